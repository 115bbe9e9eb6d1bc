"""What every data set is: the ``Dataset`` a training method takes, and the standardization
step every loader ends with (recorded as data, so a device applies the same one)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edge.classify.preprocess import standardize
from edge.core.errors import DataError


class DatasetError(DataError):
    """A dataset is missing, malformed, or unknown."""


@dataclass(frozen=True)
class Dataset:
    """A task's train and test splits (model inputs), labels, the pre-processing as data and, where its
    shape is fixed, the raw test split."""

    name: str
    x_train: np.ndarray  # (N, C, L) or (N, C, H, W), float32
    y_train: np.ndarray  # (N,) int64
    x_test: np.ndarray
    y_test: np.ndarray
    labels: tuple[str, ...]
    preprocessing: dict[str, Any]  # raw input -> model input, as data (edge.classify.preprocess applies it)
    raw_test: np.ndarray | None = None  # the test split before pre-processing, where it has a fixed shape

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def n_classes(self) -> int:
        return len(self.labels)


def standardize_splits(train: np.ndarray, test: np.ndarray, axes: tuple[int, ...]
                 ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Both splits standardized with the training split's statistics, and the step that does it. A channel
    constant in the training split (a gravity axis at 9.81) is centred, not scaled: its float32 std is
    rounding noise, and dividing by it would turn a device's 9.80 into -1,000 (its std is recorded as 1)."""
    mean = train.mean(axis=axes, keepdims=True, dtype=np.float32)[0]
    std = train.std(axis=axes, keepdims=True, dtype=np.float32)[0] + np.float32(1e-6)
    constant = (train.max(axis=axes, keepdims=True) == train.min(axis=axes, keepdims=True))[0]
    std = np.where(constant, np.float32(1), std).astype(np.float32)
    step = {"op": "standardize", "mean": mean.squeeze().tolist() if mean.size == 1 else mean.tolist(),
            "std": std.squeeze().tolist() if std.size == 1 else std.tolist()}
    return standardize(train, step["mean"], step["std"]), standardize(test, step["mean"], step["std"]), step
