"""The design benchmark runs end to end in its quick form: the grid's optimum is a real design, and
regret is measured against it for BO and random search alike."""

from __future__ import annotations

import json
from pathlib import Path

from bench import design as bench


def test_quick_benchmark_writes_all_keys(tmp_path: Path) -> None:
    out = bench.main(quick=True, results_dir=tmp_path)
    doc = json.loads((tmp_path / "design-quick.json").read_text())
    for key in (*bench.GOALS, "random_regret_vs_grid_pct", "design_evals_per_second"):
        assert isinstance(doc[key], float), key
    assert doc["quick"] is True and doc["grid_designs"] == 32 and out["budget"] == 4
    assert doc["grid_optimum"] > 0 and len(doc["bo_regret_pct_per_seed"]) == len(bench.SEEDS)
    assert all(0 <= r <= 100 for r in doc["bo_regret_pct_per_seed"] + doc["random_regret_pct_per_seed"])
    assert set(doc["grid_optimum_design"]) == set(bench.SPACE)
