"""trickle serve --write-mosquitto-config: with its password file and ACL, a real Mosquitto lets each
device publish only to its own topics and read only the server's topics for it, refuses a wrong
password, and lets the server's bridge in."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from edge.contract.protocol import topic
from server.mqtt.bridge import SERVER_USER
from server.ports import free_port, port_open
from server.service import read_or_create_token
from server.store.store import open_store
from tests.helpers import MqttPeer
from tests.server.conftest import ServerProc, needs_mosquitto, wait_for


@needs_mosquitto
def test_devices_are_confined_to_their_own_topics(tmp_path: Path) -> None:
    state = tmp_path / "server"
    store = open_store(state / "trickle.sqlite")
    a, b = store.add_device("node-a", "lab"), store.add_device("node-b", "lab")
    store.close()
    out = tmp_path / "mosquitto"
    proc = subprocess.run([sys.executable, "-m", "trickle", "serve", "--state-dir", str(state),
                           "--write-mosquitto-config", str(out), "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "user node-a\ntopic write trickle/v1/lab/node-a/telemetry" in (out / "acl").read_text()
    assert (out / "passwords").stat().st_mode & 0o077 == 0
    port = free_port()
    conf = tmp_path / "broker.conf"
    # as root, Mosquitto drops to its own user, which may not read a 0600 file in a private folder
    run_as = "user root\n" if os.geteuid() == 0 else ""
    conf.write_text(f"listener {port} 127.0.0.1\n{run_as}" + (out / "mosquitto.conf").read_text())
    broker = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    clients: list[MqttPeer] = []
    try:
        server_token = read_or_create_token(state / "server.token")
        wait_for(lambda: port_open(port), 10, "mosquitto")
        watcher = MqttPeer(port, SERVER_USER, server_token, SERVER_USER)  # the bridge's identity
        node_a, node_b = MqttPeer(port, "node-a", a.token, "node-a"), MqttPeer(port, "node-b", b.token, "node-b")
        intruder = MqttPeer(port, "node-a", "not-the-token")
        clients += [watcher, node_a, node_b, intruder]
        for c in clients:
            assert c.connected.wait(10)
        assert watcher.reason == 0 and node_a.reason == 0 and intruder.reason != 0  # a wrong password is refused
        watcher.subscribe("trickle/v1/#")
        node_a.subscribe(topic("lab", "node-b", "ota"))  # another device's commands: not granted (a SUBACK all the same)
        node_b.subscribe(topic("lab", "node-b", "ota"))
        node_a.c.publish(topic("lab", "node-b", "telemetry"), b"forged", qos=1).wait_for_publish(10)
        node_a.c.publish(topic("lab", "node-a", "telemetry"), b"own", qos=1).wait_for_publish(10)
        watcher.c.publish(topic("lab", "node-b", "ota"), b"for-b", qos=1).wait_for_publish(10)
        wait_for(lambda: (topic("lab", "node-a", "telemetry"), b"own") in watcher.received, 10, "node-a's own message")
        wait_for(lambda: (topic("lab", "node-b", "ota"), b"for-b") in node_b.received, 10, "node-b's command")
        assert all(payload != b"forged" for _, payload in watcher.received)
        assert node_a.received == []

        # a device naming the bridge's client id, or another device's, takes nobody's session:
        # Mosquitto makes its client id its user name (use_username_as_clientid)
        thieves = [MqttPeer(port, "node-a", a.token, SERVER_USER), MqttPeer(port, "node-a", a.token, "node-b")]
        clients += thieves
        for thief in thieves:
            assert thief.connected.wait(10)
        time.sleep(0.5)  # what must not happen (a takeover) is given time to happen
        assert watcher.c.is_connected() and node_b.c.is_connected()
        node_b.c.publish(topic("lab", "node-b", "telemetry"), b"still-here", qos=1).wait_for_publish(10)
        wait_for(lambda: (topic("lab", "node-b", "telemetry"), b"still-here") in watcher.received, 10,
                 "the bridge's session still receiving")
        assert all(not t.received for t in thieves)
    finally:
        for c in clients:
            c.close()
        broker.terminate()
        broker.wait(10)

    # the server's bridge gets in with its own credentials
    port2 = free_port()
    conf.write_text(f"listener {port2} 127.0.0.1\n{run_as}" + (out / "mosquitto.conf").read_text())
    broker = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: port_open(port2), 10, "mosquitto")
    server = ServerProc(state, free_port(), f"mqtt://127.0.0.1:{port2}", 0)
    try:
        server.start()  # waits until /healthz says the broker is connected
        assert httpx.get(server.url + "/healthz").json()["broker_connected"] is True
    finally:
        server.stop()
        broker.terminate()
        broker.wait(10)


def test_the_password_lines_are_mosquitto_s_format() -> None:
    from server.mqtt.mosquitto import password_line

    line = password_line("u", "p", salt=bytes(12))
    user, rest = line.split(":", 1)
    assert user == "u" and rest.startswith("$7$101$AAAAAAAAAAAAAAAA$") and len(rest.split("$")[-1]) == 88

