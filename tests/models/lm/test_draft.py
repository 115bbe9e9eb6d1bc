"""Drafts for a trained target (models/lm/draft.py): trained, saved, loaded back, and lossless through the verify loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from edge.core.errors import ConfigError
from edge.llm.cost import DecodeCost
from models.lm.draft import load_drafter, load_target, train_draft
from models.lm.speculative import NoDrafter, Tree, speculative_generate
from models.lm.target import train_lm
from tests.models.lm.test_lm import config


@pytest.fixture(scope="module")
def target_dir(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("target") / "lm"
    train_lm(config(steps=150), corpus, out)
    return out


@pytest.mark.parametrize("kind", ["moa", "eagle", "independent"])
def test_a_trained_draft_is_lossless_and_accepted_more_than_untrained(kind: str, target_dir: Path, corpus: Path,
                                                                     tmp_path: Path) -> None:
    target, tok = load_target(target_dir)
    prompts = [tok("Ham.\nHamlet ").input_ids, tok("[Enter Horatio.]\n\nHor.\n").input_ids]
    untrained = train_draft(target_dir, kind, corpus, tmp_path / "untrained", steps=1)
    trained = train_draft(target_dir, kind, corpus, tmp_path / "draft", steps=120, lr=3e-3, seed=0)
    assert trained["val_loss"] < untrained["val_loss"]
    assert json.loads((tmp_path / "draft" / "draft.json").read_text())["kind"] == kind
    lengths = {}
    for name in ("untrained", "draft"):
        drafter = load_drafter(tmp_path / name, target)
        lengths[name] = 0.0
        for prompt in prompts:
            expected = target.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                                       pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
            got, stats = speculative_generate(target, drafter, prompt, 24, k=4, eos_token_id=tok.eos_token_id)
            assert got == expected[: len(got)] and (len(got) == 24 or got[-1] == tok.eos_token_id), (name, kind)
            lengths[name] += stats.accept_length / len(prompts)
            # auto: plain rounds between drafting ones, so the draft must catch up on the text it skipped
            mixed = DecodeCost.prior(verify_s=0.01, draft_token_s=0.001).session(6, plan=(0, 0, 3, 0, 6, 1, 0, 0, 2))
            for how in (dict(tree=Tree(depth=4, branch=2, width=2)), dict(k=6, adaptive=True), dict(k=6, auto=mixed)):
                again, _ = speculative_generate(target, drafter, prompt, 24, eos_token_id=tok.eos_token_id,
                                                **how)  # type: ignore[arg-type]
                assert again == got, (name, kind, how)
            drafting = DecodeCost.prior(verify_s=0.01, draft_token_s=0.001).session(6, plan=(0, 2, 0, 6))
            sampled = [speculative_generate(target, d, prompt, 24, k=6, temperature=0.7, seed=3, auto=cost)[0]
                       for d, cost in ((NoDrafter(), DecodeCost.prior(verify_s=0.01, draft_token_s=1.0)), (drafter, drafting))]
            assert sampled[0] == sampled[1], (name, kind)
    assert lengths["draft"] > lengths["untrained"] + 0.5, lengths


def test_a_bad_target_or_kind_is_one_config_error(tmp_path: Path, corpus: Path) -> None:
    with pytest.raises(ConfigError, match="not a model folder"):
        train_draft(tmp_path / "nothing", "moa", corpus, tmp_path / "out")
    with pytest.raises(ConfigError, match="--kind = 'medusa': must be one of"):
        train_draft(tmp_path / "nothing", "medusa", corpus, tmp_path / "out")  # type: ignore[arg-type]


def test_the_cli_kinds_are_the_trainers() -> None:
    from models import cli
    from models.lm import draft

    assert cli.DRAFT_KINDS == draft.KINDS


def test_the_server_decodes_with_moa_and_eagle_drafts_chain_tree_and_adaptive(target_dir: Path, corpus: Path,
                                                                            tmp_path: Path) -> None:
    from server.llm.completions import LlmService

    for kind in ("moa", "eagle"):
        train_draft(target_dir, kind, corpus, tmp_path / kind, steps=60)  # type: ignore[arg-type]
    plain = LlmService.load(target_dir)
    a = plain.complete("Ham.\nHamlet ", max_tokens=20, temperature=0)
    for kind, how in (("moa", {"auto": False}), ("eagle", {"tree": "3x2x2"}), ("moa", {"k": 6, "adaptive": True})):
        served = LlmService.load(target_dir, tmp_path / kind, **how)  # type: ignore[arg-type]
        b = served.complete("Ham.\nHamlet ", max_tokens=20, temperature=0)
        assert b.speculative and not a.speculative and a.text == b.text and b.target_calls < a.target_calls, (kind, how)
    for kind in ("moa", "eagle"):  # auto, the default: drafts only where its measured costs say drafting pays
        auto = LlmService.load(target_dir, tmp_path / kind)
        assert auto.cost is not None and auto.complete("Ham.\nHamlet ", max_tokens=20, temperature=0).text == a.text


def test_draft_training_resumes_bit_for_bit(target_dir: Path, corpus: Path, tmp_path: Path) -> None:
    """Interrupted after 6 of 12 steps and resumed, a draft has the weights of 12 steps in one go."""
    def interrupt(step: int, loss: float) -> None:
        if step == 6:
            raise KeyboardInterrupt

    small = dict(steps=12, batch=2, context=32)
    train_draft(target_dir, "moa", corpus, tmp_path / "once", **small)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        train_draft(target_dir, "moa", corpus, tmp_path / "twice", checkpoint_minutes=0, progress=interrupt,
                    **small)  # type: ignore[arg-type]
    assert not (tmp_path / "twice" / "moa.safetensors").exists()
    with pytest.raises(ConfigError, match="lr = 0.002: the checkpoint .* was trained with 0.001"):
        train_draft(target_dir, "moa", corpus, tmp_path / "twice", lr=2e-3, resume=True, **small)  # type: ignore[arg-type]
    summary = train_draft(target_dir, "moa", corpus, tmp_path / "twice", resume=True, **small)  # type: ignore[arg-type]
    assert summary["resumed_from_step"] == 6 and summary["steps"] == 12
    assert (tmp_path / "once" / "moa.safetensors").read_bytes() == (tmp_path / "twice" / "moa.safetensors").read_bytes()
