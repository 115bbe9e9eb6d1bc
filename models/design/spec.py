"""What ``trickle design SPEC.toml`` reads: a base scenario, the fields to choose, the cases a design
must serve, objectives and constraints.

    spec = load_spec("examples/design/indoor_node.toml")
    overrides = spec.overrides({"storage.capacitance_f": 3, "storage.v_on_v": 2.9})   # index 3 of its values

A parameter is one scenario field (``storage.capacitance_f``, ``storage.v_on_v``,
``workload.sense_period_s``, ...) searched over a range (``low``/``high``, ``log``, ``step``,
``integer``), an ordered list of ``values``, or a list of capacitor ``parts`` (a bundled catalogue
by name, or the user's own tables) that sets the capacitance and the leakage and gives each design
its volume and cost. Lists are searched by index in their order, so a GP sees that 2.2 mF lies
between 1 mF and 4.7 mF; parts rated below the clamp are left out (``prepare``) and each part
sets its ESR. Each design is simulated once per case (``[[case]]``: a day of light, a
season, a placement: overrides of the base) and seed; an objective is the mean or the worst of a
summary metric over them (``statistic``), or a design metric (``capacitor_volume_mm3``,
``capacitor_cost_usd``, ``capacitance_f``).
"""

from __future__ import annotations

import math
import tomllib
from difflib import get_close_matches
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from edge.core.config import Config, merge, read_toml, validate
from edge.core.errors import ConfigError

CATALOGUE_DIR = Path(__file__).parent / "parts"
DESIGN_METRICS = ("capacitor_volume_mm3", "capacitor_cost_usd", "capacitance_f")


class Part(Config):
    """A capacitor one can buy: what it stores, leaks, withstands, occupies and costs."""

    name: str
    capacitance_f: float = Field(gt=0, le=100)
    leakage_r_ohm: float | None = Field(None, gt=0)
    """Parallel leakage resistance (rated leakage current at rated voltage, as a resistance); none: negligible."""
    rated_voltage_v: float = Field(gt=0, le=1000)
    """The highest voltage the part takes: it must be at or above the clamp (storage.v_max_v, or a
    charger's VBAT_OV), since the clamp is where the harvester holds it."""
    esr_ohm: float = Field(ge=0, le=1e4)
    """Equivalent series resistance (sets storage.esr_ohm: the drop under the load's current)."""
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
    storage.capacitance_f, storage.leakage_r_ohm and storage.esr_ohm (field must be
    storage.capacitance_f). Parts rated below the clamp are left out when the study starts."""
    excluded: list[str] = Field(default_factory=list)
    """Set when the study starts (``prepare``): the parts left out, each with the reason."""

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

    def value(self, sampled: Any) -> Any:
        """A sampled point of a range as the scenario gets it: an int, or a float on the grid of ``step``
        without the sampler's float residue (3.0, not 3.0000000000000004)."""
        if self.integer:
            return int(sampled)
        value = float(sampled)
        if self.step is not None and self.low is not None:
            value = self.low + round((value - self.low) / self.step) * self.step
        return float(f"{value:.12g}") if self.step is not None else value

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
    """A summary metric of the simulation (completed, packets_delivered, wasted_j, accuracy_within_deadline,
    the ratios tasks_completed_ratio and packets_delivered_ratio, ...) or a design metric
    (capacitor_volume_mm3, capacitor_cost_usd, capacitance_f)."""
    goal: Literal["maximize", "minimize"] = "maximize"


class Constraint(Config):
    """A bound a design's metric must keep (reduced over cases and seeds as the objectives are), e.g.
    95 % of the packets sent delivered: ``metric = "packets_delivered_ratio"``, ``min = 0.95``."""

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
                out["storage.esr_ohm"] = part.esr_ohm
            elif choices is not None:
                out[p.field] = choices[int(value)]
            else:
                out[p.field] = p.value(value)
        return out

    def part(self, chosen: dict[str, Any]) -> Part | None:
        """The capacitor part a design chose (None without parts)."""
        for p in self.parameter:
            if p.parts is not None and p.choices is not None:
                part: Part = p.choices[int(chosen[p.field])]
                return part
        return None

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


def scenario_file(spec: DesignSpec, base_dir: Path) -> Path:
    """The base scenario's file: a bundled name, else a path (as given, or relative to the spec)."""
    from simulator.config import SCENARIO_DIR, scenario_path

    path = scenario_path(spec.scenario)
    if not path.is_absolute() and not path.exists():
        path = base_dir / spec.scenario
    if not path.is_file():
        bundled = sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))
        close = get_close_matches(Path(spec.scenario).stem, bundled, n=3, cutoff=0.5)
        raise ConfigError("scenario", spec.scenario, f"no such file (nor relative to {base_dir}) and no bundled "
                          f"scenario of that name" + (f"; did you mean {close}?" if close else f"; bundled: {bundled}"))
    return path


def scenario_data(spec: DesignSpec, base_dir: Path, dotted: dict[str, Any]) -> dict[str, Any]:
    """The base scenario's tables with ``dotted`` overrides applied (not yet validated)."""
    data = read_toml(scenario_file(spec, base_dir), "scenario")
    return merge(data, nested(dotted))


def prepare(spec: DesignSpec, base_dir: Path) -> DesignSpec:
    """The spec checked against its base scenario before anything is simulated, with its parts
    narrowed to those rated for the clamp. One ConfigError naming the parameter (or ``set`` or
    case entry) and its value: a field the scenario does not have, a value the field refuses on its
    own (a negative capacitance, say: a value refused only together with others, v_on above the
    clamp, is a design the scenario refuses, told to the optimiser), or no part rated for the clamp.
    Idempotent: a prepared spec prepares to itself."""
    from simulator.config import build_scenario

    base = build_scenario(read_toml(scenario_file(spec, base_dir), "scenario"), f"scenario {spec.scenario}")
    for key, value in spec.set.items():
        check_field(base, key, [value], f"set.{key}")
    for case in spec.case:
        for key, value in case.set.items():
            check_field(base, key, [value], f"case {case.name!r}: set.{key}")
    for p in spec.parameter:
        if p.parts is not None:
            continue
        check_field(base, p.field, p.values if p.values is not None else [p.low, p.high], f"parameter {p.field}")
    fields = {p.field for p in spec.parameter}
    if not any(p.parts is not None for p in spec.parameter) or fields & CLAMP_FIELDS:
        return spec  # without parts nothing to narrow; a searched clamp: each design's part is checked alone
    clamp_v = max(_clamp_v(spec, base_dir, case) for case in (spec.case or [Case(name="base")]))
    return spec.model_copy(update={"parameter": [_rated(p, clamp_v) if p.parts is not None else p
                                                 for p in spec.parameter]})


# fields that move the clamp a part must withstand
CLAMP_FIELDS = frozenset({"storage.v_max_v", "input.vbat_ov_v", "input.kind"})


def _clamp_v(spec: DesignSpec, base_dir: Path, case: Case) -> float:
    """Where the harvester holds the capacitor in ``case`` (storage.v_max_v, or a charger's VBAT_OV)."""
    from simulator.config import build_scenario

    data = scenario_data(spec, base_dir, {**spec.set, **case.set})
    try:
        return build_scenario(data, "clamp").thresholds.v_max
    except ConfigError:  # the base's own thresholds clash with the set: the storage's clamp as written
        return float(data.get("storage", {}).get("v_max_v", 3.6))


def _rated(p: Parameter, clamp_v: float) -> Parameter:
    assert p.parts is not None
    parts = load_parts(p.parts)
    usable = [part for part in parts if part.rated_voltage_v >= clamp_v]
    excluded = [f"{part.name}: rated {part.rated_voltage_v:g} V, below the clamp ({clamp_v:g} V)"
                for part in parts if part.rated_voltage_v < clamp_v]
    if not usable:
        top = max(parts, key=lambda part: part.rated_voltage_v)
        raise ConfigError(f"parameter {p.field}.parts", p.parts if isinstance(p.parts, str) else [q.name for q in parts],
                          f"no part is rated for the clamp ({clamp_v:g} V: storage.v_max_v, or the charger's "
                          f"VBAT_OV); the highest rating is {top.rated_voltage_v:g} V ({top.name}): lower the clamp "
                          "or add parts rated for it")
    return p.model_copy(update={"parts": usable, "excluded": [*p.excluded, *excluded]})


def check_field(base: Any, key: str, values: list[Any], where: str) -> None:
    """One ConfigError unless ``key`` names a field of the scenario ``base`` and each of ``values`` is
    one that field takes on its own (its type and bounds; rules between fields are not checked)."""
    from pydantic import BaseModel, ValidationError

    *tables, name = key.split(".")
    obj = base
    for i, table in enumerate(tables):
        known = type(obj).model_fields if isinstance(obj, BaseModel) else {}
        if table not in known:
            _unknown(where, key, ".".join(tables[:i]), list(known))
        obj = getattr(obj, table)
        if not isinstance(obj, BaseModel):  # a table the base leaves unset (None) or a list: its fields unknown here
            return
    known = type(obj).model_fields
    if name not in known:
        _unknown(where, key, ".".join(tables), list(known))
    if name == "kind":  # a tagged union's member changes with it: checked when designs are built
        return
    for value in values:
        try:
            type(obj).model_validate({**obj.model_dump(), name: value})
        except ValidationError as e:
            err = e.errors()[0]
            if tuple(err["loc"][:1]) == (name,):
                raise ConfigError(where, value, f"{key} " + err["msg"].replace("Input should", "should")) from None
        except ConfigError:  # a rule between this value and the base's others: a design refused, not a bad spec
            pass


def _unknown(where: str, key: str, table: str, known: list[str]) -> None:
    name = key.removeprefix(f"{table}.") if table else key
    close = get_close_matches(name, known, n=3, cutoff=0.5)
    raise ConfigError(where, key, f"the scenario has no field {name!r}" + (f" in [{table}]" if table else "")
                      + (f"; did you mean {close}?" if close else f"; its fields: {known}"))


def load_spec(path: str | Path) -> DesignSpec:
    """A design spec from TOML; one ConfigError naming the field on a bad value."""
    data = read_toml(path, "SPEC")
    return validate(DesignSpec, data, str(path))
