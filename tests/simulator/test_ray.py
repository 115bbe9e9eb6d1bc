"""Fleets as Ray tasks: a local Ray head with two worker slots runs the same deterministic shards,
and the results are byte-identical to the local run's."""

from __future__ import annotations

import pytest

from edge.core.errors import ConfigError
from simulator.config import load_scenario, scenario_path
from simulator.fleet import simulate
from simulator.report import to_json

pytest.importorskip("ray")


def test_a_fleet_on_ray_is_byte_identical_to_the_local_run() -> None:
    sc = load_scenario(scenario_path("rf_powercast"), run={"duration_s": 1800.0, "workers": 2}, nodes={"count": 12})
    local = simulate(sc)
    shards: list[int] = []
    on_ray = simulate(sc, progress=shards.append, cluster="ray")
    assert to_json(on_ray) == to_json(local) and local.summary["power_cycles"] > 0
    assert sum(shards) == 12 and len(shards) > 1  # several shards, each reported


def test_a_bad_cluster_is_one_clear_error() -> None:
    sc = load_scenario(scenario_path("rf_powercast"), run={"duration_s": 60.0, "workers": 1}, nodes={"count": 1})
    with pytest.raises(ConfigError, match="--cluster = 'dask': must be ray or ray:ADDRESS"):
        simulate(sc, cluster="dask")
