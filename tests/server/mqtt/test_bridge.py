"""The bridge's commit: a locked disk is tried again, bounded and logged; a bug surfaces at once. Its
shutdown: a bridge being stopped says nothing of a lost broker."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest
from tenacity import stop_after_attempt

from server.mqtt.bridge import Bridge
from server.mqtt.broker import EmbeddedBroker
from server.ports import free_port
from server.store.store import Incoming, Store


class FlakyStore(Store):
    def __init__(self, path: Path, failures: list[BaseException]) -> None:
        super().__init__(path)
        self.failures = failures
        self.calls = 0

    def add_messages(self, batch: list[Incoming]) -> int:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return super().add_messages(batch)


def _batch(n: int) -> list[tuple[list[Incoming], int, int]]:
    return [([Incoming(f"d:telemetry:{i}", "d", "telemetry", 1.0, 1.0, "{}")], i + 1, 1) for i in range(n)]


def test_a_locked_database_is_tried_again_then_stored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = FlakyStore(tmp_path / "db.sqlite", [sqlite3.OperationalError("database is locked")] * 2)
    bridge = Bridge(store, "mqtt://127.0.0.1:1", "token")
    bridge._commit(_batch(3))
    assert store.calls == 3 and len(store.messages("d", "telemetry")) == 3
    assert "Retrying" in caplog.text  # each retry is logged


def test_retries_are_bounded_and_leave_the_batch_unacknowledged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    store = FlakyStore(tmp_path / "db.sqlite", [OSError("disk full")] * 1000)
    bridge = Bridge(store, "mqtt://127.0.0.1:1", "token")
    monkeypatch.setattr(Bridge._store.retry, "stop", stop_after_attempt(3))  # type: ignore[attr-defined]  # not 30 s
    acked: list[int] = []
    reconnects: list[bool] = []
    monkeypatch.setattr(bridge._client, "ack", lambda mid, qos: acked.append(mid))
    monkeypatch.setattr(bridge._client, "reconnect", lambda: reconnects.append(True))
    bridge._commit(_batch(2))
    assert store.calls == 3 and acked == [] and not bridge._unacked
    assert reconnects == [True]  # the persistent session makes the broker deliver the batch again
    assert "reconnecting so the broker delivers them again" in caplog.text


def test_a_programming_error_is_not_retried(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "db.sqlite", [TypeError("a bug")])
    bridge = Bridge(store, "mqtt://127.0.0.1:1", "token")
    with pytest.raises(TypeError, match="a bug"):
        bridge._commit(_batch(1))
    assert store.calls == 1


def test_a_bug_in_the_writer_stops_it_and_shows_at_healthz(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "db.sqlite", [TypeError("a bug")])
    bridge = Bridge(store, "mqtt://127.0.0.1:1", "token")
    for item in _batch(1):
        bridge._queue.put(item)
    bridge._write_loop()  # returns instead of spinning
    assert bridge.failure == "TypeError: a bug" and store.calls == 1


@pytest.mark.needs_broker
def test_a_bridge_being_stopped_is_quiet(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # `trickle demo` ended with "bridge lost the broker ... (Normal disconnection); reconnecting": the
    # bridge's own disconnect, as it stopped, read as the broker going away
    port = free_port()
    broker = EmbeddedBroker("127.0.0.1", port, tmp_path / "db.sqlite", "token")
    broker.start()
    try:
        bridge = Bridge(Store(tmp_path / "db.sqlite"), f"mqtt://127.0.0.1:{port}", "token")
        bridge.start()
        assert bridge.connected.wait(10)
        with caplog.at_level(logging.INFO, logger="trickle.server.bridge"):
            bridge.stop()
    finally:
        broker.stop()
    lines = [r for r in caplog.records if r.name == "trickle.server.bridge"]
    assert [r.getMessage() for r in lines] == [f"bridge disconnected from 127.0.0.1:{port} (stopping)"]
