"""The power path around the capacitor: how a source is coupled in, and the stage that feeds the load.

Every part reduces, between two events, to constant terms of eq. (1) in ``simulator.capacitor``,
C·v·dv/dt = p − i·v − g·v²: a power p, a current i drawn (negative when delivered) and
a conductance g. A part whose terms change with the capacitor voltage (a cell on its I–V
curve, the charger's cold start) splits the voltage axis into regions whose edges are
events of the exact engine.

Input (``[input]``):

- ``converter``: today's model, every source power times ``storage.input_efficiency``.
- ``direct``: a cell (or current source) wired to the capacitor operates at V_cap on its I–V
  curve, a piecewise-linear I(v) = a − b·v per segment: i += −a, g += b. It cannot charge
  past V_oc, and charges slower near it.
- ``diode``: the same through a diode of fixed drop: the cell sits at V_cap + drop.
- ``bq25570``: TI's boost charger with fractional-V_oc MPPT, cold start and its efficiency
  table (``BQ25570`` below, cited).

Output (``[output]``): ``converter`` (load power / ``storage.output_efficiency``, today's
model), ``direct`` (the load on the capacitor), ``ldo`` (input current = load current +
quiescent current, which differs with the output on and off), ``buck`` (input power =
V_out·I_load / η(I_load)). A comparator gating the load on V_cap (MIC841-class) is the
storage's v_on_v/v_off_v hysteresis plus ``gate_quiescent_a``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from edge.core.config import Config
from edge.core.errors import ConfigError

# TI SLUSBH2G (bq25570 datasheet, March 2019), §6.5 Electrical Characteristics unless noted.
BQ25570_SOURCE = (
    "TI SLUSBH2G bq25570 datasheet: VIN(CS) 330 mV typ (cold start), VSTOR_CHGEN 1.73 V typ (cold start ends), "
    "PIN(CS) 5 uW, PIN 0.005-510 mW and VIN(DC) 100 mV min for normal charging, IQ 488 nA typ (full operating "
    "mode, the storage's quiescent_a); §7.3.1 MPPT: VOC sampled every 16 s (typ) for 256 ms with the charger "
    "off, input regulated to 80 % (VOC_SAMP to VSTOR) or 50 % (to GND) of it. Efficiency: approximate readings "
    "of Figures 1-7 (charger efficiency vs input current at VSTOR = 3 V for VIN = 0.2/0.5/1/2/3 V), read to "
    "about +-5 points and not re-checked against the PDF; cold-start efficiency is not given in the datasheet "
    "(it calls the cold-start converter 'lower efficiency'): 10 % is an assumption. Give your own measured "
    "table in input.efficiency_table."
)
# rows: input voltage (V); columns: input current (A)
BQ25570_VIN_V = (0.2, 0.5, 1.0, 2.0, 3.0)
BQ25570_IIN_A = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
BQ25570_EFFICIENCY = (
    (0.50, 0.66, 0.72, 0.74, 0.68),
    (0.66, 0.78, 0.83, 0.85, 0.82),
    (0.72, 0.83, 0.87, 0.89, 0.88),
    (0.75, 0.86, 0.90, 0.92, 0.92),
    (0.76, 0.87, 0.91, 0.93, 0.93),
)


class InputConfig(Config):
    """How the source is coupled to the capacitor (``[input]``)."""

    kind: Literal["converter", "direct", "diode", "bq25570"] = "converter"
    """converter: source power x storage.input_efficiency (power sources); direct / diode: a cell or current
    source wired to the capacitor (through a diode); bq25570: TI's MPPT boost charger."""
    diode_drop_v: float = Field(0.3, ge=0, le=2)
    """diode: forward drop (a Schottky's at tens of uA is ~0.2-0.3 V)."""
    mppt_fraction: float = Field(0.8, gt=0, lt=1)
    """bq25570: input regulated to this fraction of V_oc (0.8 solar, 0.5 thermoelectric)."""
    mppt_period_s: float = Field(16.0, gt=0, le=3600)
    """bq25570: V_oc is sampled this often..."""
    mppt_sample_s: float = Field(0.256, ge=0, le=60)
    """bq25570: ...with the charger off for this long."""
    vstor_chgen_v: float = Field(1.73, gt=0, le=5.5)
    """bq25570: below this V_stor only the cold-start converter charges."""
    cold_start_min_v: float = Field(0.33, ge=0, le=5)
    """bq25570: VIN(CS), the least input voltage for cold start."""
    cold_start_min_w: float = Field(5e-6, ge=0, le=1)
    """bq25570: PIN(CS), the least input power for cold start."""
    cold_start_efficiency: float = Field(0.10, gt=0, le=1)
    """bq25570: cold-start converter efficiency (not in the datasheet: an assumption)."""
    min_input_v: float = Field(0.1, ge=0, le=5)
    """bq25570: VIN(DC) minimum for normal charging."""
    min_input_w: float = Field(5e-6, ge=0, le=1)
    """bq25570: PIN minimum for normal charging."""
    input_v: float | None = Field(None, gt=0, le=5.1)
    """bq25570 with a power source (no I-V curve): the input voltage it operates at."""
    efficiency_vin_v: tuple[float, ...] = BQ25570_VIN_V
    """bq25570: input voltages (V) of the efficiency table's rows, increasing."""
    efficiency_iin_a: tuple[float, ...] = BQ25570_IIN_A
    """bq25570: input currents (A) of its columns, increasing; interpolated in log current."""
    efficiency_table: tuple[tuple[float, ...], ...] = BQ25570_EFFICIENCY
    """bq25570: charger efficiency at (row voltage, column current); the default is the datasheet's (see source)."""
    vbat_ov_v: float | None = Field(None, gt=0, le=5.5)
    """bq25570: VBAT_OV, where charging stops; replaces storage.v_max_v."""
    vbat_ok_hyst_v: float | None = Field(None, gt=0, le=5.5)
    """bq25570: VBAT_OK rising threshold (load on); replaces storage.v_on_v."""
    vbat_ok_prog_v: float | None = Field(None, gt=0, le=5.5)
    """bq25570: VBAT_OK falling threshold (load off); replaces storage.v_off_v."""

    @model_validator(mode="after")
    def _table_shape(self) -> InputConfig:
        if self.mppt_sample_s >= self.mppt_period_s:
            raise ConfigError("input.mppt_sample_s", self.mppt_sample_s,
                              f"must be shorter than input.mppt_period_s ({self.mppt_period_s})")
        rows, cols = len(self.efficiency_vin_v), len(self.efficiency_iin_a)
        if len(self.efficiency_table) != rows or any(len(r) != cols for r in self.efficiency_table):
            raise ConfigError("input.efficiency_table", f"{len(self.efficiency_table)} rows",
                              f"needs {rows} rows (efficiency_vin_v) of {cols} values (efficiency_iin_a)")
        for name, axis in (("efficiency_vin_v", self.efficiency_vin_v), ("efficiency_iin_a", self.efficiency_iin_a)):
            if not axis or any(b <= a for a, b in itertools.pairwise(axis)) or axis[0] <= 0:
                raise ConfigError(f"input.{name}", list(axis), "must be positive and strictly increasing")
        if any(not 0 < e <= 1 for r in self.efficiency_table for e in r):
            raise ConfigError("input.efficiency_table", "a value", "efficiencies must lie in (0, 1]")
        return self

    def charger_efficiency(self, vin_v: float, iin_a: float) -> float:
        """The table bilinearly interpolated in (V_in, log I_in), held flat outside it."""
        v = np.asarray(self.efficiency_vin_v)
        logi = np.log(np.asarray(self.efficiency_iin_a))
        x = math.log(max(iin_a, 1e-30))
        by_row = np.array([np.interp(x, logi, np.asarray(row)) for row in self.efficiency_table])
        return float(np.interp(vin_v, v, by_row))

    def charger_power_w(self, vin_v: float, pin_w: float, cold: bool) -> float:
        """Power the bq25570 delivers into V_stor from ``pin_w`` at ``vin_v`` (the MPPT point)."""
        if cold:
            ok = vin_v >= self.cold_start_min_v and pin_w >= self.cold_start_min_w
            return self.cold_start_efficiency * pin_w if ok else 0.0
        if vin_v < self.min_input_v or pin_w < self.min_input_w:
            return 0.0
        return self.charger_efficiency(vin_v, pin_w / vin_v) * pin_w


class OutputConfig(Config):
    """The stage between the capacitor and the load (``[output]``)."""

    kind: Literal["converter", "direct", "ldo", "buck"] = "converter"
    """converter: load power / storage.output_efficiency; direct: the load on the capacitor; ldo: input current
    = load current + quiescent; buck: input power = V_out x I_load / efficiency(I_load)."""
    v_out_v: float = Field(3.0, gt=0, le=50)
    """Regulated output (ldo, buck); for every kind, the voltage a load given as a current is supplied at."""
    dropout_v: float = Field(0.1, ge=0, le=5)
    """ldo: least V_cap - V_out while regulating (below it V_out = V_cap - dropout); buck: least headroom."""
    quiescent_on_a: float = Field(0.0, ge=0, le=1)
    """ldo, buck: current the stage draws from the capacitor while its output is on."""
    quiescent_off_a: float = Field(0.0, ge=0, le=1)
    """ldo, buck: ...and while it is off (the node off)."""
    efficiency: tuple[tuple[float, float], ...] = ((1e-6, 0.6), (1e-4, 0.85), (1e-2, 0.9))
    """buck: (load current A, efficiency) points, interpolated in log current, flat outside."""
    gate_quiescent_a: float = Field(0.0, ge=0, le=1)
    """A comparator switching the output on V_cap (storage.v_on_v / v_off_v), e.g. a MIC841: its supply current."""
    load_off_v: float | None = Field(None, gt=0, le=50)
    """The load's own brown-out at the output (default: the MCU's brown_out_v)."""
    load_on_v: float | None = Field(None, gt=0, le=50)
    """The least output voltage the load starts at (default: none beyond the gate)."""

    @field_validator("efficiency")
    @classmethod
    def _curve(cls, points: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
        if not points or any(i <= 0 or not 0 < e <= 1 for i, e in points):
            raise ValueError("needs (current > 0, 0 < efficiency <= 1) points")
        if any(b[0] <= a[0] for a, b in itertools.pairwise(points)):
            raise ValueError("currents must increase")
        return points

    def buck_efficiency(self, i_load_a: float) -> float:
        cur, eff = zip(*self.efficiency)
        return float(np.interp(math.log(max(i_load_a, 1e-30)), np.log(cur), eff))

    def cap_threshold_v(self, output_v: float) -> float:
        """The capacitor voltage at which the output reaches ``output_v``."""
        if self.kind == "ldo":
            return output_v + self.dropout_v
        if self.kind == "buck":
            return max(output_v, self.v_out_v) + self.dropout_v  # the model supplies the load only in regulation
        return output_v


@dataclass(frozen=True)
class LoadTerms:
    """What one load draws from the capacitor (eq. 1 terms) and what reaches the load."""

    p_w: float  # constant power taken from the capacitor (>= 0)
    i_a: float  # constant current taken from the capacitor (>= 0)
    load_w: float  # power delivered to the load, booked per second (0 for current loads)
    load_a: float  # a direct current load: it receives load_a x V_cap
    ldo_a: float = 0.0  # a load behind an LDO: it receives ldo_a x min(v_out, V_cap - dropout)
    ldo_out_v: float = 0.0
    ldo_dropout_v: float = 0.0


def load_terms(out: OutputConfig, out_eff: float, power_w: float, current_a: float, on: bool) -> LoadTerms:
    """The terms of a load of ``power_w`` (or ``current_a`` at the output, when > 0) behind ``out``.

    ``out_eff`` is storage.output_efficiency (the converter kind). A load given as a power behind
    a regulator draws P / v_out from it; a load given as a current under the converter kind
    draws I x v_out. The node off draws only the stage's off-state quiescent current."""
    if not on:
        q = out.quiescent_off_a if out.kind in ("ldo", "buck") else 0.0
        return LoadTerms(0.0, q, 0.0, 0.0)
    if out.kind == "converter":
        p = current_a * out.v_out_v if current_a > 0 else power_w
        return LoadTerms(p / out_eff, 0.0, p, 0.0)
    if out.kind == "direct":
        return LoadTerms(0.0, current_a, 0.0, current_a) if current_a > 0 else LoadTerms(power_w, 0.0, power_w, 0.0)
    i_load = current_a if current_a > 0 else power_w / out.v_out_v
    if out.kind == "ldo":
        return LoadTerms(0.0, i_load + out.quiescent_on_a, 0.0, 0.0, i_load, out.v_out_v, out.dropout_v)
    p_out = i_load * out.v_out_v
    p_in = p_out / out.buck_efficiency(i_load) if i_load > 0 else 0.0
    return LoadTerms(p_in, out.quiescent_on_a, p_out, 0.0)


@dataclass(frozen=True)
class CurveRegions:
    """A cell's I-V curve on the capacitor's voltage axis: I(v) = a[k] − b[k]·v for
    edges[k-1] <= v < edges[k] (edges has one entry fewer than a and b)."""

    edges: tuple[float, ...]
    a: tuple[float, ...]
    b: tuple[float, ...]

    def region(self, v: float) -> int:
        return int(np.searchsorted(np.asarray(self.edges), v, side="right")) if self.edges else 0

    def current_a(self, v: float) -> float:
        k = self.region(v)
        return self.a[k] - self.b[k] * v


def curve_regions(v_cell: np.ndarray, i_cell: np.ndarray, drop_v: float) -> CurveRegions:
    """The piecewise-linear curve through (v_cell, i_cell) (delivered current >= 0, v_cell increasing
    from 0), zero past its last point, seen from a capacitor behind ``drop_v``."""
    if len(v_cell) == 1:  # a current source: the same current at any voltage
        return CurveRegions((), (float(i_cell[0]),), (0.0,))
    edges, a, b = [], [], []
    for k in range(len(v_cell) - 1):
        slope = -(i_cell[k + 1] - i_cell[k]) / (v_cell[k + 1] - v_cell[k])  # b >= 0 on a cell's curve
        a.append(float(i_cell[k] + slope * v_cell[k] - slope * drop_v))
        b.append(float(slope))
        edges.append(float(v_cell[k + 1] - drop_v))
    a.append(0.0)
    b.append(0.0)
    # regions wholly below 0 V on the capacitor side never apply
    first = next((k for k, e in enumerate(edges) if e > 0.0), len(edges))
    return CurveRegions(tuple(edges[first:]), tuple(a[first:]), tuple(b[first:]))


def mppt_point(v_cell: np.ndarray, i_cell: np.ndarray, fraction: float) -> tuple[float, float]:
    """(V_in, I_in) where fractional-V_oc MPPT holds the cell: V_in = fraction x V_oc."""
    if len(v_cell) == 1:
        if i_cell[0] == 0.0:  # no light: nothing to track
            return 0.0, 0.0
        raise ConfigError("input.kind", "bq25570", "needs a source with an open-circuit voltage (an I-V curve), "
                          "or a power source with input.input_v; a current source has none")
    v_in = fraction * float(v_cell[-1])
    return v_in, float(np.interp(v_in, v_cell, i_cell))


@dataclass(frozen=True)
class Thresholds:
    """The capacitor voltages the node switches at, all parts considered."""

    v_on: float  # the load connects (gate on, and the load's own start voltage reached)
    v_cut: float  # the load stops (gate off, or the load browns out at the output)
    v_max: float  # charging stops (clamp or VBAT_OV)


def thresholds(storage: object, inp: InputConfig, out: OutputConfig, brown_out_v: float) -> Thresholds:
    """v_on, v_cut and v_max of a scenario's power path (bq25570 VBAT_OK/VBAT_OV replace the storage's)."""
    from simulator.storage import StorageConfig

    assert isinstance(storage, StorageConfig)
    bq = inp.kind == "bq25570"
    v_max = inp.vbat_ov_v if bq and inp.vbat_ov_v is not None else storage.v_max_v
    gate_on = inp.vbat_ok_hyst_v if bq and inp.vbat_ok_hyst_v is not None else storage.v_on_v
    gate_off = inp.vbat_ok_prog_v if bq and inp.vbat_ok_prog_v is not None else storage.v_off_v
    load_off = out.load_off_v if out.load_off_v is not None else brown_out_v
    v_cut = max(gate_off, out.cap_threshold_v(load_off))
    v_on = gate_on if out.load_on_v is None else max(gate_on, out.cap_threshold_v(out.load_on_v))
    if not v_cut < v_on <= v_max:
        raise ConfigError("storage.v_on_v", v_on, f"the load must switch on (at {v_on:g} V) above where it stops "
                          f"({v_cut:g} V: gate off, or the load's brown-out behind the {out.kind} stage) and at or "
                          f"below the clamp ({v_max:g} V)")
    return Thresholds(v_on, v_cut, v_max)
