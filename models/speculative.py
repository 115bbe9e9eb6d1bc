"""Speculative decoding on Hugging Face causal LMs: draft K tokens, verify them with one target
forward, keep the longest valid prefix plus the target's own next token, roll the caches back.

    target = AutoModelForCausalLM.from_pretrained("runs/lm/base")
    drafter = IndependentDrafter(AutoModelForCausalLM.from_pretrained("runs/lm/draft"))
    tokens, stats = speculative_generate(target, drafter, prompt_ids, max_new_tokens=128, k=4)

The verify loop never knows which draft it holds (transformers' ``CandidateGenerator`` is the
model): a ``Drafter`` proposes tokens (and, for sampling, the distributions it drew them from)
and is told how many were kept. The acceptance rule is ``edge.speculative`` — the same numpy
function a torch-free device runs — so greedy output is the target's own greedy output token for
token, and sampled output is distributed exactly as the target's (Leviathan et al. 2023).

Caches: the target's ``DynamicCache`` always holds every token but the last one; one verify call
feeds ``[last, x_1..x_K]`` and is then cropped back to the verified prefix (``crop`` takes a
negative count in transformers 5).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from edge.speculative import accept_greedy, accept_sampling, distribution


@dataclass
class DecodeStats:
    """What one generation cost: target calls, drafted and kept tokens, wall time."""

    new_tokens: int = 0
    target_calls: int = 0
    drafted: int = 0
    kept: int = 0
    seconds: float = 0.0
    kept_per_call: list[int] = field(default_factory=list)

    @property
    def accept_length(self) -> float:
        """Mean tokens added per target call, the target's own token included (the paper's τ)."""
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


class Drafter(Protocol):
    def reset(self, prompt: list[int]) -> None:
        """Start a new sequence."""

    def propose(self, seq: list[int], k: int, temperature: float, top_p: float,
                rng: np.random.Generator) -> tuple[list[int], np.ndarray | None]:
        """K draft tokens after ``seq`` and, when sampling, the (K, V) distributions they were drawn from."""

    def accepted(self, seq: list[int]) -> None:
        """``seq`` is the sequence now verified (the last token is the target's own): drop the rest."""


class _CachedLM:
    """A causal LM with a KV cache over a growing token sequence; it feeds only what is new."""

    def __init__(self, model: Any, keep_hidden: bool = False) -> None:
        self.model = model.eval()
        self.cache: Any = None
        self.keep_hidden = keep_hidden  # EAGLE-style drafts read the target's last hidden states
        self.hidden: torch.Tensor | None = None  # (cached, H) last-layer states of the cached tokens

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.hidden = None

    @property
    def cached(self) -> int:
        return int(self.cache.get_seq_length()) if self.cache is not None else 0

    @torch.inference_mode()
    def logits(self, seq: list[int], upto: int | None = None) -> torch.Tensor:
        """Logits (n, V) after each of the tokens seq[cached:upto] fed now (float64 on the CPU)."""
        new = seq[self.cached : upto]
        out = self.model(input_ids=torch.tensor([new]), past_key_values=self.cache, use_cache=True,
                         output_hidden_states=self.keep_hidden)
        self.cache = out.past_key_values
        if self.keep_hidden:
            last = out.hidden_states[-1][0]
            self.hidden = last if self.hidden is None else torch.cat([self.hidden, last])
        return out.logits[0].double()

    def crop(self, length: int) -> None:
        """Keep the cache of the first ``length`` tokens only."""
        extra = self.cached - length
        if extra > 0:
            self.cache.crop(-extra)
        if self.hidden is not None:
            self.hidden = self.hidden[:length]


def draft_tokens(next_logits: Callable[[list[int]], np.ndarray], k: int, temperature: float, top_p: float,
                 rng: np.random.Generator) -> tuple[list[int], np.ndarray | None]:
    """K tokens from a draft's ``next_logits(drafted so far)``: the argmax when greedy, else sampled,
    with the (K, V) distributions they were drawn from (what the acceptance rule needs)."""
    tokens: list[int] = []
    dists = []
    for _ in range(k):
        logits = next_logits(tokens)
        if temperature == 0:
            tokens.append(int(logits.argmax()))
        else:
            q = distribution(logits, temperature, top_p)
            dists.append(q)
            tokens.append(int(rng.choice(len(q), p=q)))
    return tokens, (np.stack(dists) if dists else None)


class TargetReader:
    """Base of drafts that read the target's states of the verified prefix (MoA, EAGLE-style): the
    verify loop hands them its cached target (``attach_target``); they keep nothing per sequence."""

    def __init__(self) -> None:
        self.target_lm: Any = None

    def attach_target(self, target_lm: Any) -> None:
        self.target_lm = target_lm

    def reset(self, prompt: list[int]) -> None:
        pass

    def accepted(self, seq: list[int]) -> None:
        pass


class NoDrafter:
    """Proposes nothing: the verify loop then decodes plainly, one target call per token (the
    baseline, with the very same sampling)."""

    def reset(self, prompt: list[int]) -> None:
        pass

    def propose(self, seq: list[int], k: int, temperature: float, top_p: float,
                rng: np.random.Generator) -> tuple[list[int], np.ndarray | None]:
        return [], None

    def accepted(self, seq: list[int]) -> None:
        pass


class IndependentDrafter:
    """A small causal LM with the target's tokenizer: the classic draft model."""

    def __init__(self, model: Any) -> None:
        self.lm = _CachedLM(model)

    def reset(self, prompt: list[int]) -> None:
        self.lm.reset()

    def propose(self, seq: list[int], k: int, temperature: float, top_p: float,
                rng: np.random.Generator) -> tuple[list[int], np.ndarray | None]:
        return draft_tokens(lambda drafted: self.lm.logits(seq + drafted)[-1].numpy(), k, temperature, top_p, rng)

    def accepted(self, seq: list[int]) -> None:
        self.lm.crop(len(seq) - 1)


@torch.inference_mode()
def speculative_generate(target: Any, drafter: Drafter, prompt: list[int], max_new_tokens: int, k: int = 4,
                         temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                         eos_token_id: int | None = None,
                         on_tokens: Callable[[list[int]], None] | None = None) -> tuple[list[int], DecodeStats]:
    """The prompt's continuation by speculative decoding, and what it cost. ``temperature`` 0 is
    greedy (lossless token for token); otherwise speculative sampling (lossless in distribution).
    ``on_tokens`` is called with each block of tokens as it is verified (for streaming); the
    blocks concatenate to the returned tokens."""
    if k < 1 or max_new_tokens < 0 or not prompt:
        raise ValueError(f"k = {k}, max_new_tokens = {max_new_tokens}, prompt of {len(prompt)} tokens: need k >= 1, "
                         "max_new_tokens >= 0 and a non-empty prompt")
    rng = np.random.default_rng(seed)
    lm = _CachedLM(target, keep_hidden=getattr(drafter, "needs_hidden", False))
    lm.reset()
    drafter.reset(prompt)
    attach = getattr(drafter, "attach_target", None)
    if attach is not None:  # a draft that reads the target's states (MoA, EAGLE-style)
        attach(lm)
    seq = list(prompt)
    stats = DecodeStats()
    started = time.perf_counter()
    if len(seq) > 1:
        lm.logits(seq, upto=len(seq) - 1)  # the cache holds every token but the last
    end = len(prompt) + max_new_tokens
    while len(seq) < end:
        room = end - len(seq)
        draft, q = drafter.propose(seq, min(k, room - 1), temperature, top_p, rng) if room > 1 else ([], None)
        logits = lm.logits(seq + draft)  # (len(draft) + 1, V): after the last verified token, then each draft token
        stats.target_calls += 1
        stats.drafted += len(draft)
        if temperature == 0:
            n, nxt = accept_greedy(np.array(draft, dtype=np.int64), logits.argmax(-1).numpy())
        else:
            p = distribution(logits.numpy(), temperature, top_p)
            n, nxt = accept_sampling(np.array(draft, dtype=np.int64), q if q is not None else p[:0], p, rng)
        stats.kept += n
        stats.kept_per_call.append(n)
        added = [*draft[:n], nxt][: end - len(seq)]
        stop = eos_token_id is not None and eos_token_id in added
        if eos_token_id is not None and stop:
            added = added[: added.index(eos_token_id) + 1]
        seq += added
        if on_tokens is not None:
            on_tokens(added)
        if stop:
            break
        lm.crop(len(seq) - 1)
        drafter.accepted(seq)
    stats.seconds = time.perf_counter() - started
    out = seq[len(prompt) : end]
    stats.new_tokens = len(out)
    return out, stats
