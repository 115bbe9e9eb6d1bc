"""Reliability of the edge ↔ server link with real processes: kill -9 the agent, restart the
broker and the server mid-stream — every result arrives, and arrives once."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from server.ports import free_port
from tests.server.conftest import (
    Bundles,
    Mosquitto,
    ServerProc,
    agent_cmd,
    fresh_database,
    needs_mosquitto,
    start_agent,
    wait_for,
)


def _n_samples(bundles: Bundles) -> int:
    with np.load(bundles.source) as data:
        return len(data["x"])


def _assert_exactly_once(server: ServerProc, device: str, n: int) -> None:
    wait_for(lambda: len(server.messages(device, "result")) >= n, 60, f"{n} results")
    keys = [m["key"] for m in server.messages(device, "result")]
    assert sorted(keys) == sorted(f"{device}:result:{i}" for i in range(n))  # none lost, none twice
    telemetry = [m["key"] for m in server.messages(device, "telemetry")]
    assert sorted(telemetry) == sorted(f"{device}:telemetry:{i}" for i in range(9, n, 10))


def _stream(server: ServerProc, device: str, bundles: Bundles, tmp_path: Path, period_s: str,
            first: int) -> tuple[list[str], subprocess.Popen[bytes]]:
    """Start an agent reporting the whole source; returns once the server holds ``first`` results."""
    cmd = agent_cmd(server, device, server.register(device), tmp_path / device, bundles.v1, bundles.source,
                    "--period-s", period_s, "--exit-when-done")
    agent = start_agent(cmd, tmp_path / "agent.log")
    wait_for(lambda: len(server.messages(device, "result")) >= first, 60, "the first results")
    return cmd, agent


def test_kill_9_of_the_agent_mid_stream_loses_and_repeats_nothing(embedded_server: ServerProc, bundles: Bundles,
                                                                    tmp_path: Path) -> None:
    n = _n_samples(bundles)
    cmd, agent = _stream(embedded_server, "n1", bundles, tmp_path, "0.004", 40)
    agent.send_signal(signal.SIGKILL)
    agent.wait(10)
    assert len(embedded_server.messages("n1", "result")) < n  # it really died mid-stream
    # the broker publishes the agent's last will
    wait_for(lambda: [m["state"] for m in embedded_server.messages("n1", "status")] == ["offline", "online"], 30,
             "the last will")  # signed at connect, so it sorts before the online status it follows
    again = start_agent(cmd, tmp_path / "agent.log")
    assert again.wait(120) == 0, (tmp_path / "agent.log").read_text()[-3000:]
    _assert_exactly_once(embedded_server, "n1", n)
    results = embedded_server.messages("n1", "result")
    assert all(m["bundle_version"] == 1 and m["correct"] in (True, False) for m in results)
    assert sum(m["correct"] for m in results) / n > 0.5  # the bundle's answers, not noise


@needs_mosquitto
@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_broker_restart_and_server_kill_9_mid_stream_lose_nothing(mosquitto: Mosquitto, bundles: Bundles,
                                                                  tmp_path: Path, store: str,
                                                                  request: pytest.FixtureRequest) -> None:
    url = fresh_database(request.getfixturevalue("postgres_url"), "kill9") if store == "postgresql" else None
    server = ServerProc(tmp_path / "server", free_port(), mosquitto.url, 0, trust=bundles.pub, store=url)
    server.start()
    try:
        n = _n_samples(bundles)
        _, agent = _stream(server, "n2", bundles, tmp_path, "0.01", 30)
        mosquitto.stop()
        time.sleep(0.3)  # the outage itself: the broker stays down a moment
        mosquitto.start()
        seen = len(server.messages("n2", "result"))
        wait_for(lambda: len(server.messages("n2", "result")) >= seen + 30, 60, "results after the broker restart")
        server.stop(signal.SIGKILL)
        time.sleep(0.3)  # the outage itself
        server.start()
        assert agent.wait(180) == 0, (tmp_path / "agent.log").read_text()[-3000:]
        _assert_exactly_once(server, "n2", n)
    finally:
        server.stop()


def test_graceful_server_restart_with_the_embedded_broker_loses_nothing(embedded_server: ServerProc, bundles: Bundles,
                                                                          tmp_path: Path) -> None:
    _, agent = _stream(embedded_server, "n3", bundles, tmp_path, "0.01", 30)
    embedded_server.stop(signal.SIGTERM)
    time.sleep(0.5)  # the outage itself
    embedded_server.start()
    assert agent.wait(180) == 0, (tmp_path / "agent.log").read_text()[-3000:]
    _assert_exactly_once(embedded_server, "n3", _n_samples(bundles))
