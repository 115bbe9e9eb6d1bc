"""Drafts for a trained target (models/draft.py): trained, saved, loaded back, and lossless through the verify loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from edge.errors import ConfigError
from models.draft import load_drafter, load_target, train_draft
from models.lm import train_lm
from models.speculative import speculative_generate
from tests.models.test_lm import config
from tests.models.test_lm import corpus as corpus


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
    trained = train_draft(target_dir, kind, corpus, tmp_path / "draft", steps=120, seed=0)
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
    assert lengths["draft"] > lengths["untrained"] + 0.5, lengths


def test_a_bad_target_or_kind_is_one_config_error(tmp_path: Path, corpus: Path) -> None:
    with pytest.raises(ConfigError, match="not a model folder"):
        train_draft(tmp_path / "nothing", "moa", corpus, tmp_path / "out")
    with pytest.raises(ConfigError, match="--kind = 'medusa': must be one of"):
        train_draft(tmp_path / "nothing", "medusa", corpus, tmp_path / "out")  # type: ignore[arg-type]


def test_the_cli_kinds_are_the_trainers() -> None:
    from models import cli, draft

    assert cli.DRAFT_KINDS == draft.KINDS


def test_the_server_decodes_with_a_moa_draft(target_dir: Path, corpus: Path, tmp_path: Path) -> None:
    from server.llm import LlmService

    train_draft(target_dir, "moa", corpus, tmp_path / "moa", steps=60)
    plain = LlmService.load(target_dir)
    moa = LlmService.load(target_dir, tmp_path / "moa")
    a = plain.complete("Ham.\nHamlet ", max_tokens=20, temperature=0)
    b = moa.complete("Ham.\nHamlet ", max_tokens=20, temperature=0)
    assert b.speculative and not a.speculative and a.text == b.text and b.target_calls < a.target_calls
