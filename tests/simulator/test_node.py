"""One node end to end (config → fleet.simulate) against hand-derived physics and invariants.

Expected numbers come from the capacitor ODE C·v·dv/dt = p − i·v − g·v² solved by hand
(energy over power, the RC law in u = v², scipy quadrature, solve_ivp) and from the
MSP430FR5994 datasheet figures written out below, never from the engine itself.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

import numpy as np
import pytest
from scipy.integrate import quad, solve_ivp

from edge.core.errors import ConfigError
from simulator.config import Scenario, build_scenario
from simulator.devices import MCUS
from simulator.fleet import simulate
from simulator.node import Mode
from simulator.results import NodeResult

# MSP430FR5994 at 8 MHz (TI SLASE54D): 118 µA/MHz at 3.0 V, LPM3 0.5 µA, 0.5 ms boot, 16 cycles per MAC (estimate),
# FRAM by DMA at one MCLK cycle per byte.
ACTIVE_W = 118e-6 * 8 * 3.0  # 2.832 mW
SLEEP_W = 0.5e-6 * 3.0
BOOT_S = 0.5e-3
S_PER_MAC = 16 / 8e6
NVM_S_PER_BYTE = 1 / 8e6
NVM_J_PER_BYTE = 118e-6 / 1e6 * 3.0
ETA_IN, ETA_OUT = 0.8, 0.9  # StorageConfig defaults, written out in every scenario below
POLICIES = ("restart", "jit", "per_layer", "loop_continuation")

# A 470 µF node on 200 µW whose task (4 × 120k MACs, 0.96 s of compute) needs more than the capacitor holds.
SMALL_CAP = {"capacitance_f": 470e-6, "v_max_v": 3.3, "v_on_v": 3.0, "v_off_v": 2.0, "v_initial_v": 0.0}
LAYER_MACS = 120_000
LAYERS = [{"name": f"layer{k}", "macs": LAYER_MACS, "output_bytes": 256} for k in range(4)]
WEAK_HARVEST_W = 200e-6
PIEZO = {"kind": "piezo", "rate_hz": 0.2, "mean_burst_s": 3.0, "median_power_w": 5e-4}


def scenario(**sections: dict[str, Any]) -> Scenario:
    """One node, harvest scale 1, one worker, trace recorded; ``sections`` override field by field."""
    data: dict[str, dict[str, Any]] = {
        "run": {"duration_s": 600.0, "workers": 1, "seed": 0},
        "nodes": {"count": 1, "harvest_scale_min": 1.0, "harvest_scale_max": 1.0, "record_traces": 1},
        "harvester": {"kind": "constant", "power_w": WEAK_HARVEST_W},
        "storage": {**SMALL_CAP, "input_efficiency": ETA_IN, "output_efficiency": ETA_OUT},
        "workload": {"mcu": "msp430fr5994", "send_packet": False, "sense_period_s": 60.0, "sense_offset_s": 30.0,
                     "layers": LAYERS},
    }
    for name, values in sections.items():
        data[name] = values if name == "harvester" else {**data.get(name, {}), **values}
    return build_scenario(data)


def run_one(**sections: dict[str, Any]) -> NodeResult:
    return simulate(scenario(**sections)).nodes[0]


NO_LEAK = {"leakage_r_ohm": None, "leakage_a": 0.0, "quiescent_a": 0.0}
NO_TASKS = {"sense_period_s": 86400.0, "sense_offset_s": 1e7}  # the first sensing event lies beyond the run


def test_msp430_profile_holds_the_datasheet_figures_used_here() -> None:
    mcu = MCUS["msp430fr5994"]
    assert mcu.active_power_w() == pytest.approx(ACTIVE_W, rel=1e-12)
    assert mcu.sleep_power_w() == pytest.approx(SLEEP_W, rel=1e-12)
    assert (mcu.boot_s, mcu.brown_out_v) == (BOOT_S, 1.8)
    assert mcu.compute_time_s(1) == pytest.approx(S_PER_MAC, rel=1e-12)
    assert mcu.nvm_write_s_per_byte == pytest.approx(NVM_S_PER_BYTE) and mcu.nvm_write_j_per_byte == pytest.approx(NVM_J_PER_BYTE)


# ---- charging and discharging in closed form ---------------------------------------------------


def recorded(r: NodeResult) -> dict[str, list[Any]]:
    """The node's (time_s, voltage_v, mode) at every event."""
    assert r.trace is not None
    return r.trace


def first_on_time_s(trace: dict[str, list[Any]]) -> float:
    return next(t for t, m in zip(trace["time_s"], trace["mode"]) if m != Mode.OFF)


@pytest.mark.parametrize(
    "leak, expected_s",
    [
        # no leakage: ½ C v_on² / (η_in P) = 10 mF · 9 V² / (2 · 0.8 mW)
        (NO_LEAK, 10e-3 * 9.0 / (2 * ETA_IN * 1e-3)),
        # 100 kΩ only: u = v² relaxes to p/g with time constant C/(2g)
        ({**NO_LEAK, "leakage_r_ohm": 1e5}, 10e-3 / (2 * 1e-5) * math.log(0.8e-3 / (0.8e-3 - 1e-5 * 9.0))),
        # 20 µA quiescent only: C ∫ v / (p − i v) dv
        ({**NO_LEAK, "quiescent_a": 20e-6}, quad(lambda v: 10e-3 * v / (0.8e-3 - 20e-6 * v), 0.0, 3.0, epsrel=1e-13)[0]),
    ],
    ids=["no_leak", "resistive", "quiescent"],
)
def test_first_boot_from_empty_capacitor_at_closed_form_time(leak: dict[str, Any], expected_s: float) -> None:
    storage = {"capacitance_f": 10e-3, "v_max_v": 3.6, "v_on_v": 3.0, "v_off_v": 2.0, "v_initial_v": 0.0, **leak}
    r = run_one(run={"duration_s": 100.0}, harvester={"kind": "constant", "power_w": 1e-3}, storage=storage, workload=NO_TASKS)
    trace = recorded(r)
    assert first_on_time_s(trace) == pytest.approx(expected_s, rel=1e-12)
    assert trace["voltage_v"][trace["mode"].index(Mode.BOOT)] == pytest.approx(3.0, rel=1e-14)
    st = r.stats
    assert (st.boots, st.power_cycles, st.released) == (1, 0, 0)
    assert st.on_time_s == pytest.approx(100.0 - expected_s, rel=1e-12)


@pytest.mark.parametrize(
    "r_ohm, v_off, v_cut",
    [(None, 2.0, 2.0), (1e6, 2.0, 2.0), (None, 1.0, 1.8)],  # below the MSP430's 1.8 V brown-out, that is the cut-off
    ids=["no_leak", "resistive", "brown_out"],
)
def test_charged_node_without_harvest_drains_from_v_on_to_cut_off_in_closed_form(
    r_ohm: float | None, v_off: float, v_cut: float
) -> None:
    c, u_on, u_cut = 10e-3, 3.0**2, v_cut**2
    # boot: 0.5 ms at the MCU's active power, then sleep at LPM3 power until the voltage falls to the cut-off
    p_boot, p_sleep = -ACTIVE_W / ETA_OUT, -SLEEP_W / ETA_OUT
    if r_ohm is None:
        u_boot = u_on + 2 * p_boot * BOOT_S / c
        idle_s = c * (u_boot - u_cut) / (2 * -p_sleep)
    else:
        g = 1 / r_ohm
        u_boot = p_boot / g + (u_on - p_boot / g) * math.exp(-2 * g * BOOT_S / c)
        idle_s = c / (2 * g) * math.log((p_sleep - g * u_boot) / (p_sleep - g * u_cut))
    expected_s = BOOT_S + idle_s
    storage = {"capacitance_f": c, "v_max_v": 3.6, "v_on_v": 3.0, "v_off_v": v_off, "v_initial_v": 3.0,
               **NO_LEAK, "leakage_r_ohm": r_ohm}
    r = run_one(run={"duration_s": round(2 * expected_s)}, harvester={"kind": "constant", "power_w": 0.0},
                storage=storage, workload=NO_TASKS)
    st = r.stats
    assert (st.boots, st.power_cycles) == (1, 1)
    assert st.on_time_s == pytest.approx(expected_s, rel=1e-10)
    trace = recorded(r)
    off = [t for t, m in zip(trace["time_s"][1:], trace["mode"][1:]) if m == Mode.OFF]
    assert off[0] == pytest.approx(expected_s, rel=1e-10)
    assert st.load_j == pytest.approx(ACTIVE_W * BOOT_S + SLEEP_W * idle_s, rel=1e-10)
    if r_ohm is None:  # nothing drains an off node without leakage: it stays at the cut-off
        assert st.v_final_v == pytest.approx(v_cut, rel=1e-12)


def test_every_on_and_off_period_takes_its_closed_form_time() -> None:
    """1 µW into 100 µF, no leakage, no tasks: the node boots at v_on, sleeps (LPM3 draws more than
    the harvest) down to the cut-off, charges back to v_on, and so on; each period is energy over power."""
    c, p_in, u_on, u_cut = 100e-6, ETA_IN * 1e-6, 3.0**2, 2.0**2
    off_s = c * (u_on - u_cut) / (2 * p_in)
    u_boot = u_on + 2 * (p_in - ACTIVE_W / ETA_OUT) * BOOT_S / c
    on_s = BOOT_S + c * (u_boot - u_cut) / (2 * (SLEEP_W / ETA_OUT - p_in))
    storage = {"capacitance_f": c, "v_max_v": 3.3, "v_on_v": 3.0, "v_off_v": 2.0, "v_initial_v": 3.0, **NO_LEAK}
    r = run_one(run={"duration_s": 3600.0}, harvester={"kind": "constant", "power_w": 1e-6}, storage=storage,
                workload=NO_TASKS)
    on, off = r.periods()
    assert len(on) == r.stats.power_cycles >= 5 and len(off) == len(on) - (r.stats.boots == r.stats.power_cycles)
    np.testing.assert_allclose(on, on_s, rtol=1e-9)
    np.testing.assert_allclose(off, off_s, rtol=1e-9)
    summary = simulate(scenario(run={"duration_s": 3600.0}, harvester={"kind": "constant", "power_w": 1e-6},
                                storage=storage, workload=NO_TASKS)).summary
    assert summary["on_period_count"] == len(on) and summary["on_period_mean_s"] == pytest.approx(on_s, rel=1e-9)
    assert summary["off_period_min_s"] == pytest.approx(off_s, rel=1e-9)


def test_your_own_mcu_from_the_scenario_file_sets_the_drain() -> None:
    """The closed-form drain of a charged node without harvest (boot, then sleep to the cut-off)
    with a customised MCU: twice the sleep current, a longer boot, a brown-out above v_off."""
    sleep_a, boot_s, brown_out_v, c = 1.0e-6, 2e-3, 2.2, 10e-3
    p_boot, p_sleep = -ACTIVE_W / ETA_OUT, -sleep_a * 3.0 / ETA_OUT
    u_boot = 3.0**2 + 2 * p_boot * boot_s / c
    expected_s = boot_s + c * (u_boot - brown_out_v**2) / (2 * -p_sleep)
    storage = {"capacitance_f": c, "v_max_v": 3.6, "v_on_v": 3.0, "v_off_v": 2.0, "v_initial_v": 3.0, **NO_LEAK}
    r = run_one(run={"duration_s": round(2 * expected_s)}, harvester={"kind": "constant", "power_w": 0.0}, storage=storage,
                workload={**NO_TASKS, "mcu_params": {"sleep_a": sleep_a, "boot_s": boot_s, "brown_out_v": brown_out_v}})
    assert (r.stats.boots, r.stats.power_cycles) == (1, 1)
    assert r.stats.on_time_s == pytest.approx(expected_s, rel=1e-10)
    with pytest.raises(ConfigError, match=r"^workload.mcu_params.sleep_a = -1: should be greater than or equal to 0"):
        scenario(workload={"mcu_params": {"sleep_a": -1}})
    with pytest.raises(ConfigError, match=r"^workload.mcu_params.flash_kb = 1: Extra inputs"):
        scenario(workload={"mcu_params": {"flash_kb": 1}})


def test_your_own_radio_costs_its_transmit_current_per_packet() -> None:
    """Plenty of harvest, so both runs send the same packets; the load differs by exactly the
    packets' radio-on time at the difference in transmit power."""
    from simulator.fleet import tx_timing

    base = {"run": {"duration_s": 600.0}, "harvester": {"kind": "constant", "power_w": 0.05},
            "storage": {"v_initial_v": 3.0, "capacitance_f": 0.1}, "workload": {"send_packet": True}}
    plain = simulate(scenario(**base)).nodes[0].stats
    custom_sc = scenario(**base, network={"radio_params": {"tx_a": 40e-3}})
    custom = simulate(custom_sc).nodes[0].stats
    assert plain.packets_sent == custom.packets_sent > 0 and plain.power_cycles == custom.power_cycles == 0
    _, on_s, _ = tx_timing(custom_sc)
    assert custom.load_j - plain.load_j == pytest.approx(custom.packets_sent * on_s * (40e-3 - 29e-3) * 3.3, rel=1e-9)
    assert custom_sc.network.radio_profile.tx_a == 40e-3 and "customised" in custom_sc.network.radio_profile.name


def test_clamp_wastes_the_surplus_at_v_max() -> None:
    # 10 mW into 10 mF with 10 kΩ leakage only: every stretch is the RC law in u = v², solved here by hand
    c, g, p_in, v_max, duration_s = 10e-3, 1e-4, ETA_IN * 10e-3, 3.6, 60.0
    tau_s = c / (2 * g)

    def rc(u0: float, p: float, t: float) -> tuple[float, float]:
        """(u after t, ∫ u dt) for (C/2) du/dt = p − g u."""
        u_eq = p / g
        decay = math.exp(-t / tau_s)
        return u_eq + (u0 - u_eq) * decay, u_eq * t + (u0 - u_eq) * tau_s * (1 - decay)

    t_on = tau_s * math.log(p_in / (p_in - g * 9.0))  # OFF: 0 → v_on
    _, int_off = rc(0.0, p_in, t_on)
    u_boot, int_boot = rc(9.0, p_in - ACTIVE_W / ETA_OUT, BOOT_S)  # BOOT
    p_idle = p_in - SLEEP_W / ETA_OUT
    t_rise = tau_s * math.log((p_idle - g * u_boot) / (p_idle - g * v_max**2))  # IDLE: → v_max
    _, int_rise = rc(u_boot, p_idle, t_rise)
    t_clamp = duration_s - t_on - BOOT_S - t_rise
    assert t_clamp > 40.0
    storage = {"capacitance_f": c, "v_max_v": v_max, "v_on_v": 3.0, "v_off_v": 2.0, "v_initial_v": 0.0,
               **NO_LEAK, "leakage_r_ohm": 1 / g}
    st = run_one(run={"duration_s": duration_s}, harvester={"kind": "constant", "power_w": 10e-3},
                 storage=storage, workload=NO_TASKS).stats
    assert st.wasted_j == pytest.approx((p_idle - g * v_max**2) * t_clamp, rel=1e-9)
    assert st.leaked_j == pytest.approx(g * (int_off + int_boot + int_rise + v_max**2 * t_clamp), rel=1e-9)
    assert st.v_final_v == pytest.approx(v_max, rel=1e-14)
    assert st.stored_delta_j == pytest.approx(0.5 * c * v_max**2, rel=1e-12)
    assert st.on_time_s == pytest.approx(duration_s - t_on, rel=1e-12)


# ---- energy bookkeeping --------------------------------------------------------------------------


def test_leakage_while_charging_matches_solve_ivp() -> None:
    # an OFF node charging through 100 kΩ and 3 µA of constant draw, stopped before it reaches v_on
    c, p, i, g, duration_s = 10e-3, ETA_IN * 1e-3, 3e-6, 1e-5, 40.0

    def rhs(_t: float, y: np.ndarray) -> list[float]:
        u = max(y[0], 0.0)
        v = math.sqrt(u)
        return [2 * (p - i * v - g * u) / c, i * v + g * u]  # u = v², and the leaked energy

    sol = solve_ivp(rhs, (0.0, duration_s), [0.0, 0.0], method="DOP853", rtol=1e-12, atol=1e-15)
    u_end, leaked_j = sol.y[:, -1]
    assert u_end < 9.0
    storage = {"capacitance_f": c, "v_max_v": 3.6, "v_on_v": 3.0, "v_off_v": 2.0, "v_initial_v": 0.0,
               "leakage_r_ohm": 1 / g, "leakage_a": 1e-6, "quiescent_a": 2e-6}
    st = run_one(run={"duration_s": duration_s}, harvester={"kind": "constant", "power_w": 1e-3},
                 storage=storage, workload=NO_TASKS).stats
    assert st.boots == 0 and st.on_time_s == 0.0
    assert st.v_final_v == pytest.approx(math.sqrt(u_end), rel=1e-9)
    assert st.leaked_j == pytest.approx(leaked_j, rel=1e-8)


@pytest.mark.parametrize("leaky", [False, True], ids=["no_leak", "leak"])
@pytest.mark.parametrize("policy", POLICIES)
def test_energy_books_balance_for_every_policy(policy: str, leaky: bool) -> None:
    i, g = (3e-6, 1e-6) if leaky else (0.0, 0.0)
    leak = {"leakage_r_ohm": 1e6 if leaky else None, "leakage_a": 1e-6 if leaky else 0.0, "quiescent_a": 2e-6 if leaky else 0.0}
    duration_s, c = 600.0, SMALL_CAP["capacitance_f"]
    st = run_one(storage=leak, workload={"policy": policy}).stats
    assert st.power_cycles + st.checkpoints > 0  # the run does exercise the failure paths
    assert st.harvested_j == pytest.approx(WEAK_HARVEST_W * duration_s, rel=1e-12)
    assert st.stored_delta_j == pytest.approx(0.5 * c * (st.v_final_v**2 - st.v_initial_v**2), rel=1e-12, abs=1e-15)
    assert st.v_initial_v == 0.0 and 0.0 < st.v_final_v <= SMALL_CAP["v_max_v"]
    assert st.wasted_j >= 0.0 and st.load_j > 0.0 and st.lost_work_j >= 0.0
    if not leaky:
        assert abs(st.leaked_j) <= 1e-12 * st.harvested_j
        return
    # v never exceeds v_max; after the first boot it never falls below v_off (an off node recharges from there)
    p = ETA_IN * WEAK_HARVEST_W
    first_boot_latest_s = 0.5 * c * 9.0 / (p - i * 3.0 - g * 9.0)  # charging against the leakage at v_on
    v_max, v_off = SMALL_CAP["v_max_v"], SMALL_CAP["v_off_v"]
    assert (i * v_off + g * v_off**2) * (duration_s - first_boot_latest_s) <= st.leaked_j
    assert st.leaked_j <= (i * v_max + g * v_max**2) * duration_s


# ---- tasks and policies under power failures -----------------------------------------------------------


def task_accounting(st: Any) -> int:
    return st.lost_off + st.dropped + st.completed + st.missed + st.unfinished


@pytest.mark.parametrize("harvester", [{"kind": "constant", "power_w": WEAK_HARVEST_W}, PIEZO], ids=["constant", "piezo"])
@pytest.mark.parametrize("policy", POLICIES)
def test_every_sensing_event_is_accounted_for(policy: str, harvester: dict[str, Any]) -> None:
    outcomes = np.zeros(5, dtype=int)
    for work, net in [
        ({"sense_period_s": 7.0, "sense_offset_s": 3.0, "queue_capacity": 2}, {}),
        ({"sense_period_s": 2.0, "sense_offset_s": 0.5, "queue_capacity": 0, "send_packet": True}, {"radio": "ble"}),
        ({"sense_period_s": 13.0, "sense_offset_s": 1.0, "queue_capacity": 5, "send_packet": True}, {"radio": "lora"}),
    ]:
        r = run_one(harvester=harvester, workload={"policy": policy, **work}, network=net)
        st = r.stats
        released = math.ceil((600.0 - work["sense_offset_s"]) / work["sense_period_s"])  # events at offset + k·period < 600 s
        assert st.released == released
        assert task_accounting(st) == released, asdict(st)
        assert st.power_cycles > 0 or st.checkpoints > 0
        outcomes += [st.lost_off, st.dropped, st.completed, st.missed, st.unfinished]
    assert outcomes[:2].all(), "the runs should lose events while off and drop them while busy"


def test_restart_never_finishes_a_task_larger_than_the_capacitor_but_the_others_do() -> None:
    c, v_max, v_on, v_cut = 470e-6, 3.3, 3.0, 2.0
    layer_j = LAYER_MACS * S_PER_MAC * ACTIVE_W / ETA_OUT  # drawn from the capacitor
    p_in = ETA_IN * WEAK_HARVEST_W
    # restart: even from a full capacitor, with the harvest during the whole inference, 4 layers do not fit
    assert 4 * layer_j > 0.5 * c * (v_max**2 - v_cut**2) + p_in * 4 * LAYER_MACS * S_PER_MAC
    # one layer, its commit, a boot and a restore fit in what a fresh boot at v_on holds
    overhead_j = (ACTIVE_W * BOOT_S + 2 * 256 * NVM_J_PER_BYTE) / ETA_OUT
    assert layer_j + overhead_j < 0.5 * c * (v_on**2 - v_cut**2)

    results = {policy: run_one(workload={"policy": policy}).stats for policy in POLICIES}
    restart = results["restart"]
    assert (restart.completed, restart.missed, restart.unfinished) == (0, 0, 1)
    assert restart.power_cycles > 20
    for policy in ("jit", "per_layer", "loop_continuation"):
        st = results[policy]
        assert (st.completed, st.missed, st.unfinished) == (10, 0, 0), policy
    assert results["per_layer"].power_cycles > 0 and results["loop_continuation"].power_cycles > 0
    assert results["jit"].checkpoints > 0 and results["jit"].lost_work_j == 0.0


@pytest.mark.parametrize("policy", POLICIES)
def test_lost_work_of_a_single_power_failure_by_hand(policy: str) -> None:
    # A charged 470 µF node, no harvest, no leakage: boot, sleep until the sensing event at 1 ms, sample,
    # then compute until the capacitor reaches v_off. Whatever load energy is left after the sample goes into
    # the layers; the policy decides how much of it a power failure throws away.
    c, release_s = 470e-6, 1e-3
    sense_j = 5e-3 * (ACTIVE_W + 1e-3) + 490 * NVM_J_PER_BYTE
    compute_j = ETA_OUT * 0.5 * c * (3.0**2 - 2.0**2) - ACTIVE_W * BOOT_S - SLEEP_W * (release_s - BOOT_S) - sense_j
    layer_j = LAYER_MACS * S_PER_MAC * ACTIVE_W
    assert layer_j < compute_j < 2 * layer_j  # the failure strikes in the second layer
    tiles = math.ceil(LAYER_MACS / 256)
    tile_j = (LAYER_MACS * S_PER_MAC * ACTIVE_W + tiles * 4 * NVM_J_PER_BYTE) / tiles
    expected_j = {
        "restart": compute_j,  # only the sample is durable
        "per_layer": compute_j - layer_j - 256 * NVM_J_PER_BYTE,  # the first layer and its commit survive
        "loop_continuation": math.fmod(compute_j - tiles * tile_j, tile_j),  # only the tile in flight is lost
        "jit": 0.0,  # checkpointed at 2.4 V, then hibernated until the failure (~250 s later)
    }[policy]
    storage = {"capacitance_f": c, "v_max_v": 3.3, "v_on_v": 3.0, "v_off_v": 2.0, "v_initial_v": 3.0, **NO_LEAK}
    st = run_one(run={"duration_s": 1000.0}, harvester={"kind": "constant", "power_w": 0.0}, storage=storage,
                 workload={"policy": policy, "sense_offset_s": release_s, "sense_period_s": 1000.0}).stats
    assert (st.released, st.power_cycles, st.completed, st.unfinished) == (1, 1, 0, 1)
    assert st.checkpoints == (1 if policy == "jit" else 0)
    assert st.lost_work_j == pytest.approx(expected_j, rel=1e-9, abs=1e-15)


def test_a_sensing_event_while_booting_is_lost() -> None:
    # a charged node boots at t = 0 for 0.5 ms; events at 0.2 ms (booting) and 1.2 ms (idle)
    st = run_one(run={"duration_s": 10.0}, harvester={"kind": "constant", "power_w": 50e-3},
                 storage={"v_initial_v": 3.0}, workload={"sense_offset_s": 0.2e-3, "sense_period_s": 1e-3}).stats
    assert st.released == 10_000
    assert st.lost_off == 1
    assert st.completed >= 1 and task_accounting(st) == st.released


def test_lost_work_falls_from_restart_to_per_layer_to_loop_continuation() -> None:
    lost = {}
    for policy in ("restart", "per_layer", "loop_continuation"):
        st = run_one(workload={"policy": policy}).stats
        assert st.power_cycles >= 10
        lost[policy] = (st.lost_work_j, st.power_cycles)
    assert lost["restart"][0] > lost["per_layer"][0] > lost["loop_continuation"][0] > 0.0
    # a failure loses at most the layer in flight (per_layer), at most one tile (loop_continuation)
    layer_j = LAYER_MACS * S_PER_MAC * ACTIVE_W + 256 * NVM_J_PER_BYTE
    tile_j = 256 * S_PER_MAC * ACTIVE_W + 4 * NVM_J_PER_BYTE
    assert lost["per_layer"][0] <= lost["per_layer"][1] * layer_j * (1 + 1e-9)
    assert lost["loop_continuation"][0] <= lost["loop_continuation"][1] * tile_j * (1 + 1e-9)


# ---- deadlines ---------------------------------------------------------------------------------


def task_duration_s() -> float:
    """restart policy, no packet: sampling (5 ms + 490 B to FRAM) then 4 layers of compute."""
    return 5e-3 + 490 * NVM_S_PER_BYTE + 4 * LAYER_MACS * S_PER_MAC


@pytest.mark.parametrize("margin, outcome", [(1 - 1e-6, "missed"), (1 + 1e-6, "completed")])
def test_a_result_after_the_deadline_is_missed(margin: float, outcome: str) -> None:
    # 50 mW of harvest: no power failure, the task runs in one go from its release at t = 1 s
    duration_s = task_duration_s()
    st = run_one(run={"duration_s": 10.0}, harvester={"kind": "constant", "power_w": 50e-3},
                 storage={"v_initial_v": 3.0},
                 workload={"policy": "restart", "sense_offset_s": 1.0, "sense_period_s": 1000.0,
                           "deadline_s": duration_s * margin}).stats
    assert (st.released, st.power_cycles) == (1, 0)
    assert (st.completed, st.missed) == ((1, 0) if outcome == "completed" else (0, 1))
    assert st.latency_sum_s == pytest.approx(duration_s, rel=1e-9)


def test_power_failures_push_results_past_a_short_deadline() -> None:
    # per_layer finishes every task, but each needs a recharge from v_off to v_on: ≥ ½C(v_on² − v_off²)/(η_in P)
    recharge_s = 0.5 * 470e-6 * (9.0 - 4.0) / (ETA_IN * WEAK_HARVEST_W)
    st = run_one(workload={"policy": "per_layer", "deadline_s": recharge_s}).stats
    assert (st.completed, st.missed, st.unfinished) == (0, 10, 0)
    assert st.latency_sum_s / st.missed > recharge_s


# ---- the exact engine against the fixed-step reference, determinism ----------------------------------


@pytest.mark.parametrize(
    "policy, harvester",
    [("restart", {"kind": "constant", "power_w": WEAK_HARVEST_W}), ("per_layer", {"kind": "constant", "power_w": WEAK_HARVEST_W}),
     ("loop_continuation", PIEZO), ("jit", PIEZO)],
)
def test_exact_engine_agrees_with_fixed_step_euler(policy: str, harvester: dict[str, Any]) -> None:
    stats = {}
    for engine in ("exact", "fixed_step"):
        stats[engine] = run_one(run={"engine": engine, "step_s": 1e-3}, harvester=harvester, workload={"policy": policy}).stats
    exact, euler = stats["exact"], stats["fixed_step"]
    assert exact.power_cycles + exact.checkpoints >= 10
    assert euler.on_time_s == pytest.approx(exact.on_time_s, rel=0.01)
    assert euler.power_cycles == pytest.approx(exact.power_cycles, rel=0.01)
    assert euler.completed == exact.completed


def test_jit_threshold_below_brown_out_is_rejected() -> None:
    # a checkpoint threshold the MCU never sees (below its 1.8 V brown-out) is a configuration mistake
    with pytest.raises(ConfigError, match=r"workload.jit_threshold_v = 1.5: must lie between the cut-off \(1.8 V"):
        scenario(storage={"v_off_v": 1.0}, workload={"policy": "jit", "jit_threshold_v": 1.5})


def test_node_below_v_on_settles_at_its_equilibrium_for_days() -> None:
    # default storage (10 mF, 1 MΩ, 0.5 µA quiescent) on 2 µW: the equilibrium, solved by hand, is below v_on
    p, i, g = ETA_IN * 2e-6, 0.5e-6, 1e-6
    v_eq = (-i + math.sqrt(i * i + 4 * g * p)) / (2 * g)
    storage = {"capacitance_f": 10e-3, "v_max_v": 3.6, "v_on_v": 3.0, "v_off_v": 2.0, "v_initial_v": 0.0,
               "leakage_r_ohm": 1e6, "leakage_a": 0.0, "quiescent_a": 0.5e-6}
    st = run_one(run={"duration_s": 2 * 86400.0}, harvester={"kind": "constant", "power_w": 2e-6},
                 storage=storage, workload={"sense_period_s": 600.0}).stats
    assert st.boots == 0
    assert st.v_final_v == pytest.approx(v_eq, rel=1e-9)


def summary_json(**sections: dict[str, Any]) -> str:
    result = simulate(scenario(**sections))
    per_node = [asdict(r.stats) for r in result.nodes]
    return json.dumps({"summary": result.summary, "nodes": per_node}, sort_keys=True)


def test_same_seed_gives_identical_results_and_another_seed_differs() -> None:
    sections: dict[str, dict[str, Any]] = {
        "harvester": PIEZO,
        "nodes": {"count": 3, "harvest_scale_min": 0.5, "harvest_scale_max": 1.0},
        "workload": {"policy": "per_layer", "sense_offset_s": None, "send_packet": True},
    }
    first = summary_json(run={"seed": 7}, **sections)
    assert summary_json(run={"seed": 7}, **sections) == first
    assert summary_json(run={"seed": 8}, **sections) != first
