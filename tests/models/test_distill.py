"""MDSLR's selection, logit reshaping and KD loss against their definitions, computed independently."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.distill import class_logit_std, difficulty, kd_loss, reshape_logits, select


def _ranked(n_per_class: int, n_classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Logits whose teacher loss ranks each class's examples in a known order: (logits, y, rank)."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(n_classes), n_per_class)
    rank = np.concatenate([rng.permutation(n_per_class) for _ in range(n_classes)])
    logits = np.zeros((len(y), n_classes), np.float32)
    logits[np.arange(len(y)), y] = 5.0 - rank  # a lower margin for a higher rank: a larger loss
    rng.shuffle(order := np.arange(len(y)))
    return logits[order], y[order], rank[order]


def test_mdslr_keeps_the_medium_examples_of_every_class() -> None:
    logits, y, rank = _ranked(10, 3)
    loss = difficulty(logits, y)
    for c in range(3):  # the oracle: the loss grows with the rank
        members = np.flatnonzero(y == c)
        assert np.all(np.diff(loss[members][np.argsort(rank[members])]) > 0)
    # floor(30 / 3 * 0.5) = 5 per class: 2 from the median (rank 5) up, 3 below it (the odd one below)
    keep = select("mdslr", logits, y, ratio=0.5)
    assert sorted(rank[keep].tolist()) == sorted([2, 3, 4, 5, 6] * 3)
    assert np.bincount(y[keep]).tolist() == [5, 5, 5]
    assert sorted(rank[select("hard", logits, y, 0.3)].tolist()) == sorted([7, 8, 9] * 3)
    assert sorted(rank[select("easy", logits, y, 0.3)].tolist()) == sorted([0, 1, 2] * 3)
    r1, r2 = select("random", logits, y, 0.3, seed=1), select("random", logits, y, 0.3, seed=1)
    assert np.array_equal(r1, r2) and np.bincount(y[r1]).tolist() == [3, 3, 3]
    assert len(select("full", logits, y, 0.3)) == 30
    with pytest.raises(ValueError, match="keep ratio"):
        select("mdslr", logits, y, 0.0)


def test_logit_reshaping_gives_each_example_its_class_spread() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(40, 4)).astype(np.float32) * rng.uniform(0.5, 3, size=(40, 1)).astype(np.float32)
    y = rng.integers(0, 4, 40)
    class_std = class_logit_std(logits, y, 4)
    want = [np.std(logits[y == c], axis=1, ddof=1).mean() for c in range(4)]
    np.testing.assert_allclose(class_std, want, rtol=1e-6)
    t = torch.from_numpy(logits)
    shaped = reshape_logits(t, torch.from_numpy(y), torch.from_numpy(class_std).float())
    np.testing.assert_allclose(shaped.std(dim=1).numpy(), class_std[y], rtol=1e-5)
    assert torch.equal(shaped.argsort(dim=1), t.argsort(dim=1))  # only the scale changes


def test_the_kd_loss_is_the_formula() -> None:
    rng = np.random.default_rng(1)
    s, t = rng.normal(size=(8, 5)), rng.normal(size=(8, 5))
    y = rng.integers(0, 5, 8)
    temp, alpha, gamma = 3.0, 0.7, 0.3

    def softmax(z: np.ndarray) -> np.ndarray:
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    p_t, p_s = softmax(t / temp), softmax(s / temp)
    kl = np.sum(p_t * (np.log(p_t) - np.log(p_s))) / len(s)
    ce = -np.mean(np.log(softmax(s)[np.arange(8), y]))
    got = kd_loss(torch.from_numpy(s), torch.from_numpy(t), torch.from_numpy(y), temp, alpha, gamma)
    assert got.item() == pytest.approx(gamma * ce + alpha * temp**2 * kl, rel=1e-9)

