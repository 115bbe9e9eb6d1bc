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
    names = sorted(p.relative_to(tmp_path / "out").as_posix() for p in paths)
    assert names == ["cycles.csv", "plots/energy.png", "plots/timeline.png", "plots/voltage.png", "report.html", "report.md",
                     "results.json", "traces/node-0.csv", "traces/node-1.csv"]
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


def test_cycles_and_traces_as_csv_match_the_results(tmp_path: Path) -> None:
    import csv

    from simulator.config import SCENARIO_DIR

    sc = load_scenario(SCENARIO_DIR / "rf_powercast.toml", run={"duration_s": 600.0, "workers": 1},
                       nodes={"count": 2, "record_traces": 1})
    result = simulate(sc)
    write_outputs(result, tmp_path, plots=False)
    rows = list(csv.DictReader((tmp_path / "cycles.csv").open()))
    node0 = [r for r in rows if r["node_id"] == "0"]
    on, _ = result.nodes[0].periods()
    assert len(node0) == result.nodes[0].stats.boots and len(on) == result.nodes[0].stats.power_cycles > 0
    assert [float(r["on_s"]) for r in node0 if r["on_s"]] == on.tolist()  # repr round-trips floats exactly
    trace = list(csv.DictReader((tmp_path / "traces" / "node-0.csv").open()))
    assert [float(r["voltage_v"]) for r in trace] == result.nodes[0].trace["voltage_v"]  # type: ignore[index]
    assert {r["mode"] for r in trace} >= {"off", "boot", "run"} and not (tmp_path / "traces" / "node-1.csv").exists()
    # the event log: every power failure is a v_cut row at the time cycles.csv gives, entering off
    failures = [(float(r["time_s"]), r["mode"]) for r in trace if r["event"] == "v_cut"]
    assert [t for t, _ in failures] == [float(r["power_failure_s"]) for r in node0 if r["power_failure_s"]]
    assert {m for _, m in failures} == {"off"} and trace[0]["event"] == "start"
    assert {r["event"] for r in trace} >= {"v_on", "phase", "sense", "harvest"}
