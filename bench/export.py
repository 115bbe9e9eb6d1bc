"""Export benchmark: every format of every variant, on its own runtime, against PyTorch eager fp32.

    trickle bench export [--quick]

For each dataset (digits, basic_motions, and fsdd when the data folder has it) a NExUME model
is trained (seed 0), exported with every format, and each file is run on the runtime a device
would use (onnxruntime, ExecuTorch, LiteRT), at batch 1 with each library's default threads:
latency is the median of many single-example calls after a warm-up, size is the file's bytes,
accuracy is on the test split. Headline keys of bench/results/export.json (goals in GOALS):

- int8_ort_speedup_vs_torch_eager: PyTorch eager fp32 latency / onnxruntime int8 latency, of
  the full-width variant (drop 0); the smallest over the datasets.
- int8_size_ratio_vs_fp32: int8 ONNX bytes / fp32 ONNX bytes of the full-width variant; the largest.
- int8_accuracy_loss_pts: PyTorch fp32 accuracy - onnxruntime int8 accuracy, in points; the largest.
- edge_install_size_ratio: a fresh virtual environment with ``trickle[edge]`` / the environment
  running the benchmark (``trickle[all,dev]``), on disk.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from edge.classify.backends import FORMAT_BACKEND, load_backend, quiet
from edge.contract.bundle import read_bundle
from edge.core.files import write_atomic
from edge.core.tables import console_table
from export.bundle import export_bundle
from models.data.base import DatasetError
from models.data.datasets import load
from models.nexume.checkpoint import load_checkpoint, save_checkpoint
from models.nexume.train import TrainConfig, train

RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parent.parent
GOALS = {
    "int8_ort_speedup_vs_torch_eager": (">=", 3.0),
    "int8_size_ratio_vs_fp32": ("<=", 0.3),
    "int8_accuracy_loss_pts": ("<=", 1.0),
    "edge_install_size_ratio": ("<=", 0.15),
}


def median_latency_s(fn: Callable[[], object], calls: int) -> float:
    for _ in range(max(20, calls // 20)):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _dir_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            if not p.is_symlink():
                total += p.stat().st_size
    return total


def edge_install_size() -> dict[str, Any]:
    """Bytes of a fresh venv with trickle[edge], and of the environment running this benchmark."""
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "edge-venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", f"{REPO}[edge]"],
                       check=True)
        imports_torch = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch"], capture_output=True).returncode == 0
        edge_bytes = _dir_bytes(venv)
    full_bytes = _dir_bytes(Path(sys.prefix))
    return {"edge_venv_bytes": edge_bytes, "full_venv_bytes": full_bytes, "edge_venv_has_torch": imports_torch,
            "edge_install_size_ratio": edge_bytes / full_bytes}


def bench_dataset(name: str, epochs: int, calls: int, work: Path) -> dict[str, Any]:
    data = load(name)
    t0 = time.perf_counter()
    result = train(TrainConfig(dataset=name, method="nexume", epochs=epochs, seed=0), data)
    save_checkpoint(result, data, work / name)
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    bundle_path = export_bundle(work / name / "checkpoint.pt", work / f"{name}.tar", as_tar=True)
    export_s = time.perf_counter() - t0
    bundle = read_bundle(bundle_path)
    x1 = data.x_test[:1].copy()
    rows: list[dict[str, Any]] = []
    model, _ = load_checkpoint(work / name / "checkpoint.pt")
    model.eval()
    for variant in bundle.manifest.variants:
        if variant.bits == 32:  # PyTorch eager fp32: the reference every ratio is against
            model.configure(32, variant.drop)
            with torch.inference_mode():
                xt = torch.from_numpy(x1)
                acc = float((model(torch.from_numpy(data.x_test)).argmax(1).numpy() == data.y_test).mean())
                latency = median_latency_s(lambda: model(xt), calls)  # noqa: B023 (called here, in this iteration)
            rows.append({"variant": variant.name, "format": "torch-eager", "runtime": "pytorch", "bits": 32,
                         "drop": variant.drop, "latency_s": latency, "size_bytes": None, "accuracy": acc})
        for fmt, file in variant.formats.items():
            with quiet():
                backend = load_backend(fmt, bundle.file(file))
            latency = median_latency_s(lambda: backend.run(x1), calls)  # noqa: B023 (called here, in this iteration)
            rows.append({"variant": variant.name, "format": fmt, "runtime": FORMAT_BACKEND[fmt], "bits": variant.bits,
                         "drop": variant.drop, "latency_s": latency, "size_bytes": len(bundle.file(file)),
                         "accuracy": variant.accuracy[fmt]})

    def row(variant: str, fmt: str) -> dict[str, Any]:
        return next(r for r in rows if r["variant"] == variant and r["format"] == fmt)

    eager, int8, fp32 = row("fp32-d00", "torch-eager"), row("int8-d00", "onnx-int8"), row("fp32-d00", "onnx")
    return {"dataset": name, "train_s": train_s, "export_s": export_s, "rows": rows,
            "int8_ort_speedup_vs_torch_eager": eager["latency_s"] / int8["latency_s"],
            "int8_size_ratio_vs_fp32": int8["size_bytes"] / fp32["size_bytes"],
            "int8_accuracy_loss_pts": 100 * (eager["accuracy"] - int8["accuracy"])}


def _verdict(key: str, value: float | None) -> str:
    if value is None:
        return "not measured"
    op, goal = GOALS[key]
    ok = value >= goal if op == ">=" else value <= goal
    return f"{'✔' if ok else '✘'} (goal {op} {goal:g})"


def main(quick: bool = False, results_dir: Path = RESULTS) -> dict[str, Any]:
    datasets = ["digits"] if quick else ["digits", "basic_motions", "fsdd"]
    epochs, calls = (2, 200) if quick else (30, 2000)
    per: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in datasets:
            try:
                print(f"{name}: training ({epochs} epochs), exporting every format, timing ...", flush=True)
                per.append(bench_dataset(name, epochs, calls, Path(tmp)))
            except DatasetError as e:
                print(f"{name}: skipped ({e})")
    out: dict[str, Any] = {
        "int8_ort_speedup_vs_torch_eager": min(d["int8_ort_speedup_vs_torch_eager"] for d in per),
        "int8_size_ratio_vs_fp32": max(d["int8_size_ratio_vs_fp32"] for d in per),
        "int8_accuracy_loss_pts": max(d["int8_accuracy_loss_pts"] for d in per),
        "datasets": per,
    }
    if quick:
        out["edge_install_size_ratio"] = None  # a fresh install is a minute of pip: full runs only
    else:
        print("measuring an edge-only install (fresh venv, pip install trickle[edge]) ...", flush=True)
        out.update(edge_install_size())
    out["goals"] = {k: f"{op} {goal:g}" for k, (op, goal) in GOALS.items()}
    out["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                      "torch_threads": torch.get_num_threads()}
    out["quick"] = quick
    for d in per:
        print(f"\n{d['dataset']}")
        table = [(r["variant"], r["format"], r["runtime"], f"{r['latency_s'] * 1e6:.1f}",
                  f"{r['size_bytes'] / 1e3:.1f}" if r["size_bytes"] is not None else "", f"{r['accuracy']:.3f}")
                 for r in d["rows"]]
        headers = ["variant", "format", "runtime", "latency µs", "size KB", "acc"]
        print(textwrap.indent(console_table(table, headers=headers, align="lllrrr"), "  "))
    goals = [(key, f"{out[key] if out[key] is not None else float('nan'):.4g}", _verdict(key, out[key])) for key in GOALS]
    print("\n" + console_table(goals, headers=["metric", "measured", "verdict"], align="lrl"))
    path = results_dir / ("export-quick.json" if quick else "export.json")
    results_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}")
    return out
