"""A reconfigurable bank (storage.bank_f): capacitors switched onto the bus by voltage thresholds,
against closed forms. Between events the bus is one capacitor of the capacitance connected, so
the RC law holds; at a connection the charge is shared, v' = (C v + C_j u) / (C + C_j), and
C C_j (v - u)^2 / 2 (C + C_j) is lost; an isolated capacitor decays as u exp(-t / R C_j)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from edge.core.errors import ConfigError
from simulator.config import build_scenario
from simulator.fleet import simulate
from simulator.node import NodeEvent
from tests.simulator.test_node import ETA_IN, NO_LEAK, NO_TASKS, run_one, scenario

C0, C1 = 1e-3, 4e-3
V_CONNECT, V_ISOLATE = 2.5, 2.1
BANK = {"bank_f": [C1], "bank_connect_v": V_CONNECT, "bank_isolate_v": V_ISOLATE}


def test_connecting_an_empty_capacitor_shares_the_charge_and_loses_the_closed_form() -> None:
    # 1 mW into 1 mF with nothing else drawing: v^2 = v0^2 + 2 p t / C on each side of the switch
    p = ETA_IN * 1e-3
    storage = {"capacitance_f": C0, "v_max_v": 3.6, "v_on_v": 3.0, "v_off_v": 2.0, "v_initial_v": 0.0, **NO_LEAK, **BANK}
    node = run_one(run={"duration_s": 60.0}, harvester={"kind": "constant", "power_w": 1e-3}, storage=storage,
                   workload=NO_TASKS)
    t1 = C0 * V_CONNECT**2 / (2 * p)
    v_shared = C0 * V_CONNECT / (C0 + C1)
    t2 = (C0 + C1) * (3.0**2 - v_shared**2) / (2 * p)
    assert node.on_at_s is not None and node.on_at_s[0] == pytest.approx(t1 + t2, rel=1e-12)
    loss = 0.5 * C0 * C1 * V_CONNECT**2 / (C0 + C1)
    st = node.stats
    assert st.switching_loss_j == pytest.approx(loss, rel=1e-12)
    # the books balance with the loss in them; the bank's energy is stored
    assert st.stored_delta_j == pytest.approx(0.5 * (C0 + C1) * st.v_final_v**2, rel=1e-12)
    assert st.harvested_j * ETA_IN == pytest.approx(st.stored_delta_j + st.switching_loss_j + st.load_j / 0.9
                                                    + st.wasted_j, rel=1e-12)


def test_isolated_capacitor_keeps_its_charge_minus_its_leakage_until_it_reconnects(tmp_path: Path) -> None:
    # 1 mW for 20 s, then nothing for 30 s, then 1 mW again: the bus rises, connects C1, the node
    # runs and drains it, C1 is isolated at 2.1 V, decays through 1 MOhm, and reconnects later
    r = 1e6
    trace = tmp_path / "harvest.csv"
    trace.write_text("time,power_w\n0,1e-3\n20,0\n50,1e-3\n120,1e-3\n")
    storage = {"capacitance_f": C0, "v_max_v": 3.6, "v_on_v": 2.3, "v_off_v": 2.0, "v_initial_v": 0.0, **NO_LEAK,
               **BANK, "bank_leakage_r_ohm": r}
    sc = scenario(run={"duration_s": 120.0}, harvester={"kind": "trace", "path": str(trace)}, storage=storage,
                  workload={"sense_period_s": 2.0})
    node = simulate(sc).nodes[0]
    assert node.trace is not None
    trace = node.trace
    bank = [(t, v) for t, v, e in zip(trace["time_s"], trace["voltage_v"], trace["event"]) if e == NodeEvent.V_BANK]
    assert len(bank) >= 3 and len(bank) % 2 == 0, bank  # it connects, is isolated, connects again, ...
    expected_loss, u = 0.0, 0.0  # C1 starts empty
    for k in range(0, len(bank), 2):
        (_, v_after), (t_iso, v_iso) = bank[k], bank[k + 1]
        # the trace shows the voltage after the switch: the shared charge, from V_CONNECT and C1's u
        assert v_after == pytest.approx((C0 * V_CONNECT + C1 * u) / (C0 + C1), rel=1e-12)
        expected_loss += 0.5 * C0 * C1 * (V_CONNECT - u) ** 2 / (C0 + C1)
        assert v_iso == pytest.approx(V_ISOLATE, rel=1e-12)
        if k + 2 < len(bank):
            u = V_ISOLATE * math.exp(-(bank[k + 2][0] - t_iso) / (r * C1))  # decayed through its own R
    st = node.stats
    assert st.switching_loss_j == pytest.approx(expected_loss, rel=1e-12)
    balance = (st.harvested_j - st.input_loss_j - st.wasted_j - st.leaked_j - st.load_j - st.output_loss_j
               - st.stored_delta_j - st.switching_loss_j)
    assert abs(balance) <= 1e-12 * st.harvested_j


def test_a_bank_outside_its_thresholds_is_one_error() -> None:
    base = scenario().model_dump()
    for bad, match in (({"bank_f": [C1]}, "bank_isolate_v"),
                       ({**BANK, "bank_connect_v": 3.7}, "bank_isolate_v"),
                       ({**BANK, "bank_isolate_v": 2.6}, "bank_isolate_v"),
                       ({**BANK, "bank_f": [0.0]}, "bank_f")):
        data = {**base, "storage": {**base["storage"], **bad}}
        with pytest.raises(ConfigError, match=match):
            build_scenario(data)
    data = {**base, "storage": {**base["storage"], **BANK}, "output": {"kind": "direct"}}
    with pytest.raises(ConfigError, match="converter"):
        build_scenario(data)
