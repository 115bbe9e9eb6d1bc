"""An EAGLE-style draft (Li et al. 2024, EAGLE §3), the MoA paper's main baseline: one decoder
layer that autoregresses on the target's last hidden state ("feature") plus the next token's embedding.

    draft = EagleDraft.for_target(target)
    loss, stats = draft.loss(target, tokens)          # feature regression + forward KL, teacher-forced
    drafter = EagleDrafter(draft)

At position j the input is [f_j ; e(x_{j+1})] (the target's feature after token j and the
embedding of the token that followed), fused to the hidden size and passed through one causal
layer, which predicts f_{j+1}; the target's LM head reads the next token from it. Drafting past
the verified prefix feeds the draft's own predicted features back in.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from models.moa import KL_WEIGHT, _Block
from models.speculative import TargetReader, draft_tokens


class EagleDraft(nn.Module):
    def __init__(self, hidden: int, heads: int = 4) -> None:
        super().__init__()
        self.fuse = nn.Linear(2 * hidden, hidden)
        self.layer = _Block(hidden, heads)
        self.position = nn.Embedding(4096, hidden)
        self.embed: nn.Embedding | None = None  # the target's (set by attach)
        self.head: nn.Linear | None = None

    @classmethod
    def for_target(cls, target: Any, heads: int = 4) -> EagleDraft:
        draft = cls(target.config.hidden_size, heads)
        draft.attach(target)
        return draft.to(target.dtype)

    def attach(self, target: Any) -> None:
        object.__setattr__(self, "embed", target.get_input_embeddings())
        object.__setattr__(self, "head", target.get_output_embeddings())

    def forward(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """Predicted features (B, T, H) from features f_1..f_T (B, T, H) and tokens x_2..x_{T+1} (B, T)."""
        assert self.embed is not None
        t = features.shape[1]
        positions = torch.arange(t, device=features.device)
        x = self.fuse(torch.cat([features, self.embed(next_tokens)], -1)) + self.position(positions)
        return self.layer(x, mask=positions[None, :] <= positions[:, None])

    def loss(self, target: Any, tokens: torch.Tensor, generator: torch.Generator | None = None
             ) -> tuple[torch.Tensor, dict[str, float]]:
        with torch.no_grad():
            out = target(input_ids=tokens, output_hidden_states=True)
            features, p = out.hidden_states[-1], out.logits.softmax(-1)  # (B, T, H), (B, T, V)
        predicted = self(features[:, :-1], tokens[:, 1:])  # predicts f_2..f_T
        assert self.head is not None
        log_q = self.head(predicted).log_softmax(-1)
        forward_kl = -(p[:, 1:] * log_q).sum(-1).mean()
        feature = F.smooth_l1_loss(predicted, features[:, 1:])
        agree = float((log_q.argmax(-1) == p[:, 1:].argmax(-1)).float().mean())
        return KL_WEIGHT * forward_kl + feature, {"forward_kl": float(forward_kl), "feature": float(feature),
                                                  "top1_agreement": agree}


class EagleDrafter(TargetReader):
    """``EagleDraft`` as a ``models.speculative.Drafter``: reads the target's features of the verified prefix."""

    needs_hidden = True

    def __init__(self, draft: EagleDraft) -> None:
        super().__init__()
        self.draft = draft.eval()

    @torch.inference_mode()
    def propose(self, seq: list[int], k: int, temperature: float, top_p: float,
                rng: np.random.Generator) -> tuple[list[int], np.ndarray | None]:
        verified = len(seq) - 1  # the target's features exist for these tokens
        if verified == 0:
            return [], None  # nothing to stand on yet: the target decodes the first token alone
        assert self.target_lm.hidden is not None and self.draft.head is not None
        head = self.draft.head
        features = [self.target_lm.hidden[:verified][None]]  # (1, n-1, H): f_1..f_{n-1}, then the predicted ones

        def next_logits(drafted: list[int]) -> np.ndarray:
            nxt = torch.tensor([seq[1:] + drafted])  # x_2..x_n, then the drafted ones
            predicted = self.draft(features[0], nxt)[:, -1:]  # the feature after the last token
            features[0] = torch.cat([features[0], predicted], 1)
            return head(predicted[0, -1]).double().numpy()

        return draft_tokens(next_logits, k, temperature, top_p, rng)

