"""``trickle train firmbound``: FIRMBOUND on a data set, scored on its test split, saved for export.

    data = load_user("Coffee.npz")                     # or a built-in series set, or ucr:NAME
    clf, summary, paths = train_firmbound(data, {"cost": "accurate"}, Path("runs/train/coffee-firmbound"))

The classifier learns from the series as a device senses them: the loader's per-channel
standardization is undone (``models.data.raw``; FIRMBOUND standardizes each sample itself, and the
bundle's pre-processing is that one step), so the exported rule takes raw samples.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edge.core.errors import DataError
from models.data.base import Dataset
from models.data.raw import raw_series
from models.firmbound.checkpoint import save_checkpoint
from models.firmbound.classifier import FirmboundClassifier, harmonic_mean


def score(clf: FirmboundClassifier, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Accuracy, mean samples taken, earliness, harmonic mean, and the accuracy after all T samples."""
    tau, pred = clf.decisions(x)
    length = x.shape[2]
    pi, _ = clf.prefix_posteriors(x)
    accuracy, earliness = float((pred == y).mean()), float((tau / length).mean())
    return {"accuracy": accuracy, "mean_samples": float(tau.mean()), "earliness": earliness,
            "hm": harmonic_mean(accuracy, earliness),
            "full_length_accuracy": float((clf.classes_[pi[:, -1].argmax(1)] == y).mean())}


def train_firmbound(data: Dataset, params: dict[str, Any], out_dir: Path,
                    progress: Callable[[str, int, int], None] | None = None, dataset: str | None = None,
                    dataset_sha256: str | None = None) -> tuple[FirmboundClassifier, dict[str, Any], list[Path]]:
    """Fit ``FirmboundClassifier(**params)`` on ``data``'s training split (raw), score it on the test
    split, and write checkpoint.pt, summary.json and summary.md to ``out_dir``."""
    x, xt = raw_series(data)
    y, yt = data.y_train, data.y_test
    missing = sorted(set(np.unique(yt).tolist()) - set(np.unique(y).tolist()))
    if missing:
        raise DataError(f"{data.name}: class(es) {[data.labels[i] for i in missing]} only in the test split; FIRMBOUND "
                        "learns from the training split")
    clf = FirmboundClassifier(**params).with_progress(progress)
    started = time.perf_counter()
    clf.fit(x, y)
    seconds = time.perf_counter() - started
    choice = (f"{clf.cost}, chosen by internal validation" if clf.sampling_cost() is None else
              "energy per sample / joules per loss" if clf.energy_per_sample_j is not None else "given")
    labels = [data.labels[c] for c in clf.classes_]
    summary = {"dataset": data.name, "n_train": len(y), "n_test": len(yt), "channels": int(x.shape[1]),
               "length": int(x.shape[2]), "labels": labels,
               "estimator": clf.estimator, "cost": float(clf.cost_), "decision_points": len(clf.points_),
               "cost_choice": choice,
               "train_time_s": seconds, **score(clf, xt, yt)}
    paths = save_checkpoint(clf, labels, x, xt, out_dir, summary, dataset, dataset_sha256)
    return clf, summary, paths
