"""Train for the node the model will run on: DynInfer's choice of (bits, dropout), simulated.

    mix = deployment_mix(model, load_scenario("scenarios/piezo_machine.toml"), grid)
    # {(8, 0.0): 0.02, (4, 0.25): 0.11, (2, 0.5): 0.87, ...}: the share of inferences each runs

DynInfer on a device runs the most accurate variant the stored energy affords. Before training
the accuracies are unknown, so the simulated node ranks the variants by their energy (a costlier
variant, more bits and fewer channels dropped, is taken to be the better one, as it is once
trained) and runs the user's scenario with them: the share of inferences each variant gets is
the schedule ``models.nexume.train`` trains on (NExUME's ``deployment`` schedule). On
continuous power every inference affords the full network, and training becomes 8-bit QAT.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from edge.core.errors import ConfigError
from simulator.config import Scenario
from simulator.workload import InferenceModel, LayerSpec, ModelVariant

Config = tuple[int, float]  # (bits, drop)


def variant_layers(model: Any, bits: int, drop: float) -> tuple[LayerSpec, ...]:
    """The simulator's layer work of one (bits, drop) variant."""
    return tuple(LayerSpec(name=c.name, macs=c.macs, output_bytes=math.ceil(c.outputs * min(bits, 8) / 8))
                 for c in model.layer_costs(drop))


def energy_ranked_model(model: Any, grid: Sequence[Config]) -> InferenceModel:
    """The model's variants as the simulator needs them, their accuracy a stand-in rising with
    their MACs × bits (what DynInfer's choice needs before any is measured)."""
    variants = []
    for bits, drop in grid:
        layers = variant_layers(model, bits, drop)
        variants.append((bits, drop, layers, sum(layer.macs for layer in layers) * bits))
    top = max(v[3] for v in variants)
    return InferenceModel(tuple(ModelVariant(bits=min(b, 8), drop=d, layers=layers, correct=np.ones(1, bool),
                                             accuracy=0.5 + 0.5 * work / top)
                                for b, d, layers, work in variants), adaptive=True)


def deployment_mix(model: Any, scenario: Scenario, grid: Sequence[Config]) -> dict[Config, float]:
    """The share of inferences DynInfer runs with each configuration in ``grid`` on ``scenario``'s
    nodes (configurations it never runs are left out)."""
    from simulator.fleet import simulate

    if not grid:
        raise ConfigError("grid", list(grid), "needs at least one (bits, drop) configuration")
    result = simulate(scenario, model=energy_ranked_model(model, grid))
    counts = np.zeros(len(grid))
    for node in result.nodes:
        if node.task_log is not None and len(node.task_log):
            counts += np.bincount(node.task_log[:, 1], minlength=len(grid))
    if counts.sum() == 0:
        raise ConfigError("harvest_scenario", scenario.name, "its simulated nodes ran no inference to learn the "
                          "deployment from (too little energy, or too short a run)")
    return {tuple(g): float(c / counts.sum()) for g, c in zip(grid, counts) if c > 0}  # type: ignore[misc]
