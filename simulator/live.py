"""Simulated nodes on the real link: every result of a simulation is published to the server over
MQTT by its node's own device identity, through the device's store-and-forward link (``edge.agent.link``).

Virtual time: a result's ``ts_s`` is the simulated time it was produced; the publishing itself
runs as fast as the link takes it. Devices are ``{fleet}-n{node_id}``, registered on first use
with the admin token; their tokens are kept in ``state_dir/tokens.json`` so a rerun reuses them.
Keys are ``{device}:result:{sensing event}``, so publishing a run twice stores it once.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from tenacity import retry, retry_if_result, stop_after_delay, wait_fixed

from edge.agent.link import Link
from edge.agent.outbox import Outbox
from edge.contract.protocol import ROUTES, Message, Result, Telemetry, encode, topic
from edge.core.errors import LinkError
from edge.core.files import write_secret
from simulator.results import SimulationResult
from simulator.summary import sample_indices

Progress = Callable[[str, int, int], None]  # (stage, done, total): see deliver


class LiveError(LinkError):
    """The server refused the simulation's devices, or the link did not drain in time."""


@dataclass
class LiveReport:
    """What publishing a simulation took: devices, messages and seconds until the last acknowledgement."""

    devices: int
    messages: int
    seconds: float

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


def device_name(fleet: str, node_id: int) -> str:
    return f"{fleet}-n{node_id}"


def register(server: str, admin_token: str, fleet: str, node_ids: list[int], state_dir: Path) -> dict[str, str]:
    """Tokens of the simulation's devices, registering the ones this state folder has not seen."""
    path = state_dir / "tokens.json"
    tokens: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    headers = {"Authorization": f"Bearer {admin_token}"}
    for node_id in node_ids:
        device = device_name(fleet, node_id)
        if device in tokens:
            continue
        r = httpx.post(server.rstrip("/") + ROUTES["devices"], json={"device": device, "fleet": fleet}, headers=headers,
                       timeout=30)
        if r.status_code == 409:
            raise LiveError(f"device {device} is registered on {server} but its token is not in {path}")
        if r.status_code != 201:
            raise LiveError(f"registering {device} on {server}: HTTP {r.status_code} {r.text[:200]}")
        tokens[device] = r.json()["token"]
    write_secret(path, json.dumps(tokens))
    return tokens


def on_time_until(boots: np.ndarray, failures: np.ndarray, t: float) -> float:
    """Seconds powered before ``t``: the k-th on-period runs from ``boots[k]`` to ``failures[k]``
    (to ``t`` while it has not failed)."""
    started = boots[boots < t]
    ends = np.minimum(np.append(failures, np.full(max(len(started) - len(failures), 0), np.inf))[: len(started)], t)
    return float(np.sum(ends - started))


def node_messages(result: SimulationResult, fleet: str, labels: list[str], bundle_version: int,
                  telemetry_every_s: float = 600.0) -> dict[str, list[tuple[str, Message]]]:
    """(kind, message) per device: a result per finished task; a telemetry every
    ``telemetry_every_s`` of simulated time (power failures and time powered so far, and the
    capacitor's voltage where the node's trace was recorded, ``nodes.record_traces``); a final
    telemetry of the node (its totals, as ``results.json`` has them)."""
    model = result.model
    if model is None:
        raise LiveError("a live simulation needs a model (a bundle) to report results")
    out: dict[str, list[tuple[str, Message]]] = {}
    for r in result.nodes:
        device = device_name(fleet, r.node_id)
        samples = sample_indices(result.scenario.run.seed, r.node_id, model.n_test, r.stats.released)
        messages: list[tuple[str, Message]] = []
        log, done, latency = r.task_log, r.task_done_s, r.task_latency_s
        assert log is not None and done is not None and latency is not None
        for (event, variant, in_time), done_s, latency_s in zip(log.tolist(), done.tolist(), latency.tolist()):
            v = model.variants[0 if model.early is not None else variant]  # early: variant = samples taken - 1
            sample = int(samples[event])
            k = int(v.predicted[sample]) if v.predicted is not None else 0
            messages.append(("result", Result(
                key=f"{device}:result:{event}", device=device, ts_s=done_s, label=str(labels[k]), class_index=k,
                variant=f"int{v.bits}-d{round(v.drop * 100):02d}", bundle_version=bundle_version, latency_s=latency_s,
                correct=bool(in_time and v.correct[sample]))))
        failures = np.zeros(0) if r.off_at_s is None else np.asarray(r.off_at_s)
        boots = np.zeros(0) if r.on_at_s is None else np.asarray(r.on_at_s)
        trace_t = np.asarray(r.trace["time_s"]) if r.trace else None
        trace_v = np.asarray(r.trace["voltage_v"]) if r.trace else None
        for k, t in enumerate(np.arange(telemetry_every_s, result.scenario.run.duration_s, telemetry_every_s)):
            voltage = None
            if trace_t is not None and trace_v is not None and len(trace_t):
                voltage = float(trace_v[max(int(np.searchsorted(trace_t, t, side="right")) - 1, 0)])
            messages.append(("telemetry", Telemetry(key=f"{device}:telemetry:{k}", device=device, ts_s=float(t),
                                                    voltage_v=voltage, on_time_s=on_time_until(boots, failures, t),
                                                    power_cycles=int(np.searchsorted(failures, t, side="right")))))
        st = r.stats
        messages.append(("telemetry", Telemetry(
            key=f"{device}:telemetry:final", device=device, ts_s=result.scenario.run.duration_s, voltage_v=st.v_final_v,
            harvested_j=st.harvested_j, consumed_j=st.load_j, power_cycles=st.power_cycles, on_time_s=st.on_time_s,
            metrics={"completed": float(st.completed), "missed": float(st.missed), "lost_off": float(st.lost_off)})))
        out[device] = messages
    return out


def publish(result: SimulationResult, server: str, broker: str, admin_token: str, fleet: str, labels: list[str],
            bundle_version: int, state_dir: Path, timeout_s: float = 600.0, progress: Progress | None = None
            ) -> LiveReport:
    """Publish every node's messages; returns when the server has acknowledged every one."""
    per_device = node_messages(result, fleet, labels, bundle_version)
    tokens = register(server, admin_token, fleet, [r.node_id for r in result.nodes], state_dir)
    seconds = deliver(per_device, tokens, server, broker, fleet, state_dir, timeout_s, progress)
    return LiveReport(len(per_device), sum(len(m) for m in per_device.values()), seconds)


def deliver(per_device: dict[str, list[tuple[str, Message]]], tokens: dict[str, str], server: str, broker: str,
            fleet: str, state_dir: Path, timeout_s: float = 600.0, progress: Progress | None = None) -> float:
    """Send each device's messages through its own store-and-forward link (outbox, end-to-end
    acks), all devices at once; returns the seconds until the server acknowledged the last one.

    Each device's backlog is queued in one outbox transaction (one fsync, not one per message).
    ``progress(stage, done, total)`` is told how many messages are ``"queued"`` on disk, then how
    many the server has ``"acknowledged"`` (a message left queued by an earlier, interrupted run
    is sent and counted too)."""
    total = sum(len(m) for m in per_device.values())
    links = []
    queued = 0
    for device, messages in per_device.items():
        outbox = Outbox(state_dir / "outbox" / f"{device}.sqlite")
        outbox.put_many((m.key, topic(fleet, device, kind), encode(m, tokens[device])) for kind, m in messages)
        links.append((Link(outbox, device, tokens[device], broker, fleet), outbox))
        queued += len(messages)
        if progress is not None:
            progress("queued", queued, total)
    backlog = sum(len(outbox) for _, outbox in links)
    start = time.perf_counter()
    for link, _ in links:
        link.start()
    shown = -1.0

    @retry(retry=retry_if_result(lambda drained: not drained), stop=stop_after_delay(timeout_s), wait=wait_fixed(0.05),
           retry_error_callback=lambda state: False)
    def drained() -> bool:
        nonlocal shown
        left = [len(outbox) for _, outbox in links]
        if progress is not None and (time.monotonic() - shown >= 0.25 or not any(left)):
            progress("acknowledged", backlog - sum(left), backlog)
            shown = time.monotonic()
        return not any(left)

    try:
        if not drained():
            left = sum(len(outbox) for _, outbox in links)
            raise LiveError(f"{left} messages still queued after {timeout_s:.0f} s (kept in {state_dir}/outbox)")
        return time.perf_counter() - start
    finally:
        for link, outbox in links:
            link.stop()
            outbox.close()


@contextlib.contextmanager
def progress_bars(disable: bool | None = None) -> Iterator[Progress]:
    """A ``progress`` for :func:`deliver` that draws one tqdm bar per stage on stderr (``disable``:
    None draws them on a terminal only)."""
    from tqdm import tqdm

    bars: dict[str, Any] = {}
    try:
        def update(stage: str, done: int, total: int) -> None:
            bar = bars.get(stage)
            if bar is None:
                bar = bars[stage] = tqdm(total=total, unit="msg", desc=f"messages {stage}", file=sys.stderr,
                                         disable=disable, leave=False)
            bar.total = total
            bar.update(done - bar.n)

        yield update
    finally:
        for bar in bars.values():
            bar.close()
