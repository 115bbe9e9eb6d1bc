"""FIRMBOUND (Ebihara et al., ICLR 2025): stop sensing as soon as the decision is safe.

- ``core``: the finite-horizon rule by backward induction (CFL or GP continuation values), the
  SPRT-TANDEM density-ratio estimator, and the synthetic task with its exact optimum;
- ``prefix``: the density-ratio estimator on the peers' features (causal MiniRocket and a
  logistic head per decision point);
- ``classifier``: ``FirmboundClassifier``, both behind sktime's early-classification interface.
"""

from models.firmbound.classifier import FirmboundClassifier, harmonic_mean
from models.firmbound.core import (
    LOSS_L,
    ConvexContinuation,
    DensityRatio,
    ExactRule,
    FrameNet,
    GPContinuation,
    MaxAffine,
    StoppingRule,
    backward_induction,
    bayes_risk,
    exact_backward_induction,
    fit_density_ratio,
    gaussian_sequences,
    posteriors,
    stack_frames,
    stopping_risk,
    tandem_loss,
)
from models.firmbound.prefix import PrefixPosteriors, fit_prefix_posteriors

__all__ = [
    "LOSS_L",
    "ConvexContinuation",
    "DensityRatio",
    "ExactRule",
    "FirmboundClassifier",
    "FrameNet",
    "GPContinuation",
    "MaxAffine",
    "PrefixPosteriors",
    "StoppingRule",
    "backward_induction",
    "bayes_risk",
    "exact_backward_induction",
    "fit_density_ratio",
    "fit_prefix_posteriors",
    "gaussian_sequences",
    "harmonic_mean",
    "posteriors",
    "stack_frames",
    "stopping_risk",
    "tandem_loss",
]
