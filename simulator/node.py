"""One energy-harvesting node: the state machine shared by the exact and the fixed-step engines.

The node is always in one mode; each mode draws a constant load, so with the harvest
trace piecewise constant, eq. (1) of ``capacitor.py`` has constant coefficients between
events. The exact engine (``next_event`` then ``apply_event``) jumps from event to event
with closed-form crossing times; ``simulator.reference`` steps the same machine on a
fixed grid.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from simulator import capacitor
from simulator.power import CurveRegions, InputConfig, LoadTerms, OutputConfig, Thresholds, load_terms
from simulator.storage import StorageConfig
from simulator.trace import PowerTrace
from simulator.workload import Phase, WorkloadConfig, boot_phase, checkpoint_phase, restore_phase


class Mode(IntEnum):
    """What a node is doing: off, booting, restoring, running, checkpointing, idle, hibernating or in a
    sequence phase."""

    OFF = 0  # load disconnected, the capacitor charges
    BOOT = 1
    RESTORE = 2  # reading progress back from NVM after a boot
    RUN = 3  # executing a phase of the current task
    CHECKPOINT = 4  # jit: saving volatile state
    IDLE = 5  # sleeping until the next sensing event
    HIBERNATE = 6  # jit: sleeping on a checkpoint until the voltage recovers
    SEQ = 7  # running a phase of the program's boot sequence (once_per_boot, repeat, until_power_fails)


class NodeEvent(IntEnum):
    """What the exact engine schedules next: the run's end, a harvest change, a phase's end, a sensing
    event, or a voltage threshold crossed."""

    END = 0
    HARVEST = 1  # the harvest trace steps
    PHASE = 2  # the current phase finishes
    SENSE = 3  # a sensing event
    V_ON = 4  # voltage rises to v_on
    V_CUT = 5  # voltage falls to the cut-off: power failure
    V_JIT = 6  # voltage falls to the jit threshold
    V_MAX = 7  # voltage reaches the clamp
    V_SEG = 8  # voltage crosses an edge of the power path's regions (a cell's I-V segment, cold start)
    MPPT = 9  # the charger stops to sample V_oc, or starts again
    V_BANK = 10  # voltage reaches a bank threshold: a bank capacitor connects (rising) or is isolated (falling)
    PERIODIC = 11  # a JitLoad's periodic checkpoint is due


# Looking up an enum member costs ~0.1 µs in CPython 3.11, ten times a global: the hot
# paths below use these aliases.
OFF, BOOT, RESTORE, RUN, CHECKPOINT, IDLE, HIBERNATE, SEQ = Mode
END, HARVEST, PHASE, SENSE, V_ON, V_CUT, V_JIT, V_MAX, V_SEG, MPPT, V_BANK, PERIODIC = NodeEvent


@dataclass
class NodeStats:
    """Per-node results. Energies in J at the point named; leaked_j includes the power path's quiescent draw."""

    harvested_j: float = 0.0  # transducer output
    input_loss_j: float = 0.0  # lost in the MPPT/boost converter
    wasted_j: float = 0.0  # shunted at the clamp
    leaked_j: float = 0.0
    load_j: float = 0.0  # delivered to MCU, sensor and radio
    output_loss_j: float = 0.0  # lost in the buck/LDO
    lost_work_j: float = 0.0  # load energy of work a power failure rolled back
    on_time_s: float = 0.0
    power_cycles: int = 0  # power failures (on -> off)
    boots: int = 0
    checkpoints: int = 0
    released: int = 0  # sensing events
    lost_off: int = 0  # sensing events while the node was off or booting
    dropped: int = 0  # sensing events that found the queue full
    completed: int = 0  # results within the deadline
    missed: int = 0  # results after the deadline
    unfinished: int = 0  # tasks still pending at the end
    packets_sent: int = 0
    latency_sum_s: float = 0.0  # of completed + missed results
    v_initial_v: float = 0.0
    v_final_v: float = 0.0
    stored_delta_j: float = 0.0  # in the capacitor, and in a bank's isolated capacitors
    switching_loss_j: float = 0.0  # lost to charge sharing as a bank capacitor connects
    phase_counts: dict[str, int] = field(default_factory=dict)  # completions per phase name (a packet: a tx/send)


@dataclass(frozen=True)
class NodeSpec:
    """Everything one node needs; shared objects (trace, plan) are not copied per node."""

    node_id: int
    storage: StorageConfig
    work: WorkloadConfig
    plan: tuple[Phase, ...]
    harvest: PowerTrace
    harvest_scale: float  # shading / placement factor of this node
    sense_times_s: np.ndarray | None  # explicit sensing events, or None for periodic
    sense_offset_s: float
    airtime_s: float  # on-air part of the tx phase (the rest is radio start-up)
    record_trace: bool = False
    variant_plans: tuple[tuple[Phase, ...], ...] = ()  # one plan per model variant (adaptive inference)
    # (capacitor voltage, node id, sensing event) -> variant, at task start: DynInfer's choice, or
    # an early rule's plan for the series this event observes
    choose_variant: Callable[[float, int, int], int] | None = None
    thresholds: Thresholds | None = None  # of the whole power path (None: the storage's and the MCU's)
    path: PowerPath | None = None  # a power path beyond converters (None: eq. 1 terms are powers)
    boot_seq: tuple[Phase, ...] = ()  # the program's once_per_boot, repeat and until_power_fails phases
    loop_at: int = -1  # index in boot_seq of the first repeat phase
    jit_phases: tuple[Phase, Phase] | None = None  # (checkpoint, restore) of a JitLoad
    jit_threshold_v: float | None = None
    hold: tuple[float, float] | None = None  # (power W, current A) while holding on a JitLoad checkpoint
    gate_quiescent_a: float = 0.0  # a comparator switching the output: its supply current, always drawn


@dataclass(frozen=True)
class PowerPath:
    """A scenario's input and output parts, with what every node shares precomputed."""

    inp: InputConfig
    out: OutputConfig
    out_eff: float  # storage.output_efficiency, for the converter output
    source: str  # "curve" (direct, diode), "bq_curve" (bq25570 on an I-V curve), "bq_power" (bq25570, input_v),
    # "power" (the converter input in front of another output stage)
    seg_time_s: np.ndarray  # start of each source segment
    seg_curve: np.ndarray  # curve index of each segment (curve sources)
    regions: tuple[CurveRegions, ...] = ()  # per curve, on the capacitor's voltage axis
    mppt: tuple[tuple[float, float], ...] = ()  # per curve: (V_in, I_in) where the MPPT holds the cell
    drop_v: float = 0.0  # the diode's


@dataclass
class _Progress:
    phase: int = 0
    elapsed_s: float = 0.0


class Node:
    """The mutable state of one node and the transitions between its modes."""

    def __init__(self, spec: NodeSpec, end_s: float) -> None:
        s, w = spec.storage, spec.work
        self.spec, self.end_s = spec, end_s
        path = self.path = spec.path
        self.simple = path is None
        self.c_f, self.i_a, self.g_s = s.capacitance_f, s.current_draw_a + spec.gate_quiescent_a, s.conductance_s
        self.eta_in, self.eta_out = s.input_efficiency, s.output_efficiency
        # a reconfigurable bank: capacitors beside c_f, connected in order; the isolated ones' voltages
        # and since when they are isolated
        self.bank = s.bank_f
        self.bank_on = 0
        self.bank_v = [0.0] * len(s.bank_f)
        self.bank_since = [0.0] * len(s.bank_f)
        self.bank_g = s.bank_conductance_s
        self.v_connect = s.bank_connect_v if s.bank_connect_v is not None else math.inf
        self.v_isolate = s.bank_isolate_v if s.bank_isolate_v is not None else -math.inf
        th = spec.thresholds
        if th is None:
            th = Thresholds(s.v_on_v, s.cut_off_v(w.mcu_profile), s.v_max_v)
        self.v_on, self.v_cut, self.v_max = th.v_on, th.v_cut, th.v_max
        self.v_jit = -1.0
        if spec.jit_threshold_v is not None:
            self.v_jit = spec.jit_threshold_v
        elif w.policy == "jit":
            self.v_jit = w.jit_threshold_v
        self.sleep_w = w.mcu_profile.sleep_power_w()
        self.hold = spec.hold if spec.hold is not None else (self.sleep_w, 0.0)
        self.boot, self.ckpt = boot_phase(w), checkpoint_phase(w)
        self.restore_jit: Phase | None = None
        if spec.jit_phases is not None:
            self.ckpt, self.restore_jit = spec.jit_phases
        jit = w.jit_load
        self.ckpt_period_s = math.inf if jit is None or jit.checkpoint_period_s is None else jit.checkpoint_period_s
        self.restore_every_boot = jit is not None and jit.restore_on_boot
        self.next_ckpt_s = math.inf  # the next periodic checkpoint (armed while a phase runs)
        self.periodic = False  # the checkpoint in progress is a periodic one: run on after it
        self.boot_restoring = False  # the restore in progress is restore_on_boot's
        # the program's boot sequence: position, durable completions, a jit checkpoint of it
        self.seq, self.loop_at = spec.boot_seq, spec.loop_at
        self.seq_i = -1
        self.seq_done: set[int] = set()
        self.seq_ckpt: tuple[int, float] | None = None  # (phase, remaining s) saved in NVM
        self.seq_saving: tuple[int, float] | None = None  # what a checkpoint in progress saves
        self.seq_t0 = 0.0  # when the current boot-sequence phase started
        self.v = min(s.v_initial_v, self.v_max)
        self.t = 0.0
        self.mode = OFF
        self.load_w = 0.0  # load power of the current mode, at the load
        self.phase: Phase | None = None  # what a finite mode is executing
        self.remaining_s = math.inf
        self.task_release_s: float | None = None  # the task in progress
        self.pos = _Progress()  # volatile progress in the plan
        self.durable = _Progress()  # progress in NVM
        self.restore_bytes = 0
        self.queue: deque[tuple[float, int]] = deque()  # (release time, sensing event number)
        self.plan = spec.plan
        self.variant = 0
        self.task_event = -1
        self.task_log: list[tuple[int, int, bool]] = []  # (sensing event, variant, within deadline)
        self.task_done_s: list[float] = []  # when each logged task finished
        self.task_latency_s: list[float] = []  # and how long after its sensing event
        self.jit_armed = True
        # the voltage has been above the JIT threshold since the firmware armed its comparator (a phase
        # or idle after the boot): only then is a voltage at or below it a falling crossing
        self.jit_above = False
        self.seg = 0
        self.seg_time_s = spec.harvest.time_s if path is None or path.source == "bq_power" else path.seg_time_s
        self.harvest_w = float(spec.harvest.power_w[0]) * spec.harvest_scale
        self.next_harvest_s = self._next_harvest_s()
        # eq. (1) terms: p, i, g; in a general power path, the source's and the load's parts
        self.p, self.i, self.g = self.eta_in * self.harvest_w, self.i_a, self.g_s
        self.src_p = self.src_i = self.src_g = 0.0
        self.src_a = self.src_b = 0.0  # a cell's current a - b v on the capacitor side (for booking)
        self.load = LoadTerms(0.0, 0.0, 0.0, 0.0)
        self.edges: tuple[float, ...] = ()
        self.region = 0
        self.regions: CurveRegions | None = None
        self.sampling = False
        self.pinned = False  # resting on a region edge both sides push towards (the charger's cold-start edge)
        self.next_mppt_s = math.inf
        self._load_cache: dict[tuple[float, float, bool], LoadTerms] = {}
        self.next_sense_idx = 0
        self.next_sense_s = self._sense_time(0)
        self.stats = NodeStats(v_initial_v=self.v)
        self.packets: list[tuple[float, float, float]] = []  # (start_s, airtime_s, deadline_s)
        self.on_at: list[float] = []  # when the load was connected (each boot starts an on-period)
        self.off_at: list[float] = []  # when power failed (each ends one)
        self.trace_t: list[float] = []
        self.trace_v: list[float] = []
        self.trace_mode: list[int] = []
        self.trace_event: list[int] = []  # what happened at each row (-1: the start)
        self.trace_phase: list[str] = []  # the phase running after each row ("" when none)
        self.trace_ended: list[str] = []  # at a phase row, the phase that finished
        self.ended = ""  # the phase the event being handled finished
        self.tracing = spec.record_trace
        if path is not None:
            if path.source in ("bq_curve", "bq_power") and path.inp.mppt_sample_s > 0:
                self.next_mppt_s = 0.0
            self._set_load(0.0, 0.0, False)
            self._source_segment()
        self.record()
        if self.v >= self.v_on:
            self._power_on()

    # ---- coefficients of eq. (1) -------------------------------------------------

    def net_power_w(self) -> float:
        """The constant-power part p_w of eq. (1)."""
        return self.eta_in * self.harvest_w - self.load_w / self.eta_out

    def _coeffs(self) -> None:
        """Refresh eq. (1)'s p, i, g after the load, the source or the region changed."""
        if self.simple:
            self.p = self.eta_in * self.harvest_w - self.load_w / self.eta_out
        else:
            load = self.load
            self.p = self.src_p - load.p_w
            self.i = self.src_i + load.i_a + self.i_a
            self.g = self.src_g + self.g_s

    def _set_load(self, power_w: float, current_a: float, on: bool) -> None:
        key = (power_w, current_a, on)
        load = self._load_cache.get(key)
        if load is None:
            assert self.path is not None
            load = self._load_cache[key] = load_terms(self.path.out, self.path.out_eff, power_w, current_a, on)
        self.load = load

    # ---- the source side of a general power path ---------------------------------

    def _source_segment(self) -> None:
        """A new source segment: its curve's regions (or the charger's), and the region v lies in."""
        path = self.path
        assert path is not None
        if path.source == "curve":
            self.regions = path.regions[int(path.seg_curve[self.seg])]
            self.edges = self.regions.edges
        elif path.source == "power":
            self.edges = ()
        else:
            self.edges = (path.inp.vstor_chgen_v,)
        self.region = bisect_right(self.edges, self.v) if self.edges else 0
        self._source_terms()

    def _source_terms(self) -> None:
        path = self.path
        assert path is not None
        scale = self.spec.harvest_scale
        if path.source == "curve":
            assert self.regions is not None
            a, b = self.regions.a[self.region] * scale, self.regions.b[self.region] * scale
            self.src_a, self.src_b = a, b
            self.src_p, self.src_i, self.src_g = 0.0, -a, b
        elif path.source == "power":  # a power source through the converter (storage.input_efficiency)
            self.harvest_w = float(self.spec.harvest.power_w[self.seg]) * scale
            self.src_p = self.eta_in * self.harvest_w
        else:
            if path.source == "bq_curve":
                v_in, i_in = path.mppt[int(path.seg_curve[self.seg])]
                p_in = v_in * i_in * scale
            else:
                v_in = path.inp.input_v or 0.0
                p_in = float(self.spec.harvest.power_w[self.seg]) * scale
            cold = self.region == 0
            if self.sampling and not cold:  # the charger is off while it samples V_oc
                p_in = 0.0
            self.src_p = path.inp.charger_power_w(v_in, p_in, cold) if p_in > 0 else 0.0
            self.harvest_w = p_in if self.src_p > 0.0 else 0.0  # below its minimum input the charger draws nothing
        self._coeffs()

    # ---- scheduled (non-voltage) events ------------------------------------------

    def _sense_time(self, k: int) -> float:
        times = self.spec.sense_times_s
        if times is not None:
            return float(times[k]) if k < len(times) else math.inf
        return self.spec.sense_offset_s + k * self.spec.work.sense_period_s

    def _next_harvest_s(self) -> float:
        times = self.seg_time_s
        return float(times[self.seg + 1]) if self.seg + 1 < len(times) else math.inf

    def scheduled(self) -> tuple[float, NodeEvent]:
        """The earliest event that does not depend on the voltage."""
        best, kind = self.end_s, END
        if self.next_harvest_s < best:
            best, kind = self.next_harvest_s, HARVEST
        if self.next_sense_s < best:
            best, kind = self.next_sense_s, SENSE
        if self.remaining_s != math.inf and self.t + self.remaining_s < best:
            best, kind = self.t + self.remaining_s, PHASE
        if self.next_mppt_s < best:
            best, kind = self.next_mppt_s, MPPT
        if self.next_ckpt_s < best:
            best, kind = self.next_ckpt_s, PERIODIC
        return best, kind

    # ---- accounting --------------------------------------------------------------

    def account(self, dt: float, v_new: float, p_w: float, wasted_j: float) -> None:
        """Book ``dt`` seconds at constant coefficients ending at ``v_new``; leakage is the balance."""
        st = self.stats
        delta_j = 0.5 * self.c_f * (v_new - self.v) * (v_new + self.v)
        st.harvested_j += self.harvest_w * dt
        st.load_j += self.load_w * dt
        st.wasted_j += wasted_j
        st.leaked_j += p_w * dt - delta_j - wasted_j
        st.stored_delta_j += delta_j
        self._advance(dt, v_new)

    def _advance(self, dt: float, v_new: float) -> None:
        """Move the clock, the voltage and the running phase on by ``dt`` (both bookings end here)."""
        mode = self.mode
        if mode != OFF:
            self.stats.on_time_s += dt
            if self.remaining_s != math.inf:
                self.remaining_s -= dt
                if mode == RUN:
                    self.pos.elapsed_s += dt
        self.v, self.t = v_new, self.t + dt

    def account_general(self, dt: float, v_new: float, wasted_j: float) -> None:
        """``account`` for a general power path: currents take I·∫v dt and conductances G·∫v² dt
        (``capacitor.voltage_moments``); leakage is again the balance."""
        st = self.stats
        v0 = self.v
        if wasted_j > 0.0 or v_new == v0:
            m1, m2 = v0 * dt, v0 * v0 * dt
        else:
            m1, m2 = capacitor.voltage_moments(v0, v_new, dt, self.p, self.i, self.g, self.c_f)
        delta_j = 0.5 * self.c_f * (v_new - v0) * (v_new + v0)
        into_j = self.src_p * dt - self.src_i * m1 - self.src_g * m2  # from the source into the capacitor
        load = self.load
        out_j = load.p_w * dt + load.i_a * m1  # into the output stage
        if self.path is not None and self.path.source == "curve":
            drop = self.path.drop_v  # the cell sits at v + drop: it delivers (a - b v)(v + drop)
            harvested_j = self.src_a * (m1 + drop * dt) - self.src_b * (m2 + drop * m1)
        else:
            harvested_j = self.harvest_w * dt
        delivered_j = load.load_w * dt + load.load_a * m1
        if load.ldo_a > 0.0:
            delivered_j += load.ldo_a * self._ldo_output_integral(v0, v_new, dt, m1)
        st.harvested_j += harvested_j
        st.input_loss_j += harvested_j - into_j
        st.load_j += delivered_j
        st.output_loss_j += out_j - delivered_j
        st.wasted_j += wasted_j
        st.leaked_j += into_j - out_j - delta_j - wasted_j
        st.stored_delta_j += delta_j
        self._advance(dt, v_new)

    def _ldo_output_integral(self, v0: float, v1: float, dt: float, m1: float) -> float:
        """∫ min(v_out, V_cap − dropout) dt over the stretch: an LDO in dropout passes V_cap − dropout."""
        load = self.load
        knee = load.ldo_out_v + load.ldo_dropout_v
        if min(v0, v1) >= knee:
            return load.ldo_out_v * dt
        if max(v0, v1) <= knee:
            return m1 - load.ldo_dropout_v * dt
        # the stretch crosses the knee (monotone voltage): split it where it does
        t_knee = min(capacitor.time_to(v0, knee, self.p, self.i, self.g, self.c_f), dt)
        first = capacitor.voltage_moments(v0, knee, t_knee, self.p, self.i, self.g, self.c_f)[0]
        above, below = (t_knee, dt - t_knee) if v0 > knee else (dt - t_knee, t_knee)
        below_m1 = first if v0 < knee else m1 - first
        return load.ldo_out_v * above + below_m1 - load.ldo_dropout_v * below

    def record(self, event: int = -1) -> None:
        if self.tracing:
            self.trace_t.append(self.t)
            self.trace_v.append(self.v)
            self.trace_mode.append(int(self.mode))
            self.trace_event.append(event)
            phase = self.phase
            self.trace_phase.append("" if phase is None else (phase.name or phase.kind))
            self.trace_ended.append(self.ended if event == PHASE else "")

    # ---- transitions -------------------------------------------------------------

    def handle(self, kind: NodeEvent) -> None:
        if kind != V_SEG:
            self.pinned = False  # anything else may change the terms: look again
        if kind == HARVEST:
            self.seg += 1
            self.next_harvest_s = self._next_harvest_s()
            if self.simple:
                self.harvest_w = float(self.spec.harvest.power_w[self.seg]) * self.spec.harvest_scale
                self.p = self.eta_in * self.harvest_w - self.load_w / self.eta_out
            else:
                self._source_segment()
        elif kind == SENSE:
            self._sense()
        elif kind == PHASE:
            done = self.phase
            self.ended = "" if done is None else (done.name or done.kind)
            self._phase_done()
        elif kind == V_ON:
            self._resume() if self.mode == HIBERNATE else self._power_on()
        elif kind == V_CUT:
            self._power_fail()
        elif kind == V_JIT:
            self.jit_armed = False
            self._checkpoint()
        elif kind == V_SEG:
            up = self.region < len(self.edges) and self.v >= self.edges[self.region]
            self.region += 1 if up else -1
            self._source_terms()
            # at a discontinuous edge the new side may push back (the charger stops sampling V_oc above
            # VSTOR_CHGEN while the cold-start converter charges below): the voltage rests on the edge
            back = capacitor.direction(self.v, self.p, self.i, self.g)
            self.pinned = (back < 0) if up else (back > 0)
        elif kind == V_BANK:
            self._bank_switch()
        elif kind == PERIODIC:
            self._periodic_checkpoint()
        elif kind == MPPT:
            assert self.path is not None
            inp = self.path.inp
            self.sampling = not self.sampling
            self.next_mppt_s += inp.mppt_sample_s if self.sampling else inp.mppt_period_s - inp.mppt_sample_s
            self._source_terms()
        self._jit_due()
        if self.tracing:
            self.record(int(kind))

    def _jit_due(self) -> None:
        """The JIT comparator trips on a falling crossing of its threshold while the firmware runs: one in
        a phase is the V_JIT event; one that fell while the node idled between tasks, or that ends on
        another event's instant, is taken at once as a phase runs, the voltage falling. The firmware arms
        the comparator when it starts work, after the boot and any restore: a boot that drains the
        capacitor below the threshold is no crossing, and the phase after it runs on (a BQ25570 + JIT node
        measured so: no checkpoint as it boots)."""
        # cheapest test first: every event passes here, and without JIT v_jit is -1
        if self.v > self.v_jit:
            if not self.jit_above and self.mode in (RUN, SEQ, IDLE):
                self.jit_above = True
        elif (self.jit_above and self.jit_armed and self.v_cut < self.v_jit and self.mode in (RUN, SEQ)
                and self._falling()):
            self.jit_armed = False
            self._checkpoint()

    def _periodic_checkpoint(self) -> None:
        """A JitLoad's periodic checkpoint: save and run on (one due while no phase runs waits)."""
        self.next_ckpt_s = math.inf
        if self.mode in (RUN, SEQ):
            self.periodic = True
            self._checkpoint()

    def _checkpoint(self) -> None:
        """Save the running phase: the boot sequence's position, or the task's progress (at the end)."""
        if self.mode == SEQ:
            self.seq_saving = (self.seq_i, self.remaining_s)
        self._enter(CHECKPOINT, self.ckpt)

    def _falling(self) -> bool:
        if self.simple:
            return self.p - self.i_a * self.v - self.g_s * self.v * self.v < 0.0
        return capacitor.direction(self.v, self.p, self.i, self.g) < 0

    # ---- a reconfigurable bank --------------------------------------------------

    def _decay_isolated(self, j: int) -> float:
        """Bank capacitor j's voltage now, isolated since bank_since[j] (u exp(-t / R C)); what it
        leaked meanwhile is booked (it leaves the stored energy)."""
        u0 = self.bank_v[j]
        u = u0 if self.bank_g == 0.0 else u0 * math.exp(-(self.t - self.bank_since[j]) * self.bank_g / self.bank[j])
        leaked = 0.5 * self.bank[j] * (u0 * u0 - u * u)
        self.stats.leaked_j += leaked
        self.stats.stored_delta_j -= leaked
        self.bank_v[j], self.bank_since[j] = u, self.t
        return u

    def _bank_switch(self) -> None:
        """At bank_connect_v (rising) the next capacitor connects: the charge C v + C_j u is shared,
        v' = (C v + C_j u) / (C + C_j), and C C_j (v - u)^2 / 2 (C + C_j) is lost; at
        bank_isolate_v (falling) the last one connected is isolated with the bus's voltage."""
        st = self.stats
        if abs(self.v - self.v_connect) <= abs(self.v - self.v_isolate):
            j = self.bank_on
            u = self._decay_isolated(j)
            c_j = self.bank[j]
            loss = 0.5 * self.c_f * c_j * (self.v - u) ** 2 / (self.c_f + c_j)
            st.switching_loss_j += loss
            st.stored_delta_j -= loss
            self.v = (self.c_f * self.v + c_j * u) / (self.c_f + c_j)
            self.c_f += c_j
            self.g_s += self.bank_g
            self.bank_on += 1
            if self.mode != OFF and self.v <= self.v_cut:  # a design that shares too much: the node browns out
                self._power_fail()
        else:
            self.bank_on -= 1
            j = self.bank_on
            self.bank_v[j], self.bank_since[j] = self.v, self.t
            self.c_f -= self.bank[j]
            self.g_s -= self.bank_g
        self._coeffs()

    def _enter(self, mode: Mode, phase: Phase | None = None, remaining_s: float | None = None) -> None:
        self.mode, self.phase = mode, phase
        if mode in (RUN, SEQ) and self.next_ckpt_s == math.inf and self.ckpt_period_s != math.inf:
            self.next_ckpt_s = self.t + self.ckpt_period_s
        self.remaining_s = math.inf if phase is None else (phase.duration_s if remaining_s is None else remaining_s)
        if phase is not None:
            self.load_w = phase.power_w
        elif mode == HIBERNATE:
            self.load_w = self.hold[0]
        else:
            self.load_w = 0.0 if mode == OFF else self.sleep_w
        if self.simple:
            self.p = self.eta_in * self.harvest_w - self.load_w / self.eta_out
        else:
            current = phase.current_a if phase is not None else (self.hold[1] if mode == HIBERNATE else 0.0)
            self._set_load(self.load_w, current, mode != OFF)
            self._coeffs()

    def _sense(self) -> None:
        st = self.stats
        st.released += 1
        release = (self.next_sense_s, self.next_sense_idx)
        self.next_sense_idx += 1
        self.next_sense_s = self._sense_time(self.next_sense_idx)
        if self.mode in (OFF, BOOT):
            st.lost_off += 1
        elif self.mode == IDLE:
            self.queue.append(release)
            self._next_task()
        elif len(self.queue) >= self.spec.work.queue_capacity:
            st.dropped += 1
        else:
            self.queue.append(release)

    def _power_on(self) -> None:
        self.stats.boots += 1
        self.jit_above = False  # the comparator is armed again when the firmware starts work
        self.on_at.append(self.t)
        self._enter(BOOT, self.boot)

    def _power_fail(self) -> None:
        self.stats.power_cycles += 1
        self.off_at.append(self.t)
        if self.mode == SEQ:
            assert self.phase is not None
            if self.phase.duration_s != math.inf:
                self.stats.lost_work_j += self.phase.power_w * (self.t - self.seq_t0)
        self.seq_i, self.seq_saving = -1, None
        if self.task_release_s is not None:
            self._roll_back()
        self.jit_armed = True
        self.next_ckpt_s, self.periodic, self.boot_restoring = math.inf, False, False
        self._enter(OFF)

    def _roll_back(self) -> None:
        """Volatile progress falls back to what NVM holds; account the work that is lost."""
        pos, plan = self.pos, self.plan
        if pos.phase < len(plan) and plan[pos.phase].granule_s > 0.0 and self.durable.phase == pos.phase:
            # loop continuation: every whole tile done in this phase is already committed
            g = plan[pos.phase].granule_s
            kept = math.floor(pos.elapsed_s / g * (1.0 + 1e-12)) * g
            if kept > self.durable.elapsed_s:
                self.durable = _Progress(pos.phase, kept)
                self.restore_bytes = plan[pos.phase].restore_bytes
        self.stats.lost_work_j += _plan_energy(plan, self.durable, pos)
        self.pos = _Progress(self.durable.phase, self.durable.elapsed_s)

    def _phase_done(self) -> None:
        mode = self.mode
        if mode == SEQ:
            self._seq_next()
        elif mode == BOOT:
            if self.restore_every_boot and self.restore_jit is not None:  # the firmware always reads its state back
                self.boot_restoring = True
                self._enter(RESTORE, self.restore_jit)
            elif self.seq_ckpt is not None:  # a checkpoint of the boot sequence: restore it, don't start over
                self._enter(RESTORE, self.restore_jit or restore_phase(self.spec.work, self.ckpt.restore_bytes))
            elif self.seq:
                self._seq_enter(self._seq_skip(0))
            else:
                self._after_boot()
        elif mode == RESTORE:
            at_boot, self.boot_restoring = self.boot_restoring, False
            if self.seq_ckpt is not None:
                self._seq_resume()
            elif at_boot and self.seq:  # restore_on_boot with nothing saved: the sequence starts over
                self._seq_enter(self._seq_skip(0))
            else:
                self._continue()
        elif mode == CHECKPOINT:
            self.stats.checkpoints += 1
            if self.seq_saving is not None:
                self.seq_ckpt, self.seq_saving = self.seq_saving, None
            else:
                self.durable = _Progress(self.pos.phase, self.pos.elapsed_s)
                self.restore_bytes = self.ckpt.restore_bytes
            if self.periodic:  # saved: run on where it was (the checkpoint stays in NVM)
                self.periodic = False
                if self.seq_ckpt is not None and self.seq_i >= 0:
                    self._seq_enter(*self.seq_ckpt)
                else:
                    self._continue()
                return
            self._enter(HIBERNATE)
        else:
            self._next_phase()

    def _after_boot(self) -> None:
        """After the boot (and the program's boot sequence): restore the task in progress, else go on."""
        if self.task_release_s is not None and self.restore_bytes > 0:
            restore = self.restore_jit or restore_phase(self.spec.work, self.restore_bytes)
            self._enter(RESTORE, restore)
        else:
            self._continue()

    def _resume(self) -> None:
        self.jit_armed = True
        if self.seq_ckpt is not None:
            self._seq_resume()
        else:
            self._continue()

    # ---- the program's boot sequence ---------------------------------------------

    def _seq_enter(self, i: int, remaining_s: float | None = None) -> None:
        if i >= len(self.seq):  # every phase of a sequence without a loop is done
            self.seq_i = -1
            self.seq_done.clear()
            self._after_boot()
            return
        self.seq_i, self.seq_t0 = i, self.t
        self._enter(SEQ, self.seq[i], remaining_s)

    def _seq_resume(self) -> None:
        assert self.seq_ckpt is not None
        i, remaining_s = self.seq_ckpt
        self.seq_ckpt = None  # a checkpoint is used once
        self._seq_enter(i, remaining_s)

    def _seq_skip(self, j: int) -> int:
        """The first phase from j on that must run: durable ones finished in this pass are skipped;
        passing the end of the boot phases, or of the loop, ends a pass."""
        n, loop = len(self.seq), self.loop_at
        # the boot phases end where the loop or the until_power_fails phase begins
        once_end = loop if loop >= 0 else (n - 1 if n and self.seq[-1].duration_s == math.inf else n)
        for _ in range(2 * n + 1):
            if j == once_end and once_end < n:
                self.seq_done.difference_update(range(once_end))
            if j >= n and loop >= 0:
                self.seq_done.difference_update(range(loop, n))
                j = loop
            if j < n and j in self.seq_done:
                j += 1
                continue
            return j
        return j

    def _seq_next(self) -> None:
        i = self.seq_i
        done = self.seq[i]
        self._completed(done, math.inf)
        if done.durable_end:
            self.seq_done.add(i)
        self._seq_enter(self._seq_skip(i + 1))

    def _completed(self, done: Phase, deadline_s: float) -> None:
        """Count a finished phase; a finished tx phase is a packet on the air."""
        counts = self.stats.phase_counts
        name = done.name or done.kind
        counts[name] = counts.get(name, 0) + 1
        if done.kind == "tx":
            self.stats.packets_sent += 1
            airtime_s = min(self.spec.airtime_s, done.duration_s)
            self.packets.append((self.t - airtime_s, airtime_s, deadline_s))

    def _continue(self) -> None:
        """Carry on with the task in progress, else the next one, else sleep."""
        if self.task_release_s is None:
            self._next_task()
            return
        phase = self.plan[self.pos.phase]
        self._enter(RUN, phase, phase.duration_s - self.pos.elapsed_s)

    def _next_task(self) -> None:
        if not self.queue:
            self._enter(IDLE)
            return
        self.task_release_s, self.task_event = self.queue.popleft()
        if self.spec.choose_variant is not None:  # DynInfer: the variant the stored energy affords
            self.variant = self.spec.choose_variant(self.v, self.spec.node_id, self.task_event)
            self.plan = self.spec.variant_plans[self.variant]
        self.pos, self.durable, self.restore_bytes = _Progress(), _Progress(), 0
        self._enter(RUN, self.plan[0])

    def _next_phase(self) -> None:
        plan = self.plan
        done = plan[self.pos.phase]
        self.pos.phase += 1
        self.pos.elapsed_s = 0.0
        if done.durable_end:
            self.durable = _Progress(self.pos.phase, 0.0)
            self.restore_bytes = done.restore_bytes
        self._completed(done, self._deadline())
        if self.pos.phase == len(plan):
            self._task_done()
        else:
            self._enter(RUN, plan[self.pos.phase])

    def _deadline(self) -> float:
        assert self.task_release_s is not None
        return self.task_release_s + self.spec.work.deadline_s

    def _task_done(self) -> None:
        st = self.stats
        in_time = self.t <= self._deadline()
        if in_time:
            st.completed += 1
        else:
            st.missed += 1
        self.task_log.append((self.task_event, self.variant, in_time))
        self.task_done_s.append(self.t)
        assert self.task_release_s is not None
        self.task_latency_s.append(self.t - self.task_release_s)
        st.latency_sum_s += self.t - self.task_release_s
        self.task_release_s = None
        self._next_task()

    def finish(self) -> NodeStats:
        st = self.stats
        for j in range(self.bank_on, len(self.bank)):  # isolated to the end
            self._decay_isolated(j)
        st.unfinished = len(self.queue) + (self.task_release_s is not None)
        st.v_final_v = self.v
        if self.simple:  # a general path booked its losses as it went
            st.input_loss_j = (1.0 - self.eta_in) * st.harvested_j
            st.output_loss_j = st.load_j * (1.0 / self.eta_out - 1.0)
        return st


def _plan_energy(plan: tuple[Phase, ...], a: _Progress, b: _Progress) -> float:
    """Load energy of the plan between positions a <= b."""
    if b.phase == a.phase:
        return plan[a.phase].power_w * (b.elapsed_s - a.elapsed_s) if a.phase < len(plan) else 0.0
    total = plan[a.phase].power_w * (plan[a.phase].duration_s - a.elapsed_s)
    total += sum(p.energy_j for p in plan[a.phase + 1 : b.phase])
    if b.phase < len(plan):
        total += plan[b.phase].power_w * b.elapsed_s
    return total


def next_event(node: Node) -> tuple[float, NodeEvent, float, bool]:
    """The exact engine's step: (time of the next event, its kind, the voltage then, clamped).

    The voltage moves monotonically under constant coefficients, so a threshold is crossed
    before the next scheduled event exactly when the voltage then lies past it; only then
    is the crossing time (eq. 2 of capacitor.py) needed.
    """
    if not node.simple:
        return _next_event_general(node)
    t_next, kind = node.scheduled()
    p_w = node.p
    v, c, i, g = node.v, node.c_f, node.i_a, node.g_s
    f = p_w - i * v - g * v * v
    if v >= node.v_max and f > 0.0:
        return t_next, kind, node.v_max, True
    v_next = capacitor.voltage_after(v, t_next - node.t, p_w, i, g, c)
    if f > 0.0:
        waiting = node.mode == OFF or node.mode == HIBERNATE
        v_th, ev = (node.v_on, V_ON) if waiting else (node.v_max, V_MAX)
        if node.bank_on < len(node.bank) and v < node.v_connect < v_th:
            v_th, ev = node.v_connect, V_BANK
        crossed = v_next >= v_th
    elif f < 0.0:
        v_th, ev = -math.inf, END
        if node.mode != OFF:
            v_th, ev = node.v_cut, V_CUT
            if (node.mode == RUN or node.mode == SEQ) and node.jit_armed and v > node.v_jit > node.v_cut:
                v_th, ev = node.v_jit, V_JIT
        if node.bank_on > 0 and v > node.v_isolate > v_th:
            v_th, ev = node.v_isolate, V_BANK
        if ev == END:
            return t_next, kind, v_next, False
        crossed = v_next <= v_th
    else:
        return t_next, kind, v_next, False
    if crossed:
        t_cross = node.t + capacitor.time_to(v, v_th, p_w, i, g, c)
        if t_cross < t_next:
            return t_cross, ev, v_th, False
        # a tie (or rounding between eq. 2 and its inverse): the scheduled event goes first and
        # the voltage rests on the threshold, so the crossing follows at once
        return t_next, kind, v_th, False
    return t_next, kind, v_next, False


def _next_event_general(node: Node) -> tuple[float, NodeEvent, float, bool]:
    """``next_event`` with currents, conductances and region edges (a general power path)."""
    t_next, kind = node.scheduled()
    p, i, g, c, v = node.p, node.i, node.g, node.c_f, node.v
    d = 0 if node.pinned else capacitor.direction(v, p, i, g)
    if d == 0:
        return t_next, kind, v, False
    if v >= node.v_max and d > 0:
        return t_next, kind, node.v_max, True
    v_next = capacitor.voltage_after(v, t_next - node.t, p, i, g, c)
    edges, k = node.edges, node.region
    mode = node.mode
    if d > 0:
        v_th, ev = (node.v_on, V_ON) if mode in (OFF, HIBERNATE) else (node.v_max, V_MAX)
        if k < len(edges) and edges[k] < v_th:
            v_th, ev = edges[k], V_SEG
        crossed = v_next >= v_th
    else:
        v_th, ev = -math.inf, END
        if mode != OFF:
            v_th, ev = node.v_cut, V_CUT
            if (mode in (RUN, SEQ)) and node.jit_armed and v > node.v_jit > node.v_cut:
                v_th, ev = node.v_jit, V_JIT
        if k > 0 and edges[k - 1] > v_th:
            v_th, ev = edges[k - 1], V_SEG
        crossed = v_next <= v_th
    if crossed:
        t_cross = node.t + capacitor.time_to(v, v_th, p, i, g, c)
        if t_cross < t_next:
            return t_cross, ev, v_th, False
        return t_next, kind, v_th, False
    return t_next, kind, v_next, False


def apply_event(node: Node, t_next: float, kind: NodeEvent, v_new: float, clamped: bool) -> None:
    """Book the stretch up to ``t_next`` and apply the event found by ``next_event``."""
    dt = t_next - node.t
    if node.simple:
        p_w = node.p
        wasted_j = capacitor.rate(node.v_max, p_w, node.i_a, node.g_s) * dt if clamped else 0.0
        node.account(dt, v_new, p_w, wasted_j)
    else:
        wasted_j = capacitor.rate(node.v_max, node.p, node.i, node.g) * dt if clamped else 0.0
        node.account_general(dt, v_new, wasted_j)
    node.t = t_next  # the exact event time, free of accumulated rounding
    if kind == V_MAX:
        if node.tracing:
            node.record(int(V_MAX))
    elif kind != END:
        node.handle(kind)
