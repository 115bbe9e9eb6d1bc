"""What every early decider returns and shares (``edge.classify.early``, ``edge.classify.early_rocket``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from edge.core.errors import DataError


@dataclass(frozen=True)
class Decision:
    """Where FIRMBOUND's rule stands after a sample: stop or go on, the class leading, the samples
    seen, the log-likelihood ratios and the posterior."""

    stop: bool  # the rule says the decision is safe (or the horizon is reached)
    label: int  # the class index leading now
    t: int  # samples seen
    llr: np.ndarray  # (K, K): λ_kl = log p(X_1:t | k) / p(X_1:t | l)
    posterior: np.ndarray  # (K,)


class StreamingDecider(ABC):
    """What every early decider shares: ``update`` one sample, ``reset``, ``run`` a whole series."""

    horizon: int
    channels: int
    done: Decision | None

    @abstractmethod
    def reset(self) -> None:
        """Forget the series: the next sample is its first."""

    @abstractmethod
    def update(self, sample: np.ndarray) -> Decision:
        """Take the next sample (channels,); once a decision is final, it is returned again."""

    def run(self, series: np.ndarray, to_horizon: bool = False) -> Decision:
        """The decision on one whole series (channels, T): where the rule stops, or with
        ``to_horizon`` the one after the last sample (the full-length decision of the same model)."""
        self.reset()
        decision = None
        for t in range(series.shape[1]):
            decision = self.update(series[:, t])
            if decision.stop:
                if not to_horizon or decision.t >= self.horizon:
                    break
                self.done = None
        if decision is None:
            raise DataError("an empty series")
        return decision
