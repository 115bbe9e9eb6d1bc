"""Client–server speculative decoding, the server's half: verification sessions over the target.

    sessions = VerifySessions(target, max_sessions=64, ttl_s=600)
    response = sessions.verify("dev-1", VerifyRequest(session="s1", start=0, tokens=prompt, draft=[5, 9, 2]))

A session, per (device, session id), holds the verified token history and the target's KV cache
of every history token but the last (``models.lm.cache.CachedLM``); one round feeds the new
history tokens, the last one and the draft in one target forward, keeps what the acceptance rule
keeps (``edge.llm.acceptance``, the same functions the single-host loop uses) and rolls the cache back.
Sessions expire after ``ttl_s`` idle and are capped in number, per device and in tokens held
(``_admit``), so that no device can push out another's: a device at its quota
(``max_sessions_per_device``) replaces its own least recently used session; when the whole pool
(``max_sessions``) is full, a new session takes the place of the least recently used session of a
device holding more than its fair share (``max_sessions // devices holding any``), or the device's own
when it is the one over. With the pool full and the new device under its share, some other device is
over its share (pigeonhole), so nobody waits for others' idle sessions to expire; another device's
session is pushed out only then (counted: ``evicted_across_devices``), or when the pool is smaller
than the number of devices. Over ``max_tokens``, the device holding the most tokens loses its least
recently used session. A request about a session the server no longer holds, or whose
``start`` is not the server's history length, is refused (``SessionNotHeldError``: HTTP 409) and the client
resends its history from 0, which rebuilds it. Sessions are keyed by the authenticated device, so
one device can neither read nor disturb another's.

Generation (``generate``: the device's "API only" block): after its verification a round stays in
the worker and decodes one token per step, each step batched with whatever other rounds are
waiting — continuous batching — until it has its tokens; then it is answered. Overload: a round
with a draft that finds ``overload`` rounds already waiting is not verified; the server decodes
instead and says so (``speculation: refused``), and the device asks for blocks.

Batching: requests are queued to one worker thread, which takes every request waiting (one per
session, at most ``max_batch``) into one target forward. Requests that arrive while the target is
busy with a round are verified together in the next. The sequences differ in cached length and
in new tokens, so the batch is padded: each session's cache is copied into a (B, heads, L_max, d)
cache, the new tokens into a (B, N_max) block, and a 4-D attention mask lets row i see its own
cache (the first c_i slots) and its own new tokens causally; positions are each row's own. Each
session then takes back its cache with its new keys and values. One request alone takes the
unpadded path.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge.contract.protocol import VerifyRequest, VerifyResponse
from edge.core.errors import TrickleError
from edge.llm.acceptance import accept_greedy, accept_tests, distribution

EVICTION_CAUSES = ("expired", "own", "fair_share", "tokens")  # VerifySessions.evictions' keys, see _admit


class SessionNotHeldError(TrickleError):
    """The server does not hold this session at this point of its history: resend it from 0."""


class BadVerifyError(TrickleError):
    """A verification request the target cannot serve (a token out of its vocabulary, too long)."""


@dataclass
class _Session:
    lm: Any  # a models.lm.cache.CachedLM
    history: list[int] = field(default_factory=list)
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    used: float = field(default_factory=time.monotonic)


@dataclass
class _Job:
    owner: str
    req: VerifyRequest
    done: threading.Event = field(default_factory=threading.Event)
    result: VerifyResponse | None = None
    error: BaseException | None = None
    refused: bool = False  # the server was overloaded: the draft was not verified
    # set while the round runs
    key: tuple[str, str] = ("", "")
    session: _Session | None = None
    history: list[int] = field(default_factory=list)
    # after the verification, when the request asked the server to generate: one token per batched step
    outcome: VerifyResponse | None = None
    remaining: int = 0
    generated: list[int] = field(default_factory=list)
    generate_ms: float = 0.0

    @property
    def draft(self) -> list[int]:
        """The tokens fed after the history in this step: the draft, none while generating."""
        return [] if self.outcome is not None else self.req.draft


def answer(sessions: VerifySessions | None, owner: str, req: VerifyRequest) -> tuple[int, str, VerifyResponse | None]:
    """One verification as (status, detail, response), the same over HTTP and MQTT: 200 with the
    response, 409 session lost, 400 a request the target cannot serve, 404 no language model."""
    if sessions is None:
        return 404, "this server serves no language model (start it with trickle serve --llm DIR)", None
    try:
        return 200, "", sessions.verify(owner, req)
    except SessionNotHeldError as err:
        return 409, str(err), None
    except BadVerifyError as err:
        return 400, str(err), None


class VerifySessions:
    """The target and its verification sessions (thread-safe; rounds are batched across sessions)."""

    def __init__(self, target: Any, max_sessions: int = 64, ttl_s: float = 600.0, max_tokens: int = 1 << 16,
                 moa: Any = None, max_batch: int = 16, overload: int | None = None,
                 max_sessions_per_device: int | None = None) -> None:
        per_device = max(1, max_sessions // 8) if max_sessions_per_device is None else max_sessions_per_device
        if max_sessions < 1 or not 1 <= per_device <= max_sessions:
            raise ValueError(f"max_sessions = {max_sessions}, max_sessions_per_device = {per_device}: need "
                             "1 <= max_sessions_per_device <= max_sessions")
        self.target = target
        self.moa = moa  # a models.lm.moa.MoADraft: its Layer Self-Attention runs here, states go to the device
        self.vocab = int(target.config.vocab_size)
        self.context = int(getattr(target.config, "max_position_embeddings", 1 << 30))
        self.max_sessions, self.ttl_s, self.max_tokens, self.max_batch = max_sessions, ttl_s, max_tokens, max_batch
        self.max_sessions_per_device = per_device
        self.sessions: OrderedDict[tuple[str, str], _Session] = OrderedDict()  # least recently used first
        self.evictions = dict.fromkeys(EVICTION_CAUSES, 0)  # sessions dropped, by cause (_admit)
        self.evicted_across_devices = 0  # of those, sessions of one device dropped to make room for another's
        self.overload = overload if overload is not None else 2 * max_batch  # rounds waiting beyond which drafts are refused
        self.rounds = 0  # target forwards
        self.verified = 0  # requests verified in them
        self.generated = 0  # tokens the server decoded itself in them (``generate``)
        self._pending: list[_Job] = []
        self._cond = threading.Condition()
        self._worker: threading.Thread | None = None

    def verify(self, owner: str, req: VerifyRequest) -> VerifyResponse:
        """One round for ``owner``'s session: queued, verified in the next batch, answered."""
        bad = [t for t in (*req.tokens, *req.draft) if t >= self.vocab]
        if bad:
            raise BadVerifyError(f"token {bad[0]} is outside the target's vocabulary of {self.vocab}")
        if req.q is not None and len(req.q) != len(req.draft):
            raise BadVerifyError(f"q has {len(req.q)} probabilities for {len(req.draft)} draft tokens")
        if req.temperature > 0 and req.draft and req.q is None:
            raise BadVerifyError("sampling (temperature > 0) needs q, the draft's probability of each draft token")
        job = _Job(owner, req)
        with self._cond:
            if req.draft and len(self._pending) >= self.overload:  # too busy to verify: decode instead
                job.req = req.model_copy(update={"draft": [], "q": None, "generate": max(req.generate, len(req.draft))})
                job.refused = True
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="trickle-verify", daemon=True)
                self._worker.start()
            self._pending.append(job)
            self._cond.notify()
        job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
                batch: list[_Job] = []
                rest: list[_Job] = []
                keys: set[tuple[str, str]] = set()
                for job in self._pending:  # one request per session per round, in arrival order
                    key = (job.owner, job.req.session)
                    if key in keys or len(batch) >= self.max_batch:
                        rest.append(job)
                    else:
                        batch.append(job)
                        keys.add(key)
                self._pending = rest
            try:
                self._round(batch)
            except Exception as err:  # a bug or the target failing: each waiting request learns it
                for job in batch:
                    if job.result is None and job.error is None:
                        job.error = err
            going = [job for job in batch if job.result is None and job.error is None]  # still generating
            if going:
                with self._cond:
                    self._pending = going + self._pending  # their next step goes first
            for job in batch:
                if job not in going:
                    job.done.set()

    @property
    def evicted(self) -> int:
        """Sessions dropped so far, whatever the cause."""
        return sum(self.evictions.values())

    def _drop(self, key: tuple[str, str], cause: str, for_owner: str) -> None:
        del self.sessions[key]
        self.evictions[cause] += 1
        self.evicted_across_devices += key[0] != for_owner

    def _expire(self, now: float) -> None:
        for key in [k for k, s in self.sessions.items() if now - s.used > self.ttl_s]:
            self._drop(key, "expired", key[0])

    def _admit(self, key: tuple[str, str]) -> None:
        """Make room after storing session ``key`` (new, or grown): the quotas of the module doc. At
        most one session goes for the count (one came in), as many as it takes for the tokens."""
        owner = key[0]
        mine = [k for k in self.sessions if k[0] == owner]  # least recently used first; ``key`` is last
        if len(mine) > self.max_sessions_per_device:
            self._drop(mine[0], "own", owner)
        elif len(self.sessions) > self.max_sessions:
            held = Counter(k[0] for k in self.sessions)
            fair = max(1, self.max_sessions // len(held))
            if held[owner] > fair:
                self._drop(mine[0], "own", owner)
            else:  # someone else is over its share, unless the pool is smaller than the number of devices
                over = [k for k in self.sessions if held[k[0]] > fair]
                self._drop(over[0] if over else next(k for k in self.sessions if k[0] != owner), "fair_share", owner)
        tokens = Counter[str]()
        for (device, _), session in self.sessions.items():
            tokens[device] += len(session.history)
        while tokens.total() > self.max_tokens:
            heaviest = tokens.most_common(1)[0][0]
            victim = next(k for k in self.sessions if k[0] == heaviest)
            tokens[heaviest] -= len(self.sessions[victim].history)
            self._drop(victim, "tokens", owner)

    def _open(self, job: _Job) -> None:
        """The job's session and history, or its error (SessionNotHeldError, BadVerifyError)."""
        from models.lm.cache import CachedLM

        req = job.req
        job.key = (job.owner, req.session)
        session = self.sessions.get(job.key)
        if req.start == 0:  # a (re)start: the history is what the client sends (held once it checks out)
            session = _Session(CachedLM(self.target, keep_hidden=True), rng=np.random.default_rng(req.seed))
            session.lm.reset()
        elif session is None:
            raise SessionNotHeldError(f"session {req.session!r} is not held here (evicted or never started): "
                              "resend the history from start 0")
        elif req.start != len(session.history):
            raise SessionNotHeldError(f"session {req.session!r} holds {len(session.history)} tokens, the request starts at "
                              f"{req.start}: resend the history from start 0")
        history = session.history + req.tokens
        if not history:
            raise BadVerifyError("nothing to verify after: the history is empty (send the prompt as tokens)")
        if len(history) + len(req.draft) > self.context:
            raise BadVerifyError(f"history of {len(history)} + draft of {len(req.draft)} tokens is over the target's "
                            f"context of {self.context}")
        if req.states_from is not None and req.state_kind == "moa" and self.moa is None:
            raise BadVerifyError("a MoA device draft: this server serves no MoA draft, so it cannot compute the target states "
                                 "the device's draft reads (serve its MoA draft: trickle serve --draft, or use a bundle "
                                 "of the draft this server serves)")
        if req.states_from is not None and req.states_from > len(history):
            raise BadVerifyError(f"states_from = {req.states_from}: past the history of {len(history)} tokens")
        job.session, job.history = session, history

    def _round(self, batch: list[_Job]) -> None:
        self._expire(time.monotonic())
        ready = []
        for job in batch:
            try:
                if job.outcome is None:  # a new round (a job generating has its session open)
                    self._open(job)
                ready.append(job)
            except (SessionNotHeldError, BadVerifyError) as err:
                job.error = err
        if not ready:
            return
        started = time.perf_counter()
        for job in ready:
            assert job.session is not None
            job.session.lm.crop(len(job.history) - 1)
        all_logits = self._logits(ready)
        took = (time.perf_counter() - started) * 1e3
        self.rounds += 1
        for job, logits in zip(ready, all_logits):
            if job.outcome is None:
                self.verified += 1
                job.outcome = self._finish(job, logits, took)
                job.remaining = job.req.generate if job.outcome.next is not None else 0
            else:
                self._step(job, logits[-1], took)
            assert job.session is not None
            job.history = job.session.history
            if job.remaining <= 0 or len(job.history) >= self.context:
                job.result = self._complete(job)

    def _step(self, job: _Job, logits: np.ndarray, took: float) -> None:
        """One token the server decodes itself for a job that asked to ``generate``."""
        session, req = job.session, job.req
        assert session is not None
        if req.temperature == 0:
            token = int(logits.argmax())
        else:
            p = distribution(logits, req.temperature, req.top_p)
            token = int(session.rng.choice(len(p), p=p))
        session.history = [*session.history, token]  # the cache holds every token but this one
        job.generated.append(token)
        job.remaining -= 1
        job.generate_ms += took
        self.generated += 1

    def _complete(self, job: _Job) -> VerifyResponse:
        """The job's answer: the verification's outcome, the tokens generated, the target states."""
        req, session, outcome = job.req, job.session, job.outcome
        assert session is not None and outcome is not None
        states = self._states(session, req.states_from, req.state_kind) if req.states_from is not None else None
        return outcome.model_copy(update={
            "history": len(session.history), "generated": job.generated, "generate_ms": job.generate_ms,
            "load": len(self._pending), "speculation": "refused" if job.refused else "ok",
            "states": states, "states_from": req.states_from if states is not None else None})

    def _logits(self, jobs: list[_Job]) -> list[np.ndarray]:
        """Per job, the (K + 1, V) target logits after its last history token and each draft token,
        in one target forward (each session's cache then holds its new tokens)."""
        if len(jobs) == 1:  # unpadded
            job = jobs[0]
            assert job.session is not None
            seq = job.history + job.draft
            return [job.session.lm.logits(seq).numpy()[-len(job.draft) - 1 :]]
        from models.lm.cache import batched_logits

        lms = [job.session.lm for job in jobs]  # type: ignore[union-attr]  # _open gave every job its session
        feeds = [(job.history + job.draft)[lm.cached :] for job, lm in zip(jobs, lms)]
        logits = batched_logits(self.target, lms, feeds)  # in inference mode, as every CachedLM forward
        return [z[len(feed) - len(job.draft) - 1 :].double().numpy() for z, feed, job in zip(logits, feeds, jobs)]

    def _finish(self, job: _Job, logits: np.ndarray, took: float) -> VerifyResponse:
        req, session = job.req, job.session
        assert session is not None
        draft = np.array(req.draft, dtype=np.int64)
        p_out = None
        if req.temperature == 0:
            n, nxt = accept_greedy(draft, logits.argmax(-1))
            kept: list[int] = [*req.draft[:n], nxt]
            result: int | None = nxt
        else:
            p = distribution(logits, req.temperature, req.top_p)
            n, result = accept_tests(draft, np.array(req.q or [], dtype=np.float64), p, session.rng)
            kept = [*req.draft[:n], *([result] if result is not None else [])]
            if result is None:
                p_out = [float(x) for x in p[n]]
        session.history = job.history + kept
        session.lm.crop(len(session.history) - 1)
        session.used = time.monotonic()
        self.sessions[job.key] = session
        self.sessions.move_to_end(job.key)
        self._admit(job.key)
        return VerifyResponse(accepted=n, next=result, p=p_out, history=len(session.history), target_ms=took)

    def _states(self, session: _Session, start: int, kind: str = "moa") -> str:
        """The target states (``kind``: the MoA draft's or the target's features) of history
        tokens start.. that the target's cache holds."""
        import torch

        from edge.contract.protocol import encode_states

        upto = session.lm.cached  # >= start: _open refused a states_from past the history
        if kind == "features":  # the target's last hidden states, as EAGLE-style drafts read them
            assert session.lm.hidden is not None
            return encode_states(session.lm.hidden[start:upto].float().numpy())
        assert self.moa is not None  # _open refused MoA states without a MoA draft
        if start == upto:
            return encode_states(np.zeros((0, self.moa.project.out_features)))
        with torch.inference_mode():
            states = self.moa.target_states(session.lm.cache, upto, start)[0].float().numpy()
        return encode_states(states)
