"""Speculative decoding's acceptance rule, written once, in numpy (a torch-free device drafts too).

    probs = distribution(logits, temperature=0.8, top_p=0.95)      # (..., V), rows sum to 1
    n, token = accept_greedy(draft_tokens, target_argmax)          # greedy: lossless by equality
    n, token = accept_sampling(draft_tokens, q, p, rng)            # sampling: lossless in distribution
    path, token = accept_tree_greedy(parents, tokens, target_argmax)           # a drafted token tree
    path, token = accept_tree_sampling(parents, tokens, candidates, q, p, rng)

A draft proposes K tokens ``x_1..x_K`` with its distributions ``q_i``; one target forward gives
``p_1..p_{K+1}`` (``p_i`` conditioned on the prefix and ``x_1..x_{i-1}``). The rule returns how
many draft tokens are kept (``n``) and the token that follows them: the target's correction at
the first rejection, or its bonus token after ``x_K`` when all are kept. Every call therefore
adds ``n + 1`` tokens.

Sampling: Leviathan et al. 2023 (Algorithm 1) and Chen et al. 2023 (Algorithm 2): keep ``x_i``
with probability ``min(1, p_i(x_i) / q_i(x_i))``; on rejection, sample from
``norm(max(0, p_i - q_i))``. The emitted tokens are then distributed exactly as sampling the
target alone (Leviathan et al., Theorem 3.5); ``tests/edge/llm/test_speculative.py`` checks it with a
chi-square test against the enumerated target distribution.

Trees (EAGLE-2, MoA): node 0 is the last verified token, node ``i > 0`` holds ``tokens[i]`` after
its ``parents[i]``; one target forward gives ``p`` at every node. Greedy walks down while the
target's argmax at a node is one of its children. Sampling needs each expanded node's children
to be ``candidates[i]``, draws i.i.d. from ``q[i]`` in draw order (repeats allowed): each is tried
in turn with probability ``min(1, p(x) / q(x))``, and after each rejection ``p`` becomes
``norm(max(0, p - q))`` (SpecInfer's multi-round speculative sampling, Miao et al. 2024, Thm 4.2);
when all are rejected, or the node has none, the next token is drawn from what ``p`` has become.
A chain is the tree whose nodes each have one candidate, and then both rules draw the same.

Coupled sampling (auto mode): every position of the text gets its own Gumbel noise, drawn from
the seed and the position alone (``GumbelNoise``), and a token is ``argmax(log p + g)`` — an
exact draw from ``p`` (the Gumbel-max trick), whatever came before, since the noise of a position
is independent of the tokens that chose the prefix. The draft proposes ``argmax(log q + g)`` with
the same noise, and the target keeps it when its own coupled choice is the same token: greedy
verification on perturbed logits. The text is then the target's own coupled sample token for
token, whatever the draft, however many tokens each round drafts (so a cost model driven by
timings can choose K freely and a seed still fixes the text), and a draft close to the target
agrees with it most of the time. It keeps somewhat fewer draft tokens than the rule above
(the coupling is not the maximal one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def distribution(logits: np.ndarray, temperature: float = 1.0, top_p: float = 1.0) -> np.ndarray:
    """Softmax of ``logits / temperature`` over the last axis, restricted to the nucleus: the
    smallest set of most probable tokens whose mass reaches ``top_p`` (Holtzman et al. 2020),
    renormalised. ``temperature`` 0 is greedy (all mass on the argmax)."""
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"temperature = {temperature}, top_p = {top_p}: need temperature >= 0 and 0 < top_p <= 1")
    z = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        out = np.zeros_like(z)
        np.put_along_axis(out, z.argmax(-1)[..., None], 1.0, axis=-1)
        return out
    z = z / temperature
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if top_p < 1:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(sorted_p, axis=-1) - sorted_p  # mass of the more probable tokens
        keep_sorted = before < top_p  # always keeps the most probable token
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(-1, keepdims=True)
    return p


def accept_greedy(draft_tokens: np.ndarray, target_argmax: np.ndarray) -> tuple[int, int]:
    """(kept, next token): keep draft tokens while each equals the target's argmax at its position;
    the next token is the target's argmax after the kept ones. ``target_argmax`` has K + 1 entries."""
    draft = np.asarray(draft_tokens)
    target = np.asarray(target_argmax)
    if target.shape != (len(draft) + 1,):
        raise ValueError(f"target_argmax has shape {target.shape}; need ({len(draft) + 1},) for {len(draft)} draft tokens")
    mismatch = np.flatnonzero(draft != target[: len(draft)])
    n = int(mismatch[0]) if len(mismatch) else len(draft)
    return n, int(target[n])


def accept_sampling(draft_tokens: np.ndarray, q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> tuple[int, int]:
    """(kept, next token) by speculative sampling. ``q``: (K, V) the draft's distributions the draft
    tokens were sampled from; ``p``: (K + 1, V) the target's, the last one after all K tokens."""
    draft = np.asarray(draft_tokens)
    k = len(draft)
    if q.shape[0] != k or p.shape[0] != k + 1 or q.shape[1:] != p.shape[1:]:
        raise ValueError(f"q {q.shape} and p {p.shape}: need (K, V) and (K + 1, V) for K = {k} draft tokens")
    for i, token in enumerate(draft):
        q_x, p_x = float(q[i, token]), float(p[i, token])
        if q_x <= 0:
            raise ValueError(f"draft token {token} at position {i} has probability 0 under the draft's own q")
        if rng.random() < min(1.0, p_x / q_x):
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        total = residual.sum()
        # total is 0 only if p == q, where rejection has probability 0; guard rounding anyway
        return i, int(rng.choice(len(residual), p=residual / total if total > 0 else p[i]))
    return k, int(rng.choice(p.shape[1], p=p[k]))


class GumbelNoise:
    """Standard Gumbel noise per text position, a function of (seed, position) only: position
    ``start + i`` reads row ``i`` of one stream seeded by ``seed``, made in blocks of ``block``
    positions (one generator call per block, not per token)."""

    def __init__(self, seed: int, vocab: int, start: int = 0, block: int = 32) -> None:
        if seed < 0 or vocab < 1 or block < 1:
            raise ValueError(f"seed = {seed}, vocab = {vocab}, block = {block}: need seed >= 0, vocab and block >= 1")
        self.rng, self.vocab, self.start, self.block = np.random.default_rng(seed), vocab, start, block
        self.blocks: list[np.ndarray] = []

    def __call__(self, position: int) -> np.ndarray:
        """(vocab,) the noise of ``position`` (>= start)."""
        i = position - self.start
        if i < 0:
            raise ValueError(f"position {position} is before the first noisy position {self.start}")
        while len(self.blocks) * self.block <= i:  # blocks come in order, so a position's row never depends on use
            self.blocks.append(self.rng.gumbel(size=(self.block, self.vocab)))
        return self.blocks[i // self.block][i % self.block]


def coupled_choice(p: np.ndarray, noise: np.ndarray) -> int:
    """``argmax(log p + noise)``: with standard Gumbel noise, an exact draw from ``p`` (tokens of
    probability 0 are never chosen)."""
    with np.errstate(divide="ignore"):
        return int(np.argmax(np.log(p) + noise))


def _children(parents: np.ndarray, tokens: np.ndarray) -> list[dict[int, int]]:
    """Per node, its children by token (the first child holding a token)."""
    children: list[dict[int, int]] = [{} for _ in range(len(parents))]
    for i in range(1, len(parents)):
        if not 0 <= parents[i] < i:
            raise ValueError(f"node {i} has parent {parents[i]}: parents must come before their children")
        children[int(parents[i])].setdefault(int(tokens[i]), i)
    return children


def accept_tree_greedy(parents: np.ndarray, tokens: np.ndarray, target_argmax: np.ndarray) -> tuple[list[int], int]:
    """(kept nodes from the root down, next token): follow the child equal to the target's argmax at
    each node; the next token is the argmax at the last node kept. ``parents[0]`` (the root) is ignored."""
    parents, tokens, target = np.asarray(parents), np.asarray(tokens), np.asarray(target_argmax)
    if not len(parents) == len(tokens) == len(target):
        raise ValueError(f"parents {parents.shape}, tokens {tokens.shape}, target_argmax {target.shape}: one entry per node")
    children = _children(parents, tokens)
    path, node = [], 0
    while (child := children[node].get(int(target[node]))) is not None:
        path.append(child)
        node = child
    return path, int(target[node])


def accept_tree_sampling(parents: np.ndarray, tokens: np.ndarray, candidates: list[list[int]], q: dict[int, np.ndarray],
                         p: np.ndarray, rng: np.random.Generator) -> tuple[list[int], int]:
    """(kept nodes from the root down, next token) by multi-round speculative sampling over the tree.
    ``candidates[i]``: node i's draws from ``q[i]`` in draw order (each a child's token); ``p``:
    (nodes, V) the target's distribution at each node."""
    parents, tokens = np.asarray(parents), np.asarray(tokens)
    if not len(parents) == len(tokens) == len(candidates) == p.shape[0]:
        raise ValueError(f"parents {parents.shape}, tokens {tokens.shape}, {len(candidates)} candidate lists, p {p.shape}: "
                         "one entry per node")
    children = _children(parents, tokens)
    path, node = [], 0
    while True:
        dist = p[node]
        moved = False
        for token in candidates[node]:
            if token not in children[node]:
                raise ValueError(f"node {node}: candidate {token} is not one of its children")
            q_x = float(q[node][token])
            if q_x <= 0:
                raise ValueError(f"node {node}: candidate {token} has probability 0 under the draft's own q")
            if rng.random() < min(1.0, float(dist[token]) / q_x):
                node = children[node][token]
                path.append(node)
                moved = True
                break
            residual = np.maximum(dist - q[node], 0.0)
            total = residual.sum()
            dist = residual / total if total > 0 else dist  # 0 only where p == q (rejection impossible): rounding
        if not moved:
            return path, int(rng.choice(len(dist), p=dist))


def accept_tests(draft_tokens: np.ndarray, q_of_draft: np.ndarray, p: np.ndarray, rng: np.random.Generator
                 ) -> tuple[int, int | None]:
    """Speculative sampling split across a link, server half: the accept tests need only the
    draft's probability of each draft token (``q_of_draft``, K). Returns (kept, next): ``next``
    drawn from ``p[K]`` when all K are kept, else None, and the client draws the correction from
    ``residual(p[kept], q[kept])`` — together exactly ``accept_sampling``'s draw."""
    draft = np.asarray(draft_tokens)
    k = len(draft)
    if q_of_draft.shape != (k,) or p.shape[0] != k + 1:
        raise ValueError(f"q_of_draft {q_of_draft.shape} and p {p.shape}: need (K,) and (K + 1, V) for K = {k}")
    for i, token in enumerate(draft):
        if not rng.random() < min(1.0, float(p[i, token]) / float(q_of_draft[i])):
            return i, None
    return k, int(rng.choice(p.shape[1], p=p[k]))


def residual(p: np.ndarray, q: np.ndarray, rng: np.random.Generator) -> int:
    """The correction after a rejected draft token: a draw from norm(max(0, p − q))."""
    res = np.maximum(np.asarray(p, dtype=np.float64) - q, 0.0)
    total = res.sum()
    return int(rng.choice(len(res), p=res / total if total > 0 else p))


# ---- how many tokens to draft: the one adaptive-K rule (single host and client–server) ----


def best_draft_length(rate: float, k_max: int, round_s: float, token_s: float) -> int:
    """The draft length in 1..k_max of most expected tokens per second: a round keeps
    ``(1 - a^(K+1)) / (1 - a)`` tokens on average (per-token acceptance ``a``) and costs
    ``round_s`` (the target's call, or the round trip) plus K drafted tokens of ``token_s``. A slow
    round makes long blocks pay even at a modest acceptance rate; a fast one keeps them short, so a
    rejection wastes little drafting."""
    rate = min(max(rate, 0.0), 0.99)
    gain = [(1 - rate ** (k + 1)) / ((1 - rate) * (round_s + k * token_s)) for k in range(1, k_max + 1)]
    return int(np.argmax(gain)) + 1


@dataclass
class AcceptanceRate:
    """A draft's running per-token acceptance rate: decayed sums of tokens kept and tried, from a
    prior of 0.6 (1.8 of 3)."""

    kept: float = 1.8
    tried: float = 3.0
    decay: float = 0.7

    @property
    def rate(self) -> float:
        return self.kept / self.tried

    def update(self, kept: int, drafted: int) -> None:
        """``kept`` of ``drafted`` tokens kept: that many successes, and one failed trial unless
        all were kept."""
        self.kept = self.decay * self.kept + kept
        self.tried = self.decay * self.tried + kept + (kept < drafted)
