"""The user's own data: every source format reads into a training task, bad data sets get one line,
and a user-style table goes through train → export → flash (host) → simulate from the command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile

from models.data.base import DatasetError
from models.data.userdata import UserData, load_user
from tests.helpers import trickle


def write_audio(root: Path, rates: tuple[int, int] = (8000, 8000), per_class: int = 8) -> Path:
    """Two labels of tones, each in its own sub-folder, lengths varying."""
    rng = np.random.default_rng(0)
    for (label, f0), rate in zip((("high", 900.0), ("low", 250.0)), rates):
        (root / label).mkdir(parents=True)
        for k in range(per_class):
            t = np.arange(int(rate * (0.4 + 0.05 * k))) / rate
            wave = 0.5 * np.sin(2 * np.pi * f0 * t) + 0.01 * rng.standard_normal(len(t))
            soundfile.write(root / label / f"{k}.{'flac' if k % 2 else 'wav'}", wave, rate)
    return root


def wide_table(path: Path, n: int = 60, length: int = 24) -> Path:
    """A wide table: one row per example, a sine whose frequency is the class, plus noise."""
    rng = np.random.default_rng(1)
    labels = np.array(["slow", "fast", "still"] * (n // 3))
    freq = {"slow": 1.0, "fast": 3.0, "still": 0.0}
    t = np.arange(length) / length
    rows = np.stack([np.sin(2 * np.pi * freq[label] * t) + 0.1 * rng.standard_normal(length) for label in labels])
    table = pd.DataFrame(rows.astype(np.float32), columns=[f"s{i}" for i in range(length)])
    table["label"] = labels
    table.to_csv(path, index=False)
    return path


def test_an_audio_folder_becomes_mfccs_of_the_longest_recording(tmp_path: Path) -> None:
    data = load_user(str(write_audio(tmp_path / "clips")))
    assert data.labels == ("high", "low") and data.name == "clips"
    mfcc = data.preprocessing["steps"][0]
    assert mfcc["op"] == "mfcc" and mfcc["sample_rate_hz"] == 8000 and mfcc["duration_s"] == pytest.approx(0.75)
    assert data.x_train.shape[1] == 13 and len(data.y_train) + len(data.y_test) == 16
    assert set(data.y_test.tolist()) == {0, 1}  # stratified
    # standardized per coefficient with the training split's statistics
    assert np.allclose(data.x_train.mean(axis=(0, 2)), 0, atol=1e-4)


def test_tables_wide_and_long_and_npz_and_ucr(tmp_path: Path) -> None:
    wide = load_user(str(wide_table(tmp_path / "wide.csv")))
    assert wide.x_train.shape[1:] == (1, 24) and wide.labels == ("fast", "slow", "still")
    assert wide.preprocessing["raw"] == {"shape": [1, 24], "dtype": "float32"}
    again = load_user(str(tmp_path / "wide.csv"))
    assert np.array_equal(again.x_test, wide.x_test)  # the split is seeded
    other = load_user(str(tmp_path / "wide.csv"), UserData(seed=1))
    assert not np.array_equal(other.y_test, wide.y_test)

    rows = [{"walk": i, "t": 29 - t, "ax": float(t), "ay": float(i), "activity": "a" if i % 2 else "b"}
            for i in range(12) for t in range(30)]
    pd.DataFrame(rows).to_parquet(tmp_path / "long.parquet")
    long = load_user(str(tmp_path / "long.parquet"), UserData(label_column="activity", id_column="walk",
                                                               time_column="t"))
    assert long.x_train.shape[1:] == (2, 30)
    raw = long.raw_test
    assert raw is not None and np.array_equal(raw[0, 0], np.arange(29, -1, -1))  # rows ordered by t

    rng = np.random.default_rng(2)
    np.savez(tmp_path / "xy.npz", X=rng.standard_normal((20, 3, 8)), y=np.repeat([5, 7], 10),
             X_test=rng.standard_normal((6, 3, 8)), y_test=np.repeat([5, 7], 3))
    npz = load_user(str(tmp_path / "xy.npz"))
    assert npz.labels == ("5", "7") and len(npz.y_test) == 6  # the file's own test split is kept

    gun = load_user("ucr:GunPoint")
    assert gun.x_train.shape == (50, 1, 150) and gun.x_test.shape == (150, 1, 150)


@pytest.mark.parametrize(("make", "opts", "message"), [
    (lambda p: wide_table(p / "t.csv"), UserData(label_column="activity"),
     r"no label column 'activity' \(columns: \['s0',"),
    (lambda p: (np.savez(p / "one.npz", X=np.ones((10, 4)), y=np.zeros(10)), p / "one.npz")[1], None,
     r"one class only \(0.0\)"),
    (lambda p: (np.savez(p / "few.npz", X=np.ones((12, 4)), y=np.array([0] * 9 + [1] * 3)), p / "few.npz")[1], None,
     r"class '1' has 3 example\(s\); at least 5 per class"),
    (lambda p: write_audio(p / "mixed", rates=(8000, 16000)), None,
     r"the sample rate differs between files \(0.wav: 8000 Hz, 0.wav: 16000 Hz\)"),
    (lambda p: Path("ucr:JapaneseVowels"), None, r"ragged series \(lengths 7 to 29\); pass --pad"),
    (lambda p: Path("ucr:Coffee"), None, r"sktime ships no offline copy"),
    (lambda p: (p / "x.json").write_text("{}") and p / "x.json", None, r"a \.json file; expected a folder of audio"),
])
def test_bad_data_sets_get_one_line(tmp_path: Path, make, opts: UserData | None, message: str) -> None:  # type: ignore[no-untyped-def]
    spec = make(tmp_path)
    with pytest.raises(DatasetError, match=message):
        load_user(str(spec), opts)


def test_the_command_line_trains_exports_flashes_and_simulates_a_users_table(tmp_path: Path) -> None:
    table = wide_table(tmp_path / "vibration.csv", n=90)
    out = tmp_path / "train"
    proc = trickle("train", "nexume", "--dataset", str(table), "--epochs", "4", "--out", str(out), "--no-progress",
                   "--set", 'harvest_scenario="rf_powercast"')
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "vibration" and max(v["accuracy"] for v in summary["variants"]) > 0.6

    bundle = tmp_path / "bundle"
    proc = trickle("export", str(out / "checkpoint.pt"), "--out", str(bundle), "--formats", "onnx-int8")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["task"] == "vibration" and manifest["labels"] == ["fast", "slow", "still"]

    if shutil.which("cc") or shutil.which("gcc"):
        proc = trickle("flash", str(bundle), "--board", "host", "--out", str(tmp_path / "fw"), "--vectors", "5")
        assert proc.returncode == 0, proc.stderr
        assert "bit-exact with onnxruntime" in proc.stdout

    # raw samples as the device reads them: rows of the table, labels as class indices
    frame = pd.read_csv(table)
    samples = tmp_path / "samples.npz"
    index = {label: i for i, label in enumerate(manifest["labels"])}
    np.savez(samples, x=frame.drop(columns="label").to_numpy(np.float32)[:, None, :],
             y=np.array([index[v] for v in frame["label"]]))
    proc = trickle("simulate", "--scenario", "rf_powercast", "--bundle", str(bundle), "--samples", str(samples),
                   "--nodes", "2", "--duration-s", "600", "--out", str(tmp_path / "sim"), "--no-progress", "--no-plots")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "sim" / "results.json").read_text())
    assert result["summary"]["accuracy_within_deadline"] > 0


def test_the_command_line_names_a_bad_data_set_in_one_line(tmp_path: Path) -> None:
    proc = trickle("train", "nexume", "--dataset", str(wide_table(tmp_path / "t.csv")), "--label-column", "kind",
                   "--epochs", "1", "--no-progress", "--out", str(tmp_path / "o"))
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("trickle train: error: ") and len(proc.stderr.strip().splitlines()) == 1
    assert "no label column 'kind'" in proc.stderr
