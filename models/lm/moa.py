"""The Mixture-of-Attentions draft (Zimmer et al., ICLR 2025, arXiv 2410.03804, §3) for a decoder-only target
(Llama, Qwen2, Mistral, Phi-3, Gemma, GPT-2, ...: ``models.lm.family`` reads each family's attention numbers).

    draft = MoADraft.for_target(target)                       # reuses the target's embedding and LM head
    loss, stats = draft.loss(target, tokens)                  # (B, T) token windows; the target is frozen
    drafter = MoADrafter(draft)                               # a models.lm.speculative.Drafter
    tokens, stats = speculative_generate(target, drafter, prompt, 128, k=4)

Three attentions, as in the paper's Figure 2:

1. **Layer Self-Attention** over the target's per-layer keys and values of each token (a
   sequence of ``n_layers`` vectors of size ``2·kv_heads·head_dim``, each first projected to a
   narrower ``layer_dim``; attention across layers, mean-pooled), projected to the hidden size:
   what the target knows about each verified token.
2. **Self-Attention**, causal, over the token embeddings (the target's own embedding table).
3. **Cross-Attention**: queries from (2), keys and values from (1) — but a token may only see
   target states up to the last *verified* token before it. Training enforces this with the
   paper's "T-step bounded" masking: each row is cut into segments of 6–14 tokens, and every
   token attends to target states up to its segment's start, so the draft learns to predict
   several tokens past the last state the target has computed (§3.2).

The output is a hidden state read out by the target's LM head. The loss (§3.3) is
0.1 × forward KL to the target's next-token distribution + SmoothL1 to the target's last
(normalised) hidden state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from edge.core.errors import ConfigError
from models.lm.cache import kv_layout, layer_kv, new_cache
from models.lm.family import FIELD, attention_shape
from models.lm.speculative import TargetReader

SEGMENT_MIN, SEGMENT_MAX = 6, 15  # T-step bounded masking: segment lengths drawn from [6, 15)
KL_WEIGHT = 0.1


def rotate(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021) of x (B, h, T, d) at ``positions`` (T,): dot
    products of rotated queries and keys then depend on the distance between their positions only."""
    half = x.shape[-1] // 2
    freq = base ** (-torch.arange(half, dtype=torch.float64) / half)
    angle = (positions.to(torch.float64)[:, None] * freq[None]).to(x.dtype)  # (T, d/2)
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


class _Block(nn.Module):
    """Pre-norm attention (queries from x, keys/values from memory) and a SiLU MLP, residual. Given
    positions, queries and keys are rotated (RoPE), so attention knows how far apart they are."""

    def __init__(self, dim: int, heads: int, memory_dim: int | None = None) -> None:
        super().__init__()
        self.heads = heads
        self.norm_q, self.norm_kv, self.norm_mlp = nn.RMSNorm(dim), nn.RMSNorm(memory_dim or dim), nn.RMSNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(memory_dim or dim, 2 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim, bias=False), nn.SiLU(), nn.Linear(2 * dim, dim, bias=False))

    def memory(self, memory: torch.Tensor, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, h, S, d/h) of a memory (B, S, D) at ``positions`` (S,): what an
        incremental draft caches."""
        b, t, _ = memory.shape
        k, v = self.kv(self.norm_kv(memory)).chunk(2, -1)
        k, v = k.view(b, t, self.heads, -1).transpose(1, 2), v.view(b, t, self.heads, -1).transpose(1, 2)
        return (k if positions is None else rotate(k, positions)), v

    def attend(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
               positions: torch.Tensor | None = None) -> torch.Tensor:
        b, t, d = x.shape
        q = self.q(self.norm_q(x)).view(b, t, self.heads, -1).transpose(1, 2)  # (B, h, T, d/h)
        if positions is not None:
            q = rotate(q, positions)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # mask: True = may attend
        x = x + self.out(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm_mlp(x))

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.attend(x, *self.memory(memory if memory is not None else x), mask=mask)


class MoADraft(nn.Module):
    """The Mixture-of-Attentions draft: Layer Self-Attention over the target's keys and values, then
    Self- and Cross-Attention layers."""

    def __init__(self, hidden: int, kv_dim: int, n_layers: int, heads: int, layer_dim: int = 128,
                 layer_heads: int = 2) -> None:
        super().__init__()
        self.kv_dim, self.n_layers, self.layer_dim = kv_dim, n_layers, layer_dim
        self.layer_in = nn.Linear(kv_dim, layer_dim)  # each layer's K/V of a token, to the Layer Self-Attention's width
        self.layer_position = nn.Parameter(torch.zeros(n_layers, layer_dim))
        self.layer_attention = _Block(layer_dim, layer_heads)
        self.project = nn.Linear(layer_dim, hidden)
        self.self_attention = _Block(hidden, heads)  # rotary positions: token i at i
        self.cross_attention = _Block(hidden, heads)  # rotary positions: token i at i, the state of token j at j
        self.embed: nn.Embedding | None = None  # the target's, not trained (set by for_target)
        self.head: nn.Linear | None = None

    @classmethod
    def for_target(cls, target: Any, heads: int = 4) -> MoADraft:
        """A draft shaped for ``target``'s attention; a ConfigError when its cache does not hold the
        per-layer keys and values its config describes (the draft could not read them)."""
        shape = attention_shape(target.config)
        layout, want = kv_layout(target), (shape.kv_heads, shape.head_dim, shape.head_dim)
        if len(layout) != shape.layers or set(layout) != {want}:
            raise ConfigError(FIELD, shape.model_type, f"its cache holds (key/value heads, key size, value size) "
                              f"{sorted(set(layout))} in {len(layout)} layers, its config says {want} in {shape.layers}; "
                              "the MoA draft reads keys and values laid out as the config says")
        draft = cls(shape.hidden, shape.kv_dim, shape.layers, heads)
        draft.attach(target)
        return draft.to(target.dtype)

    def shape(self) -> dict[str, int]:
        """The constructor's arguments (what ``draft.json`` records to rebuild it)."""
        return {"hidden": self.project.out_features, "kv_dim": self.kv_dim, "n_layers": self.n_layers,
                "heads": self.self_attention.heads, "layer_dim": self.layer_dim, "layer_heads": self.layer_attention.heads}

    def attach(self, target: Any) -> None:
        """Share the target's token embedding and LM head (frozen; kept out of this module's state)."""
        object.__setattr__(self, "embed", target.get_input_embeddings())
        object.__setattr__(self, "head", target.get_output_embeddings())

    def target_states(self, cache: Any, upto: int, start: int = 0) -> torch.Tensor:
        """(B, upto - start, hidden): the projected Layer Self-Attention summary of the per-layer K/V
        of tokens start..upto - 1."""
        per_layer = [torch.cat([keys, values], -1) for keys, values in layer_kv(cache, start, upto)]
        kv = torch.stack([z.permute(0, 2, 1, 3).flatten(2) for z in per_layer], 2)  # (B, T, L, kv_dim)
        b, t = kv.shape[:2]
        states = self.layer_attention(self.layer_in(kv.reshape(b * t, self.n_layers, self.kv_dim)) + self.layer_position)
        return self.project(states.mean(1).view(b, t, self.layer_dim))

    def forward(self, tokens: torch.Tensor, states: torch.Tensor, sees: torch.Tensor) -> torch.Tensor:
        """Hidden states (B, T, hidden) predicting each token's successor. ``sees`` (B, T): the last
        target state index each token may attend to."""
        assert self.embed is not None
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens)
        x = self.self_attention.attend(x, *self.self_attention.memory(x, positions),
                                       mask=positions[None, :] <= positions[:, None], positions=positions)
        j = torch.arange(states.shape[1], device=tokens.device)
        cross = (j[None, None, :] <= sees.clamp(min=0)[:, :, None])[:, None]  # (B, 1, T, S)
        return self.cross_attention.attend(x, *self.cross_attention.memory(states, j), mask=cross, positions=positions)

    def loss(self, target: Any, tokens: torch.Tensor, generator: torch.Generator | None = None
             ) -> tuple[torch.Tensor, dict[str, float]]:
        """The paper's loss on token windows (B, T), with T-step bounded masking."""
        with torch.no_grad():
            out = target_pass(target, tokens)
            p = out.logits.softmax(-1)
            last_hidden = out.hidden_states[-1]
        states = self.target_states(out.cache, tokens.shape[1])
        sees = bounded_segments(tokens.shape, generator)
        hidden = self(tokens, states, sees)
        assert self.head is not None
        # position 0 can only be given its own state, which no drafted token ever has: no loss there
        counted = sees < torch.arange(tokens.shape[1])[None, :]
        log_q = self.head(hidden).log_softmax(-1)
        forward_kl = -(p * log_q).sum(-1)[counted].mean()  # cross-entropy to p: the KL up to p's own entropy
        feature = F.smooth_l1_loss(hidden[counted], last_hidden[counted])
        loss = KL_WEIGHT * forward_kl + feature
        agree = float((log_q.argmax(-1) == p.argmax(-1))[counted].float().mean())
        return loss, {"forward_kl": forward_kl.item(), "feature": feature.item(), "top1_agreement": agree}


def target_pass(target: Any, tokens: torch.Tensor) -> Any:
    """The target's forward over token windows (B, T) with every layer's keys and values of every
    token kept (``models.lm.cache.new_cache``; the model's own cache would keep a sliding-window
    layer's last window only) and its hidden states: what the MoA draft trains on."""
    return target(input_ids=tokens, cache=new_cache(), use_cache=True, output_hidden_states=True)


def bounded_segments(shape: torch.Size | tuple[int, ...], generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, T) index of the last target state each token may see: rows cut into segments of
    SEGMENT_MIN..SEGMENT_MAX - 1 tokens at random; a token sees states up to its segment's start
    (the last token the target verified), whatever its offset within the segment."""
    b, t = shape
    sees = torch.empty(b, t, dtype=torch.long)
    for row in range(b):
        start = 0
        while start < t:
            length = int(torch.randint(SEGMENT_MIN, SEGMENT_MAX, (1,), generator=generator))
            # the segment's first token sees the state before it: the bonus token's situation at
            # inference (the target has not computed its state yet)
            sees[row, start : start + length] = max(start - 1, 0)
            start += length
    return sees


class MoADrafter(TargetReader):
    """``MoADraft`` as a ``models.lm.speculative.Drafter``. It caches, per sequence, the projected
    target states of the verified tokens and the Cross-Attention's keys/values of them (they never
    change once verified), and the Self-Attention's keys/values of the verified tokens; a drafted
    path costs its own tokens only."""

    cost = 0.15  # a drafted token's time over a target call's, measured with the base target here

    draft: MoADraft

    def reset(self, prompt: list[int]) -> None:
        self.states = 0  # verified tokens whose target states are cached
        self.cross: tuple[torch.Tensor, torch.Tensor] | None = None  # (1, h, states, d/h) keys, values
        self.fed: list[int] = []  # tokens in the self-attention cache
        self.self_kv: tuple[torch.Tensor, torch.Tensor] | None = None

    @torch.inference_mode()
    def prepare(self, seq: list[int]) -> bool:
        draft = self.draft
        verified = len(seq) - 1  # the target's cache holds these tokens
        if verified > self.states:
            new = draft.cross_attention.memory(draft.target_states(self.target_lm.cache, verified, self.states),
                                               torch.arange(self.states, verified))
            self.cross = new if self.cross is None else (torch.cat([self.cross[0], new[0]], 2),
                                                         torch.cat([self.cross[1], new[1]], 2))
            self.states = verified
        common = 0
        for a, b in zip(self.fed, seq[:-1]):
            if a != b:
                break
            common += 1
        if self.self_kv is not None:
            self.self_kv = (self.self_kv[0][:, :, :common], self.self_kv[1][:, :, :common])
        if verified > common:  # the self-attention's keys/values of seq[common:-1]
            assert draft.embed is not None
            new = draft.self_attention.memory(draft.embed(torch.tensor([seq[common:-1]])), torch.arange(common, verified))
            self.self_kv = new if self.self_kv is None else (torch.cat([self.self_kv[0], new[0]], 2),
                                                               torch.cat([self.self_kv[1], new[1]], 2))
        self.fed = seq[:-1]
        return True

    @torch.inference_mode()
    def path_logits(self, seq: list[int], paths: Sequence[Sequence[int]]) -> np.ndarray:
        draft = self.draft
        w, n = len(paths), len(seq)
        tokens = torch.tensor([[seq[-1], *path] for path in paths])  # (w, 1 + d): the last verified token, then the path
        assert draft.embed is not None
        x = draft.embed(tokens)
        positions = torch.arange(n - 1, n + tokens.shape[1] - 1)
        k, v = draft.self_attention.memory(x, positions)
        if self.self_kv is not None:
            k = torch.cat([self.self_kv[0].expand(w, -1, -1, -1), k], 2)
            v = torch.cat([self.self_kv[1].expand(w, -1, -1, -1), v], 2)
        end = positions[-1:]
        h = draft.self_attention.attend(x[:, -1:], k, v, positions=end)  # (w, 1, hidden): only the path's end is read out
        if self.cross is None:  # a one-token prompt: no target state yet; a zero state stands in
            ck, cv = draft.cross_attention.memory(torch.zeros(1, 1, draft.project.out_features, dtype=x.dtype),
                                                  torch.zeros(1, dtype=torch.long))
        else:
            ck, cv = self.cross
        # the path's end sees every verified state, as the bonus token and the drafted ones after it
        # did in training (T-step bounded masking)
        out = draft.cross_attention.attend(h, ck.expand(w, -1, -1, -1), cv.expand(w, -1, -1, -1), positions=end)
        return self.head.logits(out[:, 0])
