"""The `trickle` command as a user runs it: exit codes, one-line errors, outputs, help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TINY = """
name = "tiny"
[run]
duration_s = 600
workers = 1
[harvester]
kind = "constant"
power_w = 0.002
[storage]
capacitance_f = 0.0022
[workload]
sense_period_s = 10
[nodes]
count = 2
"""


def trickle(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trickle", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_simulate_writes_results(tmp_path: Path) -> None:
    (tmp_path / "tiny.toml").write_text(TINY)
    out = tmp_path / "out"
    proc = trickle("simulate", "--scenario", str(tmp_path / "tiny.toml"), "--out", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "power failures" in proc.stdout
    doc = json.loads((out / "results.json").read_text())
    assert doc["scenario"]["name"] == "tiny" and doc["summary"]["nodes"] == 2
    assert (out / "plots" / "voltage.png").exists()


def test_overrides_from_flags(tmp_path: Path) -> None:
    (tmp_path / "tiny.toml").write_text(TINY)
    out = tmp_path / "out"
    proc = trickle("simulate", "--scenario", str(tmp_path / "tiny.toml"), "--out", str(out), "--no-plots",
                   "--nodes", "3", "--seed", "9", "--set", "workload.policy=\"jit\"", "--set", "storage.capacitance_f=0.0047")
    assert proc.returncode == 0, proc.stderr
    sc = json.loads((out / "results.json").read_text())["scenario"]
    assert (sc["nodes"]["count"], sc["run"]["seed"], sc["workload"]["policy"], sc["storage"]["capacitance_f"]) == (
        3, 9, "jit", 0.0047)


def test_bad_config_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text("[storage]\ncapacitance_f = -1\n")
    proc = trickle("simulate", "--scenario", str(tmp_path / "bad.toml"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == "trickle simulate: error: storage.capacitance_f = -1: should be greater than 0"
    assert not (tmp_path / "out").exists()


def test_missing_data_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('[harvester]\nkind = "nrel"\npath = "missing/nrel.txt"\n')
    proc = trickle("simulate", "--scenario", str(tmp_path / "bad.toml"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert "harvester.path: data file 'missing/nrel.txt' not found" in proc.stderr


def test_help_and_list() -> None:
    top = trickle("--help")
    assert top.returncode == 0 and "simulate" in top.stdout and "bench" in top.stdout
    sim = trickle("simulate", "--help")
    assert sim.returncode == 0 and "--scenario" in sim.stdout and "examples:" in sim.stdout
    listing = trickle("simulate", "--list")
    assert listing.returncode == 0 and "nrel_24h" in listing.stdout and "fleet_1000" in listing.stdout
    bench = trickle("bench", "--help")
    assert bench.returncode == 0 and "simulator" in bench.stdout


def test_simulator_never_imports_torch() -> None:
    code = "import sys, simulator.fleet, simulator.report, simulator.cli; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_train_writes_checkpoint_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "train"
    proc = trickle("train", "nexume", "--dataset", "basic_motions", "--epochs", "2", "--out", str(out),
                   "--set", 'harvest_scenario="rf_powercast"', "--no-progress")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["variants"]) == 9 and summary["config"]["method"] == "nexume"
    assert (out / "checkpoint.pt").stat().st_size > 0 and "| bits |" in (out / "summary.md").read_text()

    from models.checkpoint import load_checkpoint
    from models.datasets import load
    from models.nexume import accuracy

    model, payload = load_checkpoint(out / "checkpoint.pt")
    data = load("basic_motions")
    v = payload["variants"][0]
    assert accuracy(model, data.x_test, data.y_test, v["bits"], v["drop"]) == v["accuracy"]


def test_train_bad_config_is_one_line() -> None:
    proc = trickle("train", "nexume", "--set", "d_max=2")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "trickle train: error: d_max = 2: should be less than 1"


def test_keygen_then_export_a_signed_bundle(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    assert trickle("keygen", str(keys)).returncode == 0
    again = trickle("keygen", str(keys))
    assert again.returncode == 2 and "pass --force" in again.stderr
    ckpt = tmp_path / "train"
    assert trickle("train", "nexume", "--dataset", "basic_motions", "--method", "qat8", "--epochs", "2",
                   "--out", str(ckpt), "--no-progress").returncode == 0
    proc = trickle("export", str(ckpt / "checkpoint.pt"), "--out", str(tmp_path / "b.tar"), "--tar",
                   "--key", str(keys / "signing.key"), "--formats", "onnx,onnx-int8")
    assert proc.returncode == 0, proc.stderr
    from edge.bundle import load_public_key, read_bundle

    bundle = read_bundle(tmp_path / "b.tar", [load_public_key(keys / "signing.pub")])
    assert sorted(bundle.files) == ["fp32-d00.onnx", "int8-d00.onnx"]
    bad = trickle("export", str(ckpt / "checkpoint.pt"), "--out", str(tmp_path / "c"), "--formats", "pte,coreml")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "trickle export: error: --formats coreml: must be among onnx,onnx-int8,pte,tflite"
