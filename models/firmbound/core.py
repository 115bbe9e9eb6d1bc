"""FIRMBOUND (Ebihara et al., ICLR 2025): stop sensing as soon as the decision is safe.

A finite-horizon sequential test, learned from data in two parts:

1. **Density-ratio estimation** (SPRT-TANDEM, Markov order 0 on stacked frames): a small network
   maps each new frame (the last ``context`` samples, causal) to class logits; their running sum
   A_t gives the log-likelihood ratios of every class pair, λ_kl(X_1:t) = A_t,k − A_t,l, and the
   posterior π_t = softmax(A_t) under a flat prior. Trained with LSEL (the log-sum-exp loss,
   log Σ_l exp(−λ_yl) at every t) plus the LLLR term (mean |1[y = k] − σ(λ_kl)|).
2. **Backward induction** of the Bayes risk R = L·1[wrong] + c·τ: the stopping risk
   G_st(π) = L·(1 − max_k π_k); G_T = G_st; G_t = min(G_st, c + Ê[G_t+1 | π_t]), where Ê is a
   regression of the realized G_t+1 of the training sequences on π_t, one per time step:
   ``cfl`` (convex function learning: G is concave in π, so a max-affine convex function is
   fitted to −G, by Magnani and Boyd's partition-and-least-squares heuristic) or ``gp``
   (gpytorch's sparse variational GP on inducing points). The rule stops at the first t with
   G_st(π_t) ≤ c + Ê_t(π_t), and at T at the latest.

``gaussian_sequences``
makes the paper's synthetic task, whose true LLR is known; for two classes
``exact_backward_induction`` solves the optimal stopping problem on a grid of the true LLR (the
oracle the learned rule is measured against).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from edge.core.errors import ConfigError

LOSS_L = 10.0  # the misclassification loss L (the paper's PENALTY_L)


# ---- data ---------------------------------------------------------------------------------------


def gaussian_sequences(n: int, n_classes: int = 2, dim: int = 16, length: int = 30, offset: float = 0.5,
                       seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The paper's synthetic task: frames i.i.d. N(offset·e_k, I) for class k. Returns X (n, dim,
    length) float32, y (n,), and the true accumulated log-likelihoods A (n, length, classes), whose
    differences are the true LLRs."""
    if not 2 <= n_classes <= dim:
        raise ConfigError("n_classes", n_classes, f"must be between 2 and dim ({dim})")
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, n)
    means = offset * np.eye(n_classes, dim)
    x = rng.standard_normal((n, length, dim)) + means[y][:, None, :]
    # log N(x; mu_k, I) up to a constant shared by the classes: mu_k.x - |mu_k|^2 / 2
    frame = x @ means.T - 0.5 * (means**2).sum(1)
    return np.ascontiguousarray(x.transpose(0, 2, 1), dtype=np.float32), y, np.cumsum(frame, axis=1)


# ---- density-ratio estimation -------------------------------------------------------------------


def stack_frames(x: np.ndarray, context: int) -> np.ndarray:
    """(n, channels, T) -> (n, T, channels·context): at each t the last ``context`` samples, zeros before 0."""
    n, c, t = x.shape
    padded = np.concatenate([np.zeros((n, c, context - 1), x.dtype), x], axis=2)
    frames = np.stack([padded[:, :, k : k + t] for k in range(context)], axis=-1)  # (n, c, T, context)
    return np.ascontiguousarray(frames.transpose(0, 2, 1, 3).reshape(n, t, c * context))


class FrameNet(nn.Module):
    """Per-frame class logits; their running sum over time is A_t."""

    def __init__(self, n_in: int, n_classes: int, hidden: int) -> None:
        super().__init__()
        self.net = (nn.Linear(n_in, n_classes) if hidden == 0 else
                    nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_classes)))

    def forward(self, frames: torch.Tensor) -> torch.Tensor:  # (n, T, n_in) -> A (n, T, classes)
        return torch.cumsum(self.net(frames), dim=1)


def tandem_loss(acc: torch.Tensor, y: torch.Tensor, lllr_weight: float = 0.1) -> torch.Tensor:
    """LSEL over every time step plus ``lllr_weight`` x LLLR."""
    n, t, k = acc.shape
    lsel = nn.functional.cross_entropy(acc.reshape(n * t, k), y.repeat_interleave(t))  # = log sum_l exp(-llr_yl)
    llr = acc[..., :, None] - acc[..., None, :]  # (n, T, K, K): llr[k, l] = A_k - A_l
    target = nn.functional.one_hot(y, k).to(acc.dtype)[:, None, :, None]
    lllr = (target - torch.sigmoid(llr)).abs().mean() * k / max(k - 1, 1) * 0.5
    return lsel + lllr_weight * lllr


@dataclass
class DensityRatio:
    """The trained density-ratio estimator and what the device needs to run it."""

    net: FrameNet
    context: int
    mean: np.ndarray  # per-channel standardization
    std: np.ndarray
    classes: np.ndarray
    train_seconds: float = 0.0

    def accumulated(self, x: np.ndarray) -> np.ndarray:
        """A (n, T, classes): the running sums of the frame logits for series X (n, channels, T)."""
        z = ((x.astype(np.float32) - self.mean[None, :, None]) / self.std[None, :, None]).astype(np.float32)
        with torch.no_grad():
            return self.net(torch.from_numpy(stack_frames(z, self.context))).numpy().astype(np.float64)


def fit_density_ratio(x: np.ndarray, y: np.ndarray, context: int = 1, hidden: int = 32, epochs: int = 60,
                      batch_size: int = 64, lr: float = 3e-3, seed: int = 0,
                      progress: Callable[[str, int, int], None] | None = None) -> DensityRatio:
    """Train the SPRT-TANDEM estimator on series X (n, channels, T) with labels y;
    ``progress("epochs", done, epochs)`` after each epoch."""
    torch.manual_seed(seed)
    classes, y_idx = np.unique(y, return_inverse=True)
    x = np.asarray(x, dtype=np.float32)  # float32 throughout, as on the device (edge.classify.preprocess)
    mean = x.mean(axis=(0, 2), dtype=np.float64).astype(np.float32)
    std = (x.std(axis=(0, 2), dtype=np.float64) + 1e-6).astype(np.float32)
    z = ((x - mean[None, :, None]) / std[None, :, None]).astype(np.float32)
    frames = torch.from_numpy(stack_frames(z, context))
    target = torch.from_numpy(y_idx.astype(np.int64))
    net = FrameNet(frames.shape[2], len(classes), hidden)
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=1e-4)
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for epoch in range(epochs):
        for idx in torch.randperm(len(frames), generator=gen).split(batch_size):
            opt.zero_grad()
            tandem_loss(net(frames[idx]), target[idx]).backward()
            opt.step()
        if progress is not None:
            progress("epochs", epoch + 1, epochs)
    net.eval()
    return DensityRatio(net, context, mean, std, classes, time.perf_counter() - start)


def posteriors(acc: np.ndarray) -> np.ndarray:
    """π = softmax(A) along the last axis (a flat prior)."""
    z = acc - acc.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def stopping_risk(pi: np.ndarray, loss: float = LOSS_L) -> np.ndarray:
    return loss * (1.0 - pi.max(axis=-1))


# ---- regressions of the continuation value ------------------------------------------------------


@dataclass
class MaxAffine:
    """Convex max-affine regression f(s) = max_i (a_i·s + b_i), by Magnani and Boyd's heuristic:
    partition the points by their active piece, refit each piece by least squares, repeat. A piece
    whose least-squares slopes exceed ``max_slope`` is refitted with a small ridge on the slopes
    (``ridge`` × its points): posteriors crowd at the simplex's corners, where a piece's points
    barely vary in some direction, and the plain fit there puts slopes of 1e11 in it that no
    fixed-point device could hold (and that predict nothing off the data). Well-posed pieces keep
    the plain fit: even a tiny ridge everywhere moves the partition, and the synthetic task's
    Bayes risk with it (1.039 → 1.081 of the optimum at 1e-6)."""

    pieces: int = 12
    iterations: int = 30
    seed: int = 0
    ridge: float = 1e-6
    max_slope: float = 1e3
    slopes: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    intercepts: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def fit(self, s: np.ndarray, target: np.ndarray) -> MaxAffine:
        n, d = s.shape
        design = np.hstack([s, np.ones((n, 1))])
        rng = np.random.default_rng(self.seed)
        centers = s[rng.choice(n, min(self.pieces, n), replace=False)]
        part = ((s[:, None, :] - centers[None]) ** 2).sum(-1).argmin(1)
        coef = np.zeros((len(centers), d + 1))
        for _ in range(self.iterations):
            for i in range(len(centers)):
                rows = part == i
                if rows.sum() > d:
                    coef[i] = np.linalg.lstsq(design[rows], target[rows], rcond=None)[0]
                    if np.abs(coef[i, :d]).max() > self.max_slope:
                        penalty = np.sqrt(self.ridge * rows.sum()) * np.eye(d, d + 1)  # slopes only
                        coef[i] = np.linalg.lstsq(np.vstack([design[rows], penalty]),
                                                  np.r_[target[rows], np.zeros(d)], rcond=None)[0]
                elif rows.any():
                    coef[i] = np.r_[np.zeros(d), target[rows].mean()]
                else:
                    coef[i] = np.r_[np.zeros(d), -np.inf]  # an empty piece drops out
            new = (design @ coef.T).argmax(1)
            if np.array_equal(new, part):
                break
            part = new
        keep = np.isfinite(coef[:, -1])
        self.slopes, self.intercepts = coef[keep, :d], coef[keep, d]
        return self

    def predict(self, s: np.ndarray) -> np.ndarray:
        return np.asarray((s @ self.slopes.T + self.intercepts).max(axis=1))


class ConvexContinuation:
    """CFL: Ê[G_t+1 | π_t] as the negative of a max-affine convex fit to −G_t+1 (G is concave)."""

    def __init__(self, pieces: int = 12, seed: int = 0) -> None:
        self.model = MaxAffine(pieces=pieces, seed=seed)

    def fit(self, s: np.ndarray, target: np.ndarray) -> ConvexContinuation:
        self.model.fit(s, -target)
        return self

    def predict(self, s: np.ndarray) -> np.ndarray:
        return -self.model.predict(s)


class GPContinuation:
    """Ê[G_t+1 | π_t] by gpytorch's sparse variational GP (RBF kernel, learned inducing points)."""

    def __init__(self, inducing: int = 64, epochs: int = 30, seed: int = 0) -> None:
        self.inducing, self.epochs, self.seed = inducing, epochs, seed

    def fit(self, s: np.ndarray, target: np.ndarray) -> GPContinuation:
        import gpytorch

        torch.manual_seed(self.seed)
        xs = torch.from_numpy(s.astype(np.float32))
        ys = torch.from_numpy(target.astype(np.float32))
        self.offset, self.scale = float(ys.mean()), float(ys.std()) + 1e-6
        ys = (ys - self.offset) / self.scale
        points = xs[torch.randperm(len(xs), generator=torch.Generator().manual_seed(self.seed))[: self.inducing]].clone()

        class Model(gpytorch.models.ApproximateGP):
            def __init__(self) -> None:
                dist = gpytorch.variational.CholeskyVariationalDistribution(len(points))
                super().__init__(gpytorch.variational.VariationalStrategy(self, points, dist,
                                                                          learn_inducing_locations=True))
                self.mean_module = gpytorch.means.ConstantMean()
                self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

            def forward(self, x: torch.Tensor) -> Any:
                return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

        self.model, self.likelihood = Model(), gpytorch.likelihoods.GaussianLikelihood()
        self.model.train()
        self.likelihood.train()
        opt = torch.optim.Adam([*self.model.parameters(), *self.likelihood.parameters()], lr=0.05)
        mll = gpytorch.mlls.VariationalELBO(self.likelihood, self.model, num_data=len(ys))
        for _ in range(self.epochs):
            for idx in torch.randperm(len(xs), generator=torch.Generator().manual_seed(self.seed)).split(512):
                opt.zero_grad()
                (-mll(self.model(xs[idx]), ys[idx])).backward()
                opt.step()
        self.model.eval()
        self.likelihood.eval()
        return self

    def predict(self, s: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            mean = self.model(torch.from_numpy(s.astype(np.float32))).mean.numpy()
        return np.asarray(mean * self.scale + self.offset, dtype=np.float64)


# ---- backward induction and the stopping rule ---------------------------------------------------


@dataclass
class StoppingRule:
    """Per decision point i but the last: a regression of the continuation value; stop at the
    first i with G_st(π_i) <= c·Δ_i + Ê_i(π_i) (at the last point at the latest). Δ_i: the samples
    from point i to the next (1 when the rule decides at every sample). ``symmetric``: the
    regressions read the posterior sorted in decreasing order (the risk of a posterior does not
    depend on which class leads, so the classes pool their data)."""

    cost: float
    loss: float
    continuation: list[Any]  # length: decision points − 1
    train_seconds: float = 0.0
    steps: np.ndarray | None = None  # (points − 1,) samples between points; None: 1 each
    symmetric: bool = False

    def continue_risk(self, t: int, pi: np.ndarray) -> np.ndarray:
        """c·Δ_t + Ê[G_t+1 | π_t], the estimate held within [0, L] where the risk lives."""
        step = 1.0 if self.steps is None else float(self.steps[t])
        s = np.sort(pi, axis=-1)[..., ::-1] if self.symmetric else pi
        return np.asarray(self.cost * step + np.clip(self.continuation[t].predict(s), 0.0, self.loss))

    def hitting_times(self, pi: np.ndarray) -> np.ndarray:
        """τ (1..points, an index of decision points) of posteriors π (n, t, K) at the first t
        points; 0 where fewer points than all are given and the series is still open (at the last
        point every series stops)."""
        n, t_max, _ = pi.shape
        horizon = len(self.continuation) + 1
        tau = np.zeros(n, int)
        for t in range(min(t_max, horizon - 1)):
            stop = (tau == 0) & (stopping_risk(pi[:, t], self.loss) <= self.continue_risk(t, pi[:, t]))
            tau[stop] = t + 1
        if t_max == horizon:
            tau[tau == 0] = horizon
        return tau

    def decide(self, pi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(hitting time τ in 1..points, predicted class index) of posteriors π (n, points, K)."""
        tau = self.hitting_times(pi)
        return tau, pi[np.arange(len(pi)), tau - 1].argmax(1)


def backward_induction(pi: np.ndarray, cost: float, method: str = "cfl", loss: float = LOSS_L,
                       seed: int = 0, steps: np.ndarray | None = None, symmetric: bool = False) -> StoppingRule:
    """Learn the finite-horizon rule from training posteriors π (n, points, K); ``steps``: the
    samples between consecutive points (default 1: a point per sample)."""
    if method not in ("cfl", "gp"):
        raise ConfigError("method", method, "must be cfl or gp")
    if cost <= 0:
        raise ConfigError("cost", cost, "the sampling cost must be positive")
    t_max = pi.shape[1]
    if steps is not None and (len(steps) != t_max - 1 or np.any(np.asarray(steps) <= 0)):
        raise ConfigError("steps", list(np.asarray(steps)), f"must be {t_max - 1} positive sample counts")
    start = time.perf_counter()
    s = np.sort(pi, axis=-1)[..., ::-1] if symmetric else pi
    g = stopping_risk(pi[:, -1], loss)
    models: list[Any] = [None] * (t_max - 1)
    for t in range(t_max - 2, -1, -1):
        model = ConvexContinuation(seed=seed) if method == "cfl" else GPContinuation(seed=seed)
        models[t] = model.fit(s[:, t], g)
        step = 1.0 if steps is None else float(steps[t])
        g = np.minimum(stopping_risk(pi[:, t], loss), cost * step + np.clip(model.predict(s[:, t]), 0.0, loss))
    return StoppingRule(cost, loss, models, time.perf_counter() - start,
                        None if steps is None else np.asarray(steps, np.float64), symmetric)


def bayes_risk(tau: np.ndarray, correct: np.ndarray, cost: float, loss: float = LOSS_L) -> float:
    """L x error rate + c x mean hitting time."""
    return float(loss * (1.0 - correct.mean()) + cost * tau.mean())


# ---- the oracle: exact backward induction with the true LLR (two Gaussian classes) --------------


@dataclass
class ExactRule:
    """The Bayes-optimal stopping rule of a Gaussian two-class task by backward induction on an LLR
    grid: the oracle FIRMBOUND is held against."""

    grid: np.ndarray  # LLR values λ = log p(X|0)/p(X|1)
    stop: np.ndarray  # (T, grid): G_st
    value: np.ndarray  # (T, grid): G_t
    cont: np.ndarray  # (T - 1, grid): c + E[G_t+1 | λ_t]
    risk: float  # the optimal Bayes risk, c + E[G_1]

    def decide(self, llr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(τ, predicted class) of true LLR trajectories (n, T)."""
        n, t_max = llr.shape
        tau = np.full(n, t_max)
        open_ = np.ones(n, bool)
        for t in range(t_max - 1):
            g_st = np.interp(llr[:, t], self.grid, self.stop[t])
            stop = open_ & (g_st <= np.interp(llr[:, t], self.grid, self.cont[t]))
            tau[stop] = t + 1
            open_ &= ~stop
        return tau, (llr[np.arange(n), tau - 1] < 0).astype(int)


def exact_backward_induction(offset: float, length: int, cost: float, loss: float = LOSS_L,
                             half_width: float = 40.0, points: int = 8001) -> ExactRule:
    """The Bayes-optimal finite-horizon rule of the two-class Gaussian task, by backward induction on
    a grid of the true LLR: its increment is N(+m, 2m) under class 0 and N(−m, 2m) under class 1,
    m = |μ0 − μ1|² / 2 = offset², mixed by the posterior σ(λ); expectations by Gauss–Hermite."""
    m, sd = offset**2, math.sqrt(2) * offset
    grid = np.linspace(-half_width, half_width, points)
    p0 = 1 / (1 + np.exp(-grid))
    g_st = loss * np.minimum(p0, 1 - p0)
    nodes, weights = np.polynomial.hermite_e.hermegauss(64)  # E[f(Z)], Z ~ N(0, 1)
    weights = weights / weights.sum()

    def expect(g: np.ndarray, at: np.ndarray, prob0: np.ndarray) -> np.ndarray:
        up = np.interp(at[:, None] + m + sd * nodes[None], grid, g) @ weights
        down = np.interp(at[:, None] - m + sd * nodes[None], grid, g) @ weights
        return np.asarray(prob0 * up + (1 - prob0) * down)

    value = np.empty((length, points))
    cont = np.empty((length - 1, points))
    value[-1] = g_st
    for t in range(length - 2, -1, -1):
        cont[t] = cost + expect(value[t + 1], grid, p0)
        value[t] = np.minimum(g_st, cont[t])
    risk = cost + float(expect(value[0], np.zeros(1), np.full(1, 0.5))[0])  # the first sample is always taken
    return ExactRule(grid, np.tile(g_st, (length, 1)), value, cont, risk)
