"""Speculative-decoding sessions per device (``server.llm.verify``: ``_admit``): one device opening
sessions replaces its own, never another device's under its fair share; a device never waits for
others' idle sessions to expire; each eviction is counted by its cause."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from edge.contract.protocol import ROUTES, VerifyRequest
from server.llm.verify import SessionNotHeldError, VerifySessions
from server.ports import free_port
from server.service import ServeConfig, Service
from tests.language import Models


def _target(models: Models) -> object:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(models.target, local_files_only=True).eval()


def _open(sessions: VerifySessions, owner: str, session: str) -> int:
    """A new session of ``owner`` (a 3-token prompt, a 1-token draft): its history length."""
    return sessions.verify(owner, VerifyRequest(session=session, start=0, tokens=[5, 6, 7], draft=[8])).history


def _held(sessions: VerifySessions, owner: str) -> list[str]:
    return [name for device, name in sessions.sessions if device == owner]


def test_one_device_opening_80_sessions_over_http_evicts_none_of_another_s(models: Models, tmp_path: Path) -> None:
    """The probe of issue 49: device A opens 80 sessions (the pool holds 64) while device B's session
    is live; B's next round is still answered (200, not 409), and no session crossed devices."""
    config = ServeConfig(state_dir=tmp_path, port=free_port(), mqtt_port=free_port(), llm=models.target)
    with Service(config).background() as service:
        admin = {"Authorization": f"Bearer {(tmp_path / 'admin.token').read_text().strip()}"}
        auth = {}
        for device in ("a", "b"):
            r = httpx.post(config.url + ROUTES["devices"], json={"device": device}, headers=admin)
            auth[device] = {"Authorization": f"Bearer {r.json()['token']}"}
        with httpx.Client(base_url=config.url, timeout=30) as http:
            r = http.post(ROUTES["verify"], json={"session": "live", "start": 0, "tokens": [1, 2, 3], "draft": [4]},
                          headers=auth["b"])
            assert r.status_code == 200, r.text
            history = r.json()["history"]
            for i in range(80):
                r = http.post(ROUTES["verify"], json={"session": f"s{i}", "start": 0, "tokens": [5, 6], "draft": [7]},
                              headers=auth["a"])
                assert r.status_code == 200, r.text
            r = http.post(ROUTES["verify"], json={"session": "live", "start": history, "tokens": [], "draft": [9]},
                          headers=auth["b"])
            assert r.status_code == 200, r.text
            assert r.json()["history"] > history
        assert service.state.llm is not None
        sessions = service.state.llm.sessions()
        quota = sessions.max_sessions_per_device
        assert quota == 8 and sessions.max_sessions == 64
        assert _held(sessions, "a") == [f"s{i}" for i in range(80 - quota, 80)]  # its own newest
        assert sessions.evictions["own"] == 80 - quota and sessions.evicted_across_devices == 0


def test_a_full_pool_takes_room_only_from_devices_over_their_fair_share(models: Models) -> None:
    """Pool 4, quota 2: A and B fill it. C's first session takes the least recently used of a device
    over the fair share (4 // 3 = 1 each: A's oldest); C's second replaces its own (C would be over);
    D then takes B's oldest (B is the one over), and a device at its share loses nothing."""
    sessions = VerifySessions(_target(models), max_sessions=4, max_sessions_per_device=2)
    for owner in ("a", "b"):
        for i in range(2):
            _open(sessions, owner, f"{owner}{i}")
    _open(sessions, "c", "c0")
    assert (_held(sessions, "a"), _held(sessions, "b"), _held(sessions, "c")) == (["a1"], ["b0", "b1"], ["c0"])
    assert sessions.evicted_across_devices == 1 and sessions.evictions["fair_share"] == 1
    _open(sessions, "c", "c1")
    assert (_held(sessions, "a"), _held(sessions, "b"), _held(sessions, "c")) == (["a1"], ["b0", "b1"], ["c1"])
    assert sessions.evictions["own"] == 1 and sessions.evicted_across_devices == 1
    _open(sessions, "d", "d0")
    assert (_held(sessions, "a"), _held(sessions, "b"), _held(sessions, "c"), _held(sessions, "d")) == (
        ["a1"], ["b1"], ["c1"], ["d0"])
    assert sessions.evicted_across_devices == 2 and len(sessions.sessions) == 4
    with pytest.raises(SessionNotHeldError, match="'b0' is not held"):  # the evicted one asks for its history again
        sessions.verify("b", VerifyRequest(session="b0", start=4, draft=[1]))


def test_a_device_at_its_quota_replaces_its_own_and_idle_sessions_expire(models: Models) -> None:
    """Quota 3 of a pool of 64: a device's fourth session replaces its own least recently used one
    (the one it used last stays); sessions idle past ttl_s are dropped as expired."""
    sessions = VerifySessions(_target(models), max_sessions_per_device=3, ttl_s=0.2)
    held = {name: _open(sessions, "a", name) for name in ("x", "y", "z")}
    sessions.verify("a", VerifyRequest(session="x", start=held["x"], draft=[3]))  # x is now the most recent
    _open(sessions, "a", "w")
    assert _held(sessions, "a") == ["z", "x", "w"] and sessions.evictions["own"] == 1
    import time

    time.sleep(0.3)
    _open(sessions, "b", "v")  # a round: the idle ones go first
    assert list(sessions.sessions) == [("b", "v")] and sessions.evictions["expired"] == 3
    assert sessions.evicted == 4 and sessions.evicted_across_devices == 0


def test_the_token_cap_takes_from_the_device_holding_the_most(models: Models) -> None:
    """Over max_tokens, the heaviest device loses its least recently used session, whoever grew."""
    sessions = VerifySessions(_target(models), max_tokens=100)
    sessions.verify("big", VerifyRequest(session="p", start=0, tokens=list(range(3, 43)), draft=[]))
    sessions.verify("big", VerifyRequest(session="q", start=0, tokens=list(range(3, 43)), draft=[]))
    _open(sessions, "small", "s")  # 41 + 41 + 5 tokens: under the cap
    sessions.verify("small", VerifyRequest(session="t", start=0, tokens=list(range(3, 23)), draft=[]))  # 108 > 100
    assert _held(sessions, "big") == ["q"] and _held(sessions, "small") == ["s", "t"]
    assert sessions.evictions["tokens"] == 1 and sessions.evicted_across_devices == 1


def test_quotas_out_of_range_are_one_clear_error(models: Models) -> None:
    target = _target(models)
    for bad in ({"max_sessions_per_device": 0}, {"max_sessions": 4, "max_sessions_per_device": 5}, {"max_sessions": 0}):
        with pytest.raises(ValueError, match="need 1 <= max_sessions_per_device <= max_sessions"):
            VerifySessions(target, **bad)  # type: ignore[arg-type]
