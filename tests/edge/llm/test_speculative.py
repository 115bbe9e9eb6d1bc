"""The acceptance rule: greedy by hand, and speculative sampling lossless in distribution (a
chi-square test against the target's enumerated distribution, which a broken rule fails)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest
from scipy.stats import chisquare

from edge.llm.acceptance import (
    GumbelNoise,
    accept_greedy,
    accept_sampling,
    accept_tests,
    accept_tree_greedy,
    accept_tree_sampling,
    coupled_choice,
    distribution,
    residual,
)

V = 8  # a tiny vocabulary, so the target's distribution over a few tokens can be enumerated
TOKENS = 3  # generated tokens whose joint distribution is tested
SAMPLES = 20_000


def test_greedy_keeps_the_matching_prefix_and_adds_the_targets_token() -> None:
    assert accept_greedy(np.array([5, 6, 7]), np.array([5, 6, 7, 1])) == (3, 1)  # all kept, then the bonus
    assert accept_greedy(np.array([5, 6, 7]), np.array([5, 2, 7, 1])) == (1, 2)  # the correction at the first miss
    assert accept_greedy(np.array([5, 6, 7]), np.array([4, 6, 7, 1])) == (0, 4)
    assert accept_greedy(np.array([], dtype=int), np.array([3])) == (0, 3)
    with pytest.raises(ValueError, match="need \\(3,\\)"):
        accept_greedy(np.array([1, 2]), np.array([1, 2]))


def test_distribution_temperature_and_nucleus() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert np.allclose(distribution(logits), [0.5, 0.3, 0.15, 0.05])
    assert np.allclose(distribution(logits, top_p=0.79), [0.5 / 0.8, 0.3 / 0.8, 0, 0])  # 0.5 + 0.3 reaches 0.79
    assert np.allclose(distribution(logits, top_p=0.81), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0])
    assert np.allclose(distribution(logits, top_p=0.1), [1, 0, 0, 0])  # the most probable token always stays
    assert np.array_equal(distribution(logits, temperature=0), [1, 0, 0, 0])
    sharp = distribution(logits, temperature=0.5)
    assert np.allclose(sharp, np.array([0.5, 0.3, 0.15, 0.05]) ** 2 / np.sum(np.array([0.5, 0.3, 0.15, 0.05]) ** 2))


def _chain(seed: int, concentration: float) -> np.ndarray:
    """A first-order 'language model': row t is the distribution of the next token after token t."""
    return np.random.default_rng(seed).dirichlet(np.full(V, concentration), size=V)


TARGET = _chain(1, 0.7)
DRAFT = _chain(2, 0.7)  # deliberately mismatched: another random chain


def _speculative(rule: Callable[..., tuple[int, int]], k: int, seed: int, draft: np.ndarray = DRAFT) -> np.ndarray:
    """SAMPLES sequences of TOKENS tokens after token 0, drafted K at a time by DRAFT, checked by rule."""
    rng = np.random.default_rng(seed)
    out = np.empty((SAMPLES, TOKENS), dtype=np.int64)
    for s in range(SAMPLES):
        seq = [0]
        while len(seq) <= TOKENS:
            drafted, q = [], []
            last = seq[-1]
            for _ in range(k):
                q.append(draft[last])
                last = int(rng.choice(V, p=draft[last]))
                drafted.append(last)
            p = TARGET[[seq[-1], *drafted]]  # the target after the prefix, then after each draft token
            n, nxt = rule(np.array(drafted), np.array(q), p, rng)
            seq += [*drafted[:n], nxt]
        out[s] = seq[1 : TOKENS + 1]
    return out


def _chi_square_p(samples: np.ndarray) -> float:
    """p-value of the samples' joint distribution against the target's exact one (cells with a
    small expected count pooled, as the test requires)."""
    cells = list(itertools.product(range(V), repeat=TOKENS))
    exact = np.array([TARGET[0, a] * TARGET[a, b] * TARGET[b, c] for a, b, c in cells])
    index = samples @ (V ** np.arange(TOKENS)[::-1])
    observed = np.bincount(index, minlength=V**TOKENS).astype(float)
    expected = exact * SAMPLES
    small = expected < 5
    observed = np.append(observed[~small], observed[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    return float(chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_sampling_draws_from_the_target_exactly(k: int) -> None:
    assert _chi_square_p(_speculative(accept_sampling, k, seed=k)) > 1e-3


def test_a_draft_blind_to_some_tokens_still_samples_the_target_exactly() -> None:
    """A draft vocabulary (models.lm.speculative.DraftHead): the draft gives tokens 5..7 no probability."""
    blind = DRAFT.copy()
    blind[:, 5:] = 0
    assert _chi_square_p(_speculative(accept_sampling, 3, seed=21, draft=blind / blind.sum(1, keepdims=True))) > 1e-3


def test_sampling_split_across_a_link_draws_from_the_target_exactly() -> None:
    """The server runs the accept tests with q of the draft tokens only; the device draws the
    correction from the residual with its own q (edge.llm.generate over server.llm.verify)."""
    device = np.random.default_rng(99)

    def split(draft: np.ndarray, q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> tuple[int, int]:
        n, nxt = accept_tests(draft, q[np.arange(len(draft)), draft], p, rng)  # on the server
        return n, nxt if nxt is not None else residual(p[n], q[n], device)  # on the device

    assert _chi_square_p(_speculative(split, 3, seed=31)) > 1e-3


def _coupled(k: int, shared: bool = False) -> tuple[np.ndarray, float]:
    """Coupled sampling (auto mode): SAMPLES sequences, each with its own seed, drafted K at a time
    by DRAFT with the position's noise and kept where the target's coupled choice agrees; and the
    share of draft tokens kept."""
    out = np.empty((SAMPLES, TOKENS), dtype=np.int64)
    kept = tried = 0
    for s in range(SAMPLES):
        fresh = GumbelNoise(s, V, start=1, block=4)

        def noise(position: int, fresh: GumbelNoise = fresh) -> np.ndarray:
            return fresh(1 if shared else position)

        seq = [0]
        while len(seq) <= TOKENS:
            drafted = []
            for i in range(k):
                drafted.append(coupled_choice(DRAFT[([*seq, *drafted])[-1]], noise(len(seq) + i)))
            choice = np.array([coupled_choice(TARGET[t], noise(len(seq) + i))
                               for i, t in enumerate([seq[-1], *drafted])])
            n, nxt = accept_greedy(np.array(drafted), choice)
            kept, tried = kept + n, tried + k
            seq += [*drafted[:n], nxt]
        out[s] = seq[1 : TOKENS + 1]
    return out, kept / tried


def test_coupled_sampling_draws_from_the_target_exactly_and_keeps_draft_tokens() -> None:
    samples, kept = _coupled(3)
    assert _chi_square_p(samples) > 1e-3
    # the draft is another random chain: agreement is what the coupling buys (independent
    # noise would agree on sum_x p(x) q(x) only)
    chance = float(np.mean([TARGET[t] @ DRAFT[t] for t in range(V)]))
    assert kept > chance + 0.1


def test_coupled_sampling_with_noise_shared_across_positions_fails_the_same_test() -> None:
    """The noise must be fresh per position: reusing one draw for every position biases the text."""
    samples, _ = _coupled(3, shared=True)
    assert _chi_square_p(samples) < 1e-6


def test_gumbel_noise_of_a_position_does_not_depend_on_the_order_asked() -> None:
    ahead, in_order = GumbelNoise(7, V, start=3, block=2), GumbelNoise(7, V, start=3, block=2)
    late = ahead(9).copy()
    assert np.array_equal([in_order(p) for p in range(3, 10)][-1], late) and not np.array_equal(ahead(3), late)
    assert not np.array_equal(GumbelNoise(8, V, start=3)(3), in_order(3))
    with pytest.raises(ValueError, match="before the first"):
        ahead(2)


def test_a_broken_rule_fails_the_same_test() -> None:
    def resample_from_p(draft: np.ndarray, q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> tuple[int, int]:
        # a classic mistake: on rejection, sample from the target's p instead of norm(max(0, p - q))
        for i, token in enumerate(draft):
            if rng.random() >= min(1.0, p[i, token] / q[i, token]):
                return i, int(rng.choice(V, p=p[i]))
        return len(draft), int(rng.choice(V, p=p[-1]))

    assert _chi_square_p(_speculative(resample_from_p, 3, seed=3)) < 1e-6


def test_a_perfect_draft_is_always_kept() -> None:
    rng = np.random.default_rng(0)
    p = TARGET[[0, 3, 5, 1]]
    assert accept_sampling(np.array([3, 5, 1]), p[:3], p, rng)[0] == 3


def test_greedy_tree_follows_the_targets_argmax() -> None:
    #        0
    #      /   \
    #   1:5     2:6
    #   |  \     |
    #  3:7 4:8  5:9
    parents, tokens = np.array([-1, 0, 0, 1, 1, 2]), np.array([0, 5, 6, 7, 8, 9])
    assert accept_tree_greedy(parents, tokens, np.array([6, 0, 9, 0, 0, 4])) == ([2, 5], 4)
    assert accept_tree_greedy(parents, tokens, np.array([5, 8, 0, 0, 3, 0])) == ([1, 4], 3)
    assert accept_tree_greedy(parents, tokens, np.array([1, 0, 0, 0, 0, 0])) == ([], 1)
    with pytest.raises(ValueError, match="parents must come before"):
        accept_tree_greedy(np.array([-1, 2, 0]), np.array([0, 1, 2]), np.array([1, 1, 1]))


def _tree_rule(rule: Callable[..., tuple[list[int], int]], branch: int, depth: int, seed: int) -> np.ndarray:
    """SAMPLES sequences of TOKENS tokens after token 0, drafted as trees (``branch`` i.i.d. draws
    from DRAFT per expanded node, only each node's first child expanded further)."""
    rng = np.random.default_rng(seed)
    out = np.empty((SAMPLES, TOKENS), dtype=np.int64)
    for s in range(SAMPLES):
        seq = [0]
        while len(seq) <= TOKENS:
            parents, tokens, candidates, q = [-1], [seq[-1]], [[]], {}
            node = 0
            for _ in range(depth):
                draws = [int(x) for x in rng.choice(V, size=branch, p=DRAFT[tokens[node]])]
                candidates[node], q[node] = draws, DRAFT[tokens[node]]
                first = None
                for token in dict.fromkeys(draws):
                    parents.append(node)
                    tokens.append(token)
                    candidates.append([])
                    first = first or len(tokens) - 1
                node = first
            path, nxt = rule(np.array(parents), np.array(tokens), candidates, q, TARGET[tokens], rng)
            seq += [*(tokens[i] for i in path), nxt]
        out[s] = seq[1 : TOKENS + 1]
    return out


def test_tree_sampling_draws_from_the_target_exactly() -> None:
    assert _chi_square_p(_tree_rule(accept_tree_sampling, branch=3, depth=2, seed=11)) > 1e-3


def test_a_tree_rule_without_the_residual_update_fails_the_same_test() -> None:
    def no_update(parents: np.ndarray, tokens: np.ndarray, candidates: list[list[int]], q: dict[int, np.ndarray],
                  p: np.ndarray, rng: np.random.Generator) -> tuple[list[int], int]:
        # a plausible mistake: try every candidate against the unchanged p, then sample the residual once
        path, node = [], 0
        while True:
            kids = {int(tokens[i]): i for i in range(len(parents)) if parents[i] == node and i}
            for token in candidates[node]:
                if rng.random() < min(1.0, p[node, token] / q[node][token]):
                    node = kids[token]
                    path.append(node)
                    break
            else:
                residual = np.maximum(p[node] - q[node], 0) if candidates[node] else p[node]
                return path, int(rng.choice(V, p=residual / residual.sum()))

    assert _chi_square_p(_tree_rule(no_update, branch=3, depth=2, seed=12)) < 1e-6


def test_a_chain_tree_draws_what_chain_sampling_draws() -> None:
    rng = np.random.default_rng(5)
    for trial in range(200):
        k = int(rng.integers(0, 5))
        draft = rng.integers(0, V, k)
        q = _chain(100 + trial, 0.5)[:k]
        q[np.arange(k), draft] += 0.05
        q /= q.sum(-1, keepdims=True)
        p = _chain(200 + trial, 0.5)[: k + 1]
        parents, tokens = np.arange(-1, k), np.array([0, *draft])
        candidates = [[int(t)] for t in draft] + [[]]
        seed = int(rng.integers(1 << 30))
        n, token = accept_sampling(draft, q, p, np.random.default_rng(seed))
        path, tree_token = accept_tree_sampling(parents, tokens, candidates, dict(enumerate(q)), p, np.random.default_rng(seed))
        assert (path, tree_token) == (list(range(1, n + 1)), token)
