"""The agent's sensor source: raw samples as the sensor gives them, and the few kept for self-tests.

A source is an ``.npz`` with ``x`` (raw samples) and optionally ``y`` (labels), a folder of
``.npy``/``.csv``/``.txt``/``.wav`` files (one raw example each, in name order), or one such file.

The first samples of a source are kept in the state folder (``selftest.npz``): an OTA bundle
without test vectors of its own (one exported before they existed) is self-tested on them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge.classify.preprocess import read_input
from edge.contract.manifest import Preprocessing
from edge.contract.vectors import npz_bytes
from edge.core.errors import DataError
from edge.core.files import write_atomic

SELFTEST_FILE = "selftest.npz"
SELFTEST_VECTORS = 16
SUFFIXES = (".npy", ".csv", ".txt", ".wav")


def load_source(path: Path, preprocessing: Preprocessing) -> tuple[list[np.ndarray], np.ndarray | None]:
    """Raw samples (as the sensor gives them) and their labels if known."""
    if path.suffix == ".npz":
        with np.load(path) as data:
            if "x" not in data:
                raise DataError(f"source {path}: an .npz source needs an array 'x' (and optionally 'y')")
            return list(data["x"]), (np.asarray(data["y"]) if "y" in data else None)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES)
        if not files:
            raise DataError(f"source {path}: no .npy/.csv/.txt/.wav files")
        return [read_input(p, preprocessing) for p in files], None
    if path.exists():
        return [read_input(path, preprocessing)], None
    raise DataError(f"source {path}: no such file or folder")


def keep_selftest_samples(state_dir: Path, raws: list[np.ndarray], labels: np.ndarray | None) -> Path:
    """Keep the first samples (and labels) in ``state_dir/selftest.npz``, once: later sources do
    not replace them. Returns the file."""
    path = state_dir / SELFTEST_FILE
    if path.exists() or not raws:
        return path
    # raw examples of variable length (audio) do not stack: keep those shaped like the first
    keep = [i for i, raw in enumerate(raws) if np.shape(raw) == np.shape(raws[0])][:SELFTEST_VECTORS]
    arrays = {"x": np.stack([raws[i] for i in keep])}
    if labels is not None:
        arrays["y"] = np.asarray(labels)[keep]
    write_atomic(path, npz_bytes(arrays))
    return path


def stored_selftest_samples(state_dir: Path) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The samples ``keep_selftest_samples`` kept, or None if there are none yet."""
    path = state_dir / SELFTEST_FILE
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as data:
        return data["x"], data.get("y")
