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
     r"no label column 'activity' \(columns: 's0', 's1', 's2', 's3', 's4' and 20 more\)"),
    (lambda p: (np.savez(p / "one.npz", X=np.ones((10, 4)), y=np.zeros(10)), p / "one.npz")[1], None,
     r"one class only \(0\)"),
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


def probe_table(path: Path, n: int = 48, length: int = 251) -> pd.DataFrame:
    """Issue 33's probe: a wide table of ``length`` samples per row and string labels in 'klass'."""
    rng = np.random.default_rng(3)
    table = pd.DataFrame(rng.standard_normal((n, length)).round(3), columns=[f"t{i}" for i in range(length)])
    table["klass"] = np.array(["ant", "bee", "cat"] * (n // 3))
    return table.astype(object)


def long_probe(shuffled: bool = True) -> pd.DataFrame:
    rows = [{"walk": i, "time": t, "ax": float(t) + i, "activity": "a" if i % 2 else "b"} for i in range(12)
            for t in range(30)]
    table = pd.DataFrame(rows)
    return table.sample(frac=1, random_state=0).reset_index(drop=True) if shuffled else table


def _edit(path: Path, change) -> Path:  # type: ignore[no-untyped-def]
    table = probe_table(path)
    change(table)
    table.to_csv(path, index=False)
    return path


@pytest.mark.parametrize(("make", "opts", "message"), [
    # one non-numeric cell dropped column t5 from every series (465309f: shape (48, 1, 250))
    (lambda p: _edit(p / "a.csv", lambda t: t.__setitem__("t5", ["err" if i == 7 else v for i, v in enumerate(t["t5"])])),
     UserData(label_column="klass"), r"a\.csv: row 8 \(line 9\), column 't5': 'err' is not a number"),
    # six empty labels became a fourth class 'nan'
    (lambda p: _edit(p / "b.csv", lambda t: t.__setitem__("klass", [None if i in (3, 9, 11, 20, 30, 40) else v
                                                                  for i, v in enumerate(t["klass"])])),
     UserData(label_column="klass"), r"6 empty label\(s\) \(row 4 \(line 5\), row 10 \(line 11\), row 12 \(line 13\) and "
                                     r"3 more\); fill them in, or pass --drop-missing-labels"),
    # a row missing its last cell: "ragged series (lengths 250 to 251)", no row named
    (lambda p: _edit(p / "c.csv", lambda t: t.__setitem__("t250", [None if i == 12 else v for i, v in enumerate(t["t250"])])),
     UserData(label_column="klass"), r"row 13 \(line 14\) has 250 value\(s\), empty from column 't250', where 47 row\(s\) "
                                     r"have 251 .*--fill"),
    # a gap inside a row
    (lambda p: _edit(p / "d.csv", lambda t: t.__setitem__("t100", [None if i == 2 else v for i, v in enumerate(t["t100"])])),
     UserData(label_column="klass"), r"row 3 \(line 4\), column 't100': an empty cell before a value"),
    # a long table without --time-column took its numeric time column as a channel, rows in file order
    (lambda p: (long_probe().to_csv(p / "l.csv", index=False), p / "l.csv")[1],
     UserData(label_column="activity", id_column="walk"), r"column 'time' looks like time: name it with --time-column"),
    # an empty cell in a long table names its row and column
    (lambda p: (long_probe().assign(ax=lambda t: t["ax"].where(t.index != 5)).to_csv(p / "m.csv", index=False),
                p / "m.csv")[1],
     UserData(label_column="activity", id_column="walk", time_column="time"), r"row 6 \(line 7\), column 'ax' \(walk = \d+\)"),
    # an unknown label column listed all 252 names on one line
    (lambda p: _edit(p / "e.csv", lambda t: None), UserData(label_column="class"),
     r"no label column 'class' \(columns: 'klass', 't0', 't1', 't2', 't3' and 247 more\); name it with --label-column$"),
    (lambda p: (np.savez(p / "nan.npz", X=np.ones((12, 4)), y=np.array([0.0, 1.0, np.nan] * 4)), p / "nan.npz")[1], None,
     r"4 empty label\(s\) \(y\[2\], y\[5\], y\[8\] and 1 more\)"),
])
def test_data_is_never_lost_without_a_word(tmp_path: Path, make, opts: UserData | None, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DatasetError, match=message):
        load_user(str(make(tmp_path)), opts)


def test_the_options_that_keep_going_say_what_they_did(tmp_path: Path) -> None:
    table = probe_table(tmp_path)
    table.loc[[3, 9, 11, 20, 30, 40], "klass"] = None
    table.loc[12, "t250"] = None
    table.loc[13, "t100"] = None
    table["subject"] = "alice"
    table.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(DatasetError, match=r"column 'subject': 'alice' is not a number"):
        load_user(str(tmp_path / "t.csv"), UserData(label_column="klass", drop_missing_labels=True, fill="linear"))
    data = load_user(str(tmp_path / "t.csv"), UserData(label_column="klass", drop_missing_labels=True, fill="linear",
                                                       ignore_columns=("subject",)))
    assert len(data.y_train) + len(data.y_test) == 42 and data.x_train.shape[1:] == (1, 251)
    assert data.labels == ("ant", "bee", "cat")
    description = data.preprocessing["description"]
    assert "6 example(s) without a label left out" in description and "2 empty cell(s) filled (linear)" in description
    assert data.raw_test is not None and np.isfinite(data.raw_test).all()

    long = long_probe()
    long.loc[long.time == 3 + long.walk, "ax"] = None  # one empty cell in every walk
    long.to_csv(tmp_path / "l.csv", index=False)
    walks = load_user(str(tmp_path / "l.csv"), UserData(label_column="activity", id_column="walk", time_column="time",
                                                        fill="linear", min_per_class=2))
    assert "12 empty cell(s) filled (linear)" in walks.preprocessing["description"]
    ordered = long_probe(shuffled=False)  # ax = time + walk: linear filling restores it exactly
    assert walks.raw_test is not None
    assert {tuple(r[0]) for r in walks.raw_test} <= {tuple(ordered[ordered.walk == w].ax) for w in range(12)}


def test_a_checkpoint_finds_its_data_from_anywhere_and_refuses_changed_data(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    table = wide_table(tmp_path / "work" / "vib.csv", n=45, length=16)
    proc = trickle("train", "nexume", "--dataset", "vib.csv", "--epochs", "1", "--out", "run", "--no-progress",
                   "--set", 'harvest_scenario="rf_powercast"', cwd=tmp_path / "work")
    assert proc.returncode == 0, proc.stderr
    checkpoint = tmp_path / "work" / "run" / "checkpoint.pt"
    # 465309f: "dataset 'vib.csv': no such file or folder" from any other directory
    proc = trickle("export", str(checkpoint), "--out", str(tmp_path / "b1"), "--formats", "onnx", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr

    moved = tmp_path / "moved.csv"
    table.rename(moved)
    proc = trickle("export", str(checkpoint), "--out", str(tmp_path / "b2"), "--formats", "onnx", cwd=tmp_path)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert f"the path recorded in {checkpoint} at training time" in proc.stderr and "--dataset" in proc.stderr
    proc = trickle("export", str(checkpoint), "--out", str(tmp_path / "b2"), "--formats", "onnx", "--dataset",
                   str(moved), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    one = json.loads((tmp_path / "b1" / "manifest.json").read_text())
    two = json.loads((tmp_path / "b2" / "manifest.json").read_text())
    assert one["variants"] == two["variants"]  # the same split, the same parity figures

    frame = pd.read_csv(moved)
    frame.loc[0, "s0"] += 1.0
    frame.to_csv(moved, index=False)
    proc = trickle("export", str(checkpoint), "--out", str(tmp_path / "b3"), "--formats", "onnx", "--dataset",
                   str(moved), cwd=tmp_path)
    assert proc.returncode == 1 and "its content differs from the data" in proc.stderr
    assert not (tmp_path / "b3").exists()


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
    # the same samples with the table's own string labels (465309f: accuracy 0.000, no warning)
    np.savez(tmp_path / "named.npz", x=np.load(samples)["x"], y=frame["label"].to_numpy().astype(str))
    proc = trickle("simulate", "--scenario", "rf_powercast", "--bundle", str(bundle), "--samples",
                   str(tmp_path / "named.npz"), "--nodes", "2", "--duration-s", "600", "--out", str(tmp_path / "sim2"),
                   "--no-progress", "--no-plots")
    assert proc.returncode == 0, proc.stderr
    named = json.loads((tmp_path / "sim2" / "results.json").read_text())
    assert named["summary"]["accuracy_within_deadline"] == result["summary"]["accuracy_within_deadline"]
    np.savez(tmp_path / "wrong.npz", x=np.load(samples)["x"], y=np.array(["slow", "walk"] * 45))
    proc = trickle("simulate", "--scenario", "rf_powercast", "--bundle", str(bundle), "--samples",
                   str(tmp_path / "wrong.npz"), "--nodes", "2", "--duration-s", "600", "--out", str(tmp_path / "sim3"),
                   "--no-progress", "--no-plots")
    assert proc.returncode == 1 and "'walk' not among the bundle's labels (fast, slow, still)" in proc.stderr


def test_the_command_line_names_a_bad_data_set_in_one_line(tmp_path: Path) -> None:
    proc = trickle("train", "nexume", "--dataset", str(wide_table(tmp_path / "t.csv")), "--label-column", "kind",
                   "--epochs", "1", "--no-progress", "--out", str(tmp_path / "o"))
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("trickle train: error: ") and len(proc.stderr.strip().splitlines()) == 1
    assert "no label column 'kind'" in proc.stderr
