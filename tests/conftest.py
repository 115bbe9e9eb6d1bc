"""Shared fixtures: small scenarios that run in well under a second."""

from __future__ import annotations

import os

import matplotlib
import pytest

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
    from simulator.data import data_root

    root = data_root()
    if not (root / "harvest" / "nrel").is_dir():
        pytest.skip(f"shared data not found at {root} (set TRICKLE_DATA)")
    return os.fspath(root)
