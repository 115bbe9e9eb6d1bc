"""Speculative decoding on Hugging Face causal LMs: draft K tokens (a chain) or a token tree,
verify them with one target forward, keep the longest valid path plus the target's own next
token, roll the caches back.

    target = AutoModelForCausalLM.from_pretrained("runs/lm/base")
    drafter = IndependentDrafter(AutoModelForCausalLM.from_pretrained("runs/lm/draft"))
    tokens, stats = speculative_generate(target, drafter, prompt_ids, max_new_tokens=128, k=4)
    tokens, stats = speculative_generate(target, drafter, prompt_ids, 128, tree=Tree(depth=5, branch=2, width=3))
    tokens, stats = speculative_generate(target, drafter, prompt_ids, 128, k=8, adaptive=True)

The verify loop never knows which draft it holds (transformers' ``CandidateGenerator`` is the
model): a ``Drafter`` gives its next-token logits after the verified sequence followed by any
drafted path (``path_logits``, several paths in one batched call), and the loop grows a chain or
a tree from them. The acceptance rules are ``edge.llm.acceptance`` — the same numpy functions a
torch-free device runs — so greedy output is the target's own greedy output token for token, and
sampled output is distributed exactly as the target's (Leviathan et al. 2023; SpecInfer for trees).

Caches: the target's ``DynamicCache`` always holds every token but the last one. A chain is
verified by feeding ``[last, x_1..x_K]`` and cropping back (``crop`` takes a negative count in
transformers 5); a tree by feeding ``[last, nodes...]`` with a tree attention mask (each node sees
the prefix, its ancestors and itself) and keeping the accepted path's entries only.

Draft length: fixed ``k``, or ``adaptive``: before each call, the K in 1..k that maximises the
expected tokens per unit of time, ``(1 - a^(K+1)) / ((1 - a)(1 + c K))``, for the running
per-token acceptance rate ``a`` (kept over tried draft tokens, decayed sums, a prior of 0.6) and the draft's cost
per token relative to a target call ``c`` (the drafter's ``cost`` attribute, else 0.1). It
depends on accepted counts only, never on timings, so a seed still fixes the output.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from edge.llm.acceptance import (
    AcceptanceRate,
    GumbelNoise,
    accept_greedy,
    accept_sampling,
    accept_tree_greedy,
    accept_tree_sampling,
    best_draft_length,
    coupled_choice,
    distribution,
)
from edge.llm.cost import AutoSession, DecodeCost
from models.lm.cache import CachedLM


@dataclass
class DecodeStats:
    """What one generation cost: target calls, drafted and kept tokens, wall time."""

    new_tokens: int = 0
    target_calls: int = 0
    drafted: int = 0
    kept: int = 0
    seconds: float = 0.0
    kept_per_call: list[int] = field(default_factory=list)
    k_per_call: list[int] = field(default_factory=list)

    @property
    def accept_length(self) -> float:
        """Mean tokens added per target call, the target's own token included (the paper's τ)."""
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class Tree:
    """Tree drafting's shape (EAGLE-2 style): ``depth`` levels; at each, the ``width`` nodes of
    highest cumulative draft log-probability are expanded, each by ``branch`` children (greedy:
    the draft's top ``branch`` tokens; sampling: ``branch`` i.i.d. draws, repeats merged)."""

    depth: int = 5
    branch: int = 2
    width: int = 3

    def __post_init__(self) -> None:
        if min(self.depth, self.branch, self.width) < 1:
            raise ValueError(f"tree {self}: depth, branch and width must be >= 1")


@dataclass
class DraftTree:
    """A drafted token tree. Node 0 is the last verified token; node i > 0 holds ``tokens[i]``
    after ``parents[i]``; ``candidates[i]`` are node i's draws (its children's tokens, in draw
    order) and, when sampling, ``q[i]`` the distribution they were drawn from."""

    parents: list[int]
    tokens: list[int]
    candidates: list[list[int]]
    q: dict[int, np.ndarray]

    @classmethod
    def root(cls, token: int) -> DraftTree:
        return cls([-1], [token], [[]], {})

    def path(self, node: int) -> list[int]:
        """The tokens from below the root down to ``node``."""
        out = []
        while node > 0:
            out.append(self.tokens[node])
            node = self.parents[node]
        return out[::-1]

    def depths(self) -> list[int]:
        depth = [0] * len(self.parents)
        for i in range(1, len(self.parents)):
            depth[i] = depth[self.parents[i]] + 1
        return depth


class Drafter(Protocol):
    """What the verify loop needs of a draft."""

    def reset(self, prompt: list[int]) -> None:
        """Start a new sequence."""

    def prepare(self, seq: list[int]) -> bool:
        """``seq`` is the verified sequence (its last token the target's own): bring the draft's
        caches up to it. False: the draft cannot propose yet (the loop decodes one token plainly)."""

    def path_logits(self, seq: list[int], paths: Sequence[Sequence[int]]) -> np.ndarray:
        """(len(paths), V) float64: the draft's next-token logits after ``seq`` + each path (all
        paths of one length). Called after ``prepare(seq)``."""


class DraftHead:
    """An LM head read only over a draft vocabulary: the ``vocab`` most frequent tokens of the
    training text (FR-Spec, Zhao et al. 2025). On a CPU one drafted token reads the whole head
    from memory, and the head is most of a small draft's weights; a quarter of its rows costs a
    quarter. Tokens outside get no probability from the draft (its logits there are -inf), which
    the acceptance rules handle exactly: the target still emits them, as corrections."""

    def __init__(self, head: torch.nn.Linear, vocab: Sequence[int] | None = None) -> None:
        self.size = head.weight.shape[0]
        self.rows = None if vocab is None else np.array(sorted(set(vocab)), dtype=np.int64)
        index = None if self.rows is None else torch.from_numpy(self.rows)
        self.weight = head.weight.detach() if index is None else head.weight.detach()[index].contiguous()
        bias = head.bias.detach() if head.bias is not None else None
        self.bias = bias if bias is None or index is None else bias[index]
        self.quantized: torch.nn.Module | None = None  # int8 weights (``to_int8``)

    def to_int8(self) -> None:
        """Read the head through int8 weights from now on (torch's dynamic quantization)."""
        linear = torch.nn.Linear(self.weight.shape[1], self.weight.shape[0], bias=self.bias is not None)
        with torch.no_grad():
            linear.weight.copy_(self.weight.float())
            if self.bias is not None:
                linear.bias.copy_(self.bias.float())
        self.quantized = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear},
                                                               dtype=torch.qint8)

    def logits(self, hidden: torch.Tensor) -> np.ndarray:
        """(n, V) float64 logits of hidden states (n, H), -inf outside the draft vocabulary."""
        if self.quantized is not None:
            z = self.quantized(hidden.float()).double().numpy()
        else:
            z = torch.nn.functional.linear(hidden, self.weight, self.bias).double().numpy()
        if self.rows is None:
            return z
        full = np.full((z.shape[0], self.size), -np.inf)
        full[:, self.rows] = z
        return full


def draft_vocabulary(train_ids: torch.Tensor, vocab_size: int, n: int) -> list[int]:
    """The ``n`` most frequent token ids of a training stream (ties: the lower id), ascending."""
    counts = torch.bincount(train_ids, minlength=vocab_size).numpy()
    order = np.lexsort((np.arange(vocab_size), -counts))  # by count, descending, then by id
    return sorted(int(t) for t in order[: min(n, vocab_size)])


def _greedy_or_sampled(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator
                       ) -> tuple[int, np.ndarray | None]:
    if temperature == 0:
        return int(logits.argmax()), None
    q = distribution(logits, temperature, top_p)
    return int(rng.choice(len(q), p=q)), q


def draft_chain(drafter: Drafter, seq: list[int], k: int, temperature: float, top_p: float, rng: np.random.Generator,
                noise: Callable[[int], np.ndarray] | None = None) -> tuple[list[int], np.ndarray | None]:
    """K tokens drafted one after another (argmax when greedy, else sampled) and, when sampling,
    the (K, V) distributions they were drawn from (what the acceptance rule needs). ``noise``:
    coupled sampling (auto mode), the Gumbel noise of a text position; then no q is returned."""
    tokens: list[int] = []
    dists = []
    for _ in range(k):
        logits = drafter.path_logits(seq, [tokens])[0]
        if noise is not None and temperature > 0:
            token, q = coupled_choice(distribution(logits, temperature, top_p), noise(len(seq) + len(tokens))), None
        else:
            token, q = _greedy_or_sampled(logits, temperature, top_p, rng)
        tokens.append(token)
        if q is not None:
            dists.append(q)
    return tokens, (np.stack(dists) if dists else None)


def draft_tree(drafter: Drafter, seq: list[int], shape: Tree, depth: int, temperature: float, top_p: float,
               rng: np.random.Generator) -> DraftTree:
    """A token tree of up to ``depth`` levels grown by ``shape`` (see ``Tree``). Which nodes are
    expanded depends on draft probabilities already drawn only, never on a node's own draws, so
    each expanded node's candidates stay i.i.d. from its q (what lossless tree sampling needs)."""
    tree = DraftTree.root(seq[-1])
    score = [0.0]  # cumulative draft log-probability of each node
    frontier = [0]
    for _ in range(depth):
        logits = drafter.path_logits(seq, [tree.path(node) for node in frontier])  # (w, V)
        grown: list[int] = []
        for row, node in enumerate(frontier):
            if temperature == 0:
                probs = distribution(logits[row])
                draws = [int(t) for t in np.argsort(-probs, kind="stable")[: shape.branch]]
            else:
                probs = distribution(logits[row], temperature, top_p)
                draws = [int(t) for t in rng.choice(len(probs), size=shape.branch, p=probs)]
                tree.q[node] = probs
            tree.candidates[node] = draws
            for token in dict.fromkeys(draws):
                tree.parents.append(node)
                tree.tokens.append(token)
                tree.candidates.append([])
                score.append(score[node] + math.log(max(float(probs[token]), 1e-300)))
                grown.append(len(tree.tokens) - 1)
        frontier = sorted(grown, key=lambda i: -score[i])[: shape.width]  # stable: ties keep draw order
    return tree


class TargetReader:
    """Base of drafts that read the target's states of the verified prefix (MoA, EAGLE-style): a
    draft module sharing the target's LM head, read over the draft vocabulary ``vocab``; the
    verify loop hands them its cached target (``attach_target``). Subclasses keep their
    per-sequence caches in ``reset``."""

    needs_hidden = False  # whether the target must keep its last hidden states

    def __init__(self, draft: Any, vocab: Sequence[int] | None = None) -> None:
        self.draft = draft.eval()
        assert draft.head is not None, "attach the draft to its target first"
        self.vocab = vocab
        self.head = DraftHead(draft.head, vocab)
        self.target_lm: Any = None
        self.reset([])

    def reset(self, prompt: list[int]) -> None:
        """Start a new sequence."""

    def attach_target(self, target_lm: Any) -> None:
        self.target_lm = target_lm


def int8_drafter(drafter: Any) -> Any:
    """``drafter`` with int8 weights in its own linear layers and its draft head (torch's dynamic
    quantization, fbgemm on x86): a cheaper draft on the server. The verify loop keeps the text
    exact; whether the cheaper draft pays is measured (``trickle bench speculative``)."""
    quantize = torch.ao.quantization.quantize_dynamic
    if isinstance(drafter, TargetReader):
        drafter.draft = quantize(drafter.draft, {torch.nn.Linear}, dtype=torch.qint8)
        drafter.head.to_int8()
    elif isinstance(drafter, IndependentDrafter):
        drafter.lm.model = quantize(drafter.lm.model, {torch.nn.Linear}, dtype=torch.qint8)
        if drafter.head is not None:
            drafter.head.to_int8()
    else:
        raise TypeError(f"{type(drafter).__name__}: no int8 form")
    return drafter


class NoDrafter:
    """Proposes nothing: the verify loop then decodes plainly, one target call per token (the
    baseline, with the very same sampling). ``prepare`` answers False, so the loop never asks
    it for logits."""

    def reset(self, prompt: list[int]) -> None:
        pass

    def prepare(self, seq: list[int]) -> bool:
        return False

    def path_logits(self, seq: list[int], paths: Sequence[Sequence[int]]) -> np.ndarray:
        raise RuntimeError("NoDrafter.prepare answers False: the verify loop never asks it for logits")


class IndependentDrafter:
    """A small causal LM with the target's tokenizer: the classic draft model. Its cache follows
    the longest sequence it has seen that is still a prefix of what it is asked about; paths of a
    tree are run as one batch on copies of the cached prefix."""

    cost = 0.15  # a drafted token's time over a target call's, measured with the base target here

    def __init__(self, model: Any, vocab: Sequence[int] | None = None) -> None:
        self.head = DraftHead(model.get_output_embeddings(), vocab) if vocab is not None else None
        self.lm = CachedLM(model, head=self.head)
        self.fed: list[int] = []  # the tokens the cache holds

    def reset(self, prompt: list[int]) -> None:
        self.lm.reset()
        self.fed = []

    def prepare(self, seq: list[int]) -> bool:
        return True

    def _follow(self, tokens: list[int]) -> None:
        """Make the cache hold ``tokens[:-1]``: crop to the common prefix, feed the rest but the last."""
        common = 0
        for a, b in zip(self.fed, tokens[:-1]):
            if a != b:
                break
            common += 1
        self.lm.crop(common)
        self.fed = self.fed[:common]
        if len(tokens) - 1 > common:
            self.lm.logits(tokens, upto=len(tokens) - 1)
            self.fed = tokens[:-1]

    @torch.inference_mode()
    def path_logits(self, seq: list[int], paths: Sequence[Sequence[int]]) -> np.ndarray:
        if len(paths) == 1:  # a chain: extend the cache itself
            tokens = [*seq, *paths[0]]
            self._follow(tokens)
            logits = self.lm.logits(tokens)
            self.fed = tokens
            return logits[-1:].numpy()
        self._follow(list(seq))
        return self.lm.branch_logits(seq[-1], paths).numpy()


@torch.inference_mode()
def speculative_generate(target: Any, drafter: Drafter, prompt: list[int], max_new_tokens: int, k: int = 4,
                         temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                         eos_token_id: int | None = None, on_tokens: Callable[[list[int]], bool | None] | None = None,
                         tree: Tree | None = None, adaptive: bool = False, auto: DecodeCost | AutoSession | None = None
                         ) -> tuple[list[int], DecodeStats]:
    """The prompt's continuation by speculative decoding, and what it cost. ``temperature`` 0 is
    greedy (lossless token for token); otherwise speculative sampling (lossless in distribution).
    A chain of ``k`` tokens per target call (at most ``k`` when ``adaptive``), or a ``tree``, or
    ``auto``: each round the chain length in 0..k (0: plain decoding) of most expected tokens per
    second by the measured cost model (``edge.llm.cost``), which the round's timings update;
    sampling is then coupled (``edge.llm.acceptance``), so the text is the same whatever K the
    timings choose. ``on_tokens`` is called with each block of tokens as it is verified (for
    streaming); the blocks concatenate to the returned tokens; when it returns True the generation
    ends there (a stop text)."""
    if k < 1 or max_new_tokens < 0 or not prompt:
        raise ValueError(f"k = {k}, max_new_tokens = {max_new_tokens}, prompt of {len(prompt)} tokens: need k >= 1, "
                         "max_new_tokens >= 0 and a non-empty prompt")
    if auto is not None and (tree is not None or adaptive):
        raise ValueError("auto chooses the chain length itself: give auto, or a tree, or adaptive, not several")
    session = auto.session(k) if isinstance(auto, DecodeCost) else auto
    # coupled sampling's noise (auto mode, sampling only)
    noise = GumbelNoise(seed, int(target.config.vocab_size), start=len(prompt)) \
        if session is not None and temperature > 0 else None

    rng = np.random.default_rng(seed)
    lm = CachedLM(target, keep_hidden=getattr(drafter, "needs_hidden", False))
    lm.reset()
    drafter.reset(prompt)
    attach = getattr(drafter, "attach_target", None)
    if attach is not None:  # a draft that reads the target's states (MoA, EAGLE-style)
        attach(lm)
    cost = float(getattr(drafter, "cost", 0.1))
    acceptance = AcceptanceRate()
    seq = list(prompt)
    stats = DecodeStats()
    started = time.perf_counter()
    if len(seq) > 1:
        lm.logits(seq, upto=len(seq) - 1)  # the cache holds every token but the last
    end = len(prompt) + max_new_tokens
    while len(seq) < end:
        room = end - len(seq) - 1  # draft tokens that can still be used
        verified = len(seq)
        if session is not None:
            kept, n_drafted, nxt = _auto_round(lm, drafter, session, seq, room, temperature, top_p, noise)
            stats.k_per_call.append(n_drafted)
        elif tree is not None:
            can = room > 0 and drafter.prepare(seq)
            drafted = draft_tree(drafter, seq, tree, min(tree.depth, room), temperature, top_p, rng) if can \
                else DraftTree.root(seq[-1])
            logits = lm.tree_logits(seq[-1], drafted)  # (nodes, V): at the root, then each node
            if temperature == 0:
                path, nxt = accept_tree_greedy(np.array(drafted.parents), np.array(drafted.tokens), logits.argmax(-1).numpy())
            else:
                p = distribution(logits.numpy(), temperature, top_p)
                path, nxt = accept_tree_sampling(np.array(drafted.parents), np.array(drafted.tokens), drafted.candidates,
                                                 drafted.q, p, rng)
            lm.keep(verified, path)
            kept, n_drafted = [drafted.tokens[i] for i in path], len(drafted.tokens) - 1
        else:
            can = room > 0 and drafter.prepare(seq)
            want = best_draft_length(acceptance.rate, k, 1.0, cost) if adaptive else k  # cost: a drafted token / a target call
            draft, q = draft_chain(drafter, seq, min(want, room), temperature, top_p, rng) if can else ([], None)
            logits = lm.logits(seq + draft)  # (len(draft) + 1, V): after the last verified token, then each draft token
            if temperature == 0:
                n, nxt = accept_greedy(np.array(draft, dtype=np.int64), logits.argmax(-1).numpy())
            else:
                p = distribution(logits.numpy(), temperature, top_p)
                n, nxt = accept_sampling(np.array(draft, dtype=np.int64), q if q is not None else p[:0], p, rng)
            if draft:
                acceptance.update(n, len(draft))
            kept, n_drafted = draft[:n], len(draft)
            stats.k_per_call.append(len(draft))
        stats.target_calls += 1
        stats.drafted += n_drafted
        stats.kept += len(kept)
        stats.kept_per_call.append(len(kept))
        added = [*kept, nxt][: end - len(seq)]
        stop = eos_token_id is not None and eos_token_id in added
        if eos_token_id is not None and stop:
            added = added[: added.index(eos_token_id) + 1]
        seq += added
        if on_tokens is not None and on_tokens(added):  # the caller has what it wants (a stop text)
            stop = True
        if stop:
            break
        lm.crop(len(seq) - 1)
    stats.seconds = time.perf_counter() - started
    out = seq[len(prompt) : end]
    stats.new_tokens = len(out)
    return out, stats


def _auto_round(lm: CachedLM, drafter: Drafter, session: AutoSession, seq: list[int], room: int,
                temperature: float, top_p: float, noise: Callable[[int], np.ndarray] | None
                ) -> tuple[list[int], int, int]:
    """One round of auto mode: (kept draft tokens, tokens drafted, the target's next token). The
    draft is asked nothing (not even to catch up) in a round that decodes plainly."""
    want = min(session.choose(), room)
    started = time.perf_counter()
    draft: list[int] = []
    if want > 0 and drafter.prepare(seq):
        draft, _ = draft_chain(drafter, seq, want, temperature, top_p, np.random.default_rng(0), noise=noise)
        session.observe_draft(len(draft), time.perf_counter() - started)
    started = time.perf_counter()
    logits = lm.logits(seq + draft)  # (len(draft) + 1, V)
    session.observe_verify(len(draft) + 1, time.perf_counter() - started)
    if noise is None:  # greedy
        choice = logits.argmax(-1).numpy()
    else:
        p = distribution(logits.numpy(), temperature, top_p)
        choice = np.array([coupled_choice(p[i], noise(len(seq) + i)) for i in range(len(p))])
    n, nxt = accept_greedy(np.array(draft, dtype=np.int64), choice)
    if draft:
        session.observe_acceptance(n, len(draft))
    return draft[:n], len(draft), nxt


@torch.inference_mode()
def calibrate(target: Any, drafter: Drafter, k: int, rounds: int = 4) -> DecodeCost:
    """A cost model for ``auto`` measured on this machine: after a first draft (which catches up
    on the prompt), ``rounds`` each of a one-token and a ``k``-token draft back to back, on a
    made-up prompt (what is drafted does not matter, only what it costs). The verification's line
    is fitted at 2 and k + 1 tokens, the drafting's at 1 and k tokens, in steady drafting."""
    vocab = int(target.config.vocab_size)
    prompt = [(7 * i + 3) % vocab for i in range(16)]
    cost = DecodeCost.prior(verify_s=1e-3, draft_token_s=1e-3)
    plan = (k, *(1, k) * rounds)
    speculative_generate(target, drafter, prompt, len(plan) * (k + 1) + 1, k=k, auto=cost.session(k, plan))
    return cost
