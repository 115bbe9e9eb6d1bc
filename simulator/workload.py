"""What a node does with its energy: sense, infer layer by layer, transmit — and how it survives power failures.

A task is a fixed plan of phases, each a constant load for a known time. The
execution policy decides which phases make progress durable (written to NVM) and
what a power failure rolls back to:

- ``restart``: nothing but the input sample is kept; a failure restarts inference.
- ``jit``: Hibernus-style just-in-time checkpoint — when the voltage falls to
  ``jit_threshold_v`` the volatile state is written to NVM and the MCU sleeps until
  the voltage recovers to v_on (resume, nothing to restore) or fails (restore on boot).
- ``per_layer``: task-based (Alpaca/InK-style) — each layer's output is committed.
- ``loop_continuation``: SONIC-style — loop indices and outputs live in NVM and a
  tile of ``tile_macs`` is committed with a word store, so a failure loses at most a tile.
- ``quanta``: NExUME's QuantaTasks (edge.classify.dyninfer) — each layer's loop is cut into chunks
  that fit half a full charge, neighbours are fused greedily, and each group's outputs are
  committed to NVM.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from edge.core.config import Config
from edge.core.errors import ConfigError
from simulator.devices import MCUS, McuProfile, known_mcu

Policy = Literal["restart", "jit", "per_layer", "loop_continuation", "quanta"]


class LayerSpec(Config):
    """One layer of the inference task."""

    name: str
    """Layer name, for reports."""
    macs: int = Field(ge=0, le=10**10)
    """Multiply-accumulates in the layer."""
    output_bytes: int = Field(ge=0, le=10**8)
    """Bytes of its output activation (what a per-layer commit writes)."""
    cycles: int | None = Field(None, ge=0, le=10**12)
    """Measured cost on the MCU, in cycles (a bundle's instruction counts from ``trickle flash
    --record``, one cycle per instruction); replaces macs x the profile's cycles_per_mac."""

    def compute_s(self, mcu: McuProfile, bits: int) -> float:
        return self.cycles / mcu.clock_hz if self.cycles is not None else mcu.compute_time_s(self.macs, bits)

    def compute_j(self, mcu: McuProfile, bits: int) -> float:
        if self.cycles is not None:
            return self.cycles * mcu.energy_per_cycle_j()
        return mcu.compute_energy_j(self.macs, bits)


def layers_from_bundle(path: str, mcu: str, variant: str | None = None) -> tuple[LayerSpec, ...]:
    """A bundle variant's layers with the cycles measured for ``mcu`` (``trickle flash --record``).

    ``variant`` defaults to the widest measured one. Raises ValueError naming what is missing."""
    from edge.contract.bundle import BundleError, read_bundle

    try:
        manifest = read_bundle(path).manifest
    except BundleError as err:
        raise ValueError(str(err)) from None
    measured = [v for v in manifest.variants if any(m.cpu == mcu for m in (v.measured or {}).values())]
    if not measured:
        raise ValueError(f"{path}: no variant has instruction counts for mcu {mcu!r}; record them with "
                         "trickle flash BUNDLE --board mps2-an386 --record OUT (cortex-m4)")
    chosen = min(measured, key=lambda v: v.drop) if variant is None else next(
        (v for v in measured if v.name == variant), None)
    if chosen is None:
        raise ValueError(f"{path}: variant {variant!r} has no counts for mcu {mcu!r}; measured: "
                         f"{', '.join(v.name for v in measured)}")
    counts = next(m for m in (chosen.measured or {}).values() if m.cpu == mcu)
    macs = {layer.name: layer.macs for layer in chosen.layers}
    return tuple(LayerSpec(name=layer.name, macs=macs.get(layer.name, 0), output_bytes=layer.output_bytes,
                           cycles=layer.instructions) for layer in counts.layers)


# A small 1-D CNN over 49 frames x 10 MFCCs (a keyword-spotting shape); later issues fill
# this from a real bundle's manifest.
DEFAULT_LAYERS = (
    LayerSpec(name="conv1", macs=47 * 16 * 10 * 3, output_bytes=47 * 16),
    LayerSpec(name="conv2", macs=45 * 32 * 16 * 3, output_bytes=22 * 32),
    LayerSpec(name="conv3", macs=20 * 32 * 32 * 3, output_bytes=20 * 32),
    LayerSpec(name="dense", macs=640 * 10, output_bytes=10),
)


class McuParams(Config):
    """Your own MCU, in the scenario file (``[workload.mcu_params]``): any field of
    ``simulator.devices.McuProfile``; the fields not given come from the named ``workload.mcu``."""

    name: str | None = None
    vdd_v: float | None = Field(None, gt=0, le=50)
    """Supply the currents are quoted at (V)."""
    clock_hz: float | None = Field(None, gt=0, le=1e10)
    active_a_per_hz: float | None = Field(None, gt=0, le=1e-3)
    """Active current per clock rate (A/Hz; a datasheet's µA/MHz × 1e-12)."""
    sleep_a: float | None = Field(None, ge=0, le=1)
    """Retention sleep current (A)."""
    brown_out_v: float | None = Field(None, gt=0, le=50)
    boot_s: float | None = Field(None, ge=0, le=60)
    """Power-up to main (s), at full active power; 0: firmware that starts at once."""
    cycles_per_mac: float | None = Field(None, gt=0, le=1e6)
    nvm_write_j_per_byte: float | None = Field(None, gt=0, le=1)
    nvm_read_j_per_byte: float | None = Field(None, gt=0, le=1)
    nvm_write_s_per_byte: float | None = Field(None, gt=0, le=1)
    nvm_read_s_per_byte: float | None = Field(None, gt=0, le=1)
    source: str = "the scenario file"


RunKind = Literal["once_per_boot", "repeat", "until_power_fails", "periodic"]


class ProgramPhase(Config):
    """One phase of the firmware you write (``[[workload.program]]``).

    ``run`` says when it runs: ``once_per_boot`` phases run first at every boot, in order (INIT);
    then the ``repeat`` phases loop until the power fails (a sense-and-send loop), or the one
    ``until_power_fails`` phase holds (radio listen, a burn load); ``periodic`` phases form a
    task released by every sensing event (``workload.sense_period_s`` or ``sense_trace``), run
    after the boot phases, as today's built-in task is.

    ``durable``: finishing it is written to NVM, so a power failure does not make it run again
    until the pass it belongs to (the boot phases, or one pass of the loop) has finished."""

    name: str = Field(min_length=1, max_length=40)
    """Shown in reports; completion counts are kept per name."""
    run: RunKind = "repeat"
    duration_s: float | None = Field(None, gt=0, le=86400)
    """How long the phase runs (not for until_power_fails)."""
    current_a: float | None = Field(None, ge=0, le=10)
    """Load current at the output (give this or power_w)."""
    power_w: float | None = Field(None, ge=0, le=100)
    """Load power (give this or current_a)."""
    durable: bool = False
    packet: bool = False
    """A completed phase is one packet sent (the network's airtime at its end)."""

    @model_validator(mode="after")
    def _load_and_duration(self) -> ProgramPhase:
        where = f"workload.program[{self.name}]"
        if (self.current_a is None) == (self.power_w is None):
            raise ConfigError(f"{where}.current_a", self.current_a, "give exactly one of current_a and power_w")
        if self.run == "until_power_fails" and self.duration_s is not None:
            raise ConfigError(f"{where}.duration_s", self.duration_s, "an until_power_fails phase has no duration")
        if self.run != "until_power_fails" and self.duration_s is None:
            raise ConfigError(f"{where}.duration_s", None, f"a {self.run} phase needs a duration")
        return self


class JitLoad(Config):
    """Just-in-time checkpointing (Hibernus/ENGAGE style) with your own figures (``[workload.jit_load]``):
    when V_cap falls to ``threshold_v`` while a phase runs, checkpoint, then hold until the voltage
    recovers to v_on (resume) or the power fails (restore on the next boot). Replaces the jit policy's
    derived checkpoint (workload.state_bytes through the MCU's NVM) and MCU-sleep hold."""

    threshold_v: float = Field(gt=0, le=50)
    checkpoint_s: float = Field(gt=0, le=60)
    checkpoint_a: float = Field(ge=0, le=10)
    """Current while checkpointing (at the output)."""
    restore_s: float = Field(gt=0, le=60)
    restore_a: float = Field(ge=0, le=10)
    hold_a: float | None = Field(None, ge=0, le=10)
    """Current while holding after a checkpoint (default: the MCU's sleep current)."""
    checkpoint_period_s: float | None = Field(None, gt=0, le=86400)
    """Also checkpoint every this many seconds while a phase runs, and run on (firmware that saves
    periodically as well as at the threshold, ENGAGE-style); a checkpoint due while the node
    sleeps waits for the next phase. None: at the threshold only."""
    restore_on_boot: bool = False
    """Run the restore after every boot, whether or not a checkpoint is due (firmware that always
    reads its state back at power-up)."""


class WorkloadConfig(Config):
    """Sensing, the inference task, and the intermittent-execution policy."""

    mcu: str = "msp430fr5994"
    """MCU profile (see simulator.devices.MCUS)."""
    mcu_params: McuParams | None = None
    """Your own MCU: these fields replace the named profile's (``[workload.mcu_params]``)."""
    sense_period_s: float = Field(60.0, gt=0, le=86400)
    """Period of the sensing events."""
    sense_offset_s: float | None = Field(None, ge=0)
    """Time of the first sensing event; None draws it per node in [0, period)."""
    sense_trace: str | None = None
    """CSV of sensing event times in seconds (first column); replaces the period when set."""
    sense_time_s: float = Field(5e-3, ge=0, le=60)
    """How long the sensor is powered to take a sample."""
    sense_power_w: float = Field(1e-3, ge=0, le=1)
    """Sensor + ADC power while sampling (on top of the MCU's active power)."""
    input_bytes: int = Field(490, ge=0, le=10**8)
    """Size of the sample, written to NVM as it is taken."""
    layers: tuple[LayerSpec, ...] = DEFAULT_LAYERS
    """The inference task."""
    policy: Policy = "per_layer"
    """What survives a power failure (see the module docstring)."""
    jit_threshold_v: float = Field(2.4, gt=0, le=50)
    """jit policy: checkpoint when the voltage falls to this (between v_off_v and v_on_v)."""
    state_bytes: int = Field(2048, ge=0, le=10**8)
    """jit policy: volatile state (registers, stack, live buffers) a checkpoint saves."""
    tile_macs: int = Field(256, ge=1, le=10**9)
    """loop_continuation policy: MACs between two progress commits."""
    tile_commit_bytes: int = Field(4, ge=1, le=4096)
    """loop_continuation policy: bytes written per commit (the loop-index word)."""
    deadline_s: float = Field(30.0, gt=0)
    """A result later than this after its sensing event counts as missed."""
    queue_capacity: int = Field(1, ge=0, le=1000)
    """Sensing events that may wait while a task runs; further ones are dropped."""
    send_packet: bool = True
    """Transmit each result to the gateway."""

    program: tuple[ProgramPhase, ...] = ()
    """Your own firmware as phases (``[[workload.program]]``): replaces the built-in sense-infer-send task."""
    jit_load: JitLoad | None = None
    """Just-in-time checkpointing with your own checkpoint/restore figures."""

    bundle: str | None = None
    """A bundle (folder or .tar) with recorded instruction counts: its variant's layers, with
    measured cycles, replace ``layers`` (see ``trickle flash --record``)."""
    bundle_variant: str | None = None
    """Which variant of ``bundle`` (default: the widest with counts for ``mcu``)."""

    @field_validator("mcu")
    @classmethod
    def _known_mcu(cls, name: str) -> str:
        return known_mcu(name, "workload.mcu")

    @model_validator(mode="before")
    @classmethod
    def _layers_from_bundle(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("bundle") is not None:
            if "layers" in data:
                raise ValueError("give workload.layers or workload.bundle, not both")
            mcu = known_mcu(data.get("mcu", "msp430fr5994"), "workload.mcu")
            data = {**data, "layers": layers_from_bundle(str(data["bundle"]), mcu, data.get("bundle_variant"))}
        return data

    @field_validator("program")
    @classmethod
    def _program_order(cls, program: tuple[ProgramPhase, ...]) -> tuple[ProgramPhase, ...]:
        order = {"once_per_boot": 0, "repeat": 1, "until_power_fails": 1, "periodic": 1}
        runs = [p.run for p in program]
        for a, b in itertools.pairwise(runs):
            if order[b] < order[a]:
                raise ConfigError("workload.program", b, f"once_per_boot phases come first (a {b} phase precedes one)")
        endless = [r for r in runs if r in ("repeat", "until_power_fails")]
        if "until_power_fails" in runs and (runs.count("until_power_fails") > 1 or runs[-1] != "until_power_fails"
                                            or "repeat" in runs):
            raise ConfigError("workload.program", "until_power_fails",
                              "one until_power_fails phase, last, and no repeat phases (they would never end)")
        if endless and "periodic" in runs:
            raise ConfigError("workload.program", "periodic", "periodic phases never run after a repeat loop or an "
                              "until_power_fails phase: the node never becomes idle")
        if len({p.name for p in program}) != len(program):
            raise ConfigError("workload.program", [p.name for p in program], "phase names must differ")
        return program

    @property
    def mcu_profile(self) -> McuProfile:
        base = MCUS[self.mcu]
        if self.mcu_params is None:
            return base
        given = self.mcu_params.model_dump(exclude_none=True)
        return replace(base, **{**given, "name": given.get("name", f"{base.name} (customised)")})

    @property
    def total_macs(self) -> int:
        return sum(layer.macs for layer in self.layers)


@dataclass(frozen=True, slots=True)
class Phase:
    """A stretch of constant load. Energy = power_w x duration_s at the load (before the output converter)."""

    kind: str
    duration_s: float
    power_w: float  # at the load; for a phase given as a current, current_a x the output voltage
    granule_s: float = 0.0  # progress inside the phase survives a failure in whole granules (0: none)
    durable_end: bool = False  # finishing the phase commits progress to NVM
    restore_bytes: int = 0  # what a reboot must read back when progress rests at the end of this phase
    name: str = ""  # completion counts are kept per name (the kind when empty)
    current_a: float = 0.0  # > 0: the load is this current at the output (power_w is then nominal)

    @property
    def energy_j(self) -> float:
        return self.power_w * self.duration_s


def _nvm_phase(kind: str, mcu: McuProfile, nbytes: int, write: bool, **kw: object) -> Phase:
    """Moving ``nbytes`` to or from NVM; the profile's energy per byte includes the MCU core's."""
    per_byte_s = mcu.nvm_write_s_per_byte if write else mcu.nvm_read_s_per_byte
    per_byte_j = mcu.nvm_write_j_per_byte if write else mcu.nvm_read_j_per_byte
    return Phase(kind, nbytes * per_byte_s, per_byte_j / per_byte_s, **kw)  # type: ignore[arg-type]


def build_plan(work: WorkloadConfig, tx_time_s: float, tx_power_w: float, bits: int = 8,
               layers: tuple[LayerSpec, ...] | None = None, quanta_budget_j: float = math.inf,
               steps: int = 1) -> tuple[Phase, ...]:
    """The phases of one task under the workload's policy, for ``layers`` (default the workload's) at ``bits``.
    ``steps`` > 1: an early-classification task, which senses a sample and runs ``layers`` on it
    that many times before it sends its result (the sample is ``input_bytes``)."""
    mcu = work.mcu_profile
    layers = work.layers if layers is None else layers
    # sensing: sensor + MCU for sense_time_s, then the sample is written to NVM; one phase
    store = _nvm_phase("sense", mcu, work.input_bytes, write=True)
    duration_s = work.sense_time_s + store.duration_s
    energy_j = work.sense_time_s * (mcu.active_power_w() + work.sense_power_w) + store.energy_j
    sense = Phase("sense", duration_s, energy_j / duration_s if duration_s > 0 else 0.0, durable_end=True)
    plan: list[Phase] = []
    for _ in range(steps):
        plan.append(sense)
        if work.policy == "quanta":
            plan.extend(_quanta_phases(mcu, layers, bits, quanta_budget_j))
        else:
            for layer in layers:
                plan.extend(_layer_phases(work, mcu, layer, bits))
    if work.send_packet:
        plan.append(Phase("tx", tx_time_s, tx_power_w + mcu.sleep_power_w(), durable_end=work.policy != "restart"))
    return tuple(plan)


def _layer_phases(work: WorkloadConfig, mcu: McuProfile, layer: LayerSpec, bits: int) -> list[Phase]:
    compute_s = layer.compute_s(mcu, bits)
    if work.policy == "loop_continuation":
        tiles = max(1, math.ceil(layer.macs / work.tile_macs))
        commit = _nvm_phase("commit", mcu, work.tile_commit_bytes, write=True)
        duration_s = compute_s + tiles * commit.duration_s
        energy_j = compute_s * mcu.active_power_w() + tiles * commit.energy_j
        return [
            Phase("compute", duration_s, energy_j / duration_s, granule_s=duration_s / tiles, durable_end=True,
                  restore_bytes=work.tile_commit_bytes)
        ]
    compute = Phase("compute", compute_s, mcu.active_power_w())
    if work.policy == "per_layer":
        return [compute, _nvm_phase("commit", mcu, layer.output_bytes, write=True, durable_end=True,
                                    restore_bytes=layer.output_bytes)]
    return [compute]


def _quanta_phases(mcu: McuProfile, layers: tuple[LayerSpec, ...], bits: int, budget_j: float) -> list[Phase]:
    """QuantaTasks: one output element per loop iteration; each fused group computes, then commits."""
    from edge.classify.dyninfer import quanta_tasks

    iterations = [max(1, layer.output_bytes) for layer in layers]
    per_iteration_j = [layer.compute_j(mcu, bits) / n for layer, n in zip(layers, iterations)]
    phases: list[Phase] = []
    for group in quanta_tasks(iterations, per_iteration_j, budget_j):
        compute_s = sum(layers[t.layer].compute_s(mcu, bits) * (t.stop - t.start) / iterations[t.layer] for t in group)
        outputs = sum(t.stop - t.start for t in group)
        phases.append(Phase("compute", compute_s, mcu.active_power_w()))
        phases.append(_nvm_phase("commit", mcu, outputs, write=True, durable_end=True, restore_bytes=outputs))
    return phases


def program_phases(work: WorkloadConfig, v_out_v: float) -> tuple[tuple[Phase, ...], tuple[Phase, ...]]:
    """(boot sequence, periodic task) of ``work.program``: the once_per_boot, repeat and until_power_fails
    phases in order, and the periodic phases (each durable one commits the task's progress)."""
    def phase(p: ProgramPhase) -> Phase:
        current = p.current_a or 0.0
        power = p.power_w if p.power_w is not None else current * v_out_v
        duration = math.inf if p.duration_s is None else p.duration_s
        return Phase("tx" if p.packet else "program", duration, power, durable_end=p.durable, name=p.name,
                     current_a=current)
    boot = tuple(phase(p) for p in work.program if p.run != "periodic")
    task = tuple(phase(p) for p in work.program if p.run == "periodic")
    return boot, task


def jit_load_phases(jit: JitLoad, v_out_v: float) -> tuple[Phase, Phase]:
    """(checkpoint, restore) of a JitLoad."""
    # restore_bytes = 1 marks a restore as due after the checkpoint; its cost is the JitLoad's, not per byte
    return (Phase("checkpoint", jit.checkpoint_s, jit.checkpoint_a * v_out_v, durable_end=True, restore_bytes=1,
                  name="checkpoint", current_a=jit.checkpoint_a),
            Phase("restore", jit.restore_s, jit.restore_a * v_out_v, name="restore", current_a=jit.restore_a))


def checkpoint_phase(work: WorkloadConfig) -> Phase:
    """jit policy: saving the volatile state when the voltage falls to the threshold."""
    return _nvm_phase("checkpoint", work.mcu_profile, work.state_bytes, write=True, durable_end=True,
                      restore_bytes=work.state_bytes)


def restore_phase(work: WorkloadConfig, nbytes: int) -> Phase:
    return _nvm_phase("restore", work.mcu_profile, nbytes, write=False)


def boot_phase(work: WorkloadConfig) -> Phase:
    mcu = work.mcu_profile
    return Phase("boot", mcu.boot_s, mcu.active_power_w())


@dataclass(frozen=True)
class ModelVariant:
    """One runnable form of a trained model, as the simulator needs it."""

    bits: int
    drop: float
    layers: tuple[LayerSpec, ...]
    correct: np.ndarray  # (n_test,) bool: does this variant classify test sample i right
    accuracy: float
    predicted: np.ndarray | None = None  # (n_test,) class index it answers, when known


@dataclass(frozen=True)
class EarlyTask:
    """Early classification (FIRMBOUND, ``edge.classify.early``): a task senses a sample, runs the frame
    model on it, and repeats until the bundle's rule stops; how many samples that takes on each
    test series."""

    samples: np.ndarray  # (n_test,) int in 1..horizon
    horizon: int


@dataclass(frozen=True)
class InferenceModel:
    """A trained model as the node's task: its variants, and whether DynInfer picks among them.
    With ``early``, the one variant is the frame model and the task's length follows the rule."""

    variants: tuple[ModelVariant, ...]
    adaptive: bool = True  # DynInfer chooses per task; otherwise variants[0] always runs
    margin: float = 1.0  # DynInfer's safety factor on a variant's energy
    early: EarlyTask | None = None

    def __post_init__(self) -> None:
        if not self.variants:
            raise ConfigError("model.variants", 0, "need at least one variant")
        sizes = {len(v.correct) for v in self.variants}
        if len(sizes) != 1:
            raise ConfigError("model.variants", sorted(sizes), "every variant needs a verdict on the same test samples")
        if self.early is not None:
            taken = self.early.samples
            if len(self.variants) != 1 or len(taken) != self.n_test or not np.all((taken >= 1) & (taken <= self.early.horizon)):
                raise ConfigError("model.early", len(taken), "one frame-model variant, and per test series a count of "
                                  f"samples in 1..{self.early.horizon}")

    @property
    def n_test(self) -> int:
        return len(self.variants[0].correct)
