"""The edge ↔ server protocol, version 1: MQTT topics, message schemas, signatures, HTTP routes.

The device runtime owns it; the server imports it. Topics::

    trickle/v1/{fleet}/{device}/{kind}

- device → server: ``telemetry``, ``result``, ``event`` (QoS 1), ``status`` (retained; the
  last will publishes ``offline``);
- server → device: ``ota`` (retained: the bundle the device should run), ``cmd``, and ``ack``:
  the keys the server has stored. A device deletes a queued message only on this end-to-end
  acknowledgement (a broker's PUBACK alone is not enough: amqtt acknowledges a message before it
  is safely queued, and loses it if the publisher disconnects right after);
- request/response, QoS 0 (a lost one is a timeout, never a stale answer from a broker's queue):
  ``verify`` (device → server, a signed ``VerifyCall``: one round of client–server speculative
  decoding) and ``verified`` (server → device, its ``VerifyReply``). The correlation id travels in
  the payload: the embedded broker (amqtt) speaks MQTT 3.1.1, which has no correlation-data
  property, and the same bytes then work through any broker.

Every device message is JSON with ``v`` (schema version), ``key`` (idempotency key: the server
stores a key once), ``device`` (must match the topic) and ``ts_s`` (the device's clock, or the
simulator's virtual time), and is signed: its last member ``sig`` is the HMAC-SHA256, under the
device's token, of the payload's bytes without that member (see ``encode``), so checking it
needs no re-serialization. A device publishing under another device's topic, or a
payload over ``MAX_PAYLOAD_BYTES``, not JSON, of the wrong schema or with a bad signature, is
refused by ``decode`` with a ``ProtocolError`` that names the reason.

HTTP (bearer tokens): ``ROUTES`` lists the paths; the server's OpenAPI spec at /openapi.json
describes them in full.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, NamedTuple
from urllib.parse import urlsplit

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edge.core.errors import BundleError, ConfigError, LinkError

VERSION = 1
ROOT = f"trickle/v{VERSION}"
DEVICE_KINDS = ("telemetry", "result", "status", "event")  # stored by the server
REQUEST_KINDS = ("verify",)  # device → server requests, answered at once, never stored
SERVER_KINDS = ("ota", "cmd", "ack", "verified")
BATCH_KIND = "batch"  # transport only: several signed device messages in one publish (encode_batch)
SERVER_SUBSCRIPTIONS = [f"{ROOT}/+/+/{kind}" for kind in (*DEVICE_KINDS, BATCH_KIND)]  # the bridge: what devices send
REQUEST_SUBSCRIPTIONS = [f"{ROOT}/+/+/{kind}" for kind in REQUEST_KINDS]  # QoS 0
MAX_PAYLOAD_BYTES = 8192
MAX_REQUEST_BYTES = 1 << 18  # a verification that resends a long history
MAX_BATCH_BYTES = 1 << 18
MAX_BATCH_ITEMS = 256
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

ROUTES = {
    "health": "/healthz",
    "ready": "/readyz",
    "metrics": "/metrics",
    "devices": "/v1/devices",
    "bundles": "/v1/bundles",
    "bundle": "/v1/bundles/{version}",
    "assignments": "/v1/assignments",
    "messages": "/v1/devices/{device}/{kind}",
    "device_token": "/v1/devices/{device}/token",  # admin: POST a new token (the old one revoked), DELETE: revoke
    "verify": "/v1/llm/verify",
    "checkpoints": "/v1/checkpoints",  # admin: a teacher checkpoint for jobs (content-addressed)
    "jobs": "/v1/jobs",  # admin: heavy work on the server (server.jobs.queue)
    "job": "/v1/jobs/{job_id}",
    "job_logs": "/v1/jobs/{job_id}/logs",
    "job_cancel": "/v1/jobs/{job_id}/cancel",
}

Name = Annotated[str, Field(pattern=_NAME.pattern)]


class ProtocolError(LinkError):
    """A topic or message that breaks the protocol; the text says how."""


class Topic(NamedTuple):
    """An MQTT topic taken apart: fleet, device and message kind."""

    fleet: str
    device: str
    kind: str


def _check_name(what: str, value: str) -> str:
    if not _NAME.match(value):
        raise ProtocolError(f"{what} {value!r}: must be 1-64 of A-Z a-z 0-9 _ -")
    return value


KINDS = (*DEVICE_KINDS, *REQUEST_KINDS, *SERVER_KINDS, BATCH_KIND)


def topic(fleet: str, device: str, kind: str) -> str:
    if kind not in KINDS:
        raise ProtocolError(f"kind {kind!r}: must be one of {', '.join(KINDS)}")
    return f"{ROOT}/{_check_name('fleet', fleet)}/{_check_name('device', device)}/{kind}"


@functools.lru_cache(maxsize=65536)
def parse_topic(name: str) -> Topic:
    parts = name.split("/")
    if len(parts) != 5 or "/".join(parts[:2]) != ROOT:
        raise ProtocolError(f"topic {name!r}: not {ROOT}/FLEET/DEVICE/KIND")
    fleet, device, kind = parts[2:]
    if kind not in KINDS:
        raise ProtocolError(f"topic {name!r}: unknown kind {kind!r}")
    return Topic(_check_name("fleet", fleet), _check_name("device", device), kind)


def device_topics(fleet: str, device: str) -> dict[str, list[str]]:
    """What a device may publish and subscribe to (the broker ACL and the bridge enforce it)."""
    return {"publish": [topic(fleet, device, k) for k in (*DEVICE_KINDS, *REQUEST_KINDS, BATCH_KIND)],
            "subscribe": [topic(fleet, device, k) for k in SERVER_KINDS]}


# ---- messages ------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Message(_Strict):
    """What every device message carries: its idempotency key, the device and its timestamp (the
    device's own clock)."""

    v: Literal[1] = 1
    key: str = Field(min_length=1, max_length=96, pattern=r"^[A-Za-z0-9_.:-]+$")
    device: Name
    ts_s: float = Field(ge=0, le=1e11)
    sig: str = Field("", max_length=64)


class Telemetry(Message):
    """A device's state: storage voltage, energy harvested and consumed, power failures and time
    powered so far, free-form metrics."""

    voltage_v: float | None = Field(None, ge=0, le=100)
    harvested_j: float | None = Field(None, ge=0)
    consumed_j: float | None = Field(None, ge=0)
    power_cycles: int | None = Field(None, ge=0)  # power failures since the device was first started
    on_time_s: float | None = Field(None, ge=0)  # time powered since then
    metrics: dict[Name, float] = Field(default_factory=dict, max_length=32)


class Result(Message):
    """One inference: the class, the variant and bundle that made it, its latency and, where the truth
    is known, whether it was right."""

    label: str = Field(max_length=64)
    class_index: int = Field(ge=0)
    variant: str = Field(max_length=32)
    bundle_version: int = Field(ge=0)
    latency_s: float = Field(ge=0)
    correct: bool | None = None  # known when a dataset or a simulation supplies the truth


class Status(Message):
    """Online or offline (the offline one is the connection's last will), with the bundle version
    running."""

    state: Literal["online", "offline"]
    bundle_version: int | None = Field(None, ge=0)


class Event(Message):
    """Something that happened on the device (an OTA step, a self-test, a rollback), with its bundle
    version and detail."""

    event: Literal["ota_applied", "ota_rejected", "ota_rolled_back", "started", "stopped"]
    bundle_version: int | None = Field(None, ge=0)
    detail: str = Field("", max_length=512)


class OtaCommand(_Strict):
    """Retained on the device's ``ota`` topic: the bundle it should run."""

    v: Literal[1] = 1
    bundle_version: int = Field(ge=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")  # of the bundle's tar, as served
    path: str  # HTTP route to download it from


class Ack(_Strict):
    """The keys of a device's messages the server has stored (or already had)."""

    v: Literal[1] = 1
    keys: list[str] = Field(max_length=10_000)


class Command(_Strict):
    """An instruction from the server to one device: report now, or stop."""

    v: Literal[1] = 1
    command: Literal["report", "stop"]


MAX_DRAFT = 256  # draft tokens one verification may carry (a re-verified offline suffix is one long draft)
MAX_HISTORY = 8192
MAX_GENERATE = 1024  # tokens one round may ask the server to decode itself


class VerifyRequest(_Strict):
    """Client–server speculative decoding, one round: "after my history, here is a draft".

    The server keeps, per (device, ``session``), the verified token history and the target's
    cache of it. ``tokens`` are history tokens from index ``start`` on that the server does not
    hold yet: at the first round the whole prompt (``start`` 0); after a rejection in sampling the
    correction the client drew. A server that lost the session (evicted, restarted) answers 409 and
    the client resends its whole history from ``start`` 0. ``q`` (sampling only): the draft's
    probability of each draft token."""

    v: Literal[1] = 1
    session: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    start: int = Field(ge=0, le=MAX_HISTORY)
    tokens: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=MAX_HISTORY)
    draft: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=MAX_DRAFT)
    q: list[Annotated[float, Field(gt=0, le=1)]] | None = Field(None, max_length=MAX_DRAFT)
    temperature: float = Field(0.0, ge=0, le=10)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int = Field(0, ge=0, lt=2**63)
    states_from: int | None = Field(None, ge=0, le=MAX_HISTORY)
    """A draft that reads target states holds those of history[:states_from]; send the rest."""
    state_kind: Literal["moa", "features"] = "moa"
    """Which states: the MoA draft's (its Layer Self-Attention over the target's keys/values,
    projected: needs the server's MoA draft) or the target's last hidden states (EAGLE-style)."""
    generate: int = Field(0, ge=0, le=MAX_GENERATE)
    """After the round, the server decodes up to this many more tokens itself (greedy, or sampled
    from the target when temperature > 0), one step at a time batched with other sessions' rounds,
    and returns them as ``generated``: the device's "API only" block (when the round ends with a
    correction the device must draw, nothing is generated)."""


class VerifyResponse(_Strict):
    """The round's outcome: ``accepted`` draft tokens kept, then ``next``: the target's token after
    them (greedy, or sampling with every draft token kept), or None after a rejection in sampling,
    when ``p`` is the target's distribution there and the client draws the correction from
    norm(max(0, p − q)) with its own q (``edge.llm.acceptance.residual``) and sends it as ``tokens``.
    ``history`` is the length of the server's verified history afterwards."""

    v: Literal[1] = 1
    accepted: int = Field(ge=0)
    next: int | None = Field(None, ge=0)
    p: list[float] | None = None
    history: int = Field(ge=0)
    target_ms: float = Field(ge=0)
    states: str | None = None
    """Base64 (m, 2 + hidden) bytes, per token a float16 scale and int8 values
    (``edge.llm.draft.encode_states``): the target states of the request's ``state_kind`` of
    history tokens states_from.. that the target's cache holds."""
    states_from: int | None = Field(None, ge=0)
    generated: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=MAX_GENERATE)
    """Tokens the server decoded itself after ``next`` (``generate``; ``history`` counts them)."""
    generate_ms: float = Field(0.0, ge=0)
    """The server's time decoding them (its batched steps, shared with other sessions)."""
    load: int = Field(0, ge=0)
    """Rounds waiting at the server when this one was answered (how busy it is)."""
    speculation: Literal["ok", "refused"] = "ok"
    """``refused``: the server was overloaded and did not verify the draft (``accepted`` 0); it
    decoded the tokens itself instead (``generated``). Ask it for blocks rather than drafts."""


class VerifyCall(Message):
    """A ``VerifyRequest`` over MQTT (topic ``verify``), signed like every device message; ``key``
    is the correlation id its ``VerifyReply`` carries back."""

    request: VerifyRequest


class VerifyReply(_Strict):
    """The server's answer on ``verified``: ``id`` is the call's key; ``status`` as HTTP's (200 with
    ``result``; 409 session lost: resend from start 0; 400 bad request; 404 no language model;
    500 the server failed), ``detail`` says why."""

    v: Literal[1] = 1
    id: str = Field(max_length=96)
    status: int = Field(ge=100, le=599)
    detail: str = Field("", max_length=1024)
    result: VerifyResponse | None = None


SCHEMAS: dict[str, type[Message]] = {"telemetry": Telemetry, "result": Result, "status": Status, "event": Event,
                                     "verify": VerifyCall}


_SIG = b',"sig":"'


def signature(body: bytes, token: str) -> str:
    """HMAC-SHA256 (hex) of a message's JSON bytes without its ``sig`` member."""
    return hmac.new(token.encode(), body, hashlib.sha256).hexdigest()


def encode(message: Message, token: str) -> bytes:
    """The signed JSON payload of ``message``: its compact JSON with ``"sig"`` appended as the last
    member; the signature covers exactly the bytes before it (plus the closing brace), so a
    verifier needs no re-serialization."""
    body = json.dumps(message.model_dump(mode="json", exclude={"sig"}), separators=(",", ":"), allow_nan=False).encode()
    return body[:-1] + _SIG + signature(body, token).encode() + b'"}'


def _unsigned(payload: bytes) -> tuple[bytes, bytes]:
    """(the signed bytes, the signature) of a payload whose last member is ``"sig"``."""
    at = payload.rfind(_SIG)
    if at < 0 or not payload.endswith(b'"}') or len(payload) - at != len(_SIG) + 64 + 2:
        return payload, b""
    return payload[:at] + b"}", payload[at + len(_SIG) : -2]


def decode(name: str, payload: bytes, token_of: Callable[[str, str], str | None]) -> tuple[Topic, Message]:
    """Check one device message end to end; ``token_of(fleet, device)`` is the device's token or
    None for an unknown device. Raises ProtocolError naming the first thing wrong."""
    where = parse_topic(name)
    if where.kind not in SCHEMAS:
        raise ProtocolError(f"topic {name!r}: devices do not publish {where.kind!r}")
    limit = MAX_REQUEST_BYTES if where.kind in REQUEST_KINDS else MAX_PAYLOAD_BYTES
    if len(payload) > limit:
        raise ProtocolError(f"payload of {len(payload)} bytes: over the limit of {limit}")
    try:
        message = SCHEMAS[where.kind].model_validate_json(payload)
    except ValidationError as err:
        first = err.errors()[0]
        if first["type"] == "json_invalid":
            raise ProtocolError(f"payload is not JSON ({first['msg']})") from None
        if first["type"] == "model_type":
            raise ProtocolError("payload is not a JSON object") from None
        raise ProtocolError(f"{where.kind} schema: {'.'.join(map(str, first['loc'])) or 'message'}: {first['msg']}") from None
    if message.device != where.device:
        raise ProtocolError(f"device {message.device!r} published under {where.device!r}'s topic")
    token = token_of(where.fleet, where.device)
    if token is None:
        raise ProtocolError(f"unknown device {where.device!r} in fleet {where.fleet!r}")
    body, sig = _unsigned(payload)
    if not hmac.compare_digest(sig, signature(body, token).encode()):
        raise ProtocolError(f"bad signature from {where.device!r}")
    return where, message


class _BatchItem(_Strict):
    kind: Literal["telemetry", "result", "status", "event"]
    payload: str  # its size is checked per item (decode), so one oversized item fails alone


class _Batch(_Strict):
    v: Literal[1] = 1
    items: list[_BatchItem] = Field(min_length=1, max_length=MAX_BATCH_ITEMS)


def encode_batch(items: list[tuple[str, bytes]]) -> bytes:
    """One publish carrying several messages, each (kind, its signed payload as ``encode`` made it):
    the transport batches a backlog so a broker handles one message instead of many. Each item
    keeps its own key and signature; the server stores and acknowledges them one by one."""
    batch = _Batch(items=[_BatchItem(kind=kind, payload=payload.decode()) for kind, payload in items])
    return batch.model_dump_json().encode()


def decode_batch(name: str, payload: bytes, token_of: Callable[[str, str], str | None]
                 ) -> list[tuple[Topic, Message, bytes] | ProtocolError]:
    """The messages of a batch published on ``name`` (a device's batch topic), each checked as
    ``decode`` checks it under the device's own topic for its kind: (topic, message, payload), or
    the ProtocolError that item raised. The batch itself wrong raises ProtocolError."""
    where = parse_topic(name)
    if where.kind != BATCH_KIND:
        raise ProtocolError(f"topic {name!r}: not a batch topic")
    if len(payload) > MAX_BATCH_BYTES:
        raise ProtocolError(f"payload of {len(payload)} bytes: over the limit of {MAX_BATCH_BYTES}")
    try:
        batch = _Batch.model_validate_json(payload)
    except ValidationError as err:
        first = err.errors()[0]
        raise ProtocolError(f"batch schema: {'.'.join(map(str, first['loc'])) or 'message'}: {first['msg']}") from None
    out: list[tuple[Topic, Message, bytes] | ProtocolError] = []
    for item in batch.items:
        body = item.payload.encode()
        try:
            inner, message = decode(topic(where.fleet, where.device, item.kind), body, token_of)
            out.append((inner, message, body))
        except ProtocolError as err:
            out.append(err)
    return out


def mqtt_address(url: str, field: str = "broker") -> tuple[str, int]:
    """(host, port) of ``mqtt://HOST:PORT`` (port 1883 when not given) or ``mqtts://HOST:PORT``
    (MQTT over TLS, port 8883 when not given); anything else is a ConfigError naming ``field``."""
    parts = urlsplit(url)
    try:
        port = (8883 if parts.scheme == "mqtts" else 1883) if parts.port is None else parts.port
    except ValueError:  # a port that is not a number, or out of range
        port = 0
    if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname or not 1 <= port <= 65535:
        raise ConfigError(field, url, "must be mqtt://HOST:PORT or mqtts://HOST:PORT (PORT in 1..65535)")
    return parts.hostname, port


def mqtt_tls(url: str) -> bool:
    """Whether a broker URL asks for TLS (``mqtts://``)."""
    return urlsplit(url).scheme == "mqtts"


@dataclass(frozen=True)
class TlsFiles:
    """What a TLS client trusts and shows: ``ca_file`` (PEM; default the system's CAs), and for
    mutual TLS its own ``cert_file`` and ``key_file``. Used for mqtts:// brokers and https:// servers."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def context(self) -> ssl.SSLContext:
        try:
            ctx = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
            if self.cert_file is not None:
                ctx.load_cert_chain(str(self.cert_file), str(self.key_file) if self.key_file else None)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError("tls", str(self.ca_file or self.cert_file), f"cannot be loaded ({e})") from None
        return ctx


# ---- target states on the wire (client–server speculative decoding) ----


def encode_states(states: np.ndarray) -> str:
    """The wire form of (m, hidden) states: per token a float16 scale then ``hidden`` int8 values
    (symmetric, round to nearest), base64. Half the bytes of float16; the draft's logits move by
    far less than its own error."""
    x = np.asarray(states, dtype=np.float32)
    scale = np.maximum(np.abs(x).max(-1, keepdims=True), 1e-8) / 127  # (m, 1)
    scale16 = scale.astype("<f2")
    q = np.clip(np.rint(x / scale16.astype(np.float32)), -127, 127).astype(np.int8)
    rows = np.concatenate([scale16.view(np.int8).reshape(len(x), 2), q], 1) if len(x) else np.zeros((0, 2), np.int8)
    return base64.b64encode(rows.tobytes()).decode()


def decode_states(data: str, hidden: int) -> np.ndarray:
    """(m, hidden) float32 from ``encode_states``' wire form."""
    raw = np.frombuffer(base64.b64decode(data), dtype=np.int8)
    if raw.size % (hidden + 2):
        raise BundleError(f"target states of {raw.size} bytes: not whole rows of {hidden} values and a scale")
    rows = raw.reshape(-1, hidden + 2)
    scale = rows[:, :2].copy().view("<f2").astype(np.float32)  # (m, 1)
    return rows[:, 2:].astype(np.float32) * scale
