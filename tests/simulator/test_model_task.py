"""A trained model as the node's task: accuracy within deadline and DynInfer's choice in the loop."""

from __future__ import annotations

import numpy as np
import pytest

from edge.core.errors import ConfigError
from simulator.config import load_scenario
from simulator.fleet import simulate
from simulator.workload import InferenceModel, LayerSpec, ModelVariant

BIG = (LayerSpec(name="l1", macs=200_000, output_bytes=512), LayerSpec(name="l2", macs=100_000, output_bytes=10))
SMALL = (LayerSpec(name="l1", macs=20_000, output_bytes=128), LayerSpec(name="l2", macs=10_000, output_bytes=10))


def variant(layers: tuple[LayerSpec, ...], correct: list[bool], bits: int = 8) -> ModelVariant:
    c = np.array(correct, dtype=bool)
    return ModelVariant(bits=bits, drop=0.0, layers=layers, correct=c, accuracy=float(c.mean()))


def scenario(power_w: float, capacitance_f: float, policy: str = "per_layer"):  # type: ignore[no-untyped-def]
    return load_scenario(None, run={"duration_s": 600.0, "workers": 1, "seed": 2},
                         harvester={"kind": "constant", "power_w": power_w},
                         storage={"capacitance_f": capacitance_f, "v_initial_v": 3.0},
                         workload={"sense_period_s": 5.0, "policy": policy, "send_packet": False}, nodes={"count": 2})


def test_accuracy_within_deadline_counts_only_right_and_timely_results() -> None:
    sc = scenario(0.05, 0.01)
    right = simulate(sc, model=InferenceModel((variant(BIG, [True] * 10),), adaptive=False)).summary
    wrong = simulate(sc, model=InferenceModel((variant(BIG, [False] * 10),), adaptive=False)).summary
    # continuous power: every event is served in time but one still running at the end
    assert right["completed"] + right["unfinished"] == right["released"] > 100 and right["missed"] == 0
    assert right["accuracy_within_deadline"] == right["completed"] / right["released"]
    assert wrong["accuracy_within_deadline"] == 0.0
    half = simulate(sc, model=InferenceModel((variant(BIG, [True, False] * 50),), adaptive=False)).summary
    assert 0.35 < half["accuracy_within_deadline"] < 0.65  # each event observes a random test sample


def test_dyninfer_picks_the_variant_the_energy_affords() -> None:
    model = InferenceModel((variant(BIG, [True] * 4), variant(SMALL, [True, True, True, False], bits=4)))
    rich = simulate(scenario(0.05, 0.01), model=model).summary
    assert rich["variant_8b_d0_tasks"] > 0 and rich["variant_4b_d0_tasks"] == 0  # plenty: the accurate one
    # 47 µF holds ~0.1 mJ between 3.0 and 2.0 V: less than BIG costs, so the cheaper variant runs
    poor = simulate(scenario(0.05, 47e-6, policy="quanta"), model=model).summary
    assert poor["variant_4b_d0_tasks"] > 0


def test_an_early_decision_task_senses_until_the_rule_stops() -> None:
    """Each task observes one test series and senses as many samples as the rule takes on it: under
    continuous power the energy per decision is that count times one sample's sense + frame model
    (closed form from the plan), and accuracy follows the series' verdicts."""
    from simulator.workload import EarlyTask

    sc = scenario(0.05, 0.01)
    frame = variant(SMALL, [True, False, True, True])
    runs = {}
    for name, taken in (("early", [2, 5, 3, 2]), ("full", [8, 8, 8, 8])):
        model = InferenceModel((frame,), adaptive=False, early=EarlyTask(np.array(taken), horizon=8))
        runs[name] = simulate(sc, model=model)
    early, full = runs["early"].summary, runs["full"].summary
    assert full["samples_per_decision"] == 8 and full["decisions"] > 100
    step_j = runs["full"].plan_energy_j[0]  # one sample: sense, then the frame model
    assert runs["full"].plan_energy_j[4] == pytest.approx(5 * step_j)
    assert full["energy_per_decision_j"] == pytest.approx(8 * step_j)
    assert early["energy_per_decision_j"] == pytest.approx(early["samples_per_decision"] * step_j)
    assert 2.3 < early["samples_per_decision"] < 3.7  # each event a random series of the four
    assert 0.6 < early["accuracy_within_deadline"] < 0.9
    with pytest.raises(ConfigError, match="model.early"):
        InferenceModel((frame,), early=EarlyTask(np.array([1, 9, 2, 2]), horizon=8))
