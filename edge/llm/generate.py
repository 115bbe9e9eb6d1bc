"""Client–server speculative decoding, the device's half (numpy only: no torch on a device).

    link = HttpLink("http://server:8080", token)
    result = generate(draft, link, prompt_ids, max_new_tokens=64, k=4)
    result.tokens, result.verified, result.divergences

The device drafts K tokens with its own model (``DraftModel``: next-token logits after a token
sequence), sends them to the server (``edge.contract.protocol.VerifyRequest``), and gets back how many the
target keeps and its next token (``server.llm.verify``). Greedy output is the target's own greedy
output; sampling splits speculative sampling exactly: the server runs the accept tests with the
draft's probabilities of its tokens, and after a rejection the device draws the correction from
norm(max(0, p − q)) with its own q (``edge.llm.acceptance.accept_tests`` and ``residual``).

When the server cannot be reached (refused, timed out, dropped), generation goes on with the draft
alone; those tokens are *unverified*. The link is tried again after K such tokens and at least
``retry_s``, and once more at the end; when it answers,
the unverified suffix is sent as one long draft. Where the target disagrees, the divergence is
recorded and, with ``on_divergence="correct"``, the text from there is replaced by the target's
(``"keep"`` keeps the device's text and verifies onwards from it). A server that lost the session
(409) gets the whole history again, which rebuilds it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from edge.contract.protocol import (
    MAX_DRAFT,
    ROUTES,
    VerifyCall,
    VerifyReply,
    VerifyRequest,
    VerifyResponse,
    decode_states,
    encode,
    mqtt_address,
    topic,
)
from edge.core.errors import LinkError
from edge.llm.acceptance import distribution, residual


class DraftModel(Protocol):
    def next_logits(self, tokens: list[int]) -> np.ndarray:
        """(V,) logits of the token after ``tokens``."""


class SessionLostError(LinkError):
    """The server no longer holds the session (HTTP 409): resend the history from the start."""


class Link(Protocol):
    def verify(self, request: VerifyRequest) -> VerifyResponse:
        """One round; LinkError when the server cannot be reached, SessionLostError on 409."""

    def close(self) -> None:
        """Release the connection."""


class HttpLink:
    """Verification over HTTP (httpx, one keep-alive connection), the device's bearer token."""

    def __init__(self, url: str, token: str, timeout_s: float = 5.0) -> None:
        import httpx

        self.client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)

    def verify(self, request: VerifyRequest) -> VerifyResponse:
        import httpx

        try:
            r = self.client.post(ROUTES["verify"], content=request.model_dump_json(),
                                 headers={"content-type": "application/json"})
        except httpx.HTTPError as err:
            raise LinkError(f"verification: {type(err).__name__}: {err}") from None
        if r.status_code == 409:
            raise SessionLostError(r.json().get("detail", "session lost"))
        if r.status_code != 200:
            raise LinkError(f"verification refused: HTTP {r.status_code}: {r.text[:200]}")
        return VerifyResponse.model_validate_json(r.content)

    def close(self) -> None:
        self.client.close()


class MqttLink:
    """Verification over MQTT: a signed ``VerifyCall`` on the device's ``verify`` topic, the
    ``VerifyReply`` with the same id on ``verified`` (QoS 0 both ways: a lost message is a
    timeout, and the round falls back to the draft alone).

    ``MqttLink.connect(broker, fleet, device, token)`` opens its own connection;
    ``MqttLink(link.client, fleet, device, token)`` shares an ``edge.agent.link.Link``'s (which
    subscribes to ``verified`` with the device's other topics), so a device that already talks
    MQTT needs no second connection."""

    def __init__(self, client: Any, fleet: str, device: str, token: str, timeout_s: float = 5.0) -> None:
        self.client, self.fleet, self.device, self.token, self.timeout_s = client, fleet, device, token, timeout_s
        self._replies: dict[str, tuple[Any, list[VerifyReply]]] = {}
        self._lock = threading.Lock()
        self._own = False
        client.message_callback_add(topic(fleet, device, "verified"), self._on_reply)

    @classmethod
    def connect(cls, broker: str, fleet: str, device: str, token: str, timeout_s: float = 5.0) -> MqttLink:
        """Its own paho connection to ``mqtt://HOST:PORT`` as ``device``; LinkError when refused."""
        import paho.mqtt.client as mqtt

        host, port = mqtt_address(broker)
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{device}.{uuid.uuid4().hex[:8]}")
        client.username_pw_set(device, token)
        client.reconnect_delay_set(1, 5)
        ready, refused = threading.Event(), []

        def on_connect(c: Any, userdata: object, flags: object, reason: Any, properties: object) -> None:
            if reason.is_failure:
                refused.append(str(reason))
            else:
                c.subscribe(topic(fleet, device, "verified"), qos=0)
            ready.set()

        client.on_connect = on_connect
        link = cls(client, fleet, device, token, timeout_s)
        link._own = True
        try:
            client.connect(host, port, keepalive=30)
        except OSError as err:
            raise LinkError(f"MQTT broker {broker}: {err}") from None
        client.loop_start()
        if not ready.wait(timeout_s) or refused:
            link.close()
            raise LinkError(f"MQTT broker {broker} refused {device!r}: {refused[0] if refused else 'no answer'}")
        return link

    def _on_reply(self, client: Any, userdata: object, msg: Any) -> None:
        try:
            reply = VerifyReply.model_validate_json(msg.payload)
        except ValueError:
            return  # not ours to read; the waiting call times out
        with self._lock:
            waiting = self._replies.get(reply.id)
        if waiting is not None:
            waiting[1].append(reply)
            waiting[0].set()

    def verify(self, request: VerifyRequest) -> VerifyResponse:
        if not self.client.is_connected():
            raise LinkError("MQTT: not connected to the broker")
        call = VerifyCall(key=uuid.uuid4().hex, device=self.device, ts_s=time.time(), request=request)
        done: tuple[threading.Event, list[VerifyReply]] = (threading.Event(), [])
        with self._lock:
            self._replies[call.key] = done
        try:
            info = self.client.publish(topic(self.fleet, self.device, "verify"), encode(call, self.token), qos=0)
            if info.rc != 0:
                raise LinkError(f"MQTT: publishing the verification failed (paho rc {info.rc})")
            if not done[0].wait(self.timeout_s):
                raise LinkError(f"MQTT: no verification reply within {self.timeout_s:g} s")
        finally:
            with self._lock:
                del self._replies[call.key]
        reply = done[1][0]
        if reply.status == 409:
            raise SessionLostError(reply.detail or "session lost")
        if reply.status != 200 or reply.result is None:
            raise LinkError(f"verification refused: {reply.status}: {reply.detail}")
        return reply.result

    def close(self) -> None:
        self.client.message_callback_remove(topic(self.fleet, self.device, "verified"))
        if self._own:
            self.client.disconnect()
            self.client.loop_stop()


@dataclass
class Generation:
    """What ``generate`` made: ``tokens`` (after the prompt), of which the first ``verified`` the
    target verified; ``divergences``: positions in ``tokens`` where re-verification found the
    target disagreeing with text drafted offline."""

    tokens: list[int] = field(default_factory=list)
    verified: int = 0
    server_calls: int = 0
    offline_tokens: int = 0
    divergences: list[int] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds else 0.0


def generate(draft: DraftModel, link: Link | None, prompt: list[int], max_new_tokens: int, k: int = 4,
             temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, session: str | None = None,
             retry_s: float = 1.0, on_divergence: Literal["correct", "keep"] = "correct", adaptive: bool = False,
             on_tokens: Callable[[list[int], bool], None] | None = None) -> Generation:
    """``max_new_tokens`` after ``prompt`` by client–server speculative decoding (see the module
    doc); ``link`` None is the draft alone. ``on_tokens(tokens, verified)`` streams blocks.
    ``adaptive``: each round drafts ``choose_k`` tokens (at most ``k``) from the measured round
    time, the measured time per drafted token and the running acceptance rate."""
    if k < 1 or max_new_tokens < 0 or not prompt:
        raise ValueError(f"k = {k}, max_new_tokens = {max_new_tokens}, prompt of {len(prompt)} tokens: need k >= 1, "
                         "max_new_tokens >= 0 and a non-empty prompt")
    rng = np.random.default_rng(seed)
    session = session or uuid.uuid4().hex
    if hasattr(draft, "reset"):  # a draft with per-sequence caches (edge.llm.draft.OnnxMoADraft)
        draft.reset()
    history = list(prompt)
    q_rows: list[np.ndarray | None] = [None] * len(prompt)  # the draft's q of each history token it drew offline
    verified = len(prompt)  # history[:verified] is verified (the prompt counts as verified)
    server_has = 0  # the server's history length, as far as the device knows
    end = len(prompt) + max_new_tokens
    out = Generation()
    next_try = 0.0
    started = time.perf_counter()

    def draw(tokens: list[int]) -> tuple[int, np.ndarray | None]:
        logits = draft.next_logits(tokens)
        if temperature == 0:
            return int(np.argmax(logits)), None
        q = distribution(logits, temperature, top_p)
        return int(rng.choice(len(q), p=q)), q

    wants = getattr(draft, "wants_states", False)  # a MoA draft: the server sends the target's states
    round_s, token_s, kept_sum, tried_sum = 0.05, 0.005, 1.8, 3.0  # running estimates (priors)
    offline_left = 0  # tokens to draft alone before the link is tried again
    last_try = False
    while len(history) < end or (link is not None and verified < len(history) and not last_try):
        if len(history) >= end:  # done, but some of it is unverified: one last try at the link
            last_try, offline_left, next_try = True, 0, 0.0
        online = link is not None and offline_left == 0 and time.monotonic() >= next_try
        if not online:  # the draft alone, one token, unverified
            offline_left = max(offline_left - 1, 0)
            if len(history) >= end:
                break
            token, q = draw(history)
            history.append(token)
            q_rows.append(q)
            out.offline_tokens += 1
            if on_tokens is not None:
                on_tokens([token], False)
            continue
        assert link is not None
        unverified = history[verified:]
        if unverified:  # back online: the offline suffix is this round's draft
            drafted, qs = unverified[:MAX_DRAFT], q_rows[verified : verified + MAX_DRAFT]
            base = history[:verified]
        else:
            room = end - len(history) - 1
            want = choose_k(kept_sum / tried_sum, k, round_s, token_s) if adaptive else k
            drafted, qs = [], []
            t0 = time.perf_counter()
            for _ in range(min(want, room)):
                token, q = draw(history + drafted)
                drafted.append(token)
                qs.append(q)
            if drafted:
                token_s = 0.8 * token_s + 0.2 * (time.perf_counter() - t0) / len(drafted)
            base = history
        q_of = None if temperature == 0 else [float(q[t]) for q, t in zip(qs, drafted)]  # type: ignore[index]
        request = VerifyRequest(session=session, start=server_has, tokens=base[server_has:], draft=drafted, q=q_of,
                                temperature=temperature, top_p=top_p, seed=seed,
                                states_from=draft.states_held if wants else None,  # type: ignore[attr-defined]
                                state_kind=getattr(draft, "state_kind", "moa"))
        t0 = time.perf_counter()
        try:
            answer = link.verify(request)
            round_s = 0.8 * round_s + 0.2 * (time.perf_counter() - t0)
        except SessionLostError:
            if server_has:  # resend the whole history; a 409 to that too is a broken link
                server_has = 0
                continue
            next_try, offline_left = time.monotonic() + retry_s, k
            continue
        except LinkError:
            next_try, offline_left = time.monotonic() + retry_s, k  # k tokens alone at least, then retry_s
            continue
        out.server_calls += 1
        if answer.states is not None and answer.states_from is not None:
            draft.add_states(answer.states_from, decode_states(answer.states, draft.hidden))  # type: ignore[attr-defined]
        n = answer.accepted
        if answer.next is not None:
            correction = answer.next
        else:  # a rejection in sampling: the device draws the correction with its own q
            q_rejected = qs[n]
            if answer.p is None or q_rejected is None:
                raise LinkError("the server rejected a sampled draft token without sending its distribution")
            correction = residual(np.array(answer.p), q_rejected, rng)
        if not unverified:
            if drafted:  # n kept of K: n successes in n trials, + 1 failed trial unless all were kept
                kept_sum, tried_sum = 0.7 * kept_sum + n, 0.7 * tried_sum + n + (n < len(drafted))
            added = [*drafted[:n], correction][: end - len(history)]
            history += added
            q_rows += [None] * len(added)
            verified, server_has = len(history), answer.history
            if on_tokens is not None:
                on_tokens(added, True)
            continue
        # re-verification of text drafted offline
        at = verified + n  # the first offline token the target did not keep (or the chunk's end)
        if at < len(history) and (n < len(drafted) or history[at] != correction):
            out.divergences.append(at - len(prompt))
            if on_divergence == "correct":
                del history[at:], q_rows[at:]
                history.append(correction)
                q_rows.append(None)
                verified, server_has = len(history), answer.history
                if on_tokens is not None:
                    on_tokens(history[at:], True)
            else:  # keep the device's text; the server learns it with the whole history next round
                verified, server_has = len(history), 0
            continue
        if at == len(history):  # all of it kept: the target's next token follows
            history.append(correction)
            q_rows.append(None)
        verified, server_has = at + 1, answer.history  # a chunk's end where the target agrees with the next offline token
        if on_tokens is not None:
            on_tokens(history[at:verified], True)
    out.seconds = time.perf_counter() - started
    out.tokens = history[len(prompt) : end]
    out.verified = min(verified, end) - len(prompt)
    return out


def choose_k(rate: float, k_max: int, round_s: float, token_s: float) -> int:
    """The draft length in 1..k_max of most expected tokens per second: a round keeps
    ``(1 - a^(K+1)) / (1 - a)`` tokens on average (per-token acceptance ``a``) and costs the round
    trip plus K drafted tokens. A slow link (large ``round_s``) makes long blocks pay even at a
    modest acceptance rate; a fast one keeps them short, so a rejection wastes little drafting."""
    rate = min(max(rate, 0.0), 0.99)
    gain = [(1 - rate ** (k + 1)) / ((1 - rate) * (round_s + k * token_s)) for k in range(1, k_max + 1)]
    return int(np.argmax(gain)) + 1
