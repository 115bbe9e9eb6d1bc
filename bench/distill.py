"""Knowledge distillation on pruned data: MDSLR against random, hardest-first, easiest-first and full-data KD.

    trickle bench distill [--quick]

Per data set (digits, FSDD): a float teacher (the built-in CNN at full width, ``fp32``) trained
once; then students — the NExUME switchable-precision CNN at a quarter of the teacher's channels,
trained with NExUME's schedule and the KD loss (CE + KL at T = 4) — on the examples each rule keeps
at 30, 50 and 70 %, and on all of them, over 3 seeds (the student's initialisation, its batches and
the random rule's draw). Every student trains the same number of epochs, so a pruned set costs
fewer steps. Accuracy: the student's 8-bit, full-width variant (what a node runs at full energy) on
the test split. KD time: the teacher's pass over the full training set, the selection and the
student's training loop (``DistillResult.seconds``).

Data-parallel training: the teacher's training run in one process and through torchrun in two
(``trickle train nexume --nproc 2``, gloo), the same configuration; the speed-up is the
ratio of their training loops (the launch is reported beside it).

Writes bench/results/distill.json and docs/results/distill.md.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from edge.core.files import write_atomic
from edge.core.tables import markdown_table
from models.distill import Selection, distill
from models.nexume.switchable import FLOAT_BITS
from models.nexume.train import TrainConfig, accuracy, train

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOCS = REPO / "docs" / "results"
DATASETS = ("digits", "fsdd")
RATIOS = (0.3, 0.5, 0.7)
PRUNED: tuple[Selection, ...] = ("mdslr", "random", "hard", "easy")
SEEDS = (0, 1, 2)
WIDTH = 0.25
GOALS = {"mdslr_gain_vs_random_pts_at_50": (">=", 1.0), "mdslr_minus_full_kd_pts_at_70": (">=", 0.0),
         "kd_time_ratio_at_50": ("<=", 0.6)}


def teacher_config(dataset: str, quick: bool, epochs: int | None = None) -> TrainConfig:
    return TrainConfig(dataset=dataset, method="fp32", epochs=epochs or (4 if quick else 20), seed=0)


def student_config(dataset: str, seed: int, quick: bool, epochs: int | None = None) -> TrainConfig:
    return TrainConfig(dataset=dataset, method="nexume", epochs=epochs or (3 if quick else 60), lr=0.01, batch_size=64,
                       seed=seed)


def student_accuracy(variants: list[dict[str, float]]) -> float:
    return next(v["accuracy"] for v in variants if v["bits"] == 8 and v["drop"] == 0.0)


def run_dataset(dataset: str, quick: bool, seeds: tuple[int, ...], bar: Any, epochs: int | None) -> dict[str, Any]:
    tcfg = teacher_config(dataset, quick, epochs)
    data = tcfg.load_data()
    teacher = train(tcfg, data)
    teacher_acc = accuracy(teacher.model, data.x_test, data.y_test, FLOAT_BITS, 0.0)
    runs: list[dict[str, Any]] = []
    for seed in seeds:
        for selection, ratio in [("full", 1.0), *((s, r) for s in PRUNED for r in RATIOS)]:
            bar.set_postfix_str(f"{dataset} seed {seed} {selection} {ratio:.0%}")
            d = distill(student_config(dataset, seed, quick, epochs), data, teacher.model, selection, ratio, width=WIDTH)
            runs.append({"selection": selection, "ratio": ratio, "seed": seed, "kept": len(d.kept),
                         "accuracy": student_accuracy(d.result.variants), "seconds": d.seconds})
            bar.update(1)
    table: dict[str, dict[str, dict[str, float]]] = {}
    for selection in ("full", *PRUNED):
        for ratio in (1.0,) if selection == "full" else RATIOS:
            picked = [r for r in runs if r["selection"] == selection and r["ratio"] == ratio]
            acc = np.array([100 * r["accuracy"] for r in picked])
            secs = np.array([r["seconds"] for r in picked])
            table.setdefault(selection, {})[f"{ratio:.1f}"] = {
                "accuracy_pts_mean": float(acc.mean()), "accuracy_pts_std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                "seconds_mean": float(secs.mean()), "kept": picked[0]["kept"]}
    return {"teacher_accuracy": teacher_acc, "teacher_train_s": teacher.train_time_s, "n_train": len(data.y_train),
            "table": table, "runs": runs}


def ddp_speedup(quick: bool) -> dict[str, Any]:
    """The digits teacher's training: one process against torchrun's two."""
    from models.nexume.launch import launch

    cfg = teacher_config("digits", quick)
    one = train(cfg, cfg.load_data()).train_time_s
    with tempfile.TemporaryDirectory(prefix="trickle-bench-ddp-") as tmp:
        started = time.perf_counter()
        summary = launch(cfg.model_dump_json(), Path(tmp), None, 2)
        wall = time.perf_counter() - started
    two = float(summary["train_time_s"])  # type: ignore[arg-type]
    return {"config": cfg.model_dump(mode="json"), "one_process_train_s": one, "two_process_train_s": two,
            "two_process_wall_s": wall, "speedup": one / two}


def main(quick: bool = False, results_dir: Path = RESULTS, docs_dir: Path = DOCS, datasets: tuple[str, ...] = DATASETS,
         seeds: tuple[int, ...] | None = None, epochs: int | None = None, ddp: bool = True) -> dict[str, Any]:
    """``seeds``, ``epochs`` (teacher and students) and ``ddp`` (off: no speed-up measured) make a
    smaller run, as the tests do."""
    torch.set_num_threads(1)
    started = time.perf_counter()
    seeds = seeds or (SEEDS[:2] if quick else SEEDS)
    per_set: dict[str, Any] = {}
    with tqdm(total=len(datasets) * len(seeds) * (1 + len(PRUNED) * len(RATIOS)), unit="student",
              desc="distill", leave=False) as bar:
        for name in datasets:
            per_set[name] = run_dataset(name, quick, seeds, bar, epochs)
    parallel = ddp_speedup(quick) if ddp else None

    def acc(name: str, selection: str, ratio: float) -> float:
        return float(per_set[name]["table"][selection][f"{ratio:.1f}"]["accuracy_pts_mean"])

    def secs(name: str, selection: str, ratio: float) -> float:
        return float(per_set[name]["table"][selection][f"{ratio:.1f}"]["seconds_mean"])

    out: dict[str, Any] = {
        "mdslr_gain_vs_random_pts_at_50": float(np.mean([acc(n, "mdslr", 0.5) - acc(n, "random", 0.5) for n in per_set])),
        "mdslr_minus_full_kd_pts_at_70": float(np.mean([acc(n, "mdslr", 0.7) - acc(n, "full", 1.0) for n in per_set])),
        "kd_time_ratio_at_50": float(np.mean([secs(n, "mdslr", 0.5) / secs(n, "full", 1.0) for n in per_set])),
        "ddp_2proc_speedup": parallel["speedup"] if parallel else None,
        "per_set": {n: {"mdslr_gain_vs_random_pts": {f"{r:.1f}": acc(n, "mdslr", r) - acc(n, "random", r) for r in RATIOS},
                        "mdslr_minus_full_kd_pts": {f"{r:.1f}": acc(n, "mdslr", r) - acc(n, "full", 1.0) for r in RATIOS}}
                    for n in per_set},
        "datasets": per_set, "ddp": parallel, "width": WIDTH, "seeds": list(seeds),
        "student_config": student_config("digits", 0, quick, epochs).model_dump(mode="json"),
        "teacher_config": teacher_config("digits", quick, epochs).model_dump(mode="json"),
        "quick": quick, "seconds": time.perf_counter() - started,
        "goals": {k: f"{op} {g}" for k, (op, g) in GOALS.items()},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
    }
    _write(out, results_dir, docs_dir, quick)
    print(markdown_table(["key", "measured", "goal", ""], _goal_rows(out), align="lrlc"))
    return out


def _write(out: dict[str, Any], results_dir: Path, docs_dir: Path, quick: bool) -> None:
    suffix = "-quick" if quick else ""
    write_atomic(results_dir / f"distill{suffix}.json", json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")
    s = out["student_config"]
    lines = ["# Knowledge distillation on pruned data (MDSLR)", "",
             "Produced by `trickle bench distill`" + (" --quick" if quick else "") + f" in {out['seconds'] / 60:.0f} min "
             f"on {out['machine']['cpus']} CPUs, one torch thread.", "",
             f"Teacher: the built-in CNN at full width, fp32, {out['teacher_config']['epochs']} epochs. Students: the "
             f"NExUME switchable-precision CNN at {out['width']:g} of the teacher's channels, NExUME's schedule, "
             f"{s['epochs']} epochs at lr {s['lr']:g}, batch {s['batch_size']}, KD loss 0.1·CE + 0.9·T²·KL at T = 4; "
             f"seeds {', '.join(map(str, out['seeds']))}. Accuracy: the student's 8-bit full-width variant on the test "
             "split, in points, mean ± std over the seeds. Time: the KD's cost (the teacher's pass over the full set, "
             "the selection, the student's training loop), mean over the seeds.", ""]
    for name, r in out["datasets"].items():
        lines += [f"## {name} (teacher {100 * r['teacher_accuracy']:.1f} %, {r['n_train']} training examples)", ""]
        rows = []
        for selection, by_ratio in r["table"].items():
            for ratio, cell in by_ratio.items():
                rows.append((selection, f"{float(ratio):.0%}", str(cell["kept"]),
                             f"{cell['accuracy_pts_mean']:.1f} ± {cell['accuracy_pts_std']:.1f}", f"{cell['seconds_mean']:.1f}"))
        lines += [markdown_table(["method", "keep", "examples", "accuracy (%)", "KD time (s)"], rows, align="lrrrr"), ""]
    d = out["ddp"] or {"config": {"epochs": 0, "batch_size": 0}, "one_process_train_s": float("nan"),
                       "two_process_train_s": float("nan"), "two_process_wall_s": float("nan"), "speedup": float("nan")}
    lines += ["## Data-parallel training", "",
              f"The digits teacher's training ({d['config']['epochs']} epochs, batch {d['config']['batch_size']}): one process "
              f"{d['one_process_train_s']:.2f} s, torchrun with two processes (gloo) {d['two_process_train_s']:.2f} s "
              f"(the whole launch {d['two_process_wall_s']:.1f} s): speed-up {d['speedup']:.2f}. The network is a few kB: "
              "a step is mostly fixed overhead that halving the batch does not halve, and each step waits for an "
              "all-reduce between the ranks.", ""]
    lines += ["## Goals", "", "Accuracy differences in points, mean over the data sets.", "",
              markdown_table(["key", "measured", "goal"], [row[:3] for row in _goal_rows(out)], align="lrl")]
    write_atomic(docs_dir / f"distill{suffix}.md", "\n".join(lines) + "\n")


def _goal_rows(out: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(key, measured, goal, met) of every benchmark key."""
    rows = [(k, f"{out[k]:+.2f}" if "pts" in k else f"{out[k]:.3f}", f"{op} {g}",
             "✔" if (out[k] >= g if op == ">=" else out[k] <= g) else "✘") for k, (op, g) in GOALS.items()]
    speedup = out["ddp_2proc_speedup"]
    return [*rows, ("ddp_2proc_speedup", "not measured" if speedup is None else f"{speedup:.2f}", "reported", "")]
