"""A small CNN whose precision and width switch per forward pass: the network NExUME trains.

Every conv/linear layer keeps one float weight and, for each supported bit-width, a brevitas
quantized layer that shares it (tied parameters), so switching precision switches the
quantizer, not the weights. Structured dropout is ordered: at level d a hidden layer keeps
its first ceil((1 - d) * C) output channels and rescales them by C / kept, so a device
running variant d simply skips the other channels (and the next layer's matching inputs).
``bits = 32`` runs the float weights, unquantized.

    net = SwitchableNet(arch_for("fsdd", (13, 63), 10))
    net.configure(bits=4, drop=0.25)
    logits = net(x)                                   # (B, 10)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, cast

import brevitas.nn as qnn
import torch
from torch import nn
from torch.nn import functional as F

SUPPORTED_BITS = (2, 4, 8)
FLOAT_BITS = 32


@dataclass(frozen=True)
class ConvSpec:
    """One convolution of the built-in CNN: output channels, kernel, stride and padding."""

    out_channels: int
    kernel: int
    stride: int = 1
    padding: int = 0


@dataclass(frozen=True)
class Arch:
    """Model shape: conv stack, global average pool, linear classifier."""

    name: str
    input_shape: tuple[int, ...]  # (C, L) or (C, H, W)
    n_classes: int
    convs: tuple[ConvSpec, ...]

    @property
    def dims(self) -> int:
        return len(self.input_shape) - 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Arch:
        convs = tuple(ConvSpec(**c) for c in d["convs"])
        return cls(str(d["name"]), tuple(d["input_shape"]), int(d["n_classes"]), convs)


def arch_for(dataset: str, input_shape: tuple[int, ...], n_classes: int) -> Arch:
    """The architecture used for each task: a few kB of weights, well under an MCU's 256 KB."""
    if len(input_shape) == 3:  # images
        convs = (ConvSpec(16, 3, 1, 1), ConvSpec(32, 3, 2, 1), ConvSpec(32, 3, 1, 1))
    else:  # time series: MFCC frames or IMU samples
        convs = (ConvSpec(24, 5, 2, 2), ConvSpec(32, 3, 2, 1), ConvSpec(32, 3, 1, 1))
    return Arch(dataset, tuple(input_shape), n_classes, convs)


def kept_channels(channels: int, drop: float) -> int:
    return max(1, math.ceil((1.0 - drop) * channels - 1e-9))


class SwitchableLayer(nn.Module):
    """One conv (1-D/2-D) or linear layer at every supported precision, with tied float weights."""

    def __init__(self, kind: str, in_ch: int, out_ch: int, spec: ConvSpec | None = None) -> None:
        super().__init__()
        self.kind, self.spec = kind, spec
        self.quant = nn.ModuleDict({str(b): self._make(kind, in_ch, out_ch, spec, b) for b in SUPPORTED_BITS})
        master = self.quant[str(SUPPORTED_BITS[-1])]
        for b in SUPPORTED_BITS[:-1]:
            self.quant[str(b)].weight = master.weight
            self.quant[str(b)].bias = master.bias

    @staticmethod
    def _make(kind: str, in_ch: int, out_ch: int, spec: ConvSpec | None, bits: int) -> nn.Module:
        if kind == "linear":
            return qnn.QuantLinear(in_ch, out_ch, bias=True, weight_bit_width=bits)
        assert spec is not None
        cls = qnn.QuantConv1d if kind == "conv1d" else qnn.QuantConv2d
        return cls(in_ch, out_ch, spec.kernel, stride=spec.stride, padding=spec.padding, bias=True, weight_bit_width=bits)

    @property
    def weight(self) -> nn.Parameter:
        return cast(nn.Parameter, self.quant[str(SUPPORTED_BITS[-1])].weight)

    @property
    def bias(self) -> nn.Parameter:
        return cast(nn.Parameter, self.quant[str(SUPPORTED_BITS[-1])].bias)

    def forward(self, x: torch.Tensor, bits: int) -> torch.Tensor:
        if bits == FLOAT_BITS:
            if self.kind == "linear":
                return F.linear(x, self.weight, self.bias)
            conv = F.conv1d if self.kind == "conv1d" else F.conv2d
            assert self.spec is not None
            return conv(x, self.weight, self.bias, stride=self.spec.stride, padding=self.spec.padding)
        return self.quant[str(bits)](x)


class SwitchableNet(nn.Module):
    """The built-in CNN whose precision (2, 4, 8 bits or float) and width (ordered dropout) switch per
    forward pass."""

    def __init__(self, arch: Arch) -> None:
        super().__init__()
        self.arch = arch
        kind = "conv1d" if arch.dims == 1 else "conv2d"
        in_ch = arch.input_shape[0]
        self.input_quant = qnn.QuantIdentity(bit_width=8)  # the sensor's sample is int8 on the device
        self.convs = nn.ModuleList()
        self.acts = nn.ModuleList()
        for spec in arch.convs:
            self.convs.append(SwitchableLayer(kind, in_ch, spec.out_channels, spec))
            self.acts.append(nn.ModuleDict({str(b): qnn.QuantReLU(bit_width=b) for b in SUPPORTED_BITS}))
            in_ch = spec.out_channels
        self.classifier = SwitchableLayer("linear", in_ch, arch.n_classes)
        self.bits, self.drop = 8, 0.0

    def configure(self, bits: int, drop: float) -> SwitchableNet:
        if bits not in (*SUPPORTED_BITS, FLOAT_BITS):
            raise ValueError(f"bits = {bits}: must be one of {[*SUPPORTED_BITS, FLOAT_BITS]}")
        if not 0.0 <= drop < 1.0:
            raise ValueError(f"drop = {drop}: must be in [0, 1)")
        self.bits, self.drop = bits, drop
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bits != FLOAT_BITS:
            x = self.input_quant(x)
        for conv, act in zip(self.convs, self.acts):
            x = conv(x, self.bits)
            x = F.relu(x) if self.bits == FLOAT_BITS else act[str(self.bits)](x)  # type: ignore[index]
            x = _ordered_dropout(x, self.drop)
        x = x.flatten(2).mean(dim=2)  # global average pool: (B, C)
        return self.classifier(x, self.bits)  # (B, n_classes)

    def layer_costs(self, drop: float) -> list[LayerCost]:
        """What the device computes per layer at dropout ``drop``."""
        out: list[LayerCost] = []
        shape = list(self.arch.input_shape[1:])
        in_keep = self.arch.input_shape[0]
        for i, spec in enumerate(self.arch.convs):
            shape = [(n + 2 * spec.padding - spec.kernel) // spec.stride + 1 for n in shape]
            keep = kept_channels(spec.out_channels, drop)
            kernel = spec.kernel ** len(shape)
            positions = math.prod(shape)
            out.append(LayerCost(f"conv{i + 1}", keep * in_keep * kernel * positions, keep * in_keep * kernel + keep,
                                 keep * positions))
            in_keep = keep
        n = self.arch.n_classes
        out.append(LayerCost("classifier", in_keep * n, in_keep * n + n, n))
        return out


@dataclass(frozen=True)
class LayerCost:
    """One layer's MACs, parameter bytes and outputs: what the manifest records and the energy model
    prices."""

    name: str
    macs: int
    weights: int  # weights + biases
    outputs: int  # output activations


def _ordered_dropout(x: torch.Tensor, drop: float) -> torch.Tensor:
    """Zero all but the first kept channels and rescale them (see the module docstring)."""
    if drop <= 0.0:
        return x
    channels = x.shape[1]
    keep = kept_channels(channels, drop)
    mask = torch.zeros(channels, dtype=x.dtype, device=x.device)
    mask[:keep] = channels / keep
    return x * mask.view(1, channels, *([1] * (x.dim() - 2)))
