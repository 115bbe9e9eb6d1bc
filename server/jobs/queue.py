"""Heavy work on the server: a job queue in the server's store, run by worker processes.

    trickle serve --workers 2                    # the server starts two workers and watches them
    trickle worker --state-dir runs/server       # or workers of their own (same state dir and --store)
    POST /v1/checkpoints  (body: trickle train's checkpoint.pt)  -> {"teacher": "checkpoint:SHA256"}
    POST /v1/jobs {"kind": "distill", "teacher": "checkpoint:SHA256", "dataset": "digits",
                   "keep_ratio": 0.5, "then_assign": "field"}

A job names its inputs by what the server holds, never by a file path: a teacher is a checkpoint
uploaded to the server (content-addressed, checked as weights only on upload), a finished job
(``job:ID``) or the job that made a bundle (``bundle:V``); a data set is a built-in one, ``ucr:NAME``,
or a file or folder the operator put in STATE_DIR/datasets. Every checkpoint is loaded with
``torch.load(weights_only=True)`` (``models.weights``): no file becomes code.

A job is ``queued`` -> ``running`` (a worker claimed it, atomically, and beats a heartbeat every
second) -> ``done`` | ``failed`` (with its error) | ``cancelled``. Each worker runs one job at a
time. When a worker dies (killed, out of memory, its machine gone) the server notices (its process
ended, or its heartbeat is ``stale_s`` old) and queues the job again while it has attempts left
(``max_attempts``), else fails it: a resumed job runs again from its start. A worker stopped
politely (SIGTERM) hands its job back without spending an attempt.

A ``distill`` job (``models.distill``: MDSLR pruning, KD into a switchable-precision student)
ends in a bundle signed with the server's key (STATE_DIR/signing.key, made on first start; devices
trust STATE_DIR/signing.pub). Its registration, its assignment to ``then_assign`` and the job's
``done`` are one transaction, the bundle's file moved into place inside it: a worker killed at any
point leaves all of it or none. The server then tells the fleet's devices by the usual OTA path.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from edge.contract.protocol import Name
from edge.core.config import Config
from edge.core.errors import ConfigError, TrickleError
from server.store.store import JobNotFinishedError, Store, VersionTakenError

log = logging.getLogger("trickle.server.jobs")
Selection = Literal["mdslr", "random", "hard", "easy", "full"]  # models.distill.SELECTIONS (a test keeps them equal)
TEACHER_PATTERN = r"^(checkpoint:[0-9a-f]{64}|job:[0-9]{1,18}|bundle:[0-9]{1,18})$"
DATASET_PATTERN = r"^(ucr:)?[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$"  # a name, never a path


class JobError(TrickleError):
    """A job that cannot run as specified (its teacher is missing, its data does not fit it)."""


class JobCancelledError(Exception):
    """Raised inside a job whose cancellation was asked for."""


class JobLostError(Exception):
    """Raised inside a job its worker no longer owns (the server took it back, thinking it dead)."""


class WorkerStoppingError(Exception):
    """Raised inside a job whose worker was asked to stop (SIGTERM): the job is handed back."""


class DistillJob(Config):
    """Distil a teacher into a quarter-width switchable-precision student on a pruned data set
    (models.distill), export it as a signed bundle, register it and optionally assign it."""

    kind: Literal["distill"] = "distill"
    teacher: str = Field(pattern=TEACHER_PATTERN)
    """``checkpoint:SHA256`` (a checkpoint uploaded with POST /v1/checkpoints), ``job:ID`` (the
    student a finished job trained here) or ``bundle:V`` (that of the job that made bundle V here)."""
    dataset: str = Field("digits", pattern=DATASET_PATTERN)
    """What the teacher was trained on: fsdd, basic_motions, digits, ucr:NAME, or the name of a file
    or folder in the server's STATE_DIR/datasets (the user's data as trickle train accepts it)."""
    keep_ratio: float = Field(0.5, gt=0, le=1)
    """Share of the training set the student sees (per class ⌊N/C·r⌋)."""
    selection: Selection = "mdslr"
    """Which examples: mdslr (medium difficulty, reshaped logits), random, hard, easy, or full."""
    width: float = Field(0.25, gt=0, le=1)
    """The student's channels relative to the teacher's."""
    method: Literal["nexume", "uniform", "qat8"] = "nexume"
    """The student's schedule: nexume or uniform (switchable precision, ready for DynInfer) or qat8."""
    q_min: int = Field(2, ge=2, le=8)
    """Lowest bit-width the student trains (nexume)."""
    q_max: int = Field(8, ge=2, le=8)
    """Highest bit-width the student trains (nexume)."""
    epochs: int = Field(10, ge=1, le=1000)
    """The student's passes over the kept examples."""
    temperature: float = Field(4.0, gt=0, le=100)
    """KD temperature T."""
    seed: int = Field(0, ge=0)
    """Seeds the student and the selection."""
    mcu: str = "msp430fr5994"
    """The target MCU: its cost model prices the variants the search trains."""
    formats: list[str] = Field(default_factory=lambda: ["onnx", "onnx-int8"], min_length=1)
    """The bundle's formats (trickle export --formats)."""
    then_assign: Name | None = None
    """A fleet to assign the finished bundle to (its devices update by OTA)."""

    @field_validator("formats")
    @classmethod
    def _formats(cls, formats: list[str]) -> list[str]:
        from export.formats import FORMATS

        unknown = sorted(set(formats) - set(FORMATS))
        if unknown:
            raise ConfigError("formats", ",".join(unknown), f"must be among {', '.join(FORMATS)}")
        return formats

    @field_validator("mcu")
    @classmethod
    def _mcu(cls, name: str) -> str:
        from simulator.devices import known_mcu

        return known_mcu(name, "mcu")

    @model_validator(mode="after")
    def _bits(self) -> DistillJob:
        if self.q_min > self.q_max:
            raise ConfigError("q_min", self.q_min, f"must be <= q_max ({self.q_max})")
        return self


JobSpec = DistillJob  # a discriminated union on ``kind`` once there is a second kind


# ---- the server's signing key -------------------------------------------------------------


def signing_key(state_dir: Path) -> tuple[Path, Path]:
    """(private, public) key files the server signs its bundles with, made on first use."""
    from edge.contract.bundle import generate_keypair

    private, public = state_dir / "signing.key", state_dir / "signing.pub"
    if not private.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        generate_keypair(private, public)
    return private, public


def checkpoint_store(state_dir: Path) -> Path:
    """Where uploaded checkpoints are kept, each as SHA256.pt."""
    return state_dir / "checkpoints"


def resolve_teacher(spec: DistillJob, store: Store, state_dir: Path) -> Path:
    """The teacher's checkpoint file on this server, or JobError naming what is missing."""
    kind, _, ref = spec.teacher.partition(":")
    if kind == "checkpoint":
        path = checkpoint_store(state_dir) / f"{ref}.pt"
        if not path.is_file():
            raise JobError(f"teacher {spec.teacher!r}: no checkpoint with that sha256 was uploaded here "
                           "(POST /v1/checkpoints)")
        return path
    job_id = int(ref)
    made = (store.job_by_bundle(job_id) if kind == "bundle" else store.job(job_id)) if 0 < job_id < 2**62 else None
    if made is None or made["state"] != "done":
        what = f"no job on this server made bundle {ref}" if kind == "bundle" else f"job {ref} has not finished here"
        raise JobError(f"teacher {spec.teacher!r}: {what} (a bundle holds no training checkpoint; upload the "
                       "checkpoint with POST /v1/checkpoints)")
    return state_dir / "jobs" / str(made["id"]) / "checkpoint.pt"


def resolve_dataset(spec: DistillJob, state_dir: Path) -> str:
    """The data set as ``TrainConfig`` takes it: a built-in name or ucr:NAME as given, else the
    file or folder of that name in STATE_DIR/datasets (JobError when there is none)."""
    from models.data.datasets import DATASETS

    if spec.dataset in DATASETS or spec.dataset.startswith("ucr:"):
        return spec.dataset
    path = state_dir / "datasets" / spec.dataset
    if not path.exists():
        raise JobError(f"dataset {spec.dataset!r}: not a built-in data set ({', '.join(DATASETS)}, ucr:NAME) "
                       f"and not in the server's {state_dir / 'datasets'}")
    return str(path.resolve())


# ---- running one job ------------------------------------------------------------------------


@dataclass
class JobContext:
    """What a running job may do: report progress (which is where a cancellation reaches it) and log."""

    store: Store
    job_id: int
    worker: str
    state_dir: Path
    stopping: threading.Event = field(default_factory=threading.Event)

    def progress(self, fraction: float, step: str) -> None:
        """Record how far the job is; raises where the job must stop: cancelled, taken back, or
        its worker stopping."""
        if self.stopping.is_set():
            raise WorkerStoppingError()
        try:
            state = self.store.job_heartbeat(self.job_id, self.worker, fraction, step)
        except Exception as e:  # the database away for a moment: go on, the next report tells
            log.warning("job %d: progress not recorded: %s", self.job_id, e)
            return
        if state == "cancel":
            raise JobCancelledError()
        if state == "lost":
            raise JobLostError()

    def log(self, line: str) -> None:
        self.store.job_log(self.job_id, line)


def run_distill(spec: DistillJob, ctx: JobContext) -> None:
    """Distil, export a signed bundle, and end the job with it registered (and assigned)."""
    import torch

    from export.bundle import export_bundle
    from models.distill import distill
    from models.nexume.checkpoint import load_checkpoint, save_checkpoint
    from models.nexume.switchable import SwitchableNet
    from models.nexume.train import TrainConfig

    torch.set_num_threads(1)
    teacher_path = resolve_teacher(spec, ctx.store, ctx.state_dir)
    teacher, _ = load_checkpoint(teacher_path)  # weights only: never code
    if not isinstance(teacher, SwitchableNet):
        raise JobError(f"teacher {spec.teacher!r}: a user's own network (models.nexume.custom) cannot be distilled; "
                       "train the built-in CNN as the teacher")
    cfg = TrainConfig(dataset=resolve_dataset(spec, ctx.state_dir), method=spec.method, epochs=spec.epochs,
                      seed=spec.seed, q_min=spec.q_min, q_max=spec.q_max, mcu=spec.mcu)
    ctx.progress(0.02, "loading data")
    data = cfg.load_data()
    if teacher.arch.n_classes != data.n_classes or tuple(teacher.arch.input_shape) != tuple(data.input_shape):
        raise JobError(f"teacher {spec.teacher!r} takes {tuple(teacher.arch.input_shape)} into "
                       f"{teacher.arch.n_classes} classes; data set {spec.dataset!r} is {tuple(data.input_shape)} "
                       f"into {data.n_classes}")
    ctx.log(f"distilling {spec.teacher} on {data.name}: {spec.selection} keeps {spec.keep_ratio:.0%}, "
            f"student width {spec.width}, {spec.method} for {spec.epochs} epochs")

    def on_epoch(epoch: int, epochs: int, metrics: dict[str, float]) -> None:
        ctx.log(f"epoch {epoch}/{epochs}: loss {metrics['loss']:.4f}, train accuracy {metrics['train_acc']:.3f}")
        ctx.progress(0.05 + 0.75 * epoch / epochs, f"epoch {epoch}/{epochs}")

    out = distill(cfg, data, teacher, spec.selection, spec.keep_ratio, spec.width, spec.temperature, progress=on_epoch)
    job_dir = ctx.state_dir / "jobs" / str(ctx.job_id)
    job_dir.mkdir(parents=True, exist_ok=True)
    save_checkpoint(out.result, data, job_dir)
    best = max(out.result.variants, key=lambda v: v["accuracy"])
    ctx.log(f"student: best variant {best['bits']}-bit drop {best['drop']}: test accuracy {best['accuracy']:.3f}; "
            f"{len(out.kept)} of {len(data.y_train)} examples in {out.seconds:.1f} s")
    key, _ = signing_key(ctx.state_dir)
    bundle_dir = ctx.state_dir / "bundles"
    bundle_dir.mkdir(parents=True, exist_ok=True)
    for _attempt in range(5):  # an upload may take the version meanwhile: export again with the next
        version = ctx.store.next_bundle_version()
        ctx.progress(0.85, f"exporting bundle v{version}")
        tmp = export_bundle(job_dir / "checkpoint.pt", job_dir / f"bundle-v{version}.tar", spec.formats, key=key,
                            as_tar=True, bundle_version=version, progress=lambda what: ctx.log(f"exported {what}"))
        sha = hashlib.sha256(tmp.read_bytes()).hexdigest()
        model = f"{data.name}-{spec.method}"
        target = bundle_dir / f"v{version}.tar"
        result = {"bundle_version": version, "model": model, "sha256": sha, "student_accuracy": best["accuracy"],
                  "best_variant": {"bits": best["bits"], "drop": best["drop"]}, "kept": len(out.kept),
                  "n_train": len(data.y_train), "seconds": round(out.seconds, 3),
                  "assigned": f"fleet:{spec.then_assign}" if spec.then_assign else None}
        try:
            ctx.store.finish_job(ctx.job_id, ctx.worker, result, (version, model, sha, target),
                                 f"fleet:{spec.then_assign}" if spec.then_assign else None,
                                 place=functools.partial(os.replace, tmp, target))
        except VersionTakenError:
            tmp.unlink(missing_ok=True)
            continue
        except JobNotFinishedError:  # cancelled during the export, or taken back: nothing was registered
            tmp.unlink(missing_ok=True)
            ctx.progress(0.85, "ending")  # raises JobCancelledError or JobLostError
            raise
        ctx.log(f"registered bundle v{version} ({model})" + (f", assigned to fleet {spec.then_assign}"
                                                               if spec.then_assign else ""))
        return
    raise JobError("five bundle versions in a row were taken by uploads meanwhile")


RUNNERS: dict[str, Callable[[Any, JobContext], None]] = {"distill": run_distill}


# ---- workers ---------------------------------------------------------------------------------


def worker_name() -> str:
    """host:pid:random — the server tells a dead local worker by its pid."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    """Claims queued jobs one at a time and runs them (``trickle worker``)."""

    def __init__(self, store: Store, state_dir: Path, name: str | None = None, poll_s: float = 0.5,
                 heartbeat_s: float = 1.0, parent_pid: int | None = None) -> None:
        self.store, self.state_dir = store, state_dir
        self.name = name or worker_name()
        self.poll_s, self.heartbeat_s = poll_s, heartbeat_s
        self.parent_pid = parent_pid  # the server that started this worker: when it is gone, so is the worker
        self.stop = threading.Event()

    def run_one(self) -> bool:
        """Run the oldest queued job, if any; whether there was one."""
        job = self.store.claim_job(self.name)
        if job is None:
            return False
        job_id = int(job["id"])
        ctx = JobContext(self.store, job_id, self.name, self.state_dir, self.stop)
        beating = threading.Event()
        beat = threading.Thread(target=self._beat, args=(job_id, beating), name=f"trickle-job-{job_id}-heartbeat",
                                daemon=True)
        beat.start()
        log.info("job %d (%s, attempt %d) on %s", job_id, job["kind"], job["attempts"], self.name)
        ctx.log(f"started on {self.name} (attempt {job['attempts']})")
        try:
            RUNNERS[job["kind"]](JobSpec.model_validate(job["spec"]), ctx)
            log.info("job %d done", job_id)
        except JobCancelledError:
            self.store.end_job(job_id, self.name, "cancelled", "cancelled on request")
            ctx.log("cancelled")
        except JobLostError:  # the server gave it to another attempt (or failed it): not ours to end
            ctx.log(f"worker {self.name} let go of it: the server had taken it back")
        except (WorkerStoppingError, KeyboardInterrupt) as stopped:  # politely: hand the job back, attempt not spent
            self.store.release_job(job_id, self.name)
            ctx.log(f"handed back: worker {self.name} stopped")
            if isinstance(stopped, KeyboardInterrupt):
                raise
        except Exception as e:
            error = str(e) if isinstance(e, TrickleError) else f"{type(e).__name__}: {e}"
            self.store.end_job(job_id, self.name, "failed", error)
            ctx.log(f"failed: {error}")
            if not isinstance(e, TrickleError):
                ctx.log(traceback.format_exc()[-4000:])
            log.warning("job %d failed: %s", job_id, error)
        finally:
            beating.set()
            beat.join()
        return True

    def _beat(self, job_id: int, done: threading.Event) -> None:
        try:
            while not done.wait(self.heartbeat_s):
                try:
                    self.store.job_heartbeat(job_id, self.name)
                except Exception as e:  # the database away for a moment: beat again next time
                    log.warning("job %d: heartbeat failed: %s", job_id, e)
                if self._orphaned():
                    self.stop.set()
        finally:
            self.store.close()

    def _orphaned(self) -> bool:
        """Whether the server that started this worker is gone."""
        if self.parent_pid is None or os.getppid() == self.parent_pid:
            return False
        log.warning("the server (pid %d) is gone: stopping", self.parent_pid)
        return True

    def run(self, once: bool = False) -> None:
        """Until ``stop`` is set (or, with ``once``, the queue is empty)."""
        while not self.stop.is_set():
            if self._orphaned():
                return
            try:
                ran = self.run_one()
            except Exception as e:  # the database away for a moment (a job it held is reaped): try again
                log.warning("worker %s: %s", self.name, e)
                self.stop.wait(5.0)
                ran = False
            if not ran:
                if once:
                    return
                self.stop.wait(self.poll_s)


def run_worker(store: Store, state_dir: Path, once: bool = False, parent_pid: int | None = None) -> None:
    """A worker in this process until SIGTERM (the running job is handed back at its next progress
    report) or SIGINT (at once)."""
    worker = Worker(store, state_dir, parent_pid=parent_pid)
    # set from a thread: the handler runs in the main thread, which may hold the event's lock (in wait)
    signal.signal(signal.SIGTERM, lambda signum, frame: threading.Thread(target=worker.stop.set).start())
    with contextlib.suppress(KeyboardInterrupt):
        worker.run(once)


# ---- the server's side: worker processes, dead workers, announcements ------------------------------


def _local_pid(worker: str) -> int | None:
    """The pid in a worker's name (host:pid:random) when it runs on this host."""
    host, _, rest = worker.partition(":")
    pid = rest.split(":", 1)[0]
    return int(pid) if host == socket.gethostname() and pid.isdigit() else None


@dataclass
class JobSupervisor:
    """In the server: starts ``workers`` worker processes (again when one dies, backing off when
    they die at once), queues the job of a dead worker again (or fails it), and announces finished
    jobs' assignments. A worker of its own that exited is dead at once; any other is dead when its
    heartbeat is ``stale_s`` old."""

    store: Store
    state_dir: Path
    store_spec: str | None  # what the workers open (--store), None: the state dir's SQLite
    workers: int
    announce: Callable[[dict[str, Any]], None]
    stale_s: float = 15.0
    max_attempts: int = 2
    every_s: float = 0.5
    stop_wait_s: float = 10.0  # how long a stopping worker may take to hand its job back
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    exited: dict[int, int | None] = field(default_factory=dict)  # pid -> exit status, of this server's workers
    seen: set[int] = field(default_factory=set)  # pids of this server's workers whose exit was noted
    _next_spawn: list[float] = field(default_factory=list)
    _backoff: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        signing_key(self.state_dir)
        self.procs = [self._spawn(i) for i in range(self.workers)]
        self._next_spawn = [0.0] * self.workers
        self._backoff = [1.0] * self.workers
        self._thread = threading.Thread(target=self._loop, name="trickle-jobs", daemon=True)
        self._thread.start()

    def _spawn(self, index: int) -> subprocess.Popen[bytes]:
        logs = self.state_dir / "workers"
        logs.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "trickle.cli", "worker", "--state-dir", str(self.state_dir),
               "--parent-pid", str(os.getpid())]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if self.store_spec:  # through the environment: a password in argv is visible to every user (ps)
            env["TRICKLE_STORE"] = self.store_spec
        else:  # the state dir's SQLite, whatever this server's environment says
            env.pop("TRICKLE_STORE", None)
        with open(logs / f"worker-{index}.log", "ab") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.every_s):
                try:
                    self.tick()
                except Exception:  # the database away for a moment, a full disk: log it, tick again
                    log.exception("job supervisor")
        finally:
            self.store.close()

    def tick(self) -> None:
        now = time.monotonic()
        for i, proc in enumerate(self.procs):
            if proc.poll() is None or self._stop.is_set():
                continue
            if proc.pid not in self.seen:
                self.seen.add(proc.pid)
                self.exited[proc.pid] = proc.returncode
                # a worker that dies right after starting (a broken install, a bad --store) is not
                # started again in a tight loop: 1, 2, 4 ... 60 s apart
                self._next_spawn[i] = now + self._backoff[i]
                self._backoff[i] = min(60.0, self._backoff[i] * 2)
                log.warning("worker %d (pid %d) exited with %s", i, proc.pid, proc.returncode)
            if now >= self._next_spawn[i]:
                self.procs[i] = self._spawn(i)
        for i, proc in enumerate(self.procs):  # one that kept running a while earns a short wait again
            if proc.poll() is None and now - self._next_spawn[i] > 60:
                self._backoff[i] = 1.0
        self.reap()
        for job in self.store.unannounced_jobs():
            self.announce(job)
            self.store.mark_announced(int(job["id"]))

    def alive(self) -> tuple[int, int]:
        """(worker processes running, workers wanted)."""
        return sum(proc.poll() is None for proc in self.procs), self.workers

    def reap(self) -> None:
        """Queue again (or fail) the jobs of workers that are gone."""
        now = time.time()
        for job_id, worker, heartbeat in self.store.running_jobs():
            pid = _local_pid(worker)
            dead = pid in self.exited
            if dead or now - heartbeat > self.stale_s:
                why = (f"worker {worker} died (exit status {self.exited[pid]})" if dead and pid is not None
                       else f"worker {worker} silent for {now - heartbeat:.0f} s")
                state = self.store.requeue_job(job_id, worker, heartbeat, self.max_attempts, why)
                if state is not None:
                    self.store.job_log(job_id, f"{why}: job {'resumed' if state == 'queued' else state}")
                    log.warning("job %d: %s; now %s", job_id, why, state)
        # an exit counts once: the job such a worker held was just taken back, and a later worker
        # may get the same pid
        self.exited.clear()

    def stop(self) -> None:
        """Stop watching first (so no worker is started again), then the workers: SIGTERM hands a
        running job back at its next progress report; one still busy after ``stop_wait_s`` gets
        SIGINT (handed back at once), then SIGKILL, and its job is handed back here: a restart
        spends no attempt."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for sig, wait_s in ((None, self.stop_wait_s), (signal.SIGINT, 3.0), (signal.SIGKILL, 10.0)):
            deadline = time.monotonic() + wait_s
            for proc in self.procs:
                if sig is not None and proc.poll() is None:
                    proc.send_signal(sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(0.1, deadline - time.monotonic()))
            if all(proc.poll() is not None for proc in self.procs):
                break
        pids = {proc.pid for proc in self.procs}
        with contextlib.suppress(Exception):
            for job_id, worker, _ in self.store.running_jobs():
                if _local_pid(worker) in pids:
                    self.store.release_job(job_id, worker)
