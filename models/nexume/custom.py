"""Your own ``torch.nn.Module`` as a switchable-precision network NExUME's DynFit trains.

    from models.nexume.train import fit
    result = fit(MyNet(), data, TrainConfig(epochs=20))          # data: models.data.datasets.Dataset
    result.model.configure(4, 0.0)(x)                           # the 4-bit variant

``switchable(module)`` swaps every ``nn.Conv1d``, ``nn.Conv2d`` and ``nn.Linear`` for a layer that
keeps the original float weight and, for each of 2, 4 and 8 bits, a brevitas quantized layer
sharing it (so switching precision switches the quantizer, not the weights), and every ``nn.ReLU``
for a quantized ReLU of the same width; the input is quantized to 8 bits as a device's sample is.
The built-in CNN (``models.nexume.switchable.SwitchableNet``) is the same idea with its own layers.

Structured dropout needs to know which channels of one layer feed which of the next, which an
arbitrary graph does not say: a user's network is trained and deployed at dropout 0, its variants
differ in precision only. A module built from a spec (``--model pkg.module:build``, called with the
input shape and the number of classes) can be rebuilt from a checkpoint.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import cast

import brevitas.nn as qnn
import torch
from torch import nn
from torch.nn import functional as F

from edge.core.errors import ConfigError
from models.nexume.switchable import FLOAT_BITS, SUPPORTED_BITS, LayerCost


class PrecisionSwitch(nn.Module):
    """One of the user's conv/linear layers at every supported precision, weights tied to the float layer."""

    def __init__(self, layer: nn.Conv1d | nn.Conv2d | nn.Linear) -> None:
        super().__init__()
        self.layer = layer
        self.bits = FLOAT_BITS
        self.quant = nn.ModuleDict({str(b): self._quantized(layer, b) for b in SUPPORTED_BITS})
        for q in self.quant.values():
            q.weight = layer.weight
            q.bias = layer.bias  # type: ignore[assignment]  # None when the layer has none

    @staticmethod
    def _quantized(layer: nn.Module, bits: int) -> nn.Module:
        if isinstance(layer, nn.Linear):
            return qnn.QuantLinear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                                   weight_bit_width=bits)
        conv = cast(nn.Conv1d | nn.Conv2d, layer)
        if not isinstance(conv.padding, tuple) or conv.padding_mode != "zeros":
            raise ConfigError("model", type(conv).__name__, "needs numeric zero padding (not 'same'/'valid' strings)")
        cls = qnn.QuantConv1d if isinstance(conv, nn.Conv1d) else qnn.QuantConv2d
        return cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
                   dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None, weight_bit_width=bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.layer(x) if self.bits == FLOAT_BITS else self.quant[str(self.bits)](x))


class ReluSwitch(nn.Module):
    """A ReLU whose output is quantized to the network's current width (float: a plain ReLU)."""

    def __init__(self) -> None:
        super().__init__()
        self.bits = FLOAT_BITS
        self.quant = nn.ModuleDict({str(b): qnn.QuantReLU(bit_width=b) for b in SUPPORTED_BITS})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x) if self.bits == FLOAT_BITS else cast(torch.Tensor, self.quant[str(self.bits)](x))


class UserNet(nn.Module):
    """The user's module made switchable: ``configure(bits, drop)`` like ``SwitchableNet``."""

    def __init__(self, module: nn.Module, input_shape: tuple[int, ...], spec: str | None = None) -> None:
        super().__init__()
        self.module = _swap(module)
        self.layers = [m for m in self.module.modules() if isinstance(m, PrecisionSwitch)]
        if not self.layers:
            raise ConfigError("model", type(module).__name__, "has no nn.Conv1d, nn.Conv2d or nn.Linear layer to train")
        self.input_quant = qnn.QuantIdentity(bit_width=8)
        self.input_shape, self.spec = tuple(input_shape), spec
        self.bits, self.drop = 8, 0.0
        self.configure(8, 0.0)

    def configure(self, bits: int, drop: float) -> UserNet:
        if bits not in (*SUPPORTED_BITS, FLOAT_BITS):
            raise ValueError(f"bits = {bits}: must be one of {[*SUPPORTED_BITS, FLOAT_BITS]}")
        self.bits, self.drop = bits, 0.0  # structured dropout needs the built-in network's layout (module docstring)
        for m in self.module.modules():
            if isinstance(m, PrecisionSwitch | ReluSwitch):
                m.bits = bits
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bits != FLOAT_BITS:
            x = self.input_quant(x)
        return cast(torch.Tensor, self.module(x))

    def trained_weights(self) -> list[nn.Parameter]:
        """Every switchable layer's weight and bias (what NExUME's update counts track)."""
        found = [p for layer in self.layers for p in (layer.layer.weight, layer.layer.bias) if p is not None]
        return cast(list[nn.Parameter], found)

    @torch.no_grad()
    def layer_costs(self, drop: float = 0.0) -> list[LayerCost]:
        """MACs, weights and outputs of every switchable layer, from one forward pass's shapes."""
        costs: list[LayerCost] = []
        hooks = []

        def record(name: str) -> Callable[..., None]:
            def hook(module: PrecisionSwitch, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
                layer = module.layer
                per_output = layer.in_features if isinstance(layer, nn.Linear) else (
                    layer.in_channels // layer.groups * math.prod(layer.kernel_size))
                weights = layer.weight.numel() + (layer.bias.numel() if layer.bias is not None else 0)
                costs.append(LayerCost(name, out[0].numel() * per_output, weights, out[0].numel()))
            return hook

        for name, m in self.module.named_modules():
            if isinstance(m, PrecisionSwitch):
                hooks.append(m.register_forward_hook(record(name)))
        bits, training = self.bits, self.training
        try:
            self.eval().configure(FLOAT_BITS, 0.0)(torch.zeros(1, *self.input_shape))
        finally:
            for h in hooks:
                h.remove()
            self.configure(bits, 0.0).train(training)
        return costs


def _swap(module: nn.Module) -> nn.Module:
    if isinstance(module, nn.Conv1d | nn.Conv2d | nn.Linear):
        return PrecisionSwitch(module)
    if isinstance(module, nn.ReLU):
        return ReluSwitch()
    for name, child in list(module.named_children()):
        setattr(module, name, _swap(child))
    return module


def switchable(module: nn.Module, input_shape: tuple[int, ...], spec: str | None = None) -> UserNet:
    """``module`` (changed in place) as a switchable-precision network for inputs of ``input_shape``."""
    return UserNet(module, input_shape, spec)


def build(spec: str, input_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """The module ``pkg.module:function`` returns for (input shape, number of classes)."""
    where, _, name = spec.partition(":")
    if not where or not name:
        raise ConfigError("--model", spec, "must be pkg.module:function (a function of (input_shape, n_classes))")
    try:
        factory = getattr(importlib.import_module(where), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError("--model", spec, f"cannot be imported: {e}") from None
    module = factory(tuple(input_shape), int(n_classes))
    if not isinstance(module, nn.Module):
        raise ConfigError("--model", spec, f"returned a {type(module).__name__}, not a torch.nn.Module")
    return module
