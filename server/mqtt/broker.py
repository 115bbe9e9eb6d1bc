"""The embedded MQTT broker (amqtt, in-process, in its own thread and event loop).

It authenticates against the server's device registry and enforces each device's topics
(``edge.contract.protocol.device_topics``) with two amqtt plugins, so a device can neither publish as
another device nor read another device's commands. The bridge checks every message again
regardless (signatures), which is what protects the server behind an external broker whose
ACL it does not control.

It also bounds what one client may cost it (``server.mqtt.limits``, the same limits the Mosquitto
configuration carries): every connection's bytes pass through ``_GuardedReader``, which reads each
packet's fixed header before its body and closes the connection on one over ``MAX_PACKET_BYTES``
(a CONNECT too, before any login) and, once a device is logged in, slows it to its packet and byte
rates by not reading its socket; a CONNECT must arrive within ``CONNECT_TIMEOUT_S``; what a device
publishes retained is delivered but not kept; a device's queue while it is away and its QoS 2
messages awaiting release are bounded. The bridge's session is exempt from every per-device limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from amqtt.adapters import ReaderAdapter, StreamReaderAdapter, StreamWriterAdapter
from amqtt.broker import Broker
from amqtt.contexts import Action, BaseContext
from amqtt.errors import AMQTTError, MQTTError, NoDataError
from amqtt.mqtt.connack import NOT_AUTHORIZED, ConnackPacket
from amqtt.mqtt.packet import CONNECT, PUBLISH
from amqtt.mqtt.protocol.broker_handler import BrokerProtocolHandler
from amqtt.plugins.base import BaseAuthPlugin, BaseTopicPlugin
from amqtt.session import Session
from amqtt.utils import gen_client_id

from edge.contract.protocol import device_topics
from server.mqtt.bridge import SERVER_USER
from server.mqtt.limits import (
    CONNECT_TIMEOUT_S,
    DEVICE_BYTE_BURST,
    DEVICE_BYTES_PER_S,
    DEVICE_PACKET_BURST,
    DEVICE_PACKETS_PER_S,
    DEVICE_QOS2_IN_FLIGHT,
    DEVICE_QUEUED_MESSAGES,
    MAX_PACKET_BYTES,
)
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
        # a device's name and fleet never change, so they can be cached (only they are read: a rotated or
        # revoked token matters at CONNECT, in DeviceAuth, and EmbeddedBroker.disconnect closes what it let in)
        self._devices: dict[str, Device] = {}

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


class _Bucket:
    """A token bucket: ``rate_per_s`` tokens a second, at most ``burst`` saved. ``take`` may run into
    debt and returns the seconds until the debt is paid, so waiting that long holds the rate exactly."""

    def __init__(self, rate_per_s: float, burst: float) -> None:
        self.rate_per_s, self.burst = rate_per_s, burst
        self.level, self._t = burst, time.monotonic()

    def take(self, cost: float) -> float:
        now = time.monotonic()
        self.level = min(self.burst, self.level + (now - self._t) * self.rate_per_s) - cost
        self._t = now
        return max(0.0, -self.level / self.rate_per_s)


class _GuardedReader(ReaderAdapter):
    """One connection's read side, between its socket and amqtt. It follows the MQTT framing of the
    bytes it hands on, so each packet's size is known when its fixed header is read, before its body:
    amqtt 0.12.1 reads a PUBLISH body whole (one ``readexactly`` of what the header claims), and a
    200 MB claim was read into memory. Over ``MAX_PACKET_BYTES`` (a CONNECT too, before any login),
    or a device's QoS 2 publish past ``DEVICE_QOS2_IN_FLIGHT`` unreleased, the connection is aborted
    there. After ``admit`` of a device, each packet also takes one token a packet and its size in
    bytes from the device's buckets; when they are empty the read waits, so the socket is not read,
    TCP's window closes and that device alone slows down (nothing is dropped). The bridge is exempt.
    A read amqtt asks past the limit is refused too (the framing and amqtt's parse could disagree on
    a malformed CONNECT: no read may then be the large one)."""

    def __init__(self, inner: ReaderAdapter, transport: asyncio.WriteTransport, peer: str) -> None:
        self._inner, self._transport, self.peer = inner, transport, peer
        self.device: str | None = None  # the logged-in device; None before login and for the bridge
        self.session: Session | None = None
        self.exempt = False
        self._packets = _Bucket(DEVICE_PACKETS_PER_S, DEVICE_PACKET_BURST)
        self._bytes = _Bucket(DEVICE_BYTES_PER_S, DEVICE_BYTE_BURST)
        self._first: int | None = None  # a fixed header's first byte, while its remaining length is read
        self._length = self._shift = self._body_left = 0
        self.refused: str | None = None

    def admit(self, user: str, session: Session) -> None:
        """The connection is ``user``'s (authenticated): the bridge goes unlimited, a device gets its rates."""
        self.exempt, self.session = user == SERVER_USER, session
        self.device = None if self.exempt else user

    @property
    def at_packet_boundary(self) -> bool:
        """amqtt has read exactly the packets the framing announced (no header half read, no body left)."""
        return self._first is None and self._body_left == 0

    async def read(self, n: int = -1) -> bytes:
        if self.refused is not None:
            raise ConnectionResetError(self.refused)
        if not self.exempt and not 0 <= n <= MAX_PACKET_BYTES:
            self.refuse(f"a read of {n} bytes")
        data = await self._inner.read(n)
        for first, length in self._follow(data):
            await self._check(first, 1 + length)  # counted as Mosquitto 2.0 counts it (its first byte, not its length bytes)
        return data

    def feed_eof(self) -> None:
        self._inner.feed_eof()

    def _follow(self, data: bytes) -> list[tuple[int, int]]:
        """Advance along the framing over ``data``; (first byte, remaining length) of each fixed
        header it completes (amqtt reads a header a byte at a time, so at most one)."""
        done, i = [], 0
        while i < len(data):
            if self._body_left:
                step = min(self._body_left, len(data) - i)
                self._body_left -= step
                i += step
                continue
            byte, i = data[i], i + 1
            if self._first is None:
                self._first, self._length, self._shift = byte, 0, 0
                continue
            self._length |= (byte & 0x7F) << self._shift
            self._shift += 7
            if byte & 0x80:
                if self._shift >= 28:  # MQTT 3.1.1 §2.2.3: at most four bytes
                    self.refuse("a remaining length of more than four bytes")
                continue
            done.append((self._first, self._length))
            self._first, self._body_left = None, self._length
        return done

    async def _check(self, first: int, packet_bytes: int) -> None:
        if self.exempt:
            return
        if packet_bytes > MAX_PACKET_BYTES:
            self.refuse(f"a packet of {packet_bytes} bytes (type {first >> 4}) over the limit of {MAX_PACKET_BYTES}")
        if self.session is None and first >> 4 != CONNECT:
            self.refuse(f"a first packet of type {first >> 4}, not CONNECT")
        if self.device is None:
            return  # before login: the size limit and the CONNECT timeout
        qos2 = first >> 4 == PUBLISH and (first >> 1) & 3 == 2
        if qos2 and self.session is not None and len(self.session.inflight_in) >= DEVICE_QOS2_IN_FLIGHT:
            self.refuse(f"a QoS 2 publish with {DEVICE_QOS2_IN_FLIGHT} not yet released (PUBREL)")
        wait_s = max(self._packets.take(1.0), self._bytes.take(packet_bytes))
        if wait_s > 0:
            await asyncio.sleep(wait_s)

    def refuse(self, what: str) -> NoReturn:
        """Abort the connection (nothing more is read from it) and fail amqtt's read."""
        self.refused = what
        log.warning("broker closed the connection of %s: %s", self.device or self.peer, what)
        self._transport.abort()
        raise ConnectionResetError(what)


class _IdentityBroker(Broker):
    """amqtt 0.12.1 (pinned) looks a CONNECT's client id up in its sessions, deletes the stored one
    (clean session) or takes it over, and only then authenticates: anyone naming the bridge's client
    id took its session and its subscriptions. Here the CONNECT is authenticated first, on a session
    of its own; a refused one gets CONNACK 5 (not authorized) and touches no stored session.

    Every TCP connection reads through a ``_GuardedReader`` (``stream_connected``); the CONNECT must
    be whole within ``CONNECT_TIMEOUT_S`` (amqtt waited forever: 3,000 silent sockets were held at
    75 s); a device's retained publishes are not kept (``retain_message``) and its queue while away
    is bounded (``_retain_broadcast_message``)."""

    connect_timeout_s = CONNECT_TIMEOUT_S
    _dropped: dict[str, int]  # per device session: messages dropped from its queue while it was away

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._dropped = {}

    async def stream_connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, listener_name: str) -> None:
        peer = writer.get_extra_info("peername")
        guarded = _GuardedReader(StreamReaderAdapter(reader), writer.transport, f"{peer[0]}:{peer[1]}" if peer else "?")
        await self._client_connected(listener_name, guarded, StreamWriterAdapter(writer))

    async def _initialize_client_session(self, reader: Any, writer: Any, remote_address: str,
                                         remote_port: int) -> tuple[BrokerProtocolHandler, Session]:
        try:
            connect = BrokerProtocolHandler.init_from_connect(reader, writer, self.plugins_manager)
            handler, incoming = await asyncio.wait_for(connect, self.connect_timeout_s)
            if isinstance(reader, _GuardedReader) and not reader.at_packet_boundary:
                reader.refuse("a CONNECT whose length is not what it holds")
        except (AMQTTError, MQTTError, NoDataError, OSError, TimeoutError) as exc:
            with contextlib.suppress(OSError):  # an aborted connection fails its drain
                await writer.close()
            if isinstance(exc, TimeoutError):
                log.info("broker closed %s:%s: no CONNECT within %g s", remote_address, remote_port, self.connect_timeout_s)
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
        if isinstance(reader, _GuardedReader):
            reader.admit(incoming.username or "", session)
        return handler, session

    async def retain_message(self, source_session: Session | None, topic_name: str | None,
                             data: bytes | bytearray | None, qos: int | None = None) -> None:
        """Only the server's retained messages (``ota``) are kept: a device's (its status, its last
        will) reach the bridge's subscription as any message does, and six retained 32 MB ones no
        longer stay in the broker's memory."""
        if source_session is not None and source_session.username != SERVER_USER:
            return
        await super().retain_message(source_session, topic_name, data, qos)

    async def _retain_broadcast_message(self, broadcast: dict[str, Any], qos: int, target_session: Session) -> None:
        queue = target_session.retained_messages
        if target_session.username != SERVER_USER and queue.qsize() >= DEVICE_QUEUED_MESSAGES:
            queue.get_nowait()  # the oldest goes (see DEVICE_QUEUED_MESSAGES)
            dropped = self._dropped[target_session.client_id or ""] = self._dropped.get(target_session.client_id or "", 0) + 1
            if dropped & (dropped - 1) == 0:  # told at 1, 2, 4, 8, ... drops, not once each
                log.warning("broker dropped %d messages queued for %s while it is away (over %d)",
                            dropped, target_session.client_id, DEVICE_QUEUED_MESSAGES)
        await super()._retain_broadcast_message(broadcast, qos, target_session)


class EmbeddedBroker:
    """amqtt on HOST:PORT in a background thread. ``connect_timeout_s``: how long a connection may
    take to send its CONNECT (``CONNECT_TIMEOUT_S``; shorter in tests)."""

    def __init__(self, host: str, port: int, db_path: Path | str, server_token: str,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.connect_timeout_s = connect_timeout_s
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
            self._broker.connect_timeout_s = self.connect_timeout_s
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

    def disconnect(self, user: str, timeout_s: float = 5.0) -> int:
        """Close every connection of device ``user`` and drop its stored sessions (its token was
        rotated or revoked: a new CONNECT is checked against the store again, by ``DeviceAuth``).
        Returns the sessions dropped. Uses amqtt internals (``_sessions``, ``_cleanup_session``) of
        the pinned version, as ``quiesce`` does."""
        broker = self._broker
        if broker is None or not self._loop.is_running() or user == SERVER_USER:
            return 0

        async def run() -> int:
            mine = [cid for cid, (session, _) in list(broker._sessions.items()) if session.username == user]
            for client_id in mine:
                await broker._cleanup_session(client_id)
            return len(mine)

        dropped = asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=timeout_s)
        log.info("broker closed %d session(s) of %s", dropped, user)
        return dropped

    def stop(self) -> None:
        if self._broker is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._broker.shutdown(), self._loop).result(timeout=15)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=15)
