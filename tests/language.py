"""What the language-model tests share: tiny random Llama models (a target and smaller drafts
sharing a byte-level BPE tokenizer) and synthetic plays to train on. The fixtures that build them
once per session (``models``, ``corpus``) are in ``tests/conftest.py``."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SENTENCES = ["To be, or not to be, that is the question.", "All the world's a stage, and all the men and women merely players.",
             "Now is the winter of our discontent made glorious summer.", "O Romeo, Romeo, wherefore art thou Romeo?",
             "The quality of mercy is not strained; it droppeth as the gentle rain from heaven."]
CONTEXT = 512


@dataclass
class Models:
    """The folders of the tiny target and its drafts."""

    target: Path
    draft: Path
    small_vocab_draft: Path


def save_llama(folder: Path, tokenizer: Any, vocab: int, seed: int, layers: int, hidden: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=None)
    # float64: one forward over K + 1 tokens and K + 1 forwards over one token agree on every
    # argmax only when rounding cannot flip a near tie
    LlamaForCausalLM(config).double().save_pretrained(folder)
    tokenizer.save_pretrained(folder)


NAMES = ["Hamlet", "Ophelia", "Horatio", "Laertes", "Polonius"]
VERBS = ["speaks", "weeps", "laughs", "swears", "sleeps"]
PLACES = ["in the castle", "on the platform", "by the river", "at the gate", "in the hall"]


def play(rng: random.Random, lines: int) -> str:
    """A play of a tiny grammar: speaker lines and stage directions, learnable in seconds."""
    out = []
    for _ in range(lines):
        name = rng.choice(NAMES)
        if rng.random() < 0.2:
            out.append(f"[Enter {name}.]\n")
        else:
            out.append(f"{name[:3]}.\n{name} {rng.choice(VERBS)} {rng.choice(PLACES)}.\n")
    return "\n".join(out)
