"""Harvesters against independent oracles: closed-form physics and the raw data files parsed by hand."""

from __future__ import annotations

import csv
import itertools
import json
import math
import socket
import typing
from pathlib import Path

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError

from edge.core.errors import ConfigError, DataError
from edge.core.files import data_root
from simulator.harvesters import (
    ConstantHarvester,
    HarvesterConfig,
    IvCurveHarvester,
    NrelHarvester,
    PanelHarvester,
    PiezoHarvester,
    RfHarvester,
    ThermoelectricHarvester,
    TraceHarvester,
    build_trace,
)

HARVEST = data_root() / "harvest"
needs_data = pytest.mark.skipif(not HARVEST.is_dir(), reason=f"shared data absent at {HARVEST}")
CONFIG_CLASSES = typing.get_args(typing.get_args(HarvesterConfig)[0])


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("harvester tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)


# --- configs --------------------------------------------------------------------------------


def test_every_field_is_documented() -> None:
    for cls in CONFIG_CLASSES:
        for name, info in cls.model_fields.items():
            assert name == "kind" or info.description, f"{cls.__name__}.{name} has no docstring"


def test_union_dispatches_on_kind() -> None:
    cfg = TypeAdapter(HarvesterConfig).validate_python({"kind": "thermoelectric", "delta_t_k": 3.0})
    assert isinstance(cfg, ThermoelectricHarvester) and cfg.delta_t_k == 3.0


@pytest.mark.parametrize(
    "raw",
    [
        {"kind": "rf", "duty": 0.0},
        {"kind": "rf", "distance_m": 0.5},
        {"kind": "constant", "power_w": -1.0},
        {"kind": "constant", "powr_w": 1.0},
        {"kind": "iv_curve", "schedule": [[8, 18, 500], [17, 20, 100]]},
        {"kind": "iv_curve", "schedule": [[18, 8, 500]]},
        {"kind": "panel", "timezone": "Mars/Olympus"},
        {"kind": "panel", "start_date": "2023-02-30"},
        {"kind": "wind"},
    ],
)
def test_bad_value_is_a_validation_error(raw: dict) -> None:
    with pytest.raises(ValidationError):
        TypeAdapter(HarvesterConfig).validate_python(raw)


def test_bad_duration_names_it() -> None:
    with pytest.raises(ConfigError, match="duration_s"):
        build_trace(ConstantHarvester(), 0.0, rng())


# --- closed-form harvesters -----------------------------------------------------------------


def test_constant() -> None:
    trace = build_trace(ConstantHarvester(power_w=2.5e-3), 100.0, rng())
    assert trace.energy_j() == pytest.approx(0.25) and trace.power_at(99.9) == 2.5e-3


def friis_w(tx_w: float, frequency_hz: float, distance_m: float) -> float:
    wavelength_m = 299_792_458.0 / frequency_hz
    return tx_w * (wavelength_m / (4 * math.pi * distance_m)) ** 2


def test_rf_matches_friis_in_free_space() -> None:
    cfg = RfHarvester(
        tx_power_w=3.0, tx_gain_dbi=0.0, rx_gain_dbi=0.0, distance_m=2.0, path_loss_exponent=2.0, rf_dc_efficiency=0.3
    )
    trace = build_trace(cfg, 10.0, rng())
    assert trace.power_at(5.0) == pytest.approx(0.3 * friis_w(3.0, 915e6, 2.0), rel=1e-12)
    assert trace.power_at(5.0) == pytest.approx(1.5297e-4, rel=1e-3)  # by hand: 3 W * (0.32764 m / 8 pi m)^2 * 0.3


def test_rf_path_loss_exponent_and_gains() -> None:
    cfg = RfHarvester(tx_gain_dbi=3.0, rx_gain_dbi=6.0, distance_m=4.0, path_loss_exponent=3.0, rf_dc_efficiency=1.0)
    at_d0 = friis_w(3.0, 915e6, 1.0) * 10**0.9
    assert build_trace(cfg, 1.0, rng()).power_at(0.0) == pytest.approx(at_d0 / 4.0**3, rel=1e-12)


def test_rf_duty_cycle_mean_and_phase() -> None:
    cfg = RfHarvester(rx_gain_dbi=0.0, distance_m=2.0, period_s=10.0, duty=0.25, phase_s=3.0)
    on_w = 0.3 * friis_w(3.0, 915e6, 2.0)
    trace = build_trace(cfg, 1000.0, rng())
    assert trace.mean_power_w() == pytest.approx(0.25 * on_w, rel=1e-12)
    assert trace.power_at(2.999) == 0.0 and trace.power_at(3.0) == pytest.approx(on_w)
    assert trace.power_at(5.499) == pytest.approx(on_w) and trace.power_at(5.5) == 0.0


def test_rf_sensitivity_cut_off() -> None:
    received_dbm = 10 * math.log10(friis_w(3.0, 915e6, 5.0) / 1e-3)
    base = {"rx_gain_dbi": 0.0, "distance_m": 5.0}
    assert build_trace(RfHarvester(**base, sensitivity_dbm=received_dbm + 0.1), 1.0, rng()).mean_power_w() == 0.0
    assert build_trace(RfHarvester(**base, sensitivity_dbm=received_dbm - 0.1), 1.0, rng()).mean_power_w() > 0.0
    assert build_trace(RfHarvester(distance_m=30.0, path_loss_exponent=3.0), 1.0, rng()).mean_power_w() == 0.0


def test_thermoelectric_matched_load() -> None:
    cfg = ThermoelectricHarvester(seebeck_v_per_k=0.05, internal_resistance_ohm=2.0, delta_t_k=10.0)
    assert build_trace(cfg, 60.0, rng()).power_at(30.0) == pytest.approx(0.5**2 / 8.0)


def test_thermoelectric_sinusoid_mean_and_clipping() -> None:
    swing = ThermoelectricHarvester(delta_t_k=10.0, delta_t_amplitude_k=4.0, period_s=86400.0, step_s=60.0)
    # mean of (S (D + A sin))^2 / 4R over whole periods is S^2 (D^2 + A^2 / 2) / 4R
    expected_w = 0.05**2 * (10.0**2 + 4.0**2 / 2) / (4 * 2.0)
    assert build_trace(swing, 2 * 86400.0, rng()).mean_power_w() == pytest.approx(expected_w, rel=1e-9)
    clipped = build_trace(ThermoelectricHarvester(delta_t_k=1.0, delta_t_amplitude_k=4.0), 86400.0, rng())
    assert clipped.power_at(0.75 * 86400.0) == 0.0 and clipped.power_at(0.25 * 86400.0) > 0.0


def test_piezo_is_deterministic_per_seed() -> None:
    cfg = PiezoHarvester()
    a, b, c = (build_trace(cfg, 3600.0, rng(seed)) for seed in (7, 7, 8))
    assert np.array_equal(a.time_s, b.time_s) and np.array_equal(a.power_w, b.power_w)
    assert not np.array_equal(a.power_w, c.power_w)


def test_piezo_mean_power_and_idle_fraction() -> None:
    cfg = PiezoHarvester(rate_hz=1.0, mean_burst_s=0.5, median_power_w=1e-4, sigma_log=0.5)
    trace = build_trace(cfg, 1e5, rng(3))
    # Campbell's theorem: overlapping bursts add, so mean = rate * E[duration] * E[power]
    assert trace.mean_power_w() == pytest.approx(1.0 * 0.5 * 1e-4 * math.exp(0.5**2 / 2), rel=0.03)
    # M/G/inf: the number of active bursts is Poisson(rate * mean_burst), so P(idle) = exp(-0.5)
    idle_s = np.sum(np.diff(np.append(trace.time_s, trace.end_s))[trace.power_w == 0.0])
    assert idle_s / trace.end_s == pytest.approx(math.exp(-0.5), rel=0.02)


# --- generic CSV trace ----------------------------------------------------------------------


def write_csv(path: Path, rows: list[tuple[float, float]], header: str = "time,power_w") -> str:
    path.write_text(header + "\n" + "".join(f"{t},{v}\n" for t, v in rows))
    return str(path)


def test_trace_csv_power_minutes_offset_and_repeat(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "p.csv", [(10, 1.0), (11, 2.0), (12, 3.0)])
    trace = build_trace(TraceHarvester(path=path, time_unit="min", start_s=60.0, repeat=True), 360.0, rng())
    assert [trace.power_at(t) for t in (0, 60, 120, 180, 240, 300)] == [2.0, 3.0, 1.0, 2.0, 3.0, 1.0]
    with pytest.raises(ConfigError, match="harvester.start_s"):
        build_trace(TraceHarvester(path=path, time_unit="min", start_s=60.0), 360.0, rng())


def test_trace_csv_irradiance(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "g.csv", [(0, 800.0), (1, -5.0)], header="t_h,ghi")
    cfg = TraceHarvester(
        path=path,
        time_column="t_h",
        value_column="ghi",
        value="irradiance_w_m2",
        time_unit="h",
        panel_area_m2=1e-3,
        efficiency=0.2,
    )
    trace = build_trace(cfg, 7200.0, rng())
    assert trace.energy_j() == pytest.approx(800.0 * 1e-3 * 0.2 * 3600.0)


def test_trace_csv_errors_name_the_field(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "p.csv", [(0, 1.0), (1, 2.0)])
    with pytest.raises(ConfigError, match=r"ward.time_column = 'seconds'.*columns"):
        build_trace(TraceHarvester(path=path, time_column="seconds"), 1.0, rng(), field="ward")
    with pytest.raises(DataError, match="ward.path"):
        build_trace(TraceHarvester(path=str(tmp_path / "nope.csv")), 1.0, rng(), field="ward")


# --- NREL measured irradiance ---------------------------------------------------------------


def nrel_day_energy_j(path: Path, day: str, area_m2: float, efficiency: float) -> float:
    with path.open(newline="") as f:
        rows = [row for row in csv.reader(f)][1:]
    return sum(max(float(ghi), 0.0) * area_m2 * efficiency * 60.0 for date, _, ghi in rows if date == day)


@needs_data
@pytest.mark.parametrize(("start_day", "day"), [(2, "6/2/2023"), (30, "6/30/2023")])
def test_nrel_day_energy_matches_the_file(start_day: int, day: str) -> None:
    cfg = NrelHarvester(start_day=start_day, panel_area_m2=1e-3, efficiency=0.2)
    expected = nrel_day_energy_j(HARVEST / "nrel" / "2023jun.txt", day, 1e-3, 0.2)
    assert build_trace(cfg, 86400.0, rng()).energy_j() == pytest.approx(expected, rel=1e-12)


@needs_data
def test_nrel_minute_alignment_and_end_of_month() -> None:
    trace = build_trace(NrelHarvester(path="harvest/nrel/2023jan.txt", start_day=31), 86400.0, rng())
    with (HARVEST / "nrel" / "2023jan.txt").open() as f:
        noon = next(row for row in csv.reader(f) if row[:2] == ["1/31/2023", "12:00"])
    assert trace.power_at(12 * 3600.0 + 30.0) == pytest.approx(max(float(noon[2]), 0.0) * 5e-4 * 0.15)
    with pytest.raises(ConfigError, match="harvester.start_day = 31"):
        build_trace(NrelHarvester(path="harvest/nrel/2023jan.txt", start_day=31), 86460.0, rng())


def test_missing_data_file_names_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRICKLE_DATA", str(tmp_path))
    with pytest.raises(DataError, match=r"node\.harvester\.path.*2023jun\.txt"):
        build_trace(NrelHarvester(), 60.0, rng(), field="node.harvester")
    with pytest.raises(DataError, match=r"harvester\.curves_dir"):
        build_trace(IvCurveHarvester(), 60.0, rng())


# --- indoor light on measured I-V curves ----------------------------------------------------


def raw_mpp_w(cell: str, lux: int) -> float:
    sweep = json.loads((HARVEST / "iv_curves" / f"{cell}_lux{lux}.json").read_text())["0"]
    return max(float(v) * -amps for v, amps in sweep.items())


def mpp_w(cell: str, lux: float) -> float:
    return build_trace(IvCurveHarvester(cell=cell, lux=lux), 60.0, rng()).power_at(0.0)


@needs_data
@pytest.mark.parametrize(
    ("cell", "lux"), [("AM1417", 300), ("AM1417", 20000), ("EXL2-1V50", 1000), ("KXOB25-02-X8F", 10000), ("Gameboy", 600)]
)
def test_iv_mpp_at_measured_lux_is_the_curve_maximum(cell: str, lux: int) -> None:
    raw = raw_mpp_w(cell, lux)
    assert raw * (1 - 1e-12) <= mpp_w(cell, lux) <= 1.05 * raw  # 1e-12: np.interp rounding at a node


@needs_data
@pytest.mark.parametrize("cell", ["AM1417", "EXL2-1V50", "KXOB25-02-X8F", "Gameboy"])
def test_iv_mpp_rises_with_lux(cell: str) -> None:
    powers = [mpp_w(cell, lux) for lux in np.geomspace(50, 50_000, 40)]
    assert all(b > a for a, b in itertools.pairwise(powers))


@needs_data
def test_iv_interpolation_log_log_and_extrapolation_linear() -> None:
    p300, p600, p20k = mpp_w("AM1417", 300), mpp_w("AM1417", 600), mpp_w("AM1417", 20000)
    assert mpp_w("AM1417", math.sqrt(300 * 600)) == pytest.approx(math.sqrt(p300 * p600), rel=1e-9)
    assert mpp_w("AM1417", 100) == pytest.approx(p300 / 3, rel=1e-12)
    assert mpp_w("AM1417", 40000) == pytest.approx(2 * p20k, rel=1e-12)
    assert mpp_w("AM1417", 0.0) == 0.0


@needs_data
def test_iv_daily_schedule() -> None:
    cfg = IvCurveHarvester(cell="AM1417", lux=0.0, schedule=[[8, 18, 600], [18, 20, 300]])
    trace = build_trace(cfg, 2 * 86400.0, rng())
    p600, p300 = mpp_w("AM1417", 600), mpp_w("AM1417", 300)
    assert [trace.power_at(h * 3600.0) for h in (7.9, 8, 17.9, 18, 20, 32, 42.5)] == pytest.approx(
        [0, p600, p600, p300, 0, p600, p300]
    )
    assert trace.energy_j() == pytest.approx(2 * (10 * p600 + 2 * p300) * 3600.0)


@needs_data
def test_iv_unknown_cell_lists_the_cells() -> None:
    with pytest.raises(DataError, match=r"harvester\.cell = 'AM9999'.*AM1417"):
        build_trace(IvCurveHarvester(cell="AM9999"), 60.0, rng())


# --- outdoor panel from pvlib ---------------------------------------------------------------


def tmy_day_energy_j(day_of_year: int, area_m2: float, efficiency: float) -> float:
    import pvlib

    with (Path(pvlib.__file__).parent / "data" / "723170TYA.CSV").open(newline="") as f:
        rows = list(csv.reader(f))[2:]
    ghi_column = 4  # "GHI (W/m^2)"
    day_rows = rows[(day_of_year - 1) * 24 : day_of_year * 24]
    return sum(float(row[ghi_column]) * area_m2 * efficiency * 3600.0 for row in day_rows)


def test_panel_tmy_offline_matches_the_file(offline: None) -> None:
    cfg = PanelHarvester(source="tmy", start_day_of_year=172, panel_area_m2=1e-3, efficiency=0.2)
    trace = build_trace(cfg, 86400.0, rng())
    assert trace.energy_j() == pytest.approx(tmy_day_energy_j(172, 1e-3, 0.2), rel=1e-12)
    assert trace.power_at(0.5 * 3600.0) == 0.0 and trace.power_at(12.5 * 3600.0) > 0.0


def test_panel_tmy_wraps_around_the_year(offline: None) -> None:
    trace = build_trace(PanelHarvester(source="tmy", start_day_of_year=365), 2 * 86400.0, rng())
    assert trace.energy_j(86400.0) == pytest.approx(tmy_day_energy_j(1, 5e-4, 0.15), rel=1e-12)


def test_panel_clearsky_offline_day_and_night(offline: None) -> None:
    trace = build_trace(PanelHarvester(source="clearsky"), 86400.0, rng())
    assert trace.power_at(0.0) == 0.0 and trace.power_at(23.5 * 3600.0) == 0.0
    # Golden CO near the June solstice: clear-sky GHI at solar noon is about 1000 W/m^2
    assert 800.0 * 5e-4 * 0.15 < trace.power_at(13 * 3600.0) < 1200.0 * 5e-4 * 0.15
