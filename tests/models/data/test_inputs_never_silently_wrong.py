"""Issue 48's probes of the user's own data, each tried as a user would at 386fc45, where every one
trained on without a word (or failed with the wrong advice): now one line naming file, row and
column, or the right result, and every one-line data error in well under 2 s (no torch)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from models.data.base import DatasetError
from models.data.userdata import UserData, load_user
from tests.helpers import trickle


def wide(n: int = 30, length: int = 12, seed: int = 0) -> pd.DataFrame:
    """A wide table: one row per example, three classes of sines."""
    rng = np.random.default_rng(seed)
    labels = np.array(["a", "b", "c"] * (n // 3))
    freq = {"a": 1.0, "b": 2.0, "c": 3.0}
    t = np.arange(length) / length
    rows = np.stack([np.sin(2 * np.pi * freq[k] * t) + 0.1 * rng.standard_normal(length) for k in labels])
    table = pd.DataFrame(rows.round(4), columns=[f"s{i}" for i in range(length)])
    table["label"] = labels
    return table


def walks(n: int = 12, steps: int = 16, clock: str = "elapsed") -> pd.DataFrame:
    """A long table, rows shuffled: each walk's ax rises with time, ay = a class-dependent sine, az gravity."""
    rng = np.random.default_rng(1)
    rows = [{"walk": f"w{i}", clock: round(0.02 * t, 2), "ax": float(t) + 0.1 * rng.standard_normal(),
             "ay": np.sin(t * (1 + i % 2)), "az": 9.81, "activity": "run" if i % 2 else "walk"}
            for i in range(n) for t in range(steps)]
    return pd.DataFrame(rows).sample(frac=1, random_state=0).reset_index(drop=True)


def test_an_infinite_cell_is_named(tmp_path: Path) -> None:
    table = wide()
    table.loc[6, "s3"] = np.inf
    table.to_csv(tmp_path / "inf.csv", index=False)  # pandas writes inf; 386fc45 trained to loss nan
    with pytest.raises(DatasetError, match=r"inf\.csv: row 7 \(line 8\), column 's3': inf is not a finite number"):
        load_user(str(tmp_path / "inf.csv"))
    x = np.ones((12, 20), dtype=np.float32)
    x[4, 7] = -np.inf
    np.savez(tmp_path / "inf.npz", X=x, y=np.arange(12) % 2)
    with pytest.raises(DatasetError, match=r"inf\.npz: X\[4, 0, 7\] is -inf; every value must be a finite number"):
        load_user(str(tmp_path / "inf.npz"))


def test_a_class_only_in_the_given_test_split_is_an_error(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "split.npz", X=rng.standard_normal((20, 16)), y=np.array([0, 1] * 10),
             X_test=rng.standard_normal((9, 16)), y_test=np.array([0, 1, 2] * 3))
    with pytest.raises(DatasetError, match=r"1 class\(es\) in the test split only: '2' \(3\); the model cannot learn"):
        load_user(str(tmp_path / "split.npz"), UserData(min_per_class=2))


def test_a_long_tables_clock_by_any_name_is_not_a_channel(tmp_path: Path) -> None:
    walks().to_csv(tmp_path / "walks.csv", index=False)
    opts = UserData(label_column="activity", id_column="walk", ignore_columns=())
    # 386fc45: 'elapsed' read as a fourth channel, rows in shuffled order
    with pytest.raises(DatasetError, match=r"column 'elapsed' looks like time \(distinct, evenly spaced values within "
                                           r"every 'walk'\): name it with --time-column"):
        load_user(str(tmp_path / "walks.csv"), opts)
    data = load_user(str(tmp_path / "walks.csv"), UserData(label_column="activity", id_column="walk",
                                                           time_column="elapsed", min_per_class=2))
    assert data.raw_test is not None and data.input_shape == (3, 16)
    ax = np.concatenate([data.raw_test[:, 0]])
    assert (np.diff(ax, axis=1) > 0).all()  # every example in time order


def test_a_constant_channel_is_centred_not_blown_up(tmp_path: Path) -> None:
    walks().to_csv(tmp_path / "walks.csv", index=False)
    data = load_user(str(tmp_path / "walks.csv"), UserData(label_column="activity", id_column="walk",
                                                           time_column="elapsed", min_per_class=2))
    step = data.preprocessing["steps"][-1]
    assert step["std"][2] == [1.0]  # 386fc45: 9.6e-06, so a device reading 9.80 fed the network -1,044
    assert abs((9.80 - step["mean"][2][0]) / step["std"][2][0]) < 0.02
    assert "channel(s) [2] constant in the training split: centred, not scaled" in data.preprocessing["description"]


def test_integer_labels_stay_integers_when_an_empty_one_is_dropped(tmp_path: Path) -> None:
    table = wide()
    table["label"] = table["label"].map({"a": 0, "b": 1, "c": 2}).astype(object)
    table.loc[4, "label"] = None
    table.to_csv(tmp_path / "ints.csv", index=False)
    data = load_user(str(tmp_path / "ints.csv"), UserData(drop_missing_labels=True, min_per_class=2))
    assert data.labels == ("0", "1", "2")  # 386fc45: '0.0', '1.0', '2.0' in the checkpoint and the bundle
    assert "1 example(s) without a label left out" in data.preprocessing["description"]


def test_a_european_spreadsheets_csv_is_read(tmp_path: Path) -> None:
    table = wide()
    text = table.to_csv(index=False, sep=";", decimal=",")
    assert "," in text.splitlines()[1]
    (tmp_path / "eu.csv").write_text(text)
    data = load_user(str(tmp_path / "eu.csv"))  # 386fc45: "no label column 'label' ...; name it with --label-column"
    plain = load_user(str(_written(table, tmp_path / "plain.csv")))
    np.testing.assert_array_equal(data.x_train, plain.x_train)
    assert "';'-separated, decimal ','" in data.preprocessing["description"]
    given = load_user(str(tmp_path / "eu.csv"), UserData(delimiter=";", decimal=","))
    np.testing.assert_array_equal(given.x_train, plain.x_train)
    with pytest.raises(DatasetError, match=r"'0,\d+' is not a number .*a decimal comma: pass --decimal ,"):
        load_user(str(tmp_path / "eu.csv"), UserData(delimiter=";", decimal="."))
    with pytest.raises(DatasetError, match=r"reads as a single column with ',' between fields: name its separator "
                                           r"with --delimiter"):
        load_user(str(tmp_path / "eu.csv"), UserData(delimiter=","))


def _written(table: pd.DataFrame, path: Path) -> Path:
    table.to_csv(path, index=False)
    return path


def test_a_long_table_read_as_wide_is_told_about_the_id_column(tmp_path: Path) -> None:
    table = walks(clock="time").drop(columns=["time"])
    table.to_csv(tmp_path / "long.csv", index=False)
    # 386fc45: "... a column that is not part of the series goes in --ignore-column"
    with pytest.raises(DatasetError, match=r"column 'walk': 'w\d+' is not a number .*example ids of a long table .*"
                                           r"--id-column"):
        load_user(str(tmp_path / "long.csv"), UserData(label_column="activity"))
    walks(clock="time").assign(walk=lambda t: t["walk"].str[1:].astype(int)).to_csv(tmp_path / "num.csv", index=False)
    with pytest.raises(DatasetError, match=r"column 'time' looks like time, which a wide table .* needs --id-column"):
        load_user(str(tmp_path / "num.csv"), UserData(label_column="activity"))


def test_nan_padded_series_and_a_given_split_are_kept(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((20, 30))
    x_test = rng.standard_normal((8, 25))  # UCR ships each split padded to its own longest
    for i in range(20):
        x[i, 20 + i % 10:] = np.nan
    x_test[3, 18:] = np.nan
    y, y_test = np.arange(20) % 2, np.arange(8) % 2
    np.savez(tmp_path / "ucr.npz", X=x, y=y, X_test=x_test, y_test=y_test)
    # 386fc45: "X holds NaN or infinity", no hint
    with pytest.raises(DatasetError, match=r"X: 20 series end in NaN \(X\[0\] from sample 20\): variable-length series "
                                           r"padded with NaN, as UCR/UEA ship them; pass --pad"):
        load_user(str(tmp_path / "ucr.npz"))
    data = load_user(str(tmp_path / "ucr.npz"), UserData(pad=True, min_per_class=2))
    assert data.input_shape == (1, 30) and len(data.y_test) == 8  # the file's own split, not 80/20
    assert data.raw_test is not None and (data.raw_test[3, 0, 18:] == 0).all() and np.isfinite(data.raw_test).all()
    x[5, 3] = np.nan
    np.savez(tmp_path / "hole.npz", X=x, y=y)
    with pytest.raises(DatasetError, match=r"X\[5, 0, 3\] is NaN, before the end of its series"):
        load_user(str(tmp_path / "hole.npz"), UserData(pad=True))


def test_a_tables_split_column_is_kept(tmp_path: Path) -> None:
    table = wide(n=30)
    table["split"] = ["test" if i % 5 == 0 else "train" for i in range(30)]
    table.to_csv(tmp_path / "s.csv", index=False)
    data = load_user(str(tmp_path / "s.csv"), UserData(split_column="split", min_per_class=2))
    assert len(data.y_test) == 6 and data.raw_test is not None
    np.testing.assert_allclose(data.raw_test[:, 0], table.loc[table.split == "test", "s0":"s11"].to_numpy(), rtol=1e-6)
    table.loc[7, "split"] = "validation"
    table.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(DatasetError, match=r"row 8 \(line 9\), column 'split' \(the split column\): 'validation'"):
        load_user(str(tmp_path / "bad.csv"), UserData(split_column="split"))


BAD = {
    "inf": lambda t: t.assign(s3=[np.inf if i == 2 else v for i, v in enumerate(t["s3"])]),
    "label": lambda t: t,
    "text": lambda t: t.assign(s5=["oops" if i == 9 else v for i, v in enumerate(t["s5"])]),
}


PROBE = """
import sys
from trickle.cli import main
status = main(sys.argv[1:])
print("torch imported" if "torch" in sys.modules else "no torch", status)
"""


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_one_line_data_error_comes_in_well_under_two_seconds(tmp_path: Path, case: str) -> None:
    """The time is the child's CPU time (user + system), which a busy machine does not stretch as it does
    wall time; and the cause of 386fc45's 15 s, importing torch, is checked by name."""
    path = _written(BAD[case](wide()), tmp_path / f"{case}.csv")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", PROBE, "train", "nexume", "--dataset", str(path), "--label-column",
                           "kind" if case == "label" else "label", "--epochs", "1", "--no-progress", "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert proc.stdout.split() == ["no", "torch", "1"], proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "trickle train: error: " in proc.stderr, proc.stderr
    assert seconds < 2.0, f"{seconds:.1f} s of CPU (386fc45: >= 15 s, nearly all of it importing torch)"


def test_the_command_line_reports_what_it_did_to_the_data(tmp_path: Path) -> None:
    table = wide(n=30)
    table["label"] = table["label"].map({"a": 0, "b": 1, "c": 2}).astype(object)
    table.loc[4, "label"] = None
    path = _written(table, tmp_path / "ints.csv")
    proc = trickle("train", "nexume", "--dataset", str(path), "--drop-missing-labels", "--epochs", "1", "--no-progress",
                   "--out", str(tmp_path / "o"), "--set", "min_per_class=2", "--set", 'harvest_scenario="rf_powercast"',
                   "--json")
    assert proc.returncode == 0, proc.stderr
    # 386fc45: the drop was recorded in the checkpoint only, and the labels were '0.0', '1.0', '2.0'
    assert "data: ints, 23 training and 6 test examples of [1, 12], classes 0, 1, 2;" in proc.stderr
    assert "1 example(s) without a label left out" in proc.stderr
