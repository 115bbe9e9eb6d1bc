"""`trickle serve --llm`: the OpenAI-compatible completion route on a real server, tiny random
Llama models (a target and a smaller draft sharing a byte-level BPE tokenizer) in local folders."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from edge.core.errors import ConfigError
from server.ports import free_port
from server.service import ServeConfig, Service
from tests.language import CONTEXT, Models


@contextmanager
def _serve(state: Path, **llm: Any) -> Iterator[str]:
    config = ServeConfig(state_dir=state, port=free_port(), mqtt_port=free_port(), **{"llm_open": True, **llm})
    with Service(config).background():
        yield config.url


@pytest.fixture(scope="module")
def speculative(models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with _serve(tmp_path_factory.mktemp("spec"), llm=models.target, llm_draft=models.draft) as url:
        yield url


@pytest.fixture(scope="module")
def plain(models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with _serve(tmp_path_factory.mktemp("plain"), llm=models.target, llm_concurrency=1, llm_queue=1) as url:
        yield url


def _complete(url: str, **body: Any) -> dict[str, Any]:
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


PROMPTS = ["To be, or", "O Romeo", "The quality of mercy is"]


def test_greedy_with_a_draft_equals_without_and_equals_generate(models: Models, speculative: str, plain: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(models.target, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(models.target, local_files_only=True)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        out = target.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):].tolist()
        assert len(out) >= 8  # not a trivially short (empty) comparison
        fast = _complete(speculative, prompt=prompt, max_tokens=24, temperature=0)
        slow = _complete(plain, prompt=prompt, max_tokens=24, temperature=0)
        assert fast["choices"][0]["text"] == slow["choices"][0]["text"] == tokenizer.decode(out, skip_special_tokens=True)
        assert fast["object"] == "text_completion" and fast["choices"][0]["finish_reason"] == \
            ("stop" if out[-1] == tokenizer.eos_token_id else "length")
        assert fast["usage"] == slow["usage"] == {"prompt_tokens": len(ids), "completion_tokens": len(out),
                                                  "total_tokens": len(ids) + len(out)}
        assert fast["trickle"]["speculative"] and not slow["trickle"]["speculative"]
        assert slow["trickle"]["target_calls"] == len(out) and slow["trickle"]["accept_length"] == 1
        assert fast["trickle"]["target_calls"] <= len(out) and fast["trickle"]["tokens_per_second"] > 0


def test_sampling_is_reproducible_by_seed_with_a_draft_or_without(speculative: str, plain: str) -> None:
    """Auto decoding samples coupled: the seed alone fixes the text, whatever the draft and K."""
    body = {"prompt": "All the world", "max_tokens": 20, "temperature": 0.8, "top_p": 0.9, "seed": 7}
    first = _complete(speculative, **body)
    assert first["choices"][0]["text"] == _complete(speculative, **body)["choices"][0]["text"]
    assert first["choices"][0]["text"] == _complete(plain, **body)["choices"][0]["text"]
    assert first["usage"]["completion_tokens"] >= 1
    assert _complete(plain, **{**body, "seed": 8})["choices"][0]["text"] != first["choices"][0]["text"]


def test_streamed_chunks_concatenate_to_the_text(speculative: str) -> None:
    body = {"prompt": "Now is the winter", "max_tokens": 40, "temperature": 0}
    whole = _complete(speculative, **body)
    events = []
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", speculative + "/v1/completions", json=stream, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line:
                assert line.startswith("data: ")
                events.append(line[len("data: "):])
    assert events[-1] == "[DONE]" and len(events) >= 3  # several blocks, not one at the end
    chunks = [json.loads(e) for e in events[:-1]]
    *texts, usage = chunks  # OpenAI's shape: choices, then (include_usage) one chunk of usage and no choices
    assert "".join(c["choices"][0]["text"] for c in texts) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in texts] == [None] * (len(texts) - 1) + [whole["choices"][0]["finish_reason"]]
    assert all(set(c["choices"][0]) == {"index", "text", "logprobs", "finish_reason"} for c in texts)
    assert usage["choices"] == [] and usage["usage"] == whole["usage"] and all(c["id"] == chunks[0]["id"] for c in chunks)


def test_a_prompt_over_the_context_is_a_400_naming_the_limit(speculative: str) -> None:
    r = httpx.post(speculative + "/v1/completions", json={"prompt": "wherefore art thou " * 200, "max_tokens": 16})
    error = r.json()["error"]
    assert r.status_code == 400 and f"context of {CONTEXT} tokens" in error["message"]
    assert f"at most {CONTEXT - 16} prompt tokens" in error["message"] and error["code"] == "context_length_exceeded"
    # max_tokens past the context: the limit, never a negative prompt length (issue 32)
    r = httpx.post(speculative + "/v1/completions", json={"prompt": "To be", "max_tokens": 4096})
    assert r.status_code == 400 and f"at most {CONTEXT - 1})" in r.json()["error"]["message"]
    assert "-" not in r.json()["error"]["message"].split("at most")[1]


@pytest.mark.parametrize("bad", [{"max_tokens": -1}, {"max_tokens": 100_000}, {"temperature": -0.1}, {"temperature": 2.5},
                                 {"top_p": 0}, {"top_p": 1.5}, {"prompt": ""}, {"prompt": []}, {"prompt": None},
                                 {"seed": -1}, {"n": 0}, {"stop": ["a", "b", "c", "d", "e"]}, {"logprobs": 6},
                                 {"best_of": 2}, {"suffix": "end"}, {"presence_penalty": 0.5}, {"logit_bias": {"5": 1}}])
def test_bad_parameters_are_openai_400s(speculative: str, bad: dict[str, Any]) -> None:
    r = httpx.post(speculative + "/v1/completions", json={"prompt": "To be", **bad})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == next(iter(bad)), error


def test_beyond_concurrency_and_queue_is_503(plain: str) -> None:
    async def three() -> list[int]:
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"prompt": "O", "max_tokens": CONTEXT - 8, "temperature": 0}
            replies = await asyncio.gather(*(client.post(plain + "/v1/completions", json=body) for _ in range(3)))
            return sorted(r.status_code for r in replies)

    assert asyncio.run(three()) == [200, 200, 503]  # one running, one waiting, one refused
    assert 'trickle_llm_requests_rejected_total{reason="queue_full"} 1.0' in httpx.get(plain + "/metrics").text


def test_metrics_count_generated_tokens(speculative: str) -> None:
    def generated() -> float:
        text = httpx.get(speculative + "/metrics").text
        return float(next(line.split()[-1] for line in text.splitlines()
                          if line.startswith("trickle_llm_tokens_generated_total")))

    before = generated()
    done = _complete(speculative, prompt="To be", max_tokens=12, temperature=0)
    assert generated() == before + done["usage"]["completion_tokens"]
    text = httpx.get(speculative + "/metrics").text
    assert "trickle_llm_accept_length_bucket" in text and "trickle_llm_tokens_per_second_count" in text


def test_without_llm_there_is_no_route_and_bad_folders_are_config_errors(models: Models, tmp_path: Path) -> None:
    with _serve(tmp_path / "none") as url:
        assert httpx.post(url + "/v1/completions", json={"prompt": "To be"}).status_code == 404
    with pytest.raises(ConfigError, match="llm = .*missing.*config.json"):
        Service(ServeConfig(state_dir=tmp_path / "a", llm=tmp_path / "missing"))
    with pytest.raises(ConfigError, match="llm_draft = .*vocabulary of"):
        Service(ServeConfig(state_dir=tmp_path / "b", llm=models.target, llm_draft=models.small_vocab_draft))
    with pytest.raises(ConfigError, match="llm_draft = .*needs llm"):
        ServeConfig(llm_draft=models.draft)
