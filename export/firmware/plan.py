"""The memory plan of an integer model: one arena, every activation tensor at an offset in it.

    p = plan(model)              # offsets from the tensors' lifetimes, the arena sized to the peak
    print(p.describe())          # the plan for a person: each tensor, its bytes, lifetime, offset

TFLite Micro's ``GreedyMemoryPlanner`` is the model: tensors sorted by size, largest first, each
placed at the lowest offset (16-byte aligned) where it shares no byte with a tensor placed before
it whose lifetime overlaps its own. A lifetime runs from the layer that writes a tensor (the
input's: before the first layer) to the last layer that reads it, both inclusive, so a layer's
output never shares a byte with its inputs: a tile redone after a power cut reads what it read
the first time. What stays outside the arena: the logits (the last layer's outputs) and the
trained models' int32 pooled sums, which the executor keeps beside the progress word.

The tensors are the model's ``routes`` (``IntModel.routes``: each layer's input, second input and
output tensor ids, the input 0); a model without routes is a chain. A layer may read a slice of a
tensor (``IntModel.views``: bytes from the tensor's start), which keeps the whole tensor live.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from export.firmware.intmodel import (
    AddLayer,
    ConcatLayer,
    ConvLayer,
    DenseLayer,
    DepthwiseLayer,
    FCLayer,
    IntModel,
    Layer,
    LutLayer,
    MeanLayer,
    MulLayer,
    PoolLayer,
    WindowPoolLayer,
)

ALIGN = 16  # TFLite Micro's kBufferAlignment; the kernels' word loads need 4


@dataclass(frozen=True)
class Tensor:
    """One activation tensor of the plan: its bytes, the layers that write it first and read it
    last (-1: the model input, written before the first layer), and its offset in the arena."""

    tensor: int  # the id in the model's routes
    bytes: int
    first: int
    last: int
    offset: int
    name: str

    def live_with(self, other: Tensor) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class MemoryPlan:
    """Offsets of every layer's tensors in one arena of ``arena_bytes``."""

    arena_bytes: int
    input_offset: int
    routes: list[tuple[int, int, int]]  # per layer: (src, src2, dst) byte offsets (0 where unused)
    tensors: list[Tensor]

    @property
    def tensor_bytes(self) -> int:
        """The tensors' bytes summed: what one buffer per tensor would take (the plan's saving)."""
        return sum(t.bytes for t in self.tensors)

    def live_bytes(self, layer: int) -> int:
        """Bytes of the tensors live while layer ``layer`` runs."""
        return sum(t.bytes for t in self.tensors if t.first <= layer <= t.last)

    def describe(self) -> str:
        rows = [f"arena {self.arena_bytes} bytes ({len(self.tensors)} tensors, {self.tensor_bytes} bytes unplanned)"]
        for t in sorted(self.tensors, key=lambda t: (t.offset, t.first)):
            rows.append(f"  {t.offset:>8} .. {t.offset + t.bytes:<8} {t.bytes:>8} B  layers {t.first:>3} .. "
                        f"{t.last:<3} {t.name}")
        return "\n".join(rows)


def output_bytes(layer: Layer, last: bool) -> int:
    """Bytes a layer writes into the arena: 0 for one writing the logits or the pooled sums."""
    if last or isinstance(layer, (PoolLayer, DenseLayer)):
        return 0
    if isinstance(layer, (ConvLayer, DepthwiseLayer, WindowPoolLayer)):
        return math.prod(layer.out_shape)
    if isinstance(layer, MeanLayer):
        return layer.in_shape[0]
    if isinstance(layer, FCLayer):
        return int(layer.weight.shape[0]) * layer.rows
    if isinstance(layer, (LutLayer, AddLayer, MulLayer)):
        return math.prod(layer.shape)
    if isinstance(layer, ConcatLayer):
        return layer.out_channels * math.prod(layer.positions)
    raise TypeError(f"no output size for {type(layer).__name__}")


def chain_routes(n_layers: int) -> list[tuple[int, int, int]]:
    """A chain's tensors: layer i reads tensor i (the input is 0) and writes tensor i + 1."""
    return [(i, -1, i + 1) for i in range(n_layers)]


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def plan(model: IntModel) -> MemoryPlan:
    """The greedy plan of ``model``'s tensors (TFLite Micro's order and rule)."""
    routes = model.routes if model.routes is not None else chain_routes(len(model.layers))
    n = len(model.layers)
    size: dict[int, int] = {0: math.prod(model.input_shape)}
    first: dict[int, int] = {0: -1}
    last: dict[int, int] = {0: -1}
    names: dict[int, str] = {0: "input"}
    for k, (layer, (src, src2, dst)) in enumerate(zip(model.layers, routes)):
        for t in (src, src2):
            if t >= 0 and not isinstance(layer, DenseLayer):  # a dense layer reads the pooled sums
                last[t] = max(last.get(t, k), k)
        nbytes = output_bytes(layer, k == n - 1)
        if nbytes:
            size[dst] = max(size.get(dst, 0), nbytes)
            first.setdefault(dst, k)
            last[dst] = max(last.get(dst, k), k)
            names.setdefault(dst, f"layer {k + 1} ({type(layer).__name__})")
    order = sorted(size, key=lambda t: (-_aligned(size[t]), first[t], t))
    placed: list[Tensor] = []
    for t in order:
        me = Tensor(t, size[t], first[t], last[t], 0, names[t])
        offset = 0
        for other in sorted((p for p in placed if p.live_with(me)), key=lambda p: p.offset):
            if offset + size[t] <= other.offset:
                break  # the gap before it holds this tensor
            offset = max(offset, _aligned(other.offset + other.bytes))
        placed.append(Tensor(t, size[t], first[t], last[t], offset, names[t]))
    at = {p.tensor: p.offset for p in placed}
    views = model.views if model.views is not None else [(0, 0)] * n
    offsets = [(at.get(src, 0) + a, at.get(src2, 0) + b if src2 >= 0 else 0, at.get(dst, 0))
               for (src, src2, dst), (a, b) in zip(routes, views)]
    arena = _aligned(max([p.offset + p.bytes for p in placed] + [ALIGN]))
    return MemoryPlan(arena, at[0], offsets, sorted(placed, key=lambda p: (p.first, p.tensor)))
