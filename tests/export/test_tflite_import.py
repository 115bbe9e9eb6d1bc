"""A fully-int8 .tflite made outside the training code (litert-torch, then ai-edge-quantizer's
static int8 quantization; no TensorFlow) becomes a bundle that LiteRT runs, and flashes bit-exact
with TFLite Micro's own interpreter (PyPI tflite-micro, its reference kernels), on the host and
under QEMU. One model is per-channel convs (one padded by a PAD), a transposed flatten and a dense
layer; the other mixes per-tensor and per-channel weights, depthwise convs with depth multipliers,
an average pool, a MEAN and a last SOFTMAX. Unsupported operators and bad files get one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from bench.tflite_models import ResidualConcat2d, int8_tflite
from edge.contract.bundle import read_bundle
from edge.contract.vectors import TestVectors
from tests.helpers import trickle

pytest.importorskip("tflite_micro")
pytest.importorskip("ai_edge_quantizer")


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)  # stride 2, symmetric padding: a PAD in TFLite
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.fc(x.flatten(1))  # NCHW flatten: a TRANSPOSE before the RESHAPE


class MixNet(nn.Module):
    def __init__(self, head: nn.Module | None = None) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 6, 3, padding=1)  # one input channel: a depthwise conv, multiplier 6
        self.dw = nn.Conv2d(6, 12, 3, padding=1, groups=6)  # depthwise, multiplier 2
        self.pool = nn.AvgPool2d(2)
        self.pw = nn.Conv2d(12, 8, 1)
        self.fc = nn.Linear(8, 4)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.dw(nn.functional.relu6(self.c1(x))))
        x = torch.relu(self.pw(self.pool(x))).mean((2, 3))
        if self.head is not None:
            x = self.head(x)
        return torch.softmax(self.fc(x), dim=1)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("tflite")
    torch.manual_seed(0)
    out = {}
    for name, net, shape, per_tensor in (("conv", ConvNet(), (2, 8, 8), False), ("mix", MixNet(), (1, 9, 7), True)):
        model = root / f"{name}.tflite"
        x = int8_tflite(net, shape, model, per_tensor_fc=per_tensor)
        with torch.no_grad():
            y = net(torch.from_numpy(x)).argmax(1).numpy()
        np.savez(root / f"{name}.npz", x=x, y=y)
        out[name] = (model, root / f"{name}.npz")
    return out


def test_the_reader_meets_what_tflm_users_deploy(models: dict[str, tuple[Path, Path]]) -> None:
    from export.firmware.intmodel import ConvLayer, DepthwiseLayer, FCLayer, MeanLayer, WindowPoolLayer
    from export.firmware.tflite_import import from_tflite, op_names, read_model

    conv = from_tflite(models["conv"][0].read_bytes())
    ops = op_names(read_model(models["conv"][0].read_bytes()))
    assert {"PAD", "TRANSPOSE", "RESHAPE"} <= set(ops)
    assert [type(layer) for layer in conv.layers] == [ConvLayer, ConvLayer, FCLayer]
    first_conv = conv.layers[0]
    assert isinstance(first_conv, ConvLayer) and len(set(first_conv.multiplier.tolist())) > 1  # per-channel weights
    assert conv.input_gather is not None and conv.input_gather[1] == 64  # NCHW input, channels-last buffer

    data = models["mix"][0].read_bytes()
    mix = from_tflite(data)
    assert {"DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "MEAN", "SOFTMAX"} <= set(op_names(read_model(data)))
    kinds = [type(layer) for layer in mix.layers]
    # the first DEPTHWISE_CONV_2D reads one channel: it runs as the conv it is (the faster kernel)
    assert kinds == [ConvLayer, DepthwiseLayer, WindowPoolLayer, ConvLayer, MeanLayer, FCLayer]
    first = mix.layers[0]
    assert isinstance(first, ConvLayer) and first.weight.shape == (6, 1, 3, 3) and first.in_shape[0] == 1
    fc = mix.layers[-1]
    assert isinstance(fc, FCLayer) and len(set(fc.multiplier.tolist())) == 1  # per-tensor weights
    second = mix.layers[1]
    assert isinstance(second, DepthwiseLayer) and len(set(second.multiplier.tolist())) > 1  # per-channel


def test_a_tflite_classifier_bundles_runs_and_flashes_bit_exact_with_tflm(models: dict[str, tuple[Path, Path]],
                                                                          tmp_path: Path) -> None:
    from edge.classify.backends import load_backend

    model, examples = models["conv"]
    proc = trickle("export", str(model), "--calibration", str(examples), "--out", str(tmp_path / "b"), "--labels",
                   "a,b,c,d,e")
    assert proc.returncode == 0, proc.stderr
    assert "LiteRT and TFLite Micro agree on the top class" in proc.stdout
    assert "trickle flash can run it (bit-exact with TFLite Micro)" in proc.stdout
    bundle = read_bundle(tmp_path / "b")
    (variant,) = bundle.manifest.variants
    assert variant.formats == {"tflite-int8": "int8-d00.tflite"} and variant.bits == 8
    # conv1 8 x 64 outputs x 18 taps, conv2 8 x 16 x 72, fc 5 x 128
    assert [layer.macs for layer in variant.layers] == [9216, 9216, 640]
    assert variant.accuracy["tflite-int8"] > 0.9  # labels: the float model's answers
    vectors = TestVectors.from_bytes(bundle.file(bundle.manifest.test_vectors.file))  # type: ignore[union-attr]
    backend = load_backend("tflite-int8", bundle.file("int8-d00.tflite"))
    got = np.concatenate([backend.run(vectors.features[i : i + 1]) for i in range(len(vectors))])
    np.testing.assert_array_equal(got, vectors.expected["int8-d00"])

    proc = trickle("flash", str(tmp_path / "b"), "--board", "host", "--out", str(tmp_path / "fw"))
    assert proc.returncode == 0, proc.stderr
    assert "bit-exact with TFLite Micro" in proc.stdout


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler")
def test_depthwise_pools_mean_and_mixed_granularity_are_bit_exact_on_host_and_qemu(
        models: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    from export.firmware.flash import flash
    from export.firmware.tflite_import import import_tflite, tflm_outputs

    model, examples = models["mix"]
    path = import_tflite(model, examples, tmp_path / "b", vectors=24)
    bundle = read_bundle(path)
    report = flash(bundle, "host", tmp_path / "host")
    assert report["mismatches"] == 0 and report["oracle"] == "TFLite Micro" and report["vectors"] == 24
    outputs = np.array([report["outputs"][(i, 0)] for i in range(24)])
    assert len(np.unique(outputs, axis=0)) > 12  # the vectors differ: the check bites
    with np.load(examples) as z:
        x = z["x"][:24]
    from edge.classify.backends import quantize_tflite
    from export.firmware.tflite_import import _Graph, logits_model, read_model

    data = model.read_bytes()
    graph = _Graph(read_model(data), data)
    scale, zp = graph.act(int(graph.g.inputs[0]))
    x_q = quantize_tflite(x, scale, zp)
    # the board printed TFLite Micro's outputs of the model without its SOFTMAX, every byte
    np.testing.assert_array_equal(outputs, tflm_outputs(data, x_q))
    # ... and the unmodified model's SOFTMAX (TFLite Micro on the file as given) picks the same classes
    from tflite_micro.python.tflite_micro import runtime

    full = runtime.Interpreter.from_bytes(data)
    probs = []
    for row in x_q:
        full.set_input(row[None], 0)
        full.invoke()
        probs.append(np.asarray(full.get_output(0)).reshape(-1))
    assert len(logits_model(data)) < len(data)
    assert (np.argmax(probs, axis=1) == outputs.argmax(1)).mean() >= 0.9  # int8 probabilities may tie
    if shutil.which("qemu-system-arm") and shutil.which("arm-none-eabi-gcc"):
        qemu = flash(bundle, "mps2-an386", tmp_path / "m4", vectors=4)
        assert qemu["mismatches"] == 0 and qemu["variants"][0]["instructions_per_inference"] > 0


class StridedConv1d(nn.Module):
    """The most common TinyML time-series layout: Conv1d with stride 2 (litert-torch writes strides
    1 x 2), then a dilated Conv1d, a global average and a dense layer."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(3, 8, 5, stride=2, padding=2)
        self.c2 = nn.Conv1d(8, 8, 3, dilation=2, padding=2)
        self.c3 = nn.Conv1d(8, 8, 3, stride=2, dilation=3)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c3(torch.relu(self.c2(torch.relu(self.c1(x))))))
        return self.fc(x.mean(2))


class Uneven2d(nn.Module):
    """Unequal strides in a conv and a depthwise conv, a dilated depthwise conv, an uneven pool."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 6, 3, stride=(1, 2), padding=1)
        self.dw = nn.Conv2d(6, 6, 3, stride=(2, 1), dilation=2, padding=2, groups=6)
        self.pool = nn.AvgPool2d((1, 2))
        self.fc = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.dw(torch.relu(self.c1(x)))))
        return self.fc(x.mean((2, 3)))


class Quads2d(nn.Module):
    """The SIMD kernels' paths: a depthwise conv of multiplier 4 (one input value for four channels)
    and a 5 x 5 one of multiplier 1, windows cut by the edges; average and max pools over four
    channels at a time; a MEAN over more positions than an int16 lane's sum holds; a dense layer with an odd
    output count and inputs not a multiple of four."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 8, 3, stride=(2, 1), padding=2, dilation=2, groups=2)
        self.dw = nn.Conv2d(8, 8, 5, padding=2, groups=8)
        self.avg = nn.AvgPool2d(3, stride=2)
        self.max = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(8, 7)
        self.fc2 = nn.Linear(7, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.dw(torch.relu(self.c1(x))))
        return self.fc2(torch.relu(self.fc1(self.max(self.avg(x)).mean((2, 3)))))


class Windows3x3(nn.Module):
    """The Cortex-M4's written-out loops: 3 x 3 depthwise convs of whole channel quads (strided, and dilated so
    that all but one window reach into the padding and are gathered) under ReLU6, a pointwise conv with an odd
    channel count, and odd position counts (a tile's lone last position)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 8, 3, padding=1)
        self.dw1 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.dw2 = nn.Conv2d(8, 8, 3, dilation=2, padding=2, groups=8)
        self.pw = nn.Conv2d(8, 5, 1)
        self.fc = nn.Linear(5 * 5 * 5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.relu6(self.dw2(nn.functional.relu6(self.dw1(torch.relu(self.c1(x))))))
        return self.fc(self.pw(x).flatten(1))


class LongMean1d(nn.Module):
    """A MEAN over 300 positions (more than an int16 lane's sum holds) of eight channels."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(3, 8, 3, padding=2, dilation=2)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.c1(x)).mean(2))


@pytest.mark.parametrize(("net", "shape", "strides_seen"), [
    (StridedConv1d, (3, 64), {(1, 2)}),
    (Uneven2d, (2, 10, 12), {(1, 2), (2, 1)}),
    (Quads2d, (2, 26, 24), {(2, 1)}),
    (LongMean1d, (3, 300), {(1, 1)}),
    (Windows3x3, (2, 9, 9), {(2, 2)}),
])
def test_unequal_strides_and_dilation_are_bit_exact_with_tflm(tmp_path: Path, net: type[nn.Module],
                                                              shape: tuple[int, ...], strides_seen: set) -> None:
    """465309f refused both ("the firmware takes equal strides", "dilation has no firmware kernel")."""
    from export.firmware.flash import flash
    from export.firmware.intmodel import ConvLayer, DepthwiseLayer
    from export.firmware.tflite_import import from_tflite, import_tflite

    torch.manual_seed(0)
    model = tmp_path / "m.tflite"
    x = int8_tflite(net(), shape, model)
    np.savez(tmp_path / "x.npz", x=x)
    read = from_tflite(model.read_bytes())
    convs = [layer for layer in read.layers if isinstance(layer, (ConvLayer, DepthwiseLayer))]
    assert strides_seen <= {(layer.stride_h, layer.stride) for layer in convs}
    assert any(max(layer.dilation, layer.dilation_h) > 1 for layer in convs)
    bundle = read_bundle(import_tflite(model, tmp_path / "x.npz", tmp_path / "b", vectors=16))
    host = flash(bundle, "host", tmp_path / "host")
    assert host["mismatches"] == 0 and host["oracle"] == "TFLite Micro" and host["vectors"] == 16
    assert len({tuple(v) for v in host["outputs"].values()}) > 8  # the vectors differ: the check bites
    if shutil.which("qemu-system-arm") and shutil.which("arm-none-eabi-gcc"):
        m4 = flash(bundle, "mps2-an386", tmp_path / "m4", vectors=4)
        assert m4["mismatches"] == 0


class Pools2d(nn.Module):
    """Average pools without a division (a count of 2^k cells): 2 x 2 windows (their own loop), 1 x 4 and
    2 x 1 ones, and a padded 3 x 3 pool whose corner windows hold 2 x 2 cells and whose others 6."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 8, 3, padding=1)
        self.avg1 = nn.AvgPool2d(2)
        self.c2 = nn.Conv2d(8, 12, 1)
        self.avg2 = nn.AvgPool2d((1, 4), stride=(1, 1))
        self.avg3 = nn.AvgPool2d((2, 1))
        self.avg4 = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
        self.fc = nn.Linear(12 * 2 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.relu6(self.avg1(torch.relu(self.c1(x))))
        x = torch.relu(self.avg4(torch.relu(self.avg3(self.avg2(torch.relu(self.c2(x)))))))
        return self.fc(x.flatten(1))


def test_average_pools_of_power_of_two_counts_are_bit_exact_with_tflm(tmp_path: Path) -> None:
    """The pools' rounding by shifts (sums of either sign, half away from zero) against TFLite Micro's
    division, on the host and on the Cortex-M4."""
    from export.firmware.flash import flash
    from export.firmware.intmodel import WindowPoolLayer
    from export.firmware.tflite_import import from_tflite, import_tflite

    torch.manual_seed(0)
    model = tmp_path / "m.tflite"
    x = int8_tflite(Pools2d(), (2, 9, 14), model)
    np.savez(tmp_path / "x.npz", x=x)
    pools = [layer for layer in from_tflite(model.read_bytes()).layers if isinstance(layer, WindowPoolLayer)]
    assert [(p.kind, p.kernel, p.padding) for p in pools] == [("avg", (2, 2), 0), ("avg", (1, 4), 0),
                                                              ("avg", (2, 1), 0), ("avg", (3, 3), 1)]
    bundle = read_bundle(import_tflite(model, tmp_path / "x.npz", tmp_path / "b", vectors=16))
    host = flash(bundle, "host", tmp_path / "host")
    assert host["mismatches"] == 0 and host["oracle"] == "TFLite Micro" and host["vectors"] == 16
    assert len({tuple(v) for v in host["outputs"].values()}) > 8
    if shutil.which("qemu-system-arm") and shutil.which("arm-none-eabi-gcc"):
        m4 = flash(bundle, "mps2-an386", tmp_path / "m4", vectors=8)
        assert m4["mismatches"] == 0


class OneChannel2d(nn.Module):
    """A first conv on a one-channel image (a depthwise conv in TFLite, run as a conv): strided, an odd
    number of output columns (a tile's second position starts the next row) and of positions (a lone
    last one), windows cut by the padding on every side."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 6, 3, stride=2, padding=1)
        self.fc = nn.Linear(6 * 5 * 5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.c1(x)).flatten(1))


def test_a_strided_one_channel_conv_is_bit_exact_with_tflm(tmp_path: Path) -> None:
    """The one-channel 3 x 3 columns written out per tile, against TFLite Micro on the host and the Cortex-M4."""
    from export.firmware.flash import flash
    from export.firmware.intmodel import ConvLayer
    from export.firmware.tflite_import import from_tflite, import_tflite

    torch.manual_seed(0)
    model = tmp_path / "m.tflite"
    x = int8_tflite(OneChannel2d(), (1, 9, 9), model)
    np.savez(tmp_path / "x.npz", x=x)
    first = from_tflite(model.read_bytes()).layers[0]
    assert isinstance(first, ConvLayer) and first.in_shape == (1, 9, 9) and first.out_shape == (6, 5, 5)
    assert first.weight.shape[2:] == (3, 3) and first.stride == 2
    bundle = read_bundle(import_tflite(model, tmp_path / "x.npz", tmp_path / "b", vectors=16))
    host = flash(bundle, "host", tmp_path / "host")
    assert host["mismatches"] == 0 and host["oracle"] == "TFLite Micro" and host["vectors"] == 16
    assert len({tuple(v) for v in host["outputs"].values()}) > 8
    if shutil.which("qemu-system-arm") and shutil.which("arm-none-eabi-gcc"):
        assert flash(bundle, "mps2-an386", tmp_path / "m4", vectors=8)["mismatches"] == 0


class Tabled(nn.Module):
    """A BatchNorm left as a MUL and an ADD by per-channel constants (after a ReLU, so the converter
    cannot fold them into the conv), a sigmoid, a tanh; or a residual ADD of two computed tensors."""

    def __init__(self, residual: bool = False) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 6, 3, padding=1)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 6).view(1, 6, 1, 1))
        self.shift = nn.Parameter(torch.linspace(-0.3, 0.3, 6).view(1, 6, 1, 1))
        self.c2 = nn.Conv2d(6, 6, 3, padding=1)
        self.fc = nn.Linear(6, 3)
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.sigmoid(torch.relu(self.c1(x)) * self.scale + self.shift)
        y = torch.relu(self.c2(x))
        return self.fc(torch.tanh((x + y if self.residual else y).mean((2, 3))))


def test_tabled_operators_are_bit_exact_with_tflm(tmp_path: Path) -> None:
    """465309f refused MUL, ADD, LOGISTIC and TANH, and a residual ADD (aacb8cc too, in one line)."""
    from export.firmware.flash import flash
    from export.firmware.intmodel import AddLayer, LutLayer
    from export.firmware.tflite_import import from_tflite, import_tflite, op_names, read_model

    torch.manual_seed(0)
    model = tmp_path / "t.tflite"
    x = int8_tflite(Tabled(), (2, 8, 8), model)
    np.savez(tmp_path / "x.npz", x=x)
    assert {"MUL", "ADD", "LOGISTIC", "TANH"} <= set(op_names(read_model(model.read_bytes())))
    read = from_tflite(model.read_bytes())
    tables = {layer.op: layer.table.shape for layer in read.layers if isinstance(layer, LutLayer)}
    assert tables == {"MUL": (6, 256), "ADD": (6, 256), "LOGISTIC": (1, 256), "TANH": (1, 256)}
    bundle = read_bundle(import_tflite(model, tmp_path / "x.npz", tmp_path / "b", vectors=16))
    host = flash(bundle, "host", tmp_path / "host")
    assert host["mismatches"] == 0 and host["oracle"] == "TFLite Micro"
    assert len({tuple(v) for v in host["outputs"].values()}) > 4  # the vectors differ: the check bites
    if shutil.which("qemu-system-arm") and shutil.which("arm-none-eabi-gcc"):
        assert flash(bundle, "mps2-an386", tmp_path / "m4", vectors=4)["mismatches"] == 0

    residual = tmp_path / "r.tflite"
    np.savez(tmp_path / "xr.npz", x=int8_tflite(Tabled(residual=True), (2, 8, 8), residual))
    assert any(isinstance(layer, AddLayer) for layer in from_tflite(residual.read_bytes()).layers)
    bundle = read_bundle(import_tflite(residual, tmp_path / "xr.npz", tmp_path / "br", vectors=16))
    assert flash(bundle, "host", tmp_path / "host-r")["mismatches"] == 0


class PaddedMaxPool(nn.Module):
    """ResNet's stem pool, MaxPool2d(3, stride 2, padding 1): litert-torch writes a PADV2 of -128, then a
    VALID MAX_POOL_2D."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(torch.relu(self.c1(x))).mean((2, 3)))


def test_a_max_pool_with_padding_is_bit_exact_with_tflm(tmp_path: Path) -> None:
    """aacb8cc refused it: "a PAD must be followed by a convolution"."""
    from export.firmware.flash import flash
    from export.firmware.intmodel import WindowPoolLayer
    from export.firmware.tflite_import import from_tflite, import_tflite, op_names, read_model

    torch.manual_seed(0)
    model = tmp_path / "p.tflite"
    np.savez(tmp_path / "x.npz", x=int8_tflite(PaddedMaxPool(), (2, 8, 8), model))
    assert "PADV2" in op_names(read_model(model.read_bytes()))
    (pool,) = [layer for layer in from_tflite(model.read_bytes()).layers if isinstance(layer, WindowPoolLayer)]
    assert (pool.kind, pool.padding_h, pool.padding, pool.out_shape[1:]) == ("max", 1, 1, (4, 4))
    bundle = read_bundle(import_tflite(model, tmp_path / "x.npz", tmp_path / "b", vectors=16))
    host = flash(bundle, "host", tmp_path / "host")
    assert host["mismatches"] == 0 and len({tuple(v) for v in host["outputs"].values()}) > 8
    if shutil.which("qemu-system-arm") and shutil.which("arm-none-eabi-gcc"):
        assert flash(bundle, "mps2-an386", tmp_path / "m4", vectors=4)["mismatches"] == 0


def test_a_residual_add_and_a_concatenation_are_bit_exact_and_survive_power_cuts(tmp_path: Path) -> None:
    """aacb8cc refused both ("only chains are supported"; CONCATENATION "has no firmware kernel")."""
    import random

    from export.firmware.cgen import generate
    from export.firmware.flash import build, flash, fresh_nv, qemu, run_with_cuts, write_sources
    from export.firmware.intmodel import AddLayer, ConcatLayer
    from export.firmware.plan import plan
    from export.firmware.tflite_import import from_tflite, import_tflite, op_names, read_model

    torch.manual_seed(0)
    model = tmp_path / "b.tflite"
    np.savez(tmp_path / "x.npz", x=int8_tflite(ResidualConcat2d(), (2, 8, 8), model))
    assert {"ADD", "CONCATENATION"} <= set(op_names(read_model(model.read_bytes())))
    read = from_tflite(model.read_bytes())
    kinds = [type(layer).__name__ for layer in read.layers]
    assert kinds.count("AddLayer") == 1 and kinds.count("ConcatLayer") == 2
    assert read.routes is not None
    for layer, (src, src2, dst) in zip(read.layers, read.routes):
        assert dst not in (src, src2)  # no layer overwrites what it reads: a redone tile rewrites the same bytes
        assert (src2 >= 0) == isinstance(layer, AddLayer)
    kept = plan(read)  # the ADD's inputs both live while it runs: three tensors at once, none sharing a byte
    add = next(k for k, layer in enumerate(read.layers) if isinstance(layer, AddLayer))
    assert len([t for t in kept.tensors if t.first <= add <= t.last]) == 3
    concat = [route for layer, route in zip(read.layers, read.routes) if isinstance(layer, ConcatLayer)]
    assert len({dst for _, _, dst in concat}) == 1 and len({src for src, _, _ in concat}) == 2  # two inputs, one output
    bundle = read_bundle(import_tflite(model, tmp_path / "x.npz", tmp_path / "b", vectors=16))
    host = flash(bundle, "host", tmp_path / "host")
    assert host["mismatches"] == 0 and host["oracle"] == "TFLite Micro"
    assert len({tuple(v) for v in host["outputs"].values()}) > 8  # the vectors differ: the check bites
    if not (shutil.which("qemu-system-arm") and shutil.which("arm-none-eabi-gcc")):
        return
    assert flash(bundle, "mps2-an386", tmp_path / "m4", vectors=4)["mismatches"] == 0
    assert flash(bundle, "stm32f405", tmp_path / "stm32", vectors=4)["mismatches"] == 0
    sources, _ = generate(bundle)
    write_sources(sources, tmp_path / "gen")
    elf = build(tmp_path / "gen", "mps2-an386", tmp_path / "cut", vectors=1)
    nv = tmp_path / "cut" / "nv.bin"
    fresh_nv(nv)
    rc, out, marks, _ = qemu(elf, nv, tmp_path / "cut")
    assert rc == 0
    rng = random.Random(0)
    for _ in range(20):  # a cut at a random instruction of the inference, then power on again
        result = run_with_cuts(elf, tmp_path / "cut", [rng.randrange(marks[0], marks[1])])
        assert result.boots == 2 and result.mismatches == 0
        assert result.stdout.splitlines()[0] == out.splitlines()[0]


class Island(nn.Module):
    """LEAKY_RELU and REDUCE_MAX, which the quantizer leaves in float (DEQUANTIZE, LEAKY_RELU,
    QUANTIZE: the "QUANTIZE/DEQUANTIZE inside the graph" 465309f refused), HARD_SWISH and a SUB of
    constants."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 6, 3, padding=1)
        self.c2 = nn.Conv2d(6, 6, 3, padding=1)
        self.off = nn.Parameter(torch.linspace(-0.2, 0.4, 6).view(1, 6, 1, 1))
        self.fc = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.leaky_relu(self.c1(x), 0.1)
        x = nn.functional.hardswish(self.c2(x)) - self.off
        return self.fc(x.amax((2, 3)))  # REDUCE_MAX, left in float too


def test_float_islands_hard_swish_and_sub_are_bit_exact_with_tflm(tmp_path: Path) -> None:
    from export.firmware.flash import flash
    from export.firmware.intmodel import LutLayer
    from export.firmware.tflite_import import from_tflite, import_tflite, op_names, read_model

    torch.manual_seed(0)
    model = tmp_path / "i.tflite"
    x = int8_tflite(Island(), (2, 8, 8), model)
    np.savez(tmp_path / "x.npz", x=x)
    ops = op_names(read_model(model.read_bytes()))
    assert ops[ops.index("LEAKY_RELU") - 1 : ops.index("LEAKY_RELU") + 2] == ["DEQUANTIZE", "LEAKY_RELU", "QUANTIZE"]
    tables = {layer.op: layer.table.shape for layer in from_tflite(model.read_bytes()).layers
              if isinstance(layer, LutLayer)}
    assert tables == {"DEQUANTIZE+LEAKY_RELU+QUANTIZE": (1, 256), "HARD_SWISH": (1, 256), "SUB": (6, 256),
                      "DEQUANTIZE+REDUCE_MAX+QUANTIZE": (1, 256)}
    assert ops[ops.index("REDUCE_MAX") - 1 : ops.index("REDUCE_MAX") + 2] == ["DEQUANTIZE", "REDUCE_MAX", "QUANTIZE"]
    bundle = read_bundle(import_tflite(model, tmp_path / "x.npz", tmp_path / "b", vectors=16))
    host = flash(bundle, "host", tmp_path / "host")
    assert host["mismatches"] == 0 and len({tuple(v) for v in host["outputs"].values()}) > 4
    if shutil.which("qemu-system-arm") and shutil.which("arm-none-eabi-gcc"):
        assert flash(bundle, "stm32f405", tmp_path / "stm32", vectors=4)["mismatches"] == 0


class Maxed(nn.Module):
    """A MAXIMUM of two computed tensors: an operator TFLite Micro runs and the firmware lacks."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.c1(x)).mean((2, 3))
        return self.fc(torch.maximum(y, 0.5 * y))


def test_an_operator_the_firmware_lacks_is_named_with_its_place(tmp_path: Path) -> None:

    torch.manual_seed(0)
    x = int8_tflite(Maxed(), (1, 8, 8), tmp_path / "cat.tflite")
    np.savez(tmp_path / "x.npz", x=x)
    proc = trickle("export", str(tmp_path / "cat.tflite"), "--calibration", str(tmp_path / "x.npz"), "--out",
                   str(tmp_path / "b"), "--json")
    assert proc.returncode == 0, proc.stderr  # LiteRT runs it: a bundle for devices; export says flash cannot
    said = json.loads(proc.stdout)
    assert said["flashable"] is False and "operator MAXIMUM (operator " in said["flash_refusal"]
    proc = trickle("flash", str(tmp_path / "b"), "--board", "host", "--out", str(tmp_path / "fw"))
    assert proc.returncode == 1
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "operator MAXIMUM (operator " in line and "has no firmware kernel" in line


def test_bad_tflite_files_get_one_line(models: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    model, examples = models["conv"]
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"not a flatbuffer at all" * 4)
    float_model = model.with_suffix(".f32.tflite")
    float_copy = tmp_path / "float.tflite"
    float_copy.write_bytes(float_model.read_bytes())
    np.savez(tmp_path / "wrong.npz", x=np.zeros((16, 3, 8, 8), np.float32))
    for args, expected in (
        ((str(junk), "--calibration", str(examples)), "not a TFLite flatbuffer"),
        ((str(float_copy), "--calibration", str(examples)), "the input is not int8; a fully-int8 model"),
        ((str(model), "--calibration", str(tmp_path / "wrong.npz")), "x holds examples of shape [3, 8, 8]"),
        ((str(model),), "--calibration"),
    ):
        proc = trickle("export", *args, "--out", str(tmp_path / "b"))
        assert proc.returncode == 1, proc.stdout
        assert len(proc.stderr.strip().splitlines()) == 1 and expected in proc.stderr, proc.stderr
        assert not (tmp_path / "b").exists()
