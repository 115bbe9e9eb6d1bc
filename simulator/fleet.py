"""Run a scenario: build the nodes, simulate them (SimPy, sharded over processes), resolve the network.

Nodes do not interact through energy, so a fleet splits into contiguous shards of
node ids that run independently — here in a multiprocessing pool, later on any
engine that can map ``run_shard`` over shards (Ray). Every random draw is keyed by
(seed, node id), so results do not depend on how the fleet was sharded.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import simpy

from edge.classify.dyninfer import VariantCost, choose_variant, usable_energy_j
from edge.core.errors import ConfigError, DataError
from simulator import network
from simulator.config import Scenario
from simulator.data import resolve_data_file
from simulator.harvesters import build_curves, build_trace
from simulator.node import END, Node, NodeSpec, PowerPath, apply_event, next_event
from simulator.power import Thresholds, curve_regions, load_terms, mppt_point
from simulator.reference import run_fixed_step
from simulator.results import NodeResult, SimulationResult
from simulator.summary import sample_indices, summarize
from simulator.trace import PowerTrace
from simulator.workload import (
    InferenceModel,
    Phase,
    boot_phase,
    build_plan,
    checkpoint_phase,
    jit_load_phases,
    program_phases,
)

_NODE_STREAM = 1  # rng stream of per-node draws; the network uses its own


@dataclass(frozen=True)
class _Shared:
    """What every shard needs, built once in the parent."""

    scenario: Scenario
    harvest: PowerTrace
    plan: tuple[Phase, ...]
    airtime_s: float
    sense_times_s: np.ndarray | None
    variant_plans: tuple[tuple[Phase, ...], ...] = ()
    chooser: DynInferChooser | EarlyChooser | None = None
    path: PowerPath | None = None
    boot_seq: tuple[Phase, ...] = ()
    loop_at: int = -1
    thresholds: Thresholds | None = None  # the power path's, the cut-off raised by the storage's ESR drop


@dataclass(frozen=True)
class DynInferChooser:
    """Picks a variant from the capacitor voltage with edge.classify.dyninfer, as a device would."""

    variants: tuple[VariantCost, ...]
    capacitance_f: float
    v_cut_v: float
    output_efficiency: float
    margin: float

    def __call__(self, v: float, node_id: int = 0, event: int = 0) -> int:
        budget_j = usable_energy_j(v, self.capacitance_f, self.v_cut_v) * self.output_efficiency
        return self.variants.index(choose_variant(self.variants, budget_j, self.margin))


@dataclass
class EarlyChooser:
    """The plan of an early-classification task: the one that senses as many samples as the rule
    takes on the test series this sensing event observes (``summary.sample_indices``)."""

    seed: int
    samples: np.ndarray  # (n_test,): samples the rule takes on each test series
    _drawn: dict[int, np.ndarray] = field(default_factory=dict)

    def __call__(self, v: float, node_id: int = 0, event: int = 0) -> int:
        drawn = self._drawn.get(node_id)
        if drawn is None or event >= len(drawn):  # a prefix of the same stream, grown by doubling
            drawn = sample_indices(self.seed, node_id, len(self.samples), max(2 * event + 2, 64))
            self._drawn[node_id] = drawn
        return int(self.samples[drawn[event]]) - 1


def tx_timing(scenario: Scenario) -> tuple[float, float, float]:
    """(on-air time, radio-on time, radio power) of one result packet."""
    net = scenario.network
    radio = net.radio_profile
    airtime_s = network.packet_airtime_s(net)
    repeats = 3 if net.radio == "ble" else 1  # BLE advertising: the same PDU on the three channels
    return airtime_s, repeats * (radio.startup_s + airtime_s), radio.tx_a * radio.vdd_v


def _shared(scenario: Scenario, model: InferenceModel | None = None) -> _Shared:
    return _with_esr(_plans(scenario, model))


def _plans(scenario: Scenario, model: InferenceModel | None = None) -> _Shared:
    run, st, work = scenario.run, scenario.storage, scenario.workload
    harvest = build_trace(scenario.harvester, run.duration_s, np.random.default_rng([run.seed, 0, 0]))
    airtime_s, on_s, tx_w = tx_timing(scenario)
    th = scenario.thresholds  # of the whole power path
    v_cut = th.v_cut
    # QuantaTasks fit half of what a full charge delivers to the load
    budget_j = 0.5 * usable_energy_j(th.v_on, st.capacitance_f, v_cut) * st.output_efficiency
    path = _power_path(scenario, harvest)
    if work.program:
        if model is not None:
            raise ConfigError("workload.program", "a program", "runs your own phases; it cannot also run a trained "
                              "model's variants (drop --model, or the program)")
        boot_seq, task = program_phases(work, scenario.output.v_out_v)
        loop_at = next((k for k, p in enumerate(work.program) if p.run == "repeat"), -1)
        sense_times = _sense_times(scenario) if task else np.zeros(0)  # no periodic phases: no sensing events
        return _Shared(scenario, harvest, task, airtime_s, sense_times, path=path, boot_seq=boot_seq, loop_at=loop_at)
    if model is None:
        plan = build_plan(work, on_s, tx_w, quanta_budget_j=budget_j)
        return _Shared(scenario, harvest, plan, airtime_s, _sense_times(scenario), path=path)
    if model.early is not None:  # plan k: k + 1 samples sensed, each through the frame model
        frame = model.variants[0]
        plans = tuple(build_plan(work, on_s, tx_w, bits=frame.bits, layers=frame.layers, quanta_budget_j=budget_j,
                                 steps=k) for k in range(1, model.early.horizon + 1))
        return _Shared(scenario, harvest, plans[-1], airtime_s, _sense_times(scenario), plans,
                       EarlyChooser(run.seed, model.early.samples), path=path)
    plans = tuple(build_plan(work, on_s, tx_w, bits=v.bits, layers=v.layers, quanta_budget_j=budget_j)
                  for v in model.variants)
    chooser: DynInferChooser | None = None
    if model.adaptive and len(plans) > 1:
        costs = tuple(VariantCost(v.bits, v.drop, sum(p.energy_j for p in plan), v.accuracy)
                      for v, plan in zip(model.variants, plans))
        chooser = DynInferChooser(costs, st.capacitance_f, v_cut, st.output_efficiency, model.margin)
    return _Shared(scenario, harvest, plans[0], airtime_s, _sense_times(scenario), plans, chooser, path=path)


def _with_esr(shared: _Shared) -> _Shared:
    """The thresholds with the storage's ESR: the terminals sag by I x esr_ohm under a load current I,
    so the load stops at the cut-off plus the drop under the heaviest phase's current there (taken in
    every mode, which is conservative in lighter ones; the I²R loss is not booked)."""
    sc = shared.scenario
    th, esr = sc.thresholds, sc.storage.esr_ohm
    if esr == 0.0:
        return replace(shared, thresholds=th)
    work, eff = sc.workload, sc.storage.output_efficiency
    phases = [*shared.plan, *itertools.chain.from_iterable(shared.variant_plans), *shared.boot_seq,
              boot_phase(work), checkpoint_phase(work)]
    if work.jit_load is not None:
        phases += jit_load_phases(work.jit_load, sc.output.v_out_v)
    # the current the capacitor gives a phase at the cut-off: eq. (1)'s constant power over v, plus its current
    i_peak_a = max(t.p_w / th.v_cut + t.i_a for t in (load_terms(sc.output, eff, p.power_w, p.current_a, True)
                                                        for p in phases))
    v_cut = th.v_cut + i_peak_a * esr
    sags = f"sags the terminals by {i_peak_a * esr:.3g} V under the peak load current ({i_peak_a * 1e3:.3g} mA)"
    if v_cut >= th.v_on:
        raise ConfigError("storage.esr_ohm", esr, f"{sags}: the load would stop at {v_cut:.3g} V, at or above where "
                          f"it switches on ({th.v_on:g} V)")
    jit_v = work.jit_load.threshold_v if work.jit_load is not None else work.jit_threshold_v
    if (work.policy == "jit" or work.jit_load is not None) and jit_v <= v_cut:
        raise ConfigError("storage.esr_ohm", esr, f"{sags}: the load would stop at {v_cut:.3g} V, at or above the "
                          f"JIT checkpoint threshold ({jit_v:g} V), so no checkpoint could be taken")
    chooser = shared.chooser
    if isinstance(chooser, DynInferChooser):
        chooser = replace(chooser, v_cut_v=v_cut)
    return replace(shared, thresholds=Thresholds(th.v_on, v_cut, th.v_max), chooser=chooser)


def _power_path(scenario: Scenario, harvest: PowerTrace) -> PowerPath | None:
    """What a general power path shares across nodes; None for converters on both sides."""
    if scenario.simple_power_path:
        return None
    inp, out, eff = scenario.input, scenario.output, scenario.storage.output_efficiency
    if inp.kind == "converter":
        return PowerPath(inp, out, eff, "power", harvest.time_s, np.zeros(len(harvest.time_s), dtype=np.int64))
    if inp.kind == "bq25570" and scenario.harvester.kind != "iv_curve":
        return PowerPath(inp, out, eff, "bq_power", harvest.time_s, np.zeros(len(harvest.time_s), dtype=np.int64))
    curves = build_curves(scenario.harvester, scenario.run.duration_s)
    if inp.kind == "bq25570":
        mppt = tuple(mppt_point(v, i, inp.mppt_fraction) for v, i in curves.curves)
        return PowerPath(inp, out, eff, "bq_curve", curves.time_s, curves.index, mppt=mppt)
    drop = inp.diode_drop_v if inp.kind == "diode" else 0.0
    regions = tuple(curve_regions(v, i, drop) for v, i in curves.curves)
    return PowerPath(inp, out, eff, "curve", curves.time_s, curves.index, regions=regions, drop_v=drop)


def _sense_times(scenario: Scenario) -> np.ndarray | None:
    path = scenario.workload.sense_trace
    if path is None:
        return None
    file = resolve_data_file(path, "workload.sense_trace")
    try:
        times = np.loadtxt(file, delimiter=",", usecols=0, ndmin=1, comments="#", skiprows=_header_rows(file))
    except ValueError as e:
        raise DataError(f"workload.sense_trace: {file}: {e}") from None
    if np.any(np.diff(times) < 0):
        raise DataError(f"workload.sense_trace: {file}: event times must be non-decreasing")
    return times[(times >= 0) & (times < scenario.run.duration_s)]


def _header_rows(file: os.PathLike[str]) -> int:
    with open(file) as fh:
        first = fh.readline().split(",")[0].strip()
    try:
        float(first)
        return 0
    except ValueError:
        return 1


def _node_spec(shared: _Shared, node_id: int) -> NodeSpec:
    sc = shared.scenario
    rng = np.random.default_rng([sc.run.seed, node_id, _NODE_STREAM])
    scale = float(rng.uniform(sc.nodes.harvest_scale_min, sc.nodes.harvest_scale_max))
    offset = sc.workload.sense_offset_s
    if offset is None:
        offset = float(rng.uniform(0.0, sc.workload.sense_period_s))
    jit = sc.workload.jit_load
    v_out = sc.output.v_out_v
    return NodeSpec(
        node_id=node_id, storage=sc.storage, work=sc.workload, plan=shared.plan, harvest=shared.harvest,
        harvest_scale=scale, sense_times_s=shared.sense_times_s, sense_offset_s=offset,
        airtime_s=shared.airtime_s, record_trace=node_id < sc.nodes.record_traces,
        variant_plans=shared.variant_plans, choose_variant=shared.chooser, thresholds=shared.thresholds,
        path=shared.path, boot_seq=shared.boot_seq, loop_at=shared.loop_at,
        jit_phases=None if jit is None else jit_load_phases(jit, v_out),
        jit_threshold_v=None if jit is None else jit.threshold_v,
        hold=None if jit is None or jit.hold_a is None else (jit.hold_a * v_out, jit.hold_a),
        gate_quiescent_a=sc.output.gate_quiescent_a,
    )


# Events where a node process yields to SimPy's queue. Nodes do not interact (their packets meet
# only at the gateway, resolved after the run), so only the end is one; every other event
# (harvest steps, sensing, phases, voltage crossings) is applied in closed form without a round
# trip through the queue, since no other process observes it. An interaction between nodes
# would add its event kinds here.
_SYNC = (END,)


def _node_process(env: simpy.Environment, node: Node) -> Generator[simpy.Event, None, None]:
    while True:
        t_next, kind, v_new, clamped = next_event(node)
        if kind in _SYNC:
            yield env.timeout(max(t_next - env.now, 0.0))
        apply_event(node, t_next, kind, v_new, clamped)
        if kind == END:
            return


def run_shard(shared: _Shared, node_ids: range) -> list[NodeResult]:
    """Simulate the nodes ``node_ids`` in one SimPy environment (or the fixed-step reference)."""
    run = shared.scenario.run
    nodes = [Node(_node_spec(shared, i), run.duration_s) for i in node_ids]
    if run.engine == "exact":
        env = simpy.Environment()
        for node in nodes:
            env.process(_node_process(env, node))
        env.run()
    else:
        for node in nodes:
            run_fixed_step(node, run.step_s)
    return [_result(node) for node in nodes]


def _result(node: Node) -> NodeResult:
    trace: dict[str, list[Any]] | None = None
    if node.spec.record_trace:
        trace = {"time_s": node.trace_t, "voltage_v": node.trace_v, "mode": node.trace_mode, "event": node.trace_event,
                 "phase": node.trace_phase, "ended": node.trace_ended}
    packets = np.asarray(node.packets, dtype=np.float64).reshape(-1, 3)
    task_log = np.asarray(node.task_log, dtype=np.int64).reshape(-1, 3)
    done_s = np.asarray(node.task_done_s, dtype=np.float64)
    latency_s = np.asarray(node.task_latency_s, dtype=np.float64)
    return NodeResult(node.spec.node_id, node.spec.harvest_scale, node.finish(), packets, trace, task_log, done_s,
                      latency_s, np.asarray(node.on_at, dtype=np.float64), np.asarray(node.off_at, dtype=np.float64))


def _shards(n_nodes: int, n_shards: int) -> list[range]:
    bounds = np.linspace(0, n_nodes, n_shards + 1).round().astype(int)
    return [range(a, b) for a, b in itertools.pairwise(bounds.tolist()) if b > a]


def simulate(
    scenario: Scenario, progress: Callable[[int], None] | None = None, model: InferenceModel | None = None,
    cluster: str | None = None,
) -> SimulationResult:
    """Run ``scenario``; ``progress`` is called with the number of nodes each finished shard held.

    With ``model`` the task runs that trained model's variants (DynInfer picks one per task when
    the model is adaptive) and the summary adds accuracy-within-deadline. ``cluster``
    "ray[:ADDRESS]" runs the same shards as Ray tasks (a local Ray with ``run.workers`` CPUs, or
    the cluster at ADDRESS, e.g. ``auto`` or ``ray://head:10001``); the results are identical to
    the local run's, as every node's randomness is keyed by (seed, node id).
    """
    shared = _shared(scenario, model)
    n = scenario.nodes.count
    workers = min(scenario.run.workers or os.cpu_count() or 1, n)
    shards = _shards(n, min(n, max(workers * 8, 1)))
    if cluster is not None:
        parts = _run_ray(shared, shards, cluster, scenario.run.workers, progress)
    elif workers == 1:
        parts = []
        for shard in shards:
            parts.append(run_shard(shared, shard))
            if progress:
                progress(len(shard))
    else:
        parts = _run_pool(shared, shards, workers, progress)
    nodes = [r for part in parts for r in part]
    distances = network.node_distances_m(scenario.network, n, scenario.run.seed)
    resolution = network.resolve(_packet_log(scenario, nodes, distances), scenario.network, scenario.run.seed)
    result = SimulationResult(scenario, nodes, distances, resolution, shared.harvest, model,
                              plan_energy_j=tuple(sum(p.energy_j for p in plan) for plan in shared.variant_plans))
    result.summary = summarize(result)
    return result


def _run_pool(
    shared: _Shared, shards: list[range], workers: int, progress: Callable[[int], None] | None
) -> list[list[NodeResult]]:
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    with ctx.Pool(workers, initializer=_init_worker, initargs=(shared,)) as pool:
        parts = []
        for part in pool.imap(_run_in_worker, shards):  # imap keeps shard order: deterministic output
            parts.append(part)
            if progress:
                progress(len(part))
    return parts


def _run_ray(shared: _Shared, shards: list[range], cluster: str, cpus: int | None,
             progress: Callable[[int], None] | None) -> list[list[NodeResult]]:
    """The shards as Ray tasks, gathered in shard order (so the output is the local run's)."""
    kind, _, address = cluster.partition(":")
    if kind != "ray":
        raise ConfigError("--cluster", cluster, "must be ray or ray:ADDRESS (e.g. ray:auto, ray://head:10001)")
    try:
        import ray
    except ImportError:
        raise ConfigError("--cluster", cluster, "needs Ray: pip install 'trickle[cluster]'") from None
    started = not ray.is_initialized()
    if started:
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:  # a local Ray: a head and run.workers worker slots (every core when not set)
                ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        except Exception as err:  # Ray raises its own types (RpcError, ConnectionError, ...) for a cluster it cannot reach
            raise ConfigError("--cluster", cluster, f"Ray could not start or connect: {err}") from None
    try:
        task = ray.remote(run_shard)
        held = ray.put(shared)
        pending = [task.remote(held, shard) for shard in shards]
        parts = []
        for ref in pending:
            parts.append(ray.get(ref))
            if progress:
                progress(len(parts[-1]))
        return parts
    finally:
        if started:
            ray.shutdown()


_WORKER_SHARED: _Shared | None = None


def _init_worker(shared: _Shared) -> None:
    global _WORKER_SHARED
    _WORKER_SHARED = shared


def _run_in_worker(shard: range) -> list[NodeResult]:
    assert _WORKER_SHARED is not None
    return run_shard(_WORKER_SHARED, shard)


def _packet_log(scenario: Scenario, nodes: list[NodeResult], distances_m: np.ndarray) -> network.PacketLog:
    net = scenario.network
    logs = []
    for r in nodes:
        k = len(r.packets)
        rng = np.random.default_rng([scenario.run.seed, r.node_id, _NODE_STREAM + 1])
        rx = network.received_power_dbm(net.tx_power_dbm, distances_m[r.node_id], net.frequency_hz, net.path_loss_exponent)
        logs.append(network.PacketLog(
            node_id=np.full(k, r.node_id, dtype=np.int64), start_s=r.packets[:, 0], airtime_s=r.packets[:, 1],
            channel=rng.integers(0, net.channels, size=k).astype(np.int16),
            sf=np.full(k, net.spreading_factor, dtype=np.int8), rx_power_dbm=np.full(k, float(rx)),
            deadline_s=r.packets[:, 2],
        ))
    return network.PacketLog.concatenate(logs)
