"""NExUME benchmark: every trained model as the inference task of simulated nodes.

    trickle bench nexume [--quick]

For each dataset (fsdd, basic_motions, digits) and seed, four ways to train and deploy:
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
deployment schedule. Writes bench/results/nexume.json and docs/results/nexume.md.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

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
ABLATIONS: dict[str, dict[str, Any]] = {
    "without the full-width share": {"full_share": 0.0},
    "without the even spread": {"spread": 0.0},
    "with the rare-weight fine-tuning (3 epochs)": {"finetune_epochs": 3},
    "without in-place distillation": {"distill": 0.0},
    "λ-search instead of the deployment schedule": {"schedule": "search"},
}
ABLATION_CELLS: tuple[tuple[str, float | None], ...] = (("piezo", 1e-3), ("rf", 1e-3), ("continuous", None))
PLAN_SEED_OFFSET = 100  # the schedule's simulation: the same scenario, another seed than the cell's evaluation


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
         datasets: tuple[str, ...] = DATASETS, seeds: tuple[int, ...] | None = None, epochs: int | None = None) -> dict[str, Any]:
    seeds = seeds if seeds is not None else ((0, 1) if quick else (0, 1, 2))
    epochs = epochs if epochs is not None else (3 if quick else 30)
    sources = [s for s in SOURCES if s != "solar" or (data_root() / "harvest" / "nrel").is_dir()]
    cells: list[tuple[str, float | None]] = [(src, c) for src in sources for c in CAPACITORS_F]
    cells.append(("continuous", None))
    runs: dict[str, list[dict[str, float]]] = {}  # key "dataset|source|cap|method" -> per-seed metrics
    train_s: dict[str, list[float]] = {m: [] for m in METHODS}
    accuracy: dict[str, list[float]] = {}
    started = time.perf_counter()

    def log(msg: str) -> None:
        _log(f"[{time.perf_counter() - started:6.0f} s] {msg}")

    for dataset in datasets:
        data = load(dataset)
        for seed in seeds:
            for method in BASELINES:
                model, t_train = train_method(method, data, seed, epochs)
                train_s[method].append(t_train)
                dm = device_model(method, model, data)
                accuracy.setdefault(f"{dataset}|{method}", []).append(dm.variants[0].accuracy)
                for src, cap in cells:
                    runs.setdefault(f"{dataset}|{src}|{cap}|{method}", []).append(
                        run_cell(dm, scenario(src, cap, method, seed, quick)))
                log(f"{dataset} seed {seed} {method}: trained in {t_train:.1f} s, test accuracy {dm.variants[0].accuracy:.3f}")
            for src, cap in cells:  # nexume: a model per node it runs on
                plan = scenario(src, cap, "nexume", seed + PLAN_SEED_OFFSET, quick)
                model, t_train = train_method("nexume", data, seed, epochs, deployment=plan)
                train_s["nexume"].append(t_train)
                dm = device_model("nexume", model, data)
                accuracy.setdefault(f"{dataset}|nexume", []).append(dm.variants[0].accuracy)
                runs.setdefault(f"{dataset}|{src}|{cap}|nexume", []).append(
                    run_cell(dm, scenario(src, cap, "nexume", seed, quick)))
                log(f"{dataset} seed {seed} nexume for {src} {cap}: trained in {t_train:.1f} s")
    ablations: dict[str, dict[str, float]] = {}
    if not quick:
        for dataset in datasets:
            data = load(dataset)
            for name, options in ABLATIONS.items():
                for src, cap in ABLATION_CELLS:
                    plan = scenario(src, cap, "nexume", PLAN_SEED_OFFSET, quick)
                    model, _ = train_method("nexume", data, 0, epochs, deployment=plan, **options)
                    got = run_cell(device_model("nexume", model, data), scenario(src, cap, "nexume", 0, quick))
                    ablations.setdefault(name, {})[f"{dataset}|{src}|{cap}"] = got["accuracy_within_deadline"]
                log(f"{dataset} ablation {name}")
    out = _summarize(runs, train_s, accuracy, cells, datasets, quick, seeds, epochs, ablations)
    _write(out, results_dir, docs_dir, quick)
    return out


def _stats(values: list[float]) -> dict[str, float]:
    v = np.asarray(values, dtype=float)
    return {"mean": float(np.nanmean(v)), "std": float(np.nanstd(v))}


def _summarize(runs: dict[str, list[dict[str, float]]], train_s: dict[str, list[float]], accuracy: dict[str, list[float]],
               cells: list[tuple[str, float | None]], datasets: tuple[str, ...], quick: bool, seeds: tuple[int, ...],
               epochs: int, ablations: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    table = []
    gains = gains_fixed = 0
    loss_pts: list[float] = []
    uniform_gains: list[float] = []
    for dataset in datasets:
        for src, cap in cells:
            row: dict[str, Any] = {"dataset": dataset, "source": src, "capacitance_f": cap}
            for method in METHODS:
                metrics = runs[f"{dataset}|{src}|{cap}|{method}"]
                for k in ("accuracy_within_deadline", "inferences_per_hour", "energy_per_inference_j"):
                    row[f"{method}_{k}"] = _stats([m[k] for m in metrics])
            ours = row["nexume_accuracy_within_deadline"]["mean"]
            best = max(row[f"{b}_accuracy_within_deadline"]["mean"] for b in BASELINES)
            best_fixed = max(row[f"{b}_accuracy_within_deadline"]["mean"] for b in FIXED_BASELINES)
            row["gain_pts_vs_best_baseline"] = 100 * (ours - best)
            row["gain_pts_vs_uniform"] = 100 * (ours - row["uniform_accuracy_within_deadline"]["mean"])
            uniform_gains.append(row["gain_pts_vs_uniform"])
            row["gain_pts_vs_fixed_baselines"] = 100 * (ours - best_fixed)
            if src == "continuous":
                loss_pts.append(100 * (row["qat8_layer_accuracy_within_deadline"]["mean"] - ours))
            else:
                gains += row["gain_pts_vs_best_baseline"] >= 6.0
                gains_fixed += row["gain_pts_vs_fixed_baselines"] >= 6.0
            table.append(row)
    return {
        "cells_with_gain_ge_6pts": gains,
        # context: the same count against the two fixed 8-bit deployments only, leaving out the
        # energy-unaware ablation (which shares DynInfer and QuantaTasks with NExUME)
        "cells_with_gain_ge_6pts_vs_fixed_baselines": gains_fixed,
        # the claim to test: does energy-aware training add over the energy-unaware ablation (every cell)
        "nexume_gain_vs_uniform_pts_mean": float(np.mean(uniform_gains)),
        "nexume_gain_vs_uniform_pts_min": float(np.min(uniform_gains)),
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
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
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


def _write(out: dict[str, Any], results_dir: Path, docs_dir: Path, quick: bool) -> None:
    suffix = "-quick" if quick else ""
    write_atomic(results_dir / f"nexume{suffix}.json", json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")
    lines = ["# NExUME: accuracy within deadline (%, mean ± std over seeds)", "",
             f"Seeds {out['seeds']}, {out['epochs']} epochs, BLE uplink, a sensing event every 10 s with a 10 s deadline. "
             "Produced by `trickle bench nexume`" + (" --quick" if quick else "") + ".", "",
             "nexume (the default schedule of `trickle train nexume` since issue 30) is trained for the node it runs on: "
             "each (bits, dropout) as often as DynInfer runs it on that cell's simulated node (the same scenario, "
             "another seed), a quarter of the steps at full width (8 bit, no dropout), half of the others spread "
             "evenly over every configuration the node runs at all, the cheaper configurations distilled in place from "
             "the full network's most recent outputs (no rare-weight fine-tuning since issue 30's ablation); one model "
             "per cell. The baselines: one model per dataset and seed for every cell.", "",
             "Gain: nexume minus the best of the three baselines; vs fixed: minus the better of ptq_jit and qat8_layer.",
             ""]
    rows = [(r["dataset"], r["source"], "–" if r["capacitance_f"] is None else f"{r['capacitance_f'] * 1e3:g}",
             *(_fmt(r[f"{m}_accuracy_within_deadline"]) for m in METHODS),
             f"{r['gain_pts_vs_best_baseline']:+.1f}", f"{r['gain_pts_vs_fixed_baselines']:+.1f}",
             f"{r['gain_pts_vs_uniform']:+.1f}") for r in out["table"]]
    lines.append(markdown_table(["dataset", "source", "C (mF)", *METHODS, "gain (pts)", "vs fixed (pts)", "vs uniform (pts)"],
                                rows, align="llrrrrrrrr"))
    goals = [(k, f"{out[k]:.3g}", f"{op} {g}") for k, (op, g) in GOALS.items()]
    goals.append(("(context) cells_with_gain_ge_6pts_vs_fixed_baselines", out["cells_with_gain_ge_6pts_vs_fixed_baselines"], "–"))
    lines += ["", markdown_table(["goal", "measured", "target"], goals, align="lrl")]
    if out["ablation"]:
        cells = list(out["ablation"]["nexume"])
        lines += ["", "## Ablation (seed 0): which parts matter", "",
                  "Accuracy within deadline (%) of nexume with one part changed, on the same cells and seed; the mean "
                  "difference to nexume in the last column.", ""]
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
