"""FIRMBOUND (Ebihara et al., ICLR 2025): stop sensing as soon as the decision is safe.

- ``core``: the finite-horizon rule by backward induction (CFL or GP continuation values), the
  SPRT-TANDEM density-ratio estimator, and the synthetic task with its exact optimum;
- ``prefix``: the density-ratio estimator on the peers' features (causal MiniRocket and a
  logistic head per decision point);
- ``classifier``: ``FirmboundClassifier``, both behind sktime's early-classification interface.
"""

import importlib
from typing import Any

# the public names, imported on first use: `trickle export` reads a checkpoint through
# ``models.firmbound.checkpoint`` without loading sktime (the classifier) for a NExUME one
_LAZY = {
    "FirmboundClassifier": "models.firmbound.classifier",
    "harmonic_mean": "models.firmbound.classifier",
    "ConvexContinuation": "models.firmbound.core",
    "DensityRatio": "models.firmbound.core",
    "ExactRule": "models.firmbound.core",
    "FrameNet": "models.firmbound.core",
    "GPContinuation": "models.firmbound.core",
    "LOSS_L": "models.firmbound.core",
    "MaxAffine": "models.firmbound.core",
    "StoppingRule": "models.firmbound.core",
    "backward_induction": "models.firmbound.core",
    "bayes_risk": "models.firmbound.core",
    "exact_backward_induction": "models.firmbound.core",
    "fit_density_ratio": "models.firmbound.core",
    "gaussian_sequences": "models.firmbound.core",
    "posteriors": "models.firmbound.core",
    "stack_frames": "models.firmbound.core",
    "stopping_risk": "models.firmbound.core",
    "tandem_loss": "models.firmbound.core",
    "PrefixPosteriors": "models.firmbound.prefix",
    "fit_prefix_posteriors": "models.firmbound.prefix",
}

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


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
