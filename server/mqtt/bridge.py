"""The MQTT bridge: takes every device message from the broker, checks it, stores it once.

A paho-mqtt client with a persistent session (clean_session=False) subscribes at QoS 1 to all
devices' topics. Acknowledgements are manual: a message is PUBACKed only after the batch that
holds it is committed to the store, so a server that dies before storing gets it again from
the broker. Keys make the store idempotent, so a redelivery is a duplicate skipped, not a copy.

Verification calls (``verify``, QoS 0: client–server speculative decoding over MQTT) are checked
the same way and answered at once on the device's ``verified`` topic from a pool of threads, so
calls from many devices reach ``server.llm.verify`` together and share a target forward; a refused
call is answered with its status (401, 400) when its id can be read, so the device need not time out.

After each commit the bridge publishes an ``ack`` with the stored keys to each device; only
then does a device delete them from its outbox (end to end, whatever the broker did).

Replicas (``replica`` NAME: several ``trickle serve`` processes on one database and one external
broker): each bridge connects as ``trickle-server.NAME`` over MQTT v5 and subscribes through shared
subscriptions (``$share/trickle/…``, Mosquitto ≥ 1.6 and any v5 broker), so the broker hands each
message to one replica. The session is clean (expiry 0): a broker keeps a persistent member of a
share group in the group while it is away and piles its share of the messages into its queue, so
a dead replica would swallow half the fleet's messages until it came back. With a clean session
its share goes to the others at once; what it held unacknowledged is lost in the broker but not
at the device, which publishes again what the server did not acknowledge end to end (the
store's keys make the second copy a duplicate skipped). Only a replica serving a language model
subscribes to verification calls.

Each message is checked with ``edge.contract.protocol.decode`` (topic, size, JSON, schema, that the
device is registered in that fleet, and its HMAC). A rejected message is logged with its
reason, counted, acknowledged and dropped; nothing a device sends can stop the bridge.
"""

from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import paho.mqtt.client as mqtt
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from tenacity import (
    before_sleep_log,
    retry,
    retry_if_exception_type,
    retry_if_result,
    stop_after_delay,
    wait_exponential,
    wait_fixed,
)

from edge.contract.protocol import (
    BATCH_KIND,
    DEVICE_KINDS,
    REQUEST_KINDS,
    REQUEST_SUBSCRIPTIONS,
    SERVER_SUBSCRIPTIONS,
    Ack,
    Event,
    Message,
    ProtocolError,
    Result,
    Status,
    TlsFiles,
    VerifyCall,
    VerifyReply,
    VerifyRequest,
    VerifyResponse,
    decode,
    decode_batch,
    mqtt_address,
    mqtt_tls,
    parse_topic,
    topic,
)
from server.mqtt.limits import MAX_PACKET_BYTES
from server.store.store import Incoming, Store

log = logging.getLogger("trickle.server.bridge")
SERVER_USER = "trickle-server"
SHARE_GROUP = "trickle"  # the replicas' shared-subscription group
# a locked, full or failing disk, or a database connection lost: worth another try
STORE_ERRORS: tuple[type[BaseException], ...] = (sqlite3.OperationalError, OSError)
try:
    import psycopg

    STORE_ERRORS += (psycopg.OperationalError,)
except ImportError:  # PostgreSQL support not installed: SQLite only
    pass
STORE_RETRY_S = 30.0
TOKENS_TTL_S = 2.0  # how long the bridge trusts a device's token it read (a revoked one: see Bridge._tokens)


@dataclass(frozen=True)
class BrokerAddress:
    """The broker's host and port, from an ``mqtt://`` or ``mqtts://`` URL."""

    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        """``mqtt://HOST:PORT`` (port 1883 when not given); anything else is a ConfigError."""
        return cls(*mqtt_address(url))


class Metrics:
    """Prometheus metrics of the link, in their own registry (served at /metrics)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.received = Counter("trickle_messages_in", "Device messages received", ["kind"], registry=self.registry)
        self.rejected = Counter("trickle_messages_rejected", "Device messages refused", ["reason"], registry=self.registry)
        self.stored = Counter("trickle_messages_stored", "Device messages stored (new keys)", registry=self.registry)
        self.stored_count = 0  # the same, as a plain number (the dashboard's change detector)
        self.duplicates = Counter("trickle_messages_duplicate", "Redelivered keys skipped", registry=self.registry)
        self.lag = Gauge("trickle_ingest_lag_messages", "Messages received, not yet stored", registry=self.registry)
        self.latency = Histogram("trickle_ingest_latency_seconds", "Receipt to commit", registry=self.registry,
                                 buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))


def _reason(err: ProtocolError) -> str:
    text = str(err)
    for needle, reason in (("signature", "signature"), ("published under", "foreign_topic"), ("unknown device", "unknown_device"),
                           ("over the limit", "oversized"), ("not JSON", "malformed"), ("JSON object", "malformed"),
                           ("schema", "schema"), ("topic", "topic")):
        if needle in text:
            return reason
    return "other"


class RejectionLog:
    """Rejected messages in the log without flooding it: the first of each reason is logged with
    its detail at once, later ones are summed into one line per ``every_s`` (counts per reason).
    The Prometheus counters stay exact; this is only what a person reads."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0) -> None:
        self.logger, self.every_s = logger, every_s
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._pending: dict[str, int] = {}
        self._last: str = ""
        self._since = time.monotonic()

    def note(self, reason: str, detail: str) -> None:
        with self._lock:
            if reason not in self._seen:
                self._seen.add(reason)
                self.logger.warning("rejected %s (%s)", detail[:300], reason)
            else:
                self._pending[reason] = self._pending.get(reason, 0) + 1
                self._last = detail[:300]
            self._flush_due()

    def flush_due(self) -> None:
        """Write the summary if its interval is over (called when idle, so a flood's tail is told)."""
        with self._lock:
            self._flush_due()

    def _flush_due(self) -> None:
        now = time.monotonic()
        if now - self._since < self.every_s:
            return
        if self._pending:
            counts = ", ".join(f"{n} {reason}" for reason, n in sorted(self._pending.items()))
            self.logger.warning("rejected %d more messages in %.0f s (%s); the last: %s",
                                sum(self._pending.values()), now - self._since, counts, self._last)
        self._pending, self._since = {}, now


class Bridge:
    """The server's MQTT client: checks each device message, stores it once and acknowledges it end to
    end (see the module doc)."""

    def __init__(self, store: Store, broker: str, server_token: str, metrics: Metrics | None = None,
                 max_batch: int = 2000, ack_every_s: float = 0.05, tls: TlsFiles | None = None,
                 replica: str | None = None, verify_calls: bool = True) -> None:
        self.store, self.address = store, BrokerAddress.parse(broker)
        self.replica = replica
        self.verify_calls = verify_calls  # subscribe to verification calls (a replica: only with a language model)
        self.metrics = metrics or Metrics()
        self.max_batch, self.ack_every_s = max_batch, ack_every_s
        self._unacked: dict[str, list[str]] = {}  # device -> keys stored, not yet acknowledged to it
        self._acks_sent = time.monotonic()
        # units to store: the messages of one MQTT publish (one, or a batch's), its mid and QoS
        self._queue: queue.Queue[tuple[list[Incoming], int, int] | None] = queue.Queue()
        # device -> (fleet, token, when read): a token rotated or revoked (through any replica) stops
        # verifying within TOKENS_TTL_S, at the cost of one store lookup per device that often
        self._tokens: dict[str, tuple[str, str, float]] = {}
        if replica is None:  # one server: a persistent session keeps what arrives while it restarts
            self._client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=SERVER_USER, clean_session=False,
                                       manual_ack=True)
        else:  # one of several: MQTT v5, a clean session in the share group (see the module doc)
            self._client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=replica_user(replica),
                                       protocol=mqtt.MQTTv5, manual_ack=True)
        self._client.username_pw_set(self.user, server_token)
        if mqtt_tls(broker):
            self._client.tls_set_context((tls or TlsFiles()).context())
        self._client.reconnect_delay_set(1, 5)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_message = self._on_message
        self._rejections = RejectionLog(log)
        self._writer = threading.Thread(target=self._write_loop, name="trickle-bridge-writer", daemon=True)
        self.connected = threading.Event()
        self.failure: str | None = None  # why the writer stopped (a bug), reported at /healthz
        self._received = {kind: self.metrics.received.labels(kind) for kind in DEVICE_KINDS + REQUEST_KINDS}  # looked up once
        # verification over MQTT: (device, request) -> (status, detail, response); None: no language model
        self.on_verify: Callable[[str, VerifyRequest], tuple[int, str, VerifyResponse | None]] | None = None
        self._requests = ThreadPoolExecutor(16, thread_name_prefix="trickle-verify-mqtt")  # rounds wait together: batched
        self.on_connected: list[Callable[[], None]] = []  # called (in paho's thread) after every (re)connect
        self._last_received = time.monotonic()
        self._stopping = False  # stop() disconnects: that is no broker lost

    @property
    def user(self) -> str:
        """The name the bridge logs in with (and its client id)."""
        return SERVER_USER if self.replica is None else replica_user(self.replica)

    def subscriptions(self) -> list[tuple[str, int]]:
        """(topic filter, QoS) of what the bridge reads: devices' messages at QoS 1, verification
        calls at QoS 0; shared among the replicas (``$share/GROUP/``) when this is one."""
        wanted = [(name, 1) for name in SERVER_SUBSCRIPTIONS]
        wanted += [(name, 0) for name in REQUEST_SUBSCRIPTIONS] if self.verify_calls else []
        if self.replica is None:
            return wanted
        return [(f"$share/{SHARE_GROUP}/{name}", qos) for name, qos in wanted]

    def start(self) -> None:
        self._writer.start()
        if self.replica is None:
            self._client.connect_async(self.address.host, self.address.port, keepalive=30)
        else:
            self._client.connect_async(self.address.host, self.address.port, keepalive=30, clean_start=True)
        self._client.loop_start()

    def stop(self) -> None:
        """Disconnect, then store what was received (and acknowledge it)."""
        self._stopping = True
        self._client.disconnect()
        self._client.loop_stop()
        self._requests.shutdown(wait=False, cancel_futures=True)
        self._queue.put(None)
        self._writer.join(timeout=30)

    def wait_idle(self, quiet_s: float = 0.3, timeout_s: float = 10.0) -> bool:
        """Until nothing arrived for ``quiet_s`` and everything received is stored (at most
        ``timeout_s``); returns whether it got idle."""

        @retry(retry=retry_if_result(lambda idle: not idle), stop=stop_after_delay(timeout_s), wait=wait_fixed(0.02),
               retry_error_callback=lambda state: False)
        def idle() -> bool:
            return time.monotonic() - self._last_received >= quiet_s and self._queue.empty()

        return idle()

    def publish(self, fleet: str, device: str, kind: str, payload: bytes, retain: bool = False) -> None:
        self._client.publish(topic(fleet, device, kind), payload, qos=1, retain=retain)

    def _on_connect(self, client: mqtt.Client, userdata: object, flags: object, reason: mqtt.ReasonCode,
                    properties: object) -> None:
        if reason.is_failure:
            log.error("broker %s:%d refused the bridge: %s", self.address.host, self.address.port, reason)
            return
        client.subscribe(self.subscriptions())
        self.connected.set()
        for callback in self.on_connected:
            callback()
        log.info("bridge connected to %s:%d", self.address.host, self.address.port)

    def _on_disconnect(self, client: mqtt.Client, userdata: object, flags: object, reason: mqtt.ReasonCode,
                       properties: object) -> None:
        """The broker is gone (or closed the session): not ready until paho's reconnect succeeds. Or
        the bridge is stopping, which is no news."""
        was = self.connected.is_set()
        self.connected.clear()
        if self._stopping:
            log.info("bridge disconnected from %s:%d (stopping)", self.address.host, self.address.port)
        elif was:
            log.warning("bridge lost the broker %s:%d (%s); reconnecting", self.address.host, self.address.port, reason)

    def _reject(self, reason: str, where: str, err: ProtocolError) -> None:
        """Count a refused message (exactly) and log it (rate-limited: a summary per interval)."""
        self.metrics.rejected.labels(reason).inc()
        self._rejections.note(reason, f"{where}: {err}")

    def _token_of(self, fleet: str, device: str) -> str | None:
        now = time.monotonic()
        known = self._tokens.get(device)
        if known is None or now - known[2] > TOKENS_TTL_S:
            try:
                record = self.store.device(device)
            except STORE_ERRORS:  # the store is away: the token last read, asked again in TOKENS_TTL_S
                if known is None:
                    raise
                known = self._tokens[device] = (known[0], known[1], now)
                return known[1] if known[0] == fleet else None
            if record is None:
                return None
            known = self._tokens[device] = (record.fleet, record.token, now)
        return known[1] if known[0] == fleet else None

    def _on_message(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        received_s = time.time()
        self._last_received = time.monotonic()
        if msg.topic.endswith(f"/{BATCH_KIND}"):
            self._on_batch(client, msg, received_s)
            return
        try:
            payload = bytes(msg.payload)
            where, message = decode(msg.topic, payload, self._token_of)
        except ProtocolError as err:
            reason = _reason(err)
            self._reject(reason, f"a message on {msg.topic}", err)
            client.ack(msg.mid, msg.qos)
            if msg.topic.endswith(tuple(f"/{kind}" for kind in REQUEST_KINDS)):
                self._refuse(msg.topic, payload, 401 if reason in ("signature", "unknown_device") else 400, str(err))
            return
        self._received[where.kind].inc()
        if isinstance(message, VerifyCall):  # answered at once, on a thread: rounds that wait together are batched
            self._requests.submit(self._verify, where.fleet, where.device, message)
            return
        self.metrics.lag.inc()
        self._queue.put(([_incoming(where.kind, message, payload, received_s)], msg.mid, msg.qos))

    def _on_batch(self, client: mqtt.Client, msg: mqtt.MQTTMessage, received_s: float) -> None:
        """A device's batch: each item checked on its own (a bad one is counted and dropped), the
        good ones stored together and the publish acknowledged once they are."""
        try:
            items = decode_batch(msg.topic, bytes(msg.payload), self._token_of)
        except ProtocolError as err:
            self._reject(_reason(err), f"a batch on {msg.topic}", err)
            client.ack(msg.mid, msg.qos)
            return
        unit = []
        for item in items:
            if isinstance(item, ProtocolError):
                self._reject(_reason(item), f"a message in a batch on {msg.topic}", item)
                continue
            where, message, payload = item
            self._received[where.kind].inc()
            unit.append(_incoming(where.kind, message, payload, received_s))
        if not unit:
            client.ack(msg.mid, msg.qos)
            return
        self.metrics.lag.inc(len(unit))
        self._queue.put((unit, msg.mid, msg.qos))

    def _reply(self, fleet: str, device: str, reply: VerifyReply) -> None:
        body = reply.model_dump_json(exclude_none=True).encode()
        if len(body) > MAX_PACKET_BYTES - 1024:  # with its topic over the broker's packet limit: Mosquitto would drop the bridge
            body = VerifyReply(id=reply.id, status=413, detail=f"the reply ({len(body)} bytes) is over the broker's packet "
                               f"limit ({MAX_PACKET_BYTES}): verify over HTTP").model_dump_json(exclude_none=True).encode()
        self._client.publish(topic(fleet, device, "verified"), body, qos=0)

    def _verify(self, fleet: str, device: str, call: VerifyCall) -> None:
        try:
            if self.on_verify is None:
                status, detail, result = 404, "this server serves no language model (start it with trickle serve --llm DIR)", None
            else:
                status, detail, result = self.on_verify(device, call.request)
        except Exception as err:  # a bug or the target failing: the device hears it instead of timing out
            log.exception("verification for %s failed", device)
            status, detail, result = 500, f"{type(err).__name__}: {err}", None
        self._reply(fleet, device, VerifyReply(id=call.key, status=status, detail=detail[:1024], result=result))

    def _refuse(self, name: str, payload: bytes, status: int, detail: str) -> None:
        """Tell a device why its verification call was refused (when its topic and id can be read)."""
        try:
            where = parse_topic(name)
            key = json.loads(payload).get("key", "")
        except (ProtocolError, ValueError, AttributeError):
            return
        if isinstance(key, str) and len(key) <= 96:
            self._reply(where.fleet, where.device, VerifyReply(id=key, status=status, detail=detail[:1024]))

    def _write_loop(self) -> None:
        try:
            self._write_batches()
        except Exception as err:  # a bug: stop storing, say so loudly and at /healthz, never spin
            self.failure = f"{type(err).__name__}: {err}"
            log.exception("the bridge's writer stopped; nothing more is stored until the server restarts")

    def _write_batches(self) -> None:
        """Block for a message, then take whatever else is waiting: batches grow with the load,
        and a lone message is stored at once (brokers cap unacknowledged messages in flight).
        Acks to devices are gathered for up to ``ack_every_s`` so a device gets one ack for many
        keys instead of one per commit."""
        stopping = False
        while not stopping:
            try:
                item = self._queue.get(timeout=self.ack_every_s)
            except queue.Empty:
                self._send_acks()
                self._rejections.flush_due()
                continue
            if item is None:
                break
            batch = [item]
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stopping = True
                    break
                batch.append(nxt)
            self._commit(batch)
            if time.monotonic() - self._acks_sent >= self.ack_every_s:
                self._send_acks()
        self._send_acks()

    @retry(retry=retry_if_exception_type(STORE_ERRORS), stop=stop_after_delay(STORE_RETRY_S),
           wait=wait_exponential(multiplier=0.1, max=5.0), before_sleep=before_sleep_log(log, logging.WARNING), reraise=True)
    def _store(self, messages: list[Incoming]) -> int:
        """Store a batch; a locked or full disk is tried again for up to ``STORE_RETRY_S``."""
        return self.store.add_messages(messages)

    def _commit(self, batch: list[tuple[list[Incoming], int, int]]) -> None:
        """Store a batch, then acknowledge its messages to the broker. If the disk stays locked or
        full, the batch is logged and left unacknowledged, and the bridge reconnects: its session
        is persistent, so the broker delivers every unacknowledged message again (devices also
        keep them in their outboxes until the server acknowledges them). Any other error is a bug
        and propagates."""
        messages = [m for unit, _, _ in batch for m in unit]
        try:
            new = self._store(messages)
        except STORE_ERRORS:
            log.exception("storing %d messages failed for %.0f s; reconnecting so the broker delivers them again",
                          len(messages), STORE_RETRY_S)
            self.metrics.lag.dec(len(messages))
            self._client.reconnect()
            return
        now = time.time()
        for unit, mid, qos in batch:
            self._client.ack(mid, qos)
            for message in unit:
                self.metrics.latency.observe(now - message.received_s)
                self._unacked.setdefault(message.device, []).append(message.key)
        self.metrics.stored.inc(new)
        self.metrics.stored_count += new
        self.metrics.duplicates.inc(len(messages) - new)
        self.metrics.lag.dec(len(messages))

    def _send_acks(self) -> None:
        """End to end: tell each device which of its keys are stored, so it may forget them."""
        for device, keys in self._unacked.items():
            fleet = self._tokens[device][0]
            for i in range(0, len(keys), 5000):
                payload = Ack(keys=keys[i : i + 5000]).model_dump_json().encode()
                self._client.publish(topic(fleet, device, "ack"), payload, qos=1)
        self._unacked = {}
        self._acks_sent = time.monotonic()


def replica_user(replica: str) -> str:
    """The broker user (and client id) of replica ``replica``'s bridge: ``trickle-server.NAME``.
    Device names have no dot, so no device can be, or log in as, a replica."""
    return f"{SERVER_USER}.{replica}"


def _incoming(kind: str, message: Message, payload: bytes, received_s: float) -> Incoming:
    """The row of a validated message, with what the dashboard aggregates lifted out of its body."""
    correct = message.correct if isinstance(message, Result) else None
    version = getattr(message, "bundle_version", None)
    state = message.state if isinstance(message, Status) else message.event if isinstance(message, Event) else None
    return Incoming(message.key, message.device, kind, message.ts_s, received_s, payload.decode(), correct, version, state)
