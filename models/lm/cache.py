"""A target language model's KV cache, owned in one place: ``CachedLM`` feeds a growing sequence
and rolls back, ``batched_logits`` runs several sessions' caches as one batch. Nothing else in
the project touches transformers' cache internals."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch


class Head(Protocol):
    """Logits read through a head of one's own (``models.lm.speculative.DraftHead``)."""

    def logits(self, hidden: torch.Tensor) -> np.ndarray: ...


class Tree(Protocol):
    """A token tree as the cache feeds it (``models.lm.speculative.DraftTree``)."""

    tokens: list[int]
    parents: list[int]

    def depths(self) -> list[int]: ...


class CachedLM:
    """A causal LM with a KV cache over a growing token sequence; it feeds only what is new. Every
    edit of transformers' cache (crop, keep a tree's path, branch into a batch of paths, pad into
    and split out of a batch of sessions) is a method here, so a transformers upgrade that changes
    the cache touches this file alone."""

    def __init__(self, model: Any, keep_hidden: bool = False, head: Head | None = None) -> None:
        self.model = model.eval()
        self.head = head  # read the logits through this head instead of the model's own
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

    def _forward(self, ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if self.head is not None:  # the model's body, then the draft head
            body = self.model.model(input_ids=ids, cache=self.cache, use_cache=True, **kwargs)
            self.cache = body.cache
            return torch.from_numpy(self.head.logits(body.last_hidden_state[0]))
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True, output_hidden_states=self.keep_hidden, **kwargs)
        self.cache = out.cache
        if self.keep_hidden:
            last = out.hidden_states[-1][0]
            self.hidden = last if self.hidden is None else torch.cat([self.hidden, last])
        return out.logits[0].double()

    @torch.inference_mode()
    def logits(self, seq: Sequence[int], upto: int | None = None) -> torch.Tensor:
        """Logits (n, V) after each of the tokens seq[cached:upto] fed now (float64 on the CPU)."""
        return self._forward(torch.tensor([list(seq[self.cached : upto])]))

    @torch.inference_mode()
    def tree_logits(self, last: int, tree: Tree) -> torch.Tensor:
        """Logits (nodes, V) at the tree's root (``last``, the token after the cache) and each node,
        in one forward with a tree attention mask; the cache then holds the prefix and every node."""
        past, n = self.cached, len(tree.parents)
        depth = torch.tensor(tree.depths())
        sees = torch.eye(n, dtype=torch.bool)  # sees[i, j]: j is i or one of its ancestors
        for i in range(1, n):
            sees[i] |= sees[tree.parents[i]]
        mask = torch.cat([torch.ones(n, past, dtype=torch.bool), sees], 1)[None, None]  # (1, 1, n, past + n)
        return self._forward(torch.tensor([[last, *tree.tokens[1:]]]), attention_mask=mask,
                             position_ids=(past + depth)[None])

    def keep(self, length: int, nodes: Sequence[int] = ()) -> None:
        """Keep the cache of the first ``length`` tokens followed by the entries at ``length - 1 + node``
        for each node of a verified tree (whose root sat at ``length - 1``)."""
        if nodes:
            index = torch.cat([torch.arange(length), length - 1 + torch.tensor(list(nodes), dtype=torch.long)])
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, index], layer.values[:, :, index]
            if self.hidden is not None:
                self.hidden = self.hidden[index]
        elif self.cached > length:
            self.cache.crop(length - self.cached)
            if self.hidden is not None:
                self.hidden = self.hidden[:length]

    def crop(self, length: int) -> None:
        """Keep the cache of the first ``length`` tokens only."""
        self.keep(length)

    def layer_kv(self, start: int = 0, upto: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, (keys, values) of the cached tokens start..upto - 1: (B, heads, T, head_dim)."""
        return layer_kv(self.cache, start, upto)

    @torch.inference_mode()
    def branch_logits(self, last: int, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """The last position's logits (len(paths), V) after ``[last, *path]`` for each path, run as one
        batch on copies of the cached prefix; the cache is as it was afterwards."""
        ids = torch.tensor([[last, *path] for path in paths])  # (w, 1 + d)
        past = self.cached
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys.expand(len(paths), -1, -1, -1), layer.values.expand(len(paths), -1, -1, -1)
        try:
            if self.head is not None:
                hidden = self.model.model(input_ids=ids, cache=self.cache, use_cache=True).last_hidden_state[:, -1]
                return torch.from_numpy(self.head.logits(hidden))
            return self.model(input_ids=ids, cache=self.cache, use_cache=True).logits[:, -1].double()
        finally:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:1, :, :past].contiguous(), layer.values[:1, :, :past].contiguous()


def layer_kv(cache: Any, start: int = 0, upto: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer of a transformers cache, (keys, values) of positions start..upto - 1."""
    return [(layer.keys[:, :, start:upto], layer.values[:, :, start:upto]) for layer in cache.layers]


@torch.inference_mode()
def batched_logits(target: Any, lms: Sequence[CachedLM], feeds: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """One target forward for several sessions: each ``lms[i]`` is fed ``feeds[i]`` after what it
    caches. The caches are zero-padded into one batch (a mask hides the padding, positions continue
    each session's own), then each session's cache takes its new entries (and its last hidden
    states, which EAGLE-style drafts read). Per session, the (len(feed), V) logits, float32."""
    from transformers import DynamicCache

    past = [lm.cached for lm in lms]
    b, lmax, nmax = len(lms), max(past), max(map(len, feeds))
    ids = torch.zeros(b, nmax, dtype=torch.long)
    positions = torch.zeros(b, nmax, dtype=torch.long)
    mask = torch.zeros(b, 1, nmax, lmax + nmax, dtype=torch.bool)
    causal = torch.tril(torch.ones(nmax, nmax, dtype=torch.bool))
    for i, (feed, c) in enumerate(zip(feeds, past)):
        ids[i, : len(feed)] = torch.tensor(list(feed))
        positions[i] = c + torch.arange(nmax)
        mask[i, 0, :, :c] = True
        mask[i, 0, :, lmax:] = causal  # a real row never reaches a padded column; padded rows are not read
    cache = DynamicCache(config=target.config)
    if lmax:  # every session's cache, zero-padded to lmax (the mask hides the padding)
        held = next(lm for lm, c in zip(lms, past) if c).cache.layers
        for layer, like in enumerate(held):
            keys = like.keys.new_zeros((b, like.keys.shape[1], lmax, like.keys.shape[-1]))
            values = like.values.new_zeros((b, like.values.shape[1], lmax, like.values.shape[-1]))
            for i, (lm, c) in enumerate(zip(lms, past)):
                if c:
                    keys[i, :, :c], values[i, :, :c] = lm.cache.layers[layer].keys[0], lm.cache.layers[layer].values[0]
            cache.update(keys, values, layer)
    out = target(input_ids=ids, cache=cache, use_cache=True, attention_mask=mask, position_ids=positions,
                 output_hidden_states=True)
    logits = []
    for i, (lm, feed, c) in enumerate(zip(lms, feeds, past)):
        mine = DynamicCache(config=target.config)
        for layer, batched in enumerate(out.cache.layers):
            fresh = slice(lmax, lmax + len(feed))
            new_k, new_v = batched.keys[i : i + 1, :, fresh], batched.values[i : i + 1, :, fresh]
            if c:
                old = lm.cache.layers[layer]
                new_k, new_v = torch.cat([old.keys[:, :, :c], new_k], 2), torch.cat([old.values[:, :, :c], new_v], 2)
            mine.update(new_k.contiguous(), new_v.contiguous(), layer)
        lm.cache = mine
        last = out.hidden_states[-1][i, : len(feed)]  # the features EAGLE-style drafts read
        lm.hidden = last if not c or lm.hidden is None else torch.cat([lm.hidden[:c], last])
        logits.append(out.logits[i, : len(feed)])
    return logits
