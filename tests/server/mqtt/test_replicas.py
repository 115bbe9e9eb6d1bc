"""Several ``trickle serve`` replicas on one PostgreSQL, one Mosquitto and one state folder: the
broker hands each device message to one replica (MQTT v5 shared subscriptions), the HTTP API
answers the same from either, and kill -9 of a replica or of the broker loses and repeats nothing."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from edge.contract.protocol import Result, encode, topic
from server.mqtt.mosquitto import Mosquitto
from server.ports import free_port
from server.store.store import open_store
from tests.helpers import MqttPeer
from tests.server.conftest import Bundles, ServerProc, agent_cmd, fresh_database, needs_mosquitto, start_agent, wait_for

pytestmark = [needs_mosquitto, pytest.mark.slow]


@dataclass
class Cluster:
    state: Path
    store: str
    broker: Mosquitto
    replicas: dict[str, ServerProc]

    def write_broker_files(self) -> None:
        """The password file and ACL from the registry, every replica named; the broker told."""
        cmd = [sys.executable, "-m", "trickle", "serve", "--state-dir", str(self.state), "--store", self.store,
               "--write-mosquitto-config", str(self.broker.folder)]
        for name in ("a", "b"):
            cmd += ["--replica", name]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        self.broker.reload()


def _stored_by(replica: ServerProc) -> int:
    """Messages this replica stored (new keys), from its /metrics."""
    found = re.search(r"^trickle_messages_stored_total (\S+)$", replica.metrics(), re.M)
    return int(float(found.group(1))) if found else 0


def _duplicates_seen(replica: ServerProc) -> int:
    found = re.search(r"^trickle_messages_duplicate_total (\S+)$", replica.metrics(), re.M)
    return int(float(found.group(1))) if found else 0


@contextmanager
def running_cluster(tmp_path: Path, postgres_url: str, trust: Path | None, *flags: str) -> Iterator[Cluster]:
    """Replicas a and b (``trickle serve --replica``, with ``flags``) on a fresh PostgreSQL database,
    a Mosquitto with the configuration the server writes, one state folder."""
    url = fresh_database(postgres_url, "replicas")
    state = tmp_path / "server"
    store = open_store(url)  # the schema, so the broker files can be written before any replica runs
    store.close()
    folder = tmp_path / "mosquitto"
    folder.mkdir()
    c = Cluster(state, url, Mosquitto(folder), {})
    c.write_broker_files()
    c.broker.start()
    try:
        for name in ("a", "b"):
            c.replicas[name] = ServerProc(state, free_port(), c.broker.url, 0, trust=trust, store=url,
                                          extra=["--replica", name, *flags])
            c.replicas[name].start()
        yield c
    finally:
        for replica in c.replicas.values():
            replica.stop()
        c.broker.stop()


@pytest.fixture
def cluster(tmp_path: Path, bundles: Bundles, postgres_url: str) -> Iterator[Cluster]:
    with running_cluster(tmp_path, postgres_url, bundles.pub) as c:
        yield c


def _result(device: str, i: int, token: str) -> bytes:
    return encode(Result(key=f"{device}:result:{i}", device=device, ts_s=float(i), label="0", class_index=0,
                         variant="int8", bundle_version=1, latency_s=0.001), token)


def test_two_replicas_take_one_share_each_and_serve_one_api(cluster: Cluster, bundles: Bundles) -> None:
    a, b = cluster.replicas["a"], cluster.replicas["b"]
    # registered through one replica, known to the other
    tokens = {name: a.register(name).read_text() for name in ("d1", "d2")}
    assert {d["device"] for d in httpx.get(b.url + "/v1/devices", headers=b.admin).json()} == {"d1", "d2"}
    cluster.write_broker_files()
    peers = [MqttPeer(cluster.broker.port, name, token, name) for name, token in tokens.items()]
    try:
        assert all(p.accepted for p in peers)
        n = 300
        for i in range(n):
            for peer, (name, token) in zip(peers, tokens.items(), strict=True):
                peer.c.publish(topic("f", name, "result"), _result(name, i, token), qos=1)
        for name in tokens:
            wait_for(lambda name=name: len(b.messages(name, "result")) >= n, 60, f"{name}'s results")
            keys = sorted(m["key"] for m in a.messages(name, "result"))
            assert keys == sorted(f"{name}:result:{i}" for i in range(n))
        # each message went to one replica: both took a share, none was stored or seen twice
        shares = (_stored_by(a), _stored_by(b))
        assert sum(shares) == 2 * n and min(shares) > 0, shares
        assert _duplicates_seen(a) + _duplicates_seen(b) == 0
    finally:
        for peer in peers:
            peer.c.disconnect()
            peer.c.loop_stop()
    # a bundle uploaded to one replica is assigned through the other and downloaded from either
    up = httpx.post(a.url + "/v1/bundles", content=bundles.v1.read_bytes(), headers=a.admin, timeout=60)
    assert up.status_code == 201, up.text
    version = up.json()["version"]
    assign = httpx.post(b.url + "/v1/assignments", json={"target": "fleet:f", "bundle_version": version}, headers=b.admin)
    assert assign.status_code == 200, assign.text
    assert httpx.get(a.url + "/v1/assignments", headers=a.admin).json() == {"fleet:f": version}
    device = {"Authorization": f"Bearer {tokens['d1']}"}
    got = httpx.get(f"{b.url}/v1/bundles/{version}", headers=device, timeout=60)
    assert got.status_code == 200 and got.content == bundles.v1.read_bytes()


def _n_samples(bundles: Bundles) -> int:
    with np.load(bundles.source) as data:
        return len(data["x"])


def _keys(replica: ServerProc, device: str) -> set[str]:
    return {m["key"] for m in replica.messages(device, "result")}


def test_kill_9_of_a_replica_and_of_the_broker_while_devices_publish_loses_and_repeats_nothing(
        cluster: Cluster, bundles: Bundles, tmp_path: Path) -> None:
    """Replica a hangs (SIGSTOP) while the broker keeps handing it its share, then dies (kill -9):
    what it held is gone from the broker (clean session), and the devices publish it again while
    replica b keeps acknowledging their newer messages — not only once the fleet falls silent."""
    a, b = cluster.replicas["a"], cluster.replicas["b"]
    devices = ("k1", "k2", "k3")
    tokens = {name: b.register(name) for name in devices}
    cluster.write_broker_files()
    n = _n_samples(bundles)
    period = max(0.01, 20.0 / n)  # a stream of about 20 s
    agents = [start_agent(agent_cmd(b, name, tokens[name], tmp_path / name, bundles.v1, bundles.source, "--period-s",
                                    f"{period:.4f}", "--exit-when-done", "--set", "resend_s=1.0"), tmp_path / f"{name}.log")
              for name in devices]
    try:
        wait_for(lambda: all(len(_keys(b, d)) >= 20 for d in devices), 90, "the first results")
        wait_for(lambda: _stored_by(a) > 0, 30, "replica a's share")
        assert a.proc is not None
        a.proc.send_signal(signal.SIGSTOP)  # hung: the broker still hands it every other message
        time.sleep(1.5)
        a.stop(signal.SIGKILL)
        # every message of the stream so far is stored within a few resend intervals, while it goes on
        published = {d: max(int(k.rsplit(":", 1)[1]) for k in _keys(b, d)) for d in devices}
        wait_for(lambda: all({f"{d}:result:{i}" for i in range(published[d])} <= _keys(b, d) for d in devices), 8,
                 "what replica a held, published again")
        assert all(agent.poll() is None for agent in agents), "the stream ended before the check: make it longer"
        assert cluster.broker.proc is not None
        cluster.broker.proc.kill()  # and the broker too: kill -9, nothing persisted
        cluster.broker.proc.wait(10)
        time.sleep(0.3)  # the outage itself
        cluster.broker.start()  # on the same port: the replicas and the agents reconnect to it
        for i, agent in enumerate(agents):
            assert agent.wait(240) == 0, (tmp_path / f"{devices[i]}.log").read_text()[-3000:]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    for d in devices:
        results = b.messages(d, "result")
        assert sorted(m["key"] for m in results) == sorted(f"{d}:result:{i}" for i in range(n))  # none lost, none twice
