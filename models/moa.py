"""The Mixture-of-Attentions draft (Zimmer et al., ICLR 2025, arXiv 2410.03804, §3) for a Llama-like target.

    draft = MoADraft.for_target(target)                       # reuses the target's embedding and LM head
    loss, stats = draft.loss(target, tokens)                  # (B, T) token windows; the target is frozen
    drafter = MoADrafter(draft)                               # a models.speculative.Drafter
    tokens, stats = speculative_generate(target, drafter, prompt, 128, k=4)

Three attentions, as in the paper's Figure 2:

1. **Layer Self-Attention** over the target's per-layer keys and values of each token (a
   sequence of ``n_layers`` vectors of size ``2·kv_heads·head_dim``, attention across layers,
   mean-pooled), projected to the hidden size: what the target knows about each verified token.
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

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from models.speculative import TargetReader, draft_tokens

SEGMENT_MIN, SEGMENT_MAX = 6, 15  # T-step bounded masking: segment lengths drawn from [6, 15)
KL_WEIGHT = 0.1


class _Block(nn.Module):
    """Pre-norm attention (queries from x, keys/values from memory) and a SiLU MLP, residual."""

    def __init__(self, dim: int, heads: int, memory_dim: int | None = None) -> None:
        super().__init__()
        self.heads = heads
        self.norm_q, self.norm_kv, self.norm_mlp = nn.RMSNorm(dim), nn.RMSNorm(memory_dim or dim), nn.RMSNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(memory_dim or dim, 2 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim, bias=False), nn.SiLU(), nn.Linear(2 * dim, dim, bias=False))

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, d = x.shape
        mem = self.norm_kv(memory if memory is not None else x)
        q = self.q(self.norm_q(x)).view(b, t, self.heads, -1).transpose(1, 2)  # (B, h, T, d/h)
        k, v = (z.view(b, mem.shape[1], self.heads, -1).transpose(1, 2) for z in self.kv(mem).chunk(2, -1))
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # mask: True = may attend
        x = x + self.out(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm_mlp(x))


class MoADraft(nn.Module):
    def __init__(self, hidden: int, kv_dim: int, n_layers: int, heads: int, layer_heads: int = 2) -> None:
        super().__init__()
        self.kv_dim, self.n_layers = kv_dim, n_layers
        self.layer_position = nn.Parameter(torch.zeros(n_layers, kv_dim))
        self.layer_attention = _Block(kv_dim, layer_heads)
        self.project = nn.Linear(kv_dim, hidden)
        self.self_attention = _Block(hidden, heads)
        self.position = nn.Embedding(4096, hidden)  # absolute positions of the token stream
        self.cross_attention = _Block(hidden, heads)
        self.embed: nn.Embedding | None = None  # the target's, not trained (set by for_target)
        self.head: nn.Linear | None = None

    @classmethod
    def for_target(cls, target: Any, heads: int = 4) -> MoADraft:
        cfg = target.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        draft = cls(cfg.hidden_size, 2 * cfg.num_key_value_heads * head_dim, cfg.num_hidden_layers, heads)
        draft.attach(target)
        return draft.to(target.dtype)

    def attach(self, target: Any) -> None:
        """Share the target's token embedding and LM head (frozen; kept out of this module's state)."""
        object.__setattr__(self, "embed", target.get_input_embeddings())
        object.__setattr__(self, "head", target.get_output_embeddings())

    def target_states(self, cache: Any, upto: int) -> torch.Tensor:
        """(B, upto, hidden): the projected Layer Self-Attention summary of each token's per-layer K/V."""
        per_layer = [torch.cat([layer.keys[:, :, :upto], layer.values[:, :, :upto]], -1) for layer in cache.layers]
        kv = torch.stack([z.permute(0, 2, 1, 3).flatten(2) for z in per_layer], 2)  # (B, T, L, kv_dim)
        b, t = kv.shape[:2]
        states = self.layer_attention(kv.reshape(b * t, self.n_layers, self.kv_dim) + self.layer_position)
        return self.project(states.mean(1).view(b, t, self.kv_dim))

    def forward(self, tokens: torch.Tensor, states: torch.Tensor, sees: torch.Tensor) -> torch.Tensor:
        """Hidden states (B, T, hidden) predicting each token's successor. ``sees`` (B, T): the last
        target state index each token may attend to."""
        assert self.embed is not None
        t = tokens.shape[1]
        positions = torch.arange(t, device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        causal = positions[None, :] <= positions[:, None]
        x = self.self_attention(x, mask=causal)
        j = torch.arange(states.shape[1], device=tokens.device)
        cross = (j[None, None, :] <= sees.clamp(min=0)[:, :, None])[:, None]  # (B, 1, T, S)
        return self.cross_attention(x, memory=states, mask=cross)

    def loss(self, target: Any, tokens: torch.Tensor, generator: torch.Generator | None = None
             ) -> tuple[torch.Tensor, dict[str, float]]:
        """The paper's loss on token windows (B, T), with T-step bounded masking."""
        with torch.no_grad():
            out = target(input_ids=tokens, use_cache=True, output_hidden_states=True)
            p = out.logits.softmax(-1)
            last_hidden = out.hidden_states[-1]
        states = self.target_states(out.past_key_values, tokens.shape[1])
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
        return loss, {"forward_kl": float(forward_kl), "feature": float(feature), "top1_agreement": agree}


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
    """``MoADraft`` as a ``models.speculative.Drafter``: reads the target's cache of the verified
    prefix (every token but the last) and drafts K tokens from it."""

    def __init__(self, draft: MoADraft) -> None:
        super().__init__()
        self.draft = draft.eval()

    @torch.inference_mode()
    def propose(self, seq: list[int], k: int, temperature: float, top_p: float,
                rng: np.random.Generator) -> tuple[list[int], np.ndarray | None]:
        verified = len(seq) - 1  # the target's cache holds these tokens
        if verified == 0:  # a one-token prompt: no target state yet; a zero state stands in
            states = torch.zeros(1, 1, self.draft.project.out_features, dtype=self.draft.project.weight.dtype)
        else:
            states = self.draft.target_states(self.target_lm.cache, verified)
        assert self.draft.head is not None
        head = self.draft.head

        def next_logits(drafted: list[int]) -> np.ndarray:
            ids = torch.tensor([seq + drafted])
            # only the last position's view matters (the cross-attention is per position): it sees
            # every verified state, as the bonus token and the drafted ones after it did in training
            sees = torch.full(ids.shape, max(verified - 1, 0), dtype=torch.long)
            return head(self.draft(ids, states, sees)[0, -1]).double().numpy()

        return draft_tokens(next_logits, k, temperature, top_p, rng)
