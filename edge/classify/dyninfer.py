"""DynInfer (NExUME §4): pick the model variant the stored energy affords, and cut its work into
QuantaTasks that each finish atomically on the energy at hand. Plain numpy, so a simulated
node and a real device run the same code.

    v = read_capacitor_voltage()
    variant = choose_variant(variants, usable_energy_j(v, capacitance_f=0.01, v_cut_v=2.0))
    chunks = quanta_tasks(variant.layer_iterations, variant.layer_energy_per_iteration_j, budget_j)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class VariantCost:
    """One runnable form of the model: precision, dropout level, what it costs and how good it is."""

    bits: int
    drop: float
    energy_j: float  # one inference on the target MCU
    accuracy: float  # measured on the test split


def usable_energy_j(v: float, capacitance_f: float, v_cut_v: float) -> float:
    """Energy the capacitor can deliver before the load is cut: ½C(v² − v_cut²), 0 below the cut."""
    return 0.5 * capacitance_f * max(v * v - v_cut_v * v_cut_v, 0.0)


def choose_variant(variants: Sequence[VariantCost], energy_j: float, margin: float = 1.0) -> VariantCost:
    """The most accurate variant whose cost × ``margin`` fits ``energy_j``; the cheapest if none fits.

    Ties in accuracy go to the cheaper variant. When nothing fits, the cheapest one still runs:
    split into QuantaTasks it progresses across power failures.
    """
    if not variants:
        raise ValueError("variants: need at least one")
    fitting = [v for v in variants if v.energy_j * margin <= energy_j]
    if not fitting:
        return min(variants, key=lambda v: (v.energy_j, -v.accuracy))
    return max(fitting, key=lambda v: (v.accuracy, -v.energy_j))


@dataclass(frozen=True)
class QuantaTask:
    """An atomic chunk: iterations [start, stop) of one layer's outer loop, or several whole layers fused."""

    layer: int
    start: int
    stop: int
    energy_j: float


def quanta_tasks(iterations: Sequence[int], energy_per_iteration_j: Sequence[float], budget_j: float) -> list[list[QuantaTask]]:
    """Split each layer's loop into chunks that fit ``budget_j``, then fuse neighbours greedily.

    Returns the fused groups in execution order; each group runs atomically and is followed
    by a checkpoint. A single iteration costlier than the budget still forms its own chunk.
    """
    if budget_j <= 0:
        raise ValueError(f"budget_j = {budget_j}: must be > 0")
    if len(iterations) != len(energy_per_iteration_j):
        raise ValueError("iterations and energy_per_iteration_j must have one entry per layer")
    chunks: list[QuantaTask] = []
    for layer, (n, e) in enumerate(zip(iterations, energy_per_iteration_j)):
        per_chunk = max(1, math.floor(budget_j / e)) if e > 0 else max(n, 1)
        for start in range(0, n, per_chunk):
            stop = min(n, start + per_chunk)
            chunks.append(QuantaTask(layer, start, stop, (stop - start) * e))
    groups: list[list[QuantaTask]] = []
    for chunk in chunks:
        if groups and sum(c.energy_j for c in groups[-1]) + chunk.energy_j <= budget_j:
            groups[-1].append(chunk)
        else:
            groups.append([chunk])
    return groups
