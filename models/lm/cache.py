"""A target language model's KV cache, owned in one place: ``CachedLM`` feeds a growing sequence
and rolls back, ``batched_logits`` runs several sessions' caches as one batch. Nothing else in
the project touches transformers' cache internals.

Every layer's cache keeps every token (``new_cache``), sliding-window layers too (Mistral,
Qwen2's upper layers, Gemma 2's alternate ones): transformers' sliding-window layers drop the
oldest keys, which a rollback past the window and the MoA draft's reads by position cannot have.
The window itself is the attention mask's: the model builds it when given no mask, and the custom
masks built here (a token tree, a padded batch) are windowed by ``_layer_masks``.

The last hidden states EAGLE-style drafts read (``keep_hidden``) are taken as the input of the
model's LM head (``LastHidden``), which is transformers' ``hidden_states[-1]``: asking the model
for ``output_hidden_states`` instead installs a hook on every layer that stays, and costs every
later forward of the model about 7 % on the tiny target, drafting or not. The states are kept as
the chunks each forward made, joined only when a draft reads them."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any, ClassVar, Protocol

import numpy as np
import torch

from edge.core.errors import ConfigError


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
        self._hidden: list[torch.Tensor] = []  # (n_i, H) chunks: the last-layer states of the cached tokens, in order
        self._last = LastHidden(lm_head(model)) if keep_hidden else None  # where they are read
        self.windows: list[int | None] = []  # per layer, its sliding window (``sliding_windows``; set by reset)

    def reset(self) -> None:
        self.windows = sliding_windows(self.model.config)  # what the custom masks need; refuses what the cache cannot hold
        self.cache = new_cache()
        self._hidden = []

    @property
    def hidden(self) -> torch.Tensor | None:
        """(cached, H) the last-layer states of the cached tokens (``keep_hidden``; None before any)."""
        if len(self._hidden) > 1:
            self._hidden = [torch.cat(self._hidden)]
        return self._hidden[0] if self._hidden else None

    @hidden.setter
    def hidden(self, states: torch.Tensor | None) -> None:
        self._hidden = [] if states is None else [states]

    @property
    def cached(self) -> int:
        return int(self.cache.get_seq_length()) if self.cache is not None else 0

    def _forward(self, ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if self.head is not None:  # the model's body, then the draft head
            body = self.model.base_model(input_ids=ids, cache=self.cache, use_cache=True, **kwargs)
            self.cache = body.cache
            return torch.from_numpy(self.head.logits(body.last_hidden_state[0]))
        if not self.keep_hidden:
            out = self.model(input_ids=ids, cache=self.cache, use_cache=True, **kwargs)
        else:
            assert self._last is not None
            with self._last:
                out = self.model(input_ids=ids, cache=self.cache, use_cache=True, **kwargs)
            self._hidden.append(self._last.states[0])  # (n, H)
        self.cache = out.cache
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
        positions = (past + depth)[None]  # (1, n)
        key_positions = torch.cat([torch.arange(past), past + depth])[None]  # (1, past + n)
        return self._forward(torch.tensor([[last, *tree.tokens[1:]]]), position_ids=positions,
                             attention_mask=_layer_masks(self.windows, mask, positions, key_positions))

    def keep(self, length: int, nodes: Sequence[int] = ()) -> None:
        """Keep the cache of the first ``length`` tokens followed by the entries at ``length - 1 + node``
        for each node of a verified tree (whose root sat at ``length - 1``)."""
        if nodes:
            index = torch.cat([torch.arange(length), length - 1 + torch.tensor(list(nodes), dtype=torch.long)])
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, index], layer.values[:, :, index]
            if self._hidden:
                self.hidden = self.hidden[index]  # type: ignore[index]
        elif self.cached > length:
            self.cache.crop(length - self.cached)
            self._crop_hidden(length)

    def add_hidden(self, start: int, states: torch.Tensor) -> None:
        """``states`` (n, H) are those of the tokens from ``start`` on (a forward made elsewhere)."""
        self._crop_hidden(start)
        self._hidden.append(states)

    def _crop_hidden(self, length: int) -> None:
        """Keep the states of the first ``length`` tokens: whole chunks dropped from the end, the
        last one kept cut (no copy of the rest)."""
        held = sum(len(chunk) for chunk in self._hidden)
        while self._hidden and held - len(self._hidden[-1]) >= length:
            held -= len(self._hidden.pop())
        if held > length:
            self._hidden[-1] = self._hidden[-1][: len(self._hidden[-1]) - (held - length)]

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
                hidden = self.model.base_model(input_ids=ids, cache=self.cache, use_cache=True).last_hidden_state[:, -1]
                return torch.from_numpy(self.head.logits(hidden))
            return self.model(input_ids=ids, cache=self.cache, use_cache=True).logits[:, -1].double()
        finally:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:1, :, :past].contiguous(), layer.values[:1, :, :past].contiguous()


class LastHidden:
    """The last hidden states (B, T, H) of a forward of a causal LM, read as the input of its LM
    head (``lm_head``): what transformers returns as ``hidden_states[-1]`` (the final norm's
    output), without ``output_hidden_states``, whose hooks on every layer stay installed and cost
    every later forward of the model.

        last = LastHidden(lm_head(model))
        with last:
            out = model(input_ids=ids, cache=cache, use_cache=True)
        last.states  # (B, T, H)

    One pre-hook on the head, installed the first time and left there (registering and removing a
    hook for each forward cost 2 % of a tiny target's token), records into the ``LastHidden`` its
    thread has open, if any: the server runs sessions in threads over one model, and a forward
    outside a ``with`` (plain decoding, another session's) records nothing."""

    _open: ClassVar[dict[tuple[int, int], LastHidden]] = {}  # (id(head), thread) -> where its input goes now
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, head: torch.nn.Module) -> None:
        self.head = head
        self._states: torch.Tensor | None = None
        with LastHidden._lock:
            if not any(hook is _record_head_input for hook in head._forward_pre_hooks.values()):
                head.register_forward_pre_hook(_record_head_input)

    def __enter__(self) -> LastHidden:
        self._states = None
        self._key = (id(self.head), threading.get_ident())
        LastHidden._open[self._key] = self
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        LastHidden._open.pop(self._key, None)

    @property
    def states(self) -> torch.Tensor:
        if self._states is None:
            raise RuntimeError("the model's forward did not call its LM head: no last hidden states to read")
        return self._states


def _record_head_input(head: torch.nn.Module, args: tuple[Any, ...]) -> None:
    """The LM head's pre-hook (``LastHidden``): a module-level function, so a copied model's hook is
    this one too, and records nothing for a head no ``LastHidden`` has open."""
    into = LastHidden._open.get((id(head), threading.get_ident()))
    if into is not None:
        into._states = args[0]


def lm_head(model: Any) -> torch.nn.Module:
    """The causal LM's head module, whose input is its last hidden states."""
    head = model.get_output_embeddings()
    if head is None:
        raise ConfigError("target", type(model).__name__, "has no LM head (get_output_embeddings): EAGLE-style "
                          "drafts read the last hidden states at its input")
    return head


@torch.inference_mode()
def kv_layout(model: Any) -> list[tuple[int, int, int]]:
    """Per layer, (key/value heads, key size, value size) of a token in the model's cache, measured
    with one forward of one token (what the MoA draft reads, not taken on trust from the config)."""
    lm = CachedLM(model)
    lm.reset()
    lm.logits([0, 0], upto=1)
    return [(int(k.shape[1]), int(k.shape[-1]), int(v.shape[-1])) for k, v in lm.layer_kv()]


ATTENTION = ("full_attention", "sliding_attention")  # the layer kinds whose keys and values are cached here


def sliding_windows(config: Any) -> list[int | None]:
    """Per layer of a causal LM, its attention's sliding window (None: it sees the whole prefix). A
    ConfigError for what the caches and masks here cannot serve: a layer that is not attention with
    a key/value cache (a state-space or linear-attention layer, chunked attention, a layer sharing
    another's cache), or sliding windows of several sizes."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    from models.lm.family import FIELD, decoder_config, model_type

    cfg = decoder_config(config)
    kinds, kwargs = get_layer_types_and_kwargs(cfg)
    other = sorted(set(kinds) - set(ATTENTION))
    if other:
        raise ConfigError(FIELD, model_type(cfg), f"has layers of kind {other}; speculative decoding here "
                          f"needs every layer to be attention with a key/value cache ({list(ATTENTION)})")
    windows = [int(kw["sliding_window"]) if kind == "sliding_attention" else None for kind, kw in zip(kinds, kwargs)]
    sizes = sorted({w for w in windows if w is not None})
    if len(sizes) > 1:
        raise ConfigError(FIELD, model_type(cfg), f"sliding windows of several sizes {sizes}; one size (beside "
                          "full attention) is supported")
    return windows


def new_cache() -> Any:
    """An empty cache whose every layer keeps all its tokens (see the module's docstring); check the
    model with ``sliding_windows`` first."""
    from transformers import DynamicCache

    return DynamicCache()  # no config: plain layers, made as the model first writes to them


def _layer_masks(windows: list[int | None], mask: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor
                 ) -> torch.Tensor | dict[str, torch.Tensor]:
    """The attention mask(s) for a custom boolean ``mask`` (B, 1, n, S) whose queries sit at
    positions ``queries`` (B, n) and keys at ``keys`` (B, S), for layers of ``windows``
    (``sliding_windows``). A 4-D mask reaches the attention as given, so sliding windows are
    applied here as transformers' own masks do (a query sees a key less than ``window`` positions
    back): one mask when every layer has the same window, else one per layer kind (what models
    mixing full and sliding layers take)."""

    def windowed(window: int | None) -> torch.Tensor:
        if window is None:
            return mask
        return mask & (queries[:, None, :, None] - keys[:, None, None, :] < window)

    if len(set(windows)) == 1:
        return windowed(windows[0])
    return {"full_attention": mask, "sliding_attention": windowed(next(w for w in windows if w is not None))}


def layer_kv(cache: Any, start: int = 0, upto: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer of a transformers cache, (keys, values) of positions start..upto - 1."""
    return [(layer.keys[:, :, start:upto], layer.values[:, :, start:upto]) for layer in cache.layers]


@torch.inference_mode()
def batched_logits(target: Any, lms: Sequence[CachedLM], feeds: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """One target forward for several sessions: each ``lms[i]`` is fed ``feeds[i]`` after what it
    caches. The caches are zero-padded into one batch (a mask hides the padding, positions continue
    each session's own), then each session's cache takes its new entries (and its last hidden
    states, which EAGLE-style drafts read). Per session, the (len(feed), V) logits, float32."""
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
    windows = sliding_windows(target.config)
    cache = new_cache()
    if lmax:  # every session's cache, zero-padded to lmax (the mask hides the padding)
        held = next(lm for lm, c in zip(lms, past) if c).cache.layers
        for layer, like in enumerate(held):
            keys = like.keys.new_zeros((b, like.keys.shape[1], lmax, like.keys.shape[-1]))
            values = like.values.new_zeros((b, like.values.shape[1], lmax, like.values.shape[-1]))
            for i, (lm, c) in enumerate(zip(lms, past)):
                if c:
                    keys[i, :, :c], values[i, :, :c] = lm.cache.layers[layer].keys[0], lm.cache.layers[layer].values[0]
            cache.update(keys, values, layer)
    key_positions = torch.cat([torch.arange(lmax).expand(b, -1), positions], 1)  # (B, lmax + nmax), each column's
    masks = _layer_masks(windows, mask, positions, key_positions)
    with LastHidden(lm_head(target)) as states:
        out = target(input_ids=ids, cache=cache, use_cache=True, attention_mask=masks, position_ids=positions)
    logits = []
    for i, (lm, feed, c) in enumerate(zip(lms, feeds, past)):
        mine = new_cache()
        for layer, batched in enumerate(out.cache.layers):
            fresh = slice(lmax, lmax + len(feed))
            new_k, new_v = batched.keys[i : i + 1, :, fresh], batched.values[i : i + 1, :, fresh]
            if c:
                old = lm.cache.layers[layer]
                new_k, new_v = torch.cat([old.keys[:, :, :c], new_k], 2), torch.cat([old.values[:, :, :c], new_v], 2)
            mine.update(new_k.contiguous(), new_v.contiguous(), layer)
        lm.cache = mine
        last = states.states[i, : len(feed)]  # the features EAGLE-style drafts read
        lm.add_hidden(c, last)
        logits.append(out.logits[i, : len(feed)])
    return logits
