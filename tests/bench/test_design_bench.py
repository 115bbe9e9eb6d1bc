"""The design benchmark runs end to end in its quick form: the grid's optimum is a real design, and
regret is measured against it for BO and random search alike."""

from __future__ import annotations

import json
import math
from pathlib import Path

from bench import design as bench


def test_quick_benchmark_writes_all_keys(tmp_path: Path) -> None:
    out = bench.main(quick=True, results_dir=tmp_path)
    doc = json.loads((tmp_path / "design-quick.json").read_text())
    for key in (*bench.GOALS, "random_regret_vs_grid_pct", "design_evals_per_second"):
        assert isinstance(doc[key], float | int), key
    # the example's best files simulate to their figures (6 designs may find none that completes anything)
    assert doc["best_file_resimulation_matches"] == int(bool(doc["readme_example"]["best"]))
    # the bank and the static capacitor are each the best of the same number of designs
    assert all(row["designs_each"] == doc["reconfigurable_designs_each"] for row in doc["reconfigurable_rows"])
    assert doc["quick"] is True and doc["grid_designs"] == 32 and out["budget"] == 4
    assert doc["grid_optimum"] > 0 and len(doc["bo_regret_pct_per_seed"]) == len(bench.SEEDS)
    assert all(0 <= r <= 100 for r in doc["bo_regret_pct_per_seed"] + doc["random_regret_pct_per_seed"])
    assert set(doc["grid_optimum_design"]) == set(bench.SPACE)


def test_the_bank_and_the_static_capacitor_get_equal_design_budgets() -> None:
    banks = bench._bank_designs(10e-3)
    static = bench._static_designs(10e-3, len(banks))
    assert len(static) == len(banks) == 81
    assert all(s["capacitance_f"] == 10e-3 for s in static)
    assert all(math.isclose(b["capacitance_f"] + sum(b["bank_f"]), 10e-3) for b in banks)
    low, high = bench.STATIC_V_ON_RANGE
    assert static[0]["v_on_v"] == low and static[-1]["v_on_v"] == high and len({s["v_on_v"] for s in static}) == 81
