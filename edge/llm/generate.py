"""Client–server speculative decoding, the device's half (numpy only: no torch on a device).

    link = HttpVerifyLink("http://server:8080", token)
    result = generate(draft, link, prompt_ids, max_new_tokens=64, k=4)
    result.tokens, result.verified, result.divergences

The device drafts K tokens with its own model (``Draft``: next-token logits after a token
sequence), sends them to the server (``edge.contract.protocol.VerifyRequest``), and gets back how many the
target keeps and its next token (``server.llm.verify``). Greedy output is the target's own greedy
output; sampling splits speculative sampling exactly: the server runs the accept tests with the
draft's probabilities of its tokens, and after a rejection the device draws the correction from
norm(max(0, p − q)) with its own q (``edge.llm.acceptance.accept_tests`` and ``residual``).

Auto mode (``auto=True``) decides each round between drafting (adaptive K) and asking the server
to decode the rest itself (``VerifyRequest.generate``: the server's decode steps batched with
other sessions', one round trip for the whole block): whichever gives more expected tokens per
second by the round trip, the server's time per token and the acceptance rate measured so far
(``LinkEstimates``, kept across generations over one link). While the round trip is unknown, and
for a while after the server refused a draft as overloaded (``speculation: refused``), it asks
for blocks.

What the server answers decides what happens next (``refused``):

- it cannot be reached (connection refused, dropped or timed out; 408, 429, 5xx): generation goes
  on with the draft alone; those tokens are *pending*, not verified. The link is tried again after
  K such tokens and at least ``retry_s``, and at the end until it answers or fails once more; when
  it answers, the pending text is sent as one long draft. Where the target disagrees, the
  divergence is recorded and, with ``on_divergence="correct"``, the pending text from there is
  discarded for the target's; with ``"keep"`` it is kept, *unverified*, and verification goes on
  from it. Pending text the server never saw again is *unchecked*;
- it lost the session (409: evicted, restarted): the whole history is sent again, at once;
- it refuses the request (400, 401, 403, 404, 413, 422: a draft of a kind it cannot feed, a
  token it does not know, the target's context exceeded, no language model): ``generate`` raises
  ``VerifyRefusedError`` with the server's reason and the text made so far; retrying cannot help.

``Generation`` counts verified, kept and unchecked tokens; ``on_text`` tells each change
(``TextChange``) so that a device shows only text that stays, and marks what is unverified.
"""

from __future__ import annotations

import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from edge.contract.protocol import (
    MAX_DRAFT,
    MAX_GENERATE,
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
from edge.llm.acceptance import AcceptanceRate, best_draft_length, distribution, residual
from edge.llm.cost import expected_tokens


class Draft(ABC):
    """A device's draft model as ``generate`` drives it: next-token logits after a token sequence.
    A draft that reads the target's states (``wants_states``: MoA, EAGLE-style) names which
    (``state_kind``), their width (``hidden``) and how many it holds (``states_held``), and takes
    each round's new ones (``add_states``)."""

    wants_states: bool = False
    state_kind: Literal["moa", "features"] = "moa"
    hidden: int = 0

    @property
    def states_held(self) -> int:
        """How many history tokens' target states the draft holds."""
        return 0

    def reset(self) -> None:  # noqa: B027 - a draft without per-sequence state has nothing to forget
        """Forget the sequence (a new generation)."""

    @abstractmethod
    def next_logits(self, tokens: list[int]) -> np.ndarray:
        """(V,) logits of the token after ``tokens``."""

    def add_states(self, start: int, states: np.ndarray) -> None:
        """Target states of history tokens start.. (m, hidden)."""
        raise LinkError(f"{type(self).__name__} reads no target states")


class SessionLostError(LinkError):
    """The server no longer holds the session (HTTP 409): resend the history from the start."""


class VerifyRefusedError(LinkError):
    """The server refused a verification that no retry mends (HTTP 400, 401, 403, 404, 413, 422,
    or the same status over MQTT): ``status`` and ``detail`` are its; ``generation`` is what
    ``generate`` made up to the refusal (None when raised by a link)."""

    def __init__(self, status: int, detail: str) -> None:
        self.status, self.detail = status, detail
        self.generation: Generation | None = None
        if status == 401:
            cause = f"the server does not know this device's token (HTTP 401: {detail})"
        elif status == 403:
            cause = f"the server does not let this device verify (HTTP 403: {detail})"
        else:
            cause = f"the server refused the verification (HTTP {status}): {detail}"
        super().__init__(cause)


def refused(status: int) -> bool:
    """Whether a status refuses the request itself (a client error no retry mends), as opposed to
    a server or link that is down or busy (408 timeout, 429 too many requests, 5xx) or a lost
    session (409)."""
    return 400 <= status < 500 and status not in (408, 409, 429)


def _detail(body: Any, fallback: str) -> str:
    """The server's reason, one line: FastAPI's ``detail`` (a string, or the list of 422 errors)."""
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):
        detail = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg', '')}" if isinstance(e, dict)
                           else str(e) for e in detail)
    text = str(detail) if detail else fallback
    return " ".join(text.split())[:500]


class VerifyLink(Protocol):
    """The way to the server's verification: HTTP (``HttpVerifyLink``) or MQTT (``MqttVerifyLink``)."""

    def verify(self, request: VerifyRequest) -> VerifyResponse:
        """One round; SessionLostError on 409, VerifyRefusedError when the server refuses the
        request (``refused``), LinkError when it cannot be reached."""

    def close(self) -> None:
        """Release the connection."""


class HttpVerifyLink:
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
        if r.status_code == 200:
            try:
                return VerifyResponse.model_validate_json(r.content)
            except ValueError as err:
                raise LinkError(f"verification: not a verification answer ({err})") from None
        try:
            body = r.json()
        except ValueError:
            body = None
        detail = _detail(body, r.text or r.reason_phrase)
        if r.status_code == 409:
            raise SessionLostError(detail)
        if refused(r.status_code):
            raise VerifyRefusedError(r.status_code, detail)
        raise LinkError(f"verification failed: HTTP {r.status_code}: {detail}")

    def close(self) -> None:
        self.client.close()


class MqttVerifyLink:
    """Verification over MQTT: a signed ``VerifyCall`` on the device's ``verify`` topic, the
    ``VerifyReply`` with the same id on ``verified`` (QoS 0 both ways: a lost message is a
    timeout, and the round falls back to the draft alone).

    ``MqttVerifyLink.connect(broker, fleet, device, token)`` opens its own connection;
    ``MqttVerifyLink(link.client, fleet, device, token)`` shares an ``edge.agent.link.Link``'s (which
    subscribes to ``verified`` with the device's other topics), so a device that already talks
    MQTT needs no second connection."""

    def __init__(self, client: Any, fleet: str, device: str, token: str, timeout_s: float = 5.0) -> None:
        self.client, self.fleet, self.device, self.token, self.timeout_s = client, fleet, device, token, timeout_s
        self._replies: dict[str, tuple[Any, list[VerifyReply]]] = {}
        self._lock = threading.Lock()
        self._own = False
        client.message_callback_add(topic(fleet, device, "verified"), self._on_reply)

    @classmethod
    def connect(cls, broker: str, fleet: str, device: str, token: str, timeout_s: float = 5.0) -> MqttVerifyLink:
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
        if refused(reply.status):
            raise VerifyRefusedError(reply.status, _detail({"detail": reply.detail}, "no reason given"))
        if reply.status != 200 or reply.result is None:
            raise LinkError(f"verification failed: {reply.status}: {reply.detail}")
        return reply.result

    def close(self) -> None:
        self.client.message_callback_remove(topic(self.fleet, self.device, "verified"))
        if self._own:
            self.client.disconnect()
            self.client.loop_stop()


@dataclass
class Generation:
    """What ``generate`` made: ``tokens`` (after the prompt). Each is *verified* (the target's
    choice there), *kept* (not verified but it stays: after the target disagreed with text drafted
    offline, ``on_divergence="keep"``; with no server, every token) or *unchecked* (drafted offline
    and never seen by the target: the server could not be reached again before the end; always the
    last ``unchecked`` tokens). ``divergences``: positions in ``tokens`` where re-verification found
    the target disagreeing with text drafted offline; ``offline_tokens``: tokens the draft made
    alone, those discarded since included."""

    tokens: list[int] = field(default_factory=list)
    verified: int = 0
    kept: int = 0
    unchecked: int = 0
    server_calls: int = 0
    offline_tokens: int = 0
    divergences: list[int] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def unverified(self) -> int:
        """Tokens the target did not verify: kept and unchecked."""
        return self.kept + self.unchecked

    @property
    def settled_tokens(self) -> list[int]:
        """The tokens without the unchecked tail: verified and kept, what stays whatever happens."""
        return self.tokens[: len(self.tokens) - self.unchecked]

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class TextChange:
    """One change to the text while ``generate`` runs (``on_text``). The text is a settled part,
    which stays, followed by a pending part: tokens drafted offline that the target may yet replace.

    - ``verified``: ``tokens``, verified, join the settled part (nothing is pending then);
    - ``drafted``: ``tokens``, drafted offline, join the pending part;
    - ``confirmed``: the target agrees with the first ``len(tokens)`` pending tokens: they leave the
      pending part and join the settled part, verified;
    - ``discarded``: the target disagrees with the first pending token: the whole pending part
      (``tokens``) is thrown away, and the target's text follows (``on_divergence="correct"``);
    - ``kept``: ``tokens`` join the settled part unverified: the whole pending part after the
      target disagreed with its first token (``on_divergence="keep"``), or with no server each
      token the draft makes.

    Pending tokens left when ``generate`` returns are its ``Generation.unchecked`` tail."""

    kind: Literal["verified", "drafted", "confirmed", "discarded", "kept"]
    tokens: list[int]


@dataclass
class LinkEstimates:
    """What a device has measured of its link and server, kept across generations (pass the same
    object to every ``generate`` over one link): the round trip without the server's time, the
    server's time per token it decodes itself and per verification, the draft's acceptance."""

    rtt_s: float | None = None
    server_token_s: float | None = None
    verify_s: float | None = None
    acceptance: AcceptanceRate = field(default_factory=AcceptanceRate)
    refused_at: float = -1e9  # when the server last refused to verify a draft (overloaded)

    def observe(self, round_s: float, answer: VerifyResponse) -> None:
        server_s = (answer.target_ms + answer.generate_ms) / 1e3
        self.rtt_s = _ewma(self.rtt_s, max(round_s - server_s, 0.0))
        self.verify_s = _ewma(self.verify_s, answer.target_ms / 1e3)
        if answer.generated:
            self.server_token_s = _ewma(self.server_token_s, answer.generate_ms / 1e3 / len(answer.generated))
        if answer.speculation == "refused":
            self.refused_at = time.monotonic()

    def prefer_blocks(self, rate: float, k_max: int, token_s: float, left: int, refusal_s: float = 10.0) -> bool:
        """Whether asking the server for the remaining ``left`` tokens beats drafting: by expected
        tokens per second of a speculative round against those of one block; yes while the round
        trip is unknown (a block then measures it at no loss) or the server refused drafts lately."""
        if self.rtt_s is None or time.monotonic() - self.refused_at < refusal_s:
            return True
        verify = self.verify_s or 0.0
        step = self.server_token_s if self.server_token_s is not None else verify
        k = best_draft_length(rate, k_max, self.rtt_s + verify, token_s)
        speculative = expected_tokens(rate, k) / (k * token_s + self.rtt_s + verify)
        return left / (self.rtt_s + verify + (left - 1) * step) > speculative


def _ewma(old: float | None, new: float, weight: float = 0.3) -> float:
    return new if old is None else (1 - weight) * old + weight * new


@dataclass(frozen=True)
class DecodeOptions:
    """How ``generate`` decodes: ``k`` tokens drafted per round (at most ``k`` when ``adaptive``:
    ``best_draft_length`` from the measured round time, time per drafted token and acceptance);
    ``temperature`` 0 is greedy, else speculative sampling with ``top_p`` from ``seed``; the
    server ``session`` (a fresh one when None); ``retry_s``: how long the link rests after a
    failure; ``on_divergence``: replace offline text the target disagrees with (``"correct"``)
    or keep it (``"keep"``); ``auto``: each round, draft (adaptive K) or ask the server to decode the
    rest itself (``LinkEstimates.prefer_blocks``: measured round trip, server speed, acceptance)."""

    k: int = 4
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    session: str | None = None
    retry_s: float = 1.0
    on_divergence: Literal["correct", "keep"] = "correct"
    adaptive: bool = False
    auto: bool = False


def generate(draft: Draft, link: VerifyLink | None, prompt: list[int], max_new_tokens: int, k: int = 4,
             temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, session: str | None = None,
             retry_s: float = 1.0, on_divergence: Literal["correct", "keep"] = "correct", adaptive: bool = False,
             on_tokens: Callable[[list[int], bool], None] | None = None, auto: bool = False,
             estimates: LinkEstimates | None = None, on_text: Callable[[TextChange], None] | None = None
             ) -> Generation:
    """``max_new_tokens`` after ``prompt`` by client–server speculative decoding (see the module
    doc; the settings are ``DecodeOptions``'); ``link`` None is the draft alone. ``on_text``
    tells every change to the text (``TextChange``); ``on_tokens(tokens, verified)`` only new
    tokens, as the target verifies them (True) or the draft makes them alone (False).
    ``estimates``: what earlier generations over the same link measured (auto mode decides with
    them; they are updated). Raises ``VerifyRefusedError`` (its ``generation``: the text so far)
    when the server refuses a request."""
    options = DecodeOptions(k, temperature, top_p, seed, session, retry_s, on_divergence, adaptive, auto)
    decoder = Decoder(draft, link, options, estimates)
    if on_tokens is not None:
        decoder.listeners.append(_new_tokens(on_tokens, link is None))
    if on_text is not None:
        decoder.listeners.append(on_text)
    return decoder.run(prompt, max_new_tokens)


def _new_tokens(on_tokens: Callable[[list[int], bool], None], alone: bool) -> Callable[[TextChange], None]:
    """``on_tokens``'s view of the changes: tokens verified (True) or made by the draft alone (False)."""
    def tell(change: TextChange) -> None:
        if change.kind == "verified":
            on_tokens(change.tokens, True)
        elif change.kind == "drafted" or (alone and change.kind == "kept"):
            on_tokens(change.tokens, False)
    return tell


class Decoder:
    """One generation's state: the history (prompt, settled tokens, then pending ones drafted
    offline), the draft's q of each offline token, what the server holds, and the link's running
    estimates. ``listeners`` are told every ``TextChange``."""

    def __init__(self, draft: Draft, link: VerifyLink | None, options: DecodeOptions,
                 estimates: LinkEstimates | None = None) -> None:
        self.draft, self.link, self.options = draft, link, options
        self.rng = np.random.default_rng(options.seed)
        self.session = options.session or uuid.uuid4().hex
        self.estimates = estimates or LinkEstimates()
        self.acceptance = self.estimates.acceptance if options.auto else AcceptanceRate()
        self.round_s, self.token_s = 0.05, 0.005  # running estimates (priors)
        self.listeners: list[Callable[[TextChange], None]] = []

    def run(self, prompt: list[int], max_new_tokens: int) -> Generation:
        if self.options.k < 1 or max_new_tokens < 0 or not prompt:
            raise ValueError(f"k = {self.options.k}, max_new_tokens = {max_new_tokens}, prompt of {len(prompt)} tokens: "
                             "need k >= 1, max_new_tokens >= 0 and a non-empty prompt")
        self.draft.reset()
        self.prompt_len = len(prompt)
        self.history = list(prompt)
        self.q_rows: list[np.ndarray | None] = [None] * len(prompt)  # the draft's q of each token it drew offline
        self.settled = len(prompt)  # history[:settled] stays (the prompt, verified and kept tokens); the rest is pending
        self.kept = 0  # settled tokens the target did not verify
        self.server_has = 0  # the server's history length, as far as the device knows
        self.end = len(prompt) + max_new_tokens
        self.out = Generation()
        self.next_try, self.offline_left = 0.0, 0  # when, and after how many tokens alone, the link is tried again
        self.started = time.perf_counter()
        try:
            while len(self.history) < self.end or (self.link is not None and self.settled < len(self.history)):
                done = len(self.history) >= self.end  # but some of it is pending: the link's last chance
                if self.link is not None and (done or (self.offline_left == 0 and time.monotonic() >= self.next_try)):
                    if not self._round(self.link) and done:
                        break  # the server cannot be reached: the pending text stays unchecked
                else:
                    self._offline_token()
        except VerifyRefusedError as err:
            err.generation = self._result()
            raise
        return self._result()

    def _result(self) -> Generation:
        out = self.out
        out.seconds = time.perf_counter() - self.started
        out.tokens = self.history[self.prompt_len : self.end]
        settled = min(self.settled, self.end) - self.prompt_len
        out.kept, out.unchecked = self.kept, len(out.tokens) - settled
        out.verified = settled - self.kept
        return out

    def _tell(self, kind: Literal["verified", "drafted", "confirmed", "discarded", "kept"], tokens: list[int]) -> None:
        if tokens:
            change = TextChange(kind, list(tokens))
            for listener in self.listeners:
                listener(change)

    def _draw(self, tokens: list[int]) -> tuple[int, np.ndarray | None]:
        logits = self.draft.next_logits(tokens)
        if self.options.temperature == 0:
            return int(np.argmax(logits)), None
        q = distribution(logits, self.options.temperature, self.options.top_p)
        return int(self.rng.choice(len(q), p=q)), q

    def _offline_token(self) -> None:
        """The draft alone, one token: pending (kept at once with no server)."""
        self.offline_left = max(self.offline_left - 1, 0)
        token, q = self._draw(self.history)
        self.history.append(token)
        self.q_rows.append(q)
        self.out.offline_tokens += 1
        if self.link is None:  # nothing will ever verify it
            self.settled, self.kept = len(self.history), self.kept + 1
            self._tell("kept", [token])
        else:
            self._tell("drafted", [token])

    def _rest(self) -> None:
        """The link failed: k tokens alone at least, then ``retry_s``."""
        self.next_try, self.offline_left = time.monotonic() + self.options.retry_s, self.options.k

    def _drafted(self) -> tuple[list[int], list[np.ndarray | None], list[int]]:
        """(this round's draft, its q rows, the history it follows): the pending text when there
        is some, else up to k new tokens."""
        pending = self.history[self.settled :]
        if pending:  # back online: the pending text is this round's draft
            return pending[:MAX_DRAFT], self.q_rows[self.settled : self.settled + MAX_DRAFT], self.history[: self.settled]
        o = self.options
        adaptive = o.adaptive or o.auto
        want = best_draft_length(self.acceptance.rate, o.k, self.round_s, self.token_s) if adaptive else o.k
        drafted: list[int] = []
        qs: list[np.ndarray | None] = []
        t0 = time.perf_counter()
        for _ in range(min(want, self.end - len(self.history) - 1)):
            token, q = self._draw(self.history + drafted)
            drafted.append(token)
            qs.append(q)
        if drafted:
            self.token_s = 0.8 * self.token_s + 0.2 * (time.perf_counter() - t0) / len(drafted)
        return drafted, qs, self.history

    def _round(self, link: VerifyLink) -> bool:
        """Draft (or take the pending text), verify, and take what the target kept. False when the
        server could not be reached (the link rests); VerifyRefusedError when it refused."""
        offline = self.settled < len(self.history)
        o = self.options
        left = self.end - len(self.history)
        block = o.auto and not offline and self.estimates.prefer_blocks(self.acceptance.rate, o.k, self.token_s, left)
        drafted, qs, base = ([], [], self.history) if block else self._drafted()
        q_of = None if o.temperature == 0 else [float(q[t]) for q, t in zip(qs, drafted) if q is not None]
        assert q_of is None or len(q_of) == len(drafted)  # every token drawn at a temperature has its q
        request = VerifyRequest(session=self.session, start=self.server_has, tokens=base[self.server_has :], draft=drafted,
                                q=q_of, temperature=o.temperature, top_p=o.top_p, seed=o.seed,
                                # a block of the whole rest leaves nothing to draft: no target states to carry
                                states_from=self.draft.states_held if self.draft.wants_states and not block else None,
                                state_kind=self.draft.state_kind, generate=min(left - 1, MAX_GENERATE) if block else 0)
        t0 = time.perf_counter()
        try:
            answer = link.verify(request)
        except SessionLostError:
            if self.server_has:  # evicted, or the server restarted: the whole history again, at once
                self.server_has = 0
                return True
            self._rest()  # a 409 to a request from start 0: a server that cannot hold sessions
            return False
        except VerifyRefusedError:
            raise
        except LinkError:
            self._rest()
            return False
        took = time.perf_counter() - t0
        self.estimates.observe(took, answer)
        if not block:
            self.round_s = 0.8 * self.round_s + 0.2 * took
        self.out.server_calls += 1
        if answer.states is not None and answer.states_from is not None:
            self.draft.add_states(answer.states_from, decode_states(answer.states, self.draft.hidden))
        correction = self._correction(answer, qs)
        if offline:
            self._reverified(answer, drafted, correction)
        else:
            self._verified(answer, drafted, correction)
        return True

    def _correction(self, answer: VerifyResponse, qs: list[np.ndarray | None]) -> int:
        """The token after the kept ones: the target's, or after a rejection in sampling the one the
        device draws from the residual with its own q."""
        if answer.next is not None:
            return answer.next
        q_rejected = qs[answer.accepted]
        if answer.p is None or q_rejected is None:
            raise LinkError("the server rejected a sampled draft token without sending its distribution")
        return residual(np.array(answer.p), q_rejected, self.rng)

    def _verified(self, answer: VerifyResponse, drafted: list[int], correction: int) -> None:
        """A round of new draft tokens: the kept ones and the correction join the history."""
        n = answer.accepted
        if drafted and answer.speculation == "ok":
            self.acceptance.update(n, len(drafted))
        made = [*drafted[:n], correction, *answer.generated]
        added = made[: self.end - len(self.history)]
        self.history += added
        self.q_rows += [None] * len(added)
        # the server holds what did not fit too; were there another round, it would start over
        self.settled, self.server_has = len(self.history), answer.history if len(added) == len(made) else 0
        self._tell("verified", added)

    def _reverified(self, answer: VerifyResponse, drafted: list[int], correction: int) -> None:
        """A round re-verifying the pending text (or its first MAX_DRAFT tokens): where the target
        disagrees, a divergence."""
        n, history, start = answer.accepted, self.history, self.settled
        at = start + n  # the first pending token the target did not keep (or the chunk's end)
        if at < len(history) and (n < len(drafted) or history[at] != correction):
            self.out.divergences.append(at - self.prompt_len)
            self._tell("confirmed", history[start:at])
            if self.options.on_divergence == "correct":
                self._tell("discarded", history[at:])
                del history[at:], self.q_rows[at:]
                history.append(correction)
                self.q_rows.append(None)
                self.settled, self.server_has = len(history), answer.history
                self._tell("verified", [correction])
            else:  # keep the device's text; the server learns it with the whole history next round
                self.kept += len(history) - at
                self._tell("kept", history[at:])
                self.settled, self.server_has = len(history), 0
            return
        if at < len(history):  # a chunk's end where the target agrees with the next pending token
            self.settled, self.server_has = at + 1, answer.history
            self._tell("confirmed", history[start : at + 1])
            return
        self._tell("confirmed", history[start:at])  # all of it kept: the target's next token follows
        self.settled, self.server_has = at, 0
        if at < self.end:
            history.append(correction)
            self.q_rows.append(None)
            self.settled, self.server_has = at + 1, answer.history
            self._tell("verified", [correction])
