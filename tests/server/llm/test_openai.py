"""The OpenAI API as clients expect it (issue 32), through the official ``openai`` client against a
real server: completions and chat, streaming and not, with and without a draft; stop, n,
logprobs, echo, prompt forms, errors, models; and API keys. The oracle is the target model itself
(transformers' greedy ``generate``, its own log-softmax)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import torch

from server.ports import free_port
from server.service import ServeConfig, Service
from tests.language import CONTEXT, Models

ADMIN = "admin-token-for-tests"


@contextmanager
def _serve(state: Path, **llm: Any) -> Iterator[str]:
    config = ServeConfig(state_dir=state, port=free_port(), mqtt_port=free_port(), admin_token=ADMIN, **llm)
    with Service(config).background():
        yield config.url


def _key(url: str, name: str) -> str:
    r = httpx.post(url + "/v1/llm/keys", json={"name": name}, headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 201, r.text
    return str(r.json()["key"])


@pytest.fixture(scope="module")
def servers(models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, openai.OpenAI]]:
    """Two servers of the same target, with a draft and without, and a client with a key for each."""
    with _serve(tmp_path_factory.mktemp("spec"), llm=models.target, llm_draft=models.draft) as spec, \
            _serve(tmp_path_factory.mktemp("plain"), llm=models.target) as plain:
        yield {"draft": openai.OpenAI(base_url=spec + "/v1", api_key=_key(spec, "alice"), max_retries=0),
               "plain": openai.OpenAI(base_url=plain + "/v1", api_key=_key(plain, "bob"), max_retries=0)}


@pytest.fixture(scope="module")
def target(models: Models) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(models.target, local_files_only=True).eval(),
            AutoTokenizer.from_pretrained(models.target, local_files_only=True))


def _greedy(target: tuple[Any, Any], ids: list[int], n: int) -> list[int]:
    model, _ = target
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[0, len(ids):].tolist()
    return [int(t) for t in out]


MODEL = "target"  # the served folder's name


def test_completions_greedy_is_the_targets_with_a_draft_or_without(servers: dict[str, openai.OpenAI],
                                                                    target: tuple[Any, Any]) -> None:
    _, tok = target
    for prompt in ("To be, or", "O Romeo"):
        want = tok.decode(_greedy(target, tok(prompt)["input_ids"], 20), skip_special_tokens=True)
        for client in servers.values():
            r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0)
            assert r.choices[0].text == want and r.object == "text_completion" and r.model == MODEL
            assert r.usage is not None and r.usage.completion_tokens == 20
            streamed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0, stream=True)
            assert "".join(c.choices[0].text for c in streamed) == want


def test_stop_ends_before_the_stop_text(servers: dict[str, openai.OpenAI]) -> None:
    client = servers["draft"]
    whole = client.completions.create(model=MODEL, prompt="All the world", max_tokens=40, temperature=0).choices[0].text
    stop = whole[12:15]  # a text the greedy continuation reaches
    assert stop and whole.find(stop) >= 1
    for given in (stop, [stop, "\x00never"]):
        for client in servers.values():
            r = client.completions.create(model=MODEL, prompt="All the world", max_tokens=40, temperature=0, stop=given)
            assert r.choices[0].text == whole[: whole.find(stop)] and r.choices[0].finish_reason == "stop"
            chunks = list(client.completions.create(model=MODEL, prompt="All the world", max_tokens=40, temperature=0,
                                                    stop=given, stream=True))
            assert "".join(c.choices[0].text for c in chunks) == whole[: whole.find(stop)]
            assert chunks[-1].choices[0].finish_reason == "stop"
            assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_n_choices_are_seeded_and_the_same_with_a_draft(servers: dict[str, openai.OpenAI]) -> None:
    body: dict[str, Any] = {"model": MODEL, "prompt": "The quality", "max_tokens": 12, "temperature": 0.9, "seed": 41}
    got = {name: client.completions.create(n=3, **body) for name, client in servers.items()}
    texts = [c.text for c in got["draft"].choices]
    assert [c.index for c in got["draft"].choices] == [0, 1, 2] and len(set(texts)) > 1
    assert texts == [c.text for c in got["plain"].choices]  # lossless: the draft changes nothing
    # choice j is the choice of seed + j
    alone = servers["plain"].completions.create(**{**body, "seed": 42}).choices[0].text
    assert alone == texts[1]
    assert got["draft"].usage is not None and got["draft"].usage.completion_tokens == 36


def test_logprobs_are_the_targets_and_echo_scores_the_prompt(servers: dict[str, openai.OpenAI],
                                                               target: tuple[Any, Any]) -> None:
    model, tok = target
    prompt = "Now is the winter"
    ids = tok(prompt)["input_ids"]
    r = servers["draft"].completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert lp is not None and "".join(lp.tokens or []) == r.choices[0].text
    out = _greedy(target, ids, 8)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids + out])).logits[0].float(), -1)
    want = [float(logp[len(ids) + i - 1, t]) for i, t in enumerate(out)]
    assert lp.token_logprobs == pytest.approx(want, abs=1e-4)
    assert all(1 <= len(top) <= 3 and max(top.values()) == pytest.approx(v, abs=1e-4)  # greedy: its token is the likeliest
               for top, v in zip(lp.top_logprobs or [], want))
    assert lp.text_offset == [sum(len(t) for t in (lp.tokens or [])[:i]) for i in range(len(out))]
    # echo with max_tokens 0 scores the prompt alone: the first token has nothing before it
    r = servers["plain"].completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == prompt and lp is not None and (lp.token_logprobs or [])[0] is None
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    assert (lp.token_logprobs or [])[1:] == pytest.approx([float(logp[i - 1, ids[i]]) for i in range(1, len(ids))], abs=1e-4)


def test_prompts_as_a_list_of_strings_or_token_ids(servers: dict[str, openai.OpenAI], target: tuple[Any, Any]) -> None:
    _, tok = target
    client = servers["draft"]
    one = [client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0).choices[0].text
           for p in ("To be", "O Romeo")]
    r = client.completions.create(model=MODEL, prompt=["To be", "O Romeo"], max_tokens=6, temperature=0, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3] and [c.text for c in r.choices] == [one[0], one[0], one[1], one[1]]
    ids = [tok("To be")["input_ids"], tok("O Romeo")["input_ids"]]
    assert client.completions.create(model=MODEL, prompt=ids[0], max_tokens=6, temperature=0).choices[0].text == one[0]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    assert [c.text for c in r.choices] == one


def test_special_token_text_in_a_prompt_is_plain_text(servers: dict[str, openai.OpenAI], target: tuple[Any, Any]) -> None:
    _, tok = target
    r = servers["plain"].completions.create(model=MODEL, prompt="end </s> here", max_tokens=1, temperature=0)
    assert r.usage is not None and r.usage.prompt_tokens == len(tok("end </s> here", split_special_tokens=True)["input_ids"])
    assert r.usage.prompt_tokens > len(tok("end </s> here")["input_ids"])  # not the one end-of-text token


def test_chat_uses_the_template_and_streams(servers: dict[str, openai.OpenAI], target: tuple[Any, Any]) -> None:
    _, tok = target
    messages: list[Any] = [{"role": "system", "content": "A room in the castle."}, {"role": "user", "content": "Who is there?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    want = tok.decode(_greedy(target, tok(ids)["input_ids"], 10), skip_special_tokens=True)
    for client in servers.values():
        r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
        assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
        assert r.choices[0].message.content == want and r.usage is not None and r.usage.completion_tokens == 10
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                                     stream=True, stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
    r = servers["draft"].chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0,
                                                 logprobs=True, top_logprobs=2, n=2)
    assert len(r.choices) == 2 and r.choices[0].logprobs is not None
    content = r.choices[0].logprobs.content or []
    assert "".join(c.token for c in content) == r.choices[0].message.content and all(len(c.top_logprobs) == 2 for c in content)


def test_errors_are_openai_error_objects(servers: dict[str, openai.OpenAI]) -> None:
    client = servers["draft"]
    with pytest.raises(openai.NotFoundError, match="gpt-4o"):
        client.completions.create(model="gpt-4o", prompt="To be", max_tokens=4)
    with pytest.raises(openai.BadRequestError, match=f"context of {CONTEXT} tokens"):
        client.completions.create(model=MODEL, prompt="To be", max_tokens=4096)
    with pytest.raises(openai.BadRequestError, match="'tools' is not supported"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       tools=[{"type": "function", "function": {"name": "f"}}])
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       response_format={"type": "json_object"})
    big = httpx.post(str(client.base_url) + "completions", json={"model": MODEL, "prompt": "x" * (1 << 20) + "y"},
                     headers={"Authorization": f"Bearer {client.api_key}"})
    assert big.status_code == 413 and len(big.content) < 1024  # never the MiB echoed back
    assert big.json()["error"]["type"] == "invalid_request_error"  # an OpenAI error object (test_openai_errors.py)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="apt-get install chromium")
def test_the_dashboard_shows_each_keys_use(servers: dict[str, openai.OpenAI]) -> None:
    from playwright.sync_api import sync_playwright

    client = servers["plain"]
    url = str(client.base_url).removesuffix("/v1/")
    client.completions.create(model=MODEL, prompt="To be", max_tokens=3, temperature=0)
    used = {k["name"]: k for k in httpx.get(url + "/v1/dashboard/fleet", headers={"Authorization": f"Bearer {ADMIN}"}
                                            ).json()["llm_keys"]}["bob"]
    assert used["requests"] >= 1 and used["completion_tokens"] >= 3
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(url)
        page.get_by_label("Token").fill(ADMIN)
        page.get_by_role("button", name="Sign in").click()
        row = page.locator('#llm-keys tr[data-key="bob"]')
        row.wait_for(timeout=20_000)
        cells = row.locator("td").all_inner_texts()
        browser.close()
    assert cells[:5] == ["bob", "live", str(used["requests"]), str(used["prompt_tokens"]), str(used["completion_tokens"])]


def test_models_lists_what_is_served(servers: dict[str, openai.OpenAI]) -> None:
    models = servers["draft"].models.list()
    assert [m.id for m in models.data] == [MODEL] and servers["draft"].models.retrieve(MODEL).id == MODEL


def test_llm_routes_need_a_key_and_count_its_use(servers: dict[str, openai.OpenAI], models: Models,
                                                  tmp_path: Path) -> None:
    client = servers["draft"]
    url = str(client.base_url).removesuffix("/v1/")
    for key in ("", "sk-trickle-wrong"):
        stranger = openai.OpenAI(base_url=url + "/v1", api_key=key or "-", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            stranger.completions.create(model=MODEL, prompt="To be", max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            stranger.models.list()
    assert httpx.post(url + "/v1/chat/completions", json={"messages": []}).json()["error"]["type"] == "authentication_error"
    admin = {"Authorization": f"Bearer {ADMIN}"}
    before = {k["name"]: k for k in httpx.get(url + "/v1/llm/keys", headers=admin).json()["keys"]}["alice"]
    r = client.completions.create(model=MODEL, prompt="To be", max_tokens=3, temperature=0)
    after = {k["name"]: k for k in httpx.get(url + "/v1/llm/keys", headers=admin).json()["keys"]}["alice"]
    assert after["requests"] == before["requests"] + 1
    assert after["completion_tokens"] == before["completion_tokens"] + (r.usage.completion_tokens if r.usage else -1)
    assert "key" not in after and httpx.get(url + "/v1/llm/keys", headers={"Authorization": f"Bearer {client.api_key}"}
                                            ).status_code == 403  # a known key, but not the admin's
    # a revoked key stops working at once
    carol = _key(url, "carol")
    assert openai.OpenAI(base_url=url + "/v1", api_key=carol).models.list().data
    assert httpx.delete(url + "/v1/llm/keys/carol", headers=admin).json() == {"name": "carol", "revoked": True}
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key=carol, max_retries=0).models.list()
    # keys made at start, and anonymous access only when asked for
    with _serve(tmp_path / "keys", llm=models.target, llm_keys=["dave"]) as keyed:
        key = (tmp_path / "keys" / "llm-keys" / "dave.key").read_text().strip()
        assert openai.OpenAI(base_url=keyed + "/v1", api_key=key).models.list().data[0].id == MODEL
        assert httpx.get(keyed + "/v1/models").status_code == 401
    with _serve(tmp_path / "open", llm=models.target, llm_open=True) as anyone:
        r = httpx.post(anyone + "/v1/completions", json={"prompt": "To be", "max_tokens": 2})
        assert r.status_code == 200 and json.loads(r.text)["usage"]["completion_tokens"] == 2


def test_sampled_choices_follow_the_targets_distribution_with_a_draft(servers: dict[str, openai.OpenAI],
                                                                        target: tuple[Any, Any]) -> None:
    """Lossless sampling through the server, ``n`` included: 480 first tokens (30 requests × n = 16,
    every choice its own seed) against the target's softmax, pooled into 6 bins of about equal mass
    (tokens by their text, as the API returns them)."""
    from scipy.stats import chisquare

    model, tok = target
    ids = tok("To be")["input_ids"]
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([ids])).logits[0, -1].double(), -1).numpy()
    mass: dict[str, float] = {}
    for t in range(len(p)):
        mass[tok.decode([t])] = mass.get(tok.decode([t]), 0.0) + float(p[t])
    texts = sorted(mass, key=lambda text: -mass[text])
    before = np.cumsum([mass[t] for t in texts]) - [mass[t] for t in texts]
    bins = {text: min(int(c * 6), 5) for text, c in zip(texts, before)}
    expected = [sum(mass[t] for t, b in bins.items() if b == i) for i in range(6)]
    counts = [0] * 6
    for r in range(30):
        reply = servers["draft"].completions.create(model=MODEL, prompt=ids, max_tokens=1, temperature=1.0, n=16,
                                                    seed=16 * r, logprobs=0)
        for choice in reply.choices:
            assert choice.logprobs is not None and choice.logprobs.tokens
            counts[bins[choice.logprobs.tokens[0]]] += 1
    assert sum(counts) == 480
    used = [i for i, e in enumerate(expected) if e > 0]  # a text of more than a bin's mass leaves the next empty
    assert len(used) >= 4
    assert chisquare([counts[i] for i in used], [expected[i] * 480 for i in used]).pvalue > 1e-3, (counts, expected)
