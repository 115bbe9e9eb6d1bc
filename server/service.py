"""One server: store + broker (embedded or external) + bridge + HTTP API, started and stopped together.

    service = Service(ServeConfig(state_dir=Path("runs/server")))
    service.run()                 # blocking, uvicorn in this thread (what `trickle serve` does)
    with service.background():    # or in a thread, for the demo and benchmarks
        ...

Start order: store, broker, bridge (it waits for the broker), HTTP. Stop order is the reverse,
and the bridge stores and acknowledges what it holds before it disconnects.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, Self

import uvicorn
from pydantic import Field, field_validator, model_validator
from tenacity import retry, retry_if_result, stop_after_delay, wait_fixed

from edge.contract.bundle import load_public_key
from edge.contract.protocol import TlsFiles
from edge.core.config import Config
from edge.core.errors import ConfigError, LinkError
from edge.core.files import write_secret
from server.api.app import create_app
from server.api.bundles import notify_assignment, ota_command
from server.api.state import ServerState
from server.jobs.queue import JobSupervisor, signing_key
from server.mqtt.bridge import Bridge, BrokerAddress, Metrics
from server.store.store import StoreError, open_store

log = logging.getLogger("trickle.server")


class ServeConfig(Config):
    """The server (``trickle serve``): where it keeps its state, where it listens, which broker."""

    state_dir: Path = Path("runs/server")
    """SQLite database, uploaded bundles and the tokens live here."""
    store: str | None = Field(None, min_length=1, repr=False)
    """``postgresql://USER[:PASSWORD]@HOST:PORT/DB``: keep devices, messages, bundles and assignments
    in PostgreSQL (migrations applied at start); default: SQLite in state_dir."""
    host: str = Field("127.0.0.1", min_length=1)
    """HTTP address."""
    port: int = Field(8080, ge=1, le=65535)
    """HTTP port."""
    broker: str = "embedded"
    """``embedded`` (amqtt in this process) or ``mqtt://HOST:PORT`` of an external broker
    (``mqtts://HOST:PORT`` over TLS)."""
    broker_ca_file: Path | None = None
    """PEM CA certificates the bridge trusts for an mqtts:// broker (default: the system's)."""
    broker_cert: Path | None = None
    """PEM certificate the bridge shows an mqtts:// broker that asks for one (mutual TLS)."""
    broker_key: Path | None = None
    """The private key of broker_cert."""
    replica: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
    """Run as replica NAME of several ``trickle serve`` processes on one store (PostgreSQL), one
    external broker with shared subscriptions (MQTT v5 ``$share``) and one state folder (tokens,
    bundles): the broker hands each device message to one replica. Default: the only server."""
    mqtt_host: str = Field("127.0.0.1", min_length=1)
    """Where the embedded broker listens."""
    mqtt_port: int = Field(1883, ge=1, le=65535)
    """Port of the embedded broker."""
    trusted_keys: list[Path] = Field(default_factory=list)
    """Ed25519 public keys; with any, only bundles signed by one of them are accepted."""
    admin_token: str | None = Field(None, repr=False)
    """Default: state_dir/admin.token, created on first start."""
    tls_cert: Path | None = None
    """PEM certificate: serve HTTPS (with tls_key)."""
    tls_key: Path | None = None
    """PEM private key of tls_cert."""
    llm: Path | None = None
    """A Hugging Face causal LM folder (save_pretrained): serve it at /v1/completions."""
    llm_draft: Path | None = None
    """A smaller causal LM with the same tokenizer: speculative decoding inside (needs llm)."""
    llm_draft_k: int = Field(4, ge=1, le=32)
    """Draft tokens per target call (the most, with auto decoding or llm_adaptive_k)."""
    llm_decoding: Literal["auto", "chain"] = "auto"
    """auto: each round drafts the K in 0..llm_draft_k (0: plain decoding) of most expected tokens per
    second, from costs measured at load and kept current, and samples coupled (the seed fixes the
    text, draft or no draft); chain: always llm_draft_k. llm_adaptive_k or llm_tree choose those instead."""
    llm_adaptive_k: bool = False
    """Choose each call's draft length from the running acceptance rate (at most llm_draft_k)."""
    llm_tree: str | None = Field(None, pattern=r"^[1-9][0-9]?x[1-9][0-9]?x[1-9][0-9]?$")
    """Tree drafting, DEPTHxBRANCHxWIDTH (e.g. 5x2x3: 5 levels, 2 children per expanded node, 3 nodes
    expanded per level); default: chain drafting."""
    llm_concurrency: int = Field(1, ge=1, le=64)
    """Generations run at once."""
    llm_queue: int = Field(16, ge=0, le=10_000)
    """Requests waiting for a generation slot; beyond, 503."""
    llm_open: bool = False
    """Serve the LLM routes (/v1/completions, /v1/chat/completions, /v1/models) to anyone; by default
    they need an API key (``Authorization: Bearer KEY``: llm_keys, or POST /v1/llm/keys as the admin)
    or the admin token."""
    llm_keys: list[str] = Field(default_factory=list, max_length=100)
    """Names of API keys made at start when missing, each written to STATE_DIR/llm-keys/NAME.key (0600)."""
    workers: int = Field(0, ge=0, le=64)
    """Worker processes the server starts for jobs (POST /v1/jobs); 0: none (run ``trickle worker``)."""
    job_stale_s: float = Field(15.0, ge=2.0, le=86_400.0)
    """A running job whose worker has not beaten its heartbeat for this long is taken as dead."""
    job_attempts: int = Field(2, ge=1, le=100)
    """Runs of a job whose workers die before it is failed."""

    @field_validator("broker")
    @classmethod
    def _broker(cls, value: str) -> str:
        if value != "embedded":
            try:
                BrokerAddress.parse(value)
            except ConfigError:
                raise ConfigError("broker", value, "must be 'embedded', mqtt://HOST:PORT or mqtts://HOST:PORT "
                                  "(PORT in 1..65535)") from None
        return value

    @model_validator(mode="after")
    def _tls(self) -> Self:
        if (self.tls_cert is None) != (self.tls_key is None):
            given, other = ("tls_cert", "tls_key") if self.tls_cert is not None else ("tls_key", "tls_cert")
            raise ConfigError(given, str(self.tls_cert or self.tls_key), f"needs {other} too (HTTPS takes both)")
        return self

    @model_validator(mode="after")
    def _replica(self) -> Self:
        if self.replica is not None and self.broker == "embedded":
            raise ConfigError("replica", self.replica, "needs an external broker that all replicas share "
                              "(--broker mqtt://HOST:PORT, e.g. Mosquitto): the embedded one lives in one process")
        if self.replica is not None and not (self.store or "").startswith("postgresql://"):
            raise ConfigError("replica", self.replica, "needs a store all replicas share (--store postgresql://...); "
                              "SQLite is one process's")
        return self

    @model_validator(mode="after")
    def _draft(self) -> Self:
        if self.llm_draft is not None and self.llm is None:
            raise ConfigError("llm_draft", str(self.llm_draft), "needs llm too (the target it drafts for)")
        return self

    @property
    def broker_url(self) -> str:
        return f"mqtt://{self.mqtt_host}:{self.mqtt_port}" if self.broker == "embedded" else self.broker

    @property
    def url(self) -> str:
        return f"{'https' if self.tls_cert else 'http'}://{self.host}:{self.port}"


def read_or_create_token(path: Path) -> str:
    """A secret kept in a 0600 file, made on first use. Replicas starting together on one state
    folder agree: the file is written under a temporary name and linked into place, which fails
    for all but the first, and each then reads the one that won."""
    if not path.exists():
        made = write_secret(path.with_name(f".{path.name}.{secrets.token_hex(8)}"), secrets.token_urlsafe(32) + "\n")
        try:
            os.link(made, path)
        except FileExistsError:
            pass
        finally:
            made.unlink()
    return path.read_text().strip()


class Service:
    """One server: store, broker, bridge and HTTP API (and job workers), started and stopped together."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        state_dir = config.state_dir
        self.store = open_store(config.store or state_dir / "trickle.sqlite", background_checkpoints=True)
        self.admin_token = config.admin_token or read_or_create_token(state_dir / "admin.token")
        for name in config.llm_keys:
            key_file = state_dir / "llm-keys" / f"{name}.key"
            if not key_file.exists():
                try:
                    write_secret(key_file, self.store.add_llm_key(name) + "\n")
                except StoreError as err:
                    raise ConfigError("llm_keys", name, f"{err}; its key file {key_file} is gone: revoke it "
                                      "(DELETE /v1/llm/keys/NAME) and name another") from None
        self.server_token = read_or_create_token(state_dir / "server.token")
        metrics = Metrics()
        self.bridge = Bridge(self.store, config.broker_url, self.server_token, metrics,
                             tls=TlsFiles(config.broker_ca_file, config.broker_cert, config.broker_key),
                             replica=config.replica, verify_calls=config.replica is None or config.llm is not None)
        self.bridge.on_connected.append(self._announce_assignments)
        llm = None
        if config.llm is not None:
            from server.llm.completions import LlmService

            llm = LlmService.load(config.llm, config.llm_draft, config.llm_concurrency, config.llm_queue,
                                  k=config.llm_draft_k, adaptive=config.llm_adaptive_k, tree=config.llm_tree,
                                  auto=config.llm_decoding == "auto")
        if llm is not None:
            from server.llm.verify import answer

            service = llm
            self.bridge.on_verify = lambda device, request: answer(service.sessions(), device, request)
        self.state = ServerState(self.store, self.admin_token, state_dir / "bundles",
                                 [load_public_key(k) for k in config.trusted_keys], metrics, self.bridge,
                                 config.broker_url, llm, llm_open=config.llm_open)
        self.broker = None
        if config.broker == "embedded":
            from server.mqtt.broker import EmbeddedBroker

            self.broker = EmbeddedBroker(config.mqtt_host, config.mqtt_port, config.store or state_dir / "trickle.sqlite",
                                         self.server_token)
            self.state.on_token_revoked.append(self.broker.disconnect)  # a revoked device's connections closed
        signing_key(state_dir)  # what the server's own bundles (jobs) are signed with
        self.jobs = JobSupervisor(self.store, state_dir, config.store, config.workers, self._announce_job,
                                  stale_s=config.job_stale_s, max_attempts=config.job_attempts)
        if config.workers:
            self.state.workers = self.jobs.alive
        self.app = create_app(self.state, on_start=self._start_link, on_stop=self._stop_link)
        self._uvicorn: uvicorn.Server | None = None

    def _start_link(self) -> None:
        if self.broker is not None:
            self.broker.start()
        self.bridge.start()
        if not self.bridge.connected.wait(10):
            log.warning("the bridge is not connected to %s yet; it keeps trying", self.config.broker_url)
        self.jobs.start()

    def _stop_link(self) -> None:
        self.jobs.stop()
        # devices first, so nothing the broker acknowledged is left between it and the store
        if self.broker is not None:
            self.broker.quiesce()
        self.bridge.wait_idle()
        self.bridge.stop()
        if self.broker is not None:
            self.broker.stop()
        self.store.stop_checkpoints()

    def _announce_assignments(self) -> None:
        """Retain every device's assigned bundle on its ota topic again (the embedded broker
        keeps retained messages only while it runs)."""
        for record in self.store.devices():
            device = self.store.device(record["device"])
            version = self.store.assignment(device) if device else None
            bundle = self.store.bundle(version) if version else None
            if device is not None and bundle is not None:
                command = ota_command(bundle).model_dump_json().encode()
                self.bridge.publish(device.fleet, device.device, "ota", command, retain=True)

    def _announce_job(self, job: dict[str, Any]) -> None:
        """A finished job: push its assignment to the devices (their OTA), refresh the dashboard."""
        result = job["result"] or {}
        if result.get("assigned") and job["bundle_version"]:
            told = notify_assignment(self.state, result["assigned"], int(job["bundle_version"]))
            log.info("job %s: bundle v%s assigned to %s; told %d devices", job["id"], job["bundle_version"],
                     result["assigned"], len(told))
        else:
            self.state.changes += 1

    def _server(self) -> uvicorn.Server:
        c = self.config
        ssl = {"ssl_certfile": str(c.tls_cert), "ssl_keyfile": str(c.tls_key)} if c.tls_cert and c.tls_key else {}
        return uvicorn.Server(uvicorn.Config(self.app, host=c.host, port=c.port, log_level="warning", lifespan="on",
                                             **ssl))  # type: ignore[arg-type]

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM (uvicorn's handlers), then stop in order."""
        self._server().run()

    @contextmanager
    def background(self) -> Iterator[Service]:
        server = self._server()
        thread = threading.Thread(target=server.run, name="trickle-http", daemon=True)
        thread.start()

        @retry(retry=retry_if_result(lambda done: not done), stop=stop_after_delay(30), wait=wait_fixed(0.05),
               retry_error_callback=lambda state: False)
        def started_or_failed() -> bool:
            return bool(server.started) or not thread.is_alive()

        if not (started_or_failed() and server.started):
            server.should_exit = True
            raise LinkError(f"the HTTP server did not start on {self.config.url} (see the log: a port in use?)")
        try:
            yield self
        finally:
            server.should_exit = True
            thread.join(timeout=30)
