"""The three NExUME tasks, from data on disk or shipped by packages (nothing is downloaded).

- ``fsdd``: Free Spoken Digit Dataset (../shared/data/fsdd/recordings, 8 kHz WAV), 13 MFCCs
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATASETS = ("fsdd", "basic_motions", "digits")
_FSDD_NAME = re.compile(r"^(\d)_([a-z]+)_(\d+)\.wav$")
FSDD_SAMPLE_RATE_HZ = 8000
FSDD_N_MFCC = 13
FSDD_HOP = 128  # 16 ms at 8 kHz
FSDD_N_FFT = 256


class DatasetError(ValueError):
    """A dataset is missing, malformed, or unknown."""


@dataclass(frozen=True)
class Dataset:
    name: str
    x_train: np.ndarray  # (N, C, L) or (N, C, H, W), float32
    y_train: np.ndarray  # (N,) int64
    x_test: np.ndarray
    y_test: np.ndarray
    labels: tuple[str, ...]
    preprocessing: str  # what a device must do to raw input before the model

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def n_classes(self) -> int:
        return len(self.labels)


def load(name: str, data_root: str | os.PathLike[str] | None = None, cache_dir: str | os.PathLike[str] | None = None) -> Dataset:
    """Load one of ``DATASETS``; ``data_root`` is the shared data folder (for fsdd)."""
    if name == "fsdd":
        return load_fsdd(data_root, cache_dir)
    if name == "basic_motions":
        return load_basic_motions()
    if name == "digits":
        return load_digits()
    raise DatasetError(f"dataset = {name!r}: must be one of {list(DATASETS)}")


def _standardize(train: np.ndarray, test: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    mean = train.mean(axis=axes, keepdims=True)
    std = train.std(axis=axes, keepdims=True) + 1e-6
    return ((train - mean) / std).astype(np.float32), ((test - mean) / std).astype(np.float32)


# ---- FSDD ---------------------------------------------------------------------------------


def fsdd_dir(data_root: str | os.PathLike[str] | None) -> Path:
    root = Path(data_root) if data_root is not None else _default_data_root()
    recordings = root / "fsdd" / "recordings"
    if not recordings.is_dir() or not any(recordings.glob("*.wav")):
        raise DatasetError(
            f"fsdd: no WAV files in {recordings} (pass the shared data folder, or set TRICKLE_DATA to it)"
        )
    return recordings


def _default_data_root() -> Path:
    repo = Path(__file__).resolve().parent.parent
    return Path(os.environ.get("TRICKLE_DATA", repo.parent / "shared" / "data"))


def fsdd_features(waveform: np.ndarray) -> np.ndarray:
    """(13, 63) MFCCs of the first second of an 8 kHz waveform (zero-padded), float32."""
    import librosa

    x = np.zeros(FSDD_SAMPLE_RATE_HZ, dtype=np.float32)
    x[: min(len(waveform), FSDD_SAMPLE_RATE_HZ)] = waveform[:FSDD_SAMPLE_RATE_HZ]
    mfcc = librosa.feature.mfcc(y=x, sr=FSDD_SAMPLE_RATE_HZ, n_mfcc=FSDD_N_MFCC, n_fft=FSDD_N_FFT,
                                hop_length=FSDD_HOP, n_mels=40)
    return mfcc.astype(np.float32)


def _read_wav(path: Path) -> np.ndarray:
    from scipy.io import wavfile

    rate, samples = wavfile.read(path)
    if rate != FSDD_SAMPLE_RATE_HZ:
        raise DatasetError(f"fsdd: {path.name} is sampled at {rate} Hz, expected {FSDD_SAMPLE_RATE_HZ}")
    if samples.ndim > 1:
        samples = samples.mean(axis=1)
    scale = float(np.iinfo(samples.dtype).max) if np.issubdtype(samples.dtype, np.integer) else 1.0
    return samples.astype(np.float32) / scale


def load_fsdd(data_root: str | os.PathLike[str] | None = None, cache_dir: str | os.PathLike[str] | None = None) -> Dataset:
    recordings = fsdd_dir(data_root)
    files = sorted(p for p in recordings.glob("*.wav") if _FSDD_NAME.match(p.name))
    if not files:
        raise DatasetError(f"fsdd: no files named DIGIT_SPEAKER_INDEX.wav in {recordings}")
    features, digits, indices = _fsdd_cached(files, cache_dir)
    test = indices < 5
    x_train, x_test = _standardize(features[~test], features[test], axes=(0, 2))
    return Dataset("fsdd", x_train, digits[~test], x_test, digits[test], tuple(str(d) for d in range(10)),
                   f"mono 8 kHz, first 1 s zero-padded; librosa MFCC n_mfcc={FSDD_N_MFCC} n_fft={FSDD_N_FFT} "
                   f"hop={FSDD_HOP} n_mels=40; per-coefficient standardization from the training split")


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
    tmp = cache.with_suffix(".tmp.npz")
    np.savez(tmp, features=features, digits=digits, indices=indices)
    os.replace(tmp, cache)
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
    x_train, x_test = _standardize(parts["train"][0], parts["test"][0], axes=(0, 2))
    return Dataset("basic_motions", x_train, y_train, x_test, y_test, labels,
                   "6 channels (accelerometer xyz, gyroscope xyz) x 100 samples at 10 Hz; "
                   "per-channel standardization from the training split")


def load_digits() -> Dataset:
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    bunch = sk_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = bunch.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    x_train, x_test = _standardize(x_train, x_test, axes=(0, 1, 2, 3))
    return Dataset("digits", x_train, y_train, x_test, y_test, tuple(str(d) for d in range(10)),
                   "8x8 grey levels 0-16 divided by 16, then standardized with the training split's mean and std")
