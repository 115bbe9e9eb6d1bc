"""What a simulation returns: one ``NodeResult`` per node and the fleet's ``SimulationResult``
(below ``simulator.fleet``, which makes them, and ``simulator.summary``, which sums them up)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator import network
from simulator.config import Scenario
from simulator.node import NodeStats
from simulator.trace import PowerTrace
from simulator.workload import InferenceModel


@dataclass
class NodeResult:
    """One node's run: its statistics, packets, trace (when recorded), task log and on/off edges."""

    node_id: int
    harvest_scale: float
    stats: NodeStats
    packets: np.ndarray  # (n, 3): start_s, airtime_s, deadline_s
    trace: dict[str, list[Any]] | None = None
    task_log: np.ndarray | None = None  # (k, 3) int: sensing event, variant, within deadline
    task_done_s: np.ndarray | None = None  # (k,) when each logged task finished
    task_latency_s: np.ndarray | None = None  # (k,) finish - sensing event
    on_at_s: np.ndarray | None = None  # when each on-period began (the load connected at v_on)
    off_at_s: np.ndarray | None = None  # when each ended in a power failure

    def periods(self) -> tuple[np.ndarray, np.ndarray]:
        """(on-periods, off-periods) in s: every complete on-time (boot to power failure) and every
        complete off-time (power failure to the next boot); the charge from t = 0 and a period cut
        by the end of the run are not periods."""
        on = np.zeros(0) if self.on_at_s is None else self.on_at_s
        off = np.zeros(0) if self.off_at_s is None else self.off_at_s
        ended = off[: len(on)]  # the k-th failure ends the k-th on-period
        return ended - on[: len(ended)], on[1 : len(off) + 1] - off[: max(len(on) - 1, 0)]


@dataclass
class SimulationResult:
    """A fleet's run: the scenario, every node's result, the network's resolution, the harvest trace
    and the summary."""

    scenario: Scenario
    nodes: list[NodeResult]
    distances_m: np.ndarray
    resolution: network.Resolution
    harvest: PowerTrace
    model: InferenceModel | None = None
    summary: dict[str, float | int] = field(default_factory=dict)
    plan_energy_j: tuple[float, ...] = ()  # load energy of each variant's plan, run through without a failure
