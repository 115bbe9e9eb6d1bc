"""The link protocol: topics, signed messages, and one clear reason for every refusal; the outbox."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from edge.agent.outbox import Outbox
from edge.contract.protocol import (
    MAX_PAYLOAD_BYTES,
    ProtocolError,
    Result,
    Telemetry,
    decode,
    device_topics,
    encode,
    parse_topic,
    topic,
)

TOKENS = {("f", "a"): "token-a", ("f", "b"): "token-b"}


def token_of(fleet: str, device: str) -> str | None:
    return TOKENS.get((fleet, device))


def test_topics_round_trip_and_bad_names_are_refused() -> None:
    assert parse_topic(topic("f", "a", "result")) == ("f", "a", "result")
    assert device_topics("f", "a") == {"publish": [f"trickle/v1/f/a/{k}" for k in ("telemetry", "result", "status", "event",
                                                                                   "verify", "batch")],
                                       "subscribe": [f"trickle/v1/f/a/{k}" for k in ("ota", "cmd", "ack", "verified")]}
    for bad in ("trickle/v1/f/a", "trickle/v2/f/a/result", "trickle/v1/f/a/nope", "trickle/v1/f/a b/result"):
        with pytest.raises(ProtocolError):
            parse_topic(bad)
    with pytest.raises(ProtocolError, match="device 'a/b'"):
        topic("f", "a/b", "result")


def test_a_signed_message_decodes_to_itself() -> None:
    msg = Result(key="a:result:0", device="a", ts_s=12.5, label="7", class_index=7, variant="int8-d00",
                 bundle_version=3, latency_s=0.002, correct=True)
    where, back = decode(topic("f", "a", "result"), encode(msg, "token-a"), token_of)
    assert where.device == "a" and back.model_dump(exclude={"sig"}) == msg.model_dump(exclude={"sig"})


@pytest.mark.parametrize(("name", "payload", "reason"), [
    (topic("f", "b", "telemetry"), encode(Telemetry(key="k", device="a", ts_s=1), "token-a"), "published under 'b'"),
    (topic("f", "b", "telemetry"), encode(Telemetry(key="k", device="b", ts_s=1), "token-a"), "bad signature"),
    (topic("g", "a", "telemetry"), encode(Telemetry(key="k", device="a", ts_s=1), "token-a"), "unknown device"),
    (topic("f", "a", "telemetry"), b"\xff\xfe", "not JSON"),
    (topic("f", "a", "telemetry"), b"[1, 2]", "not a JSON object"),
    (topic("f", "a", "telemetry"), b"{" + b" " * MAX_PAYLOAD_BYTES + b"}", "over the limit"),
    (topic("f", "a", "telemetry"), json.dumps({"v": 1, "key": "k", "device": "a", "ts_s": -1}).encode(), "ts_s"),
    (topic("f", "a", "telemetry"), json.dumps({"v": 2, "key": "k", "device": "a", "ts_s": 1}).encode(), "v"),
    (topic("f", "a", "ota"), b"{}", "devices do not publish 'ota'"),
])
def test_every_refusal_names_its_reason(name: str, payload: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        decode(name, payload, token_of)


def test_a_field_changed_after_signing_breaks_the_signature() -> None:
    fields = json.loads(encode(Telemetry(key="k", device="a", ts_s=1, voltage_v=2.5), "token-a"))
    fields["voltage_v"] = 3.3
    with pytest.raises(ProtocolError, match="bad signature"):
        decode(topic("f", "a", "telemetry"), json.dumps(fields).encode(), token_of)


def test_the_outbox_keeps_messages_and_state_across_reopening(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    box.put("k1", "t", b"one", {"cursor": "1"})
    box.put("k2", "t", b"two", {"cursor": "2"})
    box.put("k1", "t", b"again")  # a key already queued is kept as it was
    box.close()
    box = Outbox(tmp_path / "o.sqlite")
    assert [(topic_, payload) for _, topic_, payload in box.pending()] == [("t", b"one"), ("t", b"two")]
    assert box.get_state("cursor") == "2" and len(box) == 2
    assert len(box.delete_keys(["k1", "nope"])) == 1
    assert [p for _, _, p in box.pending()] == [b"two"]
    box.close()


def test_a_bulk_enqueue_is_one_transaction_and_all_or_nothing(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    box.put("k0", "t", b"zero")
    statements: list[str] = []
    box._db.set_trace_callback(statements.append)
    assert box.put_many((f"k{i}", "t", b"x") for i in range(5000)) == 4999  # k0 was queued: kept as it was
    box._db.set_trace_callback(None)
    assert [s for s in statements if s.startswith(("BEGIN", "COMMIT"))] == ["BEGIN IMMEDIATE", "COMMIT"]
    assert len(box) == 5000 and box.pending(limit=1)[0][2] == b"zero"
    with pytest.raises(sqlite3.ProgrammingError):  # one row SQLite cannot store queues none of the batch
        box.put_many([("new-1", "t", b"x"), ("new-2", "t", object())])  # type: ignore[list-item]
    assert len(box) == 5000
    box.close()


def _agent_fields(**changes: object) -> dict[str, object]:
    return {"device": "n1", "token": "t", "server": "http://127.0.0.1:8080", "broker": "mqtt://127.0.0.1:1883"} | changes


def test_the_agent_config_keeps_its_defaults_and_reads_the_token_file(tmp_path: Path) -> None:
    from edge.agent.agent import AgentConfig
    from edge.core.config import load_config

    config = AgentConfig(**_agent_fields(trusted_keys=["k.pub"]))  # type: ignore[arg-type]
    assert config.state_dir == Path("runs/edge/n1") and config.trusted_keys == [Path("k.pub")]
    assert (config.fleet, config.period_s, config.backend, config.resend_s) == ("default", 0.0, "onnxruntime", 30.0)
    assert "'t'" not in repr(config)  # the token stays out of logs
    (tmp_path / "n1.token").write_text("secret\n")
    (tmp_path / "agent.toml").write_text(f'device = "n1"\ntoken_file = "{tmp_path / "n1.token"}"\nperiod_s = 1.0\n'
                                         'server = "http://h:1"\nbroker = "mqtt://h:2"\n')
    config = load_config(AgentConfig, tmp_path / "agent.toml", ["count=5"], {"period_s": 0.5, "fleet": None})
    assert (config.token, config.period_s, config.count, config.fleet) == ("secret", 0.5, 5, "default")


@pytest.mark.parametrize(("changes", "message"), [
    ({"period_s": -1}, "period_s = -1: should be greater than or equal to 0"),
    ({"count": -2}, "count = -2"),
    ({"backend": "tensorflow"}, "backend = 'tensorflow': must be one of ['onnxruntime'"),
    ({"broker": "embedded"}, "broker = 'embedded': must be mqtt://HOST:PORT"),
    ({"broker": "mqtt://h:0"}, "broker = 'mqtt://h:0'"),
    ({"server": "ftp://h"}, "server = 'ftp://h': must be http(s)://HOST[:PORT]"),
    ({"device": "a/b"}, "device = 'a/b'"),
    ({"token": ""}, "token = ''"),
    ({"token": "", "token_file": "/no/such.token"}, "token_file = '/no/such.token': no such file"),
    ({"state": "x"}, "state = 'x': Extra inputs are not permitted"),
])
def test_a_bad_agent_config_is_one_config_error(changes: dict[str, object], message: str) -> None:
    from edge.agent.agent import AgentConfig
    from edge.core.config import load_config
    from edge.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(AgentConfig, flags=_agent_fields(**changes))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_first_samples_are_kept_once_for_self_tests(tmp_path: Path) -> None:
    import numpy as np

    from edge.agent.source import SELFTEST_VECTORS, keep_selftest_samples, stored_selftest_samples

    assert stored_selftest_samples(tmp_path) is None
    raws = [np.full(4, i, dtype=np.float32) for i in range(40)]
    keep_selftest_samples(tmp_path, raws, np.arange(40))
    keep_selftest_samples(tmp_path, raws[::-1], None)  # a later source does not replace them
    stored = stored_selftest_samples(tmp_path)
    assert stored is not None
    x, y = stored
    assert x.shape == (SELFTEST_VECTORS, 4) and y is not None and list(y) == list(range(SELFTEST_VECTORS))
    assert list(tmp_path.iterdir()) == [tmp_path / "selftest.npz"]  # written atomically, nothing else left


def test_a_verification_call_is_signed_and_may_be_larger() -> None:
    from edge.contract.protocol import MAX_PAYLOAD_BYTES, MAX_REQUEST_BYTES, VerifyCall, VerifyRequest

    long = VerifyRequest(session="s", start=0, tokens=list(range(3000)), draft=[1, 2])
    payload = encode(VerifyCall(key="c1", device="a", ts_s=1.0, request=long), "token-a")
    assert MAX_PAYLOAD_BYTES < len(payload) < MAX_REQUEST_BYTES  # a long history fits a call, not a stored message
    where, call = decode("trickle/v1/f/a/verify", payload, token_of)
    assert where.kind == "verify" and isinstance(call, VerifyCall) and call.request == long
    with pytest.raises(ProtocolError, match="bad signature"):
        decode("trickle/v1/f/a/verify", encode(VerifyCall(key="c1", device="a", ts_s=1.0, request=long), "token-b"), token_of)
    with pytest.raises(ProtocolError, match="published under"):
        decode("trickle/v1/f/b/verify", payload, token_of)


def test_a_batch_carries_signed_messages_each_checked_on_its_own() -> None:
    from edge.contract.protocol import MAX_BATCH_BYTES, Telemetry, decode_batch, encode, encode_batch

    def telemetry(device: str, i: int, token: str) -> bytes:
        return encode(Telemetry(key=f"{device}:t:{i}", device=device, ts_s=float(i), voltage_v=2.5), token)

    good = [("telemetry", telemetry("a", i, "token-a")) for i in range(3)]
    forged = ("telemetry", telemetry("b", 9, "token-b"))  # b's message in a's batch
    unsigned = ("telemetry", telemetry("a", 7, "wrong-token"))
    items = decode_batch(topic("f", "a", "batch"), encode_batch([*good, forged, unsigned]), token_of)
    assert [m[1].key for m in items[:3] if not isinstance(m, ProtocolError)] == ["a:t:0", "a:t:1", "a:t:2"]
    assert isinstance(items[3], ProtocolError) and "published under 'a'" in str(items[3])
    assert isinstance(items[4], ProtocolError) and "bad signature" in str(items[4])
    ok = items[0]
    assert not isinstance(ok, ProtocolError) and ok[2] == good[0][1]  # the item's own signed bytes, as stored
    with pytest.raises(ProtocolError, match="not a batch topic"):
        decode_batch(topic("f", "a", "result"), encode_batch(good), token_of)
    with pytest.raises(ProtocolError, match="over the limit"):
        decode_batch(topic("f", "a", "batch"), b" " * (MAX_BATCH_BYTES + 1), token_of)
    with pytest.raises(ProtocolError, match="batch schema"):
        decode_batch(topic("f", "a", "batch"), b'{"v": 1, "items": [{"kind": "verify", "payload": "{}"}]}', token_of)
