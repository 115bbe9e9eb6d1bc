"""A bundle's pre-processing: raw sensor input → the model's input, the same on every backend.

The manifest carries it as data, so a device needs no training code to reproduce it::

    {"description": "...", "raw": {"shape": [8, 8], "dtype": "float32"},
     "steps": [{"op": "scale", "factor": 0.0625},
               {"op": "standardize", "mean": 0.3, "std": 0.4},
               {"op": "reshape", "shape": [1, 8, 8]}]}

Steps, applied in order to one example (no batch axis):

- ``mfcc``: a mono waveform (any length; the first ``duration_s`` are kept, zero-padded) →
  (n_mfcc, frames) MFCCs with librosa (``pip install 'trickle[audio]'``). Training computes its
  features with this very function.
- ``scale``: x * factor.
- ``standardize``: (x - mean) / std, float32; mean and std are numbers or nested lists that
  broadcast against the example.
- ``reshape``: to ``shape``.

The steps are typed in ``edge.contract.manifest`` (``Preprocessing``). A raw shape of ``null`` means
variable length (audio). Every failure is a ``PreprocessError`` (a ``DataError``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from edge.contract.manifest import Mfcc, Preprocessing, Reshape, Scale, Standardize
from edge.core.errors import DataError


class PreprocessError(DataError):
    """Raw input that the bundle's pre-processing cannot take."""


def mfcc(waveform: np.ndarray, sample_rate_hz: int, n_mfcc: int, n_fft: int, hop_length: int, n_mels: int,
         duration_s: float) -> np.ndarray:
    """(n_mfcc, frames) float32 MFCCs of the first ``duration_s`` of a mono waveform, zero-padded."""
    try:
        import librosa
    except ImportError:
        raise PreprocessError("this bundle's pre-processing computes MFCCs: pip install 'trickle[audio]' (librosa)") from None
    waveform = np.asarray(waveform, dtype=np.float32)
    if waveform.ndim != 1:
        raise PreprocessError(f"mfcc: expects a mono waveform (1-D), got shape {waveform.shape}")
    n = round(sample_rate_hz * duration_s)
    x = np.zeros(n, dtype=np.float32)
    x[: min(len(waveform), n)] = waveform[:n]
    features = librosa.feature.mfcc(y=x, sr=sample_rate_hz, n_mfcc=n_mfcc, n_fft=n_fft, hop_length=hop_length, n_mels=n_mels)
    return np.asarray(features, dtype=np.float32)


def standardize(x: np.ndarray, mean: Any, std: Any) -> np.ndarray:
    return ((np.asarray(x, dtype=np.float32) - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)).astype(
        np.float32)


def as_preprocessing(preprocessing: Preprocessing | dict[str, Any]) -> Preprocessing:
    """The typed pre-processing (a bundle's is typed already; training code passes dicts)."""
    if isinstance(preprocessing, Preprocessing):
        return preprocessing
    try:
        return Preprocessing.model_validate(preprocessing)
    except ValidationError as e:
        unknown = [err for err in e.errors() if err["type"] == "union_tag_invalid"]
        if unknown:
            raise PreprocessError(f"pre-processing step {unknown[0]['ctx']['tag']!r}: not known to this runtime") from None
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise PreprocessError(f"pre-processing {where}: {err['msg']}") from None


def apply(preprocessing: Preprocessing | dict[str, Any], raw: np.ndarray) -> np.ndarray:
    """The model's input (no batch axis) for one raw example."""
    pre = as_preprocessing(preprocessing)
    x = np.asarray(raw)
    if pre.raw is not None and tuple(x.shape) != tuple(pre.raw.shape):
        raise PreprocessError(f"raw input shape {tuple(x.shape)}: this bundle takes {tuple(pre.raw.shape)}")
    for step in pre.steps:
        if isinstance(step, Mfcc):
            x = mfcc(x, step.sample_rate_hz, step.n_mfcc, step.n_fft, step.hop_length, step.n_mels, step.duration_s)
        elif isinstance(step, Scale):
            x = (np.asarray(x, dtype=np.float32) * np.float32(step.factor)).astype(np.float32)
        elif isinstance(step, Standardize):
            try:
                x = standardize(x, step.mean, step.std)
            except ValueError as e:
                raise PreprocessError(f"standardize: input of shape {x.shape} does not broadcast with the bundle's "
                                      f"statistics ({e})") from None
        elif isinstance(step, Reshape):
            try:
                x = np.reshape(x, step.shape)
            except ValueError:
                raise PreprocessError(f"reshape: input of shape {x.shape} cannot become {tuple(step.shape)}") from None
    return np.asarray(x, dtype=np.float32)


def read_wav(path: Path, sample_rate_hz: int | None = None) -> np.ndarray:
    """A WAV file as a float32 mono waveform in [-1, 1] (integer samples divided by their type's max)."""
    from scipy.io import wavfile

    try:
        rate, samples = wavfile.read(path)
    except (OSError, ValueError) as e:
        raise PreprocessError(f"{path}: not a readable WAV file ({e})") from None
    if sample_rate_hz is not None and rate != sample_rate_hz:
        raise PreprocessError(f"{path}: sampled at {rate} Hz, the bundle expects {sample_rate_hz} Hz")
    if samples.ndim > 1:
        samples = samples.mean(axis=1)
    scale = float(np.iinfo(samples.dtype).max) if np.issubdtype(samples.dtype, np.integer) else 1.0
    return np.asarray(samples, dtype=np.float32) / np.float32(scale)


def read_input(path: Path, preprocessing: Preprocessing | dict[str, Any]) -> np.ndarray:
    """One raw example from a file: .npy, .csv/.txt (numbers), or .wav (for audio bundles)."""
    pre = as_preprocessing(preprocessing)
    suffix = path.suffix.lower()
    if not path.is_file():
        raise PreprocessError(f"input {path}: no such file")
    if suffix == ".wav":
        rates = [s.sample_rate_hz for s in pre.steps if isinstance(s, Mfcc)]
        return read_wav(path, rates[0] if rates else None)
    try:
        if suffix == ".npy":
            return np.load(path, allow_pickle=False)
        if suffix in (".csv", ".txt"):
            data = np.loadtxt(path, delimiter="," if suffix == ".csv" else None, dtype=np.float32, ndmin=1)
            shape: Sequence[int] | None = pre.raw.shape if pre.raw is not None else None
            return data.reshape(shape) if shape is not None and data.size == int(np.prod(shape)) else data
    except ValueError as e:
        raise PreprocessError(f"input {path}: cannot read numbers from it ({e})") from None
    raise PreprocessError(f"input {path}: use .npy, .csv, .txt or .wav")
