"""Speculative decoding on transformers models: greedy output is the target's own greedy
`generate` output token for token, whatever the draft; the caches roll back exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.speculative import IndependentDrafter, _CachedLM, speculative_generate

VOCAB = 64


def _llama(seed: int, layers: int = 2, hidden: int = 32) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    # float64: one forward over K + 1 tokens and K + 1 forwards over one token agree to the last
    # bit of an argmax only when rounding cannot flip a near tie
    return LlamaForCausalLM(config).double().eval()


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return _llama(0)


def _greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                         pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


class AlwaysWrong:
    """Proposes what the target would not: its argmax + 1 (every draft token is rejected)."""

    def __init__(self, target: torch.nn.Module) -> None:
        self.lm = _CachedLM(target)

    def reset(self, prompt: list[int]) -> None:
        self.lm.reset()

    def propose(self, seq: list[int], k: int, *_: object) -> tuple[list[int], None]:
        self.lm.crop(len(seq) - 1)
        return [(int(self.lm.logits(seq)[-1].argmax()) + 1) % VOCAB] * k, None

    def accepted(self, seq: list[int]) -> None:
        pass


PROMPTS = [[1, 2, 3], [5], [7, 7, 7, 7, 9, 11], list(range(10, 30))]


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_equals_the_targets_greedy_generate(target: torch.nn.Module, k: int) -> None:
    drafts = {"independent": IndependentDrafter(_llama(1, layers=1, hidden=16)),
              "always right": IndependentDrafter(target), "always wrong": AlwaysWrong(target)}
    for prompt in PROMPTS:
        expected = _greedy(target, prompt, 24)
        for name, drafter in drafts.items():
            tokens, stats = speculative_generate(target, drafter, prompt, max_new_tokens=24, k=k)
            assert tokens == expected, (name, prompt)
            assert stats.new_tokens == 24 and stats.kept + stats.target_calls == 24
            if name == "always right":
                assert stats.target_calls == -(-24 // (k + 1))  # every call adds k + 1 tokens (the last one fewer)
            if name == "always wrong":
                assert stats.kept == 0 and stats.target_calls == 24


def test_the_target_cache_equals_a_fresh_forward_after_rollbacks(target: torch.nn.Module) -> None:
    prompt = [3, 1, 4, 1, 5]
    lm = _CachedLM(target)
    lm.reset()
    seq = list(prompt)
    lm.logits(seq, upto=len(seq) - 1)
    rng = np.random.default_rng(0)
    for _ in range(6):  # verify random drafts, keep a random prefix, crop
        draft = rng.integers(0, VOCAB, 4).tolist()
        lm.logits(seq + draft)
        seq += [*draft[: rng.integers(0, 5)], int(rng.integers(0, VOCAB))]
        lm.crop(len(seq) - 1)
    fresh = _CachedLM(target)
    fresh.reset()
    fresh.logits(seq, upto=len(seq) - 1)
    assert lm.cached == fresh.cached == len(seq) - 1
    for a, b in zip(lm.cache.layers, fresh.cache.layers):
        assert torch.allclose(a.keys, b.keys, atol=1e-12) and torch.allclose(a.values, b.values, atol=1e-12)


def test_sampling_is_seeded_and_stops_at_eos(target: torch.nn.Module) -> None:
    drafter = IndependentDrafter(_llama(1, layers=1, hidden=16))
    a, _ = speculative_generate(target, drafter, [1, 2, 3], 20, k=3, temperature=0.8, top_p=0.95, seed=7)
    b, _ = speculative_generate(target, drafter, [1, 2, 3], 20, k=3, temperature=0.8, top_p=0.95, seed=7)
    assert a == b and len(a) == 20
    eos = a[5]
    c, _ = speculative_generate(target, drafter, [1, 2, 3], 20, k=3, temperature=0.8, top_p=0.95, seed=7, eos_token_id=eos)
    assert c == a[: a.index(eos) + 1]
