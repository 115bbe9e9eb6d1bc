"""Design benchmark: Bayesian optimisation against an exhaustive grid and against random search.

    trickle bench design [--quick]

The space (``SPACE``): the bundled indoor_office scenario (an AM1417 cell under office light,
JIT checkpoints, BLE; one node), its capacitor (10 values), turn-on threshold (10) and sensing
period (6): 600 designs, each simulated on a bright and a dim day, the objective the worse day's
events completed within their deadline. Every design of the grid is simulated first (two
processes): the grid optimum, and ``design_evals_per_second``. Then, for 5 seeds, ``trickle
design``'s GP search and random search each get 10 % of the grid's evaluations; their designs
are grid points, whose results are looked up from the grid run (the simulation is deterministic:
the same design gives the same result, so this equals simulating them again).

Keys of bench/results/design.json (goals in GOALS):

- bo_regret_vs_grid_pct: (grid optimum - best found by BO) / grid optimum, in %, mean over seeds.
- bo_vs_random_regret_ratio: BO's mean regret over random search's, same budget and seeds.
- reconfigurable_vs_best_static_gain_pct: events detected on a volatile source (sparse vibration
  bursts: ``BANK_SCENARIO``) by the best reconfigurable bank (``storage.bank_f``: a base capacitor
  and one switched capacitor; base share, v_on and the two bank thresholds on a grid of 81) against
  the best static capacitor (v_on, its one choice, at 81 points: the same budget), both of the
  total capacitance at which the static design does best; ``reconfigurable_rows`` gives every
  total, and ``reconfigurable_best_vs_static_best_any_size_gain_pct`` the best bank of any size
  against it.
- design_evals_per_second: designs (two simulated days each) per second on this machine's cores.
- bo_vs_random_median_ratio_readme_example: the README's example (``EXAMPLE``, --workers 2): BO's
  best first objective (feasible designs that complete something) over random search's, the same
  budget, per seed of SEEDS, the median; the designs are simulated once each (every design of the
  example's space first, which also gives ``readme_example_grid_optimum``).
- best_file_resimulation_matches: 1 when every best/design-N.toml the example writes (its own seed)
  simulates to the figures its run reported, and to the design's reported first objective.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from edge.core.files import write_atomic
from edge.core.tables import console_table

RESULTS = Path(__file__).parent / "results"
GOALS = {"bo_regret_vs_grid_pct": ("<=", 1.0), "bo_vs_random_regret_ratio": ("<=", 0.5),
         "bo_vs_random_median_ratio_readme_example": (">=", 1.0), "best_file_resimulation_matches": (">=", 1)}
SEEDS = (0, 1, 2, 3, 4)
SPACE: dict[str, list[float]] = {
    "storage.capacitance_f": [0.47e-3, 1e-3, 2.2e-3, 3.3e-3, 4.7e-3, 6.8e-3, 10e-3, 15e-3, 22e-3, 47e-3],
    "storage.v_on_v": [2.4, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0, 3.1, 3.2, 3.3],
    "workload.sense_period_s": [30, 45, 60, 90, 120, 180],
}


def spec_of(quick: bool, trials: int, seed: int, sampler: str = "gp") -> Any:
    from models.design.spec import DesignSpec

    space = {k: v[::3] if quick else v for k, v in SPACE.items()}
    return DesignSpec.model_validate({
        "name": "bench", "scenario": "indoor_office", "trials": trials, "startup_trials": max(2, trials // 6),
        "seeds": [0], "statistic": "worst", "sampler": sampler, "random_baseline": False, "seed": seed,
        "set": {"nodes.count": 1},
        "case": [{"name": "bright day", "set": {"harvester.schedule": [[8.0, 18.0, 500.0]]}},
                 {"name": "dim day", "set": {"harvester.schedule": [[9.0, 16.0, 250.0]]}}],
        "parameter": [{"field": k, "values": v} for k, v in space.items()],
        "objective": [{"metric": "completed", "goal": "maximize"}],
    })


def _grid(spec: Any, base_dir: Path) -> tuple[dict[tuple[int, ...], Any], float]:
    """Every design of the grid, simulated in two processes: {indices: Evaluation}, seconds."""
    from concurrent.futures import ProcessPoolExecutor

    from models.design.search import evaluate

    fields = [p.field for p in spec.parameter]
    points = list(itertools.product(*[range(len(p.values)) for p in spec.parameter]))
    designs = [dict(zip(fields, point)) for point in points]
    started = time.perf_counter()
    with ProcessPoolExecutor(min(2, os.cpu_count() or 1)) as pool:
        results = list(pool.map(evaluate, [spec] * len(designs), [base_dir] * len(designs), designs, chunksize=8))
    return dict(zip(points, results)), time.perf_counter() - started


# the reconfigurable comparison: a sparse vibration source (bursts every ~50 s of ~5 s, piezo_machine's
# harvester), sensing every 10 s; total capacitances, and each design's choices
BANK_SCENARIO = {"harvester": {"rate_hz": 0.02, "mean_burst_s": 5.0}, "workload": {"sense_period_s": 10.0},
                 "nodes": {"count": 1}, "run": {"workers": 1}}
BANK_TOTALS_F = (2.2e-3, 4.7e-3, 10e-3, 22e-3, 47e-3)
BANK_CHOICES: dict[str, tuple[float, ...]] = {"base_share": (0.05, 0.2, 0.5), "v_on_v": (2.4, 2.8, 3.2),
                                              "bank_connect_v": (2.8, 3.2, 3.5), "bank_isolate_v": (2.0, 2.2, 2.5)}
# the static capacitor's one choice, v_on, from the cut-off to the clamp, with as many designs as the bank's grid
STATIC_V_ON_RANGE = (2.1, 3.6)
BANK_SEEDS = (0, 1, 2)


def _events(storage: dict[str, Any]) -> float:
    """Events completed within the deadline on the sparse source, the mean over BANK_SEEDS."""
    from simulator import load_scenario, simulate
    from simulator.config import scenario_path

    total = 0.0
    for seed in BANK_SEEDS:
        # no leakage on either side: a switched capacitor and a fixed one of the same parts would leak alike
        sc = load_scenario(scenario_path("piezo_machine"), **{**BANK_SCENARIO, "run": {"workers": 1, "seed": seed},
                                                              "storage": {**storage, "leakage_r_ohm": "none"}})
        total += float(simulate(sc).summary["completed"])
    return total / len(BANK_SEEDS)


def _bank_designs(total_f: float, choices: dict[str, tuple[float, ...]] = BANK_CHOICES) -> list[dict[str, Any]]:
    out = []
    for share, v_on, on, off in itertools.product(*choices.values()):
        if off < on:
            out.append({"capacitance_f": total_f * share, "bank_f": [total_f * (1 - share)], "v_on_v": v_on,
                        "bank_connect_v": on, "bank_isolate_v": off})
    return out


def _static_designs(total_f: float, budget: int) -> list[dict[str, Any]]:
    """``budget`` static designs of ``total_f``: v_on evenly over STATIC_V_ON_RANGE (its only choice)."""
    low, high = STATIC_V_ON_RANGE
    return [{"capacitance_f": total_f, "v_on_v": round(low + (high - low) * k / (budget - 1), 6)} for k in range(budget)]


def bench_bank(quick: bool) -> dict[str, Any]:
    """Best static capacitor against the best bank of the same total capacitance, per total, each the
    best of the same number of simulated designs (the bank's grid; the static v_on as finely)."""
    from concurrent.futures import ProcessPoolExecutor

    totals = BANK_TOTALS_F[1:3] if quick else BANK_TOTALS_F
    choices: dict[str, tuple[float, ...]] = {k: v[:2] for k, v in BANK_CHOICES.items()} if quick else BANK_CHOICES
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(min(2, os.cpu_count() or 1)) as pool:
        for total in totals:
            banks = _bank_designs(total, choices)
            static = _static_designs(total, len(banks))
            s_events = list(pool.map(_events, static, chunksize=4))
            b_events = list(pool.map(_events, banks, chunksize=4))
            s_best, b_best = max(s_events), max(b_events)
            rows.append({"total_capacitance_f": total, "static_events": s_best,
                         "static_design": static[s_events.index(s_best)], "bank_events": b_best,
                         "bank_design": banks[b_events.index(b_best)], "designs_each": len(banks)})
    at = max(rows, key=lambda r: (r["static_events"], -r["total_capacitance_f"]))  # the best static design's size
    best_bank = max(rows, key=lambda r: r["bank_events"])
    return {"reconfigurable_vs_best_static_gain_pct": 100.0 * (at["bank_events"] - at["static_events"]) / at["static_events"],
            "reconfigurable_best_vs_static_best_any_size_gain_pct":
                100.0 * (best_bank["bank_events"] - at["static_events"]) / at["static_events"],
            "reconfigurable_at_capacitance_f": at["total_capacitance_f"], "reconfigurable_rows": rows,
            "reconfigurable_designs_each": rows[0]["designs_each"],
            "reconfigurable_scenario": "piezo_machine with " + json.dumps(BANK_SCENARIO, sort_keys=True)
                                       + f"; events = completed within deadline, mean of seeds {list(BANK_SEEDS)}; "
                                       f"bank and static capacitor each the best of {rows[0]['designs_each']} designs "
                                       "per total (the bank's grid; the static v_on evenly over "
                                       f"{STATIC_V_ON_RANGE[0]}-{STATIC_V_ON_RANGE[1]} V)"}


# ---- the README's example: trickle design examples/design/indoor_node.toml --------------------------

EXAMPLE = Path(__file__).parents[1] / "examples" / "design" / "indoor_node.toml"
EXAMPLE_WORKERS = 2  # designs asked at a time, as the README runs it (--workers 2)


def _design_key(spec: Any, params: dict[str, Any]) -> tuple[float, ...]:
    """A design as grid indices: a list by index, a stepped range by its step."""
    key: list[float] = []
    for p in spec.parameter:
        v = params[p.field]
        key.append(int(v) if p.choices is not None else round((v - p.low) / p.step) if p.step else v)
    return tuple(key)


def _example_grid(spec: Any, base_dir: Path) -> dict[tuple[float, ...], Any]:
    """Every design of the example's space (lists and stepped ranges), simulated in two processes."""
    from concurrent.futures import ProcessPoolExecutor

    from models.design.search import evaluate

    axes = []
    for p in spec.parameter:
        if p.choices is not None:
            axes.append(list(range(len(p.choices))))
        else:
            n = round((p.high - p.low) / p.step)
            axes.append([round(p.low + k * p.step, 9) for k in range(n + 1)])
    designs = [dict(zip([p.field for p in spec.parameter], point)) for point in itertools.product(*axes)]
    with ProcessPoolExecutor(min(2, os.cpu_count() or 1)) as pool:
        results = list(pool.map(evaluate, [spec] * len(designs), [base_dir] * len(designs), designs, chunksize=8))
    return {_design_key(spec, d): ev for d, ev in zip(designs, results)}


def _best_found(spec: Any, study: Any) -> float:
    """The best first objective among the feasible designs that complete something (0 if none)."""
    from models.design.report import finished
    from models.design.search import feasible, useful

    return max((t.values[0] for t in finished(study) if feasible(t) and useful(spec, t)), default=0.0)


def bench_readme_example(quick: bool) -> dict[str, Any]:
    """The README's design example as a user runs it (its seed, --workers 2, BO and random search of the
    same budget): its figures, whether each best file simulates to what the report says; then BO
    against random search at the same budget over SEEDS (median of BO's best / random's best)."""
    from models.design.report import resimulate_best, write_report
    from models.design.search import evaluate, run_study
    from models.design.spec import load_spec, prepare

    base_dir = EXAMPLE.parent.resolve()
    spec = prepare(load_spec(EXAMPLE), base_dir)
    if quick:
        spec = spec.model_copy(update={"trials": 6, "startup_trials": 3})
    first = spec.objective[0].metric
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        study = run_study(spec, base_dir, out, EXAMPLE_WORKERS)
        random_study = run_study(spec, base_dir, out, EXAMPLE_WORKERS, sampler_kind="random")
        doc = write_report(spec, base_dir, study, random_study, out, 1.0, chosen_report=False)
        resim = resimulate_best(spec, doc, out)
    # the figure each file's own run gives, and (worst statistic) the figure the report gives for the design
    matches = bool(resim) and all(r["matches"] for r in resim) and all(
        e["file_metrics"][first] == e["values"][0] for e in doc["best"])
    example = {"bo_best": doc["best_so_far"][-1], "random_best": doc["random_best_so_far"][-1],
               "best": [{"params": e["params"], "values": e["values"], "scenario_file": e["scenario_file"],
                         "file_case": e["file_case"]} for e in doc["best"]],
               "evaluated": doc["evaluated"], "refused": doc["failed"], "complete_nothing": doc["complete_nothing"],
               "parts_excluded": doc["parts_excluded"], "resimulated": resim}
    memo: dict[tuple[float, ...], Any] = {} if quick else _example_grid(spec, base_dir)

    def lookup(params: dict[str, Any]) -> Any:  # a design simulated once (the simulation is deterministic)
        key = _design_key(spec, params)
        if key not in memo:
            memo[key] = evaluate(spec, base_dir, params)
        return memo[key]

    bests: dict[str, list[float]] = {"gp": [], "random": []}
    seeds = SEEDS[:2] if quick else SEEDS
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for sampler in bests:
                study = run_study(spec.model_copy(update={"seed": seed}), base_dir, Path(tmp) / f"{sampler}-{seed}",
                                  EXAMPLE_WORKERS, sampler_kind=sampler, lookup=lookup)
                bests[sampler].append(_best_found(spec, study))
            print(f"  seed {seed}: best {first} BO {bests['gp'][-1]:g}, random {bests['random'][-1]:g}", flush=True)
    ratios = [b / r if r > 0 else (1.0 if b == 0 else math.inf) for b, r in zip(bests["gp"], bests["random"])]
    built = [ev.metrics[first] for ev in memo.values() if ev.error is None]
    return {"bo_vs_random_median_ratio_readme_example": statistics.median(ratios),
            "bo_vs_random_ratio_per_seed_readme_example": ratios,
            "bo_best_per_seed_readme_example": bests["gp"], "random_best_per_seed_readme_example": bests["random"],
            "readme_example_grid_designs": None if quick else len(memo),
            "readme_example_grid_optimum": None if quick else max(built),
            "readme_example_designs_above_zero": None if quick else sum(v > 0 for v in built),
            "best_file_resimulation_matches": int(matches), "readme_example": example}


def main(quick: bool = False, results_dir: Path = RESULTS) -> dict[str, Any]:
    from models.design.search import run_study

    base_dir = Path(".").resolve()
    grid_spec = spec_of(quick, 2, 0)
    size = math.prod(len(p.choices or []) for p in grid_spec.parameter)
    print(f"design: the grid, {size} designs x 2 days ...", flush=True)
    grid, grid_s = _grid(grid_spec, base_dir)
    fields = [p.field for p in grid_spec.parameter]
    values = {k: ev.metrics["completed"] for k, ev in grid.items() if ev.error is None}
    optimum = max(values.values())
    best_point = min(k for k, v in values.items() if v == optimum)
    budget = max(4, len(grid) // 10)

    def lookup(params: dict[str, Any]) -> Any:
        return grid[tuple(int(params[f]) for f in fields)]

    runs: dict[str, list[float]] = {"gp": [], "random": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in SEEDS:
            for sampler in runs:
                spec = spec_of(quick, budget, seed, sampler)
                study = run_study(spec, base_dir, Path(tmp) / f"{sampler}-{seed}", lookup=lookup, sampler_kind=sampler)
                found = _best_found(spec, study)
                runs[sampler].append(100.0 * (optimum - found) / optimum)
            print(f"  seed {seed}: regret BO {runs['gp'][-1]:.2f} %, random {runs['random'][-1]:.2f} %", flush=True)
    bo, rs = (sum(v) / len(v) for v in (runs["gp"], runs["random"]))
    out: dict[str, Any] = {
        "bo_regret_vs_grid_pct": bo,
        "random_regret_vs_grid_pct": rs,
        "bo_vs_random_regret_ratio": bo / rs if rs > 0 else (0.0 if bo == 0 else math.inf),
        "bo_regret_pct_per_seed": runs["gp"], "random_regret_pct_per_seed": runs["random"],
        "grid_designs": len(grid), "budget": budget, "seeds": list(SEEDS),
        "grid_optimum": optimum, "grid_optimum_design": {f: grid_spec.parameter[i].values[best_point[i]]
                                                         for i, f in enumerate(fields)},
        "designs_within_1pct_of_optimum": sum(v >= 0.99 * optimum for v in values.values()),
        "design_evals_per_second": len(grid) / grid_s,
        "space": {k: v for k, v in zip(fields, [p.values for p in grid_spec.parameter])},
        "objective": "completed (events within deadline), the worse of a bright and a dim day",
        "quick": quick, "machine": {"platform": platform.platform(), "python": platform.python_version(),
                                    "cpus": os.cpu_count()},
        "goals": {k: f"{op} {goal:g}" for k, (op, goal) in GOALS.items()},
    }
    print("reconfigurable storage: static capacitors against banks of the same total ...", flush=True)
    out.update(bench_bank(quick))
    print("the README's example: BO against random search over five seeds, its best files simulated again ...",
          flush=True)
    out.update(bench_readme_example(quick))
    rows = [(k, f"{out[k]:.3f}" if isinstance(out[k], float) else out[k],
             f"{GOALS[k][0]} {GOALS[k][1]:g}" if k in GOALS else "") for k in
            ("bo_regret_vs_grid_pct", "random_regret_vs_grid_pct", "bo_vs_random_regret_ratio", "grid_optimum",
             "designs_within_1pct_of_optimum", "design_evals_per_second", "reconfigurable_vs_best_static_gain_pct",
             "reconfigurable_best_vs_static_best_any_size_gain_pct", "bo_vs_random_median_ratio_readme_example",
             "best_file_resimulation_matches")]
    print("\n" + console_table(rows, headers=("key", "measured", "goal"), align="lrl"))
    name = "design-quick.json" if quick else "design.json"
    write_atomic(results_dir / name, json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")
    print(f"wrote {results_dir / name}")
    return out
