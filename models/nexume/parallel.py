"""Data-parallel training beyond one process, launched by torchrun (``torch.distributed.run``).

    trickle train nexume --dataset fsdd --nproc 2                         # one machine, 2 processes
    trickle train nexume --nproc 4 --nnodes 2 --node-rank 0 --rdzv-endpoint host0:29400   # on each node

Every rank runs the same schedule (same seed: the same permutation, the same (bits, drop) drawn
each step) and takes its share of each global batch (``batch[rank::world]``); the gradients are
summed over the ranks weighted by each share's size, so a step is the step one process takes on
the whole batch, up to float rounding. The same all-reduce sums the batch's loss and hits and
averages the activation quantizers' running statistics (buffers each rank gathers on its own
share: the one place where a quantized run differs from one process's, the mean of two halves'
statistics instead of the whole batch's); the search's loss estimates come from rank 0, so every
rank picks the same configuration; at each epoch's end rank 0's parameters and buffers are
broadcast, so the replicas cannot drift apart. Only global rank 0 writes the checkpoint
(atomically), on the node it runs on (with several nodes torchrun decides which). The process
group is gloo: training here runs on the CPU.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DataParallel:
    """This process's place among torchrun's ranks, and the all-reduce that makes their steps one step."""

    rank: int
    world: int

    @classmethod
    def from_env(cls) -> DataParallel | None:
        """The process group torchrun set up (RANK, WORLD_SIZE, MASTER_ADDR in the environment), or
        None in a single process."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        return cls(dist.get_rank(), dist.get_world_size())

    def shard(self, batch: torch.Tensor) -> tuple[torch.Tensor, float]:
        """This rank's share of a global batch and its fraction of it. A rank left without examples
        (a last batch smaller than the world) computes on the first one with weight 0, so that every
        rank takes part in the same collective calls."""
        own = batch[self.rank :: self.world]
        if len(own) == 0:
            return batch[:1], 0.0
        return own, len(own) / len(batch)

    def reduce_gradients(self, model: torch.nn.Module, share: float, extras: Sequence[float] = ()) -> list[float]:
        """One all-reduce per step: each gradient becomes Σ_ranks share_r · grad_r (``share``: this
        rank's fraction of the batch), each floating buffer the same weighted mean (the activation
        quantizers' running statistics, which each rank gathered on its own share: averaged, they
        describe the whole batch and stay the same on every rank), and ``extras`` (a loss already
        weighted, a count) are summed. Equal gradients keep the parameters equal."""
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        buffers = [b for b in model.buffers() if b.is_floating_point()]
        flat = torch.cat([*(t.flatten().double() * share for t in (*grads, *buffers)),
                          torch.tensor(list(extras), dtype=torch.float64)])
        dist.all_reduce(flat)
        offset = _copy_back(flat, [*grads, *buffers])
        return flat[offset:].tolist()

    def broadcast(self, values: Sequence[float]) -> list[float]:
        """Rank 0's values on every rank."""
        t = torch.tensor(list(values), dtype=torch.float64)
        dist.broadcast(t, 0)
        return [float(v) for v in t.tolist()]

    def sync_state(self, model: torch.nn.Module) -> None:
        """Rank 0's parameters and buffers everywhere, after each epoch: the steps keep them equal
        (reduce_gradients), this guards against anything that drifts (a float reduction's order)."""
        tensors = [t for t in (*model.parameters(), *model.buffers()) if t.numel()]
        for dtype in sorted({t.dtype for t in tensors}, key=str):
            same = [t for t in tensors if t.dtype == dtype]
            flat = torch.cat([t.detach().flatten() for t in same])
            dist.broadcast(flat, 0)
            _copy_back(flat, same)


@torch.no_grad()
def _copy_back(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> int:
    """Each tensor takes its slice of ``flat`` (their concatenation, in order); returns the end."""
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
    return offset
