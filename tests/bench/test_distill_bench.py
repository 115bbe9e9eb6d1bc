"""The distillation benchmark runs end to end on one small data set, and its goal keys are what
their names say, counted from its own table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import distill


def test_small_distill_benchmark(tmp_path: Path) -> None:
    out = distill.main(quick=True, results_dir=tmp_path, docs_dir=tmp_path, datasets=("digits",), seeds=(0, 1),
                       epochs=1, ddp=False)
    doc = json.loads((tmp_path / "distill-quick.json").read_text())
    for key in distill.GOALS:
        assert doc[key] == out[key]
    assert doc["ddp_2proc_speedup"] is None
    r = doc["datasets"]["digits"]
    table = r["table"]
    assert set(table) == {"full", *distill.PRUNED}
    n_train, n_classes = r["n_train"], 10
    for selection, by_ratio in table.items():
        for ratio, cell in by_ratio.items():
            expected = n_train if selection == "full" else n_classes * int(n_train / n_classes * float(ratio))
            assert cell["kept"] == expected, (selection, ratio)
            runs = [x for x in r["runs"] if x["selection"] == selection and f"{x['ratio']:.1f}" == ratio]
            assert len(runs) == 2 and 0 <= cell["accuracy_pts_mean"] <= 100
            assert cell["accuracy_pts_mean"] == pytest.approx(sum(100 * x["accuracy"] for x in runs) / 2)

    def acc(selection: str, ratio: str) -> float:
        return table[selection][ratio]["accuracy_pts_mean"]

    assert doc["mdslr_gain_vs_random_pts_at_50"] == pytest.approx(acc("mdslr", "0.5") - acc("random", "0.5"))
    assert doc["mdslr_minus_full_kd_pts_at_70"] == pytest.approx(acc("mdslr", "0.7") - acc("full", "1.0"))
    assert doc["kd_time_ratio_at_50"] == pytest.approx(table["mdslr"]["0.5"]["seconds_mean"]
                                                        / table["full"]["1.0"]["seconds_mean"])
    md = (tmp_path / "distill-quick.md").read_text()
    assert "## digits" in md and "mdslr_gain_vs_random_pts_at_50" in md and "not measured" in md
