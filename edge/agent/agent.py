"""The device agent: read a sensor source, infer with the bundle, report over MQTT, take OTA.

    agent = Agent(AgentConfig(device="node-1", token=..., server="http://127.0.0.1:8080",
                              broker="mqtt://127.0.0.1:1883", state_dir=Path("state/node-1"),
                              bundle=Path("bundles/digits.tar"), source=Path("samples.npz")))
    agent.run()

The agent composes three parts and runs the reporting loop:

- ``edge.agent.link.Link``: MQTT with the on-disk outbox behind it (windowed resend, status and last will);
- ``edge.agent.ota.Ota``: the bundle it runs, and over-the-air updates (verify, switch, self-test, roll back);
- ``edge.agent.source``: the sensor source (raw samples, labels if known).

Every message goes through the outbox with an idempotency key ``{device}:{kind}:{n}``; the
source cursor moves in the same transaction, so a kill -9 at any point loses nothing and a
restart repeats nothing the server would keep twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit

import numpy as np
from pydantic import Field, field_validator, model_validator

from edge.agent.link import Link
from edge.agent.ota import Ota
from edge.agent.outbox import Outbox, recover_outbox
from edge.agent.source import keep_selftest_samples, load_source
from edge.classify.backends import BACKENDS
from edge.classify.runtime import Runtime
from edge.contract.bundle import Bundle
from edge.contract.protocol import Event, Message, Name, Result, Telemetry, TlsFiles, mqtt_address
from edge.core.config import Config
from edge.core.errors import ConfigError, DataError, LinkError, TrickleError
from edge.core.files import write_atomic

log = logging.getLogger("trickle.edge.agent")


class AgentConfig(Config):
    """The device agent (``trickle edge run``): who it is, where it reports, what it reads."""

    device: Name
    """This device's id, as registered on the server."""
    token: str = Field("", repr=False)
    """The device's token (from registration); or give ``token_file``."""
    token_file: Path | None = None
    """File holding the device's token, read at start (instead of ``token``)."""
    server: str
    """Server URL, http(s)://HOST[:PORT]: where bundles are downloaded from."""
    broker: str
    """MQTT broker URL, mqtt://HOST:PORT, or mqtts://HOST:PORT for MQTT over TLS."""
    ca_file: Path | None = None
    """PEM CA certificates to trust for an https:// server and an mqtts:// broker (default: the system's)."""
    client_cert: Path | None = None
    """PEM certificate this device shows to an mqtts:// broker or https:// server that asks (mutual TLS)."""
    client_key: Path | None = None
    """The private key of client_cert (when not in the same file)."""
    state_dir: Path = Path("runs/edge/DEVICE")
    """Bundles, current.json, the outbox and the self-test samples (default runs/edge/DEVICE)."""
    fleet: Name = "default"
    """The device's fleet, as registered on the server."""
    bundle: Path | None = None
    """The first bundle (folder or .tar), needed when state_dir holds none yet."""
    source: Path | None = None
    """.npz of raw samples ('x', optional labels 'y'), or a folder of .npy/.csv/.txt/.wav files."""
    period_s: float = Field(0.0, ge=0, le=86400)
    """Time between samples (0: as fast as the link takes them)."""
    count: int | None = Field(None, ge=0)
    """Samples to take (default: the whole source)."""
    telemetry_every: int = Field(10, ge=1)
    """A telemetry message every N results."""
    trusted_keys: list[Path] = Field(default_factory=list)
    """Ed25519 public key files; with any, every bundle must be signed by one of them."""
    backend: str = "onnxruntime"
    """Inference engine: one of edge.classify.backends.BACKENDS (onnxruntime, litert, executorch)."""
    exit_when_done: bool = False
    """Exit once the source is reported and acknowledged (else keep serving OTA until stopped)."""
    max_in_flight: int = Field(256, ge=1, le=65535)
    """Messages published and not yet acknowledged by the broker, at most."""
    resend_s: float = Field(30.0, gt=0)
    """Publish again a message the server has not acknowledged after this long."""
    recover_outbox: bool = False
    """Start by saving a damaged (or missing) outbox aside and keeping what can still be read of it."""

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        """state_dir defaults to runs/edge/DEVICE; token_file is read into token."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("state_dir") is None and isinstance(data.get("device"), str):
            data["state_dir"] = Path("runs/edge") / data["device"]
        path = data.get("token_file")
        if path is not None:
            if data.get("token"):
                raise ConfigError("token_file", str(path), "give token or token_file, not both")
            try:
                data["token"] = Path(path).read_text().strip()
            except FileNotFoundError:
                raise ConfigError("token_file", str(path), "no such file") from None
            except (OSError, UnicodeDecodeError) as e:
                raise ConfigError("token_file", str(path), f"cannot be read ({e})") from None
        return data

    @model_validator(mode="after")
    def _token(self) -> Self:
        if not self.token:
            raise ConfigError("token", "", "the device's token is needed: give token or token_file (--token-file)")
        return self

    @field_validator("server")
    @classmethod
    def _server(cls, value: str) -> str:
        parts = urlsplit(value)
        try:
            port_ok = parts.port is None or parts.port > 0
        except ValueError:  # a port that is not a number, or out of range
            port_ok = False
        if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
            raise ConfigError("server", value, "must be http(s)://HOST[:PORT]")
        return value

    @field_validator("broker")
    @classmethod
    def _broker(cls, value: str) -> str:
        mqtt_address(value, "broker")
        return value

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str) -> str:
        if value not in BACKENDS:
            raise ConfigError("backend", value, f"must be one of {list(BACKENDS)}")
        return value


class Agent:
    """The device agent: reads its source, infers with the bundle OTA keeps, queues every result in the
    outbox and reports over its link."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.state_dir = Path(config.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.outbox = open_outbox(self.state_dir, recover=config.recover_outbox)
        tls = TlsFiles(config.ca_file, config.client_cert, config.client_key)
        try:
            verify = tls.context() if config.server.startswith("https:") else True
            self.ota = Ota(self.state_dir, config.trusted_keys, config.backend, config.server, config.token, self.outbox,
                           first_bundle=config.bundle, report=self._event, applied=self._applied, verify=verify)
            self.link = Link(self.outbox, config.device, config.token, config.broker, config.fleet, on_ota=self.ota.handle,
                             max_in_flight=config.max_in_flight, resend_s=config.resend_s, tls=tls)
        except BaseException:
            self.outbox.close()
            raise
        self.link.bundle_version = self.version
        self._stopped = threading.Event()

    @property
    def version(self) -> int:
        return self.ota.version

    @property
    def bundle(self) -> Bundle:
        return self.ota.current[0]

    @property
    def runtime(self) -> Runtime:
        return self.ota.current[1]

    # ---- what OTA reports ----

    def _event(self, event: str, version: int | None, detail: str) -> None:
        self._queue("event", Event(key=f"{self.config.device}:event:{time.time_ns()}", device=self.config.device,
                                   ts_s=time.time(), event=event, bundle_version=version, detail=detail[:512]))

    def _applied(self, version: int) -> None:
        self.link.bundle_version = version
        self.link.publish_status("online")

    # ---- reporting ----

    def _queue(self, kind: str, message: Message, state: dict[str, str] | None = None) -> None:
        self.link.send(kind, message, state)

    def _samples(self) -> Iterator[tuple[int, np.ndarray, int | None]]:
        if self.config.source is None:
            return
        raws, labels = load_source(self.config.source, self.bundle.manifest.preprocessing)
        keep_selftest_samples(self.state_dir, raws, labels)  # an OTA bundle without test vectors is tested on them
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
                bundle, runtime = self.ota.current  # one pair: an OTA update may replace it between samples
                t0 = time.perf_counter()
                variant = runtime.choose()
                logits = runtime.infer(raw, variant.name)[0]
                latency_s = time.perf_counter() - t0
                k = int(np.argmax(logits))
                labels = bundle.manifest.labels
                result = Result(key=f"{self.config.device}:result:{i}", device=self.config.device, ts_s=time.time(),
                                label=str(labels[k]), class_index=k, variant=variant.name,
                                bundle_version=bundle.manifest.bundle_version, latency_s=latency_s,
                                correct=None if label is None else k == label)
                # telemetry first: the result's put advances the cursor, so a kill between the two would
                # skip the telemetry on restart; the other way a restart re-queues it under the same key,
                # which the outbox and the server keep once
                if (i + 1) % self.config.telemetry_every == 0:
                    self._queue("telemetry", Telemetry(key=f"{self.config.device}:telemetry:{i}", device=self.config.device,
                                                       ts_s=time.time(), metrics={"queued": float(len(self.outbox)),
                                                                                  "latency_s": latency_s}))
                self._queue("result", result, {"cursor": str(i + 1)})
                produced += 1
                if self.config.period_s > 0:
                    self._stopped.wait(self.config.period_s)
                self._check_link()
            while not self._stopped.is_set() and not (self.config.exit_when_done and self.link.drained()):
                self._check_link()
                self._stopped.wait(0.05)
        finally:
            self.link.stop()
            self.outbox.close()
        return produced

    def stop(self) -> None:
        self._stopped.set()

    def _check_link(self) -> None:
        failure = self.link.failure
        if failure is not None:
            if isinstance(failure, TrickleError):
                raise failure
            raise LinkError(f"the link's sender stopped: {type(failure).__name__}: {failure}")


OUTBOX = "outbox.sqlite"
OUTBOX_MARK = "outbox.created"  # beside it: this device has queued messages before


def open_outbox(state_dir: Path, recover: bool = False) -> Outbox:
    """The device's outbox. A damaged one is an error naming the file and the way out
    (``recover``: save it aside, keep what can be read); so is a missing one where this device
    had one (its unsent messages would be lost without a word)."""
    path, mark = state_dir / OUTBOX, state_dir / OUTBOX_MARK
    if recover:
        aside, kept, state = recover_outbox(path)
        log.warning("outbox %s: %s; kept %d messages and %d state values", path,
                    f"the damaged file is saved as {aside}" if aside else "there was none", kept, state)
    elif not path.exists() and mark.exists():
        raise DataError(f"{path}: the outbox is missing, but this device queued messages in it before (see {mark}); "
                        "restore it, or run with --recover-outbox to start a new one (unsent messages are lost; "
                        "samples are reported again from the source's start, and the server keeps each once)")
    outbox = Outbox(path)
    if not mark.exists():
        write_atomic(mark, f"{time.time():.0f}\n")
    return outbox
