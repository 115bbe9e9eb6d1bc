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

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from models.lm.family import hidden_size
from models.lm.moa import KL_WEIGHT, _Block
from models.lm.speculative import TargetReader


class EagleDraft(nn.Module):
    """An EAGLE-style draft: one decoder layer over the target's last hidden state and the next token's
    embedding, the target's head on top."""

    def __init__(self, hidden: int, heads: int = 4) -> None:
        super().__init__()
        self.fuse = nn.Linear(2 * hidden, hidden)
        self.layer = _Block(hidden, heads)  # rotary positions, as the MoA draft's attentions
        self.embed: nn.Embedding | None = None  # the target's (set by attach)
        self.head: nn.Linear | None = None

    @classmethod
    def for_target(cls, target: Any, heads: int = 4) -> EagleDraft:
        draft = cls(hidden_size(target.config), heads)
        draft.attach(target)
        return draft.to(target.dtype)

    def shape(self) -> dict[str, int]:
        return {"hidden": self.fuse.out_features, "heads": self.layer.heads}

    def attach(self, target: Any) -> None:
        object.__setattr__(self, "embed", target.get_input_embeddings())
        object.__setattr__(self, "head", target.get_output_embeddings())

    def inputs(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """The layer's inputs (B, T, H) from features and the tokens that followed them."""
        assert self.embed is not None
        return self.fuse(torch.cat([features, self.embed(next_tokens)], -1))

    def forward(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """Predicted features (B, T, H) from features f_1..f_T (B, T, H) and tokens x_2..x_{T+1} (B, T)."""
        positions = torch.arange(features.shape[1], device=features.device)
        x = self.inputs(features, next_tokens)
        return self.layer.attend(x, *self.layer.memory(x, positions), mask=positions[None, :] <= positions[:, None],
                                 positions=positions)

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
        return KL_WEIGHT * forward_kl + feature, {"forward_kl": forward_kl.item(), "feature": feature.item(),
                                                  "top1_agreement": agree}


class EagleDrafter(TargetReader):
    """``EagleDraft`` as a ``models.lm.speculative.Drafter``. Positions 0..n-2 of a verified sequence
    of n tokens take the target's own features, so their keys/values are cached once; a drafted
    path takes the draft's predicted features, kept per path while one tree or chain is drafted."""

    needs_hidden = True
    cost = 0.1  # a drafted token's time over a target call's, measured with the base target here

    draft: EagleDraft

    def reset(self, prompt: list[int]) -> None:
        self.exact = 0  # positions whose keys/values (from the target's features) are cached
        self.kv: tuple[torch.Tensor, torch.Tensor] | None = None
        self.predicted: dict[tuple[int, ...], torch.Tensor] = {}  # a path's predicted feature after it, (H,)

    @torch.inference_mode()
    def prepare(self, seq: list[int]) -> bool:
        verified = len(seq) - 1  # the target's features exist for these tokens
        if verified == 0:
            return False  # nothing to stand on yet: the target decodes the first token alone
        assert self.target_lm.hidden is not None
        if verified == self.exact:  # asked again about the same sequence
            self.predicted = {(): self.predicted[()]}
            return True
        draft = self.draft
        x = draft.inputs(self.target_lm.hidden[self.exact : verified][None], torch.tensor([seq[self.exact + 1 :]]))
        k, v = draft.layer.memory(x, torch.arange(self.exact, verified))
        if self.kv is not None:
            k, v = torch.cat([self.kv[0], k], 2), torch.cat([self.kv[1], v], 2)
        # the last position (the feature before the bonus token, then the bonus token) predicts the
        # feature after the bonus token: the root of every drafted path
        self.predicted = {(): draft.layer.attend(x[:, -1:], k, v, positions=torch.tensor([verified - 1]))[0, 0]}
        self.kv, self.exact = (k, v), verified
        return True

    @torch.inference_mode()
    def path_logits(self, seq: list[int], paths: Sequence[Sequence[int]]) -> np.ndarray:
        draft = self.draft
        assert self.kv is not None
        w, d = len(paths), len(paths[0])
        if d == 0:
            return np.repeat(self.head.logits(self.predicted[()][None]), w, 0)
        # position n - 1 + i takes the feature predicted after path[:i] and the token path[i]
        features = torch.stack([torch.stack([self.predicted[tuple(path[:i])] for i in range(d)]) for path in paths])
        x = draft.inputs(features, torch.tensor([list(path) for path in paths]))  # (w, d, H)
        positions = torch.arange(len(seq) - 1, len(seq) - 1 + d)
        k, v = draft.layer.memory(x, positions)
        k = torch.cat([self.kv[0].expand(w, -1, -1, -1), k], 2)
        v = torch.cat([self.kv[1].expand(w, -1, -1, -1), v], 2)
        out = draft.layer.attend(x[:, -1:], k, v, positions=positions[-1:])[:, 0]  # (w, H): the feature after each path
        for path, feature in zip(paths, out):
            self.predicted[tuple(path)] = feature
        return self.head.logits(out)
