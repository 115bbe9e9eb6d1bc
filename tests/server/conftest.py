"""Real processes on loopback: `trickle serve`, `trickle edge run`, Mosquitto; signed bundles."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import numpy as np
import pytest
from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_delay, wait_fixed

from server.ports import free_port
from tests.conftest import TrainedBundle

T = TypeVar("T")
needs_mosquitto = pytest.mark.skipif(shutil.which("mosquitto") is None,
                                     reason="apt-get install mosquitto mosquitto-clients")


def wait_for(condition: Callable[[], T], timeout_s: float = 30.0, what: str = "condition") -> T:
    """``condition()``'s first truthy value, polled every 50 ms for up to ``timeout_s``."""

    def timed_out(state: RetryCallState) -> T:
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")

    poll = Retrying(retry=retry_if_result(lambda value: not value), stop=stop_after_delay(timeout_s), wait=wait_fixed(0.05),
                    retry_error_callback=timed_out)
    return poll(condition)


@dataclass
class Bundles:
    key: Path
    pub: Path
    v1: Path
    v2: Path
    broken_v3: Path  # signed and well-formed, but its model answers garbage: the self-test must catch it
    broken_v4_old: Path  # the same without test vectors (as exported before them): caught on the stored samples
    source: Path  # .npz of raw digits samples and labels


@pytest.fixture(scope="session")
def bundles(tmp_path_factory: pytest.TempPathFactory, trained_bundle: TrainedBundle) -> Bundles:
    import onnx
    from onnx import numpy_helper

    from edge.contract.bundle import generate_keypair, load_private_key, pack, read_bundle, write_bundle
    from export.bundle import export_bundle

    root = tmp_path_factory.mktemp("link-bundles")
    trained = trained_bundle("digits", "nexume", epochs=3)
    data = trained.data
    generate_keypair(root / "k.key", root / "k.pub")
    ckpt = trained.checkpoint
    v1 = export_bundle(ckpt, root / "v1.tar", formats=("onnx",), key=root / "k.key", as_tar=True, bundle_version=1)
    v2 = export_bundle(ckpt, root / "v2.tar", formats=("onnx",), key=root / "k.key", as_tar=True, bundle_version=2)
    good = read_bundle(v2)
    models = {f for v in good.manifest.variants for f in v.formats.values()}
    files = dict(good.files)  # the test vectors stay: the broken models must fail against them
    for name in models:
        model = onnx.load_from_string(files[name])
        for init in model.graph.initializer:  # zero every weight: constant logits
            init.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(init)), init.name))
        files[name] = model.SerializeToString()
    manifest = good.manifest.model_copy(update={"bundle_version": 3})
    broken = write_bundle(pack(manifest, files, load_private_key(root / "k.key")), root / "v3-broken.tar")
    assert good.manifest.test_vectors is not None
    old_manifest = manifest.model_copy(update={"bundle_version": 4, "test_vectors": None})
    old_files = {name: blob for name, blob in files.items() if name != good.manifest.test_vectors.file}
    broken_old = write_bundle(pack(old_manifest, old_files, load_private_key(root / "k.key")), root / "v4-broken-old.tar")
    assert data.raw_test is not None
    np.savez(root / "source.npz", x=data.raw_test, y=data.y_test)
    return Bundles(root / "k.key", root / "k.pub", v1, v2, broken, broken_old, root / "source.npz")


@dataclass
class ServerProc:
    data: Path
    port: int
    broker: str  # "embedded" or mqtt://
    mqtt_port: int
    trust: Path | None = None
    store: str | None = None  # --store URL (PostgreSQL); default SQLite in data
    extra: list[str] = field(default_factory=list)  # more flags of trickle serve
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.data / "serve.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def broker_url(self) -> str:
        return f"mqtt://127.0.0.1:{self.mqtt_port}" if self.broker == "embedded" else self.broker

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {(self.data / 'admin.token').read_text().strip()}"}

    def start(self) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "trickle.cli", "serve", "--state-dir", str(self.data), "--port", str(self.port),
               "--broker", self.broker] + (["--mqtt-port", str(self.mqtt_port)] if self.broker == "embedded" else [])
        cmd += ["--trust", str(self.trust)] if self.trust else []
        cmd += ["--store", self.store] if self.store else []
        cmd += self.extra
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

        def healthy() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                return httpx.get(self.url + "/healthz", timeout=1).json()["broker_connected"]
            except httpx.HTTPError:
                return False

        wait_for(healthy, 60, "the server")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)
        self.proc = None

    def register(self, device: str, fleet: str = "f") -> Path:
        r = httpx.post(self.url + "/v1/devices", json={"device": device, "fleet": fleet}, headers=self.admin)
        r.raise_for_status()
        path = self.data / f"{device}.token"
        path.write_text(r.json()["token"])
        return path

    def messages(self, device: str, kind: str) -> list[dict]:
        r = httpx.get(f"{self.url}/v1/devices/{device}/{kind}", params={"limit": 100000}, headers=self.admin, timeout=10)
        r.raise_for_status()
        return r.json()

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics").text


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A throwaway PostgreSQL cluster for the session (server.store.pgtemp)."""
    from server.store.pgtemp import available, temporary_postgres

    if not available():
        pytest.skip("apt-get install postgresql")
    with temporary_postgres() as url:
        yield url


def fresh_database(url: str, name: str) -> str:
    """The URL of a new, empty database ``name`` on the cluster at ``url``."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture
def embedded_server(tmp_path: Path, bundles: Bundles) -> Iterator[ServerProc]:
    server = ServerProc(tmp_path / "server", free_port(), "embedded", free_port(), trust=bundles.pub)
    server.start()
    yield server
    server.stop()


@dataclass
class Mosquitto:
    port: int
    folder: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> None:
        conf = self.folder / "mosquitto.conf"
        conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
                        f"persistence_location {self.folder}/\nautosave_interval 1\nmax_inflight_messages 1000\n"
                        "max_queued_messages 1000000\n")
        self.proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import socket

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        wait_for(listening, 10, "mosquitto")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: it saves its persistence file on the way out
            self.proc.wait(10)


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    broker = Mosquitto(free_port(), tmp_path / "mosquitto")
    broker.folder.mkdir()
    broker.start()
    yield broker
    broker.stop()


def agent_cmd(server: ServerProc, device: str, token: Path, state: Path, bundle: Path, source: Path | None,
              *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "trickle.cli", "edge", "run", "--device-id", device, "--fleet", "f", "--token-file",
           str(token), "--server", server.url, "--broker", server.broker_url, "--bundle", str(bundle), "--state-dir", str(state)]
    return cmd + (["--source", str(source)] if source else []) + list(extra)


def start_agent(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
