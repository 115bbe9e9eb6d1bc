"""Early decisions on the device: FIRMBOUND's stopping rule, sample by sample, without torch.

    decider = EarlyDecider(read_trusted(path, keys))    # a bundle with an ``early`` rule
    for sample in stream:                               # one sample: (channels,)
        d = decider.update(sample)
        if d.stop:
            act(d.label); decider.reset()

The bundle's model is the frame model: the last ``context`` standardized samples in, class logits
out (onnxruntime). Their running sum A_t gives the log-likelihood ratios λ_kl = A_k − A_l and the
posterior π = softmax(A). The rule file (.npy) holds, for every t < T, the max-affine pieces (a_i, b_i)
of the continuation value: stop when L·(1 − max π) <= c + clip(−max_i(a_i·π + b_i), 0, L), and at
T at the latest (``models.firmbound``; ``export.early`` writes such bundles).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from edge.backends import load_backend
from edge.bundle import Bundle
from edge.errors import BundleError, DataError
from edge.preprocess import apply


@dataclass(frozen=True)
class Decision:
    stop: bool  # the rule says the decision is safe (or the horizon is reached)
    label: int  # the class index leading now
    t: int  # samples seen
    llr: np.ndarray  # (K, K): λ_kl = log p(X_1:t | k) / p(X_1:t | l)
    posterior: np.ndarray  # (K,)


class EarlyDecider:
    """Streams samples through a bundle's frame model and stopping rule."""

    def __init__(self, bundle: Bundle) -> None:
        rule = bundle.manifest.early
        if rule is None:
            raise BundleError(f"bundle {bundle.manifest.model}: no early-decision rule (export one with export.early)")
        self.manifest = bundle.manifest
        self.horizon, self.context, self.cost, self.loss = rule.horizon, rule.context, rule.cost, rule.loss
        variant = bundle.manifest.variants[0]
        n_classes = len(bundle.manifest.labels)
        missing = [f for f in (rule.file, variant.formats.get("onnx")) if f is None or f not in bundle.files]
        if missing:
            raise BundleError(f"bundle {bundle.manifest.model}: the early rule needs an onnx frame model and its rule "
                              f"file; missing: {missing}")
        try:
            pieces = np.load(io.BytesIO(bundle.file(rule.file)), allow_pickle=False)
        except (OSError, ValueError) as e:
            raise BundleError(f"{rule.file}: not a .npy array ({e})") from None
        if pieces.ndim != 3 or pieces.shape[0] != self.horizon - 1 or pieces.shape[2] != n_classes + 1:
            raise BundleError(f"{rule.file}: shape {pieces.shape}, expected ({self.horizon - 1}, pieces, {n_classes + 1})")
        self._slopes, self._intercepts = pieces[..., :n_classes], pieces[..., n_classes]
        self._backend = load_backend("onnx", bundle.file(variant.formats["onnx"]))
        raw = bundle.manifest.preprocessing.raw
        self.channels = raw.shape[0] if raw is not None else 1
        if [1, self.channels * self.context] != list(bundle.manifest.input_shape):
            raise BundleError(f"bundle {bundle.manifest.model}: input {list(bundle.manifest.input_shape)}, but "
                              f"{self.channels} channels x context {self.context} make {self.channels * self.context}")
        self.reset()

    def reset(self) -> None:
        """Forget the series: the next sample is its first."""
        self._window = np.zeros((self.channels, self.context), np.float32)
        self._acc = np.zeros(len(self.manifest.labels), np.float32)  # float32 sums, as the estimator's
        self.t = 0
        self.done: Decision | None = None

    def continuation(self, t: int, pi: np.ndarray) -> float:
        """c + Ê[G_t+1 | π_t] after ``t`` samples (1 <= t < T)."""
        pieces = self._slopes[t - 1] @ pi + self._intercepts[t - 1]
        return float(self.cost + np.clip(-pieces.max(), 0.0, self.loss))

    def update(self, sample: np.ndarray) -> Decision:
        """Take the next sample (channels,); once a decision is final, it is returned again."""
        if self.done is not None:
            return self.done
        x = np.asarray(sample, dtype=np.float32).reshape(-1)
        if x.shape != (self.channels,) or not np.all(np.isfinite(x)):
            raise DataError(f"a sample of shape {np.shape(sample)}: the model takes ({self.channels},) finite values")
        z = np.asarray(apply(self.manifest.preprocessing, x), dtype=np.float32)
        self._window = np.concatenate([self._window[:, 1:], z[:, None]], axis=1)
        logits = np.asarray(self._backend.run(self._window.reshape(1, -1)), dtype=np.float32).reshape(-1)
        self._acc = self._acc + logits
        self.t += 1
        acc = self._acc.astype(np.float64)
        e = np.exp(acc - acc.max())
        pi = e / e.sum()
        stop = self.t >= self.horizon or self.loss * (1 - pi.max()) <= self.continuation(self.t, pi)
        decision = Decision(bool(stop), int(pi.argmax()), self.t, acc[:, None] - acc[None, :], pi)
        if stop:
            self.done = decision
        return decision

    def run(self, series: np.ndarray) -> Decision:
        """The decision on one whole series (channels, T): where the rule stops."""
        self.reset()
        decision = None
        for t in range(series.shape[1]):
            decision = self.update(series[:, t])
            if decision.stop:
                break
        if decision is None:
            raise DataError("an empty series")
        return decision
