"""Revoking a device's token (issue 49): ``POST /v1/devices/{device}/token`` gives it a new one and
revokes the old, ``DELETE`` revokes without a new one. A revoked token stops working everywhere:
HTTP, the embedded broker (new CONNECTs refused, live connections closed), the bridge's signature
check (within its token cache's 2 s), and Mosquitto once its files are written again and reloaded."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import httpx

from edge.contract.protocol import ROUTES, Result, encode, topic
from server.mqtt.bridge import TOKENS_TTL_S
from server.ports import free_port
from server.service import ServeConfig, Service
from server.store.store import open_store
from tests.helpers import MqttPeer
from tests.server.conftest import needs_mosquitto, wait_for


def _result(device: str, key: str, token: str) -> bytes:
    return encode(Result(key=key, device=device, ts_s=1.0, label="0", class_index=0, variant="int8",
                         bundle_version=1, latency_s=0.001), token)


def test_a_revoked_token_stops_working_over_http_mqtt_and_the_bridge(tmp_path: Path) -> None:
    config = ServeConfig(state_dir=tmp_path, port=free_port(), mqtt_port=free_port())
    peers: list[MqttPeer] = []

    def peer(token: str) -> MqttPeer:
        peers.append(MqttPeer(config.mqtt_port, "dev-a", token, "dev-a"))
        return peers[-1]

    with Service(config).background() as service, httpx.Client(base_url=config.url, timeout=10) as http:
        admin = {"Authorization": f"Bearer {(tmp_path / 'admin.token').read_text().strip()}"}
        token = {name: http.post(ROUTES["devices"], json={"device": name, "fleet": "f"}, headers=admin).json()["token"]
                 for name in ("dev-a", "dev-b")}
        results = ROUTES["messages"].format(device="dev-a", kind="result")

        def stored() -> set[str]:
            return {m["key"] for m in http.get(results, params={"limit": 1000}, headers=admin).json()}

        def bearer(value: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {value}"}

        def publish(via: MqttPeer, key: str, signed_with: str) -> None:
            via.c.publish(topic("f", "dev-a", "result"), _result("dev-a", key, signed_with), qos=1).wait_for_publish(10)

        def signature_rejections() -> float:
            return service.state.metrics.registry.get_sample_value("trickle_messages_rejected_total",
                                                                   {"reason": "signature"}) or 0.0

        try:
            live = peer(token["dev-a"])
            assert live.accepted
            publish(live, "before", token["dev-a"])  # the bridge now holds dev-a's token
            wait_for(lambda: "before" in stored(), 10, "the message before the rotation")
            route = ROUTES["device_token"]
            assert http.post(route.format(device="dev-a"), headers=bearer(token["dev-a"])).status_code == 403
            assert http.post(route.format(device="dev-a"), headers=bearer(token["dev-b"])).status_code == 403
            assert http.delete(route.format(device="dev-a"), headers=bearer(token["dev-a"])).status_code == 403
            for method in ("POST", "DELETE"):
                r = http.request(method, route.format(device="nobody"), headers=admin)
                assert r.status_code == 404 and "'nobody' is not registered" in r.json()["detail"]
            changes = service.state.changes

            r = http.post(route.format(device="dev-a"), headers=admin)
            rotated_at = time.monotonic()
            assert r.status_code == 200 and r.json()["device"] == "dev-a" and r.json()["fleet"] == "f"
            new = r.json()["token"]
            assert service.state.changes > changes
            assert http.get(results, headers=bearer(token["dev-a"])).status_code == 401
            assert http.get(results, headers=bearer(new)).status_code == 200
            wait_for(lambda: not live.c.is_connected(), 5, "the embedded broker closing dev-a's live connection")
            assert not peer(token["dev-a"]).accepted  # CONNECT with the old token
            fresh = peer(new)
            assert fresh.accepted

            # logged in with the new token, signing with the old: refused once the bridge's cache expires
            rejected = signature_rejections()
            attempts = itertools.count()
            wait_for(lambda: publish(fresh, f"old-{next(attempts)}", token["dev-a"]) or signature_rejections() > rejected,
                     TOKENS_TTL_S + 3, "the bridge refusing the old token's signature")
            assert time.monotonic() - rotated_at < TOKENS_TTL_S + 2
            publish(fresh, "late", token["dev-a"])
            publish(fresh, "after", new)
            wait_for(lambda: "after" in stored(), 10, "the message signed with the new token")
            assert "late" not in stored() and signature_rejections() >= rejected + 2

            # revoked without a new token: nothing works until the admin rotates again
            assert http.delete(route.format(device="dev-a"), headers=admin).status_code == 204
            assert http.get(results, headers=bearer(new)).status_code == 401
            wait_for(lambda: not fresh.c.is_connected(), 5, "the embedded broker closing the revoked device's connection")
            assert not peer(new).accepted
            assert [d["revoked"] for d in http.get(ROUTES["devices"], headers=admin).json()] == [True, False]
            newest = http.post(route.format(device="dev-a"), headers=admin).json()["token"]
            assert http.get(results, headers=bearer(newest)).status_code == 200 and peer(newest).accepted
            theirs = ROUTES["messages"].format(device="dev-b", kind="result")
            assert http.get(theirs, headers=bearer(token["dev-b"])).status_code == 200  # the other device untouched
        finally:
            for p in peers:
                p.close()


@needs_mosquitto
def test_mosquitto_drops_a_revoked_device_once_its_files_are_written_again(tmp_path: Path) -> None:
    """What the route's documentation tells the admin behind Mosquitto: rewrite the files, SIGHUP.
    Mosquitto 2 then refuses the old password and closes the device's live connection."""
    from server.mqtt.mosquitto import Mosquitto, write_mosquitto_config

    store = open_store(tmp_path / "db.sqlite")
    old = store.add_device("node-a", "lab")
    write_mosquitto_config(store, "server-token", tmp_path / "mosquitto")
    broker = Mosquitto(tmp_path / "mosquitto").start()
    peers: list[MqttPeer] = []
    try:
        live = MqttPeer(broker.port, "node-a", old.token, "node-a")
        peers.append(live)
        assert live.accepted
        new = store.rotate_token("node-a")
        assert new is not None
        write_mosquitto_config(store, "server-token", tmp_path / "mosquitto")
        broker.reload()
        wait_for(lambda: not live.c.is_connected(), 5, "Mosquitto closing the connection made with the old token")
        peers += [MqttPeer(broker.port, "node-a", old.token, "node-a"), MqttPeer(broker.port, "node-a", new.token, "node-a")]
        assert not peers[1].accepted and peers[2].accepted
    finally:
        for p in peers:
            p.close()
        broker.stop()
        store.close()
