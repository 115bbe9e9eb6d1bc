"""Energy storage: the capacitor and the power path's storage-side figures (``[storage]``).

The physics, eq. (1) C·v·dv/dt = p − i·v − g·v² and its closed forms, lives in
``simulator.capacitor``; its functions are re-exported here.
"""

from __future__ import annotations

import math

from pydantic import Field, field_validator, model_validator

from edge.core.config import Config
from edge.core.errors import ConfigError
from simulator.capacitor import (
    direction,
    equilibrium_v,
    rate,
    target_v,
    time_to,
    voltage_after,
    voltage_moments,
)
from simulator.devices import McuProfile

__all__ = ["StorageConfig", "direction", "equilibrium_v", "rate", "target_v", "time_to", "voltage_after",
           "voltage_moments"]


class StorageConfig(Config):
    """The capacitor and the power path around it (a BQ25570-class harvesting PMU)."""

    capacitance_f: float = Field(10e-3, gt=0, le=100)
    """Storage capacitance."""
    v_max_v: float = Field(3.6, gt=0, le=50)
    """Clamp voltage: surplus harvest above it is shunted and counted as wasted."""
    v_on_v: float = Field(3.0, gt=0, le=50)
    """The load is connected when the voltage rises to this (hysteresis upper threshold)."""
    v_off_v: float = Field(2.0, gt=0, le=50)
    """The load is disconnected when the voltage falls to this (power failure)."""
    v_initial_v: float = Field(0.0, ge=0, le=50)
    """Voltage at t = 0."""
    leakage_r_ohm: float | None = Field(1e6, gt=0)
    """Resistive leakage (parallel resistance); "none" (TOML has no null) or inf for none."""
    leakage_a: float = Field(0.0, ge=0, le=1)
    """Constant leakage current of the dielectric."""
    quiescent_a: float = Field(0.5e-6, ge=0, le=1)
    """Quiescent current of the power path, drawn from the capacitor at all times."""
    input_efficiency: float = Field(0.8, gt=0, le=1)
    """MPPT/boost converter efficiency, harvester → capacitor."""
    output_efficiency: float = Field(0.9, gt=0, le=1)
    """Buck/LDO efficiency, capacitor → load."""
    esr_ohm: float = Field(0.0, ge=0, le=1e4)
    """Equivalent series resistance: under a load current I the terminals sag I x esr_ohm below the
    capacitor's voltage, so the load stops that much above the cut-off. Modelled as the drop under
    the heaviest phase's current at the cut-off, applied in every mode (simulator.fleet; conservative
    in lighter modes); its I²R loss is not booked. The bank's capacitors have none."""
    bank_f: tuple[float, ...] = ()
    """Reconfigurable storage (Capybara, ASPLOS 2018; REACT, 2024): capacitors switched onto the
    bus beside capacitance_f, in this order. In surplus each connects when the bus rises to
    bank_connect_v (charge sharing with what it holds; the loss is booked as switching_loss_j); as
    the input falls the last one connected is isolated at bank_isolate_v and keeps its charge
    (leaking through bank_leakage_r_ohm) until the bus rises again: a small buffer's quick start
    with a large one's capacity. No series reconfiguration is modelled. () : a fixed capacitor."""
    bank_connect_v: float | None = Field(None, gt=0, le=50)
    """Bus voltage (rising) at which the next bank capacitor connects; below v_max_v."""
    bank_isolate_v: float | None = Field(None, gt=0, le=50)
    """Bus voltage (falling) at which the last connected bank capacitor is isolated."""
    bank_leakage_r_ohm: float | None = Field(None, gt=0)
    """Each bank capacitor's own leakage resistance (connected: in parallel with the bus; isolated:
    it discharges on its own); "none" or unset: none."""

    @field_validator("leakage_r_ohm", "bank_leakage_r_ohm", mode="before")
    @classmethod
    def _none_written(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() == "none":
            return None
        if isinstance(value, float | int) and math.isinf(value) and value > 0:
            return None
        return value

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> StorageConfig:
        if not self.v_off_v < self.v_on_v <= self.v_max_v:
            raise ConfigError(
                "storage.v_on_v", self.v_on_v, f"must satisfy v_off_v ({self.v_off_v}) < v_on_v <= v_max_v ({self.v_max_v})"
            )
        if self.v_initial_v > self.v_max_v:
            raise ConfigError("storage.v_initial_v", self.v_initial_v, f"must be <= v_max_v ({self.v_max_v})")
        if self.bank_f:
            if any(not 0 < c <= 100 for c in self.bank_f):
                raise ConfigError("storage.bank_f", self.bank_f, "each capacitance must be > 0 and <= 100 F")
            on, off = self.bank_connect_v, self.bank_isolate_v
            if on is None or off is None or not self.v_off_v <= off < on < self.v_max_v:
                raise ConfigError("storage.bank_connect_v", on, f"a bank needs v_off_v ({self.v_off_v}) <= bank_isolate_v "
                                  f"({off}) < bank_connect_v < v_max_v ({self.v_max_v})")
            if self.v_initial_v >= on:
                raise ConfigError("storage.v_initial_v", self.v_initial_v, f"must be below bank_connect_v ({on}): "
                                  "the bank's capacitors start isolated and empty")
        return self

    @property
    def bank_conductance_s(self) -> float:
        """Each bank capacitor's own leakage conductance."""
        return 0.0 if self.bank_leakage_r_ohm is None else 1.0 / self.bank_leakage_r_ohm

    @property
    def conductance_s(self) -> float:
        return 0.0 if self.leakage_r_ohm is None else 1.0 / self.leakage_r_ohm

    @property
    def current_draw_a(self) -> float:
        return self.leakage_a + self.quiescent_a

    def energy_j(self, v: float) -> float:
        return 0.5 * self.capacitance_f * v * v

    def cut_off_v(self, mcu: McuProfile) -> float:
        """Where the load stops: the power path disconnects at ``v_off_v`` and ``mcu`` browns out at
        its ``brown_out_v``; whichever comes first (the higher voltage) ends the on-time."""
        return max(self.v_off_v, mcu.brown_out_v)
