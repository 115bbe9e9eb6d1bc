"""The scenario: one typed config for a simulation, with defaults that run.

``load_scenario(path)`` reads a TOML file whose tables mirror the fields below
(``[run]``, ``[harvester]``, ``[storage]``, ``[workload]``, ``[network]``, ``[nodes]``);
anything not given keeps its default. A bad value raises ``ConfigError`` naming the
field, the value and what is allowed.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from simulator.errors import ConfigError
from simulator.harvesters import HarvesterConfig, PanelHarvester
from simulator.network import NetworkConfig
from simulator.storage import StorageConfig
from simulator.typed import Config
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
        cut_v = max(s.v_off_v, w.mcu_profile.brown_out_v)  # where the MCU stops, whichever comes first
        if w.policy == "jit" and not cut_v < w.jit_threshold_v < s.v_on_v:
            raise ConfigError(
                "workload.jit_threshold_v", w.jit_threshold_v,
                f"must lie between the cut-off max(storage.v_off_v, {w.mcu} brown-out) = {cut_v} V "
                f"and storage.v_on_v ({s.v_on_v})",
            )
        return self


def load_scenario(path: str | Path | None = None, **overrides: Any) -> Scenario:
    """Defaults, then the TOML file (if any), then ``overrides`` given as ``section={field: value}``."""
    data: dict[str, Any] = {}
    source = "scenario"
    if path is not None:
        source = str(path)
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError("--scenario", source, "file not found") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(source, "TOML", f"not valid TOML: {e}") from None
    for section, values in overrides.items():
        if isinstance(values, dict):
            data.setdefault(section, {}).update(values)
        else:
            data[section] = values
    return build_scenario(data, source)


def build_scenario(data: dict[str, Any], source: str = "scenario") -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        raise one_line_error(e, source) from None


def parse_toml_value(raw: str) -> Any:
    """A command-line value in TOML syntax (0.047, true, "jit", [1, 2]); a bare word stays a string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def one_line_error(e: ValidationError, source: str) -> ConfigError:
    """The first problem of a ValidationError as one ConfigError: field, value, what is allowed."""
    err = e.errors()[0]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigError):
        return cause
    # drop the discriminator tag pydantic puts in the path of a tagged union ("harvester.rf.distance_m")
    loc = [str(p) for p in err["loc"]]
    if len(loc) > 1 and loc[0] == "harvester" and loc[1] in _HARVESTER_KINDS:
        del loc[1]
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    if err["type"] == "union_tag_invalid":  # an unknown harvester kind
        ctx = err.get("ctx") or {}
        return ConfigError(".".join([*loc, "kind"]), ctx.get("tag"), f"must be one of {ctx.get('expected_tags')}{more}")
    value = err.get("input", "")
    if err["type"] == "missing":
        value = "missing"
    return ConfigError(".".join(loc) or source, value, err["msg"].replace("Input should", "should") + more)


_HARVESTER_KINDS = {"constant", "trace", "nrel", "iv_curve", "panel", "rf", "thermoelectric", "piezo"}
