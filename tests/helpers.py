"""Helpers the test modules share (fixtures live in the conftest.py files)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

# a child process's limit, under pytest-timeout's 300 s: a stuck child fails its own test, with
# its output, instead of the whole run being stopped
SUBPROCESS_TIMEOUT_S = 240


def trickle(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m trickle ARGS`` in a fresh process, its output captured."""
    return subprocess.run([sys.executable, "-m", "trickle", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=SUBPROCESS_TIMEOUT_S)


class MqttPeer:
    """A paho client for broker tests, with the client id chosen: it records its CONNACK reason codes
    and what it receives, and ``subscribe`` returns once the broker's SUBACK came back (so nothing
    published afterwards can be missed, and no test sleeps for it)."""

    def __init__(self, port: int, user: str, password: str, client_id: str | None = None, clean: bool = True) -> None:
        import threading

        import paho.mqtt.client as mqtt

        self.received: list[tuple[str, bytes]] = []
        self.connack: list[int] = []
        self.connected = threading.Event()
        self._subacks: set[int] = set()
        client_id = client_id or f"t-{user}-{id(self):x}"
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean)
        self.c.username_pw_set(user, password)
        self.c.on_connect = self._on_connect
        self.c.on_message = lambda c, u, m: self.received.append((m.topic, bytes(m.payload)))
        self.c.on_subscribe = lambda c, u, mid, reasons, p: self._subacks.add(mid)
        self.c.reconnect_delay_set(30, 60)  # a refused peer does not come back during the test
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        if not self.connected.wait(10):
            raise AssertionError(f"no CONNACK for {client_id} within 10 s")

    def _on_connect(self, c: object, u: object, flags: object, reason: Any, props: object) -> None:
        self.connack.append(int(getattr(reason, "value", reason)))
        self.connected.set()

    @property
    def reason(self) -> int:
        """The last CONNACK's reason code (0: accepted)."""
        return self.connack[-1]

    @property
    def accepted(self) -> bool:
        return self.reason == 0

    def subscribe(self, topic: str, qos: int = 1, timeout_s: float = 10.0) -> None:
        import time

        _, mid = self.c.subscribe(topic, qos=qos)
        deadline = time.monotonic() + timeout_s
        while mid not in self._subacks:
            if time.monotonic() > deadline:
                raise AssertionError(f"no SUBACK for {topic} within {timeout_s:g} s")
            time.sleep(0.01)

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()
