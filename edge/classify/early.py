"""Early decisions on the device: FIRMBOUND's stopping rule, sample by sample, without torch.

    decider = EarlyDecider(read_trusted(path, keys))    # a bundle with an ``early`` rule
    for sample in stream:                               # one sample: (channels,)
        d = decider.update(sample)
        if d.stop:
            act(d.label); decider.reset()

The bundle's model is the frame model: the last ``context`` standardized samples in, class logits
out (onnxruntime; or, with ``integer=True``, the int8 frame model in exact integers, as the firmware
runs it). Their running sum A_t gives the log-likelihood ratios λ_kl = A_k − A_l and the
posterior π = softmax(A). The rule file (.npy) holds, for every t < T, the max-affine pieces (a_i, b_i)
of the continuation value: stop when L·(1 − max π) <= c + clip(−max_i(a_i·π + b_i), 0, L), and at
T at the latest (``models.firmbound``; ``export.early`` writes such bundles).

The integer rule (``integer=True``; the manifest's ``early.integer``) is the same rule as the
firmware's ``tn_early_update`` computes it, bit for bit: int8 samples, TFLite-style int8 fully
connected layers, A_t summed in int32 as (int8 logit − zero point), π in Q16 from an exp table
(π_k = ⌊2^16 e_k / Σ e⌋, e_k = table[max A − A_k]), and the rule's pieces and c, L in
Q``frac_bits``, compared in int64.
"""

from __future__ import annotations

import io
import itertools
from dataclasses import dataclass

import numpy as np

from edge.classify.backends import load_backend
from edge.classify.decision import Decision, StreamingDecider
from edge.classify.early_rocket import RocketDecider
from edge.classify.preprocess import apply
from edge.contract.bundle import Bundle
from edge.core.errors import BundleError, DataError

Q16 = 1 << 16


@dataclass(frozen=True)
class IntFC:
    """One int8 fully connected layer, TFLite's arithmetic (firmware/src/dense.c, tn_fc)."""

    weight: np.ndarray  # int8 (out, in)
    bias: np.ndarray  # int32 (out,)
    multiplier: np.ndarray  # int32 Q31 (out,)
    shift: np.ndarray  # int32 right shift (out,), >= 0
    input_offset: int
    output_offset: int
    act_min: int
    act_max: int

    def __call__(self, x: np.ndarray) -> np.ndarray:
        acc = self.bias.astype(np.int64) + self.weight.astype(np.int64) @ (x.astype(np.int64) + self.input_offset)
        high = (acc * self.multiplier.astype(np.int64) + (1 << 30)) >> 31  # SaturatingRoundingDoublingHighMul
        shift = self.shift.astype(np.int64)
        mask = (np.int64(1) << shift) - 1  # RoundingDivideByPOT
        out = (high >> shift) + ((high & mask) > (mask >> 1) + (high < 0)) + self.output_offset
        return np.clip(out, self.act_min, self.act_max)


def read_int_layers(data: bytes, name: str) -> list[IntFC]:
    """The int8 frame model's layers from its .npz: w0, b0, m0, s0, p0 (input offset, output offset,
    act min, act max), w1, ..."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        layers = []
        for i in range(len(arrays) // 5):
            w, b, m, s, p = (arrays[f"{k}{i}"] for k in "wbmsp")
            layers.append(IntFC(w.astype(np.int8), b.astype(np.int32), m.astype(np.int32), s.astype(np.int32),
                                *(int(v) for v in p)))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BundleError(f"{name}: not an int8 frame model ({e})") from None
    if not layers or len(arrays) != 5 * len(layers) or any(np.any((fc.shift < 0) | (fc.shift > 31)) for fc in layers):
        raise BundleError(f"{name}: not an int8 frame model (w, b, m, s, p per layer; right shifts of 0 to 31)")
    for a, b in itertools.pairwise(layers):
        if a.weight.shape[0] != b.weight.shape[1]:
            raise BundleError(f"{name}: a layer of {a.weight.shape[0]} outputs feeds one of {b.weight.shape[1]} inputs")
    return layers


def early_decider(bundle: Bundle, integer: bool = False) -> StreamingDecider:
    """The decider a bundle's early rule needs: the frame model's (``EarlyDecider``) or causal
    MiniRocket's (``edge.classify.early_rocket.RocketDecider``)."""
    rule = bundle.manifest.early
    if rule is not None and rule.estimator == "rocket":
        if integer:
            raise BundleError(f"bundle {bundle.manifest.model}: its rule reads causal MiniRocket features "
                              "(estimator 'rocket'), which have no integer form")
        return RocketDecider(bundle)
    return EarlyDecider(bundle, integer=integer)


class EarlyDecider(StreamingDecider):
    """Streams samples through a bundle's frame model and stopping rule."""

    def __init__(self, bundle: Bundle, integer: bool = False) -> None:
        rule = bundle.manifest.early
        if rule is None:
            raise BundleError(f"bundle {bundle.manifest.model}: no early-decision rule (export one with export.early)")
        if rule.estimator != "tandem":
            raise BundleError(f"bundle {bundle.manifest.model}: a {rule.estimator} rule (use early_decider)")
        if integer and rule.integer is None:
            raise BundleError(f"bundle {bundle.manifest.model}: no integer rule (export with calibration series)")
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
        self.integer = rule.integer if integer else None
        if self.integer is not None:
            q = self.integer
            missing = [f for f in (q.frame, q.rule, q.exp) if f not in bundle.files]
            if missing:
                raise BundleError(f"bundle {bundle.manifest.model}: the integer rule's files are missing: {missing}")
            self.layers = read_int_layers(bundle.file(q.frame), q.frame)
            try:
                self.pieces_q = np.load(io.BytesIO(bundle.file(q.rule)), allow_pickle=False).astype(np.int64)
                self.exp_q16 = np.load(io.BytesIO(bundle.file(q.exp)), allow_pickle=False).astype(np.int64)
            except (OSError, ValueError) as e:
                raise BundleError(f"{q.rule}, {q.exp}: not .npy arrays ({e})") from None
            if self.pieces_q.ndim != 3 or self.pieces_q.shape[::2] != (self.horizon - 1, n_classes + 1):
                raise BundleError(f"{q.rule}: shape {self.pieces_q.shape}, expected ({self.horizon - 1}, pieces, "
                                  f"{n_classes + 1})")
            if self.exp_q16.ndim != 1 or not len(self.exp_q16) or self.exp_q16[0] != Q16:
                raise BundleError(f"{q.exp}: an exp table in Q16 starts at {Q16}")
            first, last = self.layers[0].weight.shape[1], self.layers[-1].weight.shape[0]
            if last != n_classes:
                raise BundleError(f"{q.frame}: {last} outputs for {n_classes} classes")
            self._int_inputs = first
        self._backend = load_backend("onnx", bundle.file(variant.formats["onnx"]))
        raw = bundle.manifest.preprocessing.raw
        self.channels = raw.shape[0] if raw is not None else 1
        if self.integer is not None and self._int_inputs != self.channels * self.context:
            raise BundleError(f"{self.integer.frame}: {self._int_inputs} inputs, but {self.channels} channels x "
                              f"context {self.context} make {self.channels * self.context}")
        if [1, self.channels * self.context] != list(bundle.manifest.input_shape):
            raise BundleError(f"bundle {bundle.manifest.model}: input {list(bundle.manifest.input_shape)}, but "
                              f"{self.channels} channels x context {self.context} make {self.channels * self.context}")
        self.reset()

    def reset(self) -> None:
        """Forget the series: the next sample is its first."""
        self._window = np.zeros((self.channels, self.context), np.float32)
        self._acc = np.zeros(len(self.manifest.labels), np.float32)  # float32 sums, as the estimator's
        self._acc_q = np.zeros(len(self.manifest.labels), np.int64)
        self._window_q = np.zeros((self.channels, self.context), np.int8)
        self.t = 0
        self.done: Decision | None = None

    def continuation(self, t: int, pi: np.ndarray) -> float:
        """c + Ê[G_t+1 | π_t] after ``t`` samples (1 <= t < T)."""
        pieces = self._slopes[t - 1] @ pi + self._intercepts[t - 1]
        return float(self.cost + np.clip(-pieces.max(), 0.0, self.loss))

    def quantize(self, sample: np.ndarray) -> np.ndarray:
        """The int8 sample the integer rule (and the firmware) takes for a raw sample (channels,)."""
        if self.integer is None:
            raise BundleError("quantize: the decider was not made with integer=True")
        z = np.asarray(apply(self.manifest.preprocessing, self._checked(sample)), dtype=np.float32)
        return np.clip(np.rint(z / np.float32(self.integer.input_scale)), -128, 127).astype(np.int8)

    def _checked(self, sample: np.ndarray) -> np.ndarray:
        x = np.asarray(sample, dtype=np.float32).reshape(-1)
        if x.shape != (self.channels,) or not np.all(np.isfinite(x)):
            raise DataError(f"a sample of shape {np.shape(sample)}: the model takes ({self.channels},) finite values")
        return x

    def integer_decision(self, acc: np.ndarray, t: int) -> Decision:
        """The integer rule after ``t`` samples whose int8 logits (minus the zero point) sum to ``acc``."""
        assert self.integer is not None
        j = acc.max() - acc
        e = np.where(j < len(self.exp_q16), self.exp_q16[np.minimum(j, len(self.exp_q16) - 1)], 0)
        pi = (e * Q16) // e.sum()
        stop = t >= self.horizon
        if not stop:
            p = self.pieces_q[t - 1]
            g = (p[:, :-1] @ pi + p[:, -1] * Q16).max()
            cont = self.integer.cost_q * Q16 + np.clip(-g, 0, self.integer.loss_q * Q16)
            stop = self.integer.loss_q * (Q16 - pi.max()) <= cont
        scale = self.integer.logit_scale
        return Decision(bool(stop), int(acc.argmax()), t, (acc[:, None] - acc[None, :]) * scale, pi / Q16)

    def update_int8(self, sample_q: np.ndarray) -> Decision:
        """Take the next int8 sample (``quantize``'s) through the integer rule."""
        if self.integer is None:
            raise BundleError("update_int8: the decider was not made with integer=True")
        if self.done is not None:
            return self.done
        q = np.asarray(sample_q)
        if q.shape != (self.channels,) or q.dtype != np.int8:
            raise DataError(f"an int8 sample of shape {q.shape} and type {q.dtype}: expected ({self.channels},) int8")
        self._window_q = np.concatenate([self._window_q[:, 1:], q[:, None]], axis=1)
        x = self._window_q.reshape(-1).astype(np.int64)
        for layer in self.layers:
            x = layer(x)
        self._acc_q = self._acc_q + x - self.integer.logit_zero_point
        self.t += 1
        decision = self.integer_decision(self._acc_q, self.t)
        if decision.stop:
            self.done = decision
        return decision

    def update(self, sample: np.ndarray) -> Decision:
        """Take the next sample (channels,); once a decision is final, it is returned again."""
        if self.done is not None:
            return self.done
        if self.integer is not None:
            return self.update_int8(self.quantize(sample))
        x = self._checked(sample)
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

