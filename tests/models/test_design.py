"""trickle design: a design study over the simulator (Optuna's GP sampler), its report, its
scenario files, resuming, constraints and the errors a user can cause."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from edge.core.errors import ConfigError
from models.design.search import evaluate, run_study
from models.design.spec import DesignSpec, load_parts, load_spec
from tests.helpers import trickle

EXAMPLE = Path(__file__).parents[2] / "examples" / "design" / "indoor_node.toml"


def _spec(**changes: object) -> DesignSpec:
    """A small study: the botoks node (10 minutes, one node), its capacitor and its turn-on voltage."""
    doc: dict[str, object] = {
        "name": "t", "scenario": "botoks_sense_send", "trials": 6, "startup_trials": 3, "random_baseline": False,
        "set": {"nodes.count": 1, "run.duration_s": 120.0},
        "parameter": [{"field": "storage.capacitance_f", "values": [47e-6, 100e-6, 220e-6, 470e-6]},
                      {"field": "storage.v_on_v", "values": [2.0, 2.1, 2.2, 2.3]}],
        "objective": [{"metric": "phase_send_completed", "goal": "maximize"}],
    }
    doc.update(changes)
    return DesignSpec.model_validate(doc)


def test_the_example_spec_runs_from_the_command_line_and_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "d"
    proc = trickle("design", str(EXAMPLE), "--out", str(out), "--trials", "6", "--workers", "2", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "designs/s" in proc.stdout and "design.html" in proc.stdout
    doc = json.loads((out / "design.json").read_text())
    assert doc["evaluated"] == 6 and len(doc["trials"]) == 6 and doc["random_best_so_far"] is not None
    page = (out / "design.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "src=\"http" not in page  # self-contained
    assert (out / "chosen" / "report.md").is_file() and (out / "study.log").is_file()
    assert doc["scenario_files"] and all((out / p).is_file() for p in doc["scenario_files"])
    # the parts catalogue gives each design its capacitor's volume (an objective here)
    assert all(not math.isnan(t["metrics"]["capacitor_volume_mm3"]) for t in doc["trials"])


def test_a_best_design_file_simulates_to_the_figure_reported(tmp_path: Path) -> None:
    from models.design.report import write_report
    from simulator import load_scenario, simulate

    spec = _spec()
    study = run_study(spec, tmp_path, tmp_path / "d")
    doc = write_report(spec, tmp_path, study, None, tmp_path / "d", 1.0, chosen_report=False)
    best = doc["best"][0]
    scenario = load_scenario(tmp_path / "d" / doc["scenario_files"][0])
    assert scenario.storage.v_on_v == best["params"]["storage.v_on_v"]
    assert best["values"][0] > 0 and simulate(scenario).summary["phase_send_completed"] == best["values"][0]
    assert best["values"][0] == max(t.values[0] for t in study.get_trials() if t.values is not None)


def test_same_seed_same_study_and_resume_continues_it(tmp_path: Path) -> None:
    from models.design.report import summary

    first = summary(_spec(), run_study(_spec(), tmp_path, tmp_path / "a"), None)
    again = summary(_spec(), run_study(_spec(), tmp_path, tmp_path / "b"), None)
    assert first == again
    run_study(_spec(trials=3), tmp_path, tmp_path / "c")  # interrupted after 3 designs
    with pytest.raises(ConfigError, match="--resume"):
        run_study(_spec(), tmp_path, tmp_path / "c")
    resumed = summary(_spec(), run_study(_spec(), tmp_path, tmp_path / "c", resume=True), None)
    assert [t["params"] for t in resumed["trials"]][:3] == [t["params"] for t in first["trials"]][:3]
    assert resumed["evaluated"] == 6


def test_constraints_keep_failing_designs_out_of_the_best(tmp_path: Path) -> None:
    from models.design.search import feasible, pareto

    spec = _spec(constraint=[{"metric": "storage_volume_proxy", "max": 1.0}])
    with pytest.raises(ConfigError, match="closest"):  # an unknown metric: one error, with what there is
        run_study(spec, tmp_path, tmp_path / "x")
    spec = _spec(constraint=[{"metric": "power_cycles", "max": 10}], trials=8)
    study = run_study(spec, tmp_path, tmp_path / "d")
    trials = study.get_trials()
    assert any(not feasible(t) for t in trials)  # small capacitors brown out often
    for t in pareto(spec, trials):
        assert t.user_attrs["metrics"]["power_cycles"] <= 10


def test_a_design_the_scenario_refuses_is_a_failed_trial_with_the_reason(tmp_path: Path) -> None:
    spec = _spec(parameter=[{"field": "storage.v_on_v", "values": [2.2, 3.9]}], trials=4, startup_trials=4)
    ev = evaluate(spec, tmp_path, {"storage.v_on_v": 1})
    assert ev.error is not None and "v_on_v" in ev.error
    study = run_study(spec, tmp_path, tmp_path / "d")
    failed = [t for t in study.get_trials() if t.values is None]
    assert failed and all("v_on_v" in t.user_attrs["error"] for t in failed)


def test_cases_and_the_worst_statistic(tmp_path: Path) -> None:
    cases = [{"name": "bright", "set": {"harvester.lux": 1000.0}}, {"name": "dim", "set": {"harvester.lux": 400.0}}]
    params = {"storage.capacitance_f": 2, "storage.v_on_v": 2}  # 220 uF, on at 2.2 V
    worst = evaluate(_spec(case=cases, statistic="worst"), tmp_path, params)
    mean = evaluate(_spec(case=cases, statistic="mean"), tmp_path, params)
    per = [run["phase_send_completed"] for run in worst.per_run]  # 0 where no packet went out
    assert len(per) == 2 and per[0] > per[1]  # less light, fewer packets
    assert worst.metrics["phase_send_completed"] == min(per)
    assert mean.metrics["phase_send_completed"] == sum(per) / 2


def test_bad_specs_are_one_error_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="one of them"):
        _spec(parameter=[{"field": "storage.v_on_v", "low": 2.0, "high": 3.0, "values": [2.0, 3.0]}])
    with pytest.raises(ConfigError, match="low < high"):
        _spec(parameter=[{"field": "storage.v_on_v", "low": 3.0, "high": 2.0}])
    with pytest.raises(ConfigError, match="parts choose storage.capacitance_f"):
        _spec(parameter=[{"field": "storage.v_on_v", "parts": "capacitors"}])
    with pytest.raises(ConfigError, match="no such catalogue"):
        load_parts("unobtainium")
    bad = tmp_path / "bad.toml"
    bad.write_text('scenario = "indoor_office"\n[[parameter]]\nfield = "storage.v_on_v"\nlow = 2.0\nhigh = 3.0\n'
                   '[[objective]]\nmetric = "completed"\ngoal = "maximise"\n')
    with pytest.raises(ConfigError, match="objective.0.goal"):
        load_spec(bad)
    proc = trickle("design", str(bad), "--out", str(tmp_path / "o"))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "goal" in proc.stderr


def test_the_catalogue_is_ordered_by_capacitance_and_sets_the_leakage() -> None:
    spec = _spec(parameter=[{"field": "storage.capacitance_f", "parts": "capacitors"}])
    parts = spec.parameter[0].choices
    assert parts is not None and [p.capacitance_f for p in parts] == sorted(p.capacitance_f for p in parts)
    chosen = spec.overrides({"storage.capacitance_f": 0})
    assert chosen["storage.capacitance_f"] == parts[0].capacitance_f
    assert chosen["storage.leakage_r_ohm"] == parts[0].leakage_r_ohm
    assert spec.design_metrics({"storage.capacitance_f": 0})["capacitor_volume_mm3"] == parts[0].volume_mm3


@pytest.mark.slow
def test_designs_simulated_as_ray_tasks_give_the_local_study(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from models.design.report import summary

    local = summary(_spec(), run_study(_spec(), tmp_path, tmp_path / "a", workers=2), None)
    on_ray = summary(_spec(), run_study(_spec(), tmp_path, tmp_path / "b", workers=2, cluster="ray"), None)
    assert on_ray == local
    with pytest.raises(ConfigError, match="ray or ray:ADDRESS"):
        run_study(_spec(), tmp_path, tmp_path / "c", workers=2, cluster="dask")
