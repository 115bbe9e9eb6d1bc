"""NExUME training for intermittently powered nodes (ICLR 2025): train for the node it will run on.

The default ``deployment`` schedule (issue 30): DynInfer on the device runs the most accurate
(bit-width, dropout) variant the stored energy affords, so the simulator runs the user's scenario
(``harvest_scenario``) with the network's variants first (``models.nexume.deployment``) and
counts how often each runs; training draws each step's (q, d) from those shares, with
``full_share`` of the steps at full width (8 bit, no dropout) so the network stays strong where
energy is plenty, and ``spread`` of the others evenly over every (q, d) the node runs at all;
with ``distill`` the cheaper configurations also match the full network's most recent outputs
on the same examples (in-place distillation, as slimmable networks train; no extra forward).
On continuous power every inference affords the full network and training is 8-bit QAT.
(Measured against the uniform schedule and the λ-search, per part, in ``docs/results/nexume.md``.)

The ``search`` schedule, the paper's DynFit: at every iteration the energy at hand E_b is drawn
from a simulated node living on a real harvest trace; then (NExUME §3.2) the bit-width q and
the structured dropout d the step trains are chosen to minimise

    L(q, d) = CE(q, d) + λ1 · Σ_j c_q(q_j) + λ2 · Σ_i c_d(d_i)   subject to  E(q, d) <= E_b

where c_q is a layer's energy at precision q relative to 8 bit (the shared cost model of
simulator.devices), c_d(d) = d, and E(q, d) one inference's energy on the MCU; the budget runs
from the cheapest configuration's (E_b = 0) to the full network's (E_b = E_max) in proportion.
The search is discrete over the deployable (q, d), with CE(q, d) a running mean of the task loss
seen at each (``ConfigSearch``): every affordable configuration is tried once, every
configuration's loss is measured again on a batch at the start of each epoch, and one is drawn
with probability ∝ exp(−L / τ). So λ decides which configurations the weights are trained for
(raising λ1 trains the cheap ones more), not only the loss value. (The paper updates per-layer
dropout rates by projected gradient steps; here dropout levels are the deployable variants' and
are searched like the bit-widths.)

Both schedules keep per-weight update counts; with ``finetune_epochs`` (off by default, measured)
the rarely updated weights are fine-tuned after the main phase, dropout and quantization off.

Methods (the baselines of the evaluation use the same network and loop):
``nexume`` as above (either schedule); ``uniform``: q and d drawn uniformly, energy-unaware (the ablation);
``qat8``: fixed 8-bit QAT, no dropout; ``fp32``: float training (quantized after training).

    trickle train nexume --dataset digits --epochs 20 --out runs/train/digits
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from edge.core.errors import ConfigError
from models.data.base import Dataset
from models.nexume.config import TrainConfig
from models.nexume.switchable import FLOAT_BITS, SUPPORTED_BITS, SwitchableNet, arch_for
from simulator.devices import MCUS, PRECISION_CYCLE_FACTOR

if TYPE_CHECKING:
    from models.nexume.parallel import DataParallel
    from simulator.config import Scenario

DROP_LEVELS = (0.0, 0.25, 0.5)  # the dropout levels a device can choose among (variants)


# ---- the schedule (NExUME §3.2) -----------------------------------------------------------


def precision_cost(bits: int) -> float:
    """c_q: a MAC's energy at ``bits`` relative to 8 bit (float training counts as 8 bit)."""
    return PRECISION_CYCLE_FACTOR[8 if bits == FLOAT_BITS else bits]


# ---- energy draws from a simulated node -----------------------------------------------------


@dataclass(frozen=True)
class EnergySampler:
    """Usable stored energy of a simulated node at random on-times, time-weighted."""

    energies_j: np.ndarray
    energy_max_j: float

    @classmethod
    def from_scenario(cls, scenario_name: str, n_draws: int = 100_000, seed: int = 0) -> EnergySampler:
        from simulator.config import load_scenario, scenario_path
        from simulator.fleet import simulate
        from simulator.node import Mode

        sc = load_scenario(scenario_path(scenario_name), nodes={"count": 1, "record_traces": 1}, run={"workers": 1})
        trace = simulate(sc).nodes[0].trace
        assert trace is not None
        t = np.append(np.asarray(trace["time_s"]), sc.run.duration_s)
        v = np.asarray(trace["voltage_v"])
        on = np.asarray(trace["mode"]) != Mode.OFF
        dwell = np.diff(t) * on
        if dwell.sum() <= 0:
            raise ConfigError("harvest_scenario", scenario_name, "the simulated node is never on: no energy to train with")
        st = sc.storage
        v_cut = st.cut_off_v(sc.workload.mcu_profile)
        rng = np.random.default_rng(seed)
        idx = rng.choice(len(dwell), size=n_draws, p=dwell / dwell.sum())
        energies = 0.5 * st.capacitance_f * np.clip(v[idx] ** 2 - v_cut**2, 0.0, None)
        return cls(energies, 0.5 * st.capacitance_f * (st.v_max_v**2 - v_cut**2))

    def draw(self, i: int) -> float:
        return float(self.energies_j[i % len(self.energies_j)])


# ---- training -----------------------------------------------------------------------------


@dataclass
class TrainResult:
    """A training run: the network, its per-epoch history, each deployable variant's accuracy and
    energy, and the seconds it took."""

    config: TrainConfig
    model: SwitchableNet
    train_time_s: float
    history: list[dict[str, float]] = field(default_factory=list)
    variants: list[dict[str, float]] = field(default_factory=list)
    schedule_mix: dict[tuple[int, float], float] | None = None  # nexume's deployment schedule: (q, d) -> share


@dataclass
class ConfigSearch:
    """DynFit's per-step choice of (bits, drop): the least λ-penalised running task loss among the
    configurations the energy at hand affords (module docstring)."""

    energy_j: dict[tuple[int, float], float]  # one inference of each deployable configuration
    lambda_q: float
    lambda_d: float
    n_layers: int
    temperature: float
    loss: dict[tuple[int, float], float] = field(default_factory=dict)

    @classmethod
    def for_model(cls, model: Any, cfg: TrainConfig) -> ConfigSearch:
        grid = [(b, d) for b in SUPPORTED_BITS for d in drop_levels(model) if d <= cfg.d_max
                and cfg.q_min <= b <= cfg.q_max]
        energy = {g: variant_energy_j(model, g[0], g[1], cfg.mcu) for g in grid}
        return cls(energy, cfg.lambda_q, cfg.lambda_d, len(trained_weights(model)) // 2, cfg.search_temperature)

    def penalty(self, g: tuple[int, float]) -> float:
        return self.n_layers * (self.lambda_q * precision_cost(g[0]) + self.lambda_d * g[1])

    def choose(self, fraction: float, rng: np.random.Generator) -> tuple[int, float]:
        """The configuration to train when the energy at hand is ``fraction`` = E_b / E_max."""
        low, high = min(self.energy_j.values()), max(self.energy_j.values())
        cap = low + min(max(fraction, 0.0), 1.0) * (high - low)  # E_b = 0 affords the cheapest, E_max everything
        cheapest = min(self.energy_j.items(), key=lambda item: item[1])[0]
        feasible = sorted(g for g, e in self.energy_j.items() if e <= cap) or [cheapest]
        unseen = [g for g in feasible if g not in self.loss]
        if unseen:
            return unseen[int(rng.integers(len(unseen)))]
        score = np.array([self.loss[g] + self.penalty(g) for g in feasible])
        p = np.exp(-(score - score.min()) / self.temperature)
        return feasible[int(rng.choice(len(feasible), p=p / p.sum()))]

    def update(self, g: tuple[int, float], task_loss: float) -> None:
        self.loss[g] = task_loss if g not in self.loss else 0.9 * self.loss[g] + 0.1 * task_loss

    @torch.no_grad()
    def refresh(self, model: Any, x: torch.Tensor, y: torch.Tensor) -> None:
        """Every configuration's task loss on one batch: estimates of configurations the search has
        not trained lately would otherwise go stale and never be chosen again."""
        training, bits, drop = model.training, model.bits, model.drop
        model.eval()
        for g in self.energy_j:
            self.loss[g] = float(F.cross_entropy(model.configure(*g)(x), y))
        model.configure(bits, drop).train(training)


def _schedule(cfg: TrainConfig, sampler: EnergySampler | None, search: ConfigSearch | None, rng: np.random.Generator,
              step: int, mix: dict[tuple[int, float], float] | None = None) -> tuple[int, float]:
    if mix is not None:  # the deployment schedule
        if rng.random() < cfg.full_share:
            return cfg.q_max, 0.0
        configs = list(mix)
        share = np.array([mix[g] for g in configs])
        if rng.random() < cfg.spread:
            share = np.ones(len(configs)) / len(configs)
        return configs[int(rng.choice(len(configs), p=share))]
    if cfg.method == "qat8":
        return 8, 0.0
    if cfg.method == "fp32":
        return FLOAT_BITS, 0.0
    if cfg.method == "uniform":
        return int(rng.choice(SUPPORTED_BITS)), float(rng.uniform(0.0, cfg.d_max))
    assert sampler is not None and search is not None
    return search.choose(sampler.draw(step) / sampler.energy_max_j, rng)


def deployment_schedule(cfg: TrainConfig, model: Any, scenario: Scenario | None = None) -> dict[tuple[int, float], float]:
    """The share of inferences DynInfer runs with each deployable (q, d) on ``scenario`` (default: the
    config's ``harvest_scenario``, one worker, no traces)."""
    from models.nexume.deployment import deployment_mix
    from simulator.config import load_scenario, scenario_path

    if scenario is None:
        scenario = load_scenario(scenario_path(cfg.harvest_scenario), run={"workers": 1}, nodes={"record_traces": 0})
    grid = [(b, d) for b in reversed(SUPPORTED_BITS) for d in drop_levels(model)
            if d <= cfg.d_max and cfg.q_min <= b <= cfg.q_max]
    return deployment_mix(model, scenario, grid)


def build_model(cfg: TrainConfig, data: Dataset) -> Any:
    """The network ``cfg`` trains: the built-in CNN, or the user's module (``cfg.model``) made switchable."""
    if cfg.model is None:
        return SwitchableNet(arch_for(data.name, data.input_shape, data.n_classes))
    from models.nexume.custom import build, switchable

    return switchable(build(cfg.model, data.input_shape, data.n_classes), data.input_shape, cfg.model)


def train(cfg: TrainConfig, data: Dataset, progress: Callable[[int, int, dict[str, float]], None] | None = None,
          model: Any = None, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
          subset: np.ndarray | None = None, parallel: DataParallel | None = None,
          deployment: Scenario | None = None) -> TrainResult:
    """Train ``cfg.method`` on ``data``; ``progress(epoch, epochs, metrics)`` after each epoch. ``model``
    (a ``models.nexume.custom.UserNet``) replaces the network ``cfg`` names. ``loss_fn(logits, batch
    indices)`` replaces the cross-entropy (knowledge distillation, ``models.distill``); ``subset``:
    the training examples to use (a pruned set). ``parallel``: this process's place among torchrun's
    ranks (``models.nexume.parallel``): each takes its share of every batch and they step together.
    ``deployment``: the scenario the nexume deployment schedule simulates (default: ``cfg.harvest_scenario``)."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    model = model if model is not None else build_model(cfg, data)
    searching = cfg.method == "nexume" and cfg.schedule == "search"
    planning = time.perf_counter()  # the schedule's simulation counts as training time
    sampler = EnergySampler.from_scenario(cfg.harvest_scenario, seed=cfg.seed) if searching else None
    mix = deployment_schedule(cfg, model, deployment) if cfg.method == "nexume" and not searching else None
    planning = time.perf_counter() - planning
    x, y = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    rows = torch.arange(len(x)) if subset is None else torch.from_numpy(np.asarray(subset, dtype=np.int64))
    task_loss = loss_fn or (lambda logits, batch: F.cross_entropy(logits, y[batch]))
    teacher = InPlaceTeacher(len(x), cfg.distill) if mix is not None and cfg.distill > 0 else None
    weights = trained_weights(model)
    n_layers = len(weights) // 2
    search = ConfigSearch.for_model(model, cfg) if searching else None
    updates = [torch.zeros_like(p) for p in weights]
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    history: list[dict[str, float]] = []
    started = time.perf_counter()
    step = 0
    for epoch in range(cfg.epochs):
        model.train()
        order = rows[torch.from_numpy(rng.permutation(len(rows)))]
        if search is not None:
            probe = order[: 4 * cfg.batch_size]
            search.refresh(model, x[probe], y[probe])
            if parallel is not None:  # every rank must choose alike: rank 0's estimates, bit for bit
                search.loss = dict(zip(search.loss, parallel.broadcast(list(search.loss.values()))))
        total, n_seen, correct, chosen_j = 0.0, 0, 0, 0.0
        for batch in order.split(cfg.batch_size):
            bits, drop = _schedule(cfg, sampler, search, rng, step, mix)
            model.configure(bits, drop)
            # the λ terms are constant in the weights: they act through the choice of (q, d) (ConfigSearch)
            cost = cfg.lambda_q * precision_cost(bits) * n_layers + cfg.lambda_d * drop * n_layers
            opt.zero_grad()
            step_loss = task_loss if teacher is None else teacher.loss(task_loss, (bits, drop) == (cfg.q_max, 0.0))
            batch_loss, batch_correct = _backward(model, x, y, batch, step_loss, cost, parallel)
            for count, p in zip(updates, weights):
                if p.grad is not None:
                    count += (p.grad != 0).to(count.dtype)
            opt.step()
            step += 1
            if search is not None:
                search.update((bits, drop), batch_loss)
                chosen_j += search.energy_j[(bits, drop)] * len(batch)
            total += batch_loss * len(batch)
            n_seen += len(batch)
            correct += batch_correct
        metrics = {"epoch": epoch + 1, "loss": total / n_seen, "train_acc": correct / n_seen}
        if search is not None:  # the energy of what the search chose to train, per example
            metrics["chosen_energy_j"] = chosen_j / n_seen
        history.append(metrics)
        if parallel is not None:
            parallel.sync_state(model)
        if progress:
            progress(epoch + 1, cfg.epochs, metrics)
    if cfg.method == "nexume" and cfg.finetune_epochs and cfg.rare_fraction > 0:
        _finetune_rare(model, cfg, x, y, rows, task_loss, weights, updates, rng, parallel)
    elapsed = time.perf_counter() - started + planning
    result = TrainResult(cfg, model, elapsed, history, schedule_mix=mix)
    if parallel is None or parallel.rank == 0:  # the other ranks hold the same model and save nothing
        result.variants = evaluate_variants(model, data, cfg.mcu)
    return result


class InPlaceTeacher:
    """In-place distillation without an extra forward: the full network's logits on each example
    from its own most recent step; a cheaper configuration's step adds ``weight`` × KL(teacher ‖
    student) on the examples that have one."""

    def __init__(self, n: int, weight: float) -> None:
        self.logits: torch.Tensor | None = None
        self.known = torch.zeros(n, dtype=torch.bool)
        self.weight = weight

    def loss(self, task_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], full: bool
             ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        def step(logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
            task = task_loss(logits, batch)
            if full:
                if self.logits is None:
                    self.logits = torch.zeros(len(self.known), logits.shape[1])
                self.logits[batch] = logits.detach()
                self.known[batch] = True
                return task
            known = self.known[batch]
            if self.logits is None or not bool(known.any()):
                return task
            target = F.softmax(self.logits[batch][known], dim=1)
            kl = F.kl_div(F.log_softmax(logits[known], dim=1), target, reduction="batchmean")
            return task + self.weight * kl * (int(known.sum()) / len(batch))

        return step


def fit(module: nn.Module, data: Dataset, cfg: TrainConfig | None = None,
        progress: Callable[[int, int, dict[str, float]], None] | None = None) -> TrainResult:
    """Train the user's ``module`` on ``data`` with ``cfg`` (its ``method`` decides DynFit or a
    baseline; default: DynFit with this data set's defaults): a ``TrainResult`` whose ``model`` is
    the module made switchable (``models.nexume.custom.switchable``)."""
    from models.nexume.custom import switchable

    cfg = cfg or TrainConfig(dataset=data.name)
    return train(cfg, data, progress, model=switchable(module, data.input_shape, cfg.model))


def _backward(model: Any, x: torch.Tensor, y: torch.Tensor, batch: torch.Tensor,
              task_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], cost: float,
              parallel: DataParallel | None) -> tuple[float, int]:
    """Gradients of the batch's mean task loss (+ ``cost``) in the parameters' ``.grad``; returns the
    batch's mean task loss and how many of it were classified right. Under torchrun each rank
    computes its share and the ranks sum the gradients weighted by the shares: the whole batch's."""
    if parallel is None:
        logits = model(x[batch])
        task = task_loss(logits, batch)
        (task + cost).backward()
        return task.item(), int((logits.argmax(1) == y[batch]).sum())
    shard, share = parallel.shard(batch)
    logits = model(x[shard])
    task = task_loss(logits, shard)
    (task + cost).backward()
    correct = int((logits.argmax(1) == y[shard]).sum()) if share else 0
    loss, total_correct = parallel.reduce_gradients(model, share, (task.item() * share, correct))
    return loss, round(total_correct)


def _finetune_rare(model: SwitchableNet, cfg: TrainConfig, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor,
                   task_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], weights: list[nn.Parameter],
                   updates: list[torch.Tensor], rng: np.random.Generator, parallel: DataParallel | None) -> None:
    """NExUME's regularization: train only the least-updated weights, at full precision, no dropout."""
    counts = torch.cat([u.flatten() for u in updates])
    threshold = torch.quantile(counts.float(), cfg.rare_fraction)
    masks = [(u <= threshold).to(u.dtype) for u in updates]
    opt = torch.optim.Adam(weights, lr=cfg.lr * 0.3)
    model.configure(FLOAT_BITS, 0.0)
    model.train()
    for _ in range(cfg.finetune_epochs):
        for batch in rows[torch.from_numpy(rng.permutation(len(rows)))].split(cfg.batch_size):
            opt.zero_grad()
            _backward(model, x, y, batch, task_loss, 0.0, parallel)
            for p, m in zip(weights, masks):
                if p.grad is not None:
                    p.grad *= m
            opt.step()
        if parallel is not None:
            parallel.sync_state(model)


def trained_weights(model: Any) -> list[nn.Parameter]:
    """The conv and linear weights and biases whose update counts NExUME keeps."""
    if isinstance(model, SwitchableNet):
        return [p for layer in (*model.convs, model.classifier) for p in (layer.weight, layer.bias)]
    return list(model.trained_weights())


def drop_levels(model: Any) -> tuple[float, ...]:
    """The dropout levels a model's variants run: the built-in CNN's, or 0 alone (models.nexume.custom)."""
    return DROP_LEVELS if isinstance(model, SwitchableNet) else (0.0,)


@torch.no_grad()
def calibrate_int8(model: SwitchableNet, x: np.ndarray, n: int = 512) -> SwitchableNet:
    """Post-training quantization of a float-trained model: activation scales from ``n`` examples."""
    from brevitas.graph.calibrate import calibration_mode

    model.configure(8, 0.0)
    with calibration_mode(model):
        model(torch.from_numpy(x[:n]))
    model.eval()
    return model


def deployable_variants(method: str) -> list[tuple[int, float]]:
    """(bits, drop) a model trained with ``method`` is meant to run: switchable ones run all."""
    if method in ("nexume", "uniform"):
        return [(b, d) for b in reversed(SUPPORTED_BITS) for d in DROP_LEVELS]
    return [(8, 0.0)]


@torch.no_grad()
def accuracy(model: SwitchableNet, x: np.ndarray, y: np.ndarray, bits: int, drop: float) -> float:
    model.eval()
    model.configure(bits, drop)
    pred = model(torch.from_numpy(x)).argmax(1).numpy()
    return float((pred == y).mean())


def variant_energy_j(model: SwitchableNet, bits: int, drop: float, mcu: str) -> float:
    """One inference's compute energy on ``mcu`` (the cost model the simulator uses)."""
    profile = MCUS[mcu]
    return sum(profile.compute_energy_j(c.macs, bits) for c in model.layer_costs(drop))


def evaluate_variants(model: SwitchableNet, data: Dataset, mcu: str) -> list[dict[str, float]]:
    """Test accuracy, MACs, weight bytes and energy of every (bits, drop) variant."""
    rows = []
    for bits in SUPPORTED_BITS:
        for drop in drop_levels(model):
            costs = model.layer_costs(drop)
            rows.append({
                "bits": bits, "drop": drop,
                "accuracy": accuracy(model, data.x_test, data.y_test, bits, drop),
                "macs": sum(c.macs for c in costs),
                "weight_bytes": math.ceil(sum(c.weights for c in costs) * bits / 8),
                "energy_j": variant_energy_j(model, bits, drop, mcu),
            })
    return rows
