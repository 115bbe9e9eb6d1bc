"""The device's MQTT link: the outbox behind it, a window of messages in flight, resends, status.

    link = Link(outbox, device="node-1", token=token, broker="mqtt://127.0.0.1:1883", fleet="default",
                on_ota=handle_ota)
    link.start()
    link.send("result", message, state={"cursor": "1"})  # on disk, then published
    ...
    link.stop()

Every message is in the ``Outbox`` (on disk) before it is sent and leaves it only when the
server acknowledges storing its key (``edge.contract.protocol.Ack``); one whose acknowledgement is
overdue is published again (the server drops repeats by key). paho reconnects with exponential
backoff; a status ``online`` is retained on connect, and the broker publishes the last will
``offline`` when the device vanishes. Commands for the device (``ota``) go to ``on_ota`` in a
thread of their own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import paho.mqtt.client as mqtt

from edge.agent.outbox import Outbox
from edge.contract.protocol import (
    BATCH_KIND,
    DEVICE_KINDS,
    MAX_BATCH_BYTES,
    MAX_BATCH_ITEMS,
    SERVER_KINDS,
    Ack,
    Message,
    Status,
    TlsFiles,
    encode,
    encode_batch,
    mqtt_address,
    mqtt_tls,
    parse_topic,
    topic,
)

log = logging.getLogger("trickle.edge.link")


class Link:
    """MQTT with the outbox behind it. A sender thread keeps up to ``max_in_flight`` queued
    messages published (awaiting the broker's PUBACK); a message the broker acknowledged waits for
    the server's ``ack`` of its key, which deletes it, and is published again if that does not
    come within ``resend_s`` while the server acknowledges nothing at all."""

    def __init__(self, outbox: Outbox, device: str, token: str, broker: str, fleet: str = "default",
                 on_ota: Callable[[bytes], None] | None = None, max_in_flight: int = 256, resend_s: float = 30.0,
                 tls: TlsFiles | None = None, batch: int = 64) -> None:
        self.host, self.port = mqtt_address(broker)
        self.outbox, self.on_ota = outbox, on_ota
        self.device, self.token, self.broker, self.fleet = device, token, broker, fleet
        self.max_in_flight, self.resend_s = max_in_flight, resend_s
        self.batch = max(1, min(batch, MAX_BATCH_ITEMS))  # messages per publish when a backlog waits
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=device)  # the broker requires the device name
        self.client.username_pw_set(device, token)
        if mqtt_tls(broker):
            self.client.tls_set_context((tls or TlsFiles()).context())
        self.client.reconnect_delay_set(1, 30)
        self.client.max_inflight_messages_set(max_in_flight)
        self.client.max_queued_messages_set(0)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish
        self.client.on_message = self._on_message
        self._cond = threading.Condition()
        self._in_flight: dict[int, list[int]] = {}  # mid -> the outbox seqs it carries (a batch: several)
        self._early: dict[int, float] = {}  # mid -> when its PUBACK came before the sender recorded it
        self._awaiting: dict[int, float] = {}  # seq -> when the broker acknowledged it (server ack pending)
        self._last_ack = time.monotonic()  # when the server last acknowledged anything
        self._acked_seq = -1  # the newest message the server acknowledged (its outbox sequence number)
        self._sent_up_to = 0
        self._connected = False
        self._stop = False
        self._sender = threading.Thread(target=self._send_guarded, name="trickle-link-sender", daemon=True)
        self.bundle_version: int | None = None
        self.failure: BaseException | None = None  # what stopped the sender (a damaged outbox): the agent stops with it

    def start(self) -> None:
        self._set_will()
        self.client.connect_async(self.host, self.port, keepalive=20)
        self.client.loop_start()
        self._sender.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._sender.join(timeout=10)
        self.publish_status("offline")
        self.client.disconnect()
        self.client.loop_stop()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def send(self, kind: str, message: Message, state: dict[str, str] | None = None) -> None:
        """Queue ``message`` (signed, under this device's ``kind`` topic) in the outbox, saving
        ``state`` in the same transaction, and wake the sender."""
        self.outbox.put(message.key, topic(self.fleet, self.device, kind), encode(message, self.token), state)
        self.wake()

    def _signed(self, message: Message) -> bytes:
        return encode(message, self.token)

    def _status(self, state: str) -> bytes:
        key = f"{self.device}:status:{time.time_ns()}"
        return self._signed(Status(key=key, device=self.device, ts_s=time.time(), state=state,
                                   bundle_version=self.bundle_version))

    def _set_will(self) -> None:
        self.client.will_set(topic(self.fleet, self.device, "status"), self._status("offline"), qos=1, retain=True)

    def publish_status(self, state: str) -> None:
        self.client.publish(topic(self.fleet, self.device, "status"), self._status(state), qos=1, retain=True)

    def _on_connect(self, client: mqtt.Client, userdata: object, flags: object, reason: mqtt.ReasonCode,
                    properties: object) -> None:
        if reason.is_failure:
            log.error("broker refused %s: %s", self.device, reason)
            return
        for kind in SERVER_KINDS:
            client.subscribe(topic(self.fleet, self.device, kind), qos=1)
        self.publish_status("online")
        with self._cond:
            self._connected = True
            self._in_flight.clear()  # resend whatever is still queued; the server drops repeats by key
            self._early.clear()
            self._awaiting.clear()
            self._last_ack = time.monotonic()
            self._sent_up_to = 0
            self._cond.notify_all()

    def _on_disconnect(self, client: mqtt.Client, userdata: object, flags: object, reason: mqtt.ReasonCode,
                       properties: object) -> None:
        with self._cond:
            self._connected = False
        self._set_will()  # re-armed for the next connection

    def _on_publish(self, client: mqtt.Client, userdata: object, mid: int, reason: mqtt.ReasonCode,
                    properties: object) -> None:
        with self._cond:
            seqs = self._in_flight.pop(mid, None)
            if seqs is None:  # acknowledged before the sender recorded it (or a previous session's)
                self._early[mid] = time.monotonic()
            else:
                now = time.monotonic()
                for seq in seqs:
                    self._awaiting[seq] = now
            self._cond.notify_all()

    def _in_flight_count(self) -> int:
        return sum(map(len, self._in_flight.values()))

    def _on_message(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        if msg.topic.endswith("/ack"):
            try:
                keys = Ack.model_validate_json(msg.payload).keys
            except ValueError as err:
                log.warning("ignored a malformed ack: %s", err)
                return
            try:
                acked = self.outbox.delete_keys(keys)
            except Exception as err:  # a damaged outbox: the agent stops with it
                self.failure = err
                return
            with self._cond:
                self._last_ack = time.monotonic()
                for seq in acked:
                    self._awaiting.pop(seq, None)
                self._acked_seq = max(self._acked_seq, *acked) if acked else self._acked_seq
                self._cond.notify_all()
        elif msg.topic.endswith("/ota") and self.on_ota is not None:
            threading.Thread(target=self.on_ota, args=(msg.payload,), name="trickle-ota", daemon=True).start()

    def _next_rows(self) -> list[tuple[int, str, bytes]] | None:
        """Messages to publish now (never-sent ones first, then those whose server ack is overdue);
        None once stopped. Waits while disconnected or while the window is full."""
        with self._cond:
            while not self._stop and (not self._connected or self._in_flight_count() >= self.max_in_flight):
                self._cond.wait(0.5)
            if self._stop:
                return None
            room = self.max_in_flight - self._in_flight_count()
            after = self._sent_up_to
            now = time.monotonic()
            # resend when the server has gone quiet, or when a newer message was acknowledged while
            # this one waits (a server replica died holding it: the broker gave the rest to another);
            # while acks of older messages keep coming the server is working through a backlog,
            # and resending would only deepen it
            stalled = now - self._last_ack > self.resend_s
            overdue = sorted(seq for seq, t in self._awaiting.items()
                             if now - t > self.resend_s and (stalled or seq < self._acked_seq))[:room]
            for seq in overdue:
                del self._awaiting[seq]
            self._early = {mid: t for mid, t in self._early.items() if now - t < 5.0}  # acks that matched nothing
        rows = self.outbox.pending(after, room)
        return rows + self.outbox.rows(overdue)[: max(0, room - len(rows))]

    def _send_guarded(self) -> None:
        try:
            self._send_loop()
        except BaseException as err:  # the agent sees it and stops with it: never a silent hang
            self.failure = err
            log.error("the sender stopped: %s", err)

    def _send_loop(self) -> None:
        # paho is never called with self._cond held: its network thread takes its own locks and
        # then ours (in _on_publish), so holding ours across publish() would deadlock.
        while (rows := self._next_rows()) is not None:
            if not rows:
                with self._cond:
                    self._cond.wait(0.2)
                continue
            for chunk in self._chunks(rows):
                seqs = [seq for seq, _, _ in chunk]
                if len(chunk) == 1:
                    info = self.client.publish(chunk[0][1], chunk[0][2], qos=1)
                else:  # a backlog: one publish carries many (each keeps its key and signature)
                    payload = encode_batch([(parse_topic(name).kind, body) for _, name, body in chunk])
                    info = self.client.publish(topic(self.fleet, self.device, BATCH_KIND), payload, qos=1)
                if info.rc != mqtt.MQTT_ERR_SUCCESS:
                    break
                with self._cond:
                    self._sent_up_to = max(self._sent_up_to, *seqs)
                    if self._early.pop(info.mid, None) is None:
                        self._in_flight[info.mid] = seqs
                    else:
                        now = time.monotonic()
                        for seq in seqs:
                            self._awaiting[seq] = now

    def _chunks(self, rows: list[tuple[int, str, bytes]]) -> list[list[tuple[int, str, bytes]]]:
        """Rows grouped into publishes: up to ``batch`` messages of the kinds a batch carries, within
        the batch size limit; anything else (a request, a retained status) alone."""
        chunks: list[list[tuple[int, str, bytes]]] = []
        size = 0
        for row in rows:
            batchable = parse_topic(row[1]).kind in DEVICE_KINDS and self.batch > 1
            last = chunks[-1] if chunks else None
            cost = len(row[2]) + row[2].count(b'"') + row[2].count(b"\\") + 40  # JSON-escaped inside the batch
            if (batchable and last is not None and parse_topic(last[0][1]).kind in DEVICE_KINDS and len(last) < self.batch
                    and size + cost < MAX_BATCH_BYTES):
                last.append(row)
                size += cost
            else:
                chunks.append([row])
                size = cost
        return chunks

    def drained(self) -> bool:
        return len(self.outbox) == 0
