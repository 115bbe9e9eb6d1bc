"""Fleet runs: determinism (seed, sharding), outputs on disk, per-node variation, network totals."""

from __future__ import annotations

import json
import re
from pathlib import Path

from simulator.config import load_scenario
from simulator.fleet import simulate
from simulator.report import to_json, write_outputs


def test_same_seed_byte_identical_json(tiny_overrides: dict) -> None:
    one = to_json(simulate(load_scenario(None, **tiny_overrides)))
    assert to_json(simulate(load_scenario(None, **tiny_overrides))) == one


def test_results_do_not_depend_on_worker_count(tiny_overrides: dict) -> None:
    one = json.loads(to_json(simulate(load_scenario(None, **tiny_overrides))))
    tiny_overrides["run"] = {**tiny_overrides["run"], "workers": 2}
    two = json.loads(to_json(simulate(load_scenario(None, **tiny_overrides))))
    assert (one["scenario"]["run"].pop("workers"), two["scenario"]["run"].pop("workers")) == (1, 2)
    assert one == two


def test_different_seed_changes_node_draws(tiny_overrides: dict) -> None:
    a = simulate(load_scenario(None, **tiny_overrides))
    tiny_overrides["run"] = {**tiny_overrides["run"], "seed": 6}
    b = simulate(load_scenario(None, **tiny_overrides))
    assert [n.harvest_scale for n in a.nodes] != [n.harvest_scale for n in b.nodes]


def test_node_draws_do_not_depend_on_fleet_size(tiny_overrides: dict) -> None:
    small = simulate(load_scenario(None, **tiny_overrides))
    tiny_overrides["nodes"] = {**tiny_overrides["nodes"], "count": 5}
    large = simulate(load_scenario(None, **tiny_overrides))
    assert [n.harvest_scale for n in small.nodes] == [n.harvest_scale for n in large.nodes[:3]]
    assert [n.stats for n in small.nodes] == [n.stats for n in large.nodes[:3]]


def test_outputs_written(tiny_overrides: dict, tmp_path: Path) -> None:
    result = simulate(load_scenario(None, **tiny_overrides))
    paths = write_outputs(result, tmp_path / "out")
    names = sorted(p.name for p in paths)
    assert names == ["energy.png", "report.md", "results.json", "timeline.png", "voltage.png"]
    for p in paths:
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["summary"]["nodes"] == 3 and len(doc["nodes"]) == 3
    assert doc["scenario"]["harvester"]["kind"] == "constant"
    report = (tmp_path / "out" / "report.md").read_text()
    assert re.search(r"^\| power failures +\| +\d+ \|$", report, re.M) and "![voltage](plots/voltage.png)" in report
    assert not list((tmp_path / "out").rglob("*.tmp"))


def test_summary_totals_match_nodes(tiny_overrides: dict) -> None:
    result = simulate(load_scenario(None, **tiny_overrides))
    s = result.summary
    assert s["completed"] == sum(n.stats.completed for n in result.nodes)
    assert s["power_cycles"] == sum(n.stats.power_cycles for n in result.nodes)
    # every transmitted packet has exactly one fate at the gateway
    fates = s["packets_delivered"] + s["packets_collided"] + s["packets_lost"] + s["packets_below_sensitivity"]
    assert fates == s["packets_sent"] > 0
