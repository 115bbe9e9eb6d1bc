"""The three NExUME tasks, from data on disk or shipped by packages (nothing is downloaded).

- ``fsdd``: Free Spoken Digit Dataset (DATA/fsdd/recordings, 8 kHz WAV; ``edge.core.files.data_root``), 13 MFCCs
  per 16 ms hop over the first second (librosa), split as the dataset's authors do: the
  recordings numbered 0-4 of every speaker and digit are the test set.
- ``basic_motions``: sktime's BasicMotions, 3-axis accelerometer + gyroscope, 4 activities.
- ``digits``: scikit-learn's 8x8 handwritten digits, a seeded stratified 80/20 split.

Every loader returns float32 arrays laid out for a PyTorch conv (N, C, L) or (N, C, H, W),
standardized with statistics of the training split only.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from edge.classify.preprocess import PreprocessError, mfcc, read_wav
from edge.contract.vectors import npz_bytes
from edge.core.files import data_root as shared_data_root
from edge.core.files import write_atomic
from models.data.base import Dataset, DatasetError, standardize_splits

DATASETS = ("fsdd", "basic_motions", "digits")
_FSDD_NAME = re.compile(r"^(\d)_([a-z]+)_(\d+)\.wav$")
FSDD_SAMPLE_RATE_HZ = 8000
FSDD_N_MFCC = 13
FSDD_HOP = 128  # 16 ms at 8 kHz
FSDD_N_FFT = 256


def load(name: str, data_root: str | os.PathLike[str] | None = None, cache_dir: str | os.PathLike[str] | None = None,
         options: Any = None) -> Dataset:
    """One of ``DATASETS`` (``data_root`` is the shared data folder, for fsdd), or the user's data at
    ``name`` read with ``options`` (``models.data.userdata.UserData``)."""
    if name == "fsdd":
        return load_fsdd(data_root, cache_dir)
    if name == "basic_motions":
        return load_basic_motions()
    if name == "digits":
        return load_digits()
    from models.data.userdata import load_user

    return load_user(name, options)


def dataset_name(spec: str) -> str:
    """A short name for a data set spec: the built-in name, the UCR/UEA name, or the file's or folder's stem."""
    if spec in DATASETS:
        return spec
    if spec.startswith("ucr:"):
        return spec.removeprefix("ucr:")
    return Path(spec.rstrip("/")).stem or "data"


# ---- FSDD ---------------------------------------------------------------------------------


def fsdd_dir(data_root: str | os.PathLike[str] | None) -> Path:
    recordings = shared_data_root(data_root) / "fsdd" / "recordings"
    if not recordings.is_dir() or not any(recordings.glob("*.wav")):
        raise DatasetError(
            f"fsdd: no WAV files in {recordings} (pass the data folder with --data, or set TRICKLE_DATA to it)"
        )
    return recordings


FSDD_MFCC = {"op": "mfcc", "sample_rate_hz": FSDD_SAMPLE_RATE_HZ, "n_mfcc": FSDD_N_MFCC, "n_fft": FSDD_N_FFT,
             "hop_length": FSDD_HOP, "n_mels": 40, "duration_s": 1.0}


def fsdd_features(waveform: np.ndarray) -> np.ndarray:
    """(13, 63) MFCCs of the first second of an 8 kHz waveform (zero-padded), float32: the device's step."""
    return mfcc(waveform, **{k: v for k, v in FSDD_MFCC.items() if k != "op"})  # type: ignore[arg-type]


def _read_wav(path: Path) -> np.ndarray:
    try:
        return read_wav(path, FSDD_SAMPLE_RATE_HZ)
    except PreprocessError as e:
        raise DatasetError(f"fsdd: {e}") from None


def load_fsdd(data_root: str | os.PathLike[str] | None = None, cache_dir: str | os.PathLike[str] | None = None) -> Dataset:
    recordings = fsdd_dir(data_root)
    files = sorted(p for p in recordings.glob("*.wav") if _FSDD_NAME.match(p.name))
    if not files:
        raise DatasetError(f"fsdd: no files named DIGIT_SPEAKER_INDEX.wav in {recordings}")
    features, digits, indices = _fsdd_cached(files, cache_dir)
    test = indices < 5
    x_train, x_test, step = standardize_splits(features[~test], features[test], axes=(0, 2))
    pre = {"description": "mono 8 kHz waveform in [-1, 1]; MFCCs of the first second (zero-padded); "
                          "per-coefficient standardization with the training split's statistics",
           "raw": None, "steps": [FSDD_MFCC, step]}
    return Dataset("fsdd", x_train, digits[~test], x_test, digits[test], tuple(str(d) for d in range(10)), pre)


def _fsdd_cached(files: list[Path], cache_dir: str | os.PathLike[str] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MFCCs of every file, cached on disk under a key of the file names, sizes and parameters."""
    key = hashlib.sha256()
    for f in files:
        key.update(f"{f.name}:{f.stat().st_size};".encode())
    key.update(f"{FSDD_N_MFCC},{FSDD_N_FFT},{FSDD_HOP},40".encode())
    cache = Path(cache_dir or Path.home() / ".cache" / "trickle") / f"fsdd-{key.hexdigest()[:16]}.npz"
    if cache.exists():
        with np.load(cache) as z:
            return z["features"], z["digits"], z["indices"]
    features = np.stack([fsdd_features(_read_wav(f)) for f in files])
    parsed = [_FSDD_NAME.match(f.name) for f in files]
    digits = np.array([int(m.group(1)) for m in parsed if m], dtype=np.int64)
    indices = np.array([int(m.group(3)) for m in parsed if m], dtype=np.int64)
    cache.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(cache, npz_bytes({"features": features, "digits": digits, "indices": indices}))
    return features, digits, indices


# ---- BasicMotions and digits --------------------------------------------------------------


def load_basic_motions() -> Dataset:
    from sktime.datasets import load_UCR_UEA_dataset

    parts = {}
    for split in ("train", "test"):
        x, y = load_UCR_UEA_dataset("BasicMotions", split=split, return_type="numpy3D")
        parts[split] = (np.asarray(x, dtype=np.float32), np.asarray(y))
    labels = tuple(sorted(set(parts["train"][1])))
    index = {label: i for i, label in enumerate(labels)}
    y_train = np.array([index[v] for v in parts["train"][1]], dtype=np.int64)
    y_test = np.array([index[v] for v in parts["test"][1]], dtype=np.int64)
    x_train, x_test, step = standardize_splits(parts["train"][0], parts["test"][0], axes=(0, 2))
    pre = {"description": "6 channels (accelerometer xyz, gyroscope xyz) x 100 samples at 10 Hz; per-channel "
                          "standardization with the training split's statistics",
           "raw": {"shape": [6, 100], "dtype": "float32"}, "steps": [step]}
    return Dataset("basic_motions", x_train, y_train, x_test, y_test, labels, pre, raw_test=parts["test"][0])


def load_digits() -> Dataset:
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    bunch = sk_digits()
    images = bunch.images.astype(np.float32)  # grey levels 0-16
    y = bunch.target.astype(np.int64)
    raw_train, raw_test, y_train, y_test = train_test_split(images, y, test_size=0.2, random_state=0, stratify=y)
    factor = 1 / 16
    scale = {"op": "scale", "factor": factor}
    x_train, x_test, step = standardize_splits(raw_train * np.float32(factor), raw_test * np.float32(factor), axes=(0, 1, 2))
    pre = {"description": "8x8 grey levels 0-16, divided by 16, standardized with the training split's mean and std",
           "raw": {"shape": [8, 8], "dtype": "float32"}, "steps": [scale, step, {"op": "reshape", "shape": [1, 8, 8]}]}
    labels = tuple(str(d) for d in range(10))
    return Dataset("digits", x_train[:, None].copy(), y_train, x_test[:, None].copy(), y_test, labels, pre, raw_test=raw_test)
