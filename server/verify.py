"""Client–server speculative decoding, the server's half: verification sessions over the target.

    sessions = VerifySessions(target, max_sessions=64, ttl_s=600)
    response = sessions.verify("dev-1", VerifyRequest(session="s1", start=0, tokens=prompt, draft=[5, 9, 2]))

A session, per (device, session id), holds the verified token history and the target's KV cache
of every history token but the last (``models.speculative._CachedLM``); one round feeds the last
history token and the draft in one target forward, keeps what the acceptance rule keeps
(``edge.speculative``, the same functions the single-host loop uses) and rolls the cache back.
Sessions are capped in number and in tokens held and expire after ``ttl_s`` idle; the least
recently used goes first. A request about a session the server no longer holds, or whose
``start`` is not the server's history length, is refused (``SessionLost``: HTTP 409) and the client
resends its history from 0, which rebuilds it. Sessions are keyed by the authenticated device, so
one device can neither read nor disturb another's.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge.errors import TrickleError
from edge.protocol import VerifyRequest, VerifyResponse
from edge.speculative import accept_greedy, accept_tests, distribution


class SessionLost(TrickleError):
    """The server does not hold this session at this point of its history: resend it from 0."""


class BadVerify(TrickleError):
    """A verification request the target cannot serve (a token out of its vocabulary, too long)."""


@dataclass
class _Session:
    lm: Any  # models.speculative._CachedLM
    history: list[int] = field(default_factory=list)
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    used: float = field(default_factory=time.monotonic)


class VerifySessions:
    """The target and its verification sessions (thread-safe: one round at a time per server)."""

    def __init__(self, target: Any, max_sessions: int = 64, ttl_s: float = 600.0, max_tokens: int = 1 << 16,
                 moa: Any = None) -> None:
        self.target = target
        self.moa = moa  # a models.moa.MoADraft: its Layer Self-Attention runs here, states go to the device
        self.vocab = int(target.config.vocab_size)
        self.context = int(getattr(target.config, "max_position_embeddings", 1 << 30))
        self.max_sessions, self.ttl_s, self.max_tokens = max_sessions, ttl_s, max_tokens
        self.sessions: OrderedDict[tuple[str, str], _Session] = OrderedDict()
        self.lock = threading.Lock()
        self.evicted = 0

    def _evict(self, now: float) -> None:
        for key in [k for k, s in self.sessions.items() if now - s.used > self.ttl_s]:
            del self.sessions[key]
            self.evicted += 1
        while len(self.sessions) > self.max_sessions or sum(len(s.history) for s in self.sessions.values()) > self.max_tokens:
            self.sessions.popitem(last=False)
            self.evicted += 1

    def verify(self, owner: str, req: VerifyRequest) -> VerifyResponse:
        from models.speculative import _CachedLM

        bad = [t for t in (*req.tokens, *req.draft) if t >= self.vocab]
        if bad:
            raise BadVerify(f"token {bad[0]} is outside the target's vocabulary of {self.vocab}")
        if req.q is not None and len(req.q) != len(req.draft):
            raise BadVerify(f"q has {len(req.q)} probabilities for {len(req.draft)} draft tokens")
        if req.temperature > 0 and req.draft and req.q is None:
            raise BadVerify("sampling (temperature > 0) needs q, the draft's probability of each draft token")
        with self.lock:
            now = time.monotonic()
            self._evict(now)
            key = (owner, req.session)
            session = self.sessions.get(key)
            if req.start == 0:  # a (re)start: the history is what the client sends (held once it checks out)
                session = _Session(_CachedLM(self.target), rng=np.random.default_rng(req.seed))
                session.lm.reset()
            elif session is None:
                raise SessionLost(f"session {req.session!r} is not held here (evicted or never started): "
                                  "resend the history from start 0")
            elif req.start != len(session.history):
                raise SessionLost(f"session {req.session!r} holds {len(session.history)} tokens, the request starts at "
                                  f"{req.start}: resend the history from start 0")
            history = session.history + req.tokens
            if not history:
                raise BadVerify("nothing to verify after: the history is empty (send the prompt as tokens)")
            if len(history) + len(req.draft) > self.context:
                raise BadVerify(f"history of {len(history)} + draft of {len(req.draft)} tokens is over the target's "
                                f"context of {self.context}")
            self.sessions[key] = session
            started = time.perf_counter()
            session.lm.crop(len(history) - 1)
            if session.lm.cached < len(history) - 1:  # new history tokens: into the cache, but the last
                session.lm.logits(history, upto=len(history) - 1)
            logits = session.lm.logits(history + req.draft).numpy()  # (K + 1, V): after the last history token, each draft token
            took = (time.perf_counter() - started) * 1e3
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
            session.history = history + kept
            session.lm.crop(len(session.history) - 1)
            session.used = time.monotonic()
            self.sessions.move_to_end(key)
            states = None
            if req.states_from is not None:
                states = self._states(session, req.states_from)
            return VerifyResponse(accepted=n, next=result, p=p_out, history=len(session.history), target_ms=took,
                                  states=states, states_from=req.states_from if states is not None else None)

    def _states(self, session: _Session, start: int) -> str | None:
        """The device's MoA draft's target states of history tokens start.. in the target's cache."""
        import torch

        from edge.lm_draft import encode_states

        if self.moa is None:
            raise BadVerify("states_from: this server has no MoA draft to compute target states with (serve --draft)")
        upto = session.lm.cached
        if start > upto:
            raise BadVerify(f"states_from = {start}: the target holds states of {upto} history tokens")
        if start == upto:
            return encode_states(np.zeros((0, self.moa.project.out_features)))
        with torch.inference_mode():
            states = self.moa.target_states(session.lm.cache, upto, start)[0].float().numpy()
        return encode_states(states)
