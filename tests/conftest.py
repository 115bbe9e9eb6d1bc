"""Shared fixtures: small scenarios that run in well under a second, and trained, exported models
that every test needing one shares (each distinct training runs once per session)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib
import pytest

if TYPE_CHECKING:
    from models.data.base import Dataset
    from models.nexume.train import TrainResult

matplotlib.use("Agg")


@pytest.fixture
def tiny_overrides() -> dict[str, dict[str, object]]:
    """A 20-minute, 3-node fleet on a constant harvester: fast, with real power cycles."""
    return {
        "run": {"duration_s": 1200.0, "workers": 1, "seed": 5},
        "harvester": {"kind": "constant", "power_w": 2e-3},
        "storage": {"capacitance_f": 2.2e-3},
        "workload": {"sense_period_s": 10.0},
        "nodes": {"count": 3, "record_traces": 2},
    }


@pytest.fixture
def shared_data() -> str:
    from edge.core.files import data_root

    root = data_root()
    if not (root / "harvest" / "nrel").is_dir():
        pytest.skip(f"shared data not found at {root} (set TRICKLE_DATA)")
    return os.fspath(root)


@dataclass(frozen=True)
class Trained:
    """One cached training run and, when formats were asked for, its exported bundle.

    Shared by every test of the session that asks for the same arguments: copy ``result.model``
    (``copy.deepcopy``) before configuring or changing it, and write new files elsewhere.
    """

    checkpoint: Path  # checkpoint.pt (summary.json and summary.md beside it)
    bundle: Path | None  # the bundle folder, or .tar with as_tar; None when no formats were asked for
    data: Dataset  # what it was trained and evaluated on
    result: TrainResult


TrainedBundle = Callable[..., Trained]


@pytest.fixture(scope="session")
def trained_bundle(tmp_path_factory: pytest.TempPathFactory) -> TrainedBundle:
    """``trained_bundle(dataset, method="nexume", epochs=2, formats=None, as_tar=False, harvest_scenario=None)``.

    Trains (once per dataset, method, epochs, harvest_scenario) and saves a checkpoint; with
    ``formats`` (a tuple of export formats, or "all" for every format) also exports an unsigned
    bundle (once per training, formats, as_tar). Everything lives under one session temp folder.
    """
    datasets: dict[str, Dataset] = {}
    trainings: dict[tuple[str, str, int, str | None], tuple[Path, TrainResult]] = {}
    bundles: dict[tuple[object, ...], Path] = {}

    def make(dataset: str, method: str = "nexume", epochs: int = 2, formats: tuple[str, ...] | str | None = None,
             as_tar: bool = False, harvest_scenario: str | None = None) -> Trained:
        from export.bundle import FORMATS, export_bundle
        from models.data.datasets import load
        from models.nexume.checkpoint import save_checkpoint
        from models.nexume.train import TrainConfig, train

        if dataset not in datasets:
            datasets[dataset] = load(dataset)
        data = datasets[dataset]
        key = (dataset, method, epochs, harvest_scenario)
        if key not in trainings:
            scenario = {} if harvest_scenario is None else {"harvest_scenario": harvest_scenario}
            result = train(TrainConfig(dataset=dataset, method=method, epochs=epochs, **scenario), data)
            folder = tmp_path_factory.mktemp(f"trained-{dataset}-{method}-{epochs}")
            save_checkpoint(result, data, folder)
            trainings[key] = (folder / "checkpoint.pt", result)
        checkpoint, result = trainings[key]
        bundle = None
        if formats is not None:
            chosen = tuple(FORMATS) if formats == "all" else tuple(formats)
            bkey = (*key, chosen, as_tar)
            if bkey not in bundles:
                out = tmp_path_factory.mktemp("bundle") / ("bundle.tar" if as_tar else "bundle")
                bundles[bkey] = export_bundle(checkpoint, out, formats=chosen, as_tar=as_tar)
            bundle = bundles[bkey]
        return Trained(checkpoint, bundle, data, result)

    return make
