"""A trained model as the inference task of simulated nodes: variants, their costs and verdicts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from models.data.base import Dataset
from models.nexume.deployment import variant_layers
from models.nexume.switchable import SUPPORTED_BITS, SwitchableNet
from models.nexume.train import DROP_LEVELS
from simulator.workload import InferenceModel, ModelVariant


@torch.no_grad()
def net_inference_model(model: SwitchableNet, data: Dataset, variants: Sequence[tuple[int, float]] | None = None,
                    adaptive: bool = True, margin: float = 1.0) -> InferenceModel:
    """The simulator's view of ``model``: per variant, the layer work and which test samples it gets right.

    The first variant is the one a non-adaptive node always runs.
    """
    if variants is None:
        variants = [(b, d) for b in reversed(SUPPORTED_BITS) for d in DROP_LEVELS]
    model.eval()
    x = torch.from_numpy(data.x_test)
    out = []
    for bits, drop in variants:
        correct = model.configure(bits, drop)(x).argmax(1).numpy() == data.y_test
        layers = variant_layers(model, bits, drop)
        out.append(ModelVariant(bits=min(bits, 8), drop=drop, layers=layers, correct=np.asarray(correct, dtype=bool),
                                accuracy=float(correct.mean())))
    return InferenceModel(tuple(out), adaptive=adaptive, margin=margin)
