"""Knowledge distillation on a pruned data set: MDSLR (Chen et al., ICLR 2025, "medium-difficulty
samples", logit reshaping) and the pruning rules it is compared with.

    teacher_out = teacher_logits(teacher, data.x_train)
    keep = select("mdslr", teacher_out, data.y_train, ratio=0.5)      # indices into the training set
    class_std = class_logit_std(teacher_out, data.y_train, n_classes)  # over the FULL set
    loss = kd_loss(student(x), reshape_logits(teacher(x), y, class_std), y, temperature=4.0)

- Difficulty is the teacher's cross-entropy on each training example.
- ``mdslr`` keeps, per class, the ⌊N/C·r⌋ examples centred on the class's median difficulty: half
  from the median up, the rest (the odd one too) below it. ``random`` keeps as many per class at random; ``hard`` the highest
  teacher losses (what EL2N/forgetting-style pruning keeps); ``easy`` the lowest; ``full`` all.
- Logit reshaping: each teacher logit vector is divided by its own standard deviation over the
  classes and multiplied by the mean of that standard deviation over the example's class in the
  full training set, so the kept medium examples carry the confidence the class has overall.
- The loss is γ·CE(student, y) + α·T²·KL(softmax(teacher/T) ‖ softmax(student/T)).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from models.data.base import Dataset
from models.nexume.switchable import FLOAT_BITS, Arch, SwitchableNet
from models.nexume.train import TrainConfig, TrainResult, train

Selection = Literal["mdslr", "random", "hard", "easy", "full"]
SELECTIONS: tuple[Selection, ...] = ("mdslr", "random", "hard", "easy", "full")


@torch.no_grad()
def teacher_logits(teacher: torch.nn.Module, x: np.ndarray, batch: int = 512) -> np.ndarray:
    """The teacher's logits (n, classes), float32, in evaluation mode."""
    teacher.eval()
    out = [teacher(torch.from_numpy(np.asarray(x[i : i + batch], dtype=np.float32))) for i in range(0, len(x), batch)]
    return torch.cat(out).numpy().astype(np.float32)


def difficulty(logits: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each example's teacher cross-entropy."""
    t = torch.from_numpy(np.asarray(logits, dtype=np.float64))
    return F.cross_entropy(t, torch.from_numpy(np.asarray(y, dtype=np.int64)), reduction="none").numpy()


def per_class_budget(n: int, n_classes: int, ratio: float) -> int:
    """⌊N/C·r⌋ examples kept per class."""
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"keep ratio {ratio}: must be in (0, 1]")
    return int(n / n_classes * ratio)


def select(method: Selection, logits: np.ndarray, y: np.ndarray, ratio: float, seed: int = 0) -> np.ndarray:
    """Indices of the training examples ``method`` keeps at ``ratio`` (sorted)."""
    y = np.asarray(y)
    if method == "full" or ratio >= 1.0:
        return np.arange(len(y))
    n_classes = int(y.max()) + 1
    budget = per_class_budget(len(y), n_classes, ratio)
    loss = difficulty(logits, y)
    rng = np.random.default_rng(seed)
    kept: list[np.ndarray] = []
    for c in range(n_classes):
        members = np.flatnonzero(y == c)
        if budget >= len(members):
            kept.append(members)
            continue
        order = members[np.argsort(loss[members], kind="stable")]  # easiest first
        if method == "mdslr":
            mid, above = len(order) // 2, budget // 2
            kept.append(np.concatenate([order[mid - (budget - above) : mid], order[mid : mid + above]]))
        elif method == "hard":
            kept.append(order[len(order) - budget :])
        elif method == "easy":
            kept.append(order[:budget])
        elif method == "random":
            kept.append(rng.choice(members, budget, replace=False))
        else:
            raise ValueError(f"selection {method!r}: must be one of {', '.join(SELECTIONS)}")
    return np.sort(np.concatenate(kept))


def class_logit_std(logits: np.ndarray, y: np.ndarray, n_classes: int) -> np.ndarray:
    """Per class, the mean over its training examples of the teacher logits' standard deviation
    (over the classes; torch's unbiased estimate, as the paper's code takes it)."""
    std = torch.from_numpy(np.asarray(logits, dtype=np.float64)).std(dim=1).numpy()
    y = np.asarray(y)
    return np.array([std[y == c].mean() if np.any(y == c) else 1.0 for c in range(n_classes)])


def reshape_logits(logit_t: torch.Tensor, y: torch.Tensor, class_std: torch.Tensor) -> torch.Tensor:
    """Teacher logits rescaled to their class's mean spread: logit / std(logit) × class_std[y]."""
    return logit_t / logit_t.std(dim=1, keepdim=True).clamp_min(1e-12) * class_std[y].unsqueeze(1)


def kd_loss(logit_s: torch.Tensor, logit_t: torch.Tensor, y: torch.Tensor, temperature: float = 4.0,
            alpha: float = 0.9, gamma: float = 0.1) -> torch.Tensor:
    """γ·CE(student, labels) + α·T²·KL(teacher ‖ student) at temperature T (Hinton et al.)."""
    kl = F.kl_div(F.log_softmax(logit_s / temperature, dim=1), F.softmax(logit_t / temperature, dim=1),
                  reduction="batchmean")
    return gamma * F.cross_entropy(logit_s, y) + alpha * temperature**2 * kl


def student_arch(teacher: Arch, width: float) -> Arch:
    """The teacher's architecture with every conv's channels scaled by ``width`` (at least one)."""
    if not 0.0 < width <= 1.0:
        raise ValueError(f"student width {width}: must be in (0, 1]")
    convs = tuple(replace(c, out_channels=max(1, round(c.out_channels * width))) for c in teacher.convs)
    return replace(teacher, name=f"{teacher.name}-student", convs=convs)


@dataclass
class DistillResult:
    """A distilled student, the training examples it saw and what the distillation cost in seconds."""

    result: TrainResult  # the student, its history and its variants' accuracies
    kept: np.ndarray  # the training examples the student saw
    seconds: float  # the KD's cost: the teacher's pass over the full set, the selection, the student's training loop


def distill(cfg: TrainConfig, data: Dataset, teacher: SwitchableNet, selection: Selection = "mdslr", ratio: float = 0.5,
            width: float = 0.25, temperature: float = 4.0, alpha: float = 0.9, gamma: float = 0.1,
            progress: Callable[[int, int, dict[str, float]], None] | None = None) -> DistillResult:
    """Train a switchable-precision student (``width`` of the teacher's channels, ``cfg.method``'s
    schedule) on the examples ``selection`` keeps at ``ratio``, with the KD loss against the
    teacher's (float) logits; MDSLR reshapes them by the class-wise spread of the full set."""
    started = time.perf_counter()
    teacher.configure(FLOAT_BITS, 0.0)
    logits = teacher_logits(teacher, data.x_train)
    keep = select(selection, logits, data.y_train, ratio, cfg.seed)
    target = torch.from_numpy(logits)
    if selection == "mdslr":
        std = torch.from_numpy(class_logit_std(logits, data.y_train, data.n_classes)).float()
        target = reshape_logits(target, torch.from_numpy(data.y_train), std)
    labels = torch.from_numpy(data.y_train)

    def loss_fn(student_logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        return kd_loss(student_logits, target[batch], labels[batch], temperature, alpha, gamma)

    prepared = time.perf_counter() - started
    student = SwitchableNet(student_arch(teacher.arch, width))
    result = train(cfg, data, progress, model=student, loss_fn=loss_fn, subset=keep)
    return DistillResult(result, keep, prepared + result.train_time_s)
