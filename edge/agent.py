"""The device agent: read a sensor source, infer with the bundle, report over MQTT, take OTA.

    agent = Agent(AgentConfig(device="node-1", token=..., server="http://127.0.0.1:8080",
                              broker="mqtt://127.0.0.1:1883", state_dir=Path("state/node-1"),
                              bundle=Path("bundles/digits.tar"), source=Path("samples.npz")))
    agent.run()

Every message goes through the ``Outbox`` (on disk first, deleted when the server acknowledges
storing it; published again if that acknowledgement is overdue),
with an idempotency key ``{device}:{kind}:{n}``; the source cursor moves in the same
transaction, so a kill -9 at any point loses nothing and a restart repeats nothing the server
would keep twice. paho reconnects with exponential backoff; a status ``online`` is retained on
connect and the broker publishes the last will ``offline`` when the agent vanishes.

OTA: the server retains an ``OtaCommand`` on the device's ``ota`` topic. The agent downloads
the bundle over HTTP, checks its sha256, its signature, every file hash and that its version is
newer (``edge.bundle.read_bundle``), switches ``current.json`` atomically (rename), runs a
self-test on the stored test vectors, and rolls back if the self-test fails; the outcome is an
``event`` message.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import paho.mqtt.client as mqtt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edge.bundle import Bundle, BundleError, load_public_key, read_bundle
from edge.errors import AgentError
from edge.outbox import Outbox
from edge.preprocess import read_input
from edge.protocol import SERVER_KINDS, Ack, Event, Message, OtaCommand, Result, Status, Telemetry, encode, topic
from edge.runtime import Runtime

log = logging.getLogger("trickle.edge.agent")
SELFTEST_VECTORS = 16


@dataclass
class AgentConfig:
    device: str
    token: str
    server: str  # http(s)://HOST:PORT
    broker: str  # mqtt://HOST:PORT
    state_dir: Path
    fleet: str = "default"
    bundle: Path | None = None  # the first bundle, when state_dir holds none yet
    source: Path | None = None  # .npz (x[, y]) or a folder of .npy/.csv/.txt/.wav files
    period_s: float = 0.0  # between samples (0: as fast as the link takes them)
    count: int | None = None  # samples to take (default: the whole source)
    telemetry_every: int = 10  # a telemetry message every N results
    trusted_keys: list[Path] = field(default_factory=list)
    backend: str = "onnxruntime"
    exit_when_done: bool = False  # else keep serving OTA after the source ends, until stopped
    max_in_flight: int = 256
    resend_s: float = 30.0  # publish again a message the server has not acknowledged after this


def load_source(path: Path, preprocessing: dict[str, Any]) -> tuple[list[np.ndarray], np.ndarray | None]:
    """Raw samples (as the sensor gives them) and their labels if known."""
    if path.suffix == ".npz":
        with np.load(path) as data:
            if "x" not in data:
                raise AgentError(f"source {path}: an .npz source needs an array 'x' (and optionally 'y')")
            return list(data["x"]), (np.asarray(data["y"]) if "y" in data else None)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".npy", ".csv", ".txt", ".wav"))
        if not files:
            raise AgentError(f"source {path}: no .npy/.csv/.txt/.wav files")
        return [read_input(p, preprocessing) for p in files], None
    if path.exists():
        return [read_input(path, preprocessing)], None
    raise AgentError(f"source {path}: no such file or folder")


class Link:
    """MQTT with the outbox behind it. A sender thread keeps up to ``max_in_flight`` queued
    messages published (awaiting the broker's PUBACK); a message the broker acknowledged waits for
    the server's ``ack`` of its key, which deletes it, and is published again if that does not
    come within ``resend_s`` while the server acknowledges nothing at all."""

    def __init__(self, config: AgentConfig, outbox: Outbox, on_ota: Any) -> None:
        parts = urlsplit(config.broker)
        if parts.scheme != "mqtt" or not parts.hostname:
            raise AgentError(f"broker {config.broker!r}: must be mqtt://HOST:PORT")
        self.config, self.outbox, self.on_ota = config, outbox, on_ota
        self.host, self.port = parts.hostname, parts.port or 1883
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"trickle-{config.device}")
        self.client.username_pw_set(config.device, config.token)
        self.client.reconnect_delay_set(1, 30)
        self.client.max_inflight_messages_set(config.max_in_flight)
        self.client.max_queued_messages_set(0)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish
        self.client.on_message = self._on_message
        self._cond = threading.Condition()
        self._in_flight: dict[int, int] = {}  # mid -> outbox seq
        self._early: dict[int, float] = {}  # mid -> when its PUBACK came before the sender recorded it
        self._awaiting: dict[int, float] = {}  # seq -> when the broker acknowledged it (server ack pending)
        self._last_ack = time.monotonic()  # when the server last acknowledged anything
        self._sent_up_to = 0
        self._connected = False
        self._stop = False
        self._sender = threading.Thread(target=self._send_loop, name="trickle-agent-sender", daemon=True)
        self.bundle_version: int | None = None

    def start(self) -> None:
        self._set_will()
        self.client.connect_async(self.host, self.port, keepalive=20)
        self.client.loop_start()
        self._sender.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._sender.join(timeout=10)
        self.publish_status("offline")
        self.client.disconnect()
        self.client.loop_stop()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _signed(self, message: Message) -> bytes:
        return encode(message, self.config.token)

    def _status(self, state: str) -> bytes:
        key = f"{self.config.device}:status:{time.time_ns()}"
        return self._signed(Status(key=key, device=self.config.device, ts_s=time.time(), state=state,
                                   bundle_version=self.bundle_version))

    def _set_will(self) -> None:
        self.client.will_set(topic(self.config.fleet, self.config.device, "status"), self._status("offline"), qos=1, retain=True)

    def publish_status(self, state: str) -> None:
        self.client.publish(topic(self.config.fleet, self.config.device, "status"), self._status(state), qos=1, retain=True)

    def _on_connect(self, client: mqtt.Client, userdata: object, flags: object, reason: mqtt.ReasonCode,
                    properties: object) -> None:
        if reason.is_failure:
            log.error("broker refused %s: %s", self.config.device, reason)
            return
        for kind in SERVER_KINDS:
            client.subscribe(topic(self.config.fleet, self.config.device, kind), qos=1)
        self.publish_status("online")
        with self._cond:
            self._connected = True
            self._in_flight.clear()  # resend whatever is still queued; the server drops repeats by key
            self._early.clear()
            self._awaiting.clear()
            self._last_ack = time.monotonic()
            self._sent_up_to = 0
            self._cond.notify_all()

    def _on_disconnect(self, client: mqtt.Client, userdata: object, flags: object, reason: mqtt.ReasonCode,
                       properties: object) -> None:
        with self._cond:
            self._connected = False
        self._set_will()  # re-armed for the next connection

    def _on_publish(self, client: mqtt.Client, userdata: object, mid: int, reason: mqtt.ReasonCode,
                    properties: object) -> None:
        with self._cond:
            seq = self._in_flight.pop(mid, None)
            if seq is None:  # acknowledged before the sender recorded it (or a previous session's)
                self._early[mid] = time.monotonic()
            else:
                self._awaiting[seq] = time.monotonic()
            self._cond.notify_all()

    def _on_message(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        if msg.topic.endswith("/ack"):
            try:
                keys = Ack.model_validate_json(msg.payload).keys
            except ValueError as err:
                log.warning("ignored a malformed ack: %s", err)
                return
            self.outbox.delete_keys(keys)
            with self._cond:
                self._last_ack = time.monotonic()
                self._cond.notify_all()
        elif msg.topic.endswith("/ota"):
            threading.Thread(target=self.on_ota, args=(msg.payload,), name="trickle-ota", daemon=True).start()

    def _next_rows(self) -> list[tuple[int, str, bytes]] | None:
        """Messages to publish now (never-sent ones first, then those whose server ack is overdue);
        None once stopped. Waits while disconnected or while the window is full."""
        with self._cond:
            while not self._stop and (not self._connected or len(self._in_flight) >= self.config.max_in_flight):
                self._cond.wait(0.5)
            if self._stop:
                return None
            room = self.config.max_in_flight - len(self._in_flight)
            after = self._sent_up_to
            now = time.monotonic()
            # resend only when the server has gone quiet: while its acks keep coming it is working
            # through a backlog, and resending would only deepen it
            stalled = now - self._last_ack > self.config.resend_s
            overdue = sorted(seq for seq, t in self._awaiting.items() if stalled and now - t > self.config.resend_s)[:room]
            for seq in overdue:
                del self._awaiting[seq]
            self._early = {mid: t for mid, t in self._early.items() if now - t < 5.0}  # acks that matched nothing
        rows = self.outbox.pending(after, room)
        return rows + self.outbox.rows(overdue)[: max(0, room - len(rows))]

    def _send_loop(self) -> None:
        # paho is never called with self._cond held: its network thread takes its own locks and
        # then ours (in _on_publish), so holding ours across publish() would deadlock.
        while (rows := self._next_rows()) is not None:
            if not rows:
                with self._cond:
                    self._cond.wait(0.2)
                continue
            for seq, name, payload in rows:
                info = self.client.publish(name, payload, qos=1)
                if info.rc != mqtt.MQTT_ERR_SUCCESS:
                    break
                with self._cond:
                    self._sent_up_to = max(self._sent_up_to, seq)
                    if self._early.pop(info.mid, None) is None:
                        self._in_flight[info.mid] = seq
                    else:
                        self._awaiting[seq] = time.monotonic()

    def drained(self) -> bool:
        return len(self.outbox) == 0


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.state_dir = Path(config.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.keys: list[Ed25519PublicKey] = [load_public_key(k) for k in config.trusted_keys]
        self.outbox = Outbox(self.state_dir / "outbox.sqlite")
        self._ota_lock = threading.Lock()
        self.bundle = self._boot_bundle()
        self.runtime = Runtime(self.bundle, backend=config.backend)
        self.link = Link(config, self.outbox, self._on_ota)
        self.link.bundle_version = self.version
        self._stopped = threading.Event()

    # ---- bundles ----

    @property
    def version(self) -> int:
        return int(self.bundle.manifest["bundle_version"])

    def _read(self, path: Path, newer_than: int | None = None) -> Bundle:
        return read_bundle(path, self.keys or None, require_signature=bool(self.keys), newer_than=newer_than)

    def _boot_bundle(self) -> Bundle:
        current = self.state_dir / "current.json"
        if current.exists():
            return self._read(self.state_dir / json.loads(current.read_text())["path"])
        if self.config.bundle is None:
            raise AgentError(f"{self.state_dir} holds no bundle yet: give --bundle")
        bundle = self._read(self.config.bundle)
        name = f"bundles/v{bundle.manifest['bundle_version']}{'.tar' if self.config.bundle.suffix == '.tar' else ''}"
        target = self.state_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if self.config.bundle.is_dir():
            shutil.copytree(self.config.bundle, target, dirs_exist_ok=True)
        else:
            shutil.copyfile(self.config.bundle, target)
        self._switch(name)
        return bundle

    def _switch(self, name: str) -> None:
        tmp = self.state_dir / ".current.json.tmp"
        tmp.write_text(json.dumps({"path": name}))
        os.replace(tmp, self.state_dir / "current.json")

    def self_test(self, runtime: Runtime) -> str | None:
        """None if ``runtime`` classifies the stored test vectors sanely, else why not: every
        output finite, and, with labels, accuracy within 0.25 of what the manifest claims."""
        path = self.state_dir / "selftest.npz"
        if not path.exists():
            return None
        with np.load(path) as data:
            x, y = data["x"], data.get("y")
        try:
            variant = runtime.choose()
            logits = np.concatenate([runtime.infer(raw, variant["name"]) for raw in x])
        except (BundleError, ValueError, RuntimeError) as err:
            return f"inference failed: {err}"
        if not np.all(np.isfinite(logits)):
            return "non-finite outputs"
        if y is not None:
            accuracy = float((logits.argmax(1) == y).mean())
            claimed = variant["accuracy"][runtime.format_of(variant)]
            if accuracy < claimed - 0.25:
                return f"accuracy {accuracy:.2f} on the stored vectors, the manifest claims {claimed:.2f}"
        return None

    def _event(self, event: str, version: int | None, detail: str) -> None:
        n = time.time_ns()
        self._queue("event", Event(key=f"{self.config.device}:event:{n}", device=self.config.device, ts_s=time.time(),
                                   event=event, bundle_version=version, detail=detail[:512]))

    def _on_ota(self, payload: bytes) -> None:
        with self._ota_lock:
            try:
                command = OtaCommand.model_validate_json(payload)
            except ValueError as err:
                log.warning("ignored a malformed OTA command: %s", err)
                return
            if command.bundle_version == self.version or self.outbox.get_state(f"failed:{command.bundle_version}"):
                return  # already running it, or its self-test failed here before (the command is retained)
            try:
                self._apply(command)
            except Exception as err:  # anything wrong with an update is reported, never fatal to the agent
                log.warning("OTA to v%d refused: %s", command.bundle_version, err)
                self._event("ota_rejected", command.bundle_version, str(err))

    def _apply(self, command: OtaCommand) -> None:
        if command.bundle_version < self.version:
            raise BundleError(f"bundle_version {command.bundle_version} is older than the running {self.version}")
        url = self.config.server.rstrip("/") + command.path
        response = httpx.get(url, headers={"Authorization": f"Bearer {self.config.token}"}, timeout=60.0)
        response.raise_for_status()
        if hashlib.sha256(response.content).hexdigest() != command.sha256:
            raise BundleError(f"downloaded bundle v{command.bundle_version} does not match the sha256 the server announced")
        name = f"bundles/v{command.bundle_version}.tar"
        target = self.state_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(response.content)
        try:
            bundle = self._read(tmp, newer_than=self.version)
        except BundleError:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, target)
        previous = json.loads((self.state_dir / "current.json").read_text())["path"]
        old_version = self.version
        self._switch(name)
        runtime = Runtime(bundle, backend=self.config.backend)
        failure = self.self_test(runtime)
        if failure is not None:
            self._switch(previous)
            self.outbox.set_state(f"failed:{command.bundle_version}", failure)  # not retried when the command is retained
            log.warning("OTA to v%d rolled back: %s", command.bundle_version, failure)
            self._event("ota_rolled_back", command.bundle_version, f"self-test failed: {failure}; running v{old_version}")
            return
        self.bundle, self.runtime = bundle, runtime
        self.link.bundle_version = self.version
        self.link.publish_status("online")
        log.info("OTA: now running v%d", self.version)
        self._event("ota_applied", self.version, f"from v{old_version}")

    # ---- reporting ----

    def _queue(self, kind: str, message: Message, state: dict[str, str] | None = None) -> None:
        self.outbox.put(message.key, topic(self.config.fleet, self.config.device, kind), encode(message, self.config.token),
                        state)
        self.link.wake()

    def _samples(self) -> Iterator[tuple[int, np.ndarray, int | None]]:
        if self.config.source is None:
            return
        raws, labels = load_source(self.config.source, self.bundle.manifest["preprocessing"])
        selftest = self.state_dir / "selftest.npz"
        if not selftest.exists():  # the first samples become the OTA self-test vectors
            k = min(SELFTEST_VECTORS, len(raws))
            arrays = {"x": np.stack(raws[:k])} | ({"y": labels[:k]} if labels is not None else {})
            np.savez(selftest.with_name(".selftest.tmp.npz"), **arrays)  # type: ignore[arg-type]
            os.replace(selftest.with_name(".selftest.tmp.npz"), selftest)
        count = len(raws) if self.config.count is None else min(self.config.count, len(raws))
        start = int(self.outbox.get_state("cursor", "0") or 0)
        for i in range(start, count):
            yield i, raws[i], (int(labels[i]) if labels is not None else None)

    def run(self) -> int:
        """Report every sample of the source; returns how many this run produced."""
        self.link.start()
        produced = 0
        try:
            for i, raw, label in self._samples():
                if self._stopped.is_set():
                    break
                t0 = time.perf_counter()
                variant = self.runtime.choose()
                logits = self.runtime.infer(raw, variant["name"])[0]
                latency_s = time.perf_counter() - t0
                k = int(np.argmax(logits))
                labels = self.bundle.manifest["labels"]
                result = Result(key=f"{self.config.device}:result:{i}", device=self.config.device, ts_s=time.time(),
                                label=str(labels[k]), class_index=k, variant=variant["name"], bundle_version=self.version,
                                latency_s=latency_s, correct=None if label is None else k == label)
                self._queue("result", result, {"cursor": str(i + 1)})
                if (i + 1) % self.config.telemetry_every == 0:
                    self._queue("telemetry", Telemetry(key=f"{self.config.device}:telemetry:{i}", device=self.config.device,
                                                       ts_s=time.time(), metrics={"queued": float(len(self.outbox)),
                                                                                  "latency_s": latency_s}))
                produced += 1
                if self.config.period_s > 0:
                    self._stopped.wait(self.config.period_s)
            while not self._stopped.is_set() and not (self.config.exit_when_done and self.link.drained()):
                self._stopped.wait(0.05)
        finally:
            self.link.stop()
            self.outbox.close()
        return produced

    def stop(self) -> None:
        self._stopped.set()
