"""A fleet server one bad device or one bad file cannot break (issue 28's probes, each a test):
identity end to end (client ids, stored keys), no code from data, bounded bodies and archives,
a readiness check that tells the truth, rejected messages logged without a flood."""

from __future__ import annotations

import gzip
import io
import os
import socket
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import httpx
import paho.mqtt.client as mqtt
import psutil
import pytest

from edge.contract.protocol import Ack, Result, Telemetry, encode, topic
from server.mqtt.bridge import SERVER_USER
from server.ports import free_port, port_open
from tests.helpers import MqttPeer
from tests.server.conftest import ServerProc, needs_mosquitto, wait_for


def _result(device: str, key: str, token: str) -> bytes:
    return encode(Result(key=key, device=device, ts_s=1.0, label="0", class_index=0, variant="int8",
                         bundle_version=1, latency_s=0.001), token)


def _publish_results(peer: MqttPeer, fleet: str, device: str, token: str, keys: list[str]) -> None:
    for key in keys:
        peer.c.publish(topic(fleet, device, "result"), _result(device, key, token), qos=1).wait_for_publish(10)


def test_no_device_can_take_the_bridge_s_or_another_device_s_client_id(embedded_server: ServerProc) -> None:
    """Embedded broker: a registered device naming the bridge's client id (or another device's)
    is refused, and the fleet keeps being stored; nothing of another device reaches it."""
    server = embedded_server
    tokens = {name: server.register(name).read_text() for name in ("dev-a", "dev-b", "attacker")}
    port = server.mqtt_port
    b = MqttPeer(port, "dev-b", tokens["dev-b"], "dev-b")
    peers = [b]
    try:
        assert b.accepted
        for client_id, clean in ((SERVER_USER, False), (SERVER_USER, True), ("dev-b", True), ("dev-a", True)):
            intruder = MqttPeer(port, "attacker", tokens["attacker"], client_id, clean)
            peers.append(intruder)
            assert not intruder.accepted, f"the broker let 'attacker' in as client id {client_id!r}"
            intruder.close()
        watch = MqttPeer(port, "attacker", tokens["attacker"], "attacker")  # as itself: fine, but only its own topics
        peers.append(watch)
        assert watch.accepted
        watch.subscribe(topic("f", "dev-b", "result"))
        watch.subscribe(topic("f", "dev-b", "ack"))
        _publish_results(b, "f", "dev-b", tokens["dev-b"], [f"dev-b:result:{i}" for i in range(20)])
        wait_for(lambda: len(server.messages("dev-b", "result")) == 20, 20, "dev-b's results stored")
        assert b.c.is_connected(), "dev-b was kicked off by a client naming its id"
        assert watch.received == []
        ready = httpx.get(server.url + "/readyz", timeout=5)
        assert ready.status_code == 200 and ready.json()["broker"] is True
    finally:
        for p in peers:
            p.close()


def test_a_device_cannot_shadow_or_acknowledge_another_device_s_messages(embedded_server: ServerProc) -> None:
    """Keys belong to their device: 'squatter' publishing keys victim:result:0..9 on its own topic
    (signed with its own token) stores its own 10; the victim's 10 are stored too, and acknowledged
    to the victim only when stored."""
    server = embedded_server
    t_squat, t_victim = server.register("squatter").read_text(), server.register("victim").read_text()
    keys = [f"victim:result:{i}" for i in range(10)]
    squatter = MqttPeer(server.mqtt_port, "squatter", t_squat, "squatter")
    victim = MqttPeer(server.mqtt_port, "victim", t_victim, "victim")
    try:
        victim.subscribe(topic("f", "victim", "ack"))
        _publish_results(squatter, "f", "squatter", t_squat, keys)
        wait_for(lambda: len(server.messages("squatter", "result")) == 10, 20, "the squatter's results")
        assert victim.received == []  # nothing acknowledged to the victim for keys it never sent
        _publish_results(victim, "f", "victim", t_victim, keys)
        wait_for(lambda: len(server.messages("victim", "result")) == 10, 20, "the victim's own results")
        acked = wait_for(lambda: {k for _, payload in victim.received for k in Ack.model_validate_json(payload).keys}
                         >= set(keys), 20, "the victim's acks")
        assert acked
        assert [m["device"] for m in server.messages("victim", "result")] == ["victim"] * 10
    finally:
        squatter.close()
        victim.close()


def test_stored_messages_are_keyed_by_device_and_old_rows_carry_over(tmp_path: Path) -> None:
    """Migration 6 on a database of the schema before it: rows kept, keys now per device."""
    import sqlite3

    from server.store.store import MIGRATIONS, Incoming, Store

    path = tmp_path / "old.sqlite"
    store = Store(path)
    with sqlite3.connect(path) as db:  # back to schema 5: the global key
        db.execute("DELETE FROM schema_migrations WHERE version = 6")
        db.execute("DROP TABLE messages")
        db.execute("CREATE TABLE messages (key TEXT PRIMARY KEY, device TEXT NOT NULL, kind TEXT NOT NULL, ts_s DOUBLE "
                   "PRECISION NOT NULL, received_s DOUBLE PRECISION NOT NULL, stored_s DOUBLE PRECISION NOT NULL, body TEXT "
                   "NOT NULL, correct INTEGER, bundle_version BIGINT, state TEXT)")
        db.execute("INSERT INTO messages VALUES ('a:result:0', 'a', 'result', 1, 1, 1, '{\"x\": 1}', 1, 1, NULL)")
        db.execute("DROP INDEX IF EXISTS devices_by_token")
    store.close()
    store = Store(path)
    assert store.schema_version() == MIGRATIONS[-1][0]
    assert store.messages("a", "result") == [{"x": 1}]
    same_key = [Incoming("a:result:0", device, "result", 2.0, 2.0, '{"y": 2}') for device in ("a", "b")]
    assert store.add_messages(same_key) == 1  # a's is a repeat; b's is b's own
    assert store.messages("b", "result") == [{"y": 2}]


def _evil_checkpoint(path: Path, marker: Path) -> Path:
    """A torch file that runs a shell command when unpickled with weights_only=False."""
    import torch

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    torch.save({"version": 1, "state_dict": {}, "arch": Payload()}, path)
    return path


def test_no_file_becomes_code_and_no_path_is_a_teacher(embedded_server: ServerProc, tmp_path: Path) -> None:
    server = embedded_server
    marker = tmp_path / "pwned"
    evil = _evil_checkpoint(tmp_path / "evil.pt", marker)
    r = httpx.post(server.url + "/v1/checkpoints", content=evil.read_bytes(), headers=server.admin, timeout=60)
    assert r.status_code == 400 and "weights only" in r.text
    assert not marker.exists()
    assert not list((server.data / "checkpoints").glob("*.pt"))  # nothing kept
    admin_token = (server.data / "admin.token").read_text().strip()
    for path in (str(evil), "/etc/passwd", str(server.data / "admin.token"), "/proc/self/environ", "../admin.token"):
        refused = httpx.post(server.url + "/v1/jobs", json={"kind": "distill", "teacher": path}, headers=server.admin)
        assert refused.status_code == 422, path
        assert admin_token not in refused.text and "root:" not in refused.text
    for dataset in ("/etc/passwd", "../admin.token", "a/b"):
        spec = {"kind": "distill", "teacher": "job:1", "dataset": dataset}
        assert httpx.post(server.url + "/v1/jobs", json=spec, headers=server.admin).status_code == 422


@pytest.mark.needs_torch
def test_a_job_whose_checkpoint_asks_for_code_fails_without_running_it_or_quoting_it(tmp_path: Path) -> None:
    """Even a file planted in the server's checkpoint folder is loaded as weights only: the job
    fails with one line that quotes nothing of the file."""
    import hashlib

    from server.jobs.queue import Worker
    from server.store.store import open_store

    state = tmp_path / "server"
    marker = tmp_path / "pwned"
    folder = state / "checkpoints"
    folder.mkdir(parents=True)
    evil = _evil_checkpoint(tmp_path / "evil.pt", marker)
    digest = hashlib.sha256(evil.read_bytes()).hexdigest()
    evil.replace(folder / f"{digest}.pt")
    store = open_store(state / "trickle.sqlite")
    job_id = store.add_job("distill", f'{{"kind": "distill", "teacher": "checkpoint:{digest}", "formats": ["onnx"]}}')
    assert Worker(store, state).run_one()
    job = store.job(job_id)
    assert job is not None and job["state"] == "failed"
    assert "not a checkpoint that loads as weights only" in job["error"] and "touch" not in job["error"]
    assert not marker.exists()


def _server_rss_mb(server: ServerProc) -> float:
    assert server.proc is not None
    return float(psutil.Process(server.proc.pid).memory_info().rss) / 2**20


def _send_raw(port: int, head: bytes, body_mb: int, chunk: bytes = b"\0" * (1 << 20)) -> bytes:
    """Send a request head and up to ``body_mb`` MB of body; what the server answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        try:
            for _ in range(body_mb):
                s.sendall(chunk)
        except OSError:  # the server answered and closed: it reads no more
            pass
        s.settimeout(10)
        try:
            return s.recv(4096)
        except OSError:
            return b""


@pytest.mark.parametrize("token", ["none", "admin-chunked"])
def test_a_300_mb_body_costs_the_server_no_memory(embedded_server: ServerProc, token: str) -> None:
    server = embedded_server
    before = _server_rss_mb(server)
    auth = "" if token == "none" else f"Authorization: Bearer {(server.data / 'admin.token').read_text().strip()}\r\n"
    if token == "none":
        head = f"POST /v1/bundles HTTP/1.1\r\nHost: x\r\nContent-Length: {300 << 20}\r\n\r\n".encode()
        reply = _send_raw(server.port, head, 300)
        assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    else:  # no Content-Length: the cap is counted as the bytes arrive (chunked encoding)
        head = f"POST /v1/bundles HTTP/1.1\r\nHost: x\r\n{auth}Transfer-Encoding: chunked\r\n\r\n".encode()
        chunk = b"100000\r\n" + b"\0" * (1 << 20) + b"\r\n"
        reply = _send_raw(server.port, head, 300, chunk)
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    growth = _server_rss_mb(server) - before
    assert growth < 50, f"the server grew by {growth:.0f} MB"
    assert not [p for p in (server.data / "bundles").glob("*") if p.is_file()] if (server.data / "bundles").exists() else True


def test_oversized_and_invalid_bodies_get_short_answers(embedded_server: ServerProc) -> None:
    url, admin = embedded_server.url, embedded_server.admin
    big = httpx.post(url + "/v1/devices", content=b"x" * (1 << 20), headers={**admin, "Content-Type": "application/json"})
    assert big.status_code == 413 and len(big.content) < 4096
    invalid = httpx.post(url + "/v1/devices", json={"device": "y" * 60_000}, headers=admin)
    assert invalid.status_code == 422 and len(invalid.content) < 4096, len(invalid.content)
    assert "device" in invalid.text
    many = httpx.post(url + "/v1/devices", json={f"k{i}": "v" * 500 for i in range(100)}, headers=admin)
    assert many.status_code == 422 and len(many.content) < 4096
    unauth = httpx.post(url + "/v1/devices", json={"device": "z"})
    assert unauth.status_code == 401


def test_a_bundle_bomb_upload_is_refused_in_bounded_memory(embedded_server: ServerProc, tmp_path: Path) -> None:
    server = embedded_server
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w|") as tar:
        info = tarfile.TarInfo("model.onnx")
        info.size = 100 << 20

        class Zeros:
            left = info.size

            def read(self, n: int = -1) -> bytes:
                n = self.left if n < 0 else min(n, self.left)
                self.left -= n
                return bytes(n)

        tar.addfile(info, Zeros())  # type: ignore[arg-type]
    before = _server_rss_mb(server)
    r = httpx.post(server.url + "/v1/bundles", content=buf.getvalue(), headers=server.admin, timeout=60)
    assert r.status_code == 400 and "compressed more than 100:1" in r.text
    assert _server_rss_mb(server) - before < 50
    link = io.BytesIO()
    with tarfile.open(fileobj=link, mode="w") as tar:
        info = tarfile.TarInfo("manifest.json")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    r = httpx.post(server.url + "/v1/bundles", content=link.getvalue(), headers=server.admin, timeout=60)
    assert r.status_code == 400 and "regular files only" in r.text


@needs_mosquitto
@pytest.mark.needs_broker
def test_readyz_follows_the_broker_and_rejections_are_summarised(tmp_path: Path) -> None:
    """Kill Mosquitto: /readyz says so within 5 s and recovers after a restart; a flood of
    rejected messages is counted exactly and logged as a few summary lines."""
    port = free_port()
    folder = tmp_path / "mosquitto"
    folder.mkdir()
    conf = folder / "m.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n")

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: port_open(port), 10, "mosquitto")
        return proc

    broker = start()
    server = ServerProc(tmp_path / "server", free_port(), f"mqtt://127.0.0.1:{port}", 0)
    server.start()
    try:
        assert httpx.get(server.url + "/readyz").status_code == 200
        token = server.register("flood").read_text()
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="flood")
        client.connect("127.0.0.1", port)
        client.loop_start()
        forged = encode(Telemetry(key="k", device="flood", ts_s=1.0), token + "x")
        for _ in range(2000):
            client.publish(topic("f", "flood", "telemetry"), forged, qos=0)
        client.publish(topic("f", "flood", "telemetry"), forged, qos=1).wait_for_publish(10)
        wait_for(lambda: 'trickle_messages_rejected_total{reason="signature"} 2001.0' in server.metrics(), 30,
                 "every forged message counted")
        client.loop_stop()
        time.sleep(11)  # one summary interval: the flood's tail is told
        lines = [line for line in server.log.read_text().splitlines() if "rejected" in line]
        assert 1 <= len(lines) <= 5, lines
        assert any("more messages" in line and "signature" in line for line in lines), lines

        broker.kill()
        broker.wait()
        t0 = time.monotonic()
        wait_for(lambda: httpx.get(server.url + "/readyz").status_code == 503, 5, "/readyz to see the broker gone")
        assert time.monotonic() - t0 <= 5
        down = httpx.get(server.url + "/readyz").json()
        assert down["broker"] is False and down["store"] is True
        assert httpx.get(server.url + "/healthz").json()["broker_connected"] is False
        broker = start()
        wait_for(lambda: httpx.get(server.url + "/readyz").status_code == 200, 15, "/readyz after the broker is back")
    finally:
        server.stop()
        broker.kill()
        broker.wait()


@pytest.mark.needs_broker
@pytest.mark.needs_postgres
def test_readyz_follows_the_database(tmp_path: Path) -> None:
    """PostgreSQL stopped: /readyz is 503 naming the store within 5 s, and 200 again once it is back."""
    from server.store.pgtemp import available, temporary_postgres

    if not available():
        pytest.skip("apt-get install postgresql")
    with temporary_postgres() as url:
        server = ServerProc(tmp_path / "server", free_port(), "embedded", free_port(), store=url)
        server.start()
        try:
            assert httpx.get(server.url + "/readyz").status_code == 200
            cluster = _pg_cluster(url)
            subprocess.run(["runuser", "-u", "postgres", "--", cluster[0], "-D", cluster[1], "-m", "immediate", "stop"],
                           check=True, capture_output=True)
            t0 = time.monotonic()
            wait_for(lambda: httpx.get(server.url + "/readyz", timeout=5).status_code == 503, 5,
                     "/readyz to see the store gone")
            assert time.monotonic() - t0 <= 5
            assert httpx.get(server.url + "/readyz").json()["store"] is False
            # restart on a stopped cluster starts it with the options it last ran with (postmaster.opts)
            subprocess.run(["runuser", "-u", "postgres", "--", cluster[0], "-D", cluster[1], "-w", "-l",
                            str(Path(cluster[1]) / "restart.log"), "restart"], capture_output=True, timeout=60)
            wait_for(lambda: httpx.get(server.url + "/readyz", timeout=5).status_code == 200, 20,
                     "/readyz after the store is back")
        finally:
            server.stop()


def _pg_cluster(url: str) -> tuple[str, str]:
    """pg_ctl and the data folder of the throwaway cluster serving ``url`` (server.store.pgtemp)."""
    import glob

    import psycopg

    with psycopg.connect(url) as db:
        data = db.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
    return sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))[-1], str(data)


def test_dashboard_aggregates_do_not_hold_up_device_routes(embedded_server: ServerProc) -> None:
    """Ten viewers polling the fleet snapshot at once: a device's own routes still answer quickly."""
    server = embedded_server
    token = server.register("busy").read_text()
    device = {"Authorization": f"Bearer {token}"}
    stop = threading.Event()

    def view() -> None:
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                c.get(server.url + "/v1/dashboard/fleet", headers=server.admin)

    viewers = [threading.Thread(target=view) for _ in range(10)]
    for t in viewers:
        t.start()
    try:
        times = []
        with httpx.Client(timeout=30) as c:
            for _ in range(40):
                t0 = time.perf_counter()
                assert c.get(server.url + "/v1/devices/busy/result", headers=device).status_code == 200
                times.append(time.perf_counter() - t0)
        times.sort()
        assert times[int(0.95 * len(times))] < 0.5, times[-5:]
    finally:
        stop.set()
        for t in viewers:
            t.join()

