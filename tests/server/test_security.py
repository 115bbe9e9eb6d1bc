"""What a device or a client may not do is refused, logged and counted, and the server keeps serving;
OTA takes a newer signed bundle, rolls back a bad one and refuses a downgrade."""

from __future__ import annotations

import io
import json
import re
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import httpx
import paho.mqtt.client as mqtt
import pytest

from edge.contract.protocol import MAX_PAYLOAD_BYTES, Result, Telemetry, encode, topic
from server.ports import free_port
from tests.server.conftest import Bundles, Mosquitto, ServerProc, agent_cmd, needs_mosquitto, start_agent, wait_for


def _client(url: str, user: str | None = None, password: str | None = None) -> mqtt.Client:
    host, port = url.removeprefix("mqtt://").split(":")
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=user or f"anon-{time.time_ns()}")
    if user is not None:
        client.username_pw_set(user, password)
    client.connect(host, int(port))
    client.loop_start()
    return client


def _telemetry(device: str, key: str, token: str) -> bytes:
    return encode(Telemetry(key=key, device=device, ts_s=1.0, voltage_v=2.5), token)


def _rejected(server: ServerProc) -> dict[str, float]:
    pattern = r'trickle_messages_rejected_total\{reason="(\w+)"\} ([0-9.]+)'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, server.metrics())}


@needs_mosquitto
def test_the_bridge_refuses_foreign_forged_malformed_oversized_and_wrong_schema_messages(
        mosquitto: Mosquitto, bundles: Bundles, tmp_path: Path) -> None:
    server = ServerProc(tmp_path / "server", free_port(), mosquitto.url, 0)
    server.start()
    try:
        t1, t2 = server.register("d1").read_text(), server.register("d2").read_text()
        client = _client(mosquitto.url)  # Mosquitto here has no ACL: the bridge must hold the line alone
        sends = [
            (topic("f", "d2", "telemetry"), _telemetry("d1", "k1", t1)),  # d1's message under d2's topic
            (topic("f", "d2", "telemetry"), _telemetry("d2", "k2", t1)),  # d2's name, d1's key
            (topic("f", "d1", "telemetry"), b"{not json"),
            (topic("f", "d1", "telemetry"), b" " * (MAX_PAYLOAD_BYTES + 1)),
            (topic("f", "d1", "telemetry"), json.dumps({"v": 1, "key": "k3", "device": "d1", "ts_s": "soon"}).encode()),
            (topic("g", "d1", "telemetry"), _telemetry("d1", "k4", t1)),  # the wrong fleet
            (topic("f", "d1", "telemetry"), _telemetry("d1", "good", t1)),
        ]
        for name, payload in sends:
            client.publish(name, payload, qos=1).wait_for_publish(5)
        wait_for(lambda: server.messages("d1", "telemetry"), 10, "the valid message")
        assert [m["key"] for m in server.messages("d1", "telemetry")] == ["good"]
        assert server.messages("d2", "telemetry") == []
        wait_for(lambda: sum(_rejected(server).values()) >= 6, 10, "six rejections")
        assert _rejected(server) == {"foreign_topic": 1.0, "signature": 1.0, "malformed": 1.0, "oversized": 1.0,
                                     "schema": 1.0, "unknown_device": 1.0}
        log = server.log.read_text()
        assert "published under 'd2'" in log and "bad signature from 'd2'" in log
        assert httpx.get(server.url + "/healthz").json()["status"] == "ok"
        # d2 is registered in fleet f, so its two refused messages were counted as foreign_topic and
        # signature above, not as unknown_device (that one is the wrong-fleet message)
        listed = httpx.get(server.url + "/v1/devices", headers=server.admin).json()
        assert {d["device"]: d["fleet"] for d in listed} == {"d1": "f", "d2": "f"}
        assert t2 != t1
        client.loop_stop()
    finally:
        server.stop()


def test_the_embedded_broker_refuses_bad_credentials_and_foreign_topics(embedded_server: ServerProc) -> None:
    t1 = embedded_server.register("e1").read_text()
    embedded_server.register("e2")
    refused: list[mqtt.ReasonCode] = []
    bad = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="intruder")
    bad.username_pw_set("e1", "not-the-token")
    bad.on_connect = lambda c, u, f, reason, p: refused.append(reason)
    bad.connect("127.0.0.1", embedded_server.mqtt_port)
    bad.loop_start()
    wait_for(lambda: refused, 10, "the CONNACK")
    assert refused[0].is_failure
    bad.loop_stop()

    client = _client(embedded_server.broker_url, "e1", t1)
    client.publish(topic("f", "e2", "telemetry"), _telemetry("e1", "x1", t1), qos=1).wait_for_publish(5)
    client.publish(topic("f", "e1", "telemetry"), _telemetry("e1", "x2", t1), qos=1).wait_for_publish(5)
    wait_for(lambda: embedded_server.messages("e1", "telemetry"), 10, "the valid message")
    assert embedded_server.messages("e2", "telemetry") == []
    assert "broker refused" in embedded_server.log.read_text()
    client.loop_stop()


def test_http_tokens_and_roles(embedded_server: ServerProc) -> None:
    url = embedded_server.url
    t1 = embedded_server.register("h1").read_text()
    embedded_server.register("h2")
    assert httpx.get(url + "/v1/devices").status_code == 401
    assert httpx.get(url + "/v1/devices", headers={"Authorization": "Bearer nope"}).status_code == 401
    device = {"Authorization": f"Bearer {t1}"}
    assert httpx.get(url + "/v1/devices", headers=device).status_code == 403
    assert httpx.get(url + "/v1/devices/h2/result", headers=device).status_code == 403
    assert httpx.get(url + "/v1/devices/h1/result", headers=device).json() == []
    again = httpx.post(url + "/v1/devices", json={"device": "h1"}, headers=embedded_server.admin)
    assert again.status_code == 409 and "already registered" in again.json()["detail"]
    assert httpx.post(url + "/v1/devices", json={"device": "bad/name"}, headers=embedded_server.admin).status_code == 422


def _tampered(path: Path, out: Path) -> Path:
    """The same tar with one byte of a model file flipped."""
    with tarfile.open(path) as src, tarfile.open(out, "w") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            if member.name.endswith(".onnx"):
                data = data[:100] + bytes([data[100] ^ 1]) + data[101:]
            dst.addfile(member, io.BytesIO(data))
    return out


def test_bundle_uploads_are_verified(embedded_server: ServerProc, bundles: Bundles, tmp_path: Path) -> None:
    url, admin = embedded_server.url, embedded_server.admin
    bad = httpx.post(url + "/v1/bundles", content=_tampered(bundles.v1, tmp_path / "t.tar").read_bytes(), headers=admin)
    assert bad.status_code == 400 and "sha256" in bad.json()["detail"]
    unsigned = tmp_path / "unsigned.tar"
    with tarfile.open(bundles.v1) as src, tarfile.open(unsigned, "w") as dst:
        for member in src.getmembers():
            if member.name != "manifest.sig":
                dst.addfile(member, src.extractfile(member))
    refused = httpx.post(url + "/v1/bundles", content=unsigned.read_bytes(), headers=admin)
    assert refused.status_code == 400 and "signature" in refused.json()["detail"]
    assert httpx.post(url + "/v1/bundles", content=b"not a tar", headers=admin).status_code == 400
    ok = httpx.post(url + "/v1/bundles", content=bundles.v1.read_bytes(), headers=admin)
    assert ok.status_code == 201 and ok.json()["version"] == 1
    assert httpx.post(url + "/v1/bundles", content=bundles.v1.read_bytes(), headers=admin).status_code == 409
    assert httpx.get(url + "/healthz").json()["status"] == "ok"


def _events(server: ServerProc, device: str) -> list[str]:
    return [m["event"] for m in server.messages(device, "event")]


def test_ota_applies_a_newer_bundle_rolls_back_a_bad_one_and_refuses_a_downgrade(
        embedded_server: ServerProc, bundles: Bundles, tmp_path: Path) -> None:
    url, admin = embedded_server.url, embedded_server.admin
    token = embedded_server.register("o1")
    state = tmp_path / "o1"
    cmd = agent_cmd(embedded_server, "o1", token, state, bundles.v1, bundles.source, "--count", "40",
                    "--trust", str(bundles.pub))
    agent = start_agent(cmd, tmp_path / "agent.log")
    try:
        wait_for(lambda: len(embedded_server.messages("o1", "result")) == 40, 60, "the first results")
        for b in (bundles.v1, bundles.v2, bundles.broken_v3, bundles.broken_v4_old):
            assert httpx.post(url + "/v1/bundles", content=b.read_bytes(), headers=admin).status_code == 201

        def assign(version: int) -> None:
            r = httpx.post(url + "/v1/assignments", json={"target": "device:o1", "bundle_version": version}, headers=admin)
            assert r.status_code == 200 and r.json()["notified"] == ["o1"], r.text

        assign(2)
        wait_for(lambda: "ota_applied" in _events(embedded_server, "o1"), 60, "ota_applied")
        assert json.loads((state / "current.json").read_text())["path"] == "bundles/v2.tar"
        assign(3)  # signed and intact, but its model is broken: the self-test must catch it
        wait_for(lambda: "ota_rolled_back" in _events(embedded_server, "o1"), 60, "ota_rolled_back")
        assert json.loads((state / "current.json").read_text())["path"] == "bundles/v2.tar"
        rolled = next(m for m in embedded_server.messages("o1", "event") if m["event"] == "ota_rolled_back")
        assert "self-test failed" in rolled["detail"] and rolled["bundle_version"] == 3
        assert "test vectors" in rolled["detail"]  # judged on the vectors the bundle carries
        assign(4)  # broken too, and without test vectors (an older export): judged on the stored samples
        wait_for(lambda: _events(embedded_server, "o1").count("ota_rolled_back") == 2, 60, "the second ota_rolled_back")
        rolled = [m for m in embedded_server.messages("o1", "event") if m["event"] == "ota_rolled_back"][-1]
        assert rolled["bundle_version"] == 4 and "on the stored vectors" in rolled["detail"], rolled["detail"]
        assert json.loads((state / "current.json").read_text())["path"] == "bundles/v2.tar"
        assign(1)  # a downgrade
        wait_for(lambda: "ota_rejected" in _events(embedded_server, "o1"), 60, "ota_rejected")
        rejected = next(m for m in embedded_server.messages("o1", "event") if m["event"] == "ota_rejected")
        assert "older" in rejected["detail"]
        statuses = embedded_server.messages("o1", "status")
        assert statuses[-1]["state"] == "online" and statuses[-1]["bundle_version"] == 2
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
    wait_for(lambda: embedded_server.messages("o1", "status")[-1]["state"] == "offline", 10, "the offline status")


@needs_mosquitto
@pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="apt-get install mosquitto-clients")
def test_mosquitto_clients_see_and_send_valid_messages(mosquitto: Mosquitto, bundles: Bundles, tmp_path: Path) -> None:
    server = ServerProc(tmp_path / "server", free_port(), mosquitto.url, 0)
    server.start()
    try:
        token = server.register("m1").read_text()
        sub = subprocess.Popen(["stdbuf", "-oL", "mosquitto_sub", "-d", "-h", "127.0.0.1", "-p", str(mosquitto.port),
                                "-t", "trickle/v1/f/m1/result", "-C", "1", "-W", "20"], stdout=subprocess.PIPE, text=True)
        assert sub.stdout is not None
        for line in sub.stdout:  # -d: the client's log, line-buffered; its SUBACK before anything is published
            if "SUBACK" in line:
                break
        payload = encode(Result(key="m1:result:0", device="m1", ts_s=5.0, label="7", class_index=7, variant="fp32-d00",
                                bundle_version=1, latency_s=0.001, correct=True), token)
        subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(mosquitto.port), "-q", "1",
                        "-t", topic("f", "m1", "result"), "-m", payload.decode()], check=True, timeout=10)
        sub.wait(timeout=30)
        seen = sub.stdout.read()  # through the same buffered reader the loop above read from
        payload_line = next((line for line in seen.splitlines() if line.startswith("{")), seen)
        assert json.loads(payload_line)["key"] == "m1:result:0"  # a plain MQTT client reads the protocol
        wait_for(lambda: server.messages("m1", "result"), 10, "the stored result")
        assert server.messages("m1", "result")[0]["label"] == "7"
    finally:
        server.stop()
