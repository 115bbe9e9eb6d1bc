"""The `trickle` command as a user runs it: exit codes, one-line errors, outputs, help."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import trickle

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


def test_bad_config_is_one_line_exit_1(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text("[storage]\ncapacitance_f = -1\n")
    proc = trickle("simulate", "--scenario", str(tmp_path / "bad.toml"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1  # a TrickleError; argparse keeps 2 for usage errors
    assert proc.stderr.strip() == "trickle simulate: error: storage.capacitance_f = -1: should be greater than 0"
    assert not (tmp_path / "out").exists()


def test_missing_data_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('[harvester]\nkind = "nrel"\npath = "missing/nrel.txt"\n')
    proc = trickle("simulate", "--scenario", str(tmp_path / "bad.toml"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1
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


HELP_VERBS = [["simulate"], ["train"], ["export"], ["flash"], ["keygen"], ["edge"], ["edge", "infer"], ["edge", "run"],
              ["serve"], ["demo"], ["bench"], []]


@pytest.mark.parametrize("verb", HELP_VERBS, ids=lambda v: " ".join(v) or "trickle")
def test_every_help_answers_in_under_a_second(verb: list[str]) -> None:
    # the best of three runs: one slow start on a loaded CI machine is not the verb's fault
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        proc = trickle(*verb, "--help")
        times.append(time.perf_counter() - t0)
        assert proc.returncode == 0 and "usage: trickle" in proc.stdout, proc.stderr
        if times[-1] < 1.0:
            break
    assert min(times) < 1.0, f"trickle {' '.join(verb)} --help took {min(times):.2f} s"


@pytest.mark.parametrize("verb", [v for v in HELP_VERBS if v], ids=lambda v: " ".join(v))
def test_every_option_has_help(verb: list[str]) -> None:
    import argparse

    from trickle.cli import _parser

    parser = _parser(verb)
    for name in verb:  # down to the verb's (or action's) own parser
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    undocumented = [a.dest for a in parser._actions if a.help is None and not isinstance(a, argparse._HelpAction)]
    assert not undocumented, f"trickle {' '.join(verb)}: no help for {undocumented}"


def test_the_dataset_and_method_choices_match_the_models() -> None:
    from typing import get_args

    from models import cli
    from models.data import datasets
    from models.nexume import config as nexume

    assert cli.DATASETS == datasets.DATASETS and get_args(nexume.Method) == cli.METHODS


def test_flash_needs_neither_the_training_data_nor_torch() -> None:
    # trickle flash compiles the bundle's own test vectors in: nothing from models/ or torch is loaded
    code = ("import sys, export.cli, export.firmware.flash, export.firmware.cgen, edge.classify.runtime; "
            "assert not {'torch', 'models.data.datasets', 'sklearn', 'sktime'} & set(sys.modules), sorted(sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_simulator_never_imports_torch() -> None:
    code = "import sys, simulator.fleet, simulator.report, simulator.cli; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


@pytest.mark.needs_torch
def test_train_writes_checkpoint_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "train"
    proc = trickle("train", "nexume", "--dataset", "basic_motions", "--epochs", "2", "--out", str(out),
                   "--set", 'harvest_scenario="rf_powercast"', "--no-progress")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["variants"]) == 9 and summary["config"]["method"] == "nexume"
    assert (out / "checkpoint.pt").stat().st_size > 0 and re.search(r"^\| +bits \|", (out / "summary.md").read_text(), re.M)

    from models.data.datasets import load
    from models.nexume.checkpoint import load_checkpoint
    from models.nexume.train import accuracy

    model, payload = load_checkpoint(out / "checkpoint.pt")
    data = load("basic_motions")
    v = payload["variants"][0]
    assert accuracy(model, data.x_test, data.y_test, v["bits"], v["drop"]) == v["accuracy"]


@pytest.mark.needs_torch
def test_train_bad_config_is_one_line() -> None:
    proc = trickle("train", "nexume", "--set", "d_max=2")
    assert proc.returncode == 1
    assert proc.stderr.strip() == "trickle train: error: d_max = 2: should be less than 1"


@pytest.mark.needs_torch
def test_keygen_then_export_a_signed_bundle(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    assert trickle("keygen", str(keys)).returncode == 0
    again = trickle("keygen", str(keys))
    assert again.returncode == 1 and "pass --force" in again.stderr
    ckpt = tmp_path / "train"
    assert trickle("train", "nexume", "--dataset", "basic_motions", "--method", "qat8", "--epochs", "2",
                   "--out", str(ckpt), "--no-progress").returncode == 0
    proc = trickle("export", str(ckpt / "checkpoint.pt"), "--out", str(tmp_path / "b.tar"), "--tar",
                   "--key", str(keys / "signing.key"), "--formats", "onnx,onnx-int8")
    assert proc.returncode == 0, proc.stderr
    from edge.contract.bundle import load_public_key, read_bundle

    bundle = read_bundle(tmp_path / "b.tar", [load_public_key(keys / "signing.pub")])
    assert sorted(bundle.files) == ["fp32-d00.onnx", "int8-d00.onnx", "test_vectors.npz"]
    bad = trickle("export", str(ckpt / "checkpoint.pt"), "--out", str(tmp_path / "c"), "--formats", "pte,coreml")
    assert bad.returncode == 1
    assert bad.stderr.strip() == "trickle export: error: --formats = 'pte,coreml': must be among onnx,onnx-int8,pte,tflite"
    usage = trickle("export", str(ckpt / "checkpoint.pt"))  # --out missing: argparse's usage error
    assert usage.returncode == 2 and "the following arguments are required: --out" in usage.stderr
