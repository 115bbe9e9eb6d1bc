"""Piecewise-constant power traces: the form every harvester takes.

Between two breakpoints the harvested power is constant, which is what lets the
exact engine solve the storage ODE in closed form (see ``simulator.capacitor``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge.core.errors import DataError


@dataclass(frozen=True)
class PowerTrace:
    """``power_w[i]`` holds on ``[time_s[i], time_s[i+1])``; the last value holds until ``end_s``."""

    time_s: np.ndarray  # (n,) float64, strictly increasing, time_s[0] == 0
    power_w: np.ndarray  # (n,) float64, >= 0
    end_s: float

    @classmethod
    def from_samples(cls, time_s: object, power_w: object, end_s: float) -> PowerTrace:
        """Build a trace from sample times and powers: negatives clip to 0, equal runs merge.

        Samples before 0 or at/after ``end_s`` are dropped; the power before the first
        sample is taken to be the first sample's.
        """
        t = np.asarray(time_s, dtype=np.float64)
        p = np.clip(np.asarray(power_w, dtype=np.float64), 0.0, None)
        if t.ndim != 1 or t.shape != p.shape or t.size == 0:
            raise DataError(f"trace needs equal-length 1-D time and power arrays, got {t.shape} and {p.shape}")
        if not np.all(np.isfinite(t)) or not np.all(np.isfinite(p)):
            raise DataError("trace holds a non-finite time or power")
        if np.any(np.diff(t) <= 0):
            raise DataError("trace times must be strictly increasing")
        if end_s <= 0:
            raise DataError(f"trace end_s must be > 0, got {end_s}")
        keep = t < end_s
        if not keep.any():
            raise DataError(f"trace has no sample before end_s = {end_s}")
        t, p = t[keep], p[keep]
        first = int(np.searchsorted(t, 0.0, side="right")) - 1  # last sample at or before 0
        if first > 0:
            t, p = t[first:], p[first:]
        t = t.copy()
        t[0] = 0.0
        change = np.concatenate(([True], p[1:] != p[:-1]))
        return cls(t[change], p[change], float(end_s))

    @classmethod
    def constant(cls, power_w: float, end_s: float) -> PowerTrace:
        return cls.from_samples([0.0], [power_w], end_s)

    def segment_at(self, t_s: float) -> int:
        """Index of the segment that holds at ``t_s`` (right-continuous)."""
        return int(np.searchsorted(self.time_s, t_s, side="right")) - 1

    def power_at(self, t_s: float) -> float:
        return float(self.power_w[self.segment_at(t_s)])

    def scaled(self, factor: float) -> PowerTrace:
        return PowerTrace.from_samples(self.time_s, self.power_w * factor, self.end_s)

    def energy_j(self, t0_s: float = 0.0, t1_s: float | None = None) -> float:
        """Exact integral of the power over ``[t0_s, t1_s]``."""
        t1 = self.end_s if t1_s is None else t1_s
        edges = np.append(self.time_s, self.end_s)
        lo = np.clip(edges[:-1], t0_s, t1)
        hi = np.clip(edges[1:], t0_s, t1)
        return float(np.sum(self.power_w * (hi - lo)))

    def mean_power_w(self) -> float:
        return self.energy_j() / self.end_s
