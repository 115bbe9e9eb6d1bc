"""`trickle demo`, the README's main job, runs end to end and the server keeps every result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_trickle_demo_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    cmd = [sys.executable, "-m", "trickle.cli", "demo", "--out", str(out), "--nodes", "3", "--hours", "8", "--epochs", "1",
           "--no-plots"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "demo.json").read_text())
    assert summary["results_simulated"] > 100 and summary["lost"] == 0
    assert summary["results_stored"] == summary["results_simulated"]
    assert (out / "simulation" / "report.md").exists() and (out / "server" / "trickle.sqlite").exists()
    assert "report:" in proc.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)  # reuses the model; keys make it idempotent
    assert again.returncode == 0 and "reusing" in again.stdout
    assert json.loads((out / "demo.json").read_text())["results_stored"] == summary["results_simulated"]
