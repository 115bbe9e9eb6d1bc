"""A data set's series as a device senses them: the loader's standardization undone (no torch).

    x_train, x_test = raw_series(load_user("Coffee.npz"))   # (n, channels, T) each

A method that standardizes each sample itself (FIRMBOUND's rule streams raw samples) learns from
these; the loader's step (``Dataset.preprocessing``) must then be a per-channel standardization alone.
"""

from __future__ import annotations

import numpy as np

from models.data.base import Dataset, DatasetError


def raw_series(data: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) series (n, channels, T), float32, before the loader's standardization."""
    if data.x_train.ndim != 3:
        raise DatasetError(f"{data.name}: examples of shape {list(data.x_train.shape[1:])}; a series is "
                           "(channels, samples)")
    steps = data.preprocessing.get("steps", [])
    if [s.get("op") for s in steps] != ["standardize"]:
        ops = ", ".join(str(s.get("op")) for s in steps) or "none"
        raise DatasetError(f"{data.name}: pre-processed by {ops}; a device streams raw samples, so give series as a "
                           "table, an .npz or ucr:NAME (an audio folder's MFCC frames are not what a node senses)")
    channels = data.x_train.shape[1]
    mean = np.broadcast_to(np.asarray(steps[0]["mean"], np.float32).reshape(-1), (channels,))
    std = np.broadcast_to(np.asarray(steps[0]["std"], np.float32).reshape(-1), (channels,))

    def undo(z: np.ndarray) -> np.ndarray:
        return np.asarray(z * std[None, :, None] + mean[None, :, None], np.float32)

    raw_test = undo(data.x_test) if data.raw_test is None else np.asarray(data.raw_test, np.float32)
    return undo(data.x_train), raw_test
