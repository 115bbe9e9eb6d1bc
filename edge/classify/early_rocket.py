"""Early decisions on causal MiniRocket features, sample by sample, without torch.

    decider = early_decider(read_trusted(path, keys))   # a bundle whose early.estimator is rocket
    for sample in stream:                               # one sample: (channels,)
        d = decider.update(sample)
        if d.stop:
            act(d.label); decider.reset()

Per sample: standardize it (the manifest's pre-processing), update the causal MiniRocket counts
(``edge.classify.rocket``). At a decision point p (the bundle's ``points``): the head's logits
W_p f + b_p, the posterior π = softmax, and FIRMBOUND's rule on π sorted in decreasing order:
stop when L·(1 − max π) <= c·Δ_p + clip(−max_i(a_i·π↓ + b_i), 0, L), Δ_p the samples to the next
point; at the last point (T) at the latest (``models.firmbound``; ``export.early`` writes it).
"""

from __future__ import annotations

import io

import numpy as np

from edge.classify.decision import Decision, StreamingDecider
from edge.classify.preprocess import apply
from edge.classify.rocket import KERNEL_LENGTH, KERNELS, CausalRocket
from edge.contract.bundle import Bundle
from edge.core.errors import BundleError, DataError

ARRAYS = ("dilations", "kernels", "channels", "biases", "pair_of", "points", "weights", "head_biases")


def read_rocket(data: bytes, name: str, classes: int, channels: int, horizon: int
                ) -> tuple[CausalRocket, np.ndarray, np.ndarray, np.ndarray]:
    """(features, decision points, head weights (P, K, F), head biases (P, K)) from ``rocket.npz``."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            a = {k: z[k] for k in ARRAYS}
    except (OSError, ValueError, KeyError) as e:
        raise BundleError(f"{name}: not a rocket feature file ({e}; it holds {', '.join(ARRAYS)})") from None
    pairs, features = len(a["dilations"]), len(a["biases"])
    points = a["points"].astype(np.int64)
    checks = [
        (a["kernels"].shape == (pairs,) and np.all((a["kernels"] >= 0) & (a["kernels"] < len(KERNELS))),
         f"kernels: {pairs} indices below {len(KERNELS)}"),
        (pairs > 0 and np.all(a["dilations"] >= 1)
         and (KERNEL_LENGTH - 1) * int(a["dilations"].max()) < max(horizon, KERNEL_LENGTH),
         f"dilations: at least one pair, each >= 1, a kernel spanning at most the horizon {horizon}"),
        (a["channels"].shape == (pairs, channels), f"channels: shape ({pairs}, {channels})"),
        (a["pair_of"].shape == (features,) and np.all((a["pair_of"] >= 0) & (a["pair_of"] < pairs)),
         f"pair_of: {features} pair indices"),
        (points.ndim == 1 and len(points) >= 2 and np.all(np.diff(points) > 0) and points[0] >= 1
         and points[-1] == horizon, f"points: increasing prefix lengths ending at the horizon {horizon}"),
        (a["weights"].shape == (len(points), classes, features), f"weights: shape ({len(points)}, {classes}, {features})"),
        (a["head_biases"].shape == (len(points), classes), f"head_biases: shape ({len(points)}, {classes})"),
        (all(np.all(np.isfinite(a[k])) for k in ("biases", "weights", "head_biases")), "finite biases and weights"),
    ]
    for ok, want in checks:
        if not ok:
            raise BundleError(f"{name}: expected {want}")
    rocket = CausalRocket(a["dilations"].astype(np.int64), a["kernels"].astype(np.int64), a["channels"].astype(bool),
                          a["biases"].astype(np.float32), a["pair_of"].astype(np.int64))
    return rocket, points, a["weights"].astype(np.float32), a["head_biases"].astype(np.float32)


class RocketDecider(StreamingDecider):
    """Streams samples through a bundle's causal MiniRocket features, heads and stopping rule."""

    def __init__(self, bundle: Bundle) -> None:
        rule = bundle.manifest.early
        if rule is None or rule.estimator != "rocket" or rule.features is None:
            raise BundleError(f"bundle {bundle.manifest.model}: no rocket early rule (export one with export.early)")
        missing = [f for f in (rule.file, rule.features) if f not in bundle.files]
        if missing:
            raise BundleError(f"bundle {bundle.manifest.model}: the early rule's files are missing: {missing}")
        self.manifest = bundle.manifest
        self.horizon, self.cost, self.loss = rule.horizon, rule.cost, rule.loss
        raw = bundle.manifest.preprocessing.raw
        self.channels = raw.shape[0] if raw is not None else 1
        k = len(bundle.manifest.labels)
        self.rocket, self.points, self._weights, self._biases = read_rocket(
            bundle.file(rule.features), rule.features, k, self.channels, self.horizon)
        try:
            pieces = np.load(io.BytesIO(bundle.file(rule.file)), allow_pickle=False)
        except (OSError, ValueError) as e:
            raise BundleError(f"{rule.file}: not a .npy array ({e})") from None
        if pieces.ndim != 3 or pieces.shape[0] != len(self.points) - 1 or pieces.shape[2] != k + 1:
            raise BundleError(f"{rule.file}: shape {pieces.shape}, expected ({len(self.points) - 1}, pieces, {k + 1})")
        self._slopes, self._intercepts = pieces[..., :k], pieces[..., k]
        self._steps = np.diff(self.points)
        self._point_index = {int(t): i for i, t in enumerate(self.points)}
        self._stream = self.rocket.stream()
        self.reset()

    def reset(self) -> None:
        """Forget the series: the next sample is its first."""
        self._stream.reset()
        self.t = 0
        k = len(self.manifest.labels)
        self._pi = np.full(k, 1.0 / k)
        self.done: Decision | None = None

    def posterior(self, p: int, features: np.ndarray) -> np.ndarray:
        """π at decision point p (float64, as the estimator computes it)."""
        logits = self._weights[p].astype(np.float64) @ features.astype(np.float64) + self._biases[p]
        e = np.exp(logits - logits.max())
        return np.asarray(e / e.sum())

    def continuation(self, p: int, pi: np.ndarray) -> float:
        """c·Δ_p + Ê[G_p+1 | π_p] at decision point p (not the last)."""
        s = np.sort(pi)[::-1]
        pieces = self._slopes[p] @ s + self._intercepts[p]
        return float(self.cost * self._steps[p] + np.clip(-pieces.max(), 0.0, self.loss))

    def update(self, sample: np.ndarray) -> Decision:
        """Take the next sample (channels,); once a decision is final, it is returned again."""
        if self.done is not None:
            return self.done
        x = np.asarray(sample, dtype=np.float32).reshape(-1)
        if x.shape != (self.channels,) or not np.all(np.isfinite(x)):
            raise DataError(f"a sample of shape {np.shape(sample)}: the model takes ({self.channels},) finite values")
        if self.t >= self.horizon:
            raise DataError(f"sample {self.t + 1}: the rule was learned for series of {self.horizon} samples (reset)")
        features = self._stream.push(np.asarray(apply(self.manifest.preprocessing, x), dtype=np.float32))
        self.t += 1
        p = self._point_index.get(self.t)
        stop = False
        if p is not None:
            self._pi = self.posterior(p, features)
            stop = p == len(self.points) - 1 or self.loss * (1 - self._pi.max()) <= self.continuation(p, self._pi)
        logp = np.log(np.maximum(self._pi, 1e-300))
        decision = Decision(bool(stop), int(self._pi.argmax()), self.t, logp[:, None] - logp[None, :], self._pi)
        if stop:
            self.done = decision
        return decision
