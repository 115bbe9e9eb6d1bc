"""FIRMBOUND's density-ratio estimator on the peers' features: causal MiniRocket + logistic heads.

    est, oof = fit_prefix_posteriors(x, y)   # x: (n, channels, T)
    pi = est.posteriors(x_test)              # (n, points, K) at the decision points est.points

At each decision point t (up to ``decision_points`` of them, spread over 1..T) a multinomial
logistic regression reads the causal MiniRocket features of the prefix X_1:t
(``edge.classify.rocket``: the same fixed convolutions and PPV pooling sktime's MiniRocket uses,
made causal so that a prefix's features follow from the last one's by one update per sample).
Its posterior π_t gives the LLRs λ_kl = log π_t,k − log π_t,l under a flat prior, so FIRMBOUND
and sktime's ProbabilityThreshold read the same kind of classifier and differ only in the rule.
The rule is learned on out-of-fold posteriors of the training series (a head's posterior on the
series it was fitted to is overconfident, and the rule would learn to stop too soon).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from edge.classify.rocket import CausalRocket
from edge.core.errors import ConfigError, DataError


def decision_points(length: int, count: int) -> np.ndarray:
    """Up to ``count`` prefix lengths spread evenly over 1..length, the last one ``length``."""
    if count < 2:
        raise ConfigError("decision_points", count, "must be at least 2")
    return np.unique(np.round(np.linspace(1, length, min(length, count))).astype(np.int64))


@dataclass
class PrefixPosteriors:
    """Causal MiniRocket features and a linear head (standardization folded in) per decision point."""

    rocket: CausalRocket
    points: np.ndarray  # (P,) prefix lengths, increasing, the last = T
    mean: np.ndarray  # (channels,) float32: the series are standardized per channel first
    std: np.ndarray
    weights: np.ndarray  # (P, K, F) float32
    biases: np.ndarray  # (P, K) float32
    classes: np.ndarray
    train_seconds: float = 0.0

    def subset(self, index: np.ndarray | list[int]) -> PrefixPosteriors:
        """The same estimator deciding at fewer points (``index`` into ``points``; it must keep the last)."""
        index = np.asarray(index, np.int64)
        if not len(index) or index[-1] != len(self.points) - 1 or np.any(np.diff(index) <= 0):
            raise ConfigError("index", index.tolist(), f"increasing indices into {len(self.points)} points, ending "
                              "with the last")
        return PrefixPosteriors(self.rocket, self.points[index], self.mean, self.std, self.weights[index],
                                self.biases[index], self.classes, self.train_seconds)

    def standardize(self, x: np.ndarray) -> np.ndarray:
        return ((np.asarray(x, np.float32) - self.mean[None, :, None]) / self.std[None, :, None]).astype(np.float32)

    def posteriors(self, x: np.ndarray, upto: int | None = None) -> np.ndarray:
        """π (n, points, K) at the decision points within the first ``upto`` samples (default: all of x)."""
        t = x.shape[2] if upto is None else upto
        points = self.points[self.points <= t]
        if not len(points):
            raise DataError(f"series of {t} samples: the first decision point is at {self.points[0]}")
        feats = self.rocket.prefix_features(self.standardize(x), points)  # (n, p, F)
        return head_posteriors(feats, self.weights[: len(points)], self.biases[: len(points)])


def head_posteriors(feats: np.ndarray, weights: np.ndarray, biases: np.ndarray) -> np.ndarray:
    """softmax(W_p f + b_p) per point p, in float64: feats (n, p, F), weights (p, K, F), biases (p, K)."""
    logits = np.einsum("npf,pkf->npk", feats.astype(np.float64), weights.astype(np.float64)) + biases
    z = logits - logits.max(-1, keepdims=True)
    e = np.exp(z)
    return np.asarray(e / e.sum(-1, keepdims=True))


class _Head:
    """One logistic regression per fold, warm-started from the previous decision point's (the
    features of neighbouring prefixes differ little, so the solver starts near its answer)."""

    def __init__(self, c: float, seed: int) -> None:
        self.model = LogisticRegression(C=c, max_iter=1000, tol=1e-3, warm_start=True, random_state=seed)

    def fit(self, f: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(weights, biases) on standardized features, and the standardization (mean, scale)."""
        mu = f.mean(0)
        sd = f.std(0)
        sd[sd < 1e-6] = 1.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            self.model.fit((f - mu) / sd, y)
        coef, icpt = self.model.coef_, self.model.intercept_
        if coef.shape[0] == 1:  # two classes: scikit-learn keeps one row; the softmax wants two
            coef, icpt = np.vstack([-coef / 2, coef / 2]), np.r_[-icpt / 2, icpt / 2]
        return coef, icpt, mu, sd

    def fold(self, f: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The head with the standardization folded in: logits = W f + b."""
        coef, icpt, mu, sd = self.fit(f, y)
        w = coef / sd[None]
        return w, icpt - w @ mu


def fit_prefix_posteriors(x: np.ndarray, y: np.ndarray, decision_points_max: int = 64, n_features: int = 1000,
                          c: float = 0.1, folds: int = 5, seed: int = 0,
                          progress: Callable[[str, int, int], None] | None = None, points: np.ndarray | None = None
                          ) -> tuple[PrefixPosteriors, np.ndarray]:
    """The estimator on series x (n, channels, T), and out-of-fold posteriors of the training series
    (n, points, K) to learn the rule on; ``progress("heads", done, points)`` after each decision point.
    ``points``: the decision points (increasing prefix lengths ending at T) instead of
    ``decision_points_max`` of them spread over 1..T."""
    start = time.perf_counter()
    x = np.asarray(x, np.float32)
    classes, yi = np.unique(y, return_inverse=True)
    counts = np.bincount(yi)
    folds = int(min(folds, counts.min()))
    if folds < 2:
        raise DataError(f"FIRMBOUND's prefix estimator needs two series of every class (class "
                        f"{classes[counts.argmin()]!r} has {counts.min()})")
    mean = x.mean(axis=(0, 2), dtype=np.float64).astype(np.float32)
    std = (x.std(axis=(0, 2), dtype=np.float64) + 1e-6).astype(np.float32)
    z = ((x - mean[None, :, None]) / std[None, :, None]).astype(np.float32)
    rocket = CausalRocket.fit(z, n_features=n_features, seed=seed)
    if points is None:
        points = decision_points(x.shape[2], decision_points_max)
    else:
        points = np.asarray(points, np.int64)
        if points.ndim != 1 or not len(points) or points[0] < 1 or np.any(np.diff(points) <= 0) \
                or points[-1] != x.shape[2]:
            raise ConfigError("points", points.tolist(), f"increasing prefix lengths from 1 ending at {x.shape[2]}")
    feats = rocket.prefix_features(z, points)  # (n, P, F)
    splits = list(StratifiedKFold(folds, shuffle=True, random_state=seed).split(feats[:, 0], yi))
    heads = [_Head(c, seed) for _ in range(folds + 1)]
    k = len(classes)
    weights = np.empty((len(points), k, rocket.n_features), np.float32)
    biases = np.empty((len(points), k), np.float32)
    oof = np.empty((len(x), len(points), k))
    for p in range(len(points)):
        f = feats[:, p].astype(np.float64)
        w, b = heads[-1].fold(f, yi)
        weights[p], biases[p] = w, b
        for head, (fit_idx, val_idx) in zip(heads, splits):
            w, b = head.fold(f[fit_idx], yi[fit_idx])
            oof[val_idx, p] = head_posteriors(feats[val_idx, p : p + 1], w[None], b[None])[:, 0]
        if progress is not None:
            progress("heads", p + 1, len(points))
    est = PrefixPosteriors(rocket, points, mean, std, weights, biases, classes, time.perf_counter() - start)
    return est, oof
