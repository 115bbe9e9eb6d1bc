"""Imported int8 TFLite models for the firmware benchmark (and the import tests): PyPI's
litert-torch converts a PyTorch module, ai-edge-quantizer quantizes it (int8 activations and
weights, min/max calibrated); no TensorFlow.

The benchmark's three, the layouts TinyML users bring: a 1-D conv net with stride 2 (what
litert-torch writes as strides 1 x 2), a 2-D net of strided conv, depthwise conv and average
pool, and a dilated 1-D conv net; beside them, a graph that branches (a residual ADD and a
CONCATENATION).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn


class Conv1dStride2(nn.Module):
    """Three Conv1d with stride 2 (litert-torch writes strides 1 x 2), a mean over time, a dense layer."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(3, 16, 5, stride=2, padding=2)
        self.c2 = nn.Conv1d(16, 32, 5, stride=2, padding=2)
        self.c3 = nn.Conv1d(32, 32, 3, stride=2, padding=1)
        self.fc = nn.Linear(32, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c3(torch.relu(self.c2(torch.relu(self.c1(x))))))
        return self.fc(x.mean(2))


class StridedDepthwise2d(nn.Module):
    """A strided Conv2d from one channel (a depthwise conv in TFLite), a depthwise and a pointwise
    conv, an average pool, a dense layer."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pw = nn.Conv2d(16, 32, 1)
        self.pool = nn.AvgPool2d(2)
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.pw(torch.relu(self.dw(torch.relu(self.c1(x))))))
        return self.fc(self.pool(x).flatten(1))


class Dilated1d(nn.Module):
    """Conv1d with dilation 1, 2 and 4, a mean over time, a dense layer."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(3, 16, 3, padding=1)
        self.c2 = nn.Conv1d(16, 16, 3, dilation=2, padding=2)
        self.c3 = nn.Conv1d(16, 32, 3, dilation=4, padding=4)
        self.fc = nn.Linear(32, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c3(torch.relu(self.c2(torch.relu(self.c1(x))))))
        return self.fc(x.mean(2))


class ResidualConcat2d(nn.Module):
    """A graph that branches: a residual block (conv, conv, the ADD of both outputs), then the
    concatenation along channels of the sum and a 1x1 conv of it, a mean, a dense layer."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 6, 3, padding=1)
        self.c2 = nn.Conv2d(6, 6, 3, padding=1)
        self.c3 = nn.Conv2d(6, 4, 1)
        self.fc = nn.Linear(10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c1(x))
        y = torch.relu(self.c2(x)) + x
        return self.fc(torch.cat([y, torch.relu(self.c3(y))], dim=1).mean((2, 3)))


BENCH_MODELS = {  # name: (module, input shape)
    "conv1d_stride2": (Conv1dStride2, (3, 128)),
    "conv2d_strided_depthwise_avgpool": (StridedDepthwise2d, (1, 16, 16)),
    "conv1d_dilated": (Dilated1d, (3, 128)),
}


def int8_tflite(net: nn.Module, shape: tuple[int, ...], path: Path, per_tensor_fc: bool = False) -> np.ndarray:
    """litert-torch's float model, quantized by ai-edge-quantizer (int8 activations and weights,
    min/max calibrated); returns the calibration inputs."""
    import litert_torch
    from ai_edge_quantizer import qtyping, quantizer, recipe
    from ai_edge_quantizer.utils import tfl_interpreter_utils

    from edge.classify.backends import quiet

    rng = np.random.default_rng(0)
    x = rng.standard_normal((48, *shape)).astype(np.float32)
    with quiet():
        float_path = path.with_suffix(".f32.tflite")
        litert_torch.convert(net.eval(), (torch.from_numpy(x[:1]),)).export(str(float_path))
        qt = quantizer.Quantizer(str(float_path))
        qt.load_quantization_recipe(recipe.static_wi8_ai8())
        if per_tensor_fc:
            qt.add_static_config(".*", qtyping.TFLOperationName.FULLY_CONNECTED, 8, 8,
                                 weight_granularity=qtyping.QuantGranularity.TENSORWISE)
        signature = tfl_interpreter_utils.create_tfl_interpreter(str(float_path)).get_signature_list()
        key, spec = next(iter(signature.items()))
        name = spec["inputs"][0]
        calibration = qt.calibrate({key: [{name: x[i : i + 1]} for i in range(len(x))]}, num_threads=1)
        path.write_bytes(qt.quantize(calibration, enable_progress_report=False).quantized_model)
    return x
class Depthwise2d(nn.Module):
    """A conv, then a 3 x 3 depthwise conv of depth multiplier ``mult`` (``groups`` = its input
    channels), 16 output channels either way, on 16 x 16: the same geometry for multipliers 1 and 2."""

    def __init__(self, mult: int = 1) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16 // mult, 3, padding=1)
        self.dw = nn.Conv2d(16 // mult, 16, 3, padding=1, groups=16 // mult)
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.dw(torch.relu(self.c1(x)))).mean((2, 3)))


class Depthwise2dMult2(Depthwise2d):
    """Depthwise2d with a depth multiplier of 2: 8 channels in, 16 out."""

    def __init__(self) -> None:
        super().__init__(mult=2)


# measured beside them, not in tflite_instructions_per_mac_max (whose three models the issue names)
BRANCHING_MODELS = {"residual_concat2d": (ResidualConcat2d, (2, 8, 8))}
DEPTHWISE_MODELS = {"depthwise_mult1": (Depthwise2d, (3, 16, 16)), "depthwise_mult2": (Depthwise2dMult2, (3, 16, 16))}
