"""The fleet summary: totals over nodes and the rates a reader looks for first.

``simulate`` stores ``summarize(result)`` as ``result.summary``; ``simulator.report`` writes it
to results.json and report.md, and the CLI prints it.
"""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np

from simulator.results import NodeResult, SimulationResult
from simulator.workload import InferenceModel

PACKET_OUTCOMES = ("delivered", "delivered_in_time", "collided", "lost", "below_sensitivity")

# rng stream of the test sample each sensing event observes (simulator.fleet's per-node draws use 1 and 2)
_SAMPLE_STREAM = 3


def summarize(result: SimulationResult) -> dict[str, float | int]:
    """Fleet totals and the rates a reader looks for first."""
    sc = result.scenario
    totals: dict[str, float] = {}
    completions: dict[str, int] = {}
    for r in result.nodes:
        for k, v in asdict(r.stats).items():
            if k == "phase_counts":
                for name, count in v.items():
                    completions[name] = completions.get(name, 0) + count
            elif k not in ("v_initial_v", "v_final_v"):
                totals[k] = totals.get(k, 0) + v
    n, duration = len(result.nodes), sc.run.duration_s
    done = totals["completed"] + totals["missed"]
    summary: dict[str, float | int] = {"nodes": n, "duration_s": duration, **totals}
    summary["availability"] = totals["on_time_s"] / (n * duration)
    summary["completed_fraction"] = totals["completed"] / totals["released"] if totals["released"] else 0.0
    # design objectives and constraints ("95 % delivered") read the ratios by these names
    summary["tasks_completed_ratio"] = summary["completed_fraction"]
    summary["inferences_per_node_hour"] = done / n / (duration / 3600.0)
    summary["load_energy_per_result_j"] = totals["load_j"] / done if done else math.nan
    summary["mean_latency_s"] = totals["latency_sum_s"] / done if done else math.nan
    summary.update(period_summary(result.nodes))
    for name in sorted(completions):  # per-phase completion counts ("a packet is a completed SEND")
        summary[f"phase_{name}_completed"] = completions[name]
    res = result.resolution
    for k in PACKET_OUTCOMES:
        summary[f"packets_{k}"] = int(getattr(res, k).sum())
    on_air = len(res.outcome)  # every packet a node sent, whatever became of it
    summary["packets_delivered_ratio"] = summary["packets_delivered"] / on_air if on_air else 0.0
    if result.model is not None:
        summary.update(_accuracy_summary(result, result.model))
    return summary


def period_stats(periods: np.ndarray, prefix: str) -> dict[str, float | int]:
    """``{prefix}_count``, ``_mean_s``, ``_min_s``, ``_max_s`` of some on- or off-periods (NaN when none)."""
    if not len(periods):
        return {f"{prefix}_count": 0, f"{prefix}_mean_s": math.nan, f"{prefix}_min_s": math.nan, f"{prefix}_max_s": math.nan}
    return {f"{prefix}_count": len(periods), f"{prefix}_mean_s": float(periods.mean()), f"{prefix}_min_s": float(periods.min()),
            f"{prefix}_max_s": float(periods.max())}


def period_summary(nodes: list[NodeResult]) -> dict[str, float | int]:
    """Every node's complete on-periods (boot to power failure) and off-periods (failure to the
    next boot), pooled: what a logic-analyser capture of the power rail shows."""
    pairs = [r.periods() for r in nodes]
    on = np.concatenate([p[0] for p in pairs]) if pairs else np.zeros(0)
    off = np.concatenate([p[1] for p in pairs]) if pairs else np.zeros(0)
    return {**period_stats(on, "on_period"), **period_stats(off, "off_period")}


def sample_indices(seed: int, node_id: int, n_test: int, events: int) -> np.ndarray:
    """The test sample each of the first ``events`` sensing events of node ``node_id`` observes
    (index by event number; a longer draw extends a shorter one)."""
    rng = np.random.default_rng([seed, node_id, _SAMPLE_STREAM])
    return rng.integers(0, n_test, size=max(events, 1))


def _accuracy_summary(result: SimulationResult, model: InferenceModel) -> dict[str, float | int]:
    """Accuracy within deadline: a sensing event counts as right only if its result came in time and
    was correct; events lost, dropped, late or unfinished count as wrong."""
    seed = result.scenario.run.seed
    right, released, decided, taken, lost_j = 0, 0, 0, 0, 0.0
    usage = np.zeros(len(result.plan_energy_j) or len(model.variants), dtype=np.int64)
    for r in result.nodes:
        released += r.stats.released
        lost_j += r.stats.lost_work_j
        log = r.task_log if r.task_log is not None else np.zeros((0, 3), dtype=np.int64)
        samples = sample_indices(seed, r.node_id, model.n_test, r.stats.released)
        for event, variant, in_time in log:
            usage[variant] += 1
            decided += 1
            if model.early is not None:  # variant k: the plan of k + 1 samples, the one series event observed
                assert model.early.samples[samples[event]] == variant + 1
                taken += variant + 1
                right += int(in_time and model.variants[0].correct[samples[event]])
            else:
                right += int(in_time and model.variants[variant].correct[samples[event]])
    out: dict[str, float | int] = {"accuracy_within_deadline": right / released if released else 0.0}
    if model.early is not None:
        plans_j = float(usage @ np.asarray(result.plan_energy_j))
        out |= {"decisions": decided, "samples_per_decision": taken / decided if decided else math.nan,
                "energy_per_decision_j": (plans_j + lost_j) / decided if decided else math.nan}
        return out
    for i, v in enumerate(model.variants):
        out[f"variant_{v.bits}b_d{v.drop:g}_tasks"] = int(usage[i])
    return out
