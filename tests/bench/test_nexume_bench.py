"""The NExUME benchmark runs end to end on one small dataset; what it reports is consistent with itself,
with the scenario it simulates (a sensing event every 10 s) and with the models' test accuracy."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import nexume

EVENTS_PER_NODE_HOUR = 3600 / 10.0  # the bench's sense_period_s


def _cells(md: str) -> list[list[str]]:
    """The cells of every Markdown table row, whatever the column padding."""
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in md.splitlines() if line.startswith("|")]


def test_small_nexume_benchmark(tmp_path: Path) -> None:
    out = nexume.main(quick=True, results_dir=tmp_path, docs_dir=tmp_path, datasets=("basic_motions",), seeds=(0,), epochs=2)
    doc = json.loads((tmp_path / "nexume-quick.json").read_text())
    for key in nexume.GOALS:
        assert doc[key] == out[key]
    rows = doc["table"]
    cells = [(r["source"], r["capacitance_f"]) for r in rows]
    sources = [s for s in nexume.SOURCES if s != "solar" or "solar" in {c[0] for c in cells}]
    assert {"rf", "piezo"} <= set(sources)
    assert cells == [(s, c) for s in sources for c in nexume.CAPACITORS_F] + [("continuous", None)]

    def acc(row: dict, method: str) -> float:
        return row[f"{method}_accuracy_within_deadline"]["mean"]

    continuous = rows[-1]
    for r in rows:
        for m in nexume.METHODS:
            per_hour = r[f"{m}_inferences_per_hour"]["mean"]
            # at most one inference per sensing event, and on always-on power every event gets one
            assert 0.0 <= per_hour <= EVENTS_PER_NODE_HOUR
            if r is continuous:
                assert per_hour == EVENTS_PER_NODE_HOUR, m
            # an event is right only if an inference ran for it: lost and dropped events count as wrong
            assert 0.0 <= acc(r, m) <= per_hour / EVENTS_PER_NODE_HOUR + 1e-9, (r["source"], r["capacitance_f"], m)
        # the gains are what their names say
        best = max(acc(r, b) for b in nexume.BASELINES)
        best_fixed = max(acc(r, b) for b in nexume.FIXED_BASELINES)
        assert r["gain_pts_vs_best_baseline"] == pytest.approx(100 * (acc(r, "nexume") - best))
        assert r["gain_pts_vs_fixed_baselines"] == pytest.approx(100 * (acc(r, "nexume") - best_fixed))

    # the goal numbers are counted from the table
    harvested = rows[:-1]
    assert doc["cells_with_gain_ge_6pts"] == sum(r["gain_pts_vs_best_baseline"] >= 6.0 for r in harvested)
    assert doc["cells_with_gain_ge_6pts_vs_fixed_baselines"] == sum(r["gain_pts_vs_fixed_baselines"] >= 6.0 for r in harvested)
    assert doc["continuous_power_loss_pts"] == pytest.approx(100 * (acc(continuous, "qat8_layer") - acc(continuous, "nexume")))
    train_s = doc["training_time_s"]
    assert doc["training_time_ratio_vs_qat"] == pytest.approx(train_s["nexume"]["mean"] / train_s["qat8_layer"]["mean"])
    assert doc["training_time_ratio_vs_qat"] > 0
    uniform = [r["gain_pts_vs_uniform"] for r in rows]
    assert doc["nexume_gain_vs_uniform_pts_min"] == pytest.approx(min(uniform))
    assert doc["nexume_gain_vs_uniform_pts_mean"] == pytest.approx(sum(uniform) / len(uniform))

    # the fixed 8-bit deployments always run their one variant: on always-on power nothing is lost, so their
    # accuracy within deadline is the test accuracy, up to the sampling of 4 nodes x 2 h of events
    events = 4 * 2 * EVENTS_PER_NODE_HOUR
    for m in nexume.FIXED_BASELINES:
        p = doc["test_accuracy_first_variant"][f"basic_motions|{m}"]["mean"]
        assert acc(continuous, m) == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / events) + 1e-9), m
        # and the same events on harvested power can only lose results (same samples, same variant)
        for r in harvested:
            assert acc(r, m) <= acc(continuous, m) + 1e-9, (r["source"], r["capacitance_f"], m)

    # the Markdown report shows the JSON's numbers
    md = _cells((tmp_path / "nexume-quick.md").read_text())
    (row,) = [c for c in md if c[:3] == ["basic_motions", "continuous", "–"]]
    assert row[3:7] == [f"{100 * acc(continuous, m):.1f} ± 0.0" for m in nexume.METHODS]
    assert row[7] == f"{continuous['gain_pts_vs_best_baseline']:+.1f}"
    goals = {c[0]: c[1] for c in md if c[0] in nexume.GOALS}
    assert goals == {k: f"{doc[k]:.3g}" for k in nexume.GOALS}
