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
sees the pending ones). A design the scenario refuses (say v_on above the clamp, or a capacitor
rated below it) is told to the sampler as a violated constraint with its objectives at the worst
any built design reached, so the optimiser stops proposing it; the reason is kept. A study cut
short (Ctrl-C) keeps what finished; --resume continues it. Same spec and seed: the same designs
in the same order, the same results.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import Any

from edge.core.errors import ConfigError
from models.design.spec import DESIGN_METRICS, Case, DesignSpec, prepare, scenario_data

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
    of a constraint's metric is the one nearest its bound). A design the scenario refuses (or whose
    capacitor is rated below the clamp) comes back with ``error`` and its design metrics only."""
    from simulator.config import build_scenario
    from simulator.fleet import simulate

    started = time.perf_counter()
    out = Evaluation(params)
    dotted = spec.overrides(params)
    part = spec.part(params)
    try:
        for case in _cases(spec):
            for seed in spec.seeds:
                data = scenario_data(spec, base_dir, {**dotted, **case.set, "run.seed": seed, "run.workers": 1,
                                                      "nodes.record_traces": 0})
                scenario = build_scenario(data, f"design {params}")
                clamp_v = scenario.thresholds.v_max
                if part is not None and part.rated_voltage_v < clamp_v:
                    raise ConfigError("storage.capacitance_f", part.name, f"rated {part.rated_voltage_v:g} V, below "
                                      f"the clamp ({clamp_v:g} V)")
                summary = simulate(scenario).summary
                # a phase's completions are reported once it completed: the program's phases read 0 before
                zeros = {f"phase_{phase.name}_completed": 0.0 for phase in scenario.workload.program}
                out.per_run.append({"case": case.name, "seed": seed, **zeros,
                                    **{k: float(v) for k, v in summary.items() if isinstance(v, int | float)}})
    except ConfigError as err:
        out.error = str(err)
        out.metrics.update(spec.design_metrics(params))
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
    return _gp_sampler(spec, seed)


def designs_differ(spec: DesignSpec, trials: list[Any]) -> bool:
    """Do the built designs among ``trials`` differ in a simulated objective (what the nodes did)?"""
    simulated = [k for k, o in enumerate(spec.objective) if o.metric not in DESIGN_METRICS]
    built = [t for t in trials if "error" not in t.user_attrs]
    return not simulated or any(len({t.values[k] for t in built}) > 1 for k in simulated)


def _gp_sampler(spec: DesignSpec, seed: int) -> Any:
    """Optuna's GP sampler, drawing at random until the designs differ in what the nodes did: a GP
    fitted to one value everywhere (no design has completed anything yet, say) has nothing to say
    about where to look, and would keep proposing designs beside the first it saw."""
    import optuna
    import torch  # optuna's GP sampler runs on it
    from optuna.trial import TrialState

    class GPOnceDesignsDiffer(optuna.samplers.GPSampler):
        def sample_relative(self, study: Any, trial: Any, search_space: dict[str, Any]) -> dict[str, Any]:
            done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if not designs_differ(spec, done):
                return {}  # drawn by the independent (random) sampler
            # one thread: the GP's matrices are small, and --workers processes simulate beside it (two
            # threads on a busy 2-core machine took 2.7x as long)
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                return dict(super().sample_relative(study, trial, search_space))
            finally:
                torch.set_num_threads(threads)

    return GPOnceDesignsDiffer(seed=seed, n_startup_trials=spec.startup_trials, deterministic_objective=True,
                               independent_sampler=optuna.samplers.RandomSampler(seed=seed),
                               warn_independent_sampling=False)


def _ignore_interrupt() -> None:
    """Workers leave Ctrl-C to the parent, which stops them: one line, not a traceback per worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _evaluate_args(args: tuple[DesignSpec, Path, dict[str, Any]]) -> Evaluation:
    return evaluate(*args)


class _Evaluator:
    """Evaluations of designs in this process, a local pool or Ray, in the order they were asked."""

    def __init__(self, spec: DesignSpec, base_dir: Path, workers: int, cluster: str | None) -> None:
        self.spec, self.base_dir, self.workers, self.cluster = spec, base_dir, workers, cluster
        self.pool: Any = None
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
            self.pool = ctx.Pool(self.workers, initializer=_ignore_interrupt)
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if self.pool is not None:
            if kind is None:
                self.pool.close()
            else:  # interrupted (or failed): the designs in flight are dropped, resumed by --resume
                self.pool.terminate()
            self.pool.join()
        if self.ray is not None:
            self.ray.shutdown()

    def map(self, designs: list[dict[str, Any]]) -> list[Evaluation]:
        if self.ray is not None:
            task = self.ray.remote(evaluate)
            return list(self.ray.get([task.remote(self.spec, self.base_dir, d) for d in designs]))
        if self.pool is not None:
            return list(self.pool.map(_evaluate_args, [(self.spec, self.base_dir, d) for d in designs], chunksize=1))
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


# the constraint every design carries beside the spec's, so that the sampler looks where the report does:
# 1 for a design the scenario refused or one that completes nothing (see useful), -1 otherwise
REFUSED = "refused, or completes nothing"


def evaluated(trial: Any) -> bool:
    """A design the study finished (simulated, or refused with the reason): not one an interrupt cut
    short (those are failed trials, perhaps with only some of their parameters chosen)."""
    from optuna.trial import TrialState

    return bool(trial.state == TrialState.COMPLETE)


def run_study(spec: DesignSpec, base_dir: Path, out_dir: Path, workers: int = 1, resume: bool = False,
              cluster: str | None = None, sampler_kind: str | None = None, name: str | None = None,
              progress: Callable[[int], None] | None = None, lookup: Callable[[dict[str, Any]], Evaluation] | None = None
              ) -> Any:
    """Run (or continue) the study until it holds ``spec.trials`` finished designs; returns it.
    ``spec`` is checked and its parts narrowed first (``prepare``): pass the same prepared spec to
    the report. ``lookup``: evaluations from elsewhere (a benchmark's precomputed grid) instead of
    simulating."""
    spec = prepare(spec, base_dir)
    kind = sampler_kind or spec.sampler
    study = open_study(spec, out_dir, name or (spec.name if kind == spec.sampler else f"{spec.name}-{kind}"),
                       make_sampler(spec, kind), resume)
    dists = distributions(spec)
    done = sum(evaluated(t) for t in study.get_trials(deepcopy=False))
    checked = done > 0
    if progress is not None and done:
        progress(done)
    with _Evaluator(spec, base_dir, 1 if lookup is not None else workers, cluster) as evaluator:
        while done < spec.trials:
            batch = [study.ask(dists) for _ in range(min(workers, spec.trials - done))]
            designs = [dict(t.params) for t in batch]
            results = [lookup(d) for d in designs] if lookup is not None else evaluator.map(designs)
            for ev in results:
                if not checked and ev.error is None:
                    check_metrics(spec, ev)
                    checked = True
            for trial, ev in zip(batch, results):
                _tell(study, spec, trial, ev)
            done += len(batch)
            if progress is not None:
                progress(len(batch))
    return study


def _tell(study: Any, spec: DesignSpec, trial: Any, ev: Evaluation) -> None:
    """Give the sampler a design's outcome. A refused design (or one with an objective that had no
    value) is told too, so the optimiser stops proposing it: the REFUSED constraint violated (the
    GP's constrained acquisition learns where designs are refused), the spec's constraints
    violated, its objectives at a penalty (``_penalty``); the report shows no values for it. A
    design that completes nothing violates REFUSED too: the front the sampler improves is the
    report's."""
    trial.set_user_attr("metrics", ev.metrics)
    trial.set_user_attr("seconds", ev.seconds)
    names = ["case", "seed", *needed_metrics(spec)]
    trial.set_user_attr("per_run", [{k: run[k] for k in names if k in run} for run in ev.per_run])
    error = ev.error
    values = objectives(spec, ev) if error is None else []
    if error is None and any(math.isnan(v) for v in values):
        error = "an objective is NaN (the metric had no value in some run)"
    if error is None:
        constraints = violations(spec, ev)
    else:
        trial.set_user_attr("error", error)
        constraints, values = [1.0] * len(spec.constraint), _penalty(study, spec, ev)
    for i, (c, value) in enumerate(zip(spec.constraint, constraints)):
        trial.set_constraint(f"{i}: {c.metric}", value)
    trial.set_constraint(REFUSED, -1.0 if error is None and does_something(spec, values) else 1.0)
    trial.set_user_attr("constraints", constraints)
    study.tell(trial, values)


def _penalty(study: Any, spec: DesignSpec, ev: Evaluation) -> list[float]:
    """A refused design's objectives as the sampler sees them: each simulated one at the worst any
    built design has reached so far (a maximised one no higher than zero: the design does nothing;
    0 before any is built), its design metrics as they are."""
    built = [t for t in study.get_trials(deepcopy=False) if evaluated(t) and "error" not in t.user_attrs]
    out = []
    for k, o in enumerate(spec.objective):
        value = ev.metrics.get(o.metric, math.nan) if o.metric in DESIGN_METRICS else math.nan
        if math.isnan(value):
            seen = [t.values[k] for t in built]
            value = min([*seen, 0.0]) if o.goal == "maximize" else max(seen, default=0.0)
        out.append(value)
    return out


def feasible(trial: Any) -> bool:
    """Built (not refused) and within every constraint."""
    return evaluated(trial) and "error" not in trial.user_attrs and all(
        v <= 0 for v in trial.user_attrs.get("constraints", []))


def useful(spec: DesignSpec, trial: Any) -> bool:
    """Does some of the work asked for (``does_something``)."""
    return does_something(spec, trial.values)


def does_something(spec: DesignSpec, values: list[float]) -> bool:
    """Every maximised simulation objective above zero: a node that completes nothing is no design,
    however small its capacitor (and would sit on the Pareto front of completions against volume)."""
    return all(v > 0 for o, v in zip(spec.objective, values) if o.goal == "maximize" and o.metric not in DESIGN_METRICS)


def pareto(spec: DesignSpec, trials: list[Any]) -> list[Any]:
    """The feasible, useful trials no other such one dominates, by their first objective then number."""
    sign = [1.0 if o.goal == "maximize" else -1.0 for o in spec.objective]
    pool = [t for t in trials if feasible(t) and useful(spec, t)]

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
    for t in sorted((t for t in trials if evaluated(t)), key=lambda t: t.number):
        if feasible(t):
            best = max(best, sign * t.values[0])
        out.append(sign * best if best != -math.inf else math.nan)
    return out

