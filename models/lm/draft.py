"""Draft models for a target LM, trained on the target's own corpus and outputs: ``trickle train draft``.

    summary = train_draft(Path("runs/lm/base"), "moa", corpus_dir, Path("runs/lm/moa"), steps=2000)
    drafter = load_drafter(Path("runs/lm/moa"), target)        # a models.lm.speculative.Drafter

Kinds, same data and budget:

- ``moa``: the Mixture-of-Attentions draft (``models.lm.moa``), trained with the paper's loss.
- ``eagle``: an EAGLE-style draft (``models.lm.eagle``): one layer on the target's last hidden
  state and the next token's embedding, the paper's main baseline.
- ``independent``: a small Llama with the target's tokenizer (the classic draft model; usable
  with transformers' assisted generation), of about the MoA draft's trained parameter count,
  distilled from the target (forward KL to its next-token distribution).

A draft folder holds ``draft.json`` (kind, target, parameter count, validation figures). An
independent draft is a ``save_pretrained`` folder; a MoA draft keeps its own weights in
``moa.safetensors`` (the embedding and LM head are the target's).
"""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch

from edge.classify.backends import quiet
from edge.core.errors import ConfigError, DataError
from edge.core.files import write_atomic
from models.lm.cache import sliding_windows
from models.lm.eagle import EagleDraft, EagleDrafter
from models.lm.moa import MoADraft, MoADrafter
from models.lm.speculative import Drafter, IndependentDrafter, draft_vocabulary
from models.lm.target import find_plays, read_texts, token_stream, windows
from models.weights import load_weights

Kind = Literal["moa", "eagle", "independent"]
KINDS: tuple[Kind, ...] = ("moa", "eagle", "independent")
DRAFT_VOCAB = 1024  # tokens a draft's head reads when drafting (a quarter of the base target's 4096)
MANIFEST = "draft.json"


def load_target(folder: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of a target folder, frozen; a missing or broken folder is a ConfigError."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (folder / "config.json").is_file():
        raise ConfigError("--target", str(folder), "not a model folder (no config.json; train one with trickle train lm)")
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError("--target", str(folder), f"an unreadable config.json ({str(err).strip().splitlines()[0]})") from None
    sliding_windows(config)  # an encoder-decoder, or layers without a key/value cache: one ConfigError, before loading
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    except ValueError as err:  # transformers: a configuration that no causal-LM class takes
        raise ConfigError("--target", str(folder), f"not a causal LM ({str(err).strip().splitlines()[0]})") from None
    for p in model.parameters():
        p.requires_grad_(False)
    return model, AutoTokenizer.from_pretrained(folder, local_files_only=True)


def trainable_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def independent_for(target: Any, budget: int, seed: int) -> Any:
    """A two-layer Llama with the target's vocabulary and about ``budget`` trainable parameters in
    all (its tied embedding included): the widest multiple of 32 that fits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = target.config
    hidden = 32
    while 24 * (hidden + 32) ** 2 + cfg.vocab_size * (hidden + 32) <= budget:  # ~12 d² per layer, and the embedding
        hidden += 32
    heads = max(1, hidden // 64)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=hidden, intermediate_size=int(8 * hidden / 3) // 8 * 8,
        num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=True,
        pad_token_id=cfg.pad_token_id, bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id))


def _moa_size(target: Any) -> int:
    """The MoA draft's trainable parameters for ``target`` (an independent draft's budget), or the
    EAGLE-style draft's for a target whose attention the MoA draft cannot read."""
    try:
        return trainable_parameters(MoADraft.for_target(target))
    except ConfigError:
        return trainable_parameters(EagleDraft.for_target(target))


def _kl_to_target(target: Any, draft: Any, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        p = target(input_ids=x).logits.softmax(-1)
    return -(p * draft(input_ids=x).logits.log_softmax(-1)).sum(-1).mean()


CHECKPOINT = "checkpoint"


def lr_at(lr: float, step: int, progress: float, warmup: int = 50) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to a tenth of ``lr`` as the budget's
    ``progress`` (0 → 1) runs out."""
    warm = min(1.0, (step + 1) / warmup)
    return lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def train_draft(target_dir: Path, kind: Kind, corpus_dir: Path, out: Path, steps: int = 1000, minutes: float | None = None,
                batch: int = 8, context: int | None = None, lr: float = 1e-3, seed: int = 0, resume: bool = False,
                checkpoint_minutes: float = 5.0, draft_vocab: int = DRAFT_VOCAB,
                progress: Callable[[int, float], None] | None = None) -> dict[str, Any]:
    """Train a draft of ``kind`` for the target in ``target_dir``; write it to ``out``; return the summary.

    The budget is ``steps`` or ``minutes`` of training, whichever runs out first; the learning rate
    warms up, then decays (cosine) over it. ``out/checkpoint/state.pt`` is written every
    ``checkpoint_minutes`` and at the end; ``resume`` continues from it (same kind, target, batch,
    context, lr and seed; ``steps`` and ``minutes`` may grow) bit for bit as if never stopped
    (with a steps budget). ``draft_vocab``: the most frequent training tokens the draft's head reads
    when drafting (``models.lm.speculative.DraftHead``; 0: the whole vocabulary); training uses all.
    """
    if kind not in KINDS:
        raise ConfigError("--kind", kind, f"must be one of {list(KINDS)}")
    if steps < 1 or batch < 1:
        raise ConfigError("--steps/--batch", (steps, batch), "must be >= 1")
    torch.set_num_threads(1)
    target, tok = load_target(target_dir)
    limit = getattr(target.config, "max_position_embeddings", None) or context
    if limit is None:
        raise ConfigError("--context", None, f"needed: the target's config ({target.config.model_type}) gives no "
                          "max_position_embeddings")
    context = min(context or limit, limit) - 1
    corpus = find_plays(corpus_dir)
    train_ids = token_stream(tok.backend_tokenizer, read_texts(corpus.train))
    val_ids = token_stream(tok.backend_tokenizer, read_texts(corpus.held_out))
    if len(train_ids) <= context + 1 or len(val_ids) <= context + 1:
        raise DataError(f"corpus {corpus_dir}: fewer tokens than one context window ({context + 1})")
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    own: MoADraft | EagleDraft | None = (MoADraft.for_target(target) if kind == "moa" else
                                         EagleDraft.for_target(target) if kind == "eagle" else None)
    model = own if own is not None else independent_for(target, _moa_size(target), seed)

    def loss_of(x: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        if own is not None:
            return own.loss(target, x, gen)
        kl = _kl_to_target(target, model, x)
        return kl, {"forward_kl": kl.item()}

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    fixed = {"kind": kind, "target": str(target_dir), "batch": batch, "context": context, "lr": lr, "seed": seed}
    step, train_time, resumed_from = 0, 0.0, None
    folder = out / CHECKPOINT
    if resume:
        step, train_time = _load_checkpoint(folder, fixed, model, opt, gen)
        resumed_from = step

    def save() -> None:
        buf = io.BytesIO()
        torch.save({"fixed": fixed, "step": step, "train_time_s": train_time, "model": model.state_dict(),
                    "optimizer": opt.state_dict(), "gen": gen.get_state(), "torch_rng": torch.get_rng_state()}, buf)
        write_atomic(folder / "state.pt", buf.getvalue())

    def spent() -> float:
        return max(step / steps, train_time / (60 * minutes) if minutes else 0.0)

    last_save = time.perf_counter()
    model.train()
    while spent() < 1:
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(lr, step, spent())
        loss, _ = loss_of(windows(train_ids, batch, context, gen)[:, :-1])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        train_time += time.perf_counter() - t0
        if time.perf_counter() - last_save >= 60 * checkpoint_minutes:  # 0: every step
            save()
            last_save = time.perf_counter()
        if progress is not None:
            progress(step, float(loss.detach()))
    save()
    model.eval()
    with torch.no_grad():
        val_windows = torch.stack([val_ids[i : i + context] for i in range(0, len(val_ids) - context, context)][:16])
        val_loss, val_stats = loss_of(val_windows)
    summary = {"kind": kind, "target": str(target_dir), "trainable_parameters": trainable_parameters(model),
               "steps": step, "resumed_from_step": resumed_from, "train_seconds": round(train_time, 3), "seed": seed,
               "context": context + 1, "batch": batch, "lr": lr, "val_loss": float(val_loss), "val": val_stats,
               "draft_vocab": draft_vocabulary(train_ids, target.config.vocab_size, draft_vocab) if draft_vocab else None}
    _save(model, kind, tok, out, summary)
    return summary


def _load_checkpoint(folder: Path, fixed: dict[str, Any], model: torch.nn.Module, opt: torch.optim.Optimizer,
                     gen: torch.Generator) -> tuple[int, float]:
    """Restore a draft's training state; one error naming what differs from the checkpoint."""
    if not (folder / "state.pt").is_file():
        raise DataError(f"--resume: no checkpoint in {folder}")
    payload = load_weights(folder / "state.pt")
    for name, then in payload["fixed"].items():
        if fixed.get(name) != then:
            raise ConfigError(name, fixed.get(name), f"the checkpoint in {folder} was trained with {then!r}")
    model.load_state_dict(payload["model"])
    opt.load_state_dict(payload["optimizer"])
    gen.set_state(payload["gen"])
    torch.set_rng_state(payload["torch_rng"])
    return int(payload["step"]), float(payload["train_time_s"])


def _save(model: Any, kind: Kind, tok: Any, out: Path, summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if kind in ("moa", "eagle"):
        from safetensors.torch import save

        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        write_atomic(out / f"{kind}.safetensors", save(state))
        shape = model.shape()
        summary = {**summary, "shape": shape}
    else:
        with quiet():  # transformers' "Writing model shards" progress bar
            model.save_pretrained(out)
            tok.save_pretrained(out)
    write_atomic(out / MANIFEST, json.dumps(summary, indent=1, sort_keys=True) + "\n")


def load_drafter(folder: Path, target: Any) -> Drafter:
    """The drafter of a draft folder written by ``train_draft`` (or any causal LM folder with the
    target's tokenizer, used as an independent draft)."""
    manifest = folder / MANIFEST
    doc: dict[str, Any] = json.loads(manifest.read_text()) if manifest.is_file() else {"kind": "independent"}
    if doc["kind"] == "moa":
        from safetensors.torch import load

        draft = MoADraft(**doc["shape"])
        draft.load_state_dict(load((folder / "moa.safetensors").read_bytes()))
        draft.attach(target)
        return MoADrafter(draft.to(target.dtype), doc.get("draft_vocab"))
    if doc["kind"] == "eagle":
        from safetensors.torch import load

        eagle = EagleDraft(**doc["shape"])
        eagle.load_state_dict(load((folder / "eagle.safetensors").read_bytes()))
        eagle.attach(target)
        return EagleDrafter(eagle.to(target.dtype), doc.get("draft_vocab"))
    from transformers import AutoModelForCausalLM

    if not (folder / "config.json").is_file():
        raise ConfigError("--draft", str(folder), "not a draft folder (no draft.json or config.json)")
    return IndependentDrafter(AutoModelForCausalLM.from_pretrained(folder, local_files_only=True), doc.get("draft_vocab"))
