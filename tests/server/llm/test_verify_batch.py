"""Verification batched across sessions (``server.llm.verify``): requests that wait together go
through one padded target forward, which gives each session the logits and the cache it would
have had alone; many device loops at once still get the target's own greedy output."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from edge.contract.protocol import VerifyRequest, VerifyResponse
from edge.llm.generate import generate
from server.llm.verify import BadVerifyError, SessionNotHeldError, VerifySessions, _Job
from tests.language import Models
from tests.server.llm.test_verify import TorchDraft, _greedy


def _target(models: Models) -> object:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(models.target, local_files_only=True).eval()


def test_a_padded_batch_gives_each_session_its_own_logits_and_cache(models: Models) -> None:
    target = _target(models)
    solo, batched = VerifySessions(target), VerifySessions(target)
    # sessions of different cached lengths: some new (start 0), some continuing with new tokens
    openings = [("a", list(range(3, 40))), ("b", [7, 8]), ("c", list(range(60, 75)))]
    held = {}
    for sessions in (solo, batched):
        for name, prompt in openings:
            held[name] = sessions.verify("dev", VerifyRequest(session=name, start=0, tokens=prompt, draft=[1, 2])).history
    rounds = [VerifyRequest(session="a", start=held["a"], tokens=[5], draft=[9, 9, 9, 9]),
              VerifyRequest(session="b", start=held["b"], tokens=[11, 12, 13], draft=[4]),
              VerifyRequest(session="c", start=held["c"], draft=[]),
              VerifyRequest(session="d", start=0, tokens=list(range(100, 130)), draft=[6, 6, 6])]
    jobs = [_Job("dev", req) for req in rounds]
    for job in jobs:
        batched._open(job)
        assert job.session is not None
        job.session.lm.crop(len(job.history) - 1)
    got = batched._logits(jobs)
    for job, logits in zip(jobs, got):
        alone = _Job("dev", job.req)
        solo._open(alone)
        assert alone.session is not None
        alone.session.lm.crop(len(alone.history) - 1)
        (want,) = solo._logits([alone])
        np.testing.assert_allclose(logits, want, atol=1e-9)
        assert job.session is not None and job.session.lm.cached == alone.session.lm.cached
        np.testing.assert_allclose(job.session.lm.hidden.numpy(), alone.session.lm.hidden.numpy(), atol=1e-9)
        for mine, theirs in zip(job.session.lm.cache.layers, alone.session.lm.cache.layers):
            np.testing.assert_allclose(mine.keys.numpy(), theirs.keys.numpy(), atol=1e-9)
            np.testing.assert_allclose(mine.values.numpy(), theirs.values.numpy(), atol=1e-9)


class DirectLink:
    """The device loop's Link straight onto VerifySessions (the HTTP path is tested elsewhere)."""

    def __init__(self, sessions: VerifySessions, owner: str, barrier: threading.Barrier | None = None) -> None:
        self.sessions, self.owner, self.barrier, self.rounds = sessions, owner, barrier, 0

    def verify(self, request: VerifyRequest) -> VerifyResponse:
        self.rounds += 1
        if self.barrier is not None and self.rounds <= 4:
            self.barrier.wait(timeout=60)  # the clients' first rounds arrive together
        return self.sessions.verify(self.owner, request)


def test_many_clients_at_once_are_batched_and_each_gets_the_targets_greedy_output(models: Models) -> None:
    sessions = VerifySessions(_target(models))
    prompts = [[1, 5, 9, 40], [7], list(range(20, 50)), [3, 3, 3]]
    barrier = threading.Barrier(len(prompts))
    out: dict[int, list[int]] = {}
    rounds: dict[int, int] = {}

    errors: list[BaseException] = []
    drafts = [TorchDraft(models.draft) for _ in prompts]  # loaded here: loading sets torch's default dtype, globally

    def client(i: int) -> None:
        try:
            result = generate(drafts[i], DirectLink(sessions, f"d{i}", barrier), prompts[i], 16, k=1)
            out[i], rounds[i] = result.tokens, result.server_calls
        except BaseException as err:  # reported below, with its cause
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not [e for e in errors if not isinstance(e, threading.BrokenBarrierError)], errors
    for i, prompt in enumerate(prompts):
        assert out[i] == _greedy(models.target, prompt, 16), i
    assert sessions.verified == sum(rounds.values())
    assert sessions.rounds <= sessions.verified - 4  # rounds that arrived together shared target forwards


def test_errors_in_a_batch_stay_with_their_own_request(models: Models, tmp_path: Path) -> None:
    sessions = VerifySessions(_target(models))
    sessions.verify("d1", VerifyRequest(session="s", start=0, tokens=[1, 2, 3], draft=[4]))
    held = sessions.sessions[("d1", "s")].history
    jobs = [_Job("d1", VerifyRequest(session="s", start=99, draft=[1])),  # foreign start: lost
            _Job("d2", VerifyRequest(session="s", start=len(held), draft=[1])),  # another device's session id: lost
            _Job("d1", VerifyRequest(session="t", start=0, tokens=[1], draft=[2], states_from=0)),  # no MoA here
            _Job("d3", VerifyRequest(session="u", start=0, tokens=[5, 6], draft=[7, 8]))]
    sessions._round(jobs)
    assert isinstance(jobs[0].error, SessionNotHeldError) and isinstance(jobs[1].error, SessionNotHeldError)
    assert isinstance(jobs[2].error, BadVerifyError) and jobs[3].error is None and jobs[3].result is not None
    assert sessions.sessions[("d1", "s")].history == held  # untouched by the refused requests
    with pytest.raises(SessionNotHeldError):
        sessions.verify("d2", VerifyRequest(session="s", start=len(held), draft=[1]))


def test_generation_rounds_are_batched_step_by_step_with_other_sessions(models: Models) -> None:
    """``generate``: the server decodes the block itself, one token per step, each step in the same
    forward as the other sessions' steps (continuous batching); the text is the target's greedy one."""
    sessions = VerifySessions(_target(models))
    prompts = [[1, 5, 9, 40], [7], list(range(20, 50))]
    barrier = threading.Barrier(len(prompts))
    out: dict[int, VerifyResponse] = {}

    def client(i: int) -> None:
        barrier.wait(timeout=60)
        out[i] = sessions.verify(f"d{i}", VerifyRequest(session="s", start=0, tokens=prompts[i], generate=15))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for i, prompt in enumerate(prompts):
        got = out[i]
        assert [got.next, *got.generated] == _greedy(models.target, prompt, 16), i
        assert got.history == len(prompt) + 16 and got.generate_ms > 0 and got.speculation == "ok"
    assert sessions.generated == 3 * 15
    assert sessions.rounds < 3 * 16 - 10  # most steps shared a forward
    # the session goes on from the generated text: a draft after it is verified as usual
    more = sessions.verify("d0", VerifyRequest(session="s", start=out[0].history, draft=[1, 2], generate=3))
    assert more.history == out[0].history + more.accepted + 1 + 3


def test_an_overloaded_server_refuses_to_verify_and_decodes_instead(models: Models) -> None:
    sessions = VerifySessions(_target(models), overload=0)  # always overloaded
    prompt = [1, 5, 9, 40]
    got = sessions.verify("d", VerifyRequest(session="s", start=0, tokens=prompt, draft=[3, 3, 3, 3]))
    assert got.speculation == "refused" and got.accepted == 0
    assert [got.next, *got.generated] == _greedy(models.target, prompt, 5)  # the draft's length, and the next token
