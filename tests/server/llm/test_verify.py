"""Client–server speculative decoding on a real server (``trickle serve --llm``): the device's loop
(``edge.llm.generate``, numpy only) against ``POST /v1/llm/verify``. Greedy output is the target's own
greedy output; a dropped link makes the device go on alone and re-verify when it returns; a lost
session is rebuilt; bad, foreign and unauthenticated requests are refused without disturbing others."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from bench.netem import NetemProxy
from edge.contract.protocol import ROUTES, VerifyRequest, VerifyResponse
from edge.core.errors import LinkError
from edge.llm.generate import Draft, HttpVerifyLink, LinkEstimates, generate
from tests.language import Models
from tests.server.llm.test_llm import _serve


class TorchDraft(Draft):
    """A draft model for the device's loop, here a transformers model (the device runs ONNX)."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()

    @torch.inference_mode()
    def next_logits(self, tokens: list[int]) -> np.ndarray:
        return self.model(input_ids=torch.tensor([tokens])).logits[0, -1].double().numpy()


class FlakyLink:
    """A real HttpVerifyLink whose rounds ``down`` (by index) fail as a dropped connection would."""

    def __init__(self, link: HttpVerifyLink, down: range) -> None:
        self.link, self.down, self.rounds = link, down, 0

    def verify(self, request: VerifyRequest) -> VerifyResponse:
        self.rounds += 1
        if self.rounds - 1 in self.down:
            raise LinkError("connection dropped (test)")
        return self.link.verify(request)


class LosingLink:
    """A real HttpVerifyLink; before its third round the server's session is restarted by another request."""

    def __init__(self, link: HttpVerifyLink, url: str, auth: dict[str, str]) -> None:
        self.link, self.url, self.auth, self.rounds, self.lost = link, url, auth, 0, 0

    def verify(self, request: VerifyRequest) -> VerifyResponse:
        self.rounds += 1
        if self.rounds == 3:
            httpx.post(self.url + ROUTES["verify"], json={"session": request.session, "start": 0, "tokens": [1]},
                       headers=self.auth).raise_for_status()
        try:
            return self.link.verify(request)
        except LinkError:
            self.lost += 1
            raise


@pytest.fixture(scope="module")
def server(models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    state = tmp_path_factory.mktemp("verify")
    with _serve(state, llm=models.target) as url:
        admin = {"Authorization": f"Bearer {(state / 'admin.token').read_text().strip()}"}
        tokens = {}
        for device in ("d1", "d2"):
            r = httpx.post(url + ROUTES["devices"], json={"device": device}, headers=admin)
            r.raise_for_status()
            tokens[device] = r.json()["token"]
        yield url, tokens


def _greedy(folder: Path, prompt: list[int], n: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    out = target.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    return out[0, len(prompt):].tolist()


PROMPTS = [[1, 5, 9, 40], [7], list(range(20, 50))]


def test_greedy_over_http_is_the_targets_greedy_output(server: tuple[str, dict[str, str]], models: Models) -> None:
    url, tokens = server
    draft = TorchDraft(models.draft)
    link = HttpVerifyLink(url, tokens["d1"])
    for k in (1, 4):
        for prompt in PROMPTS:
            result = generate(draft, link, prompt, 24, k=k)
            assert result.tokens == _greedy(models.target, prompt, 24) and result.verified == 24, (k, prompt)
            assert result.server_calls <= 24 and result.offline_tokens == 0
    right = generate(TorchDraft(models.target), link, PROMPTS[0], 24, k=4)  # the target as its own draft
    assert right.server_calls == 5  # 5 tokens per round


@pytest.mark.parametrize("policy", ["correct", "keep"])
def test_a_dropped_link_goes_on_offline_then_reverifies(server: tuple[str, dict[str, str]], models: Models,
                                                       policy: str) -> None:
    """Through a real TCP proxy with 20 ms of round trip: the link is cut after the first verified
    block and comes back after 3 tokens drafted alone."""
    url, tokens = server
    prompt = PROMPTS[0]
    expected = _greedy(models.target, prompt, 30)
    port = int(url.rsplit(":", 1)[1])
    with NetemProxy("127.0.0.1", port, rtt_s=0.02) as proxy:
        streamed: list[tuple[list[int], bool]] = []

        def weather(block: list[int], verified: bool) -> None:
            streamed.append((block, verified))
            if len(streamed) == 1:
                proxy.down = True
                proxy.drop()
            if sum(not v for _, v in streamed) == 3:
                proxy.down = False

        result = generate(TorchDraft(models.draft), HttpVerifyLink(proxy.url, tokens["d1"], timeout_s=2), prompt, 30, k=2,
                          retry_s=0.0, on_divergence=policy, on_tokens=weather)  # type: ignore[arg-type]
    assert result.offline_tokens >= 3 and [v for _, v in streamed][:4] == [True, False, False, False]
    if policy == "correct":  # the random draft disagrees with the target offline: corrected back to the target's text
        assert result.divergences and result.tokens == expected and result.verified == 30 and result.kept == 0
    else:  # kept: the target's text up to the divergence, the device's from there (not verified)
        first = result.divergences[0]
        assert result.tokens[:first] == expected[:first] and result.tokens[first] != expected[first]
        assert len(result.tokens) == 30 and result.kept > 0 and result.verified == 30 - result.kept


def test_the_link_down_to_the_end_leaves_the_rest_unverified(server: tuple[str, dict[str, str]], models: Models) -> None:
    url, tokens = server
    link = FlakyLink(HttpVerifyLink(url, tokens["d1"]), down=range(1, 10**6))  # only the first round gets through
    result = generate(TorchDraft(models.draft), link, PROMPTS[0], 20, k=2, retry_s=0.0)
    assert len(result.tokens) == 20 and 0 < result.verified < 20 and result.offline_tokens == 20 - result.verified
    assert result.unchecked == result.unverified == 20 - result.verified
    assert result.settled_tokens == result.tokens[: result.verified]


def test_a_lost_session_is_rebuilt_and_sessions_are_per_device(server: tuple[str, dict[str, str]], models: Models) -> None:
    url, tokens = server
    d1 = {"Authorization": f"Bearer {tokens['d1']}"}
    first = httpx.post(url + ROUTES["verify"], json={"session": "s", "start": 0, "tokens": [1, 2, 3], "draft": [4]}, headers=d1)
    assert first.status_code == 200 and first.json()["history"] in (4, 5)
    # another device cannot continue d1's session: to it, the session does not exist
    d2 = {"Authorization": f"Bearer {tokens['d2']}"}
    foreign = httpx.post(url + ROUTES["verify"], json={"session": "s", "start": first.json()["history"], "draft": [4]},
                         headers=d2)
    assert foreign.status_code == 409 and "not held here" in foreign.json()["detail"]
    # a restart the target cannot take (over its context) is refused and leaves the session as it was
    long = httpx.post(url + ROUTES["verify"], json={"session": "s", "start": 0, "tokens": [1] * 600}, headers=d1)
    assert long.status_code == 400 and "context" in long.text
    held = httpx.post(url + ROUTES["verify"], json={"session": "s", "start": first.json()["history"]}, headers=d1)
    assert held.status_code == 200 and held.json()["history"] == first.json()["history"] + 1
    stale = httpx.post(url + ROUTES["verify"], json={"session": "s", "start": 1, "draft": [4]}, headers=d1)
    assert stale.status_code == 409 and "resend the history" in stale.json()["detail"]
    for body, status, words in [
        ({"session": "s", "start": 0, "tokens": [10**6]}, 400, "outside the target's vocabulary"),
        ({"session": "s", "start": 0, "tokens": [1], "draft": [2, 3], "temperature": 0.8}, 400, "needs q"),
        ({"session": "s", "start": 0, "tokens": [1], "draft": list(range(300))}, 422, "draft"),
        ({"session": "bad session!", "start": 0, "tokens": [1]}, 422, "session"),
        ({"session": "s", "start": 0, "tokens": [1], "extra": 1}, 422, "extra"),
    ]:
        r = httpx.post(url + ROUTES["verify"], json=body, headers=d1)
        assert r.status_code == status and words in r.text, (body, r.text)
    assert httpx.post(url + ROUTES["verify"], json={"session": "s", "start": 0, "tokens": [1]}).status_code == 401
    assert httpx.post(url + ROUTES["verify"], json={"session": "s", "start": 0, "tokens": [1]},
                      headers={"Authorization": "Bearer nope"}).status_code == 401
    # the device's loop survives a lost session (here restarted under it by another request): it
    # gets a 409, resends its whole history, and goes on
    link = LosingLink(HttpVerifyLink(url, tokens["d1"]), url, d1)
    result = generate(TorchDraft(models.draft), link, PROMPTS[2], 16, k=3, session="s")
    assert result.tokens == _greedy(models.target, PROMPTS[2], 16) and link.lost == 1


def test_sampling_over_the_link_is_seeded(server: tuple[str, dict[str, str]], models: Models) -> None:
    url, tokens = server
    link = HttpVerifyLink(url, tokens["d2"])
    draft = TorchDraft(models.draft)
    a = generate(draft, link, PROMPTS[0], 20, k=3, temperature=0.8, seed=3, session="x1")
    b = generate(draft, link, PROMPTS[0], 20, k=3, temperature=0.8, seed=3, session="x2")
    assert a.tokens == b.tokens and len(a.tokens) == 20 and a.verified == 20


def test_sampling_through_the_client_draws_the_first_token_from_the_target(server: tuple[str, dict[str, str]],
                                                                           models: Models) -> None:
    """The split rule end to end: the device drafts and sends q, the server runs the accept tests,
    the device draws the correction from the residual; the first token of many seeded generations
    must follow the target's own distribution (chi-square), while a draft that differs from the
    target (total variation checked) would pull it away."""
    from scipy.stats import chisquare
    from transformers import AutoModelForCausalLM

    from edge.llm.acceptance import distribution

    url, tokens = server
    link = HttpVerifyLink(url, tokens["d2"])
    draft = TorchDraft(models.draft)
    prompt, temperature, n = PROMPTS[0], 0.05, 500
    target = AutoModelForCausalLM.from_pretrained(models.target, local_files_only=True).eval()
    with torch.inference_mode():
        p = distribution(target(input_ids=torch.tensor([prompt])).logits[0, -1].double().numpy(), temperature, 1.0)
    q = distribution(draft.next_logits(prompt), temperature, 1.0)
    assert 0.5 * np.abs(p - q).sum() > 0.3  # the draft alone would fail the test below
    first = np.array([generate(draft, link, prompt, 3, k=2, temperature=temperature, seed=s, session=f"chi{s}").tokens[0]
                      for s in range(n)])
    big = np.flatnonzero(p * n >= 5)  # bins with enough expected counts; the rest pooled
    assert len(big) >= 2

    def binned(x: np.ndarray) -> np.ndarray:
        out = np.append(x[big], x.sum() - x[big].sum())
        if p[big].sum() > 1 - 5 / n:  # too little left for a bin of its own: into the last big one
            out = np.append(out[:-2], out[-2:].sum())
        return out

    observed, expected = binned(np.bincount(first, minlength=len(p)).astype(float)), binned(p) * n
    assert chisquare(observed, expected).pvalue > 1e-3
    from scipy.stats import chi2

    drafted = binned(q) * n  # the draft's own first token, in expectation: far from the target's
    assert chi2.sf(float(((drafted - expected) ** 2 / expected).sum()), len(expected) - 1) < 1e-6


def test_adaptive_k_drafts_longer_blocks_over_a_slower_link() -> None:
    from edge.llm.acceptance import best_draft_length as choose_k

    assert choose_k(0.7, 16, round_s=0.3, token_s=0.005) > choose_k(0.7, 16, round_s=0.01, token_s=0.005)
    assert choose_k(0.95, 16, 0.1, 0.005) > choose_k(0.5, 16, 0.1, 0.005)
    assert choose_k(0.0, 16, 0.1, 0.005) == 1


def test_adaptive_k_over_the_link_is_still_the_targets_greedy_output(server: tuple[str, dict[str, str]],
                                                                    models: Models) -> None:
    url, tokens = server
    port = int(url.rsplit(":", 1)[1])
    with NetemProxy("127.0.0.1", port, rtt_s=0.1) as proxy:
        result = generate(TorchDraft(models.target), HttpVerifyLink(proxy.url, tokens["d2"]), PROMPTS[1], 24, k=12, adaptive=True)
    assert result.tokens == _greedy(models.target, PROMPTS[1], 24) and result.server_calls <= 4  # long blocks at 100 ms


def test_a_server_without_a_language_model_answers_404(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from server.api.app import create_app
    from server.api.state import ServerState
    from server.mqtt.bridge import Metrics
    from server.store.store import Store

    app = create_app(ServerState(Store(tmp_path / "db.sqlite"), "admin", tmp_path / "bundles", [], Metrics()))
    r = TestClient(app).post(ROUTES["verify"], json={"session": "s", "start": 0, "tokens": [1]},
                             headers={"Authorization": "Bearer admin"})
    assert r.status_code == 404 and "no language model" in r.text


def test_auto_asks_for_blocks_over_a_slow_link_and_stays_the_targets_greedy_output(server: tuple[str, dict[str, str]],
                                                                                 models: Models) -> None:
    url, tokens = server
    port = int(url.rsplit(":", 1)[1])
    estimates = LinkEstimates()
    with NetemProxy("127.0.0.1", port, rtt_s=0.1) as proxy:
        link = HttpVerifyLink(proxy.url, tokens["d2"])
        for prompt in PROMPTS:  # the first measures the link with a block; then blocks win at 100 ms
            result = generate(TorchDraft(models.draft), link, prompt, 24, k=8, auto=True, estimates=estimates)
            assert result.tokens == _greedy(models.target, prompt, 24) and result.server_calls == 1, prompt
    assert estimates.rtt_s is not None and 0.08 < estimates.rtt_s < 0.5
    fast = LinkEstimates(rtt_s=0.0, verify_s=0.01, server_token_s=0.01)  # a draft right 9 times in 10 pays here
    fast.acceptance.kept = 0.9 * fast.acceptance.tried
    link = HttpVerifyLink(url, tokens["d2"])
    drafted = generate(TorchDraft(models.target), link, PROMPTS[0], 24, k=8, auto=True, estimates=fast)
    assert drafted.tokens == _greedy(models.target, PROMPTS[0], 24) and drafted.server_calls > 1


def test_auto_chooses_by_expected_tokens_per_second() -> None:
    est = LinkEstimates(rtt_s=0.0, verify_s=0.01, server_token_s=0.01)
    assert not est.prefer_blocks(0.9, 8, token_s=0.001, left=64)  # no round trip, a good cheap draft: draft
    assert LinkEstimates(rtt_s=0.3, verify_s=0.01, server_token_s=0.01).prefer_blocks(0.9, 8, 0.001, 64)
    assert LinkEstimates().prefer_blocks(0.9, 8, 0.001, 64)  # round trip unknown: a block measures it
    est.refused_at = time.monotonic()  # the server refused a draft lately: blocks
    assert est.prefer_blocks(0.9, 8, 0.001, 64)


def test_sampling_in_auto_mode_is_seeded(server: tuple[str, dict[str, str]], models: Models) -> None:
    url, tokens = server
    link = HttpVerifyLink(url, tokens["d1"])
    runs = [generate(TorchDraft(models.draft), link, PROMPTS[0], 20, temperature=0.8, seed=3, auto=True,
                     estimates=LinkEstimates()).tokens for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 20
