"""Any causal LM family as the target: tiny random Llama, Qwen2 (its upper layer sliding), Mistral
(a sliding window shorter than the text), Phi-3, Gemma (a head size of its own, scaled embeddings)
and GPT-2 (no key/value head count, n_head/n_embd, learned positions), made with transformers'
``AutoConfig.for_model`` (nothing downloaded). For each, MoA and EAGLE-style drafts are trained
for two steps, exported as device bundles (parity-checked with torch), and every way of decoding
is the target's own greedy ``generate``, token for token: in-process (a chain and a tree),
through the server's completions, and by the device client against the server. A target the
drafts cannot read is one ConfigError naming what it lacks."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import torch

from edge.contract.protocol import ROUTES
from edge.core.errors import ConfigError
from tests.language import CONTEXT, Models

if TYPE_CHECKING:
    from models.lm.draft import Kind

LAYERS = dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=64,
              max_position_embeddings=CONTEXT)
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {**LAYERS, "num_key_value_heads": 2},
    # sliding windows on the layers from max_window_layers on: one full layer, one sliding
    "qwen2": {**LAYERS, "num_key_value_heads": 2, "use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1},
    "mistral": {**LAYERS, "num_key_value_heads": 2, "sliding_window": 6},  # every layer sees its last 6 tokens
    "phi3": {**LAYERS, "num_key_value_heads": 2, "original_max_position_embeddings": CONTEXT},
    "gemma": {**LAYERS, "num_key_value_heads": 1, "head_dim": 16},  # not hidden / heads (8)
    "gpt2": {"n_layer": 2, "n_head": 4, "n_embd": 32, "n_positions": CONTEXT},
}
PROMPTS = ["To be, or not to be, that is", "O Romeo", "All the world's a stage, and all the men"]
NEW_TOKENS = 16  # with the prompts, past Mistral's and Qwen2's sliding window


@dataclass(frozen=True)
class Family:
    name: str
    target: Path
    moa: Path  # trickle train draft --kind moa
    eagle: Path
    moa_bundle: Path  # the device bundles
    eagle_bundle: Path


def save_family(name: str, folder: Path, tokenizer: Any, seed: int = 0, **fields: Any) -> None:
    """A random-weight target of the family ``name`` with the tests' tokenizer, float64 (so that one
    forward over K + 1 tokens and K + 1 forwards over one token agree on every argmax)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    config = AutoConfig.for_model(name, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=None, **fields)
    torch.manual_seed(seed)
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    auto.from_config(config).double().save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@pytest.fixture(scope="module")
def tokenizer(models: Models) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models.target, local_files_only=True)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest, tokenizer: Any, corpus: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Family:
    from export.lm_draft import export_eagle_draft, export_moa_draft
    from models.lm.draft import train_draft

    name = request.param
    root = tmp_path_factory.mktemp(name)
    save_family(name, root / "target", tokenizer, **FAMILIES[name])
    out = Family(name, root / "target", root / "moa", root / "eagle", root / "moa-device", root / "eagle-device.tar")
    losses: list[float] = []
    trained: tuple[tuple[Kind, Path], ...] = (("moa", out.moa), ("eagle", out.eagle))
    for kind, folder in trained:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # e.g. float() of a loss that requires grad, once per step
            summary = train_draft(out.target, kind, corpus, folder, steps=2, batch=2, context=32, checkpoint_minutes=60,
                                  progress=lambda step, loss: losses.append(loss))
        assert summary["steps"] == 2 and summary["val"]["forward_kl"] > 0
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
    for export, draft, bundle in ((export_moa_draft, out.moa, out.moa_bundle), (export_eagle_draft, out.eagle, out.eagle_bundle)):
        assert export(draft, out.target, bundle).parity_max_abs_logit < 1e-3  # the device graphs are the torch draft
    return out


def _greedy(target: Any, prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    out = target.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=n, min_new_tokens=0 if eos is not None else n, do_sample=False,
                          eos_token_id=eos, pad_token_id=0)
    return list(out[0, len(prompt):].tolist())


def _load(folder: Path) -> Any:
    from models.lm.draft import load_target

    return load_target(folder)[0]


@pytest.mark.parametrize("kind", ["moa", "eagle"])
def test_speculative_decoding_in_process_is_the_targets_greedy_output(family: Family, tokenizer: Any, kind: str) -> None:
    from models.lm.draft import load_drafter
    from models.lm.speculative import Tree, speculative_generate

    target = _load(family.target)
    drafter = load_drafter(family.moa if kind == "moa" else family.eagle, target)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        want = _greedy(target, ids, NEW_TOKENS)
        chain, stats = speculative_generate(target, drafter, ids, NEW_TOKENS, k=4)
        tree, _ = speculative_generate(target, drafter, ids, NEW_TOKENS, tree=Tree(depth=3, branch=2, width=2))
        assert chain == tree == want, (family.name, kind, prompt)
        assert stats.target_calls <= NEW_TOKENS and stats.drafted > 0


def test_the_moa_draft_trains_on_the_states_it_drafts_from(family: Family) -> None:
    """Training reads the target's keys and values from one forward over a window; decoding from a
    cache fed a few tokens at a time and rolled back after each verification: the same states,
    past a sliding window too (where transformers' own cache keeps the last window only)."""
    from models.lm.cache import CachedLM
    from models.lm.draft import load_drafter
    from models.lm.moa import target_pass

    target = _load(family.target)
    draft = load_drafter(family.moa, target).draft  # type: ignore[attr-defined]
    ids = [(7 * i + 3) % 300 for i in range(20)]
    with torch.inference_mode():
        trained = draft.target_states(target_pass(target, torch.tensor([ids])).cache, len(ids))
        lm = CachedLM(target)
        lm.reset()
        for end in (5, 9, 14, 20):  # each round verifies a draft of three wrong tokens, then rolls back
            lm.logits([*ids[:end], 0, 0, 0])
            lm.crop(end)
        decoded = draft.target_states(lm.cache, len(ids))
    torch.testing.assert_close(trained, decoded, rtol=0, atol=1e-9)


def test_sessions_batched_into_one_forward_get_their_own_logits_and_caches(family: Family) -> None:
    """The server verifies concurrent sessions in one padded forward (``batched_logits``); each
    session's logits, and its cache afterwards, are those of the session run alone."""
    from models.lm.cache import CachedLM, batched_logits

    target = _load(family.target)
    prefixes = [[], list(range(3, 15)), list(range(40, 49))]  # nothing cached yet, then past the sliding windows
    feeds = [[5, 6, 7, 8], [20, 21], list(range(60, 65))]

    def session(prefix: list[int]) -> CachedLM:
        lm = CachedLM(target, keep_hidden=True)
        lm.reset()
        if prefix:
            lm.logits(prefix)
        return lm

    lms = [session(p) for p in prefixes]
    batched = batched_logits(target, lms, feeds)
    for lm, prefix, feed, got in zip(lms, prefixes, feeds, batched):
        alone = session(prefix)
        torch.testing.assert_close(got.double(), alone.logits(prefix + feed), rtol=0, atol=1e-9)
        assert alone.hidden is not None and lm.hidden is not None
        torch.testing.assert_close(lm.hidden, alone.hidden, rtol=0, atol=1e-9)
        nxt = [1, 2, 3]  # the batched session's cache goes on as the lone one's
        torch.testing.assert_close(lm.logits(prefix + feed + nxt), alone.logits(prefix + feed + nxt), rtol=0, atol=1e-9)


@pytest.fixture(scope="module")
def served(family: Family, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The family's target served with its MoA draft: (URL, the device d1's token)."""
    from server.ports import free_port
    from server.service import ServeConfig, Service

    state = tmp_path_factory.mktemp(f"{family.name}-server")
    config = ServeConfig(state_dir=state, port=free_port(), mqtt_port=free_port(), llm=family.target,
                         llm_draft=family.moa, llm_open=True)
    with Service(config).background():
        admin = {"Authorization": f"Bearer {(state / 'admin.token').read_text().strip()}"}
        r = httpx.post(config.url + ROUTES["devices"], json={"device": "d1"}, headers=admin)
        r.raise_for_status()
        yield config.url, r.json()["token"]


def test_the_servers_greedy_completions_are_the_targets(family: Family, served: tuple[str, str], tokenizer: Any) -> None:
    target = _load(family.target)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        want = _greedy(target, ids, NEW_TOKENS, eos=tokenizer.eos_token_id)
        r = httpx.post(served[0] + "/v1/completions", json={"prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0},
                       timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["text"] == tokenizer.decode(want, skip_special_tokens=True), (family.name, prompt)
        assert body["usage"]["completion_tokens"] == len(want) and body["trickle"]["speculative"]


@pytest.mark.parametrize("kind", ["moa", "eagle"])
def test_the_device_draft_against_the_server_is_the_targets_greedy_output(family: Family, served: tuple[str, str],
                                                                         tokenizer: Any, kind: str) -> None:
    from edge.llm.draft import load_lm_draft
    from edge.llm.generate import HttpVerifyLink, generate

    target = _load(family.target)
    draft = load_lm_draft(family.moa_bundle if kind == "moa" else family.eagle_bundle)
    assert draft.state_kind == ("moa" if kind == "moa" else "features")
    link = HttpVerifyLink(*served)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        result = generate(draft, link, ids, NEW_TOKENS, k=4)
        assert result.tokens == _greedy(target, ids, NEW_TOKENS) and result.verified == NEW_TOKENS, (family.name, prompt)


# ---- what the drafts cannot read: one ConfigError, never a traceback ----


@pytest.mark.parametrize(("name", "fields", "says"), [
    ("t5", {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 1, "num_heads": 4}, "an encoder-decoder model"),
    ("mamba", {"hidden_size": 32, "state_size": 4, "num_hidden_layers": 1}, "layers of kind ['linear_attention']"),
])
def test_a_target_without_attention_caches_is_one_config_error(name: str, fields: dict[str, Any], says: str, tokenizer: Any,
                                                              corpus: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from models.lm.draft import train_draft
    from trickle.cli import main

    save_family(name, tmp_path / name, tokenizer, decoder_start_token_id=0, **fields)
    for kind in ("moa", "eagle"):
        with pytest.raises(ConfigError, match=f"'{name}'.*{says}".replace("[", r"\[").replace("]", r"\]")):
            train_draft(tmp_path / name, kind, corpus, tmp_path / kind, steps=1)
        assert not (tmp_path / kind).exists()  # nothing half-written
    assert main(["train", "draft", "--target", str(tmp_path / name), "--kind", "moa", "--corpus", str(corpus),
                 "--steps", "1", "--out", str(tmp_path / "cli")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and not any("Traceback" in line for line in err)


def test_a_config_missing_an_attention_number_names_it() -> None:
    from transformers import AutoConfig

    from models.lm.family import attention_shape

    gpt2 = attention_shape(AutoConfig.for_model("gpt2", n_embd=48, n_head=4, n_layer=3))  # no key/value head count
    assert (gpt2.hidden, gpt2.layers, gpt2.heads, gpt2.kv_heads, gpt2.head_dim, gpt2.kv_dim) == (48, 3, 4, 4, 12, 96)
    gemma = attention_shape(AutoConfig.for_model("gemma", hidden_size=32, num_attention_heads=4, num_key_value_heads=1,
                                                 head_dim=16))
    assert (gemma.heads, gemma.kv_heads, gemma.head_dim) == (4, 1, 16)
    with pytest.raises(ConfigError, match="no num_attention_heads / n_head / num_heads: the MoA draft reads"):
        attention_shape(SimpleNamespace(model_type="custom", hidden_size=32, num_hidden_layers=2))
    with pytest.raises(ConfigError, match="hidden size 30 is not a multiple of 4 attention heads"):
        attention_shape(SimpleNamespace(model_type="custom", hidden_size=30, num_hidden_layers=2, num_attention_heads=4))
