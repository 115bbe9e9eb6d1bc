"""The embedded MQTT broker (amqtt, in-process, in its own thread and event loop).

It authenticates against the server's device registry and enforces each device's topics
(``edge.protocol.device_topics``) with two amqtt plugins, so a device can neither publish as
another device nor read another device's commands. The bridge checks every message again
regardless (signatures), which is what protects the server behind an external broker whose
ACL it does not control.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amqtt.broker import Broker
from amqtt.contexts import Action, BaseContext
from amqtt.plugins.base import BaseAuthPlugin, BaseTopicPlugin
from amqtt.session import Session

from edge.protocol import device_topics
from server.bridge import SERVER_USER
from server.store import Device, open_store, token_sha256

log = logging.getLogger("trickle.server.broker")


class DeviceAuth(BaseAuthPlugin):
    """Username = device id, password = its token; the bridge logs in as ``trickle-server``."""

    @dataclass
    class Config:
        db_path: str = ""
        server_token_sha256: str = ""

    def __init__(self, context: BaseContext) -> None:
        super().__init__(context)
        self._store = open_store(self.config.db_path)  # the server's store: an SQLite path or a PostgreSQL URL

    async def authenticate(self, *, session: Session) -> bool | None:
        user, password = session.username or "", session.password or ""
        if user == SERVER_USER:
            return token_sha256(password) == self.config.server_token_sha256
        device = self._store.device(user)
        ok = device is not None and hmac.compare_digest(password.encode(), device.token.encode())
        if not ok:
            log.warning("broker refused a connection as %r (unknown device or bad token)", user)
        return ok


class DeviceTopics(BaseTopicPlugin):
    """A device publishes only under its own topics and subscribes only to its own ota/cmd."""

    @dataclass
    class Config:
        db_path: str = ""

    def __init__(self, context: BaseContext) -> None:
        super().__init__(context)
        self._store = open_store(self.config.db_path)  # the server's store: an SQLite path or a PostgreSQL URL
        self._devices: dict[str, Device] = {}  # registrations never change, so they can be cached

    async def topic_filtering(self, *, session: Session | None = None, topic: str | None = None,
                              action: Action | None = None) -> bool | None:
        user = session.username if session else None
        if user == SERVER_USER or action == Action.RECEIVE:
            return True  # receiving is checked once, when the device subscribes
        device = self._devices.get(user or "") or self._store.device(user or "")
        if device is not None:
            self._devices[device.device] = device
        if device is None or topic is None:
            return False
        allowed = device_topics(device.fleet, device.device)
        ok = topic in (allowed["publish"] if action == Action.PUBLISH else allowed["subscribe"])
        if not ok:
            log.warning("broker refused %s on %s by %s", action, topic, user)
        return ok


class _Snapshots(dict[str, list[Any]]):
    """A dict whose items() is a snapshot (lists copied), safe to walk across awaits."""

    def items(self) -> Any:
        return [(key, list(value)) for key, value in super().items()]


class EmbeddedBroker:
    """amqtt on HOST:PORT in a background thread."""

    def __init__(self, host: str, port: int, db_path: Path | str, server_token: str) -> None:
        plugins = {
            f"{__name__}.DeviceAuth": {"db_path": str(db_path), "server_token_sha256": token_sha256(server_token)},
            f"{__name__}.DeviceTopics": {"db_path": str(db_path)},
        }
        self._config: dict[str, Any] = {"listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
                                        "plugins": plugins}
        self._loop = asyncio.new_event_loop()
        self._broker: Broker | None = None
        self._thread = threading.Thread(target=self._run, name="trickle-broker", daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._broker = Broker(self._config, loop=self._loop)
            # amqtt 0.12 walks its subscription table across awaits while broadcasting; a client
            # subscribing meanwhile made it raise and drop that (already acknowledged) message.
            self._broker._subscriptions = _Snapshots(self._broker._subscriptions)
            self._loop.run_until_complete(self._broker.start())
        except BaseException as err:  # reported to start()'s caller
            self._error = err
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise RuntimeError(f"embedded broker did not start: {self._error}") from self._error

    def quiesce(self, timeout_s: float = 5.0) -> None:
        """Stop taking messages from devices before a shutdown: close the listener, end every
        device's session (their unacknowledged messages stay in their outboxes), and wait until
        what the broker already acknowledged has been handed on to the bridge's session.
        Uses amqtt internals (``_servers``, ``_sessions``, ``_broadcast_queue``) of the pinned version."""
        broker = self._broker
        if broker is None or not self._loop.is_running():
            return

        async def run() -> None:
            for server in getattr(broker, "_servers", {}).values():
                if getattr(server, "instance", None) is not None:
                    server.instance.close()
            for client_id in list(getattr(broker, "_sessions", {})):
                if client_id != SERVER_USER:
                    await broker._cleanup_session(client_id)
            queue = getattr(broker, "_broadcast_queue", None)
            deadline = self._loop.time() + timeout_s
            while queue is not None and not queue.empty() and self._loop.time() < deadline:
                await asyncio.sleep(0.01)

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=timeout_s + 5)

    def stop(self) -> None:
        if self._broker is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._broker.shutdown(), self._loop).result(timeout=15)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=15)
