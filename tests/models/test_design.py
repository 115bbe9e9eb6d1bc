"""trickle design: a design study over the simulator (Optuna's GP sampler), its report, its
scenario files, resuming, constraints and the errors a user can cause."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from edge.core.errors import ConfigError
from models.design.search import REFUSED, evaluate, run_study
from models.design.spec import DesignSpec, load_parts, load_spec, prepare
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
    assert (out / "study.log").is_file() and all((out / p).is_file() for p in doc["scenario_files"])
    assert (out / "chosen" / "report.md").is_file() == bool(doc["scenario_files"])
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


def test_a_design_the_scenario_refuses_is_a_refused_trial_with_the_reason(tmp_path: Path) -> None:
    spec = _spec(parameter=[{"field": "storage.v_on_v", "values": [2.2, 3.9]}], trials=4, startup_trials=4)
    ev = evaluate(spec, tmp_path, {"storage.v_on_v": 1})
    assert ev.error is not None and "v_on_v" in ev.error
    study = run_study(spec, tmp_path, tmp_path / "d")
    failed = [t for t in study.get_trials() if "error" in t.user_attrs]
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


def test_a_best_file_carries_the_case_and_seed_that_decide_its_figure(tmp_path: Path) -> None:
    """The worst of a bright and a dim case is the dim one's figure: the file must be the dim case
    (and the spec's seed, not the base's), or it simulates to the bright one's."""
    from models.design.report import resimulate_best, write_report
    from simulator import load_scenario, simulate

    cases = [{"name": "bright", "set": {"harvester.lux": 1000.0}}, {"name": "dim", "set": {"harvester.lux": 400.0}}]
    spec = _spec(case=cases, statistic="worst", seeds=[3])
    study = run_study(spec, tmp_path, tmp_path / "d")
    doc = write_report(spec, tmp_path, study, None, tmp_path / "d", 1.0, chosen_report=False)
    best = doc["best"][0]
    assert best["file_case"] == "dim" and best["file_seed"] == 3
    scenario = load_scenario(tmp_path / "d" / best["scenario_file"])
    assert scenario.harvester.lux == 400.0 and scenario.run.seed == 3  # type: ignore[union-attr]
    assert simulate(scenario).summary["phase_send_completed"] == best["values"][0] > 0
    assert all(r["matches"] for r in resimulate_best(spec, doc, tmp_path / "d"))
    trial = next(t for t in study.get_trials() if t.number == best["number"])
    bright = [r for r in trial.user_attrs["per_run"] if r["case"] == "bright"]
    assert bright and bright[0]["phase_send_completed"] > best["values"][0]  # the case the old file simulated


def test_resume_after_a_design_cut_mid_choice_always_reports(tmp_path: Path) -> None:
    """Ctrl-C between two of a design's choices leaves a trial with some parameters: it is left out,
    the study continues, and every later resume reports too."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from models.design.report import write_report

    out = tmp_path / "d"
    run_study(_spec(trials=3), tmp_path, out)
    storage = JournalStorage(JournalFileBackend(str(out / "study.log")))
    cut = optuna.load_study(study_name="t", storage=storage).ask()
    cut.suggest_int("storage.capacitance_f", 0, 3)  # interrupted before storage.v_on_v was chosen
    for trials in (5, 6):
        study = run_study(_spec(trials=trials), tmp_path, out, resume=True)
        doc = write_report(_spec(), tmp_path, study, None, out, 1.0, chosen_report=False)
        assert doc["evaluated"] == trials and doc["interrupted"] == 1 and len(doc["trials"]) == trials
        assert cut.number not in [t["number"] for t in doc["trials"]]


def test_ctrl_c_is_one_line_and_the_study_resumes(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    import tomli_w

    spec = tmp_path / "spec.toml"
    doc = _spec(trials=400, random_baseline=False).model_dump(exclude_defaults=True)
    spec.write_text(tomli_w.dumps(doc))
    out = tmp_path / "d"
    # Ctrl-C as at a terminal: a suite started in the background (`make test &`) runs with SIGINT ignored,
    # which its children would inherit, and then no Ctrl-C reaches the study at all
    proc = subprocess.Popen([sys.executable, "-m", "trickle", "design", str(spec), "--out", str(out), "--workers", "2",
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    log = out / "study.log"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not log.exists() or log.read_text().count('"values"') < 4):
        time.sleep(0.2)  # until a few designs are in, GP proposals among them
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group, workers too
    _, err = proc.communicate(timeout=60)
    # 130, or killed by SIGINT (Python's exit for an interrupt that passed through nested C code): $? 130 alike
    assert proc.returncode in (130, -signal.SIGINT)
    assert err.strip().count("\n") == 0, err
    assert "interrupted; resume with: trickle design" in err and f"--out {out} --resume" in err
    again = trickle("design", str(spec), "--out", str(out), "--resume", "--trials", "4", "--no-progress", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["evaluated"] >= 4


@pytest.mark.parametrize(("change", "named"), [
    ({"parameter": [{"field": "storage.v_onn_v", "low": 2.2, "high": 3.0}]}, "parameter storage.v_onn_v.*v_on_v"),
    ({"scenario": "indoor_ofice"}, "scenario = 'indoor_ofice'.*indoor_office"),
    ({"parameter": [{"field": "storage.capacitance_f", "low": -2e-3, "high": -1e-3}]},
     r"parameter storage.capacitance_f = -0.002.*greater than 0"),
    ({"parameter": [{"field": "storage.capacitance_f", "low": -1e-3, "high": 1e-3}]},
     r"parameter storage.capacitance_f = -0.001.*greater than 0"),
    ({"parameter": [{"field": "workload.sense_period_s", "values": [60, -30]}]}, "sense_period_s = -30"),
    ({"set": {"storage.leakage": 1e6}}, r"set.storage.leakage.*leakage_r_ohm"),
    ({"case": [{"name": "dim", "set": {"harvester.luxx": 200}}]}, "case 'dim'.*harvester.luxx.*lux"),
])
def test_a_spec_error_is_one_line_naming_the_parameter_before_anything_runs(
        tmp_path: Path, change: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        prepare(_spec(**change), tmp_path)


def test_a_bad_parameter_is_one_line_from_the_command_line_and_nothing_is_written(tmp_path: Path) -> None:
    import time

    spec = tmp_path / "bad.toml"
    spec.write_text('scenario = "indoor_office"\n[[parameter]]\nfield = "storage.v_onn_v"\nlow = 2.4\nhigh = 3.4\n'
                    '[[objective]]\nmetric = "completed"\n')
    started = time.perf_counter()
    proc = trickle("design", str(spec), "--out", str(tmp_path / "o"))
    wall_s = time.perf_counter() - started
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "storage.v_onn_v" in proc.stderr and "v_on_v" in proc.stderr
    assert not (tmp_path / "o").exists()  # no study was started
    assert wall_s < 10  # about 1 s on an idle machine: no simulation, no torch


def test_refused_designs_are_told_to_the_sampler_and_not_proposed_again(tmp_path: Path) -> None:
    """Half the turn-on voltages lie above the clamp (3.6 V): each such design is refused. Told to
    the GP as a violated constraint, none is proposed again once the GP leads (random draws lead
    until two built designs differ)."""
    from models.design.search import designs_differ

    spec = _spec(parameter=[{"field": "storage.capacitance_f", "values": [47e-6, 100e-6, 220e-6, 470e-6]},
                            {"field": "storage.v_on_v", "values": [2.0, 2.1, 2.2, 3.7, 3.8, 3.9]}],
                 trials=16, startup_trials=3)
    trials = run_study(spec, tmp_path, tmp_path / "d").get_trials()
    refused = [t for t in trials if "error" in t.user_attrs]
    assert refused and all(t.constraints[REFUSED] > 0 and "v_on_v" in t.user_attrs["error"] for t in refused)
    for t in trials:  # the same constraint tells the sampler which built designs complete nothing
        assert (t.constraints[REFUSED] < 0) == ("error" not in t.user_attrs and t.values[0] > 0)
    led = next(k for k in range(len(trials)) if designs_differ(spec, trials[:k]))  # the GP's first proposal
    assert led <= 10 and not any("error" in t.user_attrs for t in trials[max(led, spec.startup_trials):])


def test_a_design_that_completes_nothing_is_not_offered(tmp_path: Path) -> None:
    """1 uF never stores a BLE packet's energy: the smallest capacitor, but no design."""
    from models.design.report import summary
    from models.design.search import pareto

    spec = _spec(parameter=[{"field": "storage.capacitance_f", "values": [1e-6, 220e-6]},
                            {"field": "storage.v_on_v", "values": [2.1, 2.2]}],
                 objective=[{"metric": "phase_send_completed"}, {"metric": "capacitance_f", "goal": "minimize"}],
                 sampler="random", trials=6, seed=0)
    study = run_study(spec, tmp_path, tmp_path / "d")
    tiny = [t for t in study.get_trials() if t.params["storage.capacitance_f"] == 0]
    assert tiny and len(tiny) < 6 and all(t.values[0] == 0 for t in tiny)  # it completes nothing (and is smallest)
    front = pareto(spec, study.get_trials())
    assert front and all(t.values[0] > 0 for t in front)
    assert summary(spec, study, None)["complete_nothing"] == len(tiny)


def test_the_catalogue_rates_each_part_against_the_clamp(tmp_path: Path) -> None:
    parts = {p.name: p for p in load_parts("capacitors")}
    assert all(p.rated_voltage_v > 0 and p.esr_ohm >= 0 for p in parts.values())
    spec = prepare(_spec(parameter=[{"field": "storage.capacitance_f", "parts": "capacitors"}]), tmp_path)
    usable = spec.parameter[0].choices
    assert usable is not None and all(p.rated_voltage_v >= 3.6 for p in usable)  # the botoks node clamps at 3.6 V
    assert "supercapacitor 1 F 2.7 V (8 x 13 mm)" not in [p.name for p in usable]
    assert any("1 F 2.7 V" in e and "below the clamp (3.6 V)" in e for e in spec.parameter[0].excluded)
    assert prepare(spec, tmp_path) == spec  # a prepared spec prepares to itself
    # a lower clamp lets the 3.3 V parts in; none rated for it is one error
    low = prepare(_spec(parameter=[{"field": "storage.capacitance_f", "parts": "capacitors"}],
                        set={"nodes.count": 1, "run.duration_s": 120.0, "storage.v_max_v": 3.3}), tmp_path)
    assert "supercapacitor 47 mF 3.3 V (coin, 6.8 mm)" in [p.name for p in low.parameter[0].choices or []]
    weak = [{"name": "EDLC 2.7 V", "capacitance_f": 0.1, "rated_voltage_v": 2.7, "esr_ohm": 0.1, "volume_mm3": 100.0,
             "cost_usd": 1.0}]
    with pytest.raises(ConfigError, match=r"no part is rated for the clamp \(3.6 V.*2.7 V \(EDLC 2.7 V\)"):
        prepare(_spec(parameter=[{"field": "storage.capacitance_f", "parts": weak}]), tmp_path)


def test_a_searched_clamp_refuses_each_design_whose_part_it_exceeds(tmp_path: Path) -> None:
    parts = [{"name": f"{v} V part", "capacitance_f": 220e-6, "rated_voltage_v": v, "esr_ohm": 0.0, "volume_mm3": 10.0,
              "cost_usd": 1.0} for v in (3.0, 5.5)]
    spec = prepare(_spec(parameter=[{"field": "storage.capacitance_f", "parts": parts},
                                    {"field": "storage.v_max_v", "values": [2.8, 3.6]}]), tmp_path)
    assert [p.name for p in spec.parameter[0].choices or []] == ["3.0 V part", "5.5 V part"]  # not narrowed
    refused = evaluate(spec, tmp_path, {"storage.capacitance_f": 0, "storage.v_max_v": 1})
    assert refused.error is not None and "rated 3 V, below the clamp (3.6 V)" in refused.error
    for chosen in ({"storage.capacitance_f": 0, "storage.v_max_v": 0}, {"storage.capacitance_f": 1, "storage.v_max_v": 1}):
        assert evaluate(spec, tmp_path, chosen).error is None


def test_a_part_sets_its_esr_and_the_simulation_feels_it(tmp_path: Path) -> None:
    parts = [{"name": f"{esr} ohm", "capacitance_f": 220e-6, "rated_voltage_v": 6.3, "esr_ohm": esr, "volume_mm3": 10.0,
              "cost_usd": 1.0} for esr in (0.0, 30.0)]
    spec = _spec(parameter=[{"field": "storage.capacitance_f", "parts": parts}],
                 objective=[{"metric": "on_period_mean_s", "goal": "maximize"}])
    assert spec.overrides({"storage.capacitance_f": 1})["storage.esr_ohm"] == 30.0
    low, high = (evaluate(spec, tmp_path, {"storage.capacitance_f": i}) for i in (0, 1))
    assert low.error is None and high.error is None
    # 6.4 mA across 30 ohm: the load stops 0.19 V higher, so each on-period is shorter
    assert high.metrics["on_period_mean_s"] < 0.8 * low.metrics["on_period_mean_s"]


def test_the_ratio_metrics_are_design_objectives_and_constraints(tmp_path: Path) -> None:
    spec = _spec(objective=[{"metric": "tasks_completed_ratio"}],
                 constraint=[{"metric": "packets_delivered_ratio", "min": 0.95}], trials=4)
    study = run_study(spec, tmp_path, tmp_path / "d")
    for t in study.get_trials():
        ratio = t.user_attrs["metrics"]["packets_delivered_ratio"]
        assert 0.0 <= ratio <= 1.0 and 0.0 <= t.values[0] <= 1.0
        assert (t.user_attrs["constraints"][0] <= 0) == (ratio >= 0.95)


def test_a_stepped_range_gives_values_on_its_grid_without_float_residue() -> None:
    # 2.4 + 6 * 0.1 is 3.0000000000000004 in floating point; the scenario file and design.json said so
    from models.design.spec import Parameter

    stepped = Parameter(field="storage.v_on_v", low=2.4, high=3.6, step=0.1)
    assert stepped.value(2.4 + 6 * 0.1) == 3.0 and repr(stepped.value(3.1000000000000005)) == "3.1"
    assert Parameter(field="storage.v_on_v", low=2.4, high=3.6).value(2.4 + 6 * 0.1) == 2.4 + 6 * 0.1
    assert Parameter(field="workload.sense_period_s", low=10, high=600, integer=True, step=10).value(120) == 120
