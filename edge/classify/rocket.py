"""Causal MiniRocket: prefix features of a growing series, in numpy, batch or sample by sample.

    rocket = CausalRocket.fit(x_train)            # x: (n, channels, T), standardized
    f = rocket.prefix_features(x, at=[5, 10, T])  # (n, 3, features): PPV over samples 1..t
    stream = rocket.stream(); stream.push(sample) # one sample (channels,) -> features now

MiniRocket (Dempster et al., KDD 2021) made causal so that every prefix has features and the
features of X_1:t+1 follow from those of X_1:t by one step: the 84 kernels of length 9 whose
weights are −1 but for three 2s, dilated by d, read the samples t − 8d … t (zeros before the
start: the series are standardized, so zero is the mean). Each (kernel, dilation) pair sums its
output over a random subset of the channels (as MiniRocketMultivariate does) and compares it with
a few biases, quantiles of its output on training series; a feature is the proportion of
positive values (PPV) among the outputs so far. Per new sample that is one dot product of 9 taps
per pair and channel and a comparison per feature: what a microcontroller can do per sample.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from edge.core.errors import DataError

KERNEL_LENGTH = 9
KERNELS = np.array(list(itertools.combinations(range(KERNEL_LENGTH), 3)), dtype=np.int64)  # (84, 3): taps of weight 2
GOLDEN = (np.sqrt(5.0) - 1) / 2  # low-discrepancy quantile positions, as MiniRocket


@dataclass(frozen=True)
class CausalRocket:
    """Fixed convolutions and their biases; ``features`` = sum of ``biases`` sizes."""

    dilations: np.ndarray  # (pairs,) int: the dilation of each (kernel, dilation) pair
    kernels: np.ndarray  # (pairs,) int: its kernel's index into KERNELS
    channels: np.ndarray  # (pairs, channels) bool: the channels it sums
    biases: np.ndarray  # (features,) float32
    pair_of: np.ndarray  # (features,) int: the pair each bias (feature) belongs to

    @property
    def n_features(self) -> int:
        return len(self.biases)

    @property
    def receptive_field(self) -> int:
        return int((KERNEL_LENGTH - 1) * self.dilations.max() + 1)

    @classmethod
    def fit(cls, x: np.ndarray, n_features: int = 1000, seed: int = 0) -> CausalRocket:
        """Dilations for series of x's length, a channel subset per pair, biases from quantiles of
        each pair's output on a random training series."""
        x = _checked(x)
        n, c, length = x.shape
        rng = np.random.default_rng(seed)
        per_kernel = max(1, n_features // len(KERNELS))
        top = np.log2(max((length - 1) / (KERNEL_LENGTH - 1), 1.0))
        dils, counts = np.unique(np.floor(2 ** np.linspace(0, top, min(per_kernel, 32))).astype(np.int64),
                                 return_counts=True)
        biases_per = counts * per_kernel // counts.sum()
        biases_per[: per_kernel - biases_per.sum()] += 1  # spread the remainder over the smallest dilations
        pairs = [(k, d, b) for d, b in zip(dils, biases_per) for k in range(len(KERNELS)) if b > 0]
        kernels = np.array([p[0] for p in pairs], np.int64)
        dilations = np.array([p[1] for p in pairs], np.int64)
        chans = np.zeros((len(pairs), c), bool)
        for i in range(len(pairs)):
            size = int(2 ** rng.uniform(0, np.log2(min(c, KERNEL_LENGTH) + 1)))
            chans[i, rng.choice(c, max(1, min(size, c)), replace=False)] = True
        partial = cls(dilations, kernels, chans, np.zeros(0, np.float32), np.zeros(0, np.int64))
        biases, pair_of = [], []
        step = 0
        for i, (_, _, b) in enumerate(pairs):
            out = partial._pair_output(x[rng.integers(n)][None], i)[0]
            q = ((np.arange(b) + step + 1) * GOLDEN) % 1
            step += b
            biases.extend(np.quantile(out, q))
            pair_of.extend([i] * b)
        return cls(dilations, kernels, chans, np.asarray(biases, np.float32), np.asarray(pair_of, np.int64))

    def _pair_output(self, x: np.ndarray, i: int) -> np.ndarray:
        """(n, T): pair i's causal convolution, summed over its channels."""
        z = x[:, self.channels[i]].sum(axis=1, dtype=np.float32)  # a sum of channels convolves as one
        return self._conv(z, int(self.dilations[i]), KERNELS[self.kernels[i]])

    @staticmethod
    def _conv(z: np.ndarray, d: int, taps: np.ndarray) -> np.ndarray:
        """Σ_j w_j z[t − (8 − j)·d], w = −1 but 2 at ``taps``; z is 0 before the start."""
        n, length = z.shape
        pad = np.concatenate([np.zeros((n, (KERNEL_LENGTH - 1) * d), np.float32), z], axis=1)
        shifted = [pad[:, j * d : j * d + length] for j in range(KERNEL_LENGTH)]
        return np.asarray(3 * (shifted[taps[0]] + shifted[taps[1]] + shifted[taps[2]]) - sum(shifted),
                          dtype=np.float32)

    def prefix_features(self, x: np.ndarray, at: np.ndarray | list[int], chunk: int = 64) -> np.ndarray:
        """(n, len(at), features) float32: the PPV of every feature over samples 1..t, per t in ``at``."""
        x = _checked(x, self.channels.shape[1])
        at = np.asarray(at, np.int64)
        if len(at) == 0 or at.min() < 1 or at.max() > x.shape[2]:
            raise DataError(f"prefix lengths {at.min() if len(at) else '–'}..{at.max() if len(at) else '–'}: "
                            f"must lie in 1..{x.shape[2]}")
        out = np.empty((len(x), len(at), self.n_features), np.float32)
        for lo in range(0, len(x), chunk):
            part = x[lo : lo + chunk]
            for i in range(len(self.dilations)):
                cols = np.flatnonzero(self.pair_of == i)
                conv = self._pair_output(part, i)  # (n, T)
                hits = np.cumsum(conv[:, :, None] > self.biases[cols], axis=1, dtype=np.int32)  # (n, T, b)
                out[lo : lo + chunk, :, cols] = hits[:, at - 1] / at[None, :, None].astype(np.float32)
        return out

    def stream(self) -> RocketStream:
        return RocketStream(self)


class RocketStream:
    """The features of one growing series, updated per sample: a window of the last
    ``receptive_field`` samples and a count of positive outputs per feature."""

    def __init__(self, rocket: CausalRocket) -> None:
        self.rocket = rocket
        self.window = np.zeros((rocket.channels.shape[1], rocket.receptive_field), np.float32)
        self.counts = np.zeros(rocket.n_features, np.int64)
        self.t = 0
        r = rocket
        span = (KERNEL_LENGTH - 1) * r.dilations  # the oldest tap's age, per pair
        # per pair and tap j: the window column of z[t − (8 − j)·d] (the newest sample is the last column)
        self._cols = (r.receptive_field - 1 - span[:, None] + np.arange(KERNEL_LENGTH)[None] * r.dilations[:, None])
        self._channels = r.channels.astype(np.float32)

    def reset(self) -> None:
        self.window[:] = 0
        self.counts[:] = 0
        self.t = 0

    def push(self, sample: np.ndarray) -> np.ndarray:
        """Take one sample (channels,); return the features of the series so far (float32)."""
        sample = np.asarray(sample, np.float32).reshape(-1)
        if sample.shape[0] != self.window.shape[0]:
            raise DataError(f"a sample of {sample.shape[0]} channels; the features were fitted on {self.window.shape[0]}")
        self.window = np.roll(self.window, -1, axis=1)
        self.window[:, -1] = sample
        r = self.rocket
        # each pair's channel sum at its nine taps only: (channels, pairs, 9) summed over its channels
        taps = np.einsum("pc,cpj->pj", self._channels, self.window[:, self._cols])
        # the same order of additions as the batch path: 3·(three taps) − sum of all nine
        three = np.take_along_axis(taps, KERNELS[r.kernels], axis=1)
        conv = 3 * (three[:, 0] + three[:, 1] + three[:, 2]) - _ordered_sum(taps)
        self.counts += conv[r.pair_of] > r.biases
        self.t += 1
        return (self.counts / np.float32(self.t)).astype(np.float32)


def _ordered_sum(taps: np.ndarray) -> np.ndarray:
    total = taps[:, 0].copy()
    for j in range(1, KERNEL_LENGTH):
        total = total + taps[:, j]
    return total


def _checked(x: np.ndarray, channels: int | None = None) -> np.ndarray:
    x = np.asarray(x, np.float32)
    if x.ndim != 3 or x.shape[2] < 1:
        raise DataError(f"series of shape {x.shape}: expected (n, channels, T)")
    if channels is not None and x.shape[1] != channels:
        raise DataError(f"series of {x.shape[1]} channels; the features were fitted on {channels}")
    if not np.isfinite(x).all():
        raise DataError("series hold NaN or infinite values")
    return x
