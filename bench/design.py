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
  and one switched capacitor; base share, v_on and the two bank thresholds on a grid) against the
  best static capacitor (v_on on a grid), both of the total capacitance at which the static design
  does best; ``reconfigurable_rows`` gives every total, and
  ``reconfigurable_best_vs_static_best_any_size_gain_pct`` the best bank of any size against it.
- design_evals_per_second: designs (two simulated days each) per second on this machine's cores.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from edge.core.files import write_atomic
from edge.core.tables import console_table

RESULTS = Path(__file__).parent / "results"
GOALS = {"bo_regret_vs_grid_pct": ("<=", 1.0), "bo_vs_random_regret_ratio": ("<=", 0.5)}
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
STATIC_V_ON = (2.4, 2.6, 2.8, 3.0, 3.2, 3.4)
BANK_CHOICES = {"base_share": (0.05, 0.2, 0.5), "v_on_v": (2.4, 2.8, 3.2), "bank_connect_v": (2.8, 3.2, 3.5),
                "bank_isolate_v": (2.0, 2.2, 2.5)}
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


def _bank_designs(total_f: float) -> list[dict[str, Any]]:
    out = []
    for share, v_on, on, off in itertools.product(*BANK_CHOICES.values()):
        if off < on:
            out.append({"capacitance_f": total_f * share, "bank_f": [total_f * (1 - share)], "v_on_v": v_on,
                        "bank_connect_v": on, "bank_isolate_v": off})
    return out


def bench_bank(quick: bool) -> dict[str, Any]:
    """Best static capacitor against the best bank of the same total capacitance, per total."""
    from concurrent.futures import ProcessPoolExecutor

    totals = BANK_TOTALS_F[1:3] if quick else BANK_TOTALS_F
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(min(2, os.cpu_count() or 1)) as pool:
        for total in totals:
            static = [{"capacitance_f": total, "v_on_v": v} for v in STATIC_V_ON]
            banks = _bank_designs(total)
            s_events = list(pool.map(_events, static))
            b_events = list(pool.map(_events, banks, chunksize=4))
            s_best, b_best = max(s_events), max(b_events)
            rows.append({"total_capacitance_f": total, "static_events": s_best,
                         "static_design": static[s_events.index(s_best)], "bank_events": b_best,
                         "bank_design": banks[b_events.index(b_best)]})
    at = max(rows, key=lambda r: (r["static_events"], -r["total_capacitance_f"]))  # the best static design's size
    best_bank = max(rows, key=lambda r: r["bank_events"])
    return {"reconfigurable_vs_best_static_gain_pct": 100.0 * (at["bank_events"] - at["static_events"]) / at["static_events"],
            "reconfigurable_best_vs_static_best_any_size_gain_pct":
                100.0 * (best_bank["bank_events"] - at["static_events"]) / at["static_events"],
            "reconfigurable_at_capacitance_f": at["total_capacitance_f"], "reconfigurable_rows": rows,
            "reconfigurable_scenario": "piezo_machine with " + json.dumps(BANK_SCENARIO, sort_keys=True)
                                       + f"; events = completed within deadline, mean of seeds {list(BANK_SEEDS)}"}


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
                found = max(t.values[0] for t in study.get_trials(deepcopy=False) if t.values is not None)
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
    rows = [(k, f"{out[k]:.3f}" if isinstance(out[k], float) else out[k],
             f"{GOALS[k][0]} {GOALS[k][1]:g}" if k in GOALS else "") for k in
            ("bo_regret_vs_grid_pct", "random_regret_vs_grid_pct", "bo_vs_random_regret_ratio", "grid_optimum",
             "designs_within_1pct_of_optimum", "design_evals_per_second", "reconfigurable_vs_best_static_gain_pct",
             "reconfigurable_best_vs_static_best_any_size_gain_pct")]
    print("\n" + console_table(rows, headers=("key", "measured", "goal"), align="lrl"))
    name = "design-quick.json" if quick else "design.json"
    write_atomic(results_dir / name, json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")
    print(f"wrote {results_dir / name}")
    return out
