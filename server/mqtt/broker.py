"""The embedded MQTT broker (amqtt, in-process, in its own thread and event loop).

It authenticates against the server's device registry and enforces each device's topics
(``edge.contract.protocol.device_topics``) with two amqtt plugins, so a device can neither publish as
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
from amqtt.errors import AMQTTError, MQTTError, NoDataError
from amqtt.mqtt.connack import NOT_AUTHORIZED, ConnackPacket
from amqtt.mqtt.protocol.broker_handler import BrokerProtocolHandler
from amqtt.plugins.base import BaseAuthPlugin, BaseTopicPlugin
from amqtt.session import Session
from amqtt.utils import gen_client_id

from edge.contract.protocol import device_topics
from server.mqtt.bridge import SERVER_USER
from server.store.store import Device, open_store, token_sha256

log = logging.getLogger("trickle.server.broker")


def client_id_allowed(user: str, client_id: str) -> bool:
    """A device's MQTT client id is its name, or its name, a dot and a suffix of its own (a second
    session of the same device, e.g. ``trickle edge generate`` beside the agent). Names have no
    dot, so no device can present another's client id, nor the bridge's."""
    return client_id == user or (client_id.startswith(user + ".") and len(client_id) <= len(user) + 33)


class DeviceAuth(BaseAuthPlugin):
    """Username = device id, password = its token, client id = the device id (``client_id_allowed``);
    the bridge logs in as ``trickle-server`` with the server's own token and client id."""

    @dataclass
    class Config:
        db_path: str = ""
        server_token_sha256: str = ""

    def __init__(self, context: BaseContext) -> None:
        super().__init__(context)
        self._store = open_store(self.config.db_path)  # the server's store: an SQLite path or a PostgreSQL URL

    async def authenticate(self, *, session: Session) -> bool | None:
        user, password, client_id = session.username or "", session.password or "", session.client_id or ""
        if user == SERVER_USER or client_id == SERVER_USER:
            ok = user == client_id == SERVER_USER and hmac.compare_digest(token_sha256(password),
                                                                          self.config.server_token_sha256)
            if not ok:
                log.warning("broker refused a connection as %r with client id %r (the bridge's identity)", user, client_id)
            return ok
        device = self._store.device(user)
        ok = device is not None and hmac.compare_digest(password.encode(), device.token.encode())
        if not ok:
            log.warning("broker refused a connection as %r (unknown device or bad token)", user)
        elif not client_id_allowed(user, client_id):
            log.warning("broker refused device %r connecting with client id %r (a device's client id is its name)",
                        user, client_id)
            ok = False
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


class _IdentityBroker(Broker):
    """amqtt 0.12.1 (pinned) looks a CONNECT's client id up in its sessions, deletes the stored one
    (clean session) or takes it over, and only then authenticates: anyone naming the bridge's client
    id took its session and its subscriptions. Here the CONNECT is authenticated first, on a session
    of its own; a refused one gets CONNACK 5 (not authorized) and touches no stored session."""

    async def _initialize_client_session(self, reader: Any, writer: Any, remote_address: str,
                                         remote_port: int) -> tuple[BrokerProtocolHandler, Session]:
        try:
            handler, incoming = await BrokerProtocolHandler.init_from_connect(reader, writer, self.plugins_manager)
        except (AMQTTError, MQTTError, NoDataError) as exc:
            await writer.close()
            raise AMQTTError(exc) from exc
        if not await self._authenticate(incoming, None):
            await ConnackPacket.build(0, NOT_AUTHORIZED).to_stream(writer)
            await writer.close()
            raise MQTTError(f"refused {remote_address}:{remote_port} (user {incoming.username!r}, "
                            f"client id {incoming.client_id!r})")
        # from here on as amqtt does it, for an authenticated identity
        if incoming.clean_session:
            if incoming.client_id:
                await self._delete_session(incoming.client_id)
            else:
                incoming.client_id = gen_client_id()
            incoming.parent = 0
            session = incoming
        elif incoming.client_id in self._sessions:
            session, _ = self._sessions[incoming.client_id]
            for name in ("will_flag", "will_message", "will_topic", "will_qos", "keep_alive", "username", "password"):
                setattr(session, name, getattr(incoming, name))
            session.parent = 1
        else:
            incoming.parent = 0
            session = incoming
        delay = self.config.get("timeout-disconnect-delay", 0)
        if session.keep_alive > 0 and isinstance(delay, int):
            session.keep_alive += delay
        return handler, session


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
            self._broker = _IdentityBroker(self._config, loop=self._loop)
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
