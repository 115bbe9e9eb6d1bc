"""Energy harvesters: each typed config becomes a ``PowerTrace`` over ``[0, duration_s)``.

The trace is the power the transducer delivers (W) before the input converter.
``build_trace`` is the one entry point; ``HarvesterConfig`` is the tagged union
a scenario names under ``kind``:

    from simulator.harvesters import RfHarvester, build_trace
    trace = build_trace(RfHarvester(distance_m=2.0), 3600.0, np.random.default_rng(0))
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import numpy as np
from pydantic import Field, field_validator

from edge.core.config import Config
from edge.core.errors import ConfigError, DataError
from simulator.data import resolve_data_dir, resolve_data_file
from simulator.radio import received_power_w
from simulator.trace import PowerTrace

if TYPE_CHECKING:  # pandas costs ~0.6 s to import: only the CSV-reading sources import it
    import pandas as pd

DAY_S = 86_400.0
_MAX_SEGMENTS = 5_000_000  # beyond this a trace no longer fits the exact engine's memory comfortably
_SECONDS_PER_UNIT = {"s": 1.0, "min": 60.0, "h": 3600.0}


class ConstantHarvester(Config):
    """A source of constant power, e.g. a bench supply or a test fixture."""

    kind: Literal["constant"] = "constant"
    power_w: float = Field(default=1e-3, ge=0.0, le=100.0)
    """Delivered power (W)."""


class CurrentHarvester(Config):
    """A current source: constant (a bench source-measure unit), or a recorded trace of current.

    It delivers its current at whatever voltage the circuit imposes, so it needs
    ``input.kind = "direct"`` or ``"diode"``; with a trace, each row's current holds until the next."""

    kind: Literal["current"] = "current"
    current_a: float = Field(default=100e-6, ge=0.0, le=10.0)
    """Delivered current (A) when no trace is given."""
    period_s: float | None = Field(default=None, gt=0.0, le=86400.0)
    """Switch the source on and off with this period (s); None: always on."""
    duty: float = Field(default=1.0, gt=0.0, le=1.0)
    """Fraction of each period the source is on (from the period's start)."""
    path: str | None = None
    """CSV of currents; relative paths resolve against the working directory, then the shared data folder."""
    time_column: str = "time"
    """Name of the column of sample times (numbers in ``time_unit``)."""
    value_column: str = "current_a"
    """Name of the column of currents (A)."""
    time_unit: Literal["s", "min", "h"] = "s"
    """Unit of the time column."""
    start_s: float = Field(default=0.0, ge=0.0)
    """Offset into the trace (s, from its first row) that becomes simulation time 0."""
    repeat: bool = False
    """Tile the trace when it is shorter than the simulation; otherwise that is an error."""


class TraceHarvester(Config):
    """A recorded power or irradiance trace from any CSV file.

    Times are measured from the file's first row; each row's value holds until the
    next row, and the last row holds for the spacing of the last two rows.
    """

    kind: Literal["trace"] = "trace"
    path: str
    """CSV file; relative paths resolve against the working directory, then the shared data folder."""
    time_column: str = "time"
    """Name of the column of sample times (numbers in ``time_unit``)."""
    value_column: str = "power_w"
    """Name of the column of sample values."""
    value: Literal["power_w", "irradiance_w_m2"] = "power_w"
    """What the value column holds: delivered power (W) or irradiance on the panel (W/m^2)."""
    panel_area_m2: float = Field(default=5e-4, gt=0.0, le=10.0)
    """Panel area (m^2); used only for irradiance."""
    efficiency: float = Field(default=0.15, gt=0.0, le=0.5)
    """Panel efficiency, irradiance to electrical power; used only for irradiance."""
    time_unit: Literal["s", "min", "h"] = "s"
    """Unit of the time column."""
    start_s: float = Field(default=0.0, ge=0.0)
    """Offset into the trace (s, from its first row) that becomes simulation time 0."""
    repeat: bool = False
    """Tile the trace when it is shorter than the simulation; otherwise that is an error."""


class NrelHarvester(Config):
    """Outdoor solar from an NREL SRRL 1-minute file (``DATE (MM/DD/YYYY),MST,Global CM3 (cor) [W/m^2]``).

    Simulation time 0 is midnight (MST) of ``start_day``; power = max(GHI, 0) * area * efficiency,
    constant over each minute. A missing minute holds the previous minute's value.
    """

    kind: Literal["nrel"] = "nrel"
    path: str = "harvest/nrel/2023jun.txt"
    """NREL file; relative paths resolve against the working directory, then the shared data folder."""
    start_day: int = Field(default=1, ge=1, le=31)
    """Day of the file's month (1-based) at whose midnight the simulation starts."""
    panel_area_m2: float = Field(default=5e-4, gt=0.0, le=10.0)
    """Panel area (m^2)."""
    efficiency: float = Field(default=0.15, gt=0.0, le=0.5)
    """Panel efficiency, global horizontal irradiance to electrical power."""


class IvCurveHarvester(Config):
    """Indoor light on a small solar cell, operated at its maximum power point.

    P_mpp at each measured illuminance is the maximum of V * (-I) over the measured I-V
    curve (linearly interpolated on a fine voltage grid). Between measured levels P_mpp is
    interpolated linearly in log(lux)-log(P). Outside the measured range it is extrapolated
    proportional to lux (photocurrent is proportional to illuminance; this ignores the
    logarithmic change of V_oc, so it overestimates far below the lowest measured level).
    Simulation time 0 is midnight.
    """

    kind: Literal["iv_curve"] = "iv_curve"
    cell: str = "AM1417"
    """Cell name; curves are ``{curves_dir}/{cell}_lux{LUX}.json`` (shared data: AM1417, EXL2-1V50, KXOB25-02-X8F, Gameboy)."""
    lux: float = Field(default=500.0, ge=0.0, le=200_000.0)
    """Illuminance (lux) at all times outside the schedule's windows."""
    schedule: tuple[tuple[float, float, float], ...] = ()
    """Daily windows ``[start_h, end_h, lux]`` (hours of the day, 0 <= start < end <= 24, not overlapping)."""
    curves_dir: str = "harvest/iv_curves"
    """Folder of I-V curve JSON files; relative paths resolve like data files."""

    @field_validator("schedule")
    @classmethod
    def _windows_in_a_day(cls, windows: tuple[tuple[float, float, float], ...]) -> tuple[tuple[float, float, float], ...]:
        ordered = sorted(windows)
        for start_h, end_h, lux in ordered:
            if not (0.0 <= start_h < end_h <= 24.0) or not (0.0 <= lux <= 200_000.0):
                raise ValueError(f"window {[start_h, end_h, lux]} needs 0 <= start_h < end_h <= 24 and 0 <= lux <= 200000")
        for (_, end_h, _), (start_h, _, _) in itertools.pairwise(ordered):
            if start_h < end_h:
                raise ValueError(f"windows overlap at {start_h} h")
        return tuple(ordered)


class PanelHarvester(Config):
    """Outdoor solar panel on global horizontal irradiance from pvlib: power = GHI * area * efficiency.

    ``tmy``: hourly GHI of a TMY3 file (by default the Greensboro NC file pvlib ships),
    starting at midnight of ``start_day_of_year`` and wrapping around the year.
    ``clearsky``: Ineichen clear-sky GHI at ``latitude_deg``/``longitude_deg``, 1-minute
    steps from local midnight of ``start_date``.
    """

    kind: Literal["panel"] = "panel"
    source: Literal["tmy", "clearsky"] = "tmy"
    """Where GHI comes from: a typical meteorological year, or a clear-sky model."""
    panel_area_m2: float = Field(default=5e-4, gt=0.0, le=10.0)
    """Panel area (m^2)."""
    efficiency: float = Field(default=0.15, gt=0.0, le=0.5)
    """Panel efficiency, global horizontal irradiance to electrical power."""
    start_day_of_year: int = Field(default=172, ge=1, le=365)
    """tmy: day of the year (1-based) at whose midnight the simulation starts."""
    tmy_path: str | None = None
    """tmy: a TMY3 CSV file; None means the 723170TYA.CSV file that pvlib ships."""
    latitude_deg: float = Field(default=39.742, ge=-90.0, le=90.0)
    """clearsky: site latitude (degrees north); default NREL SRRL, Golden CO."""
    longitude_deg: float = Field(default=-105.18, ge=-180.0, le=180.0)
    """clearsky: site longitude (degrees east)."""
    altitude_m: float = Field(default=1829.0, ge=-500.0, le=9000.0)
    """clearsky: site altitude above sea level (m)."""
    start_date: date = date(2023, 6, 21)
    """clearsky: ISO date (YYYY-MM-DD) at whose local midnight the simulation starts."""
    timezone: str = "America/Denver"
    """clearsky: IANA time zone of the site, e.g. "Europe/Berlin" or "Etc/GMT+7"."""

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, name: str) -> str:
        try:
            zoneinfo.ZoneInfo(name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as err:
            raise ValueError(f"unknown time zone {name!r}; use an IANA name such as 'America/Denver'") from err
        return name


class RfHarvester(Config):
    """Far-field RF power from a dedicated transmitter, rectified to DC.

    Received power follows the log-distance path-loss model anchored by Friis at d0 = 1 m
    (``simulator.radio``, shared with the gateway link):
    P_rx = P_tx * G_t * G_r * (lambda / (4 pi d0))^2 * (d0 / d)^n, lambda = c / f.
    Below ``sensitivity_dbm`` the rectifier delivers nothing; above it, ``rf_dc_efficiency`` * P_rx.
    The transmitter is on during ``[phase_s + k period_s, phase_s + (k + duty) period_s)``.
    """

    kind: Literal["rf"] = "rf"
    tx_power_w: float = Field(default=3.0, gt=0.0, le=100.0)
    """Transmit power (W); with ``tx_gain_dbi`` = 0 this is the EIRP (Powercast TX91501 class: 3 W)."""
    tx_gain_dbi: float = Field(default=0.0, ge=-20.0, le=40.0)
    """Transmit antenna gain (dBi)."""
    rx_gain_dbi: float = Field(default=6.1, ge=-20.0, le=40.0)
    """Receive antenna gain (dBi); 6.1 dBi is a typical 915 MHz patch."""
    frequency_hz: float = Field(default=915e6, ge=1e6, le=100e9)
    """Carrier frequency (Hz)."""
    distance_m: float = Field(default=3.0, ge=1.0, le=10_000.0)
    """Transmitter-receiver distance (m); at least the reference distance d0 = 1 m."""
    path_loss_exponent: float = Field(default=2.0, ge=1.5, le=6.0)
    """Path-loss exponent n: 2 in free space, 1.6-1.8 in line-of-sight corridors, 4-6 through obstructions."""
    rf_dc_efficiency: float = Field(default=0.3, gt=0.0, le=1.0)
    """RF-to-DC conversion efficiency of the rectifier."""
    sensitivity_dbm: float = Field(default=-17.0, ge=-60.0, le=30.0)
    """Received power (dBm) below which the rectifier delivers nothing."""
    period_s: float = Field(default=1.0, gt=0.0)
    """Period of the transmitter's on/off cycle (s)."""
    duty: float = Field(default=1.0, gt=0.0, le=1.0)
    """Fraction of each period the transmitter is on."""
    phase_s: float = Field(default=0.0, ge=0.0)
    """Time (s) at which the first on-phase begins."""


class ThermoelectricHarvester(Config):
    """Thermoelectric generator into a matched load: P = (S * dT)^2 / (4 R_int).

    dT(t) = delta_t_k + delta_t_amplitude_k * sin(2 pi t / period_s), clipped at 0 and
    evaluated at the middle of each ``step_s`` interval (piecewise constant).
    """

    kind: Literal["thermoelectric"] = "thermoelectric"
    seebeck_v_per_k: float = Field(default=0.05, gt=0.0, le=1.0)
    """Module Seebeck coefficient (V/K), all couples in series."""
    internal_resistance_ohm: float = Field(default=2.0, gt=0.0, le=10_000.0)
    """Module internal resistance (ohm); the load is matched to it."""
    delta_t_k: float = Field(default=5.0, ge=0.0, le=300.0)
    """Mean temperature difference across the module (K)."""
    delta_t_amplitude_k: float = Field(default=0.0, ge=0.0, le=300.0)
    """Amplitude of the sinusoidal swing of the temperature difference (K)."""
    period_s: float = Field(default=DAY_S, gt=0.0)
    """Period of the swing (s); a day by default."""
    step_s: float = Field(default=60.0, gt=0.0)
    """Time step of the piecewise-constant trace (s)."""


class PiezoHarvester(Config):
    """Vibration harvester seeing random bursts of vibration.

    Bursts arrive as a Poisson process, last an exponential time and deliver a lognormal
    power; overlapping bursts add (so the mean power is rate * mean_burst * E[power]).
    """

    kind: Literal["piezo"] = "piezo"
    rate_hz: float = Field(default=0.1, gt=0.0, le=1000.0)
    """Mean burst arrival rate (1/s)."""
    mean_burst_s: float = Field(default=2.0, gt=0.0, le=86_400.0)
    """Mean burst duration (s)."""
    median_power_w: float = Field(default=1e-4, gt=0.0, le=10.0)
    """Median power during a burst (W)."""
    sigma_log: float = Field(default=0.5, ge=0.0, le=3.0)
    """Standard deviation of the natural log of burst power."""


HarvesterConfig = Annotated[
    ConstantHarvester
    | CurrentHarvester
    | TraceHarvester
    | NrelHarvester
    | IvCurveHarvester
    | PanelHarvester
    | RfHarvester
    | ThermoelectricHarvester
    | PiezoHarvester,
    Field(discriminator="kind"),
]


def build_trace(cfg: HarvesterConfig, duration_s: float, rng: np.random.Generator, field: str = "harvester") -> PowerTrace:
    """The transducer's power over ``[0, duration_s)``; ``rng`` feeds the random harvesters only."""
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ConfigError("duration_s", duration_s, "must be a finite number > 0")
    return _BUILDERS[type(cfg)](cfg, float(duration_s), rng, field)


# --- shared helpers ---------------------------------------------------------------------------


def _tiled(
    time_s: np.ndarray, power_w: np.ndarray, period_s: float, offset_s: float, duration_s: float, field: str
) -> PowerTrace:
    """Repeat one period of samples (``time_s[0] == 0``) and cut out ``[offset_s, offset_s + duration_s)``."""
    copies = np.arange(math.floor(offset_s / period_s), math.ceil((offset_s + duration_s) / period_s))
    if copies.size * time_s.size > _MAX_SEGMENTS:
        raise ConfigError(
            "duration_s", duration_s, f"repeating {field} every {period_s:g} s makes more than {_MAX_SEGMENTS} segments"
        )
    t = (time_s[None, :] + period_s * copies[:, None]).ravel() - offset_s
    return PowerTrace.from_samples(t, np.tile(power_w, copies.size), duration_s)


def _windowed(
    time_s: np.ndarray, power_w: np.ndarray, span_s: float, offset_s: float, duration_s: float, field: str, value: object
) -> PowerTrace:
    """Cut ``[offset_s, offset_s + duration_s)`` out of a record that covers ``[0, span_s)`` once."""
    if offset_s + duration_s > span_s:
        raise ConfigError(
            field, value, f"the record covers {span_s:g} s; starting here leaves less than the {duration_s:g} s simulated"
        )
    return _tiled(time_s, power_w, span_s, offset_s, duration_s, field)


# --- constant, generic CSV trace, NREL ------------------------------------------------------


def _build_constant(cfg: ConstantHarvester, duration_s: float, rng: np.random.Generator, field: str) -> PowerTrace:
    return PowerTrace.constant(cfg.power_w, duration_s)


def _csv_column(table: pd.DataFrame, name: str, path: Path, field: str) -> np.ndarray:
    import pandas as pd

    if name not in table.columns:
        raise ConfigError(field, name, f"{path} has columns {list(table.columns)}")
    values = pd.to_numeric(table[name], errors="coerce").to_numpy(dtype=np.float64)
    if values.size < 2 or not np.all(np.isfinite(values)):
        raise DataError(f"{field}: column {name!r} of {path} needs at least 2 rows, all numbers")
    return values


def _build_csv_trace(cfg: TraceHarvester, duration_s: float, rng: np.random.Generator, field: str) -> PowerTrace:
    import pandas as pd

    path = resolve_data_file(cfg.path, f"{field}.path")
    try:
        table = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise DataError(f"{field}.path: cannot read {path} as CSV: {err}") from err
    time_s = _csv_column(table, cfg.time_column, path, f"{field}.time_column") * _SECONDS_PER_UNIT[cfg.time_unit]
    value = _csv_column(table, cfg.value_column, path, f"{field}.value_column")
    if np.any(np.diff(time_s) <= 0):
        raise DataError(f"{field}.path: times in {path} must be strictly increasing")
    power_w = value if cfg.value == "power_w" else value * cfg.panel_area_m2 * cfg.efficiency
    time_s = time_s - time_s[0]
    span_s = time_s[-1] + (time_s[-1] - time_s[-2])
    if cfg.repeat:
        return _tiled(time_s, power_w, span_s, cfg.start_s, duration_s, f"{field}.repeat")
    return _windowed(time_s, power_w, span_s, cfg.start_s, duration_s, f"{field}.start_s", cfg.start_s)


@functools.lru_cache(maxsize=8)
def _read_nrel(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(seconds since midnight of the 1st of the month, GHI W/m^2), read-only arrays."""
    import pandas as pd

    try:
        table = pd.read_csv(path, dtype=str)
        day = pd.to_datetime(table.iloc[:, 0], format="%m/%d/%Y")
        clock = table.iloc[:, 1].str.split(":", expand=True).astype(int)
        ghi = pd.to_numeric(table.iloc[:, 2]).to_numpy(dtype=np.float64)
    except (ValueError, IndexError, KeyError, pd.errors.ParserError) as err:
        raise DataError(f"{path} is not an NREL 1-minute file (DATE (MM/DD/YYYY),MST,GHI): {err}") from err
    # Hours and minutes count from the row's date, so a "24:00" row rolls over into the next day.
    days = (day - day.iloc[0].replace(day=1)).dt.days.to_numpy()
    time_s = days * DAY_S + clock[0].to_numpy() * 3600.0 + clock[1].to_numpy() * 60.0
    if np.any(np.diff(time_s) <= 0):
        raise DataError(f"{path}: rows must be in strictly increasing time")
    time_s.flags.writeable = ghi.flags.writeable = False
    return time_s, ghi


def _build_nrel(cfg: NrelHarvester, duration_s: float, rng: np.random.Generator, field: str) -> PowerTrace:
    time_s, ghi_w_m2 = _read_nrel(resolve_data_file(cfg.path, f"{field}.path"))
    power_w = np.clip(ghi_w_m2, 0.0, None) * cfg.panel_area_m2 * cfg.efficiency
    record_s = time_s[-1] + 60.0
    start_s = (cfg.start_day - 1) * DAY_S
    if start_s < time_s[0]:
        raise ConfigError(f"{field}.start_day", cfg.start_day, f"the file starts on day {int(time_s[0] // DAY_S) + 1}")
    return _windowed(
        time_s - time_s[0], power_w, record_s - time_s[0], start_s - time_s[0], duration_s, f"{field}.start_day", cfg.start_day
    )


# --- indoor light on a measured I-V curve ---------------------------------------------------


def _mpp_w(curve_path: Path) -> float:
    """Maximum of V * (-I) over one I-V sweep, linearly interpolated on a fine voltage grid."""
    try:
        sweep = json.loads(curve_path.read_text())["0"]
        v = np.array([float(k) for k in sweep], dtype=np.float64)
        i = np.array([float(a) for a in sweep.values()], dtype=np.float64)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise DataError(f"{curve_path} is not an I-V curve ({{'0': {{volts: amps}}}}): {err}") from err
    order = np.argsort(v)
    # The measured voltages stay in the grid, so the result is never below the best measured point.
    v_fine = np.union1d(np.linspace(v.min(), v.max(), 4001), v)
    return float(np.max(v_fine * -np.interp(v_fine, v[order], i[order])))


@functools.lru_cache(maxsize=16)
def _mpp_by_lux(curves_dir: Path, cell: str) -> tuple[tuple[float, float], ...]:
    """((lux, P_mpp W), ...) for every measured level of ``cell``, in increasing lux."""
    levels = []
    for path in curves_dir.glob(f"{cell}_lux*.json"):
        try:
            lux = float(path.stem.rsplit("_lux", 1)[1])
        except ValueError:
            continue
        levels.append((lux, _mpp_w(path)))
    return tuple(sorted(levels))


def _cell_levels(cfg: IvCurveHarvester, field: str) -> tuple[np.ndarray, np.ndarray]:
    curves_dir = resolve_data_dir(cfg.curves_dir, f"{field}.curves_dir")
    levels = _mpp_by_lux(curves_dir, cfg.cell)
    if not levels:
        cells = sorted({p.stem.rsplit("_lux", 1)[0] for p in curves_dir.glob("*_lux*.json")})
        raise DataError(f"{field}.cell = {cfg.cell!r}: no curves {cfg.cell}_lux*.json in {curves_dir}; cells there: {cells}")
    lux, p_mpp_w = (np.array(column) for column in zip(*levels))
    if np.any(p_mpp_w <= 0) or np.any(lux <= 0):
        raise DataError(f"{field}.cell = {cfg.cell!r}: a curve in {curves_dir} delivers no power or has lux <= 0")
    return lux, p_mpp_w


def _mpp_at(lux: np.ndarray, levels_lux: np.ndarray, levels_w: np.ndarray) -> np.ndarray:
    """P_mpp at ``lux``: log-log interpolation inside the measured range, proportional to lux outside it."""
    inside = np.exp(np.interp(np.log(np.clip(lux, levels_lux[0], levels_lux[-1])), np.log(levels_lux), np.log(levels_w)))
    below = levels_w[0] * lux / levels_lux[0]
    above = levels_w[-1] * lux / levels_lux[-1]
    return np.where(lux < levels_lux[0], below, np.where(lux > levels_lux[-1], above, inside))


def _daily_lux(cfg: IvCurveHarvester) -> tuple[np.ndarray, np.ndarray]:
    """(seconds of the day, lux) breakpoints of the schedule; the base ``lux`` fills the gaps."""
    edges_s = np.array(sorted({0.0, *(hour * 3600.0 for window in cfg.schedule for hour in window[:2])} - {DAY_S}))
    middle_h = (edges_s + np.append(edges_s[1:], DAY_S)) / 2.0 / 3600.0
    lux = [next((w_lux for start_h, end_h, w_lux in cfg.schedule if start_h <= h < end_h), cfg.lux) for h in middle_h]
    return edges_s, np.array(lux)


def _build_iv_curve(cfg: IvCurveHarvester, duration_s: float, rng: np.random.Generator, field: str) -> PowerTrace:
    levels_lux, levels_w = _cell_levels(cfg, field)
    time_s, lux = _daily_lux(cfg)
    return _tiled(time_s, _mpp_at(lux, levels_lux, levels_w), DAY_S, 0.0, duration_s, f"{field}.schedule")


# --- sources with a current-voltage characteristic (input.kind direct, diode, bq25570) -----------


@dataclass(frozen=True)
class CurveTrace:
    """A source's I-V curve over time: ``curves[index[k]]`` holds on ``[time_s[k], time_s[k+1])``.

    A curve is (v, i): cell voltages increasing from 0 and the current delivered there (A, >= 0),
    linear in between and 0 past the last point (V_oc); a single point is a current source."""

    time_s: np.ndarray
    index: np.ndarray
    curves: tuple[tuple[np.ndarray, np.ndarray], ...]


def _build_current(cfg: CurrentHarvester, duration_s: float, field: str) -> PowerTrace:
    """The source's current over time (A, in a PowerTrace's value column)."""
    if cfg.path is None and cfg.period_s is not None and cfg.duty < 1.0:
        return _tiled(np.array([0.0, cfg.duty * cfg.period_s]), np.array([cfg.current_a, 0.0]), cfg.period_s, 0.0,
                      duration_s, f"{field}.period_s")
    if cfg.path is None:
        return PowerTrace.constant(cfg.current_a, duration_s)
    as_trace = TraceHarvester(path=cfg.path, time_column=cfg.time_column, value_column=cfg.value_column,
                              time_unit=cfg.time_unit, start_s=cfg.start_s, repeat=cfg.repeat)
    return _build_csv_trace(as_trace, duration_s, np.random.default_rng(0), field)


def build_curves(cfg: HarvesterConfig, duration_s: float, field: str = "harvester") -> CurveTrace:
    """The I-V curves of a current or iv_curve source over ``[0, duration_s)``; a ConfigError for
    sources that are powers only."""
    if isinstance(cfg, CurrentHarvester):
        current = _build_current(cfg, duration_s, field)
        curves = tuple((np.zeros(1), np.array([a])) for a in current.power_w)
        return CurveTrace(current.time_s, np.arange(len(curves)), curves)
    if isinstance(cfg, IvCurveHarvester):
        day_s, lux = _daily_lux(cfg)
        levels = _cell_curves(resolve_data_dir(cfg.curves_dir, f"{field}.curves_dir"), cfg.cell, field)
        distinct = sorted(set(lux.tolist()))
        curves = tuple(_curve_at(levels, x) for x in distinct)
        days = np.arange(math.ceil(duration_s / DAY_S))
        time_s = (day_s[None, :] + DAY_S * days[:, None]).ravel()
        index = np.tile(np.searchsorted(distinct, lux), days.size)
        keep = time_s < duration_s
        return CurveTrace(time_s[keep], index[keep], curves)
    raise ConfigError(f"{field}.kind", cfg.kind, "delivers a power, not a current at a voltage: "
                      "input.kind direct, diode and bq25570 need harvester.kind current or iv_curve "
                      "(or, for bq25570, input.input_v)")


@functools.lru_cache(maxsize=16)
def _cell_curves(curves_dir: Path, cell: str, field: str) -> tuple[tuple[float, np.ndarray, np.ndarray], ...]:
    """((lux, v, i delivered), ...) of every measured level, increasing lux, v from 0 (the first
    measured current held down to 0 V)."""
    levels = []
    for path in curves_dir.glob(f"{cell}_lux*.json"):
        try:
            lux = float(path.stem.rsplit("_lux", 1)[1])
            sweep = json.loads(path.read_text())["0"]
            v = np.array([float(k) for k in sweep], dtype=np.float64)
            i = -np.array([float(a) for a in sweep.values()], dtype=np.float64)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise DataError(f"{path} is not an I-V curve ({{'0': {{volts: amps}}}}): {err}") from err
        order = np.argsort(v)
        v, i = v[order], np.clip(i[order], 0.0, None)
        if v[0] > 0:
            v, i = np.concatenate(([0.0], v)), np.concatenate(([i[0]], i))
        last = int(np.flatnonzero(i > 0)[-1]) + 2 if np.any(i > 0) else 1  # up to the first 0 A point: V_oc
        levels.append((lux, v[:last], i[:last]))
    if not levels:
        raise DataError(f"{field}.cell = {cell!r}: no curves {cell}_lux*.json in {curves_dir}")
    return tuple(sorted(levels, key=lambda level: level[0]))


def _curve_at(levels: tuple[tuple[float, np.ndarray, np.ndarray], ...], lux: float) -> tuple[np.ndarray, np.ndarray]:
    """The I-V curve at ``lux``: between measured levels the currents mix linearly in log(lux) on the
    union of their voltages; outside, the nearest curve's current scales with lux (V_oc kept)."""
    if lux <= 0:
        return np.zeros(1), np.zeros(1)
    luxes = [level[0] for level in levels]
    if lux <= luxes[0] or lux >= luxes[-1]:
        ref, v, i = levels[0] if lux <= luxes[0] else levels[-1]
        return v, i * (lux / ref)
    k = int(np.searchsorted(luxes, lux, side="right")) - 1
    (la, va, ia), (lb, vb, ib) = levels[k], levels[k + 1]
    w = math.log(lux / la) / math.log(lb / la)
    if w == 0.0:
        return va, ia
    v = np.union1d(va, vb)
    return v, (1.0 - w) * np.interp(v, va, ia, right=0.0) + w * np.interp(v, vb, ib, right=0.0)


# --- outdoor panel from pvlib (imported inside: it takes about a second, and only panels need it)


@functools.lru_cache(maxsize=4)
def _read_tmy3_ghi(path: Path) -> np.ndarray:
    import pandas as pd
    import pvlib

    try:
        weather, _ = pvlib.iotools.read_tmy3(path, map_variables=True)
        ghi = weather["ghi"].to_numpy(dtype=np.float64)
    except (ValueError, KeyError, IndexError, pd.errors.ParserError) as err:
        raise DataError(f"{path} is not a TMY3 file: {err}") from err
    if ghi.size == 0 or not np.all(np.isfinite(ghi)):
        raise DataError(f"{path}: GHI column is empty or holds non-numbers")
    ghi.flags.writeable = False
    return ghi


def _build_tmy(cfg: PanelHarvester, duration_s: float, field: str) -> PowerTrace:
    import pvlib

    default = Path(pvlib.__file__).parent / "data" / "723170TYA.CSV"
    path = default if cfg.tmy_path is None else resolve_data_file(cfg.tmy_path, f"{field}.tmy_path")
    ghi_w_m2 = _read_tmy3_ghi(path)
    # TMY3 row k is the irradiance integrated over the hour *ending* at hour k + 1, so it holds on [k h, (k+1) h).
    time_s = np.arange(ghi_w_m2.size) * 3600.0
    power_w = np.clip(ghi_w_m2, 0.0, None) * cfg.panel_area_m2 * cfg.efficiency
    return _tiled(
        time_s, power_w, ghi_w_m2.size * 3600.0, (cfg.start_day_of_year - 1) * DAY_S, duration_s, f"{field}.start_day_of_year"
    )


def _build_clearsky(cfg: PanelHarvester, duration_s: float, field: str) -> PowerTrace:
    import pandas as pd
    import pvlib

    minutes = math.ceil(duration_s / 60.0)
    if minutes > _MAX_SEGMENTS:
        raise ConfigError("duration_s", duration_s, f"clearsky makes one segment a minute, at most {_MAX_SEGMENTS}")
    site = pvlib.location.Location(cfg.latitude_deg, cfg.longitude_deg, tz=cfg.timezone, altitude=cfg.altitude_m)
    midnight = pd.Timestamp(cfg.start_date).tz_localize(cfg.timezone)
    # Sampling each minute at its middle makes the piecewise-constant energy exact to second order.
    time_s = np.arange(minutes) * 60.0
    ghi_w_m2 = site.get_clearsky(midnight + pd.to_timedelta(time_s + 30.0, unit="s"), model="ineichen")["ghi"]
    return PowerTrace.from_samples(time_s, ghi_w_m2.to_numpy() * cfg.panel_area_m2 * cfg.efficiency, duration_s)


def _build_panel(cfg: PanelHarvester, duration_s: float, rng: np.random.Generator, field: str) -> PowerTrace:
    if cfg.source == "tmy":
        return _build_tmy(cfg, duration_s, field)
    return _build_clearsky(cfg, duration_s, field)


# --- RF, thermoelectric, piezo --------------------------------------------------------------


def _build_rf(cfg: RfHarvester, duration_s: float, rng: np.random.Generator, field: str) -> PowerTrace:
    received_w = received_power_w(
        cfg.tx_power_w, cfg.distance_m, cfg.frequency_hz, cfg.path_loss_exponent, cfg.tx_gain_dbi + cfg.rx_gain_dbi
    )
    on_w = 0.0 if 10.0 * math.log10(received_w / 1e-3) < cfg.sensitivity_dbm else cfg.rf_dc_efficiency * received_w
    if cfg.duty == 1.0 or on_w == 0.0:
        return PowerTrace.constant(on_w, duration_s)
    cycle_s = np.array([0.0, cfg.duty * cfg.period_s])
    return _tiled(cycle_s, np.array([on_w, 0.0]), cfg.period_s, -cfg.phase_s, duration_s, f"{field}.period_s")


def _build_thermoelectric(cfg: ThermoelectricHarvester, duration_s: float, rng: np.random.Generator, field: str) -> PowerTrace:
    steps = 1 if cfg.delta_t_amplitude_k == 0.0 else math.ceil(duration_s / cfg.step_s)
    if steps > _MAX_SEGMENTS:
        raise ConfigError(
            f"{field}.step_s", cfg.step_s, f"{duration_s} s in steps this small makes more than {_MAX_SEGMENTS} segments"
        )
    time_s = np.arange(steps) * cfg.step_s
    swing = np.sin(2.0 * math.pi * (time_s + 0.5 * cfg.step_s) / cfg.period_s)
    delta_t_k = np.clip(cfg.delta_t_k + cfg.delta_t_amplitude_k * swing, 0.0, None)
    # Maximum power transfer: a load equal to R_int takes half the open-circuit voltage S * dT.
    power_w = (cfg.seebeck_v_per_k * delta_t_k) ** 2 / (4.0 * cfg.internal_resistance_ohm)
    return PowerTrace.from_samples(time_s, power_w, duration_s)


def _build_piezo(cfg: PiezoHarvester, duration_s: float, rng: np.random.Generator, field: str) -> PowerTrace:
    expected = cfg.rate_hz * duration_s
    if expected > _MAX_SEGMENTS / 2:
        raise ConfigError(f"{field}.rate_hz", cfg.rate_hz, f"over {duration_s} s this makes more than {_MAX_SEGMENTS} segments")
    count = int(rng.poisson(expected))
    start_s = np.sort(rng.uniform(0.0, duration_s, count))
    burst_w = rng.lognormal(math.log(cfg.median_power_w), cfg.sigma_log, count)
    end_s = start_s + rng.exponential(cfg.mean_burst_s, count)
    time_s = np.concatenate(([0.0], start_s, end_s))
    order = np.argsort(time_s, kind="stable")
    level_w = np.cumsum(np.concatenate(([0.0], burst_w, -burst_w))[order])
    active = np.cumsum(np.concatenate(([0], np.ones(count), -np.ones(count)))[order])
    level_w[active == 0] = 0.0  # no rounding residue between bursts
    time_s = time_s[order]
    last_at_time = np.append(time_s[1:] != time_s[:-1], True)
    return PowerTrace.from_samples(time_s[last_at_time], level_w[last_at_time], duration_s)


_BUILDERS: dict[type, Callable[..., PowerTrace]] = {
    ConstantHarvester: _build_constant,
    CurrentHarvester: lambda cfg, duration_s, rng, field: _build_current(cfg, duration_s, field),
    TraceHarvester: _build_csv_trace,
    NrelHarvester: _build_nrel,
    IvCurveHarvester: _build_iv_curve,
    PanelHarvester: _build_panel,
    RfHarvester: _build_rf,
    ThermoelectricHarvester: _build_thermoelectric,
    PiezoHarvester: _build_piezo,
}
