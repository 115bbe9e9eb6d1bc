"""The scenario: one typed config for a simulation, with defaults that run.

``load_scenario(path)`` reads a TOML file whose tables mirror the fields below
(``[run]``, ``[harvester]``, ``[storage]``, ``[workload]``, ``[network]``, ``[nodes]``);
anything not given keeps its default. A bad value raises ``ConfigError`` naming the
field, the value and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from edge.core.config import Config, merge, read_toml, validate
from edge.core.errors import ConfigError
from simulator.harvesters import HarvesterConfig, PanelHarvester
from simulator.network import NetworkConfig
from simulator.power import InputConfig, OutputConfig, Thresholds, thresholds
from simulator.storage import StorageConfig
from simulator.workload import WorkloadConfig


class RunConfig(Config):
    """How long, with which seed and engine."""

    duration_s: float = Field(86400.0, gt=0, le=366 * 86400)
    """Simulated time."""
    seed: int = Field(0, ge=0, le=2**63 - 1)
    """Seeds every random draw; the same seed gives byte-identical results."""
    engine: Literal["exact", "fixed_step"] = "exact"
    """exact: closed-form event-driven; fixed_step: the Euler reference integrator."""
    step_s: float = Field(1e-3, gt=0, le=10)
    """Step of the fixed_step engine."""
    workers: int | None = Field(None, ge=1, le=1024)
    """Processes for a fleet; None uses every core."""


class NodesConfig(Config):
    """The fleet and how its nodes differ."""

    count: int = Field(20, ge=1, le=1_000_000)
    """Number of nodes."""
    harvest_scale_min: float = Field(0.6, ge=0, le=10)
    """Lowest per-node harvest factor (shading, orientation, placement)."""
    harvest_scale_max: float = Field(1.0, ge=0, le=10)
    """Highest per-node harvest factor; each node draws uniformly between the two."""
    record_traces: int = Field(3, ge=0, le=100)
    """How many nodes (the first ones) record their voltage and mode for plots."""

    @model_validator(mode="after")
    def _range(self) -> NodesConfig:
        if self.harvest_scale_min > self.harvest_scale_max:
            raise ConfigError(
                "nodes.harvest_scale_min", self.harvest_scale_min, f"must be <= harvest_scale_max ({self.harvest_scale_max})"
            )
        return self


class Scenario(Config):
    """A complete simulation."""

    name: str = "default"
    """Shown in reports."""
    run: RunConfig = RunConfig()
    harvester: HarvesterConfig = PanelHarvester()
    input: InputConfig = InputConfig()
    """How the source is coupled to the capacitor."""
    storage: StorageConfig = StorageConfig()
    output: OutputConfig = OutputConfig()
    """The stage between the capacitor and the load."""
    workload: WorkloadConfig = WorkloadConfig()
    network: NetworkConfig = NetworkConfig()
    nodes: NodesConfig = NodesConfig()

    @property
    def thresholds(self) -> Thresholds:
        return thresholds(self.storage, self.input, self.output, self.workload.mcu_profile.brown_out_v)

    @property
    def simple_power_path(self) -> bool:
        """Converters on both sides: every term of eq. (1) but the storage's own is a power."""
        return self.input.kind == "converter" and self.output.kind == "converter"

    @model_validator(mode="after")
    def _jit_between_thresholds(self) -> Scenario:
        w, th = self.workload, self.thresholds
        jit_v = w.jit_load.threshold_v if w.jit_load is not None else w.jit_threshold_v
        field = "workload.jit_load.threshold_v" if w.jit_load is not None else "workload.jit_threshold_v"
        if (w.policy == "jit" or w.jit_load is not None) and not th.v_cut < jit_v < th.v_on:
            raise ConfigError(
                field, jit_v,
                f"must lie between the cut-off ({th.v_cut:g} V: storage.v_off_v, or the {w.mcu} brown-out "
                f"behind the output stage) and the switch-on voltage ({th.v_on:g} V)",
            )
        return self

    @model_validator(mode="after")
    def _source_fits_coupling(self) -> Scenario:
        kind, source = self.input.kind, self.harvester.kind
        with_curve = source in ("current", "iv_curve")
        if kind == "converter" and source == "current":
            raise ConfigError("input.kind", kind, "a current source delivers a current, not a power: "
                              "use input.kind = \"direct\" or \"diode\"")
        if kind in ("direct", "diode") and not with_curve:
            raise ConfigError("input.kind", kind, f"needs a source with a current-voltage characteristic "
                              f"(harvester.kind current or iv_curve), not {source}")
        if kind == "bq25570" and source == "current":
            raise ConfigError("input.kind", kind, "MPPT needs an open-circuit voltage; a current source has none")
        if kind == "bq25570" and not with_curve and self.input.input_v is None:
            raise ConfigError("input.input_v", None, f"bq25570 with a power source ({source}) needs the voltage "
                              "it delivers at (input.input_v)")
        if self.storage.bank_f and not self.simple_power_path:
            raise ConfigError("storage.bank_f", self.storage.bank_f, "a capacitor bank is modelled behind converters "
                              "(input.kind and output.kind = \"converter\")")
        if self.storage.bank_f and self.run.engine == "fixed_step":
            raise ConfigError("storage.bank_f", self.storage.bank_f, "the fixed-step reference has no bank; use the exact engine")
        if self.run.engine == "fixed_step" and not self.simple_power_path:
            raise ConfigError("run.engine", "fixed_step", "the fixed-step reference models converters only "
                              "(input.kind and output.kind = \"converter\"); use the exact engine")
        return self


SCENARIO_DIR = Path(__file__).parent / "scenarios"


def scenario_path(name: str) -> Path:
    """A bundled scenario by name (``trickle simulate --list``), else the path as given."""
    bundled = SCENARIO_DIR / f"{name}.toml"
    return bundled if not Path(name).exists() and bundled.exists() else Path(name)


def load_scenario(path: str | Path | None = None, **overrides: Any) -> Scenario:
    """Defaults, then the TOML file (if any), then ``overrides`` given as ``section={field: value}``."""
    data = read_toml(path, "--scenario") if path is not None else {}
    merge(data, overrides)
    return build_scenario(data, str(path) if path is not None else "scenario")


def build_scenario(data: dict[str, Any], source: str = "scenario") -> Scenario:
    return validate(Scenario, data, source, HARVESTER_KINDS)


HARVESTER_KINDS = frozenset({"constant", "current", "trace", "nrel", "iv_curve", "panel", "rf", "thermoelectric", "piezo"})
