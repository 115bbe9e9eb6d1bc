"""The power-path parts (current sources, direct and diode coupling, the BQ25570 charger, LDO and buck
stages, phase-list programs, JIT loads) against independent oracles: closed-form charge times,
C·dV/I(V) integrated numerically over a measured I–V curve, currents added up by hand, and the
figures printed in TI's bq25570 datasheet (SLUSBH2G)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from scipy.integrate import quad

from edge.core.errors import ConfigError
from edge.core.files import data_root
from simulator import storage
from simulator.config import Scenario, build_scenario
from simulator.fleet import simulate
from simulator.power import InputConfig, curve_regions
from simulator.results import NodeResult

ACTIVE_W = 118e-6 * 8 * 3.0  # MSP430FR5994 at 8 MHz (TI SLASE54D), charged during its 0.5 ms boot
BOOT_S = 0.5e-3
C_F = 1e-3
QUIET = {"leakage_r_ohm": "none", "leakage_a": 0.0, "quiescent_a": 0.0}
LDO = {"kind": "ldo", "v_out_v": 1.8, "dropout_v": 0.1, "quiescent_on_a": 2e-6, "quiescent_off_a": 0.5e-6,
       "gate_quiescent_a": 1.5e-6}
LISTEN = [{"name": "listen", "run": "until_power_fails", "current_a": 1e-3}]


def scenario(**sections: Any) -> Scenario:
    """One node, harvest scale 1, trace recorded; ``sections`` replace or extend the defaults."""
    data: dict[str, Any] = {
        "run": {"duration_s": 200.0, "workers": 1, "seed": 0},
        "nodes": {"count": 1, "harvest_scale_min": 1.0, "harvest_scale_max": 1.0, "record_traces": 1},
        "harvester": {"kind": "current", "current_a": 100e-6},
        "input": {"kind": "direct"},
        "storage": {"capacitance_f": C_F, "v_max_v": 3.6, "v_on_v": 3.0, "v_off_v": 2.0, "v_initial_v": 0.0,
                    **QUIET},
        "output": LDO,
        "workload": {"program": LISTEN},
    }
    for name, values in sections.items():
        data[name] = values if name in ("harvester", "output") else {**data.get(name, {}), **values}
    return build_scenario(data)


def run_one(**sections: Any) -> NodeResult:
    return simulate(scenario(**sections)).nodes[0]


def balance(r: NodeResult) -> float:
    st = r.stats
    return (st.harvested_j - st.input_loss_j - st.wasted_j - st.leaked_j - st.load_j - st.output_loss_j
            - st.stored_delta_j)


# ---- a current source and an LDO: charge and discharge add up currents -------------------------


def test_constant_current_charges_through_the_hysteresis_window_in_closed_form() -> None:
    i_src = 100e-6
    r = run_one()
    q_off = LDO["quiescent_off_a"] + LDO["gate_quiescent_a"]  # drawn while the node is off
    assert r.on_at_s is not None and r.off_at_s is not None
    assert r.on_at_s[0] == pytest.approx(C_F * 3.0 / (i_src - q_off), rel=1e-12)
    on, off = r.periods()
    assert len(off) >= 3
    np.testing.assert_allclose(off, C_F * (3.0 - 2.0) / (i_src - q_off), rtol=1e-10)
    # on: the boot draws the MCU's active power from the 1.8 V LDO, then listen draws 1 mA
    q_on = LDO["quiescent_on_a"] + LDO["gate_quiescent_a"]
    i_boot = ACTIVE_W / 1.8
    charge_c = C_F * (3.0 - 2.0) - (i_boot + q_on - i_src) * BOOT_S
    np.testing.assert_allclose(on, BOOT_S + charge_c / (1e-3 + q_on - i_src), rtol=1e-10)
    assert abs(balance(r)) < 1e-12


def test_a_current_source_with_resistive_leakage_follows_the_rc_law() -> None:
    # C dv/dt = I − v/R: v(t) = IR (1 − e^(−t/RC)), so v_on is reached at −RC ln(1 − v_on/(IR))
    i_src, r_ohm = 100e-6, 50e3
    r = run_one(storage={**QUIET, "leakage_r_ohm": r_ohm}, output={"kind": "ldo"})
    assert r.on_at_s is not None
    assert r.on_at_s[0] == pytest.approx(-r_ohm * C_F * math.log(1 - 3.0 / (i_src * r_ohm)), rel=1e-10)


def test_the_ldo_input_current_is_the_load_current_plus_its_quiescent_current() -> None:
    # start charged, no source: one on-period from v_on, all currents constant, so V falls linearly
    r = run_one(harvester={"kind": "current", "current_a": 0.0}, storage={**QUIET, "v_initial_v": 3.0})
    q_on = LDO["quiescent_on_a"] + LDO["gate_quiescent_a"]
    i_boot = ACTIVE_W / 1.8
    on_s = BOOT_S + (C_F * 1.0 - (i_boot + q_on) * BOOT_S) / (1e-3 + q_on)
    assert r.off_at_s is not None and r.off_at_s[0] == pytest.approx(on_s, rel=1e-12)
    st = r.stats
    # the load receives 1.8 V x its current; the LDO burns the rest of what it draws
    assert st.load_j == pytest.approx(1.8 * (i_boot * BOOT_S + 1e-3 * (on_s - BOOT_S)), rel=1e-12)
    # after the failure the LDO's off-state current goes on; the comparator's is booked as leakage
    drawn_j = 0.5 * C_F * (3.0**2 - st.v_final_v**2)
    assert st.load_j + st.output_loss_j + st.leaked_j == pytest.approx(drawn_j, rel=1e-12)
    assert abs(balance(r)) < 1e-12


def test_a_buck_draws_v_out_times_the_load_current_over_its_efficiency() -> None:
    buck = {"kind": "buck", "v_out_v": 1.8, "dropout_v": 0.1, "efficiency": [[1e-4, 0.8], [1e-2, 0.9]]}
    r = run_one(harvester={"kind": "current", "current_a": 0.0}, storage={**QUIET, "v_initial_v": 3.0}, output=buck)
    # powers only: ½C(v_on² − v_cut²) = Σ P_in·t, with η interpolated in log current
    def p_in(i_load: float) -> float:
        eta = np.interp(math.log(i_load), [math.log(1e-4), math.log(1e-2)], [0.8, 0.9])
        return 1.8 * i_load / eta
    i_boot = ACTIVE_W / 1.8
    on_s = BOOT_S + (0.5 * C_F * (9.0 - 4.0) - p_in(i_boot) * BOOT_S) / p_in(1e-3)
    assert r.off_at_s is not None and r.off_at_s[0] == pytest.approx(on_s, rel=1e-12)


# ---- a measured cell wired to the capacitor ----------------------------------------------------

needs_curves = pytest.mark.skipif(not (data_root() / "harvest" / "iv_curves").is_dir(), reason="needs the data folder")


def measured_curve(lux: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    sweep = json.loads((data_root() / "harvest" / "iv_curves" / f"AM1417_lux{lux}.json").read_text())["0"]
    v = np.array([float(k) for k in sweep])
    i = -np.array([float(a) for a in sweep.values()])
    order = np.argsort(v)
    return v[order], np.clip(i[order], 0, None)


def cell(v_cap: float, v: np.ndarray, i: np.ndarray, drop_v: float = 0.0) -> float:
    """The measured curve, linear between points, the first current held down to 0 V, 0 past V_oc."""
    return float(np.interp(v_cap + drop_v, v, i, left=i[0], right=0.0))


@needs_curves
@pytest.mark.parametrize("coupling", ["direct", "diode"])
def test_direct_coupling_charges_like_c_dv_over_the_measured_current(coupling: str) -> None:
    v, i = measured_curve()
    drop = 0.25 if coupling == "diode" else 0.0
    v_on = 2.0 - drop
    r = run_one(harvester={"kind": "iv_curve", "cell": "AM1417", "lux": 1000},
                input={"kind": coupling, "diode_drop_v": drop},
                output={"kind": "ldo", "v_out_v": 1.2, "dropout_v": 0.1, "load_off_v": 1.0},
                storage={"capacitance_f": C_F, "v_max_v": 3.6, "v_on_v": v_on, "v_off_v": 1.5 - drop, **QUIET})
    breaks = sorted({float(x) - drop for x in v if 0 < x - drop < v_on})
    expected_s = C_F * quad(lambda x: 1.0 / cell(x, v, i, drop), 0.0, v_on, points=breaks, limit=200, epsabs=0,
                            epsrel=1e-12)[0]
    assert r.on_at_s is not None and r.on_at_s[0] == pytest.approx(expected_s, rel=1e-9)


@needs_curves
def test_a_cell_cannot_charge_its_capacitor_past_v_oc() -> None:
    # 1000 lux on an AM1417: V_oc 2.43 V; a node that switches on at 3 V never turns on, and
    # after an hour the capacitor sits just under V_oc (the old MPP-power model turned it on hundreds of times)
    v, i = measured_curve()
    r = run_one(run={"duration_s": 3600.0, "workers": 1, "seed": 0},
                harvester={"kind": "iv_curve", "cell": "AM1417", "lux": 1000})
    assert r.stats.boots == 0
    assert v[-1] - 0.01 < r.stats.v_final_v < v[-1]
    # and near V_oc it charges slower than at the maximum-power point's current would
    assert cell(2.3, v, i) < 0.5 * cell(1.0, v, i)


def test_curve_regions_reproduce_the_piecewise_linear_curve() -> None:
    v = np.array([0.0, 0.5, 1.0, 1.5])
    i = np.array([1e-3, 0.9e-3, 0.5e-3, 0.0])
    for drop in (0.0, 0.3):
        regions = curve_regions(v, i, drop)
        for x in np.linspace(0.0, 2.0, 41):
            assert regions.current_a(float(x)) == pytest.approx(cell(float(x), v, i, drop), abs=1e-15)


# ---- the BQ25570 charger -------------------------------------------------------------------------


def test_bq25570_defaults_are_the_datasheet_figures() -> None:
    bq = InputConfig(kind="bq25570")
    # SLUSBH2G §6.5: VSTOR_CHGEN 1.73 V typ, VIN(CS) 330 mV, PIN(CS) 5 µW, PIN from 5 µW, VIN(DC) from 100 mV;
    # §7.3.1: V_oc sampled every 16 s for 256 ms, 80 % for solar
    assert (bq.vstor_chgen_v, bq.cold_start_min_v, bq.cold_start_min_w) == (1.73, 0.33, 5e-6)
    assert (bq.min_input_w, bq.min_input_v, bq.mppt_period_s, bq.mppt_sample_s, bq.mppt_fraction) == (
        5e-6, 0.1, 16.0, 0.256, 0.8)
    # the efficiency table is what the figures show: higher with input voltage and with current up to ~10 mA
    table = np.array(bq.efficiency_table)
    assert np.all(np.diff(table, axis=0) > 0) and np.all(np.diff(table[:, :4], axis=1) > 0)
    assert bq.charger_efficiency(1.0, 1e-3) == table[2, 2]
    assert bq.charger_efficiency(0.75, 1e-3) == pytest.approx(0.5 * (table[1, 2] + table[2, 2]))


def bq_scenario(power_w: float, input_v: float, **bq: Any) -> Scenario:
    return scenario(harvester={"kind": "constant", "power_w": power_w},
                    input={"kind": "bq25570", "input_v": input_v, **bq},
                    storage={"capacitance_f": C_F, "v_max_v": 4.2, "v_on_v": 3.0, "v_off_v": 2.0, **QUIET},
                    output={"kind": "ldo"}, run={"duration_s": 600.0, "workers": 1, "seed": 0})


def test_bq25570_cold_starts_then_charges_at_its_efficiency_less_the_mppt_sampling() -> None:
    p, vin = 1e-3, 1.0  # I_in = 1 mA at 1 V: 0.87 in the table
    inp = InputConfig(kind="bq25570")
    eta = inp.charger_efficiency(vin, p / vin)
    cold_s = 0.5 * C_F * 1.73**2 / (inp.cold_start_efficiency * p)
    main_s = 0.5 * C_F * (3.0**2 - 1.73**2) / (eta * p)
    r = simulate(bq_scenario(p, vin, mppt_sample_s=0.0)).nodes[0]
    assert r.on_at_s is not None and r.on_at_s[0] == pytest.approx(cold_s + main_s, rel=1e-12)
    # with the charger off 256 ms in every 16 s the main charge takes the dead time longer
    sampled = simulate(bq_scenario(p, vin)).nodes[0]
    assert sampled.on_at_s is not None
    t0 = sampled.on_at_s[0]
    k0 = math.floor(cold_s / 16.0)  # periods (each starting with a sample) that begin during the main charge
    dead_s = sum(max(0.0, min(k * 16.0 + 0.256, t0) - max(k * 16.0, cold_s)) for k in range(k0, math.ceil(t0 / 16) + 1))
    assert t0 == pytest.approx(cold_s + main_s + dead_s, rel=1e-9)


def test_bq25570_does_not_cold_start_below_its_input_voltage_or_power() -> None:
    assert simulate(bq_scenario(1e-3, 0.3)).nodes[0].stats.boots == 0  # below VIN(CS) 330 mV
    assert simulate(bq_scenario(4e-6, 1.0)).nodes[0].stats.boots == 0  # below PIN(CS) 5 µW
    assert simulate(bq_scenario(1e-3, 0.35)).nodes[0].stats.boots > 0


@needs_curves
def test_bq25570_holds_a_cell_at_80_percent_of_v_oc() -> None:
    v, i = measured_curve()
    r = run_one(harvester={"kind": "iv_curve", "cell": "AM1417", "lux": 1000}, input={"kind": "bq25570"},
                storage={"capacitance_f": C_F, "v_max_v": 4.2, "v_on_v": 3.0, "v_off_v": 2.0, **QUIET},
                run={"duration_s": 30.0, "workers": 1, "seed": 0})
    vin = 0.8 * v[-1]
    p_in = vin * cell(vin, v, i)
    # the first 256 ms sample V_oc only in the main charger; cold start runs from t = 0 (30 s: no boot yet)
    assert r.stats.harvested_j == pytest.approx(p_in * 30.0, rel=1e-9)


# ---- programs and JIT loads ----------------------------------------------------------------------


@pytest.mark.parametrize("durable", [True, False])
def test_program_once_per_boot_runs_every_boot_and_durable_phases_are_not_repeated(durable: bool) -> None:
    # a charge (1 mF over 1 V at 2 mA less the 0.1 mA source) lasts ~0.53 s: sense (0.3 s) and send (0.3 s)
    # do not fit in one. With sense durable a boot that finished it goes straight to send on the next
    # boot: a packet every second boot. Without, every boot senses again and never sends.
    program = [{"name": "init", "run": "once_per_boot", "duration_s": 1e-3, "current_a": 1e-3},
               {"name": "sense", "run": "repeat", "duration_s": 0.3, "current_a": 2e-3, "durable": durable},
               {"name": "send", "run": "repeat", "duration_s": 0.3, "current_a": 2e-3, "packet": True}]
    r = run_one(workload={"program": program}, run={"duration_s": 600.0, "workers": 1, "seed": 0})
    counts, st = r.stats.phase_counts, r.stats
    assert st.power_cycles > 20
    assert counts["init"] in (st.boots, st.boots - 1)  # every boot (the last may still be booting)
    if durable:
        assert abs(counts["send"] - st.boots / 2) <= 1 and abs(counts["sense"] - st.boots / 2) <= 1
        assert st.packets_sent == counts["send"]
    else:
        assert "send" not in counts and counts["sense"] >= st.power_cycles - 1


def test_jit_load_checkpoints_and_restores_with_the_given_figures() -> None:
    program = [{"name": "compute", "run": "repeat", "duration_s": 5.0, "current_a": 1e-3}]
    jit = {"threshold_v": 2.3, "checkpoint_s": 3e-3, "checkpoint_a": 3e-3, "restore_s": 2e-3, "restore_a": 2e-3,
           "hold_a": 5e-6}
    src = {"kind": "current", "current_a": 100e-6, "period_s": 100.0, "duty": 0.5}
    r = run_one(harvester=src, workload={"program": program, "jit_load": jit},
                run={"duration_s": 1000.0, "workers": 1, "seed": 0})
    assert r.stats.power_cycles > 0 and r.stats.checkpoints >= r.stats.power_cycles
    assert r.stats.lost_work_j == 0.0
    # compute time adds up: completed phases x 5 s <= on-time in compute (no work is redone)
    assert r.stats.phase_counts["compute"] > 0


def test_general_power_paths_conserve_energy() -> None:
    for sc in (scenario(), bq_scenario(1e-3, 1.0)):
        r = simulate(sc).nodes[0]
        assert abs(balance(r)) < 1e-12 * max(r.stats.harvested_j, 1e-9)


@pytest.mark.parametrize(("p", "i", "g"), [(0.0, -1e-4, 1e-6), (0.0, -1e-4, 5e-5), (1e-4, -1e-4, 3e-5),
                                           (-5e-5, -1e-4, 1e-5), (2e-4, 1e-5, 1e-6)])
def test_voltage_moments_match_a_fine_quadrature(p: float, i: float, g: float) -> None:
    v0, dt, c = 1.7, 200.0, 10e-3
    v1 = storage.voltage_after(v0, dt, p, i, g, c)
    ts = np.linspace(0.0, dt, 20001)
    vs = np.array([storage.voltage_after(v0, t, p, i, g, c) for t in ts])
    m1, m2 = storage.voltage_moments(v0, v1, dt, p, i, g, c)
    assert m1 == pytest.approx(np.trapezoid(vs, ts), rel=1e-7)
    assert m2 == pytest.approx(np.trapezoid(vs**2, ts), rel=1e-7)


# ---- one-line errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(("sections", "message"), [
    ({"harvester": {"kind": "constant", "power_w": 1e-3}}, r"input.kind = 'direct': needs a source with a current"),
    ({"input": {"kind": "converter"}}, r"input.kind = 'converter': a current source delivers a current"),
    ({"input": {"kind": "bq25570"}}, r"input.kind = 'bq25570': MPPT needs an open-circuit voltage"),
    ({"harvester": {"kind": "constant"}, "input": {"kind": "bq25570"}}, r"input.input_v = None: bq25570 with a power"),
    ({"run": {"engine": "fixed_step"}}, r"run.engine = 'fixed_step': the fixed-step reference models converters"),
    ({"workload": {"program": [{"name": "a", "run": "repeat", "duration_s": 1, "current_a": 1e-3, "power_w": 1e-3}]}},
     r"workload.program\[a\].current_a = 0.001: give exactly one"),
    ({"workload": {"program": [{"name": "a", "run": "repeat", "duration_s": 1, "current_a": 1e-3},
                               {"name": "b", "run": "once_per_boot", "duration_s": 1, "current_a": 1e-3}]}},
     r"once_per_boot phases come first"),
    ({"workload": {"program": [{"name": "a", "run": "until_power_fails", "duration_s": 1, "current_a": 1e-3}]}},
     r"an until_power_fails phase has no duration"),
    ({"workload": {"program": LISTEN, "jit_load": {"threshold_v": 1.5, "checkpoint_s": 1e-3, "checkpoint_a": 1e-3,
                                                   "restore_s": 1e-3, "restore_a": 1e-3}}},
     r"workload.jit_load.threshold_v = 1.5: must lie between the cut-off \(2 V"),
    ({"output": {"kind": "ldo", "v_out_v": 3.3, "load_off_v": 3.0}}, r"the load must switch on \(at 3 V\) above where"),
])
def test_bad_power_path_values_get_one_clear_error(sections: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        scenario(**sections)


def test_a_jit_load_with_the_jit_policys_own_figures_runs_the_same_node() -> None:
    # where they overlap, [workload.jit_load] matches the jit policy: its checkpoint and restore derived from
    # state_bytes through the MSP430's FRAM, its hold the MCU's sleep current (converter output at 3.0 V)
    from simulator.devices import MCUS

    mcu, state = MCUS["msp430fr5994"], 2048
    write_w = mcu.nvm_write_j_per_byte / mcu.nvm_write_s_per_byte
    read_w = mcu.nvm_read_j_per_byte / mcu.nvm_read_s_per_byte
    jit = {"threshold_v": 2.4, "checkpoint_s": state * mcu.nvm_write_s_per_byte, "checkpoint_a": write_w / 3.0,
           "restore_s": state * mcu.nvm_read_s_per_byte, "restore_a": read_w / 3.0}
    common: dict[str, Any] = {
        "harvester": {"kind": "piezo", "rate_hz": 0.01, "mean_burst_s": 5.0, "median_power_w": 2e-3},
        "input": {"kind": "converter"},
        "output": {"kind": "converter", "v_out_v": 3.0},
        "storage": {"capacitance_f": 470e-6, "v_max_v": 3.3, "v_on_v": 3.0, "v_off_v": 2.0},
        "run": {"duration_s": 3600.0, "workers": 1, "seed": 0},
    }
    work = {"policy": "jit", "jit_threshold_v": 2.4, "state_bytes": state, "send_packet": False,
            "sense_period_s": 20.0, "sense_offset_s": 5.0, "program": (),
            "layers": [{"name": f"l{k}", "macs": 120_000, "output_bytes": 256} for k in range(4)]}
    derived = simulate(scenario(**common, workload=work)).nodes[0].stats
    given = simulate(scenario(**common, workload={**work, "jit_load": jit})).nodes[0].stats
    assert derived.checkpoints > 0 and derived.power_cycles > 0
    for field in ("checkpoints", "power_cycles", "boots", "completed", "missed", "lost_off"):
        assert getattr(given, field) == getattr(derived, field), field
    for field in ("on_time_s", "load_j", "harvested_j", "lost_work_j"):
        assert getattr(given, field) == pytest.approx(getattr(derived, field), rel=1e-9, abs=1e-15), field


def test_the_jit_policy_checkpoints_a_program_and_restores_it_after_a_failure() -> None:
    # no jit_load: the policy's own checkpoint (state_bytes through FRAM) and restore serve the program
    program = [{"name": "init", "run": "once_per_boot", "duration_s": 1e-3, "current_a": 1e-3},
               {"name": "compute", "run": "repeat", "duration_s": 5.0, "current_a": 1e-3}]
    src = {"kind": "current", "current_a": 100e-6, "period_s": 100.0, "duty": 0.5}
    r = run_one(harvester=src, output={"kind": "direct"}, storage={**QUIET, "leakage_r_ohm": 1e5},
                workload={"program": program, "policy": "jit", "jit_threshold_v": 2.3},
                run={"duration_s": 1000.0, "workers": 1, "seed": 0})
    st = r.stats
    assert st.power_cycles > 0 and st.checkpoints >= st.power_cycles and st.lost_work_j == 0.0
    assert st.phase_counts["init"] < st.boots  # a boot with a checkpoint restores instead of starting over


# ---- found in review -------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_the_charger_crossing_its_cold_start_edge_while_sampling_rests_on_the_edge() -> None:
    # below VSTOR_CHGEN the cold-start converter charges, above it the charger is off while it samples
    # V_oc and the load drains: both sides push towards the edge, which once looped at one instant
    sc = scenario(harvester={"kind": "constant", "power_w": 100e-6},
                  input={"kind": "bq25570", "input_v": 1.0, "mppt_period_s": 120.0, "mppt_sample_s": 60.0},
                  storage={"capacitance_f": C_F, "v_max_v": 4.2, "v_on_v": 3.0, "v_off_v": 2.0, "v_initial_v": 1.72,
                           "leakage_r_ohm": 1e6, "leakage_a": 0.0, "quiescent_a": 0.5e-6},
                  output={"kind": "ldo"}, run={"duration_s": 300.0, "workers": 1, "seed": 0})
    r = simulate(sc).nodes[0]
    assert r.trace is not None
    rests = [v for v, e in zip(r.trace["voltage_v"], r.trace["event"]) if e == 8]  # V_SEG rows
    assert rests and all(v == pytest.approx(1.73) for v in rests)
    assert abs(balance(r)) < 1e-9


def test_a_durable_init_before_an_until_power_fails_phase_runs_at_every_boot() -> None:
    program = [{"name": "init", "run": "once_per_boot", "duration_s": 1e-3, "current_a": 1e-3, "durable": True},
               *LISTEN]
    r = run_one(workload={"program": program})
    assert r.stats.power_cycles > 3 and r.stats.phase_counts["init"] in (r.stats.boots, r.stats.boots - 1)


def test_an_ldo_in_dropout_passes_v_cap_minus_the_dropout() -> None:
    # v_out 3.0 V above the whole 3.0 -> 2.0 V window: the load gets V_cap - 0.1 V, never more than drawn
    r = run_one(harvester={"kind": "current", "current_a": 0.0}, storage={**QUIET, "v_initial_v": 3.0},
                output={"kind": "ldo", "v_out_v": 3.0, "dropout_v": 0.1})
    st = r.stats
    assert st.output_loss_j > 0 and st.load_j < 0.5 * C_F * (3.0**2 - 2.0**2)
    assert abs(balance(r)) < 1e-12


def test_a_comparator_gates_current_counts_on_the_converter_path_too() -> None:
    base = {"harvester": {"kind": "constant", "power_w": 1e-3}, "input": {"kind": "converter"},
            "storage": {"capacitance_f": C_F, "v_max_v": 3.6, "v_on_v": 3.0, "v_off_v": 2.0, **QUIET}}
    plain = run_one(**base, output={"kind": "converter"})
    gated = run_one(**base, output={"kind": "converter", "gate_quiescent_a": 50e-6})
    assert plain.on_at_s is not None and gated.on_at_s is not None and gated.on_at_s[0] > plain.on_at_s[0]


def test_the_mppt_sample_must_be_shorter_than_its_period() -> None:
    with pytest.raises(ConfigError, match=r"input.mppt_sample_s = 0.256: must be shorter than input.mppt_period_s"):
        InputConfig(kind="bq25570", mppt_period_s=0.2)
