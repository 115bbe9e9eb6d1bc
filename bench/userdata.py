"""How fast a bad data set is told: every one-line data error ``trickle train nexume --dataset F``
gives, timed as a user meets it (a fresh process, wall clock), and where that time goes.

    trickle bench userdata            # writes bench/results/userdata.json

Each case is one of issue 48's probes (and the older ones of issue 33) written to a temporary
folder; each is run ``REPEATS`` times, interleaved, and its median kept. Keys:

- userdata_error_seconds_max: the slowest case's median wall time (goal <= 2 s; 386fc45: >= 15 s,
  nearly all of it importing torch, which is now imported only once the data are known good);
- userdata_error_cpu_seconds_max: the same in the child's CPU time (user + system), which a busy
  machine stretches less than wall time;
- per_case: each case's median wall and CPU seconds and the line it printed.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from edge.core.files import write_atomic
from edge.core.tables import markdown_table

RESULTS = Path(__file__).parent / "results"
REPEATS = 5
GOALS = {"userdata_error_seconds_max": ("<=", 2.0)}


def _wide(n: int = 60, length: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    table = pd.DataFrame(rng.standard_normal((n, length)).round(4), columns=[f"s{i}" for i in range(length)])
    table["label"] = ["a", "b", "c"] * (n // 3)
    return table


def _long(clock: str = "elapsed") -> pd.DataFrame:
    rows = [{"walk": f"w{i}", clock: 0.02 * t, "ax": np.sin(t + i), "activity": "run" if i % 2 else "walk"}
            for i in range(20) for t in range(30)]
    return pd.DataFrame(rows).sample(frac=1, random_state=0)


def _csv(table: pd.DataFrame, **kw: Any) -> Callable[[Path], Path]:
    def write(path: Path) -> Path:
        table.to_csv(path.with_suffix(".csv"), index=False, **kw)
        return path.with_suffix(".csv")
    return write


def _npz(**arrays: np.ndarray) -> Callable[[Path], Path]:
    def write(path: Path) -> Path:
        np.savez(path.with_suffix(".npz"), **arrays)  # type: ignore[arg-type]
        return path.with_suffix(".npz")
    return write


def _cases() -> dict[str, tuple[Callable[[Path], Path], list[str]]]:
    """name -> (write the file, extra options)."""
    inf = _wide().astype(object)
    inf.loc[7, "s3"] = np.inf
    text = _wide().astype(object)
    text.loc[9, "s5"] = "oops"
    rng = np.random.default_rng(1)
    ragged = rng.standard_normal((30, 20))
    ragged[:, 15:] = np.nan
    return {
        "inf_cell": (_csv(inf), []),
        "text_cell": (_csv(text), []),
        "unknown_label_column": (_csv(_wide()), ["--label-column", "kind"]),
        "long_table_clock_not_named": (_csv(_long()), ["--label-column", "activity", "--id-column", "walk"]),
        "long_table_read_as_wide": (_csv(_long("time")), ["--label-column", "activity"]),
        "class_only_in_test_split": (_npz(X=rng.standard_normal((20, 16)), y=np.arange(20) % 2,
                                          X_test=rng.standard_normal((9, 16)), y_test=np.arange(9) % 3), []),
        "nan_padded_without_pad": (_npz(X=ragged, y=np.arange(30) % 2), []),
        "missing_file": (lambda p: p / "nowhere.csv", []),
    }


def _run_once(path: Path, extra: list[str], out: Path) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "trickle", "train", "nexume", "--dataset", str(path), *extra,
                           "--epochs", "1", "--no-progress", "--out", str(out)], capture_output=True, text=True,
                          timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = proc.stderr.strip().splitlines()
    if proc.returncode != 1 or len(lines) != 1:
        raise RuntimeError(f"{path.name}: expected one error line and exit 1, got {proc.returncode}: {proc.stderr[-500:]}")
    return wall, cpu, lines[0]


def main(quick: bool = False, results_dir: Path = RESULTS) -> dict[str, Any]:
    repeats = 2 if quick else REPEATS
    cases = _cases()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    lines: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = {name: write(Path(tmp) / name) for name, (write, _) in cases.items()}
        for _ in range(repeats):  # interleaved: a busy moment falls on every case alike
            for name, (_, extra) in cases.items():
                wall, cpu, line = _run_once(files[name], extra, Path(tmp) / "out")
                times[name].append((wall, cpu))
                lines[name] = line.replace(tmp, "TMP")
    per_case: dict[str, dict[str, Any]] = {
        name: {"wall_s_median": statistics.median(w for w, _ in t), "cpu_s_median": statistics.median(c for _, c in t),
               "line": lines[name]} for name, t in times.items()}
    out: dict[str, Any] = {
        "userdata_error_seconds_max": max(float(c["wall_s_median"]) for c in per_case.values()),
        "userdata_error_cpu_seconds_max": max(float(c["cpu_s_median"]) for c in per_case.values()),
        "per_case": per_case, "repeats": repeats, "quick": quick,
        "goals": {k: f"{op} {g}" for k, (op, g) in GOALS.items()},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    rows = [(name, f"{c['wall_s_median']:.2f}", f"{c['cpu_s_median']:.2f}") for name, c in per_case.items()]
    print(markdown_table(["case", "wall s (median)", "CPU s (median)"], rows, align="lrr"))
    met = out["userdata_error_seconds_max"] <= GOALS["userdata_error_seconds_max"][1]
    print(f"\nuserdata_error_seconds_max {out['userdata_error_seconds_max']:.2f} (goal <= 2): {'met' if met else 'NOT met'}")
    suffix = "-quick" if quick else ""
    write_atomic(results_dir / f"userdata{suffix}.json", json.dumps(out, indent=1, sort_keys=True) + "\n")
    return out
