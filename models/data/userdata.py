"""Your own data as a training task: a folder of recordings, a table of series, an .npz, or a UCR/UEA name.

    from models.data.userdata import UserData, load_user
    data = load_user("recordings/")                                   # one sub-folder per label
    data = load_user("walks.csv", UserData(label_column="activity", id_column="walk"))
    data = load_user("ucr:GunPoint")                                  # sktime's offline copy

What each source becomes (float32, laid out for a PyTorch conv):

- a folder with one sub-folder per label of WAV/FLAC files (soundfile): 13 MFCCs per 16 ms hop
  over the longest recording, every file at the same sample rate, downmixed to mono;
- a CSV or Parquet table: *wide* (a row per example, every numeric column but the label one
  sample of a one-channel series) or, with ``id_column``, *long* (a row per time step, rows
  grouped by id and sorted by ``time_column``; each numeric column a channel);
- an ``.npz`` with ``X`` ((N, L), (N, C, L) or (N, C, H, W)) and ``y`` (and optionally
  ``X_test``/``y_test``);
- ``ucr:NAME``: a UCR/UEA set sktime ships (its own train/test split).

Nothing is dropped without a word: a cell that is not a number, an empty cell, an empty label, a
column that looks like time in a long table without ``time_column`` are errors naming the file, the
row and the column; ``fill`` fills empty cells (``linear`` along time, ``previous``, ``zero``),
``drop_missing_labels`` leaves unlabelled examples out, ``ignore_columns`` names columns that are
not part of the series (and the description records what each option did). Series of unequal
length need ``pad`` (zeros at the end). Unless the source has a test split, a stratified seeded
split holds ``test_fraction`` out. Every channel is standardized with the
training split's statistics; the steps are recorded as ``Dataset.preprocessing`` and travel in
the checkpoint and the bundle's manifest. A bad data set is one ``DatasetError`` line.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from models.data.base import Dataset, DatasetError, standardize_splits

AUDIO_SUFFIXES = (".wav", ".flac")
N_MFCC, HOP_S, N_MELS = 13, 0.016, 40
Fill = Literal["linear", "previous", "zero"]
# a long table's column by these names (or ending _time, _ts, _ms, _index) orders rows: never a channel
# unnamed (not a bare _s suffix: channels are named in units too, e.g. gyro_s)
TIME_LIKE = re.compile(r"^(t|time|times|timestamp|ts|step|steps|sample|sample_index|index|idx|seconds|secs|sec|ms|"
                       r"millis|frame|tick|date|datetime)$|(_time|_ts|_ms|_index)$", re.IGNORECASE)


@dataclass(frozen=True)
class UserData:
    """How to read a user's data set (also the fields of ``TrainConfig`` that carry them)."""

    label_column: str = "label"  # tables: the column of class labels
    id_column: str | None = None  # tables: set for long format (one row per time step)
    time_column: str | None = None  # long tables: the order of rows within an id
    pad: bool = False  # zero-pad series of unequal length to the longest
    test_fraction: float = 0.2  # held out, stratified, when the source has no test split
    seed: int = 0  # of the split
    min_per_class: int = 5  # fewer examples of a class is an error
    fill: Fill | None = None  # empty cells: an error, or filled (linear along time, previous value, zero)
    drop_missing_labels: bool = False  # examples without a label: an error, or left out
    ignore_columns: tuple[str, ...] = ()  # tables: columns that are not part of the series (names, notes)
    split_column: str | None = None  # tables: the column saying which rows are "train" and which "test"
    delimiter: str | None = None  # CSV: the field separator (default: sniffed among , ; tab |)
    decimal: str | None = None  # CSV: the decimal mark (default: "," where the separator is not and cells read so)


def load_user(spec: str, opts: UserData | None = None) -> Dataset:
    """The user's data set at ``spec`` (a path, or ``ucr:NAME``) as a training task."""
    opts = opts or UserData()
    if spec.startswith("ucr:"):
        return _ucr(spec.removeprefix("ucr:"), opts)
    path = Path(spec).expanduser()
    if not path.exists():
        raise DatasetError(f"dataset {spec!r}: no such file or folder (a built-in name, a folder of audio per "
                           "label, a .csv/.parquet table, an .npz, or ucr:NAME)")
    if path.is_dir():
        return _audio_folder(path, opts)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return _npz(path, opts)
    if suffix in (".csv", ".parquet"):
        return _table(path, opts)
    raise DatasetError(f"dataset {spec!r}: a {suffix or 'suffix-less'} file; expected a folder of audio per label, "
                       ".csv, .parquet or .npz")


def fingerprint(spec: str) -> str | None:
    """The sha256 of the user's data at ``spec`` (a file, or every audio file of a folder with its
    relative path); None for built-in and UCR/UEA sets, or a path that does not exist."""
    path = Path(spec).expanduser()
    if spec.startswith("ucr:") or not path.exists():
        return None
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        if path.is_dir():
            digest.update(f.relative_to(path).as_posix().encode() + b"\0")
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def some_names(names: Sequence[Any], wanted: str | None = None, show: int = 5) -> str:
    """At most ``show`` of ``names`` (those closest to ``wanted`` first) and how many more."""
    names = [str(n) for n in names]
    close = difflib.get_close_matches(wanted, names, n=show, cutoff=0.5) if wanted else []
    shown = close + [n for n in names if n not in close][: show - len(close)]
    more = len(names) - len(shown)
    return ", ".join(repr(n) for n in shown) + (f" and {more} more" if more else "")


# ---- labels, split, standardization -----------------------------------------------------------


def _missing(values: Any) -> np.ndarray:
    """Which labels are missing: None, NaN or blank text."""
    import pandas as pd

    series = pd.Series(np.asarray(values, dtype=object))
    return np.asarray(series.isna() | series.map(lambda v: isinstance(v, str) and not v.strip()), dtype=bool)


def _drop_unlabelled(y: np.ndarray, name: str, opts: UserData, where: Any) -> tuple[np.ndarray, str]:
    """The examples to keep (a boolean mask) and what was left out; missing labels are an error
    naming the first few (``where(i)`` says where example ``i`` is) unless ``drop_missing_labels``."""
    missing = _missing(y)
    if not missing.any():
        return ~missing, ""
    rows = np.flatnonzero(missing)
    if not opts.drop_missing_labels:
        shown = ", ".join(where(int(i)) for i in rows[:3]) + (f" and {len(rows) - 3} more" if len(rows) > 3 else "")
        raise DatasetError(f"{name}: {len(rows)} empty label(s) ({shown}); fill them in, or pass "
                           "--drop-missing-labels to leave those examples out")
    return ~missing, f"; {len(rows)} example(s) without a label left out"


def _label_texts(y: np.ndarray) -> list[str]:
    """Labels as text; whole numbers read as floats (an integer column with an empty cell, which pandas
    reads as floats) as the integers they were: 3, not 3.0."""
    values = y.tolist()
    if values and all(isinstance(v, float) and v.is_integer() for v in values):
        return [str(int(v)) for v in values]
    return [str(v) for v in values]


def _labels(y: np.ndarray, name: str, opts: UserData) -> tuple[np.ndarray, tuple[str, ...]]:
    """Integer classes and their names, after checking there are two or more with enough examples."""
    texts = _label_texts(y)
    names = sorted(set(texts))
    if len(names) < 2:
        raise DatasetError(f"{name}: one class only ({names[0] if names else 'none'}); a classifier needs two or more")
    index = {n: i for i, n in enumerate(names)}
    classes = np.array([index[t] for t in texts], dtype=np.int64)
    counts = np.bincount(classes, minlength=len(names))
    low = [(names[i], int(c)) for i, c in enumerate(counts) if c < opts.min_per_class]
    if low:
        label, count = low[0]
        raise DatasetError(f"{name}: class {label!r} has {count} example(s); at least {opts.min_per_class} per class "
                           f"are needed ({len(low)} class(es) short)")
    return classes, tuple(names)


def _split(x: np.ndarray, y: np.ndarray, opts: UserData) -> tuple[np.ndarray, ...]:
    from sklearn.model_selection import train_test_split

    n_test = max(math.ceil(opts.test_fraction * len(y)), int(y.max()) + 1)  # one per class at least
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=n_test, random_state=opts.seed, stratify=y)
    return x_train, x_test, y_train, y_test


def _given_split(y_train: np.ndarray, y_test: np.ndarray, name: str, opts: UserData
                 ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Classes of a split the source gives (kept as it is), after checking that the test split holds no
    class the training split lacks: a model cannot learn a class it never sees."""
    y_all, labels = _labels(np.concatenate([y_train, y_test]), name, opts)
    train, test = y_all[: len(y_train)], y_all[len(y_train):]
    unseen = sorted(set(test.tolist()) - set(train.tolist()))
    if unseen:
        counts = ", ".join(f"{labels[c]!r} ({int((test == c).sum())})" for c in unseen[:3])
        raise DatasetError(f"{name}: {len(unseen)} class(es) in the test split only: {counts}; the model cannot learn a "
                           "class it never sees in training: move some of its examples to the training split")
    return train, test, labels


def _task(name: str, raw_train: np.ndarray, raw_test: np.ndarray, y_train: np.ndarray, y_test: np.ndarray,
          labels: tuple[str, ...], description: str, steps: list[dict[str, Any]], fixed_raw: bool) -> Dataset:
    """Standardize every channel (axis 1) with the training split's statistics."""
    axes = tuple(a for a in range(raw_train.ndim) if a != 1)
    x_train, x_test, step = standardize_splits(raw_train.astype(np.float32), raw_test.astype(np.float32), axes=axes)
    raw = {"shape": list(raw_train.shape[1:]), "dtype": "float32"} if fixed_raw else None
    constant = [c for c in range(raw_train.shape[1]) if np.ptp(raw_train[:, c]) == 0]
    if constant:
        description += f"; channel(s) {constant} constant in the training split: centred, not scaled"
    pre = {"description": description + "; per-channel standardization with the training split's statistics",
           "raw": raw, "steps": [*steps, step]}
    return Dataset(name, x_train, y_train, x_test, y_test, labels, pre, raw_test=raw_test if fixed_raw else None)


def _stack(series: list[np.ndarray], name: str, opts: UserData) -> np.ndarray:
    """(C, L) series as one (N, C, L) array; unequal lengths need ``pad``."""
    lengths = sorted({s.shape[-1] for s in series})
    if len(lengths) > 1 and not opts.pad:
        raise DatasetError(f"{name}: ragged series (lengths {lengths[0]} to {lengths[-1]}); pass --pad to zero-pad "
                           "them to the longest")
    out = np.zeros((len(series), series[0].shape[0], lengths[-1]), dtype=np.float32)
    for k, s in enumerate(series):
        out[k, :, : s.shape[-1]] = s
    return out


# ---- sources ------------------------------------------------------------------------------------


def _audio_folder(root: Path, opts: UserData) -> Dataset:
    import soundfile

    from edge.classify.preprocess import mfcc

    files = sorted(p for p in root.glob("*/*") if p.suffix.lower() in AUDIO_SUFFIXES)
    if not files:
        raise DatasetError(f"{root}: no .wav or .flac files in sub-folders (one sub-folder per label)")
    waves: list[np.ndarray] = []
    rates: dict[int, Path] = {}
    for f in files:
        try:
            wave, rate = soundfile.read(f, dtype="float32", always_2d=True)
        except (RuntimeError, soundfile.LibsndfileError) as e:
            raise DatasetError(f"{f}: not readable audio: {e}") from None
        rates.setdefault(int(rate), f)
        waves.append(wave.mean(axis=1))
    if len(rates) > 1:
        (r1, f1), (r2, f2) = list(rates.items())[:2]
        raise DatasetError(f"{root}: the sample rate differs between files ({f1.name}: {r1} Hz, {f2.name}: {r2} Hz); "
                           "resample them to one rate")
    rate = next(iter(rates))
    y, labels = _labels(np.array([f.parent.name for f in files]), str(root), opts)
    duration_s = max(len(w) for w in waves) / rate
    hop = max(1, round(HOP_S * rate))
    step = {"op": "mfcc", "sample_rate_hz": rate, "n_mfcc": N_MFCC, "n_fft": 2 * hop, "hop_length": hop,
            "n_mels": N_MELS, "duration_s": duration_s}
    features = np.stack([mfcc(w, rate, N_MFCC, 2 * hop, hop, N_MELS, duration_s) for w in waves])  # (N, 13, frames)
    x_train, x_test, y_train, y_test = _split(features, y, opts)
    desc = (f"mono {rate} Hz waveform in [-1, 1]; {N_MFCC} MFCCs per {hop}-sample hop over the first "
            f"{duration_s:g} s (zero-padded)")
    return _task(root.name, x_train, x_test, y_train, y_test, labels, desc, [step], fixed_raw=False)


def _npz(path: Path, opts: UserData) -> Dataset:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: not a readable .npz: {e}") from None
    missing = [k for k in ("X", "y") if k not in arrays]
    if missing:
        raise DatasetError(f"{path}: needs arrays X and y (has {sorted(arrays)})")

    def shaped(x: np.ndarray, key: str) -> np.ndarray:
        if x.ndim == 2:
            x = x[:, None, :]
        if x.ndim not in (3, 4) or not np.issubdtype(x.dtype, np.number):
            raise DatasetError(f"{path}: {key} must be numbers shaped (N, L), (N, C, L) or (N, C, H, W); got "
                               f"{x.dtype} {x.shape}")
        return _finite(x.astype(np.float32), path, key, opts)

    x = shaped(arrays["X"], "X")
    if len(arrays["y"]) != len(x):
        raise DatasetError(f"{path}: X has {len(x)} examples, y {len(arrays['y'])}")
    keep, notes = _drop_unlabelled(arrays["y"], str(path), opts, lambda i: f"y[{i}]")
    x, arrays["y"] = x[keep], arrays["y"][keep]
    if "X_test" in arrays:
        x_test = shaped(arrays["X_test"], "X_test")
        if x_test.shape[1:-1] != x.shape[1:-1] or "y_test" not in arrays or len(arrays["y_test"]) != len(x_test):
            raise DatasetError(f"{path}: X_test must match X's shape {x.shape[1:]} and come with a y_test of its length")
        if x_test.shape[-1] != x.shape[-1]:  # NaN-padded sets of their own lengths (x.ndim 3: --pad already checked)
            if not opts.pad or x.ndim != 3:
                raise DatasetError(f"{path}: X_test must match X's shape {x.shape[1:]} (it is {x_test.shape[1:]}); "
                                   "pass --pad to zero-pad series of unequal length")
            longest = max(x.shape[-1], x_test.shape[-1])
            x, x_test = (np.pad(a, ((0, 0), (0, 0), (0, longest - a.shape[-1]))) for a in (x, x_test))
        keep, test_notes = _drop_unlabelled(arrays["y_test"], str(path), opts, lambda i: f"y_test[{i}]")
        x_test, arrays["y_test"] = x_test[keep], arrays["y_test"][keep]
        notes += test_notes.replace("left out", "left out of the test split")
        y_train, y_test, labels = _given_split(arrays["y"], arrays["y_test"], str(path), opts)
        notes += "; the file's own test split"
    else:
        y, labels = _labels(arrays["y"], str(path), opts)
        x, x_test, y_train, y_test = _split(x, y, opts)
    return _task(path.stem, x, x_test, y_train, y_test, labels,
                 f"arrays of shape {list(x.shape[1:])} from {path.name}{notes}", [], fixed_raw=True)


def _finite(x: np.ndarray, path: Path, key: str, opts: UserData) -> np.ndarray:
    """``x`` with every value finite: infinity is an error naming where; NaN is too, except at the end of a
    series (variable-length series padded with NaN, as UCR/UEA ship them), which ``pad`` zero-pads."""
    inf = np.isinf(x)
    if inf.any():
        at = tuple(int(i) for i in np.argwhere(inf)[0])
        raise DatasetError(f"{path}: {key}{list(at)} is {x[at]}; every value must be a finite number ({int(inf.sum())} "
                           "infinite value(s))")
    nan = np.isnan(x)
    if not nan.any():
        return x
    if x.ndim == 3:  # (N, C, L): a NaN tail shared by every channel is padding
        filled = ~nan.all(axis=1)  # (N, L): some channel has a value
        length = np.where(filled.any(axis=1), x.shape[-1] - np.argmax(filled[:, ::-1], axis=1), 0)
        inside = nan & (np.arange(x.shape[-1]) < length[:, None, None])
        if not inside.any():
            if not opts.pad:
                n = int((length < x.shape[-1]).sum())
                i = int(np.argmax(length < x.shape[-1]))
                raise DatasetError(f"{path}: {key}: {n} series end in NaN ({key}[{i}] from sample "
                                   f"{int(length[i])}): variable-length series padded with NaN, as UCR/UEA ship them; "
                                   "pass --pad to zero-pad them instead")
            return np.where(nan, np.float32(0), x)
        nan = inside
    at = tuple(int(i) for i in np.argwhere(nan)[0])
    raise DatasetError(f"{path}: {key}{list(at)} is NaN, before the end of its series ({int(nan.sum())} such value(s)); "
                       "every value must be a number")


def _filled(data: np.ndarray, how: Fill) -> np.ndarray:
    """(C, L) with its empty cells filled along time; a channel with no value at all stays empty."""
    import pandas as pd

    frame = pd.DataFrame(data.T)
    if how == "zero":
        frame = frame.fillna(0.0)
    elif how == "previous":
        frame = frame.ffill().bfill()
    else:
        frame = frame.interpolate(method="linear", limit_direction="both")
    return frame.to_numpy(dtype=np.float32).T


DELIMITERS = (",", ";", "\t", "|")
DECIMAL_COMMA = re.compile(r"^[+-]?\d+,\d+(?:[eE][+-]?\d+)?$")
DECIMAL_POINT = re.compile(r"^[+-]?\d*\.\d+(?:[eE][+-]?\d+)?$")


def _csv_dialect(path: Path, opts: UserData) -> tuple[str, str]:
    """The CSV's field separator and decimal mark: as given, else sniffed from its first lines (the
    separator that splits every line into the same number of fields, most fields first; a decimal comma
    where the separator is not a comma and number cells are written so, as European spreadsheets do)."""
    import csv
    import itertools

    with path.open(encoding="utf-8-sig", errors="replace", newline="") as f:
        lines = [line for line in itertools.islice(f, 200) if line.strip()]
    delimiter = opts.delimiter
    if delimiter is None:
        widths = {d: {len(row) for row in csv.reader(lines, delimiter=d)} for d in DELIMITERS}
        even = [d for d in DELIMITERS if len(widths[d]) == 1 and next(iter(widths[d])) > 1]
        delimiter = max(even, key=lambda d: next(iter(widths[d])), default=",")
    decimal = opts.decimal
    if decimal is None:
        cells = [c.strip() for row in csv.reader(lines[1:], delimiter=delimiter) for c in row]
        commas = delimiter != "," and any(DECIMAL_COMMA.match(c) for c in cells)
        decimal = "," if commas and not any(DECIMAL_POINT.match(c) for c in cells) else "."
    return delimiter, decimal


def _table(path: Path, opts: UserData) -> Dataset:
    import pandas as pd

    csv = path.suffix.lower() == ".csv"
    delimiter, decimal = _csv_dialect(path, opts) if csv else (",", ".")
    try:
        table = (pd.read_csv(path, sep=delimiter, decimal=decimal, encoding="utf-8-sig") if csv
                 else pd.read_parquet(path))
    except (OSError, ValueError, UnicodeDecodeError, pd.errors.ParserError) as e:
        raise DatasetError(f"{path}: not a readable table: {e}") from None
    table = table.reset_index(drop=True)  # a row's index is its position in the file

    def where(i: int) -> str:  # the table's i-th row (0-based) as a person finds it in the file
        return f"row {i + 1} (line {i + 2})" if csv else f"row {i + 1}"

    if opts.label_column not in table.columns:
        hint = "name it with --label-column"
        if csv and len(table.columns) == 1:
            hint = (f"the file reads as a single column with {delimiter!r} between fields: name its separator with "
                    "--delimiter (and a decimal comma with --decimal ,), or the label column with --label-column")
        raise DatasetError(f"{path}: no label column {opts.label_column!r} (columns: "
                           f"{some_names(list(table.columns), opts.label_column)}); {hint}")
    for column in (opts.id_column, opts.time_column, opts.split_column, *opts.ignore_columns):
        if column is not None and column not in table.columns:
            raise DatasetError(f"{path}: no column {column!r} (columns: {some_names(list(table.columns), column)})")
    skip = {opts.label_column, opts.id_column, opts.time_column, opts.split_column, *opts.ignore_columns}
    values = [c for c in table.columns if c not in skip]
    if not values:
        raise DatasetError(f"{path}: no columns of values besides {sorted(str(s) for s in skip if s)}")
    for c in values:
        _numbers(table, c, path, opts, where, decimal)
    if opts.id_column is None:  # wide: one example per row, a one-channel series
        series, y_raw, notes, split = _wide(table, values, path, opts, where)
    else:  # long: one row per time step, grouped by id
        series, y_raw, notes, split = _long(table, values, path, opts, where)
    x = _stack(series, str(path), opts)
    if split is None:
        y, labels = _labels(y_raw, str(path), opts)
        x_train, x_test, y_train, y_test = _split(x, y, opts)
    else:
        y_train, y_test, labels = _given_split(y_raw[~split], y_raw[split], str(path), opts)
        x_train, x_test = x[~split], x[split]
        notes += f"; the split of column {opts.split_column!r} ({len(y_test)} test example(s))"
    layout = "long" if opts.id_column else "wide"
    dialect = f", {delimiter!r}-separated, decimal {decimal!r}" if (delimiter, decimal) != (",", ".") else ""
    desc = f"{x.shape[1]} channel(s) x {x.shape[2]} samples from {path.name} ({layout} table{dialect}){notes}"
    return _task(path.stem, x_train, x_test, y_train, y_test, labels, desc, [], fixed_raw=True)


def _numbers(table: Any, c: Any, path: Path, opts: UserData, where: Any, decimal: str) -> None:
    """Column ``c`` holds numbers (or empty cells), every one finite; else one line naming the first bad
    cell and what the column might be instead."""
    import pandas as pd

    column = table[c]
    if pd.api.types.is_numeric_dtype(column):
        inf = np.isinf(column.to_numpy(dtype=np.float64))
        if inf.any():
            i = int(np.flatnonzero(inf)[0])
            raise DatasetError(f"{path}: {where(i)}, column {c!r}: {column.iloc[i]} is not a finite number "
                               f"({int(inf.sum())} infinite cell(s) in that column)")
        return
    bad = (pd.to_numeric(column, errors="coerce").isna() & column.notna()).to_numpy()
    i = int(np.flatnonzero(bad)[0])
    cell = column.iloc[i]
    if decimal == "." and isinstance(cell, str) and DECIMAL_COMMA.match(cell.strip()):
        hint = "a decimal comma: pass --decimal , (and --delimiter if fields are not separated by commas)"
    elif opts.id_column is None and column.nunique() < column.notna().sum():
        hint = ("its values repeat over rows, as the example ids of a long table (a row per time step) do: name it "
                "with --id-column, or put a column that is not part of the series in --ignore-column")
    else:
        hint = "a column that is not part of the series goes in --ignore-column"
    raise DatasetError(f"{path}: {where(i)}, column {c!r}: {cell!r} is not a number ({int(bad.sum())} such cell(s) in "
                       f"that column; {hint})")


def _split_of(values: np.ndarray, path: Path, opts: UserData, where: Any) -> np.ndarray:
    """Which rows are test rows, from the split column's "train"/"test" (any case)."""
    text = np.array([str(v).strip().lower() for v in values.tolist()])
    bad = ~np.isin(text, ("train", "test"))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DatasetError(f"{path}: {where(i)}, column {opts.split_column!r} (the split column): {values[i]!r}; "
                           "each row must say train or test")
    return np.asarray(text == "test")


Series = tuple[list[np.ndarray], np.ndarray, str, "np.ndarray | None"]  # series, labels, notes, which are test


def _wide(table: Any, values: list[Any], path: Path, opts: UserData, where: Any) -> Series:
    """A wide table's series (one per row, trailing empty cells shorten it), their labels, what was done
    and (with ``split_column``) which are test examples."""
    time_like = [c for c in values if TIME_LIKE.search(str(c))]
    if time_like:
        raise DatasetError(f"{path}: column {time_like[0]!r} looks like time, which a wide table (a row per example) "
                           "does not have: a table with a row per time step needs --id-column (the column naming "
                           "each example) and --time-column; a column that is not part of the series goes in "
                           "--ignore-column")
    keep, notes = _drop_unlabelled(table[opts.label_column].to_numpy(), str(path), opts, where)
    positions = np.flatnonzero(keep)
    rows = table[values].to_numpy(dtype=np.float32)[keep]
    series, filled = [], 0
    for k, r in zip(positions, rows):
        empty = np.isnan(r)
        if empty.any() and opts.fill is not None:
            r, filled = _filled(r[None, :], opts.fill)[0], filled + int(empty.sum())
            if np.isnan(r).any():
                raise DatasetError(f"{path}: {where(k)} has no value to fill from")
        elif empty.any():
            first = int(np.argmax(empty))
            if not empty[first:].all():
                raise DatasetError(f"{path}: {where(k)}, column {values[first]!r}: an empty cell before a value; "
                                   "pass --fill linear|previous|zero to fill empty cells")
            r = r[:first]
        series.append(r[None, :])
    lengths = [s.shape[1] for s in series]
    if lengths and max(lengths) < len(values):
        raise DatasetError(f"{path}: column {values[max(lengths)]!r} is empty in every row; remove it, or name it with "
                           "--ignore-column")
    if len(set(lengths)) > 1 and not opts.pad:
        short = [(k, n) for k, n in zip(positions, lengths) if n < len(values)]
        k, n = short[0]
        raise DatasetError(f"{path}: {where(k)} has {n} value(s), empty from column {values[n]!r}, where "
                           f"{lengths.count(len(values))} row(s) have {len(values)} ({len(short)} row(s) short); "
                           "pass --fill linear|previous|zero to fill empty cells, or --pad to zero-pad series of "
                           "unequal length")
    notes += f"; {filled} empty cell(s) filled ({opts.fill})" if filled else ""
    y_raw = table[opts.label_column].to_numpy()[keep]
    split = None
    if opts.split_column is not None:
        split = _split_of(table[opts.split_column].to_numpy(), path, opts, where)[keep]
    return series, y_raw, notes, split


def _long(table: Any, values: list[Any], path: Path, opts: UserData, where: Any) -> Series:
    """A long table's series (one per id, ordered by ``time_column``), their labels, what was done and
    (with ``split_column``) which are test examples."""
    time_like = [c for c in values if TIME_LIKE.search(str(c))]
    if opts.time_column is None:
        time_like += [c for c in values if c not in time_like and _evenly_spaced(table, c, opts.id_column)]
    if opts.time_column is None and time_like:
        c = time_like[0]
        why = "" if TIME_LIKE.search(str(c)) else f" (distinct, evenly spaced values within every {opts.id_column!r})"
        raise DatasetError(f"{path}: column {c!r} looks like time{why}: name it with --time-column to order each "
                           f"example's rows by it (without, rows are taken in file order and {c!r} read as a "
                           "channel), or with --ignore-column if the file's order is the time order")
    if opts.time_column is not None and table[opts.time_column].isna().any():
        i = int(np.flatnonzero(table[opts.time_column].isna().to_numpy())[0])
        raise DatasetError(f"{path}: {where(i)}, column {opts.time_column!r} (the time column) is empty")
    notes = ""
    keep, dropped = _drop_unlabelled(table[opts.label_column].to_numpy(), str(path), opts, where)
    if dropped:
        unlabelled = set(table.loc[~keep, opts.id_column])
        table = table[~table[opts.id_column].isin(unlabelled)]
        notes += f"; {len(unlabelled)} example(s) with rows without a label left out"
    series, y_raw, test, filled = [], [], [], 0
    for key, group in table.groupby(opts.id_column, sort=True):
        if opts.time_column is not None:
            group = group.sort_values(opts.time_column, kind="stable")
        labels_here = group[opts.label_column].unique()
        if len(labels_here) != 1:
            raise DatasetError(f"{path}: {opts.id_column} = {key!r} has more than one label "
                               f"({sorted(map(str, labels_here))[:3]})")
        data = group[values].to_numpy(dtype=np.float32).T  # (C, L)
        empty = np.isnan(data)
        if empty.any() and opts.fill is None:
            t, c = (int(v) for v in np.argwhere(empty.T)[0])  # the earliest empty cell
            raise DatasetError(f"{path}: {where(int(group.index[t]))}, column {values[c]!r} "
                               f"({opts.id_column} = {key!r}): an empty cell; pass --fill linear|previous|zero to fill "
                               "empty cells")
        if empty.any():
            data, filled = _filled(data, opts.fill), filled + int(empty.sum())  # type: ignore[arg-type]
            if np.isnan(data).any():
                raise DatasetError(f"{path}: {opts.id_column} = {key!r} has a channel with no value to fill from")
        series.append(data)
        y_raw.append(labels_here[0])
        if opts.split_column is not None:
            is_test = _split_of(group[opts.split_column].to_numpy(), path, opts,
                                lambda i, g=group: where(int(g.index[i])))
            if is_test.min() != is_test.max():
                raise DatasetError(f"{path}: {opts.id_column} = {key!r} has rows in both splits (column "
                                   f"{opts.split_column!r}); an example belongs to one")
            test.append(bool(is_test[0]))
    notes += f"; {filled} empty cell(s) filled ({opts.fill})" if filled else ""
    return series, np.array(y_raw), notes, np.array(test) if opts.split_column is not None else None


def _evenly_spaced(table: Any, column: Any, id_column: Any) -> bool:
    """Whether ``column`` holds, within every example of a long table (three rows or more), distinct values
    evenly spaced once sorted (within 1 % of the step): a clock or a step counter, not a measurement."""
    import pandas as pd

    if not pd.api.types.is_numeric_dtype(table[column]):
        return False
    for _, group in table.groupby(id_column, sort=False)[column]:
        steps = np.diff(np.sort(group.to_numpy(dtype=np.float64)))
        if len(steps) < 2 or not np.isfinite(steps).all() or steps.min() <= 0:
            return False
        if steps.max() - steps.min() > 0.01 * np.median(steps):
            return False
    return True


def _ucr(name: str, opts: UserData) -> Dataset:
    import sktime.datasets
    from sktime.datasets import load_UCR_UEA_dataset

    shipped = Path(sktime.datasets.__file__).parent / "data"
    have = sorted(p.name for p in shipped.iterdir() if (p / f"{p.name}_TRAIN.ts").exists())
    if name not in have:
        raise DatasetError(f"dataset ucr:{name}: sktime ships no offline copy (nothing is downloaded); offline: "
                           f"{', '.join(have)}")
    parts = {}
    for split in ("train", "test"):
        x, y = load_UCR_UEA_dataset(name, split=split, return_type="nested_univ")
        series = [np.stack([np.asarray(x.iloc[i, c], dtype=np.float32) for c in range(x.shape[1])])
                  for i in range(len(x))]
        parts[split] = (series, np.asarray(y))
    x_all = _stack(parts["train"][0] + parts["test"][0], f"ucr:{name}", opts)
    y_all, labels = _labels(np.concatenate([parts["train"][1], parts["test"][1]]), f"ucr:{name}",
                            UserData(min_per_class=1))
    n = len(parts["train"][0])
    desc = f"{x_all.shape[1]} channel(s) x {x_all.shape[2]} samples of UCR/UEA {name} (sktime's split)"
    return _task(name, x_all[:n], x_all[n:], y_all[:n], y_all[n:], labels, desc, [], fixed_raw=True)
