"""The search: Bayesian optimisation over the simulator with Optuna's GP sampler.

    study = run_study(spec, base_dir, out_dir, workers=2)       # resumable: out_dir/study.log
    evaluations = trials_of(study)

Why Optuna's ``GPSampler`` and not BoTorch directly: it is the same method (a Matérn-5/2 ARD GP,
log expected improvement; log expected hypervolume improvement with several objectives, their
constrained forms, q-batch forms for designs still being simulated), and Optuna adds what a
design study needs around it: a journal file that makes a study resumable after a crash, an
ask/tell loop so that evaluations run in our process pool or on Ray, and random, TPE and grid
samplers in the same study format for the baselines.

A design is simulated once per case and seed (``DesignSpec.case``, ``seeds``) with one worker
each; parallelism is across designs: ``workers`` designs at a time (asked together, so the GP
sees the pending ones). A design the scenario refuses (say v_on above the clamp) is a failed
trial with the reason kept; the GP ignores it. Same spec and seed: the same designs in the same
order, the same results.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import Any

from edge.core.errors import ConfigError
from models.design.spec import DESIGN_METRICS, Case, DesignSpec, scenario_data

STUDY_FILE = "study.log"


@dataclass
class Evaluation:
    """One design's outcome: the metrics reduced over cases and seeds, its objectives, whether it
    meets the constraints (``error``: why the scenario refused it)."""

    params: dict[str, Any]
    metrics: dict[str, float] = field(default_factory=dict)
    per_run: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0


def _cases(spec: DesignSpec) -> list[Case]:
    return spec.case or [Case(name="base")]


def needed_metrics(spec: DesignSpec) -> list[str]:
    """Summary metrics the objectives and constraints read (design metrics come from the parts)."""
    names = [o.metric for o in spec.objective] + [c.metric for c in spec.constraint]
    return list(dict.fromkeys(n for n in names if n not in DESIGN_METRICS))


def _reduce(values: list[float], goal: str, statistic: str) -> float:
    if statistic == "mean":
        return sum(values) / len(values)
    return min(values) if goal == "maximize" else max(values)


def evaluate(spec: DesignSpec, base_dir: Path, params: dict[str, Any]) -> Evaluation:
    """Simulate one design in every case and seed; metrics reduced by ``spec.statistic`` (the worst
    of a constraint's metric is the one nearest its bound)."""
    from simulator.config import build_scenario
    from simulator.fleet import simulate

    started = time.perf_counter()
    out = Evaluation(params)
    dotted = spec.overrides(params)
    try:
        for case in _cases(spec):
            for seed in spec.seeds:
                data = scenario_data(spec, base_dir, {**dotted, **case.set, "run.seed": seed, "run.workers": 1,
                                                      "nodes.record_traces": 0})
                scenario = build_scenario(data, f"design {params}")
                summary = simulate(scenario).summary
                # a phase's completions are reported once it completed: the program's phases read 0 before
                zeros = {f"phase_{phase.name}_completed": 0.0 for phase in scenario.workload.program}
                out.per_run.append({"case": case.name, "seed": seed, **zeros,
                                    **{k: float(v) for k, v in summary.items() if isinstance(v, int | float)}})
    except ConfigError as err:
        out.error = str(err)
        out.seconds = time.perf_counter() - started
        return out
    goals = {o.metric: o.goal for o in spec.objective}
    goals.update({c.metric: "maximize" if c.min is not None else "minimize" for c in spec.constraint
                  if c.metric not in goals})
    for name in needed_metrics(spec):
        seen = any(name in run for run in out.per_run)
        values = [run.get(name, 0.0 if seen and name.startswith("phase_") else math.nan) for run in out.per_run]
        out.metrics[name] = _reduce(values, goals.get(name, "maximize"), spec.statistic)
    out.metrics.update(spec.design_metrics(params))
    out.seconds = time.perf_counter() - started
    return out


def check_metrics(spec: DesignSpec, first: Evaluation) -> None:
    """One ConfigError when an objective or constraint names a metric the simulation does not report."""
    if first.error is not None or not first.per_run:
        return
    known = [k for k in first.per_run[0] if k not in ("case", "seed")]
    for name in needed_metrics(spec):
        if name not in known:
            close = get_close_matches(name, known, n=5, cutoff=0.3) or known[:5]
            raise ConfigError("objective/constraint metric", name, f"not in the simulation's summary; "
                              f"closest: {close} (of {len(known)}; design metrics: {list(DESIGN_METRICS)})")


def objectives(spec: DesignSpec, ev: Evaluation) -> list[float]:
    return [ev.metrics[o.metric] for o in spec.objective]


def violations(spec: DesignSpec, ev: Evaluation) -> list[float]:
    return [c.violation(ev.metrics.get(c.metric, math.nan)) for c in spec.constraint]


def distributions(spec: DesignSpec) -> dict[str, Any]:
    """Each parameter's Optuna distribution: lists by index, ranges as given."""
    from optuna.distributions import FloatDistribution, IntDistribution

    out: dict[str, Any] = {}
    for p in spec.parameter:
        choices = p.choices
        if choices is not None:
            out[p.field] = IntDistribution(0, len(choices) - 1)
        elif p.integer:
            assert p.low is not None and p.high is not None
            out[p.field] = IntDistribution(int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
        else:
            assert p.low is not None and p.high is not None
            out[p.field] = FloatDistribution(p.low, p.high, log=p.log, step=p.step)
    return out


def make_sampler(spec: DesignSpec, kind: str | None = None, seed: int | None = None) -> Any:
    import optuna

    kind = kind or spec.sampler
    seed = spec.seed if seed is None else seed
    # constraints reach the samplers through Trial.set_constraint (run_study): GP's logCEI/logCEHVI, TPE's c-TPE
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # deterministic_objective
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=spec.startup_trials)
    return optuna.samplers.GPSampler(seed=seed, n_startup_trials=spec.startup_trials, deterministic_objective=True,
                                     independent_sampler=optuna.samplers.RandomSampler(seed=seed))


class _Evaluator:
    """Evaluations of designs in this process, a local pool or Ray, in the order they were asked."""

    def __init__(self, spec: DesignSpec, base_dir: Path, workers: int, cluster: str | None) -> None:
        self.spec, self.base_dir, self.workers, self.cluster = spec, base_dir, workers, cluster
        self.pool: ProcessPoolExecutor | None = None
        self.ray: Any = None

    def __enter__(self) -> _Evaluator:
        if self.cluster is not None:
            kind, _, address = self.cluster.partition(":")
            if kind != "ray":
                raise ConfigError("--cluster", self.cluster, "must be ray or ray:ADDRESS (e.g. ray:auto)")
            try:
                import ray
            except ImportError:
                raise ConfigError("--cluster", self.cluster, "needs Ray: pip install 'trickle[cluster]'") from None
            try:
                if not ray.is_initialized():
                    ray.init(address=address or None, num_cpus=None if address else self.workers,
                             include_dashboard=False, log_to_driver=False)
            except Exception as err:  # Ray's own error types
                raise ConfigError("--cluster", self.cluster, f"Ray could not start or connect: {err}") from None
            self.ray = ray
        elif self.workers > 1:
            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
            self.pool = ProcessPoolExecutor(self.workers, mp_context=ctx)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
        if self.ray is not None:
            self.ray.shutdown()

    def map(self, designs: list[dict[str, Any]]) -> list[Evaluation]:
        if self.ray is not None:
            task = self.ray.remote(evaluate)
            return list(self.ray.get([task.remote(self.spec, self.base_dir, d) for d in designs]))
        if self.pool is not None:
            return list(self.pool.map(evaluate, [self.spec] * len(designs), [self.base_dir] * len(designs), designs))
        return [evaluate(self.spec, self.base_dir, d) for d in designs]


def open_study(spec: DesignSpec, out_dir: Path, name: str, sampler: Any, resume: bool) -> Any:
    """The study ``name`` in ``out_dir/study.log``; without ``resume`` the file must not hold it."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out_dir.mkdir(parents=True, exist_ok=True)
    storage = JournalStorage(JournalFileBackend(str(out_dir / STUDY_FILE)))
    existing = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    if name in existing and not resume:
        raise ConfigError("--out", str(out_dir), f"already holds the study {name!r} ({STUDY_FILE}): "
                          "--resume to continue it, or choose another --out")
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                directions=spec.directions, load_if_exists=True)
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):  # left by an interrupted run
        study.tell(t.number, state=TrialState.FAIL)
    return study


def run_study(spec: DesignSpec, base_dir: Path, out_dir: Path, workers: int = 1, resume: bool = False,
              cluster: str | None = None, sampler_kind: str | None = None, name: str | None = None,
              progress: Callable[[int], None] | None = None, lookup: Callable[[dict[str, Any]], Evaluation] | None = None
              ) -> Any:
    """Run (or continue) the study until it holds ``spec.trials`` finished designs; returns it.
    ``lookup``: evaluations from elsewhere (a benchmark's precomputed grid) instead of simulating."""
    from optuna.trial import TrialState

    kind = sampler_kind or spec.sampler
    study = open_study(spec, out_dir, name or (spec.name if kind == spec.sampler else f"{spec.name}-{kind}"),
                       make_sampler(spec, kind), resume)
    dists = distributions(spec)
    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)))
    if progress is not None and done:
        progress(done)
    with _Evaluator(spec, base_dir, 1 if lookup is not None else workers, cluster) as evaluator:
        while done < spec.trials:
            batch = [study.ask(dists) for _ in range(min(workers, spec.trials - done))]
            designs = [dict(t.params) for t in batch]
            results = [lookup(d) for d in designs] if lookup is not None else evaluator.map(designs)
            if done == 0:
                check_metrics(spec, results[0])
            for trial, ev in zip(batch, results):
                trial.set_user_attr("metrics", ev.metrics)
                trial.set_user_attr("seconds", ev.seconds)
                if ev.error is not None:
                    trial.set_user_attr("error", ev.error)
                    study.tell(trial, state=TrialState.FAIL)
                    continue
                for c, value in zip(spec.constraint, violations(spec, ev)):
                    trial.set_constraint(c.metric, value)
                trial.set_user_attr("constraints", violations(spec, ev))
                values = objectives(spec, ev)
                if any(math.isnan(v) for v in values):
                    trial.set_user_attr("error", "an objective is NaN (the metric had no value in some run)")
                    study.tell(trial, state=TrialState.FAIL)
                    continue
                study.tell(trial, values)
            done += len(batch)
            if progress is not None:
                progress(len(batch))
    return study


def feasible(trial: Any) -> bool:
    return all(v <= 0 for v in trial.user_attrs.get("constraints", []))


def pareto(spec: DesignSpec, trials: list[Any]) -> list[Any]:
    """The feasible finished trials no other feasible one dominates, by their first objective then number."""
    sign = [1.0 if o.goal == "maximize" else -1.0 for o in spec.objective]
    pool = [t for t in trials if t.values is not None and feasible(t)]

    def dominates(a: Any, b: Any) -> bool:
        sa = [s * v for s, v in zip(sign, a.values)]
        sb = [s * v for s, v in zip(sign, b.values)]
        return all(x >= y for x, y in zip(sa, sb)) and any(x > y for x, y in zip(sa, sb))

    front, seen = [], set()
    for t in sorted(pool, key=lambda t: t.number):  # one design per point: the first found
        if not any(dominates(o, t) for o in pool) and tuple(t.values) not in seen:
            seen.add(tuple(t.values))
            front.append(t)
    return sorted(front, key=lambda t: (-sign[0] * t.values[0], t.number))


def best_so_far(spec: DesignSpec, trials: list[Any]) -> list[float]:
    """The best feasible first objective after each evaluation (NaN until one is feasible)."""
    sign = 1.0 if spec.objective[0].goal == "maximize" else -1.0
    best, out = -math.inf, []
    for t in sorted(trials, key=lambda t: t.number):
        if t.values is not None and feasible(t):
            best = max(best, sign * t.values[0])
        out.append(sign * best if best != -math.inf else math.nan)
    return out

