"""``trickle train firmbound`` on the user's own data (issue 48): a CSV or an .npz becomes a
checkpoint, ``trickle export`` turns it into an early-decision bundle, and the edge runtime decides
with it as the trained classifier does; bad options are one line before torch is imported."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from edge.classify.early import early_decider
from edge.contract.bundle import read_bundle
from models.firmbound.checkpoint import load_checkpoint
from tests.helpers import SUBPROCESS_TIMEOUT_S
from trickle.cli import main

torch.set_num_threads(1)
LENGTH = 24
NAMES = ("walk", "run")


def _series(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, LENGTH) raw series far from standardized (offset 5, a channel a device reads as is) and labels."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    wave = np.sin(np.arange(LENGTH) / 3.0)
    return (rng.normal(0, 0.6, (n, LENGTH)) + np.where(y[:, None] == 1, wave, -wave) + 5.0).astype(np.float32), y


@pytest.fixture(scope="module")
def tiny_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wide table: a row per example, a column per sample and the label, as a spreadsheet writes it."""
    x, y = _series(60, 0)
    path = tmp_path_factory.mktemp("data") / "gait.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"t{i}" for i in range(LENGTH)] + ["label"])
        w.writerows([f"{v:.4f}" for v in row] + [NAMES[c]] for row, c in zip(x, y))
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


ROCKET = ("--features", "84", "--decision-points", "8", "--no-progress")


def test_a_csv_trains_exports_and_decides_on_the_edge_as_trained(tiny_csv: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: ``trickle train firmbound --dataset F`` was ``invalid choice: 'firmbound'``."""
    code, out, _ = _run(capsys, "train", "firmbound", "--dataset", str(tiny_csv), "--out", str(tmp_path / "run"),
                        *ROCKET, "--json")
    assert code == 0
    summary = json.loads(out)
    assert summary["labels"] == sorted(NAMES) and summary["n_train"] + summary["n_test"] == 60
    assert summary["cost_choice"] == "accurate, chosen by internal validation"  # the default: within 1 point
    assert summary["accuracy"] >= summary["full_length_accuracy"] - 0.1 and summary["mean_samples"] < LENGTH
    assert {p.name for p in (tmp_path / "run").iterdir()} == {"checkpoint.pt", "summary.json", "summary.md"}
    code, out, _ = _run(capsys, "export", str(tmp_path / "run" / "checkpoint.pt"), "--out", str(tmp_path / "bundle"))
    assert code == 0 and "12 the same as the trained classifier's" in out
    bundle = read_bundle(tmp_path / "bundle")
    assert bundle.manifest.early is not None and bundle.manifest.early.estimator == "rocket"
    assert bundle.manifest.labels == sorted(NAMES) and bundle.manifest.early.horizon == LENGTH
    # the edge runtime on raw samples (the loader's standardization undone: the bundle standardizes them)
    clf, _ = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    x, _ = _series(40, 7)
    tau, pred = clf.decisions(x[:, None, :])
    decider = early_decider(bundle)
    got = [decider.run(s[None, :]) for s in x]
    assert np.mean([d.t == t and d.label == p for d, t, p in zip(got, tau, pred)]) >= 0.95
    assert np.mean([d.t for d in got]) < LENGTH
    np.save(tmp_path / "series.npy", x[:1])
    proc = subprocess.run([sys.executable, "-m", "trickle", "edge", "infer", str(tmp_path / "bundle"),
                           str(tmp_path / "series.npy"), "--early", "--json"], capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout)
    assert line["samples"] == got[0].t and line["label"] == bundle.manifest.labels[got[0].label]
    # the same seed writes the same bytes
    assert _run(capsys, "train", "firmbound", "--dataset", str(tiny_csv), "--out", str(tmp_path / "again"),
                *ROCKET)[0] == 0
    for name in ("checkpoint.pt", "summary.json", "summary.md"):
        assert (tmp_path / "run" / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), name


def test_an_npz_keeps_its_test_split_and_the_tandem_exports_its_integer_rule(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    x, y = _series(64, 1)
    labels = np.array(NAMES)[y]
    np.savez(tmp_path / "gait.npz", X=x[:44], y=labels[:44], X_test=x[44:], y_test=labels[44:])
    code, out, _ = _run(capsys, "train", "firmbound", "--dataset", str(tmp_path / "gait.npz"), "--estimator", "tandem",
                        "--epochs", "5", "--cost", "0.05", "--out", str(tmp_path / "run"), "--no-progress", "--json")
    assert code == 0
    summary = json.loads(out)
    assert (summary["n_train"], summary["n_test"]) == (44, 20) and summary["cost_choice"] == "given"
    assert summary["cost"] == 0.05
    code, out, _ = _run(capsys, "export", str(tmp_path / "run" / "checkpoint.pt"), "--out", str(tmp_path / "b.tar"),
                        "--tar", "--json")
    assert code == 0 and json.loads(out)["decisions_checked"] == 16
    bundle = read_bundle(tmp_path / "b.tar")
    assert bundle.manifest.early is not None and bundle.manifest.early.integer is not None  # trickle flash runs it
    decision = early_decider(bundle, integer=True).run(x[50][None, :])
    assert 1 <= decision.t <= LENGTH


def test_a_nan_padded_variable_length_npz_trains_with_pad_and_keeps_its_split(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Series of 16 to 24 samples padded with NaN, as UCR ships them, with their own test split."""
    x, y = _series(60, 2)
    lengths = np.random.default_rng(3).integers(16, LENGTH + 1, 60)
    x[np.arange(LENGTH)[None, :] >= lengths[:, None]] = np.nan
    labels = np.array(NAMES)[y]
    np.savez(tmp_path / "var.npz", X=x[:40, None], y=labels[:40], X_test=x[40:, None], y_test=labels[40:])
    code, out, _ = _run(capsys, "train", "firmbound", "--dataset", str(tmp_path / "var.npz"), "--pad",
                        "--out", str(tmp_path / "run"), *ROCKET, "--json")
    assert code == 0
    summary = json.loads(out)
    assert (summary["n_train"], summary["n_test"], summary["length"]) == (40, 20, LENGTH)
    assert _run(capsys, "export", str(tmp_path / "run" / "checkpoint.pt"), "--out", str(tmp_path / "b"))[0] == 0


@pytest.mark.parametrize(("argv", "message"), [
    (("--cost", "fast"), "--cost = 'fast': must be accurate, auto or a positive number"),
    (("--cost", "-1"), "--cost = '-1': must be accurate, auto or a positive number"),
    (("--features", "10"), "--features = 10: must be 84 or more"),
    (("--epochs", "3"), "--epochs = 3: applies to --estimator tandem only"),
    (("--estimator", "tandem", "--features", "200"), "--features = 200: applies to --estimator rocket only"),
    (("--method", "qat8"), "--method = 'qat8': applies to trickle train nexume only"),
    (("--energy-per-sample-j", "1e-6"), "--energy-per-sample-j = 1e-06: needs --energy-per-sample-j and "
                                         "--joules-per-loss together"),
    (("--set", "lr=1"), "trickle train firmbound takes its options as flags"),
    (("--dataset", "digits"), "examples of shape [1, 8, 8]; a series is (channels, samples)"),
])
def test_a_bad_option_is_one_line_before_torch(argv: tuple[str, ...], message: str, tmp_path: Path) -> None:
    code = ("import sys; from trickle.cli import main; rc = main(sys.argv[1:]); "
            "print('torch imported' if 'torch' in sys.modules else 'no torch'); raise SystemExit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, "train", "firmbound", *argv, "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 1 and proc.stdout.strip() == "no torch", (proc.stdout, proc.stderr)
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "o").exists()


def test_an_audio_folder_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """MFCC frames of recordings are not what a node senses sample by sample."""
    import soundfile

    rng = np.random.default_rng(0)
    for label in ("yes", "no"):
        (tmp_path / "audio" / label).mkdir(parents=True)
        for i in range(6):
            soundfile.write(tmp_path / "audio" / label / f"{i}.wav", rng.normal(0, 0.1, 800).astype(np.float32), 8000)
    code, _, err = _run(capsys, "train", "firmbound", "--dataset", str(tmp_path / "audio"), "--out", str(tmp_path / "o"))
    assert code == 1 and "pre-processed by mfcc" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
