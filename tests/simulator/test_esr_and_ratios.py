"""A capacitor's ESR (the terminals sag by I x R under the load's current, so the load stops that much
above the cut-off) and the ratio metrics of the summary (tasks completed / sensing events, packets
delivered / packets sent), against hand-worked figures."""

from __future__ import annotations

from typing import Any

import pytest

from edge.core.errors import ConfigError
from simulator.fleet import simulate
from simulator.node import NodeEvent
from simulator.results import NodeResult
from tests.simulator.test_power_path import LDO, run_one

LISTEN_A = 5e-3  # a program phase drawn as a current behind the LDO: the capacitor gives it this plus the LDO's IQ
WORK = {"program": [{"name": "listen", "run": "until_power_fails", "current_a": LISTEN_A}]}
LDO_IQ_A = 2e-6  # the LDO's quiescent current while on
V_OFF = 2.0  # the scenario's cut-off (the gate; the MCU's brown-out behind the LDO lies lower)


def _failures_v(r: NodeResult) -> list[float]:
    assert r.trace is not None
    return [v for v, e in zip(r.trace["voltage_v"], r.trace["event"]) if e == NodeEvent.V_CUT]


def test_esr_stops_the_load_at_the_cut_off_plus_the_drop_under_its_current() -> None:
    esr_ohm = 20.0
    assert LDO["quiescent_on_a"] == LDO_IQ_A
    drop_v = (LISTEN_A + LDO_IQ_A) * esr_ohm  # 0.10004 V
    with_esr = run_one(storage={"esr_ohm": esr_ohm}, workload=WORK)
    fails = _failures_v(with_esr)
    assert len(fails) > 3 and fails == pytest.approx([V_OFF + drop_v] * len(fails), abs=1e-9)
    # the same node without ESR fails at the cut-off itself, and stays on longer each cycle
    plain = run_one(workload=WORK)
    assert _failures_v(plain) == pytest.approx([V_OFF] * len(_failures_v(plain)), abs=1e-9)
    assert plain.stats.on_time_s / plain.stats.power_cycles > with_esr.stats.on_time_s / with_esr.stats.power_cycles
    # ... and is the node whose cut-off is raised by the drop: the same cycles, the same on-time
    raised = run_one(storage={"v_off_v": V_OFF + drop_v}, workload=WORK)
    assert raised.stats.power_cycles == with_esr.stats.power_cycles
    assert raised.stats.on_time_s == pytest.approx(with_esr.stats.on_time_s, rel=1e-9)


def test_an_esr_whose_drop_reaches_the_turn_on_voltage_is_one_error_naming_it() -> None:
    # 1 V across the ESR under 5 mA: the load would stop at 3.0 V, where it switches on
    with pytest.raises(ConfigError, match=r"storage\.esr_ohm.*200.*5 mA.*switches on \(3 V\)"):
        run_one(storage={"esr_ohm": 200.0}, workload=WORK)


def test_the_ratio_metrics_divide_what_the_summary_counts(tiny_overrides: dict[str, dict[str, Any]]) -> None:
    from simulator import load_scenario

    overrides = {**tiny_overrides, "network": {"loss_probability": 0.3}}
    s = simulate(load_scenario(**overrides)).summary
    sent = s["packets_delivered"] + s["packets_collided"] + s["packets_lost"] + s["packets_below_sensitivity"]
    assert sent > 10 and 0 < s["packets_delivered"] < sent
    assert s["packets_delivered_ratio"] == s["packets_delivered"] / sent
    assert s["released"] > 0 and s["tasks_completed_ratio"] == s["completed"] / s["released"]
    assert 0.5 < s["packets_delivered_ratio"] < 0.9  # 30 % of packets lost at random
