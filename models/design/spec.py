"""What ``trickle design SPEC.toml`` reads: a base scenario, the fields to choose, the cases a design
must serve, objectives and constraints.

    spec = load_spec("examples/design/indoor_node.toml")
    overrides = spec.overrides({"storage.capacitance_f": 3, "storage.v_on_v": 2.9})   # index 3 of its values

A parameter is one scenario field (``storage.capacitance_f``, ``storage.v_on_v``,
``workload.sense_period_s``, ...) searched over a range (``low``/``high``, ``log``, ``step``,
``integer``), an ordered list of ``values``, or a list of capacitor ``parts`` (a bundled catalogue
by name, or the user's own tables) that sets the capacitance and the leakage and gives each design
its volume and cost. Lists are searched by index in their order, so a GP sees that 2.2 mF lies
between 1 mF and 4.7 mF. Each design is simulated once per case (``[[case]]``: a day of light, a
season, a placement: overrides of the base) and seed; an objective is the mean or the worst of a
summary metric over them (``statistic``), or a design metric (``capacitor_volume_mm3``,
``capacitor_cost_usd``, ``capacitance_f``).
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from edge.core.config import Config, merge, read_toml, validate
from edge.core.errors import ConfigError

CATALOGUE_DIR = Path(__file__).parent / "parts"
DESIGN_METRICS = ("capacitor_volume_mm3", "capacitor_cost_usd", "capacitance_f")


class Part(Config):
    """A capacitor one can buy: what it stores, leaks, occupies and costs."""

    name: str
    capacitance_f: float = Field(gt=0, le=100)
    leakage_r_ohm: float | None = Field(None, gt=0)
    """Parallel leakage resistance (rated leakage current at rated voltage, as a resistance); none: negligible."""
    volume_mm3: float = Field(gt=0)
    cost_usd: float = Field(ge=0)


class Parameter(Config):
    """One scenario field to choose: a range, an ordered list of values, or capacitor parts."""

    field: str
    """The scenario field, dotted: storage.capacitance_f, storage.v_on_v, workload.sense_period_s, ..."""
    low: float | None = None
    high: float | None = None
    log: bool = False
    """Search the range on a log scale."""
    step: float | None = Field(None, gt=0)
    """A grid step within the range (not with log)."""
    integer: bool = False
    values: list[Any] | None = None
    """An ordered list, searched by index."""
    parts: str | list[Part] | None = None
    """A bundled catalogue's name (models/design/parts/NAME.toml) or a list of parts; sets
    storage.capacitance_f and storage.leakage_r_ohm (field must be storage.capacitance_f)."""

    @model_validator(mode="after")
    def _one_kind(self) -> Parameter:
        kinds = [self.low is not None or self.high is not None, self.values is not None, self.parts is not None]
        if sum(kinds) != 1:
            raise ConfigError(f"parameter {self.field}", None, "give low and high, or values, or parts (one of them)")
        if kinds[0]:
            if self.low is None or self.high is None or not self.low < self.high:
                raise ConfigError(f"parameter {self.field}.low", self.low, f"needs low < high (high = {self.high})")
            if self.log and (self.low <= 0 or self.step is not None):
                raise ConfigError(f"parameter {self.field}.log", True, "needs low > 0 and no step")
        if self.values is not None and len(self.values) < 2:
            raise ConfigError(f"parameter {self.field}.values", self.values, "needs at least two values")
        if self.parts is not None and self.field != "storage.capacitance_f":
            raise ConfigError(f"parameter {self.field}.parts", "...", "parts choose storage.capacitance_f; "
                              "name that field")
        return self

    @property
    def choices(self) -> list[Any] | None:
        """The ordered values searched by index (parts: the parts, by capacitance), else None."""
        if self.values is not None:
            return list(self.values)
        if self.parts is not None:
            return sorted(load_parts(self.parts), key=lambda p: p.capacitance_f)
        return None


class Objective(Config):
    """A metric to maximise or minimise."""

    metric: str
    """A summary metric of the simulation (completed, packets_delivered, wasted_j, accuracy_within_deadline, ...)
    or a design metric (capacitor_volume_mm3, capacitor_cost_usd, capacitance_f)."""
    goal: Literal["maximize", "minimize"] = "maximize"


class Constraint(Config):
    """A bound a design's metric must keep (reduced over cases and seeds as the objectives are)."""

    metric: str
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _a_bound(self) -> Constraint:
        if self.min is None and self.max is None:
            raise ConfigError(f"constraint {self.metric}", None, "needs min or max")
        return self

    def violation(self, value: float) -> float:
        """How far ``value`` lies outside the bound (<= 0: satisfied), as Optuna's constraints take it."""
        if math.isnan(value):
            return 1.0
        worst = -math.inf
        if self.min is not None:
            worst = max(worst, self.min - value)
        if self.max is not None:
            worst = max(worst, value - self.max)
        return worst


class Case(Config):
    """One situation a design must serve: overrides of the base scenario (a day's light, a place)."""

    name: str
    set: dict[str, Any] = Field(default_factory=dict)
    """Dotted scenario fields and their values for this case."""


class DesignSpec(Config):
    """A design study."""

    name: str = "design"
    scenario: str
    """The base scenario: a bundled name (trickle simulate --list) or a TOML path, relative to the spec."""
    set: dict[str, Any] = Field(default_factory=dict)
    """Fixed overrides of the base for every design (dotted fields), e.g. nodes.count = 1."""
    parameter: list[Parameter] = Field(min_length=1)
    objective: list[Objective] = Field(min_length=1, max_length=4)
    constraint: list[Constraint] = Field(default_factory=list)
    case: list[Case] = Field(default_factory=list)
    """The situations each design is simulated in; none: the base alone."""
    seeds: list[int] = Field([0], min_length=1)
    statistic: Literal["mean", "worst"] = "mean"
    """How a summary metric is reduced over cases and seeds: the mean, or the worst for its goal."""
    trials: int = Field(40, ge=2, le=100_000)
    """Designs the optimiser evaluates."""
    startup_trials: int = Field(10, ge=1)
    """Random designs before the GP takes over."""
    sampler: Literal["gp", "tpe", "random"] = "gp"
    random_baseline: bool = True
    """Also run random search with the same budget, for the convergence plot."""
    seed: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _names(self) -> DesignSpec:
        fields = [p.field for p in self.parameter]
        if len(set(fields)) != len(fields):
            raise ConfigError("parameter", fields, "each field may be searched once")
        return self

    @property
    def directions(self) -> list[Literal["maximize", "minimize"]]:
        return [o.goal for o in self.objective]

    def overrides(self, chosen: dict[str, Any]) -> dict[str, Any]:
        """The base's dotted overrides for a design (parameter field -> sampled value or index)."""
        out = dict(self.set)
        for p in self.parameter:
            value = chosen[p.field]
            choices = p.choices
            if p.parts is not None and choices is not None:
                part = choices[int(value)]
                out["storage.capacitance_f"] = part.capacitance_f
                out["storage.leakage_r_ohm"] = part.leakage_r_ohm if part.leakage_r_ohm is not None else "none"
            elif choices is not None:
                out[p.field] = choices[int(value)]
            else:
                out[p.field] = int(value) if p.integer else float(value)
        return out

    def design_metrics(self, chosen: dict[str, Any]) -> dict[str, float]:
        """Volume, cost and capacitance of the design's capacitor (NaN without parts)."""
        for p in self.parameter:
            if p.parts is not None and p.choices is not None:
                part: Part = p.choices[int(chosen[p.field])]
                return {"capacitor_volume_mm3": part.volume_mm3, "capacitor_cost_usd": part.cost_usd,
                        "capacitance_f": part.capacitance_f}
        c = self.overrides(chosen).get("storage.capacitance_f", math.nan)
        return {"capacitor_volume_mm3": math.nan, "capacitor_cost_usd": math.nan, "capacitance_f": float(c)}


def load_parts(parts: str | list[Part]) -> list[Part]:
    """A bundled catalogue by name, or the parts given."""
    if not isinstance(parts, str):
        return list(parts)
    path = CATALOGUE_DIR / f"{parts}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in CATALOGUE_DIR.glob("*.toml"))
        raise ConfigError("parameter.parts", parts, f"no such catalogue; bundled: {known}, or give a list of parts")
    with path.open("rb") as f:
        rows = tomllib.load(f)["part"]
    return [validate(Part, row, str(path)) for row in rows]


def nested(dotted: dict[str, Any]) -> dict[str, Any]:
    """{"storage.capacitance_f": 1e-3} as {"storage": {"capacitance_f": 1e-3}}."""
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        *tables, last = key.split(".")
        table = out
        for name in tables:
            table = table.setdefault(name, {})
        table[last] = value
    return out


def scenario_data(spec: DesignSpec, base_dir: Path, dotted: dict[str, Any]) -> dict[str, Any]:
    """The base scenario's tables with ``dotted`` overrides applied (not yet validated)."""
    from simulator.config import scenario_path

    path = scenario_path(spec.scenario)
    if not path.is_absolute() and not path.exists():
        path = base_dir / spec.scenario
    data = read_toml(path, "scenario")
    return merge(data, nested(dotted))


def load_spec(path: str | Path) -> DesignSpec:
    """A design spec from TOML; one ConfigError naming the field on a bad value."""
    data = read_toml(path, "SPEC")
    return validate(DesignSpec, data, str(path))
