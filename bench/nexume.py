"""NExUME benchmark: every trained model as the inference task of simulated nodes.

    trickle bench nexume [--quick]
    trickle bench nexume --dataset walks.csv --id-column walk --label-column activity   # on your data

For each dataset (fsdd, basic_motions, digits; or your own) and seed, four ways to train and deploy:
  ptq_jit     fp32 training, int8 post-training quantization (brevitas calibration), Hibernus-style JIT checkpoints
  qat8_layer  fixed 8-bit QAT, a checkpoint after every layer
  uniform     the switchable network trained with uniformly random bit-width/dropout, DynInfer + QuantaTasks
  nexume      trained for the node it runs on: each (bits, dropout) as often as DynInfer runs it on that
              cell's simulated node (another seed of the same scenario), a quarter of the steps at full
              width, half of the others spread evenly over what the node runs, the cheaper
              configurations distilled in place from the full network; DynInfer + QuantaTasks
Each model runs on simulated nodes under three harvest sources (NREL solar, RF, piezo) and two
capacitors, plus continuous power (the baselines: one model per dataset and seed for every cell;
nexume: one per cell, as a user names the scenario). Metric: accuracy within deadline — a sensing
event counts as right only if its result was correct and in time (lost, dropped, late or
unfinished = wrong). Ablations (seed 0, the piezo and RF cells at 1 mF and continuous power):
nexume without the full-width share, without the even spread, without the in-place distillation,
with NExUME's rare-weight fine-tuning, and with the previous λ-weighted search in place of the
deployment schedule. Writes bench/results/nexume.json and docs/results/nexume.md (your data: OUT/nexume.json
and OUT/nexume.md, never the committed results).

Gains are paired: on one seed every method trains on the same split with the same seed and is
deployed on the same simulated nodes (the same energy draws), so each seed gives one difference per
cell and method; a gain is the mean of those differences with its 95 % t-interval over the seeds.
A cell counts as "gain >= 6 points" only when the interval's lower bound is 6 or more (the point
estimate's count, and the cells the interval leaves undecided, beside it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

from edge.core.files import data_root, write_atomic
from edge.core.tables import markdown_table
from models.data.base import Dataset
from models.data.datasets import DATASETS, load
from models.nexume.evaluate import net_inference_model
from models.nexume.switchable import SwitchableNet
from models.nexume.train import TrainConfig, calibrate_int8, train
from simulator.config import Scenario, load_scenario, scenario_path
from simulator.fleet import simulate
from simulator.workload import InferenceModel

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOCS = REPO / "docs" / "results"
METHODS = ("ptq_jit", "qat8_layer", "uniform", "nexume")
BASELINES = METHODS[:3]
FIXED_BASELINES = METHODS[:2]
SOURCES = {"solar": "nrel_24h", "rf": "rf_powercast", "piezo": "piezo_machine"}
CAPACITORS_F = (1e-3, 4.7e-3)
GOALS = {
    "cells_with_gain_ge_6pts": (">=", 4),
    "nexume_gain_vs_uniform_pts_mean": (">=", 1.0),
    "nexume_gain_vs_uniform_pts_min": (">=", -3.0),
    "continuous_power_loss_pts": ("<=", 1.0),
    "training_time_ratio_vs_qat": ("<=", 1.3),
}
# reported beside the goals: what the decided counts leave out, and the intervals of the goals' gains
CONTEXT = ("cells_with_gain_ge_6pts_point_estimate", "cells_with_gain_ge_6pts_undecided",
           "cells_with_gain_ge_6pts_vs_fixed_baselines", "cells_with_gain_ge_6pts_vs_fixed_baselines_point_estimate",
           "cells_with_gain_ge_6pts_vs_fixed_baselines_undecided", "nexume_gain_vs_uniform_pts_mean_ci95",
           "nexume_gain_vs_uniform_pts_min_ci95", "nexume_gain_vs_uniform_pts_min_cell", "cells_ahead_of_uniform",
           "cells_behind_uniform")
ABLATIONS: dict[str, dict[str, Any]] = {
    "without the full-width share": {"full_share": 0.0},
    "without the even spread": {"spread": 0.0},
    "with the rare-weight fine-tuning (3 epochs)": {"finetune_epochs": 3},
    "without in-place distillation": {"distill": 0.0},
    "λ-search instead of the deployment schedule": {"schedule": "search"},
}
ABLATION_CELLS: tuple[tuple[str, float | None], ...] = (("piezo", 1e-3), ("rf", 1e-3), ("continuous", None))
PLAN_SEED_OFFSET = 100  # the schedule's simulation: the same scenario, another seed than the cell's evaluation
SEEDS = tuple(range(8))  # enough paired seeds that the intervals decide most cells (3 left 6.2-7.7 points undecided)
QUICK_SEEDS = (0, 1)
CONFIDENCE = 0.95
GAIN_PTS = 6.0  # what counts as a gain worth a cell (cells_with_gain_ge_6pts)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- training ---------------------------------------------------------------------------------


def train_method(method: str, data: Dataset, seed: int, epochs: int, deployment: Scenario | None = None,
                 **options: Any) -> tuple[SwitchableNet, float]:
    """(trained model, training wall time in s) for one method; ``deployment``: the node nexume trains for."""
    training = {"ptq_jit": "fp32", "qat8_layer": "qat8", "uniform": "uniform", "nexume": "nexume"}[method]
    cfg = TrainConfig(dataset=data.name, method=training, epochs=epochs, seed=seed, **options)
    result = train(cfg, data, deployment=deployment)
    if method == "ptq_jit":
        calibrate_int8(result.model, data.x_train)
    return result.model, result.train_time_s


def device_model(method: str, model: SwitchableNet, data: Dataset) -> InferenceModel:
    if method in ("ptq_jit", "qat8_layer"):
        return net_inference_model(model, data, variants=[(8, 0.0)], adaptive=False)
    return net_inference_model(model, data, adaptive=True)


# ---- deployment scenarios ----------------------------------------------------------------------


def scenario(source: str, capacitance_f: float | None, method: str, seed: int, quick: bool) -> Scenario:
    """A small fleet on ``source`` (or continuous power when None) running ``method``'s policy."""
    policy = {"ptq_jit": "jit", "qat8_layer": "per_layer"}.get(method, "quanta")
    hours = 2.0 if quick else (24.0 if source == "solar" else 6.0)
    overrides: dict[str, dict[str, Any]] = {
        "run": {"duration_s": hours * 3600, "seed": seed, "workers": 1},
        "network": {"radio": "ble"},
        "workload": {"policy": policy, "sense_period_s": 10.0, "deadline_s": 10.0, "send_packet": True},
        "nodes": {"count": 4, "record_traces": 0},
    }
    if source == "continuous":
        overrides["harvester"] = {"kind": "constant", "power_w": 0.1}
        overrides["storage"] = {"capacitance_f": 4.7e-3, "v_initial_v": 3.0}
        base = None
    else:
        overrides["storage"] = {"capacitance_f": capacitance_f}
        base = scenario_path(SOURCES[source])
    sc = load_scenario(base, **overrides)
    cut = sc.storage.cut_off_v(sc.workload.mcu_profile)
    jit_v = round(cut + 0.3 * (sc.storage.v_on_v - cut), 3)
    return load_scenario(base, **{**overrides, "workload": {**overrides["workload"], "jit_threshold_v": jit_v}})


def run_cell(model: InferenceModel, sc: Scenario) -> dict[str, float]:
    s = simulate(sc, model=model).summary
    hours = sc.run.duration_s / 3600 * s["nodes"]
    return {"accuracy_within_deadline": float(s["accuracy_within_deadline"]),
            "inferences_per_hour": (s["completed"] + s["missed"]) / hours,
            "energy_per_inference_j": float(s["load_energy_per_result_j"]) if s["completed"] + s["missed"] else math.nan}


# ---- the whole benchmark ------------------------------------------------------------------------


def main(quick: bool = False, results_dir: Path = RESULTS, docs_dir: Path = DOCS,
         datasets: tuple[str, ...] = DATASETS, seeds: tuple[int, ...] | None = None, epochs: int | None = None,
         data: Dataset | None = None, work_dir: Path | None = None, ablate: bool = True) -> dict[str, Any]:
    """Run the benchmark and write its results. ``data``: the user's data set (already read, e.g. by
    ``trickle bench nexume --dataset``) in place of ``datasets``; its results are written to
    ``results_dir``/``docs_dir``, which the caller picks apart from the committed ones. ``work_dir``:
    a folder keeping each data set's seed (and the ablations) as it finishes, taken from there by a
    later run with the same settings: a long run resumes where it stopped, and more seeds add to the
    ones kept (delete the folder after changing the code). ``ablate=False``: no ablations; a full run
    keeps the committed run's ablation table, marked with the commit that measured it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on shared cores: one thread trained a 30-epoch run in 16.7 s, the default 221 s
    try:
        tasks = [data] if data is not None else [load(name) for name in datasets]
        seeds = seeds or (QUICK_SEEDS if quick else SEEDS)
        out = _run(tasks, quick, seeds, epochs or (3 if quick else 30), work_dir, ablate and not quick)
    finally:
        torch.set_num_threads(threads)
    if not quick and not ablate:
        out |= _committed_ablations(results_dir / "nexume.json")
    _write(out, results_dir, docs_dir, quick)
    return out


def _run(tasks: list[Dataset], quick: bool, seeds: tuple[int, ...], epochs: int, work_dir: Path | None,
         ablate: bool) -> dict[str, Any]:
    sources = [s for s in SOURCES if s != "solar" or (data_root() / "harvest" / "nrel").is_dir()]
    cells: list[tuple[str, float | None]] = [(src, c) for src in sources for c in CAPACITORS_F]
    cells.append(("continuous", None))
    runs: dict[str, list[dict[str, float]]] = {}  # key "dataset|source|cap|method" -> per-seed metrics, in seed order
    train_s: dict[str, list[float]] = {m: [] for m in METHODS}
    accuracy: dict[str, list[float]] = {}
    started = time.perf_counter()

    def log(msg: str) -> None:
        _log(f"[{time.perf_counter() - started:6.0f} s] {msg}")

    def settings(data: Dataset, seed: int) -> dict[str, Any]:
        return {"data": data.name, "data_sha256": hashlib.sha256(data.x_train.tobytes() + data.x_test.tobytes()).hexdigest(),
                "seed": seed, "quick": quick, "epochs": epochs, "cells": cells}

    for seed in seeds:  # seed by seed: a run stopped early holds whole seeds of every data set
        for data in tasks:
            unit = _kept(work_dir, f"{data.name}-seed{seed}", settings(data, seed),
                         functools.partial(_seed_runs, data, seed, cells, quick, epochs, log))
            for key, metrics in unit["runs"].items():
                runs.setdefault(key, []).append(metrics)
            for method, seconds in unit["train_s"].items():
                train_s[method] += seconds
            for key, values in unit["accuracy"].items():
                accuracy.setdefault(key, []).extend(values)
    ablations: dict[str, dict[str, float]] = {}
    for data in tasks if ablate else []:
        got = _kept(work_dir, f"{data.name}-ablations", settings(data, seeds[0]),
                    functools.partial(_ablation_runs, data, seeds[0], quick, epochs, log))
        for name, per_cell in got.items():
            ablations.setdefault(name, {}).update(per_cell)
    names = tuple(data.name for data in tasks)
    return _summarize(runs, train_s, accuracy, cells, names, quick, seeds, epochs, ablations)


def _seed_runs(data: Dataset, seed: int, cells: list[tuple[str, float | None]], quick: bool, epochs: int,
               log: Callable[[str], None]) -> dict[str, Any]:
    """One data set and seed, every method on every cell: paired, each method of this seed trains on
    the same split with the same seed and runs on the same simulated nodes."""
    runs: dict[str, dict[str, float]] = {}
    train_s: dict[str, list[float]] = {m: [] for m in METHODS}
    accuracy: dict[str, list[float]] = {}
    for method in BASELINES:
        model, t_train = train_method(method, data, seed, epochs)
        train_s[method].append(t_train)
        dm = device_model(method, model, data)
        accuracy.setdefault(f"{data.name}|{method}", []).append(dm.variants[0].accuracy)
        for src, cap in cells:
            runs[f"{data.name}|{src}|{cap}|{method}"] = run_cell(dm, scenario(src, cap, method, seed, quick))
        log(f"{data.name} seed {seed} {method}: trained in {t_train:.1f} s, test accuracy {dm.variants[0].accuracy:.3f}")
    for src, cap in cells:  # nexume: a model per node it runs on
        plan = scenario(src, cap, "nexume", seed + PLAN_SEED_OFFSET, quick)
        model, t_train = train_method("nexume", data, seed, epochs, deployment=plan)
        train_s["nexume"].append(t_train)
        dm = device_model("nexume", model, data)
        accuracy.setdefault(f"{data.name}|nexume", []).append(dm.variants[0].accuracy)
        runs[f"{data.name}|{src}|{cap}|nexume"] = run_cell(dm, scenario(src, cap, "nexume", seed, quick))
        log(f"{data.name} seed {seed} nexume for {src} {cap}: trained in {t_train:.1f} s")
    return {"runs": runs, "train_s": train_s, "accuracy": accuracy}


def _ablation_runs(data: Dataset, seed: int, quick: bool, epochs: int, log: Callable[[str], None]
                   ) -> dict[str, dict[str, float]]:
    """Per ablation and cell: nexume's accuracy within deadline with one part changed (one seed)."""
    ablations: dict[str, dict[str, float]] = {}
    for name, options in ABLATIONS.items():
        for src, cap in ABLATION_CELLS:
            plan = scenario(src, cap, "nexume", seed + PLAN_SEED_OFFSET, quick)
            model, _ = train_method("nexume", data, seed, epochs, deployment=plan, **options)
            got = run_cell(device_model("nexume", model, data), scenario(src, cap, "nexume", seed, quick))
            ablations.setdefault(name, {})[f"{data.name}|{src}|{cap}"] = got["accuracy_within_deadline"]
        log(f"{data.name} ablation {name}")
    return ablations


def _committed_ablations(path: Path) -> dict[str, Any]:
    """The ablation table of the results at ``path`` and the commit that measured it (its own
    ``ablation_measured_at``, else the last commit of the file)."""
    import subprocess

    if not path.is_file():
        return {}
    previous = json.loads(path.read_text())
    commit = previous.get("ablation_measured_at") or subprocess.run(
        ["git", "log", "-1", "--format=%h", "--", path.name], capture_output=True, text=True, cwd=path.parent).stdout.strip()
    table = previous.get("ablation", {})  # in the order a run writes it (the file's keys are sorted)
    cells = [f"{d}|{src}|{cap}" for d in DATASETS for src, cap in ABLATION_CELLS]
    table = {row: {c: table[row][c] for c in cells if c in table[row]} for row in ("nexume", "uniform", *ABLATIONS)
             if row in table}
    return {"ablation": table, "ablation_measured_at": commit or "unknown"}


def _kept(work_dir: Path | None, name: str, settings: dict[str, Any], compute: Callable[[], Any]) -> Any:
    """``compute()``, or what ``work_dir`` kept of it from a run with the same ``settings``."""
    if work_dir is None:
        return compute()
    path = work_dir / f"{name}.json"
    if path.is_file():
        kept = json.loads(path.read_text())
        if kept["settings"] == json.loads(json.dumps(settings)):
            return kept["result"]
    result = compute()
    write_atomic(path, json.dumps({"settings": settings, "result": result}, sort_keys=True) + "\n")
    return result


def _stats(values: list[float]) -> dict[str, Any]:
    v = np.asarray(values, dtype=float)
    return {"mean": float(np.nanmean(v)), "std": float(np.nanstd(v))}


def paired_gain(ours: list[float], theirs: list[float]) -> dict[str, Any]:
    """Accuracy ``ours`` minus ``theirs`` in points, seed by seed (the same seed: the same split, training
    seed and energy draws), their mean and its two-sided t-interval over the seeds (None below two seeds)."""
    diffs = 100 * (np.asarray(ours, dtype=float) - np.asarray(theirs, dtype=float))  # (seeds,)
    return {"mean": float(np.mean(diffs)), "ci95": _interval(diffs), "per_seed": diffs.tolist()}


def _interval(values: np.ndarray) -> list[float] | None:
    """The two-sided ``CONFIDENCE`` t-interval of the mean of ``values`` (None below two values)."""
    if len(values) < 2:
        return None
    mean = float(np.mean(values))
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, len(values) - 1) * np.std(values, ddof=1) / math.sqrt(len(values)))
    return [mean - half, mean + half]


def _decided(ci: list[float] | None, at_least: float) -> str:
    """What an interval says of "the gain is at least ``at_least``": yes, no or undecided."""
    if ci is None:
        return "undecided"
    return "yes" if ci[0] >= at_least else "no" if ci[1] < at_least else "undecided"


def _summarize(runs: dict[str, list[dict[str, float]]], train_s: dict[str, list[float]], accuracy: dict[str, list[float]],
               cells: list[tuple[str, float | None]], datasets: tuple[str, ...], quick: bool, seeds: tuple[int, ...],
               epochs: int, ablations: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    table = []
    loss_pts: list[float] = []
    verdicts: dict[str, list[str]] = {"best": [], "fixed": []}  # harvested cells: is the gain >= GAIN_PTS?
    points: dict[str, int] = {"best": 0, "fixed": 0}  # ... by the point estimate alone
    vs_uniform: list[dict[str, Any]] = []
    for dataset in datasets:
        for src, cap in cells:
            row: dict[str, Any] = {"dataset": dataset, "source": src, "capacitance_f": cap}
            acc: dict[str, list[float]] = {}
            for method in METHODS:
                metrics = runs[f"{dataset}|{src}|{cap}|{method}"]
                acc[method] = [m["accuracy_within_deadline"] for m in metrics]
                for k in ("accuracy_within_deadline", "inferences_per_hour", "energy_per_inference_j"):
                    row[f"{method}_{k}"] = _stats([m[k] for m in metrics])
                row[f"{method}_accuracy_within_deadline"]["per_seed"] = acc[method]  # what the paired gains pair
            # the baseline to beat: the one with the best mean accuracy, then paired with it seed by seed
            best = max(BASELINES, key=lambda b: row[f"{b}_accuracy_within_deadline"]["mean"])
            best_fixed = max(FIXED_BASELINES, key=lambda b: row[f"{b}_accuracy_within_deadline"]["mean"])
            row["best_baseline"], row["best_fixed_baseline"] = best, best_fixed
            for key, other in (("best_baseline", best), ("uniform", "uniform"), ("fixed_baselines", best_fixed)):
                gain = paired_gain(acc["nexume"], acc[other])
                row[f"gain_pts_vs_{key}"] = gain["mean"]
                row[f"gain_pts_vs_{key}_ci95"] = gain["ci95"]
            vs_uniform.append(paired_gain(acc["nexume"], acc["uniform"]) | {"cell": f"{dataset}|{src}|{cap}"})
            if src == "continuous":
                loss_pts.append(float(100 * (np.mean(acc["qat8_layer"]) - np.mean(acc["nexume"]))))
            else:
                for which, key in (("best", "best_baseline"), ("fixed", "fixed_baselines")):
                    verdicts[which].append(_decided(row[f"gain_pts_vs_{key}_ci95"], GAIN_PTS))
                    points[which] += row[f"gain_pts_vs_{key}"] >= GAIN_PTS
            table.append(row)
    # the mean gain over cells, paired: each seed's mean over cells, then its interval over seeds
    per_seed_mean = np.mean([g["per_seed"] for g in vs_uniform], axis=0)  # (seeds,)
    worst = min(vs_uniform, key=lambda g: g["mean"])
    return {
        # decided by the 95 % interval of the paired gain over the best baseline: its lower bound >= 6 points
        "cells_with_gain_ge_6pts": verdicts["best"].count("yes"),
        "cells_with_gain_ge_6pts_point_estimate": points["best"],
        "cells_with_gain_ge_6pts_undecided": verdicts["best"].count("undecided"),
        # context: the same count against the two fixed 8-bit deployments only, leaving out the
        # energy-unaware ablation (which shares DynInfer and QuantaTasks with NExUME)
        "cells_with_gain_ge_6pts_vs_fixed_baselines": verdicts["fixed"].count("yes"),
        "cells_with_gain_ge_6pts_vs_fixed_baselines_point_estimate": points["fixed"],
        "cells_with_gain_ge_6pts_vs_fixed_baselines_undecided": verdicts["fixed"].count("undecided"),
        # the claim to test: does energy-aware training add over the energy-unaware ablation (every cell)
        "nexume_gain_vs_uniform_pts_mean": float(np.mean([g["mean"] for g in vs_uniform])),
        "nexume_gain_vs_uniform_pts_mean_ci95": _interval(per_seed_mean),
        "nexume_gain_vs_uniform_pts_min": worst["mean"],
        "nexume_gain_vs_uniform_pts_min_ci95": worst["ci95"],
        "nexume_gain_vs_uniform_pts_min_cell": worst["cell"],
        # cells (every one, continuous power too) where the interval puts nexume ahead of uniform, or behind it
        "cells_ahead_of_uniform": sum(g["ci95"] is not None and g["ci95"][0] > 0 for g in vs_uniform),
        "cells_behind_uniform": sum(g["ci95"] is not None and g["ci95"][1] < 0 for g in vs_uniform),
        "confidence": f"{100 * CONFIDENCE:g} % t-interval of the mean paired difference over {len(seeds)} seeds",
        "continuous_power_loss_pts": max(loss_pts),
        "continuous_power_loss_pts_per_dataset": dict(zip(datasets, loss_pts)),
        # per training run (nexume trains one model per cell, the baselines one per dataset and seed)
        "training_time_ratio_vs_qat": float(np.mean(train_s["nexume"]) / np.mean(train_s["qat8_layer"])),
        "ablation": _ablation_table(runs, ablations or {}),
        "training_time_s": {m: _stats(v) for m, v in train_s.items()},
        "test_accuracy_first_variant": {k: _stats(v) for k, v in accuracy.items()},
        "table": table,
        "goals": {k: f"{op} {g}" for k, (op, g) in GOALS.items()},
        "seeds": list(seeds), "epochs": epochs, "quick": quick,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch_threads": torch.get_num_threads()},
    }


def _ablation_table(runs: dict[str, list[dict[str, float]]], ablations: dict[str, dict[str, float]]
                    ) -> dict[str, dict[str, float]]:
    """Per ablation and cell (seed 0): accuracy within deadline, with nexume and uniform of the same
    seed beside it."""
    if not ablations:
        return {}
    cells = list(next(iter(ablations.values())))
    table = {"nexume": {c: runs[f"{c}|nexume"][0]["accuracy_within_deadline"] for c in cells},
             "uniform": {c: runs[f"{c}|uniform"][0]["accuracy_within_deadline"] for c in cells}}
    return table | ablations


def _fmt(s: dict[str, float], scale: float = 100.0) -> str:
    return "–" if math.isnan(s["mean"]) else f"{scale * s['mean']:.1f} ± {scale * s['std']:.1f}"


def _gain(row: dict[str, Any], key: str) -> str:
    """A paired gain and its interval: ``+6.2 [+1.0, +11.4]``."""
    ci = row[f"gain_pts_vs_{key}_ci95"]
    return f"{row[f'gain_pts_vs_{key}']:+.1f}" + ("" if ci is None else f" [{ci[0]:+.1f}, {ci[1]:+.1f}]")


def _context(value: Any) -> str:
    if isinstance(value, list):
        return f"[{value[0]:+.2f}, {value[1]:+.2f}]"
    return "–" if value is None else value.replace("|", " ") if isinstance(value, str) else f"{value:.3g}"


def _write(out: dict[str, Any], results_dir: Path, docs_dir: Path, quick: bool) -> None:
    suffix = "-quick" if quick else ""
    write_atomic(results_dir / f"nexume{suffix}.json", json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")
    names = list(dict.fromkeys(r["dataset"] for r in out["table"]))
    command = "trickle bench nexume" + (" --quick" if quick else "")
    produced = f"`{command}`" if set(names) <= set(DATASETS) else f"`{command} --dataset …` on your data ({', '.join(names)})"
    lines = ["# NExUME: accuracy within deadline (%, mean ± std over seeds)", "",
             f"Seeds {out['seeds']}, {out['epochs']} epochs, BLE uplink, a sensing event every 10 s with a 10 s deadline. "
             f"Produced by {produced}.", "",
             "nexume (the default schedule of `trickle train nexume` since issue 30) is trained for the node it runs on: "
             "each (bits, dropout) as often as DynInfer runs it on that cell's simulated node (the same scenario, "
             "another seed), a quarter of the steps at full width (8 bit, no dropout), half of the others spread "
             "evenly over every configuration the node runs at all, the cheaper configurations distilled in place from "
             "the full network's most recent outputs (no rare-weight fine-tuning since issue 30's ablation); one model "
             "per cell. The baselines: one model per dataset and seed for every cell.", "",
             "Gains are paired: on each seed every method trains on the same split with the same seed and runs on "
             "the same simulated nodes (the same energy draws); a gain is the mean of the per-seed differences, with "
             f"its {out['confidence']} in brackets. Gain: nexume minus the baseline with the best mean (of the three); "
             "vs fixed: minus the better of ptq_jit and qat8_layer. A cell counts towards cells_with_gain_ge_6pts only "
             "when its interval's lower bound is at least 6 points.",
             ""]
    rows = [(r["dataset"], r["source"], "–" if r["capacitance_f"] is None else f"{r['capacitance_f'] * 1e3:g}",
             *(_fmt(r[f"{m}_accuracy_within_deadline"]) for m in METHODS),
             *(_gain(r, key) for key in ("best_baseline", "fixed_baselines", "uniform"))) for r in out["table"]]
    lines.append(markdown_table(["dataset", "source", "C (mF)", *METHODS, "gain (pts)", "vs fixed (pts)", "vs uniform (pts)"],
                                rows, align="llrrrrrrrr"))
    goals = [(k, f"{out[k]:.3g}", f"{op} {g}") for k, (op, g) in GOALS.items()]
    goals += [(f"(context) {k}", _context(out[k]), "–") for k in CONTEXT]
    lines += ["", markdown_table(["goal", "measured", "target"], goals, align="lrl")]
    if out["ablation"]:
        cells = list(out["ablation"]["nexume"])
        carried = out.get("ablation_measured_at")
        lines += ["", f"## Ablation (seed {0 if carried else out['seeds'][0]}): which parts matter", "",
                  "Accuracy within deadline (%) of nexume with one part changed, on the same cells and seed; the mean "
                  "difference to nexume in the last column." + (
                      f" Measured at commit {carried} and not re-run with the seeds above: its nexume and uniform rows are "
                      "that run's." if carried else ""), ""]
        rows = [(name, *(f"{100 * v[c]:.1f}" for c in cells),
                 f"{100 * np.mean([v[c] - out['ablation']['nexume'][c] for c in cells]):+.1f}")
                for name, v in out["ablation"].items()]
        heads = [c.replace("|", " ").replace("0.001", "1 mF").replace(" None", "") for c in cells]
        lines.append(markdown_table(["training", *heads, "vs nexume (pts)"], rows, align="l" + "r" * (len(cells) + 1)))
    _plot(out, docs_dir / f"nexume{suffix}.png")
    lines += ["", f"![accuracy within deadline per cell](nexume{suffix}.png)"]
    write_atomic(docs_dir / f"nexume{suffix}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def _plot(out: dict[str, Any], path: Path) -> None:
    """Accuracy within deadline per cell: the fixed 8-bit QAT, uniform and nexume, mean ± std over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = out["table"]
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(len(datasets), 1, figsize=(8, 2.6 * len(datasets)), sharey=True, squeeze=False)
    width = 0.27
    for ax, dataset in zip(axes[:, 0], datasets):
        cells = [r for r in rows if r["dataset"] == dataset]
        xs = np.arange(len(cells))
        for k, method in enumerate(("qat8_layer", "uniform", "nexume")):
            stats = [r[f"{method}_accuracy_within_deadline"] for r in cells]
            ax.bar(xs + (k - 1) * width, [100 * s["mean"] for s in stats], width, yerr=[100 * s["std"] for s in stats],
                   label=method, capsize=2)
        ax.set_xticks(xs, [r["source"] + ("" if r["capacitance_f"] is None else f"\n{r['capacitance_f'] * 1e3:g} mF")
                           for r in cells], fontsize=8)
        ax.set_ylabel("accuracy within\ndeadline (%)")
        ax.set_title(dataset, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, ncol=3, loc="upper center")
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=100)
    plt.close(fig)
