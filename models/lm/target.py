"""The target language model of speculative decoding: a small Llama trained here on plain-text plays.

    trickle train lm --size base --out runs/lm/base                 # 80 min of training, one thread
    trickle train lm --size tiny --steps 200 --out runs/lm/tiny
    trickle train lm --size base --out runs/lm/base --resume        # after an interruption

Data: the ``*.txt`` files of a corpus folder (default DATA/shakespeare/plays); the last four by
sorted name are held out entirely, for the validation loss and the evaluation prompts. Tokenizer:
byte-level BPE (the ``tokenizers`` library) trained on the training plays only. Model:
``transformers.LlamaForCausalLM`` with tied embeddings. Training: AdamW on random contiguous
windows of the training token stream, linear warm-up, then cosine decay over the budget (steps,
or wall-clock minutes of training).

OUT holds what ``AutoModelForCausalLM.from_pretrained(OUT)`` and ``AutoTokenizer.from_pretrained(OUT)``
load (config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json)
and ``train.json`` (validation loss, perplexity, an example generation), written last: a folder
without it is from an unfinished run. OUT/checkpoint/ holds what ``--resume`` continues from.
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch.nn import functional as F

from edge.classify.backends import quiet
from edge.core.config import Config
from edge.core.errors import ConfigError, DataError
from edge.core.files import data_root, write_atomic
from models.weights import load_weights

with quiet():  # torchao's CUDA kernels failing to load, torch's pytree notices: noise on stderr at import
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

Size = Literal["tiny", "small", "base"]
HELD_OUT = 4  # plays held out entirely: validation loss and evaluation prompts
MIN_PLAYS = HELD_OUT + 1
PAD, BOS, EOS = "<pad>", "<s>", "</s>"  # the tokenizer's first tokens
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
CORPUS = Path("shakespeare") / "plays"  # in the data folder
CHECKPOINT = "checkpoint"  # OUT/checkpoint/{state.pt,tokenizer.json}
RESUMABLE = ("steps", "minutes", "checkpoint_minutes", "threads", "sample_tokens")  # what --resume may change

# Parameters (tied embeddings counted once) and the time of one step of 8 x 256 tokens, measured on
# the plays with one thread on the project's 2-core machine while other jobs ran: small 3.69 M,
# 1.85 s; base 12.19 M, 3.66 s. Alone on the machine a base step took 1.46 s: 80 minutes were
# 3296 steps, 6.8 M tokens (4.6 epochs), validation loss 4.00 (40 minutes had given 4.77 and a
# degenerate greedy text, "And, and, and").
SIZES: dict[str, dict[str, Any]] = {
    # ~0.19 M: for tests, 0.04 s a step
    "tiny": dict(vocab_size=512, hidden_size=64, layers=3, heads=4, intermediate_size=192, context=64,
                 batch_size=8, lr=3e-3, warmup_steps=10, minutes=1.0),
    # 3.7 M
    "small": dict(vocab_size=2048, hidden_size=256, layers=4, heads=4, intermediate_size=688, context=256,
                  batch_size=8, lr=1.5e-3, warmup_steps=30, minutes=15.0),
    # 12.2 M: the bench target; 80 minutes of training
    "base": dict(vocab_size=4096, hidden_size=384, layers=6, heads=6, intermediate_size=1024, context=256,
                 batch_size=8, lr=1e-3, warmup_steps=50, minutes=80.0),
}


class LMConfig(Config):
    """One training run of the target LM; fields not given take the defaults of ``size``."""

    size: Size = "base"
    """tiny (~0.2 M parameters, tests), small (~3.7 M) or base (~12 M)."""
    vocab_size: int = Field(4096, ge=300, le=65536)
    """Byte-level BPE vocabulary, the 256 bytes and the three special tokens included."""
    hidden_size: int = Field(384, ge=8)
    """Width of the residual stream."""
    layers: int = Field(6, ge=1, le=64)
    """Decoder layers."""
    heads: int = Field(6, ge=1)
    """Attention heads (as many key/value heads: no grouped queries)."""
    intermediate_size: int = Field(1024, ge=8)
    """Width of the SwiGLU MLP."""
    context: int = Field(256, ge=8, le=8192)
    """Tokens per training window: the model's maximum context."""
    batch_size: int = Field(8, ge=1, le=4096)
    """Windows per step."""
    lr: float = Field(1e-3, gt=0, le=1)
    """AdamW peak learning rate."""
    warmup_steps: int = Field(50, ge=0)
    """Steps of linear warm-up (at most a tenth of a --steps budget)."""
    min_lr_fraction: float = Field(0.1, ge=0, le=1)
    """The cosine decays to this fraction of ``lr`` at the end of the budget."""
    weight_decay: float = Field(0.1, ge=0)
    """AdamW weight decay (matrices only; not norms)."""
    grad_clip: float = Field(1.0, gt=0)
    """Largest gradient norm."""
    steps: int | None = Field(None, ge=1)
    """Budget in optimizer steps (deterministic); None: by minutes only."""
    minutes: float | None = Field(None, gt=0)
    """Budget in minutes of training wall clock (evaluation excluded); without steps, the size's default."""
    seed: int = Field(0, ge=0)
    """Seeds the initial weights and the windows drawn: the same seed and steps give the same weights."""
    checkpoint_minutes: float = Field(5.0, ge=0)
    """Minutes between checkpoints in OUT/checkpoint/ (0: after every step); one is written at the end too."""
    threads: int = Field(1, ge=1)
    """torch threads (on 2 shared cores one is faster than two)."""
    sample_tokens: int = Field(64, ge=1)
    """Tokens of the example generation in train.json (greedy, from a held-out prompt)."""

    @model_validator(mode="before")
    @classmethod
    def _size_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        shape = dict(SIZES.get(data.get("size", "base"), SIZES["base"]))
        if data.get("steps") is not None:
            shape.pop("minutes")
        return {**shape, **data}

    @model_validator(mode="after")
    def _shape(self) -> LMConfig:
        if self.hidden_size % self.heads:
            raise ConfigError("hidden_size", self.hidden_size, f"must be a multiple of heads ({self.heads})")
        if (self.hidden_size // self.heads) % 2:
            raise ConfigError("hidden_size", self.hidden_size, f"hidden_size / heads must be even (rotary embeddings), not "
                              f"{self.hidden_size // self.heads}")
        return self


@dataclass(frozen=True)
class Corpus:
    """The plays of a corpus folder: trained on, and held out (the last four by sorted name)."""

    train: list[Path]
    held_out: list[Path]


def find_plays(folder: Path) -> Corpus:
    if not folder.is_dir():
        raise DataError(f"corpus folder {folder} not found (a folder of plain-text plays, *.txt)")
    plays = sorted(folder.glob("*.txt"))
    if len(plays) < MIN_PLAYS:
        raise DataError(f"corpus folder {folder} has {len(plays)} .txt files; needs at least {MIN_PLAYS} "
                        f"({HELD_OUT} are held out)")
    return Corpus(train=plays[:-HELD_OUT], held_out=plays[-HELD_OUT:])


def default_corpus(data: str | os.PathLike[str] | None = None) -> Path:
    return data_root(data) / CORPUS


def read_texts(paths: list[Path]) -> list[str]:
    try:
        return [p.read_text(encoding="utf-8") for p in paths]
    except UnicodeDecodeError as e:
        raise DataError(f"corpus file is not UTF-8 text: {e}") from None


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE (GPT-2 style: every byte is a token, so any text encodes)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer, length=len(texts))
    return tok


# The chat template trickle's models carry (tokenizer_config.json's "chat_template", used by the
# server's /v1/chat/completions): a chat written as a scene of a play, the text the model was
# trained on: the system message a stage direction in brackets, each turn a speech headed by its
# speaker in capitals (USER. / ASSISTANT.), and the assistant's turn opened for the model to speak.
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{{ '[' + m['content'] + ']\\n\\n' }}"
    "{%- else -%}{{ m['role'] | upper + '.\\n' + m['content'] + '\\n\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'ASSISTANT.\\n' }}{%- endif -%}"
)


def hf_tokenizer(tok: Tokenizer, context: int) -> PreTrainedTokenizerFast:
    """The tokenizer as transformers takes it (``AutoTokenizer.from_pretrained`` loads it back),
    with trickle's chat template."""
    out = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                  model_max_length=context, clean_up_tokenization_spaces=False)
    out.chat_template = CHAT_TEMPLATE
    return out


def token_stream(tok: Tokenizer, texts: list[str]) -> torch.Tensor:
    """Every text's ids followed by </s>, concatenated: (N,) int64."""
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids += [*enc.ids, EOS_ID]
    return torch.tensor(ids, dtype=torch.long)


def build_model(cfg: LMConfig, seed: int | None = None) -> LlamaForCausalLM:
    """A freshly initialised Llama of ``cfg``'s shape (weights seeded by ``seed``, else cfg.seed)."""
    config = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.layers,
                         num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
                         intermediate_size=cfg.intermediate_size, max_position_embeddings=cfg.context,
                         tie_word_embeddings=True, pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID)
    torch.manual_seed(cfg.seed if seed is None else seed)
    return LlamaForCausalLM(config)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once


def lr_at(cfg: LMConfig, step: int, progress: float) -> float:
    """Linear warm-up over the first steps, then cosine decay to min_lr_fraction · lr as the budget's
    ``progress`` (0 → 1: steps done over steps, or minutes spent over minutes) runs out."""
    warmup = cfg.warmup_steps if cfg.steps is None else min(cfg.warmup_steps, cfg.steps // 10)
    warm = min(1.0, (step + 1) / (warmup + 1))
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * warm * (cfg.min_lr_fraction + (1 - cfg.min_lr_fraction) * cosine)


def windows(tokens: torch.Tensor, batch: int, context: int, gen: torch.Generator) -> torch.Tensor:
    """``batch`` random contiguous windows of context + 1 tokens: (B, T + 1)."""
    starts = torch.randint(0, len(tokens) - context, (batch,), generator=gen)  # (B,)
    return tokens[starts[:, None] + torch.arange(context + 1)]  # (B, T + 1)


def next_token_loss(model: LlamaForCausalLM, x: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each token of ``x`` (B, T + 1) given the ones before it (nats)."""
    logits = model(input_ids=x[:, :-1]).logits  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())


@torch.no_grad()
def validation_loss(model: LlamaForCausalLM, tokens: torch.Tensor, context: int, batch: int = 16) -> float:
    """Mean token cross-entropy (nats) over consecutive non-overlapping windows of ``tokens``."""
    was_training, n_windows = model.training, (len(tokens) - 1) // context
    if n_windows < 1:
        raise DataError(f"the held-out plays have {len(tokens)} tokens, fewer than one context ({context} + 1)")
    model.eval()
    total = 0.0
    for first in range(0, n_windows, batch):
        starts = torch.arange(first, min(first + batch, n_windows)) * context  # (b,)
        x = tokens[starts[:, None] + torch.arange(context + 1)]  # (b, T + 1)
        total += next_token_loss(model, x).item() * len(starts)
    model.train(was_training)
    return total / n_windows


def example_prompt(text: str, chars: int = 240) -> str:
    """A few whole lines from the middle of a held-out play (from the first paragraph, else line, after its midpoint)."""
    middle = len(text) // 2
    paragraph, line = text.find("\n\n", middle), text.find("\n", middle)
    start = paragraph + 2 if paragraph >= 0 else line + 1 if line >= 0 else middle
    piece = text[start:start + chars]
    return piece[:piece.rfind("\n") + 1] if "\n" in piece else piece


@torch.no_grad()
def generate_example(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, prompt: str, new_tokens: int) -> str:
    """The greedy continuation of ``prompt``, both within the model's context (the prompt's end kept)."""
    context = model.config.max_position_embeddings
    new_tokens = min(new_tokens, context // 2)
    # the prompt may be longer than the context: its end is kept below, so the tokenizer need not warn
    ids = tok(prompt, return_tensors="pt", verbose=False).input_ids[:, -(context - new_tokens):]  # (1, P)
    model.eval()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=tok.pad_token_id)
    return str(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))


@dataclass
class TrainState:
    """What a checkpoint holds besides the tokenizer: enough to continue bit for bit."""

    step: int
    train_time_s: float
    model: LlamaForCausalLM
    optimizer: torch.optim.AdamW
    gen: torch.Generator  # draws the windows


def new_state(cfg: LMConfig) -> TrainState:
    model = build_model(cfg)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]  # norms: no weight decay
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    return TrainState(0, 0.0, model, optimizer, gen)


def save_checkpoint(state: TrainState, cfg: LMConfig, tok: Tokenizer, corpus: Corpus, folder: Path) -> None:
    payload = {"step": state.step, "train_time_s": state.train_time_s, "model": state.model.state_dict(),
               "optimizer": state.optimizer.state_dict(), "gen": state.gen.get_state(), "torch_rng": torch.get_rng_state(),
               "config": cfg.model_dump(mode="json"), "train_plays": [p.name for p in corpus.train],
               "held_out_plays": [p.name for p in corpus.held_out]}
    buf = io.BytesIO()
    torch.save(payload, buf)
    write_atomic(folder / "tokenizer.json", tok.to_str())
    write_atomic(folder / "state.pt", buf.getvalue())


def load_checkpoint(cfg: LMConfig, corpus: Corpus, folder: Path) -> tuple[TrainState, Tokenizer]:
    """The state saved in ``folder``; a config or corpus other than the checkpoint's is an error."""
    if not (folder / "state.pt").is_file():
        raise DataError(f"--resume: no checkpoint in {folder}")
    payload = load_weights(folder / "state.pt")
    now = cfg.model_dump(mode="json")
    for field, then in payload["config"].items():
        if field not in RESUMABLE and now.get(field) != then:
            raise ConfigError(field, now.get(field), f"the checkpoint in {folder} was trained with {then!r}")
    if payload["train_plays"] != [p.name for p in corpus.train] or payload["held_out_plays"] != [p.name for p in corpus.held_out]:
        raise DataError(f"--resume: the corpus's plays differ from those the checkpoint in {folder} was trained on")
    state = new_state(cfg)
    state.model.load_state_dict(payload["model"])
    state.optimizer.load_state_dict(payload["optimizer"])
    state.gen.set_state(payload["gen"])
    torch.set_rng_state(payload["torch_rng"])
    state.step, state.train_time_s = payload["step"], payload["train_time_s"]
    return state, Tokenizer.from_file(str(folder / "tokenizer.json"))


def progress_of(cfg: LMConfig, state: TrainState) -> float:
    """How much of the budget is spent (0 → 1): the larger of steps and minutes, where given."""
    done = [state.step / cfg.steps] if cfg.steps is not None else []
    if cfg.minutes is not None:
        done.append(state.train_time_s / (60 * cfg.minutes))
    return max(done)


# progress(step, fraction of the budget spent, the step's training loss)
Progress = Callable[[int, float, float], None]


def train_lm(cfg: LMConfig, corpus_dir: Path, out: Path, resume: bool = False,
             progress: Progress | None = None) -> dict[str, Any]:
    """Train (or, with ``resume``, continue) the LM of ``cfg`` on a corpus folder; save it in ``out``.

    Returns the summary written to ``out/train.json``.
    """
    wall_start = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    corpus = find_plays(corpus_dir)
    train_texts, held_texts = read_texts(corpus.train), read_texts(corpus.held_out)
    folder = out / CHECKPOINT
    if resume:
        state, tok = load_checkpoint(cfg, corpus, folder)
        resumed_from: int | None = state.step
    else:
        tok, state, resumed_from = train_tokenizer(train_texts, cfg.vocab_size), new_state(cfg), None
    train_tokens, held_tokens = token_stream(tok, train_texts), token_stream(tok, held_texts)
    if len(train_tokens) <= cfg.context:
        raise DataError(f"the training plays have {len(train_tokens)} tokens, fewer than one context ({cfg.context} + 1)")

    losses: list[float] = []
    last_save = time.perf_counter()
    state.model.train()
    while progress_of(cfg, state) < 1:
        t0 = time.perf_counter()
        lr = lr_at(cfg, state.step, progress_of(cfg, state))
        for group in state.optimizer.param_groups:
            group["lr"] = lr
        loss = next_token_loss(state.model, windows(train_tokens, cfg.batch_size, cfg.context, state.gen))
        state.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(state.model.parameters(), cfg.grad_clip)
        state.optimizer.step()
        state.step += 1
        state.train_time_s += time.perf_counter() - t0
        losses.append(loss.item())
        if time.perf_counter() - last_save >= 60 * cfg.checkpoint_minutes:
            save_checkpoint(state, cfg, tok, corpus, folder)
            last_save = time.perf_counter()
        if progress is not None:
            progress(state.step, min(1.0, progress_of(cfg, state)), losses[-1])
    save_checkpoint(state, cfg, tok, corpus, folder)

    val_loss = validation_loss(state.model, held_tokens, cfg.context, 2 * cfg.batch_size)
    hf_tok = hf_tokenizer(tok, cfg.context)
    prompt = example_prompt(held_texts[0])
    summary = {
        "size": cfg.size, "config": cfg.model_dump(mode="json"), "seed": cfg.seed,
        "parameters": parameter_count(state.model), "steps": state.step, "resumed_from_step": resumed_from,
        "tokens_seen": state.step * cfg.batch_size * cfg.context, "train_tokens": len(train_tokens),
        "train_time_s": round(state.train_time_s, 3), "step_time_s": round(state.train_time_s / max(state.step, 1), 4),
        "final_train_loss": sum(losses[-20:]) / len(losses[-20:]) if losses else None,
        "val_loss": val_loss, "val_perplexity": math.exp(val_loss), "val_tokens": len(held_tokens),
        "train_plays": [p.name for p in corpus.train], "held_out_plays": [p.name for p in corpus.held_out],
        "example": {"play": corpus.held_out[0].name, "prompt": prompt,
                    "greedy_continuation": generate_example(state.model, hf_tok, prompt, cfg.sample_tokens)},
    }
    save_model(state.model, hf_tok, out)
    summary["wall_time_s"] = round(time.perf_counter() - wall_start, 3)
    write_atomic(out / "train.json", json.dumps(summary, indent=1) + "\n")
    return summary


def save_model(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, out: Path) -> list[Path]:
    """``save_pretrained`` of both into a staging folder, each file synced, then renamed into ``out``.

    An older train.json is removed first and the caller writes the new one last, so a folder
    holding train.json holds a whole model.
    """
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.json").unlink(missing_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".staging-"))
    try:
        with quiet():  # transformers' "Writing model shards" progress bar
            model.save_pretrained(staging)
            tok.save_pretrained(staging)
        files = sorted(staging.iterdir())
        for f in files:
            os.chmod(f, 0o644)  # safetensors writes 0600
            with f.open("rb") as fh:
                os.fsync(fh.fileno())
        for f in files:
            os.replace(f, out / f.name)
    finally:
        for f in staging.iterdir():
            f.unlink()
        staging.rmdir()
    return [out / f.name for f in files]
