"""Speculative decoding on transformers models: greedy output is the target's own greedy
`generate` output token for token, whatever the draft, chain or tree, fixed or adaptive K; the
caches roll back exactly (transformers' test_assisted_decoding_matches_greedy_search is the model)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge.llm.cost import DecodeCost, Line
from models.lm.cache import CachedLM
from models.lm.speculative import DraftTree, IndependentDrafter, NoDrafter, Tree, calibrate, speculative_generate

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
        self.lm = CachedLM(target)

    def reset(self, prompt: list[int]) -> None:
        self.lm.reset()

    def prepare(self, seq: list[int]) -> bool:
        return True

    def path_logits(self, seq: list[int], paths: list[list[int]]) -> np.ndarray:
        rows = []
        for path in paths:
            self.lm.reset()
            wrong = (int(self.lm.logits([*seq, *path])[-1].argmax()) + 1) % VOCAB
            rows.append(np.eye(VOCAB)[wrong] * 10)
        return np.stack(rows)


class FixedCost(DecodeCost):
    """A cost model that timings do not move: auto mode's choices made by hand."""

    def __init__(self, verify_s: float, draft_token_s: float) -> None:
        super().__init__(Line(0.0, draft_token_s), Line(verify_s, 0.0))

    def observe_draft(self, k: int, seconds: float) -> None:
        pass

    def observe_verify(self, n: int, seconds: float) -> None:
        pass


FREE_DRAFTS = FixedCost(verify_s=1.0, draft_token_s=0.0)  # auto drafts the most the acceptance rate pays for
DEAR_DRAFTS = FixedCost(verify_s=1.0, draft_token_s=2.0)  # auto never drafts

PROMPTS = [[1, 2, 3], [5], [7, 7, 7, 7, 9, 11], list(range(10, 30))]
SHAPES = {"auto, drafts free": dict(k=6, auto=FREE_DRAFTS), "auto, drafts dear": dict(k=6, auto=DEAR_DRAFTS),
          "chain k=1": dict(k=1), "chain k=3": dict(k=3), "chain k=6": dict(k=6), "adaptive k<=6": dict(k=6, adaptive=True),
          "tree 4x2x3": dict(tree=Tree(depth=4, branch=2, width=3)), "tree 2x3x1": dict(tree=Tree(depth=2, branch=3, width=1))}


@pytest.mark.parametrize("shape", SHAPES)
def test_greedy_equals_the_targets_greedy_generate(target: torch.nn.Module, shape: str) -> None:
    how = SHAPES[shape]
    drafts = {"independent": IndependentDrafter(_llama(1, layers=1, hidden=16)),
              # a draft head over half the vocabulary (the target still emits the other half)
              "independent, half vocabulary": IndependentDrafter(_llama(1, layers=1, hidden=16), vocab=range(0, VOCAB, 2)),
              "always right": IndependentDrafter(target), "always wrong": AlwaysWrong(target)}
    for prompt in PROMPTS:
        expected = _greedy(target, prompt, 24)
        for name, drafter in drafts.items():
            tokens, stats = speculative_generate(target, drafter, prompt, max_new_tokens=24, **how)  # type: ignore[arg-type]
            assert tokens == expected, (name, prompt)
            assert stats.new_tokens == 24 and stats.kept + stats.target_calls == 24
            if name == "always right" and shape.startswith("chain"):
                k = int(how["k"])
                assert stats.target_calls == -(-24 // (k + 1))  # every call adds k + 1 tokens (the last one fewer)
            if name == "always right" and shape.startswith("tree"):
                tree: Tree = how["tree"]  # type: ignore[assignment]
                # width 1 keeps the argmax path; wider trees keep the best cumulative paths, which
                # need not include it
                assert stats.target_calls == -(-24 // (tree.depth + 1)) if tree.width == 1 else stats.target_calls < 12
            if name == "always wrong":
                assert stats.kept == 0 and stats.target_calls == 24


class Counting(IndependentDrafter):
    """An independent draft that counts what it is asked."""

    asked = 0

    def prepare(self, seq: list[int]) -> bool:
        self.asked += 1
        return super().prepare(seq)


def test_auto_samples_the_same_text_whatever_it_drafts(target: torch.nn.Module) -> None:
    """Coupled sampling: the seed fixes the text; the draft and the K each round chooses do not."""
    measured = calibrate(target, IndependentDrafter(_llama(1, layers=1, hidden=16)), k=4)
    assert measured.verify.seconds(1) > 0 and measured.draft.seconds(1) > 0
    for prompt in PROMPTS[:2]:
        plain, _ = speculative_generate(target, NoDrafter(), prompt, 24, k=4, temperature=0.8, top_p=0.95, seed=5,
                                        auto=DEAR_DRAFTS)
        for drafter in (IndependentDrafter(_llama(1, layers=1, hidden=16)), IndependentDrafter(target), AlwaysWrong(target)):
            for cost in (FREE_DRAFTS, DEAR_DRAFTS, measured):
                tokens, _ = speculative_generate(target, drafter, prompt, 24, k=4, temperature=0.8, top_p=0.95, seed=5,
                                                     auto=cost)
                assert tokens == plain, (prompt, type(drafter).__name__, cost)
        right = speculative_generate(target, IndependentDrafter(target), prompt, 24, k=4, temperature=0.8, seed=5,
                                     auto=FREE_DRAFTS)[1]
        assert right.kept == right.drafted > 0  # a draft equal to the target is always kept
    other, _ = speculative_generate(target, NoDrafter(), PROMPTS[0], 24, k=4, temperature=0.8, top_p=0.95, seed=6,
                                    auto=DEAR_DRAFTS)
    assert other != plain


def test_auto_never_asks_a_draft_that_cannot_pay(target: torch.nn.Module) -> None:
    dear = Counting(_llama(1, layers=1, hidden=16))
    _, stats = speculative_generate(target, dear, [1, 2, 3], 24, k=4, auto=DEAR_DRAFTS)
    assert dear.asked == 0 and stats.drafted == 0 and stats.target_calls == 24
    free = Counting(_llama(1, layers=1, hidden=16))
    speculative_generate(target, free, [1, 2, 3], 24, k=4, auto=FREE_DRAFTS)
    assert free.asked > 0
    with pytest.raises(ValueError, match="auto chooses the chain length"):
        speculative_generate(target, free, [1, 2, 3], 4, k=4, auto=FREE_DRAFTS, adaptive=True)


def test_adaptive_k_drafts_longer_for_a_draft_that_is_right() -> None:
    target = _llama(0)
    right = speculative_generate(target, IndependentDrafter(target), [1, 2, 3], 40, k=8, adaptive=True)[1]
    wrong = speculative_generate(target, AlwaysWrong(target), [1, 2, 3], 40, k=8, adaptive=True)[1]
    assert right.k_per_call[-2] == 8 and max(wrong.k_per_call[3:]) == 1, (right.k_per_call, wrong.k_per_call)


def test_tree_verification_keeps_the_accepted_path_like_a_fresh_forward(target: torch.nn.Module) -> None:
    rng = np.random.default_rng(1)
    seq = [3, 1, 4, 1, 5]
    lm = CachedLM(target)
    lm.reset()
    lm.logits(seq, upto=len(seq) - 1)
    for _ in range(5):
        tree = DraftTree.root(seq[-1])
        for i in range(1, 12):  # a random tree of 11 nodes
            tree.parents.append(int(rng.integers(0, i)))
            tree.tokens.append(int(rng.integers(0, VOCAB)))
            tree.candidates.append([])
        logits = lm.tree_logits(seq[-1], tree)
        node = int(rng.integers(0, 12))
        path = []
        while node > 0:
            path.insert(0, node)
            node = tree.parents[node]
        fresh = CachedLM(target)
        fresh.reset()
        along = fresh.logits([*seq, *tree.path(path[-1] if path else 0)])  # the same tokens as a plain sequence
        assert torch.allclose(logits[[0, *path]], along[len(seq) - 1 :], atol=1e-9)
        lm.keep(len(seq), path)
        seq += [*tree.path(path[-1] if path else 0), int(rng.integers(0, VOCAB))]
        assert lm.cached == len(seq) - 1
        for a, b in zip(lm.cache.layers, fresh.cache.layers):
            assert torch.allclose(a.keys, b.keys[:, :, : len(seq) - 1], atol=1e-12)
            assert torch.allclose(a.values, b.values[:, :, : len(seq) - 1], atol=1e-12)


def test_the_target_cache_equals_a_fresh_forward_after_rollbacks(target: torch.nn.Module) -> None:
    prompt = [3, 1, 4, 1, 5]
    lm = CachedLM(target)
    lm.reset()
    seq = list(prompt)
    lm.logits(seq, upto=len(seq) - 1)
    rng = np.random.default_rng(0)
    for _ in range(6):  # verify random drafts, keep a random prefix, crop
        draft = rng.integers(0, VOCAB, 4).tolist()
        lm.logits(seq + draft)
        seq += [*draft[: rng.integers(0, 5)], int(rng.integers(0, VOCAB))]
        lm.crop(len(seq) - 1)
    fresh = CachedLM(target)
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


def test_an_int8_draft_is_still_lossless(target: torch.nn.Module) -> None:
    from models.lm.speculative import int8_drafter

    draft = int8_drafter(IndependentDrafter(_llama(1, layers=1, hidden=16).float(), vocab=range(0, VOCAB, 2)))
    assert draft.head is not None and draft.head.quantized is not None
    for prompt in PROMPTS[:2]:
        assert speculative_generate(target, draft, prompt, 16, k=4)[0] == _greedy(target, prompt, 16)
    with pytest.raises(TypeError, match="no int8 form"):
        int8_drafter(NoDrafter())


def test_the_kept_hidden_states_are_the_targets_last_hidden_states(target: torch.nn.Module) -> None:
    """What an EAGLE-style draft reads after chains of every length (0: a plain round), rollbacks
    and a verified tree: transformers' own ``hidden_states[-1]`` of the text, from a fresh forward."""
    lm = CachedLM(target, keep_hidden=True)
    lm.reset()
    seq = [3, 1, 4, 1, 5]
    lm.logits(seq, upto=len(seq) - 1)
    rng = np.random.default_rng(2)
    for round in range(10):
        if round == 5:  # a tree of three nodes, its path [1, 3] kept
            tree = DraftTree([-1, 0, 0, 1], [seq[-1], 7, 8, 9], [[], [], [], []], {})
            lm.tree_logits(seq[-1], tree)
            lm.keep(len(seq), [1, 3])
            seq += [7, 9, int(rng.integers(0, VOCAB))]
            continue
        draft = rng.integers(0, VOCAB, int(rng.integers(0, 5))).tolist()
        lm.logits(seq + draft)
        seq += [*draft[: rng.integers(0, len(draft) + 1)], int(rng.integers(0, VOCAB))]
        lm.crop(len(seq) - 1)
    oracle = _llama(0)  # the same weights, asked for its hidden states
    want = oracle(input_ids=torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states[-1][0]
    assert lm.hidden is not None and lm.hidden.shape == want.shape == (len(seq) - 1, 32)
    torch.testing.assert_close(lm.hidden, want.detach(), rtol=0, atol=1e-9)


def test_an_eagle_style_draft_reads_the_targets_states_without_hooking_its_layers() -> None:
    """The draft reads the target's last hidden states at its LM head's input: one pre-hook on the
    head, nothing on the layers. (Asking transformers for ``output_hidden_states`` hooked every
    layer for good, so every later forward paid, auto mode's plain rounds included: 0.92–0.95×
    plain decoding on the tiny target where it drafted nothing.)"""
    from models.lm.cache import _record_head_input
    from models.lm.eagle import EagleDraft, EagleDrafter

    target = _llama(0)
    drafter = EagleDrafter(EagleDraft.for_target(target))
    hows: list[dict[str, object]] = [dict(k=4, auto=DEAR_DRAFTS), dict(k=4, auto=FREE_DRAFTS), dict(k=3),
                                     dict(tree=Tree(depth=3, branch=2, width=2))]
    for how in hows:
        for prompt in PROMPTS[:2]:
            tokens, stats = speculative_generate(target, drafter, prompt, 16, **how)  # type: ignore[arg-type]
            assert tokens == _greedy(target, prompt, 16), (how, prompt)
            if how.get("auto") is DEAR_DRAFTS:
                assert stats.drafted == 0  # auto mode's plain rounds only: it still must leave no hook
            elif "k" in how and "auto" not in how:
                assert stats.drafted > 0
    hooked = {name: [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
              for name, module in target.named_modules() if module._forward_hooks or module._forward_pre_hooks}
    assert hooked == {"lm_head": [_record_head_input]}  # one, however many generations installed it
    assert not getattr(target, "_output_capturing_hooks_installed", False)
