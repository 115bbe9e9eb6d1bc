"""The target LM (models/lm/target.py): a tiny Llama trained for seconds on synthetic plays, loaded back the
way any Hugging Face tool loads it, deterministic per seed, resumable to the very same weights."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from edge.core.errors import ConfigError, DataError
from models.lm.target import EOS, LMConfig, build_model, find_plays, train_lm, validation_loss
from trickle.cli import main

STEPS = 80
def config(**fields: object) -> LMConfig:
    return LMConfig.model_validate({"size": "tiny", "steps": STEPS, **fields})


@pytest.fixture(scope="module")
def trained(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lm") / "a"
    train_lm(config(), corpus, out)
    return out


def summary(out: Path) -> dict:
    return json.loads((out / "train.json").read_text())


def held_out_tokens(corpus: Path, tok) -> torch.Tensor:
    ids: list[int] = []
    for path in find_plays(corpus).held_out:
        ids += [*tok(path.read_text()).input_ids, tok.convert_tokens_to_ids(EOS)]
    return torch.tensor(ids)


def test_loads_with_transformers_auto_classes(trained: Path, corpus: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(trained)
    model = AutoModelForCausalLM.from_pretrained(trained)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.tie_word_embeddings
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.model_max_length) == ("<s>", "</s>", "<pad>", 64)
    text = "Señor — ¿qué? Hamlet swears by the river.\n"  # byte-level: any text round-trips
    assert tok.decode(tok(text).input_ids) == text
    # the chat template the server's /v1/chat/completions renders with: a chat as a scene of a play
    chat = tok.apply_chat_template([{"role": "system", "content": "A platform."}, {"role": "user", "content": "Who's there?"}],
                                   add_generation_prompt=True, tokenize=False)
    assert chat == "[A platform.]\n\nUSER.\nWho's there?\n\nASSISTANT.\n"
    doc = summary(trained)
    assert doc["held_out_plays"] == ["play3.txt", "play4.txt", "play5.txt", "play6.txt"]
    assert doc["steps"] == STEPS and doc["parameters"] == sum(p.numel() for p in model.parameters())
    # the loaded pair is the pair that was evaluated: same loss through the loaded tokenizer
    assert validation_loss(model, held_out_tokens(corpus, tok), 64) == pytest.approx(doc["val_loss"], abs=1e-5)
    assert doc["val_perplexity"] == pytest.approx(math.exp(doc["val_loss"]))
    prompt = tok(doc["example"]["prompt"], return_tensors="pt").input_ids
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, do_sample=False,
                         pad_token_id=tok.pad_token_id)
    assert tok.decode(out[0, prompt.shape[1]:], skip_special_tokens=True) == doc["example"]["greedy_continuation"]


def test_validation_loss_fell_from_the_untrained_models(trained: Path, corpus: Path) -> None:
    from transformers import AutoTokenizer

    tokens = held_out_tokens(corpus, AutoTokenizer.from_pretrained(trained))
    untrained = validation_loss(build_model(config()), tokens, 64)
    assert untrained == pytest.approx(math.log(512), abs=0.3)  # near uniform over the vocabulary
    assert summary(trained)["val_loss"] < untrained - 3.0


def test_same_seed_same_bytes(trained: Path, corpus: Path, tmp_path: Path) -> None:
    train_lm(config(), corpus, tmp_path / "b")
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / "b" / name).read_bytes() == (trained / name).read_bytes(), name
    train_lm(config(seed=1), corpus, tmp_path / "c")
    assert (tmp_path / "c" / "model.safetensors").read_bytes() != (trained / "model.safetensors").read_bytes()


def test_resume_gives_the_uninterrupted_weights(trained: Path, corpus: Path, tmp_path: Path) -> None:
    # Exactly equal: the checkpoint holds weights, AdamW's moments and step counts, the step and the
    # window generator's state, and one CPU thread computes each step the same way.
    out = tmp_path / "r"

    def interrupt(step: int, fraction: float, loss: float) -> None:
        if step == STEPS // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_lm(config(checkpoint_minutes=0), corpus, out, progress=interrupt)
    assert not (out / "model.safetensors").exists() and (out / "checkpoint" / "state.pt").exists()
    with pytest.raises(ConfigError, match="lr = 0.001: the checkpoint in .* was trained with 0.003"):
        train_lm(config(lr=1e-3), corpus, out, resume=True)
    train_lm(config(), corpus, out, resume=True)
    assert summary(out)["resumed_from_step"] == STEPS // 2 and summary(out)["steps"] == STEPS
    assert (out / "model.safetensors").read_bytes() == (trained / "model.safetensors").read_bytes()


def test_cli_trains_and_reports_json(corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    rc = main(["train", "lm", "--corpus", str(corpus), "--size", "tiny", "--steps", "5", "--out", str(out),
               "--no-progress", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["steps"] == 5 and doc["size"] == "tiny" and (out / "model.safetensors").exists()
    assert main(["train", "lm", "--dataset", "digits", "--out", str(out)]) == 1
    assert capsys.readouterr().err == ("trickle train: error: --dataset = 'digits': applies to trickle train nexume and "
                                       "firmbound only\n")


def test_the_cli_sizes_are_the_models() -> None:
    from typing import get_args

    from models import cli
    from models.lm import target as lm

    assert cli.LM_SIZES == get_args(lm.Size) == tuple(lm.SIZES)


def test_a_corpus_of_too_few_plays(tmp_path: Path) -> None:
    for i in range(4):
        (tmp_path / f"p{i}.txt").write_text("A line.\n")
    with pytest.raises(DataError, match=r"has 4 \.txt files; needs at least 5 \(4 are held out\)"):
        find_plays(tmp_path)


def test_missing_corpus_is_one_line_exit_1(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "trickle", "train", "lm", "--corpus", str(tmp_path / "none"),
                           "--size", "tiny", "--out", str(tmp_path / "out"), "--no-progress"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr == (f"trickle train: error: corpus folder {tmp_path / 'none'} not found "
                           "(a folder of plain-text plays, *.txt)\n")
    assert not (tmp_path / "out").exists()
