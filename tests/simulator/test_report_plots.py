"""The voltage plot reads at any fleet size and run length: the fleet's envelope over the whole
run (checked against a per-bin minimum and maximum counted by hand) and one representative node
drawn over a window narrow enough to see its charge/discharge cycles."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.config import load_scenario, scenario_path
from simulator.fleet import simulate
from simulator.results import SimulationResult


@pytest.fixture(scope="module")
def fleet() -> SimulationResult:
    scenario = load_scenario(scenario_path("rf_scarce"), run={"duration_s": 2 * 3600.0, "seed": 1, "workers": 1},
                             nodes={"count": 8, "record_traces": 8})
    return simulate(scenario)


def test_the_voltage_plot_shows_the_fleet_envelope_and_a_readable_window_of_one_node(fleet: SimulationResult) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.collections import PolyCollection

    from simulator.report import _voltage_figure, representative_window

    traced = [r for r in fleet.nodes if r.trace is not None]
    fig = _voltage_figure(fleet, traced)
    whole, window = fig.axes
    band = [c for c in whole.collections if isinstance(c, PolyCollection)]
    assert band and whole.get_xlim() == (0.0, 120.0) and whole.get_xlabel() == "time (min)"  # the whole run
    node, a, b = representative_window(fleet, traced)
    cycles = sorted(r.stats.power_cycles for r in traced)
    assert node.stats.power_cycles == cycles[(len(cycles) - 1) // 2] > 100  # the median node of a busy fleet
    assert (b - a) <= fleet.scenario.run.duration_s / 4
    assert node.off_at_s is not None
    failures_in_window = int(np.sum((node.off_at_s >= a) & (node.off_at_s < b)))
    assert 6 <= failures_in_window <= 30  # a readable sawtooth, not a solid band
    lines = [ln for ln in window.get_lines() if len(ln.get_xdata()) > 2]
    assert len(lines) == 1 and window.get_xlabel() == "time (min)" and window.get_ylabel() == "voltage (V)"


def test_the_envelope_holds_every_node_between_its_lowest_and_highest(fleet: SimulationResult) -> None:
    from simulator.report import voltage_envelope

    traced = [r for r in fleet.nodes if r.trace is not None]
    edges, lo, mid, hi = voltage_envelope(fleet, traced, bins=50)
    for k in (0, 7, 31, 49):
        seen = []
        for r in traced:
            assert r.trace is not None
            t, v = np.asarray(r.trace["time_s"]), np.asarray(r.trace["voltage_v"])
            inside = v[(t >= edges[k]) & (t < edges[k + 1])].tolist()
            before = v[t < edges[k]]
            seen += inside + ([float(before[-1])] if len(before) else [])
        assert lo[k] == min(seen) and hi[k] == max(seen)
        assert lo[k] <= mid[k] <= hi[k]
