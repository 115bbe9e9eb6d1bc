"""FIRMBOUND as an sktime early classifier: ``FirmboundClassifier``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from sktime.classification.early_classification.base import BaseEarlyClassifier

from edge.core.errors import ConfigError, DataError
from models.firmbound.core import (
    LOSS_L,
    StoppingRule,
    backward_induction,
    fit_density_ratio,
    posteriors,
)
from models.firmbound.prefix import fit_prefix_posteriors

COST_BASES = tuple(float(b) for b in np.geomspace(0.02, 200.0, 16))  # c = base × L / T; c <= L / 2
CONTEXT_FRACTIONS = (0.05, 0.25, 0.5)  # the tandem's frame lengths tried, as fractions of T


def harmonic_mean(accuracy: float, earliness: float) -> float:
    """sktime's score of an early classifier: the harmonic mean of accuracy and 1 − earliness."""
    late = 1.0 - earliness
    return 2 * accuracy * late / (accuracy + late) if accuracy + late > 0 else 0.0


def costs_for(length: int, loss: float = LOSS_L) -> list[float]:
    """The sampling costs tried by internal validation: c = base × L / T for each base, up to L / 2."""
    return [b * loss / length for b in COST_BASES if b * loss / length <= loss / 2]


OBJECTIVES = ("auto", "accurate")  # cost chosen by internal validation: best harmonic mean, or earliest within 1 point


def choose_cost(pi: np.ndarray, truth: np.ndarray, points: np.ndarray, method: str, loss: float,
                seed: int, symmetric: bool, fit_pi: np.ndarray | None = None, objective: str = "auto",
                progress: Callable[[str, int, int], None] | None = None) -> tuple[float, dict[float, float]]:
    """The sampling cost chosen on validation posteriors π (n, P, K) of series with class indices
    ``truth`` (the rule learned on ``fit_pi``, default π itself): ``auto``, the best harmonic mean
    of accuracy and 1 − earliness; ``accurate``, the earliest mean stop whose accuracy stays within
    1 point of the full-length accuracy on π, or of one series where there are fewer than 100
    (scores: 1 − earliness there, −1 elsewhere). ``progress("costs", done, costs)`` after each cost."""
    length = int(points[-1])
    full = float((pi[:, -1].argmax(1) == truth).mean())
    tolerance = max(0.01, 1.0 / len(pi))
    scores = {}
    costs = costs_for(length, loss)
    for done, cost in enumerate(costs, 1):
        rule = backward_induction(pi if fit_pi is None else fit_pi, cost, method, loss, seed,
                                  np.diff(points) if len(points) > 1 else None, symmetric)
        tau, pred = rule.decide(pi)
        accuracy, earliness = float((pred == truth).mean()), float((points[tau - 1] / length).mean())
        if objective == "accurate":
            scores[cost] = 1.0 - earliness if accuracy >= full - tolerance - 1e-12 else -1.0
        else:
            scores[cost] = harmonic_mean(accuracy, earliness)
        if progress is not None:
            progress("costs", done, len(costs))
    best = max(scores, key=lambda c: scores[c])
    return (min(scores) if scores[best] < 0 else best), scores


class FirmboundClassifier(BaseEarlyClassifier):
    """FIRMBOUND as an sktime early classifier.

    ``predict(X)`` on series X (n, channels, t) returns the class and whether the decision is
    final at t (the rule says stop by t, or t is the full length). ``update_predict`` takes longer
    prefixes of the same series; ``state_info`` keeps, per series, the samples after which its
    decision was made (0 while open) and the index of the class decided (or leading, while open).

    Parameters:

    - ``estimator``: the density-ratio estimator. ``rocket`` (default): causal MiniRocket features
      of each prefix and a logistic head per decision point (``models.firmbound.prefix``), up to
      ``decision_points`` points over 1..T, ``n_features`` features. ``tandem``: SPRT-TANDEM, a
      frame model over the last ``context`` samples (``hidden`` units; 0: linear) trained with
      LSEL for ``epochs`` epochs in batches of ``batch_size``; ``context="auto"`` picks the frame
      length among 5 %, 25 % and 50 % of T on a held-out quarter of the training series.
    - ``cost``: c, per sample, in units of the misclassification loss ``loss`` = L; ``"auto"``
      (default) picks it by internal validation (out-of-fold posteriors, or the held-out quarter)
      as the one of best harmonic mean of accuracy and 1 − earliness (sktime's score), and
      ``"accurate"`` as the one that stops earliest while staying within 1 point (or one series,
      on fewer than 100) of the full-length accuracy there; or give
      ``energy_per_sample_j`` and ``joules_per_loss`` to derive it from energy.
    - ``method``: the continuation regression, ``cfl`` (exports to the device) or ``gp``.

    >>> from models.firmbound import FirmboundClassifier, gaussian_sequences
    >>> X, y, _ = gaussian_sequences(60, dim=4, length=12, offset=1.0)
    >>> clf = FirmboundClassifier(n_features=84).fit(X, y)
    >>> labels, final = clf.predict(X[:, :, :6])  # six samples seen so far
    >>> labels, final = clf.update_predict(X[:, :, :12])  # the whole series: every decision is final
    >>> bool(final.all())
    True
    """

    _tags: ClassVar[dict[str, Any]] = {
        "capability:multivariate": True,
        "capability:random_state": True,
        "X_inner_mtype": "numpy3D",
        "authors": ["trickle"],
        # as sktime's TEASER: early classifiers keep what earlier predict calls decided, and their
        # predict / predict_proba return two arrays, which the generic idempotence checks compare as one
        "tests:skip_by_name": [
            "test_non_state_changing_method_contract",
            "test_fit_idempotent",
            "test_multiprocessing_idempotent",
            "test_persistence_via_pickle",
            "test_save_estimators_to_file",
        ],
    }

    def __init__(self, estimator: str = "rocket", cost: float | str = "auto", method: str = "cfl",
                 loss: float = LOSS_L, decision_points: int = 64, n_features: int = 1000,
                 context: int | str = "auto", hidden: int = 64, epochs: int = 150, batch_size: int = 16,
                 energy_per_sample_j: float | None = None, joules_per_loss: float | None = None,
                 random_state: int = 0) -> None:
        self.estimator = estimator
        self.cost = cost
        self.method = method
        self.loss = loss
        self.decision_points = decision_points
        self.n_features = n_features
        self.context = context
        self.hidden = hidden
        self.epochs = epochs
        self.batch_size = batch_size
        self.energy_per_sample_j = energy_per_sample_j
        self.joules_per_loss = joules_per_loss
        self.random_state = random_state
        super().__init__()

    def sampling_cost(self) -> float | None:
        """c from the parameters; None when it is chosen by internal validation."""
        if self.energy_per_sample_j is not None:
            if not self.joules_per_loss:
                raise ConfigError("joules_per_loss", self.joules_per_loss, "is needed with energy_per_sample_j")
            return float(self.energy_per_sample_j / self.joules_per_loss)
        if self.cost in OBJECTIVES:
            return None
        if isinstance(self.cost, str):
            raise ConfigError("cost", self.cost, "a positive number, 'auto' or 'accurate'")
        return float(self.cost)

    # ---- fitting ----------------------------------------------------------------------------

    def with_progress(self, report: Callable[[str, int, int], None] | None) -> FirmboundClassifier:
        """Have ``fit`` call ``report(stage, done, total)`` as it goes (stages: ``heads``, a decision
        point's heads fitted; ``costs``, a cost validated; ``epochs``, a tandem epoch); returns self."""
        self._progress = report
        return self

    def _fit(self, X: np.ndarray, y: np.ndarray) -> FirmboundClassifier:
        if self.estimator not in ("rocket", "tandem"):
            raise ConfigError("estimator", self.estimator, "must be rocket or tandem")
        if len(np.unique(y)) < 2:
            raise DataError("FIRMBOUND needs at least two classes")
        self.n_timepoints_ = X.shape[2]
        cost = self.sampling_cost()
        if self.estimator == "rocket":
            self._fit_rocket(X, y, cost)
        else:
            self._fit_tandem(X, y, cost)
        return self

    def _fit_rocket(self, X: np.ndarray, y: np.ndarray, cost: float | None) -> None:
        progress = getattr(self, "_progress", None)
        est, oof = fit_prefix_posteriors(X, y, self.decision_points, self.n_features, seed=self.random_state,
                                         progress=progress)
        self.dre_: Any = est  # PrefixPosteriors, or DensityRatio for the tandem
        self.classes_ = est.classes
        self.points_ = est.points
        self.validation_scores_: dict[float, float] = {}
        if cost is None:
            truth = np.searchsorted(est.classes, y)
            cost, self.validation_scores_ = choose_cost(oof, truth, est.points, self.method, self.loss,
                                                        self.random_state, symmetric=True, objective=str(self.cost),
                                                        progress=progress)
        self.cost_ = cost
        self.rule_: StoppingRule = backward_induction(oof, cost, self.method, self.loss, self.random_state,
                                                      np.diff(est.points) if len(est.points) > 1 else None,
                                                      symmetric=True)

    def _fit_tandem(self, X: np.ndarray, y: np.ndarray, cost: float | None) -> None:
        context = self.context
        self.validation_scores_ = {}
        if context == "auto" or cost is None:
            context, cost, self.context_scores_, self.validation_scores_ = self._validate_tandem(X, y, cost)
        self.context_ = int(context)
        dre = fit_density_ratio(X, y, self.context_, self.hidden, self.epochs, self.batch_size, seed=self.random_state,
                                progress=getattr(self, "_progress", None))
        self.dre_, self.classes_ = dre, dre.classes
        self.points_ = np.arange(1, X.shape[2] + 1)
        self.cost_ = float(cost)
        self.rule_ = backward_induction(posteriors(dre.accumulated(X)), self.cost_, self.method, self.loss,
                                        self.random_state)

    def _validate_tandem(self, X: np.ndarray, y: np.ndarray, cost: float | None
                         ) -> tuple[int, float, dict[int, float], dict[float, float]]:
        """On a held-out quarter of the training series: the frame length whose model (trained on the
        other three quarters) is most accurate averaged over every prefix length, then the cost."""
        order = np.random.default_rng(self.random_state).permutation(len(X))
        cut = max(1, len(X) * 3 // 4)
        fit_idx, val_idx = order[:cut], order[cut:] if cut < len(X) else order[:1]
        length = X.shape[2]
        candidates = ([max(min(3, length), round(length * f)) for f in CONTEXT_FRACTIONS]
                      if self.context == "auto" else [int(self.context)])
        scores, fitted = {}, {}
        for ctx in dict.fromkeys(candidates):
            dre = fit_density_ratio(X[fit_idx], y[fit_idx], ctx, self.hidden, self.epochs, self.batch_size,
                                    seed=self.random_state)
            pi = posteriors(dre.accumulated(X[val_idx]))
            truth = np.searchsorted(dre.classes, y[val_idx])
            scores[ctx] = float((pi.argmax(-1) == truth[:, None]).mean())
            fitted[ctx] = (dre, pi, truth)
        best = max(scores, key=lambda c: scores[c])
        cost_scores: dict[float, float] = {}
        if cost is None:
            dre, pi_val, truth = fitted[best]
            cost, cost_scores = choose_cost(pi_val, truth, np.arange(1, length + 1), self.method, self.loss,
                                            self.random_state, symmetric=False,
                                            fit_pi=posteriors(dre.accumulated(X[fit_idx])), objective=str(self.cost))
        return best, float(cost), scores, cost_scores

    # ---- deciding ---------------------------------------------------------------------------

    def prefix_posteriors(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(π (n, p, K), the samples of each of the p decision points within X's length)."""
        t = X.shape[2]
        if t > self.n_timepoints_:
            raise DataError(f"series of length {t}: the rule was learned for at most {self.n_timepoints_}")
        if self.estimator == "rocket":
            return self.dre_.posteriors(X), self.points_[self.points_ <= t]
        return posteriors(self.dre_.accumulated(X)), self.points_[:t]

    def decisions(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(samples taken τ in 1..T, class) of whole series X (n, channels, T)."""
        pi, points = self.prefix_posteriors(X)
        tau, idx = self.rule_.decide(pi)
        return points[tau - 1], self.classes_[idx]

    def _decide_prefix(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(samples after which each decision was made, 0 while open; the posterior it stands on;
        and the posteriors π (n, p, K) at the decision points ``points`` within X's length)."""
        pi, points = self.prefix_posteriors(X)
        tau = self.rule_.hitting_times(pi)
        at = np.where(tau > 0, tau, pi.shape[1]) - 1
        return np.where(tau > 0, points[at], 0), pi[np.arange(len(X)), at], pi, points

    def _predict_proba(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tau, proba, _, _ = self._decide_prefix(X)
        self.state_info = np.column_stack([tau, proba.argmax(1)])
        return proba, tau > 0

    def _predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        proba, final = self._predict_proba(X)
        return self.classes_[proba.argmax(1)], final

    def _update_predict_proba(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Longer prefixes of the series last predicted: all of them (decisions once made stand), or,
        as sktime's loop passes them, only those still open, in order."""
        before = self.state_info
        if before is None:
            raise DataError("update_predict: call predict on shorter prefixes of these series first")
        open_rows = np.flatnonzero(before[:, 0] == 0)
        if len(X) == len(before):
            rows = np.arange(len(X))
        elif len(X) == len(open_rows):
            rows = open_rows
        else:
            raise DataError(f"update_predict: {len(X)} series; the last predict saw {len(before)}, {len(open_rows)} "
                            "of them still open")
        tau, proba, pi_all, points = self._decide_prefix(X)
        kept = before[rows, 0] > 0  # a decision once made stands
        if np.any(before[rows, 0][kept] > X.shape[2]):
            raise DataError("update_predict: the prefixes are shorter than ones already decided on")
        tau[kept] = before[rows, 0][kept]
        if kept.any():
            proba[kept] = pi_all[np.flatnonzero(kept), np.searchsorted(points, tau[kept])]
        state = before.copy()
        state[rows] = np.column_stack([tau, proba.argmax(1)])
        self.state_info = state
        return proba, tau > 0

    def _update_predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        proba, final = self._update_predict_proba(X)
        return self.classes_[proba.argmax(1)], final

    def _score(self, X: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
        """(harmonic mean of accuracy and 1 − earliness, accuracy, earliness), as sktime's early classifiers."""
        tau, pred = self.decisions(X)
        accuracy = float((pred == y).mean())
        earliness = float((tau / X.shape[2]).mean())
        return harmonic_mean(accuracy, earliness), accuracy, earliness

    @classmethod
    def get_test_params(cls, parameter_set: str = "default") -> list[dict[str, Any]]:
        return [{"n_features": 84, "decision_points": 4},
                {"estimator": "tandem", "epochs": 3, "hidden": 0, "cost": 0.5, "context": 2}]
