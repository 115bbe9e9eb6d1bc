"""DynInfer: variant choice from a voltage, and QuantaTask chunking against hand-worked cases."""

from __future__ import annotations

import pytest

from edge.classify.dyninfer import VariantCost, choose_variant, quanta_tasks, usable_energy_j

VARIANTS = [
    VariantCost(bits=8, drop=0.0, energy_j=4e-3, accuracy=0.95),
    VariantCost(bits=4, drop=0.0, energy_j=2.8e-3, accuracy=0.93),
    VariantCost(bits=4, drop=0.5, energy_j=1.0e-3, accuracy=0.85),
    VariantCost(bits=2, drop=0.5, energy_j=0.7e-3, accuracy=0.70),
]


def test_usable_energy_is_half_c_v_squared_above_the_cut() -> None:
    assert usable_energy_j(3.0, 0.01, 2.0) == pytest.approx(0.5 * 0.01 * (9.0 - 4.0))
    assert usable_energy_j(1.5, 0.01, 2.0) == 0.0


def test_choice_by_hand() -> None:
    c, v_cut = 0.001, 2.0
    # 1 mF at 3.0 V holds 2.5 mJ above 2 V: 8-bit (4 mJ) and 4-bit (2.8 mJ) do not fit; 4-bit/0.5 does
    assert choose_variant(VARIANTS, usable_energy_j(3.0, c, v_cut)) == VARIANTS[2]
    # at 2.2 V: 0.42 mJ, nothing fits: the cheapest runs (it will span power failures)
    assert choose_variant(VARIANTS, usable_energy_j(2.2, c, v_cut)) == VARIANTS[3]
    # 10 mF at 3.0 V: 25 mJ, the most accurate
    assert choose_variant(VARIANTS, usable_energy_j(3.0, 0.01, v_cut)) == VARIANTS[0]
    # a safety margin of 2 turns 2.5 mJ into 1.25 mJ of budget
    assert choose_variant(VARIANTS, 2.5e-3, margin=2.0) == VARIANTS[2]


def test_quanta_tasks_split_and_fuse() -> None:
    # layer 0: 10 iterations of 1 mJ; layer 1: 4 of 0.5 mJ; budget 3 mJ
    groups = quanta_tasks([10, 4], [1e-3, 0.5e-3], 3e-3)
    spans = [[(t.layer, t.start, t.stop) for t in g] for g in groups]
    assert spans == [[(0, 0, 3)], [(0, 3, 6)], [(0, 6, 9)], [(0, 9, 10), (1, 0, 4)]]
    assert all(sum(t.energy_j for t in g) <= 3e-3 + 1e-15 for g in groups)
    # every iteration appears exactly once
    assert sum(t.stop - t.start for g in groups for t in g) == 14


def test_quanta_task_costlier_than_budget_stands_alone() -> None:
    groups = quanta_tasks([2], [5e-3], 1e-3)
    assert [[(t.start, t.stop) for t in g] for g in groups] == [[(0, 1)], [(1, 2)]]


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="budget_j"):
        quanta_tasks([1], [1.0], 0.0)
    with pytest.raises(ValueError, match="at least one"):
        choose_variant([], 1.0)
