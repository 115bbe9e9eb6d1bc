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

from edge.config import Config, merge, read_toml, validate
from edge.errors import ConfigError
from simulator.harvesters import HarvesterConfig, PanelHarvester
from simulator.network import NetworkConfig
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
    storage: StorageConfig = StorageConfig()
    workload: WorkloadConfig = WorkloadConfig()
    network: NetworkConfig = NetworkConfig()
    nodes: NodesConfig = NodesConfig()

    @model_validator(mode="after")
    def _jit_between_thresholds(self) -> Scenario:
        w, s = self.workload, self.storage
        cut_v = s.cut_off_v(w.mcu_profile)
        if w.policy == "jit" and not cut_v < w.jit_threshold_v < s.v_on_v:
            raise ConfigError(
                "workload.jit_threshold_v", w.jit_threshold_v,
                f"must lie between the cut-off max(storage.v_off_v, {w.mcu} brown-out) = {cut_v} V "
                f"and storage.v_on_v ({s.v_on_v})",
            )
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


HARVESTER_KINDS = frozenset({"constant", "trace", "nrel", "iv_curve", "panel", "rf", "thermoelectric", "piezo"})
