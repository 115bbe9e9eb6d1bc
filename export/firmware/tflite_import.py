"""A fully-int8 TFLite classifier the user brings (what TFLite Micro deploys), bundled and flashed.

    trickle export model.tflite --calibration inputs.npz --out bundles/mine [--labels a,b,c]

The bundle's one variant is the flatbuffer as given (format ``tflite-int8``: LiteRT runs it on a
device, quantizing float inputs with the model's own input scale). ``trickle flash`` reads it into
the firmware's integer kernels (``from_tflite``), computing what TFLite Micro's reference kernels
compute, and checks every test vector bit for bit against TFLite Micro's own interpreter
(``tflm_outputs``, PyPI ``tflite-micro``).

What the reader takes: CONV_2D and DEPTHWISE_CONV_2D (per-tensor or per-channel weights; SAME,
VALID or a PAD before them; any strides, dilation and depth multiplier; a depthwise conv of one
input channel, what a converter writes for a first Conv2d on a one-channel image, runs as the conv
it is), AVERAGE_POOL_2D, MAX_POOL_2D (a PAD of -128 before it folds into its padding), MEAN over
all positions, FULLY_CONNECTED (of one row, or of rows: a dense layer applied per time step), with
NONE/RELU/RELU6/RELU_N1_TO_1 fused; ADD, SUB and MUL of two computed tensors of one size (a
residual connection, a recurrent layer's gates) and CONCATENATION along channels or of
consecutive blocks (rows of an image, outputs stacked over time), in graphs that branch (each
layer's output a tensor of its own, placed in the arena by ``export.firmware.plan``); LOGISTIC,
TANH, ADD/SUB/MUL by a constant (a BatchNorm left as MUL and ADD, on any axis), QUANTIZE from int8
to int8, RELU, RELU6, LEAKY_RELU and HARD_SWISH, and a float island a quantizer leaves
(DEQUANTIZE, float operators value by value, QUANTIZE; or DEQUANTIZE, REDUCE_MAX over all
positions, QUANTIZE: an int8 maximum, then a table), as tables of their 256 outputs (per channel
of the buffer where a constant differs by channel) that TFLite Micro computes on those operators
alone; RESHAPE, SQUEEZE, TRANSPOSE and SLICE, which move no data on the device (the firmware's
buffer stays channels-last; a transposed or reshaped tensor only reorders the next layer's
weights or the input's bytes, a slice is read where it lies); and a last SOFTMAX, which the device
leaves out (it does not change the top class): the firmware's outputs are the int8 tensor before
it, checked against that tensor. So litert-torch's ``nn.GRU`` and ``nn.LSTM``, unrolled over time,
run as they are.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edge.contract.bundle import load_private_key, pack, write_bundle
from edge.contract.manifest import SCHEMA_VERSION
from edge.contract.vectors import FILE as VECTORS_FILE
from edge.contract.vectors import TestVectors
from edge.core.errors import BundleError
from export.firmware.intmodel import (
    AddLayer,
    ConcatLayer,
    ConvLayer,
    DepthwiseLayer,
    FCLayer,
    IntModel,
    IntModelError,
    Layer,
    LutLayer,
    MeanLayer,
    MulLayer,
    WindowPoolLayer,
)
from export.firmware.plan import chain_routes
from simulator.devices import MCUS

MIN_AGREEMENT = 0.95  # LiteRT's optimized kernels against TFLite Micro's reference ones, top class
LUT_OPS = ("LOGISTIC", "TANH", "ADD", "SUB", "MUL", "QUANTIZE", "RELU", "RELU6", "LEAKY_RELU", "HARD_SWISH")
SUPPORTED = ("CONV_2D, DEPTHWISE_CONV_2D, AVERAGE_POOL_2D, MAX_POOL_2D, MEAN, FULLY_CONNECTED, "
             "ADD, SUB and MUL of two tensors, CONCATENATION along channels or rows, SLICE, LOGISTIC, TANH, "
             "ADD/SUB/MUL by a constant, "
             "QUANTIZE (int8 to int8), RELU, RELU6, LEAKY_RELU, "
             "HARD_SWISH, DEQUANTIZE ... QUANTIZE around value-by-value float operators or a REDUCE_MAX over "
             "positions, RESHAPE, SQUEEZE, "
             "TRANSPOSE, PAD and a last SOFTMAX")
ACTIVATIONS = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6"}
_RECURRENT = (" (a recurrent layer fused into one operator; the firmware runs recurrent layers unrolled over time, "
              "as litert-torch writes nn.GRU and nn.LSTM: convert it so, or let LiteRT run the bundle on a Linux "
              "device)")
MISSING = {  # what to do about an operator the firmware lacks, where there is something to say
    "UNIDIRECTIONAL_SEQUENCE_LSTM": _RECURRENT, "BIDIRECTIONAL_SEQUENCE_LSTM": _RECURRENT,
    "UNIDIRECTIONAL_SEQUENCE_RNN": _RECURRENT, "BIDIRECTIONAL_SEQUENCE_RNN": _RECURRENT,
    "STRIDED_SLICE": " (a strided slice of a tensor; a SLICE runs)", "SPLIT": " (a split of a tensor; SLICEs run)",
    "BATCH_MATMUL": " (a product of two computed tensors: attention; fold a constant operand into a dense layer)",
    "GATHER": " (an embedding lookup)", "RESIZE_NEAREST_NEIGHBOR": " (upsampling)", "RESIZE_BILINEAR": " (upsampling)",
    "TRANSPOSE_CONV": " (a transposed convolution: upsampling)",
}


class TfliteImportError(BundleError):
    """The .tflite file or its example inputs cannot become a bundle."""


def _schema() -> Any:
    try:
        from tflite_micro.tensorflow.lite.micro.python import schema_py_generated
    except ImportError:
        raise TfliteImportError("reading .tflite models needs tflite-micro: pip install 'trickle[export]'") from None
    return schema_py_generated


def read_model(data: bytes) -> Any:
    """The flatbuffer as the schema's object tree (``ModelT``), or one error line."""
    schema = _schema()
    try:
        if not schema.Model.ModelBufferHasIdentifier(data, 0):
            raise ValueError("no TFL3 identifier")
        model = schema.ModelT.InitFromPackedBuf(bytearray(data), 0)
    except Exception as e:  # flatbuffers raises struct.error, IndexError, ... on a bad buffer
        raise TfliteImportError(f"not a TFLite flatbuffer ({e})") from None
    if not model.subgraphs or len(model.subgraphs) != 1:
        raise TfliteImportError(f"the model has {len(model.subgraphs or [])} subgraphs; one is supported")
    return model


def op_names(model: Any) -> list[str]:
    """The builtin operator name of each operator of the main subgraph."""
    schema = _schema()
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    out = []
    for op in model.subgraphs[0].operators:
        code = model.operatorCodes[op.opcodeIndex]
        builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
        out.append(names.get(builtin, f"custom {code.customCode!r}") if builtin != schema.BuiltinOperator.CUSTOM
                   else f"CUSTOM {bytes(code.customCode or b'').decode(errors='replace')}")
    return out


class _Graph:
    """Tensors of the main subgraph: shapes, int8 quantization and constant data."""

    def __init__(self, model: Any, data: bytes) -> None:
        self.model, self.data = model, data
        self.g = model.subgraphs[0]
        self.schema = _schema()

    def name(self, t: int) -> str:
        return bytes(self.g.tensors[t].name or b"").decode(errors="replace")

    def shape(self, t: int) -> tuple[int, ...]:
        return tuple(int(d) for d in self.g.tensors[t].shape)

    def quant(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        q = self.g.tensors[t].quantization
        if q is None or q.scale is None or len(q.scale) == 0:
            raise IntModelError(f"tensor {self.name(t)!r} is not quantized")
        return np.asarray(q.scale, np.float32), np.asarray(q.zeroPoint, np.int64)

    def act(self, t: int) -> tuple[float, int]:
        """(scale, zero point) of an int8 activation tensor."""
        if self.g.tensors[t].type != self.schema.TensorType.INT8:
            raise IntModelError(f"tensor {self.name(t)!r} is not int8: a fully-int8 model is needed")
        scale, zp = self.quant(t)
        return float(scale[0]), int(zp[0])

    def has_data(self, t: int) -> bool:
        """Whether tensor ``t`` is a constant (its buffer holds data)."""
        buf = self.model.buffers[self.g.tensors[t].buffer]
        return (buf.data is not None and len(buf.data) > 0) or getattr(buf, "offset", 0) > 1

    def const(self, t: int) -> np.ndarray:
        tensor = self.g.tensors[t]
        buf = self.model.buffers[tensor.buffer]
        if buf.data is not None and len(buf.data):
            raw = bytes(bytearray(buf.data))
        elif getattr(buf, "offset", 0) > 1:  # large models keep buffers after the flatbuffer
            raw = self.data[buf.offset : buf.offset + buf.size]
        else:
            raise IntModelError(f"tensor {self.name(t)!r} has no constant data")
        types = {self.schema.TensorType.INT8: np.int8, self.schema.TensorType.INT32: np.int32,
                 self.schema.TensorType.INT64: np.int64}
        if tensor.type not in types:
            raise IntModelError(f"constant {self.name(t)!r} has type {tensor.type}; int8/int32/int64 expected")
        return np.frombuffer(raw, dtype=types[tensor.type]).reshape(self.shape(t))


def quantize_multiplier(real: float) -> tuple[int, int]:
    """TFLite's QuantizeMultiplier as (Q31 multiplier, right shift; negative: a left shift)."""
    if real <= 0.0:
        raise IntModelError(f"requantization scale {real}: must be positive")
    mantissa, exponent = math.frexp(real)
    q = math.floor(mantissa * (1 << 31) + 0.5)  # std::round; exact: mantissa * 2^31 + 0.5 fits a double
    if q == 1 << 31:
        q, exponent = q // 2, exponent + 1
    if exponent < -31:  # every bit would be shifted out: TFLite flushes the multiplier to zero
        return 0, 0
    return q, -exponent


def _activation_range(code: int, scale: float, zp: int, where: str) -> tuple[int, int]:
    """CalculateActivationRangeQuantized: quantize(f) = zp + round(f / scale), float32."""
    def q(f: float) -> int:
        v = float(np.float32(f) / np.float32(scale))
        return zp + int(math.copysign(math.floor(abs(v) + 0.5), v))

    if code == 0:
        return -128, 127
    if code == 1:
        return max(-128, q(0.0)), 127
    if code == 3:
        return max(-128, q(0.0)), min(127, q(6.0))
    if code == 2:
        return max(-128, q(-1.0)), min(127, q(1.0))
    raise IntModelError(f"{where}: fused activation {code} has no firmware kernel (NONE, RELU, RELU6, RELU_N1_TO_1)")


def _device_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A tensor's shape as the firmware's elementwise layers take it: (C, H, W) of an NHWC tensor,
    else (N,), its values in order."""
    return (shape[3], shape[1], shape[2]) if len(shape) == 4 else (math.prod(shape),)


def _same_pad(n: int, k: int, stride: int, out: int) -> int:
    return max((out - 1) * stride + k - n, 0) // 2


def _contiguous(order: np.ndarray) -> int | None:
    """The first buffer offset where ``order`` (buffer offsets, in the tensor's order) is a run of
    consecutive offsets; None where it is not."""
    if order.size == 0:
        return None
    start = int(order[0])
    return start if np.array_equal(order, np.arange(start, start + order.size)) else None


def from_tflite(data: bytes) -> IntModel:
    """The integer model of a fully-int8 TFLite flatbuffer, as the firmware runs it."""
    return _Lowering(data).run()



@dataclass(frozen=True)
class _Op:
    """One operator of the graph as a handler reads it."""

    k: int
    kind: str
    ins: list[int]
    outs: list[int]
    opts: Any
    here: str  # how errors name it


class _Lowering:
    """TFLite operators into the firmware's layers, one handler per operator (``HANDLERS``).

    ``where[i...]``: the offset in the device's buffer of each value of the current tensor; before
    the first layer that computes, the buffer is the model input itself, laid out as the layer
    needs. ``phys``: the device buffer, (H, W, C), or (N,) after a vector op; ``pad``: a pending
    PAD (top, bottom, left, right), folded into the next convolution.

    A graph that branches (a residual ADD, a CONCATENATION, two operators reading one tensor) keeps
    each tensor some later operator reads: ``values`` holds every tensor's id and view, and each
    layer's output is a new tensor (``routes``: the ids each layer reads and writes), whose bytes
    in the arena ``export.firmware.plan`` gives from the tensors' lifetimes."""

    def __init__(self, data: bytes) -> None:
        model = read_model(data)
        self.graph = _Graph(model, data)
        g = self.g = self.graph.g
        self.names = op_names(model)
        if len(g.inputs) != 1 or len(g.outputs) != 1:
            raise IntModelError(f"the model has {len(g.inputs)} inputs and {len(g.outputs)} outputs; one of each is needed")
        t_in = int(g.inputs[0])
        in_scale, in_zp = self.graph.act(t_in)
        in_shape = self.graph.shape(t_in)
        if not in_shape or in_shape[0] != 1:
            raise IntModelError(f"input shape {list(in_shape)}: the batch (first) dimension must be 1")
        self.out = IntModel(in_scale, in_shape[1:], input_zero_point=in_zp)
        self.cur = t_in
        self.where = np.arange(math.prod(in_shape)).reshape(in_shape)
        self.computed = False
        self.phys: tuple[int, ...] = in_shape[1:]
        self.pad, self.pad_value = (0, 0, 0, 0), 0  # a pending PAD, and the int8 value it pads with
        self.outputs = {int(g.outputs[0])}
        self.buffer, self.k, self.tensors = 0, 0, 0  # the current tensor's id (the input's: 0); the operator lowered
        self.values: dict[int, tuple[int, np.ndarray, tuple[int, ...], bool]] = {}
        self.routes: list[tuple[int, int, int]] = []
        self.views: list[tuple[int, int]] = []  # where in its input tensors each layer reads (IntModel.views)

    def run(self) -> IntModel:
        g, out = self.g, self.out
        island_end = -1
        for k, op in enumerate(g.operators):
            if k <= island_end:
                continue  # tabulated with the DEQUANTIZE that opened its float island
            kind = self.names[k]
            ins, outs = [int(i) for i in op.inputs], [int(i) for i in op.outputs]
            here = f"operator {k + 1} of {len(g.operators)} ({kind}, output {self.graph.name(outs[0])!r})"
            self.k = k
            self.values[self.cur] = (self.buffer, self.where, self.phys, self.computed)
            reads = [t for t in ins if t >= 0 and not self.graph.has_data(t)]
            main = self.cur if self.cur in reads else (reads[0] if reads else ins[0])
            if main != self.cur:
                if main not in self.values:
                    raise IntModelError(f"{here}: reads {self.graph.name(main)!r}, which no operator the firmware "
                                        "runs has computed")
                if self.pad != (0, 0, 0, 0):
                    raise IntModelError(f"{here}: a PAD must be followed by the convolution it pads")
                self.cur = main
                self.buffer, self.where, self.phys, self.computed = self.values[main]
            if self.pad != (0, 0, 0, 0) and kind not in ("CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D"):
                raise IntModelError(f"{here}: a PAD must be followed by a convolution or a max pool (it is folded "
                                    "into it)")
            if kind == "SOFTMAX" and outs[0] in self.outputs:
                break  # monotone: the firmware stops at the logits before it
            if kind == "DEQUANTIZE":
                island_end = self._float_island(k, here)
                continue
            handler = self.HANDLERS.get(kind)
            if handler is None:
                hint = MISSING.get(kind, "")
                raise IntModelError(f"operator {kind} (operator {k + 1} of {len(g.operators)} in the graph, output "
                                    f"{self.graph.name(outs[0])!r}) has no firmware kernel{hint}: the firmware runs "
                                    f"{SUPPORTED}")
            handler(self, _Op(k, kind, ins, outs, op.builtinOptions, here))
        if self.routes != chain_routes(len(self.routes)):
            out.routes = self.routes
        if any(a or b for a, b in self.views):
            out.views = self.views
        if not out.layers or not isinstance(out.layers[-1], FCLayer):
            raise IntModelError("the model must end in a FULLY_CONNECTED layer (optionally then a SOFTMAX): its outputs "
                                "are the device's logits")
        return out

    # ---- the buffer ----

    def place(self, op: _Op, shape: tuple[int, ...]) -> None:
        """The current tensor as a channels-last (1, H, W, C) buffer in order."""
        if self.where.shape != shape:
            raise IntModelError(f"operator {op.k + 1} ({op.kind}): input shape {list(self.where.shape)}, expected "
                                f"{list(shape)}")
        if not self.computed:
            self._gather(op, self.where.reshape(-1))
        elif self.phys != shape[1:] or not np.array_equal(self.where.reshape(-1), np.arange(self.where.size)):
            raise IntModelError(f"operator {op.k + 1} ({op.kind}): its input is a transposed view of the buffer; the "
                                "firmware's layers read channels-last tensors in order")

    def _gather(self, op: _Op, order: np.ndarray) -> None:
        """The model input laid out as the first layer reading it needs (every reader the same way)."""
        if self.out.input_gather is not None and not np.array_equal(self.out.input_gather, order):
            raise IntModelError(f"operator {op.k + 1} ({op.kind}): reads the model input in another order than the "
                                "operator before it; the firmware's input buffer has one layout")
        self.out.input_gather = order.copy()

    def _new_tensor(self) -> int:
        """A new tensor id for a layer's output (the input is 0); ``export.firmware.plan`` gives it its
        bytes in the arena from its lifetime."""
        self.tensors += 1
        return self.tensors

    def emit(self, layer: Layer, src2: int = -1, dst: int | None = None, at: tuple[int, int] = (0, 0)) -> None:
        """A layer reading the current tensor (and ``src2``), ``at`` bytes into each, writing ``dst``
        or a new tensor."""
        src = self.buffer
        dst = self._new_tensor() if dst is None else dst
        self.out.layers.append(layer)
        self.routes.append((src, src2, dst))
        self.views.append(at)
        self.buffer = dst

    def produced(self, t: int, layer: Layer, src2: int = -1, dst: int | None = None, at: tuple[int, int] = (0, 0)
                 ) -> None:
        self.emit(layer, src2, dst, at)
        self.cur, self.computed = t, True
        shape = self.graph.shape(t)
        self.phys = shape[1:] if len(shape) == 4 else (math.prod(shape),)
        self.where = np.arange(math.prod(shape)).reshape(shape)

    def _weights(self, op: _Op, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(weights, their scales, the int32 bias) of a convolution or fully connected layer."""
        w = self.graph.const(op.ins[1])
        s_w, zp_w = self.graph.quant(op.ins[1])
        if np.any(zp_w != 0):
            raise IntModelError(f"{op.here}: weights with a zero point; TFLite's int8 weights are symmetric")
        bias = (self.graph.const(op.ins[2]).astype(np.int32) if len(op.ins) > 2 and op.ins[2] >= 0
                else np.zeros(n_out, np.int32))
        return w, s_w, bias

    # ---- operators that move no data ----

    def _reshape(self, op: _Op) -> None:
        self.where = self.where.reshape(self.graph.shape(op.outs[0]))
        self.cur = op.outs[0]

    def _transpose(self, op: _Op) -> None:
        self.where = np.transpose(self.where, self.graph.const(op.ins[1]).astype(int).tolist())
        self.cur = op.outs[0]

    def _pad(self, op: _Op) -> None:
        graph, ins, outs = self.graph, op.ins, op.outs
        paddings = graph.const(ins[1]).astype(int)
        s_in, zp_in = graph.act(ins[0])
        s_out, zp_out = graph.act(outs[0])
        value = int(graph.const(ins[2]).reshape(-1)[0]) if op.kind == "PADV2" else zp_in
        if value not in (zp_in, -128):
            raise IntModelError(f"{op.here}: pads with {value}; only the zero point (zero padding, before a convolution) "
                                "or -128 (before a max pool) folds")
        if paddings.shape != (4, 2) or paddings[0].any() or paddings[3].any() or (s_in, zp_in) != (s_out, zp_out):
            raise IntModelError(f"{op.here}: only spatial zero padding of an NHWC tensor folds into the next conv")
        self.place(op, graph.shape(ins[0]))
        self.pad = (int(paddings[1][0]), int(paddings[1][1]), int(paddings[2][0]), int(paddings[2][1]))
        self.pad_value = value
        self.cur = outs[0]  # the buffer stays the unpadded tensor; the next conv pads

    # ---- layers ----

    def _conv(self, op: _Op) -> None:
        graph, ins, outs, opts, here, pad = self.graph, op.ins, op.outs, op.opts, op.here, self.pad
        padded = graph.shape(ins[0])  # SAME pads the conv's own input: the PAD's output, if any
        x_shape: tuple[int, ...] = (padded[0], padded[1] - pad[0] - pad[1], padded[2] - pad[2] - pad[3], padded[3])
        if pad == (0, 0, 0, 0):  # (a PAD placed its input already)
            self.place(op, x_shape)
        elif self.pad_value != graph.act(ins[0])[1]:
            raise IntModelError(f"{here}: follows a PAD with {self.pad_value}; a convolution folds only zero padding "
                                "(the zero point)")
        y_shape = graph.shape(outs[0])
        sh, sw, dh, dw = int(opts.strideH), int(opts.strideW), int(opts.dilationHFactor), int(opts.dilationWFactor)
        if min(sh, sw, dh, dw) < 1:
            raise IntModelError(f"{here}: strides {sh} x {sw} and dilation {dh} x {dw} must be at least 1")
        s_x, zp_x = graph.act(ins[0])
        s_y, zp_y = graph.act(outs[0])
        n_out = y_shape[3]
        w, s_w, bias = self._weights(op, n_out)
        kh, kw = (w.shape[1], w.shape[2])
        if op.kind == "CONV_2D" and w.shape[3] != x_shape[3]:
            raise IntModelError(f"{here}: {w.shape[3]} weight channels for {x_shape[3]} input channels (a grouped "
                                "convolution has no firmware kernel)")
        same = opts.padding == graph.schema.Padding.SAME
        ekh, ekw = (kh - 1) * dh + 1, (kw - 1) * dw + 1  # a dilated window's extent
        top = pad[0] + (_same_pad(padded[1], ekh, sh, y_shape[1]) if same else 0)
        left = pad[2] + (_same_pad(padded[2], ekw, sw, y_shape[2]) if same else 0)
        if (top >= ekh or left >= ekw or (y_shape[1] - 1) * sh - top >= x_shape[1]
                or (y_shape[2] - 1) * sw - left >= x_shape[2]):
            raise IntModelError(f"{here}: padding wider than the kernel (some outputs see only padding); the "
                                "firmware's convolutions take at most kernel - 1")
        scales = np.broadcast_to(s_w, (n_out,))
        m0, shift = zip(*(quantize_multiplier(float(np.float64(s_x) * np.float64(sw) / np.float64(s_y)))
                          for sw in scales))
        act_min, act_max = _activation_range(opts.fusedActivationFunction, s_y, zp_y, here)
        common = dict(bias=bias, multiplier=np.array(m0, np.int32), shift=np.array(shift, np.int32),
                      input_offset=-zp_x, output_offset=zp_y, act_min=act_min, act_max=act_max,
                      stride=sw, stride_h=sh, dilation=dw, dilation_h=dh, in_shape=(x_shape[3], x_shape[1], x_shape[2]),
                      out_shape=(n_out, y_shape[1], y_shape[2]))
        if op.kind == "CONV_2D" or x_shape[3] == 1:  # a depthwise conv of one input channel is a conv
            oihw = (0, 3, 1, 2) if op.kind == "CONV_2D" else (3, 0, 1, 2)  # OHWI, or (1, kh, kw, cout)
            layer: Layer = ConvLayer(weight=np.ascontiguousarray(np.transpose(w, oihw)), padding=left,
                                     padding_h=top, **common)  # type: ignore[arg-type]
        else:
            if n_out % x_shape[3]:
                raise IntModelError(f"{here}: {n_out} output channels for {x_shape[3]} input channels")
            layer = DepthwiseLayer(weight=np.ascontiguousarray(w[0]), padding=left, padding_h=top,
                                   **common)  # type: ignore[arg-type]
        self.pad = (0, 0, 0, 0)
        self.produced(outs[0], layer)

    def _pool(self, op: _Op) -> None:
        """AVERAGE_POOL_2D, MAX_POOL_2D; a max pool after a PAD of -128 (what litert-torch writes for
        ``MaxPool2d(padding=p)``) takes the padding itself: -128 never wins a maximum, and every window
        keeps a value of the input, so ignoring the padded taps gives TFLite's result."""
        graph, ins, outs, opts, here, pad = self.graph, op.ins, op.outs, op.opts, op.here, self.pad
        padded, y_shape = graph.shape(ins[0]), graph.shape(outs[0])
        x_shape = (padded[0], padded[1] - pad[0] - pad[1], padded[2] - pad[2] - pad[3], padded[3])
        if pad == (0, 0, 0, 0):
            self.place(op, x_shape)
        elif self.pad_value != -128:
            raise IntModelError(f"{here}: follows a PAD with {self.pad_value}; a max pool folds only -128")
        if graph.act(ins[0]) != graph.act(outs[0]):
            raise IntModelError(f"{here}: input and output quantized differently; TFLite pools keep the scale")
        same = opts.padding == graph.schema.Padding.SAME
        fh, fw, sh, sw = int(opts.filterHeight), int(opts.filterWidth), int(opts.strideH), int(opts.strideW)
        top = pad[0] + (_same_pad(padded[1], fh, sh, y_shape[1]) if same else 0)
        left = pad[2] + (_same_pad(padded[2], fw, sw, y_shape[2]) if same else 0)
        if top >= fh or left >= fw or (y_shape[1] - 1) * sh - top >= x_shape[1] or (y_shape[2] - 1) * sw - left >= x_shape[2]:
            raise IntModelError(f"{here}: padding as wide as the window (some windows see only padding)")
        s_y, zp_y = graph.act(outs[0])
        act_min, act_max = _activation_range(opts.fusedActivationFunction, s_y, zp_y, here)
        self.pad = (0, 0, 0, 0)
        self.produced(outs[0], WindowPoolLayer(
            kind="avg" if op.kind == "AVERAGE_POOL_2D" else "max", kernel=(fh, fw), stride=sw, stride_h=sh,
            padding_h=top, padding=left, act_min=act_min, act_max=act_max,
            in_shape=(x_shape[3], x_shape[1], x_shape[2]), out_shape=(y_shape[3], y_shape[1], y_shape[2])))

    def _mean(self, op: _Op) -> None:
        graph, ins, outs, opts, here, where = self.graph, op.ins, op.outs, op.opts, op.here, self.where
        if not self.computed or len(self.phys) != 3:
            raise IntModelError(f"{here}: MEAN runs over the positions of a convolution's output only")
        h, w_, c = self.phys
        axes = sorted(int(a) % where.ndim for a in graph.const(ins[1]).reshape(-1))
        if opts is not None and opts.keepDims and where.ndim == 4 and axes == [1, 2]:
            raise IntModelError(f"{here}: MEAN keeping dims over axes 1, 2 (TFLite Micro's integer path) has "
                                "no firmware kernel; export it with keepdims=False")
        channels = self._positions(axes, here, "MEAN")
        s_x, zp_x = graph.act(ins[0])
        s_y, zp_y = graph.act(outs[0])
        if (s_x, zp_x) == (s_y, zp_y):
            raise IntModelError(f"{here}: a MEAN that keeps its scale (TFLite Micro divides integers there) has "
                                "no firmware kernel checked against it yet")
        # QuantizedMeanOrSum: 1/positions folded into the multiplier, as TFLite Micro does
        mult, right = quantize_multiplier(float(np.float64(s_x) / np.float64(s_y)))
        n = h * w_
        fold = min(n.bit_length() - 1, 32, 31 - right)
        self.emit(MeanLayer(multiplier=(mult << fold) // n, shift=right + fold, input_offset=-zp_x,
                            output_offset=zp_y, in_shape=(c, h, w_)))
        self.cur, self.phys = outs[0], (c,)
        self.where = channels.reshape(graph.shape(outs[0]))

    def _fully_connected(self, op: _Op) -> None:
        """FULLY_CONNECTED of one row (its columns in any order of the buffer, or a slice of it), or of
        rows one after another (a dense layer applied per time step: a GRU's or LSTM's input
        projection), as TFLite Micro computes it."""
        graph, ins, outs, opts, here = self.graph, op.ins, op.outs, op.opts, op.here
        n_out, n_in = graph.const(ins[1]).shape
        if self.where.size % n_in:
            raise IntModelError(f"{here}: {self.where.size} inputs for {n_in} weight columns")
        rows, order, base = self.where.size // n_in, self.where.reshape(-1), 0
        if not self.computed:
            self._gather(op, order)
            order = np.arange(n_in * rows)
        elif (start := _contiguous(order)) is not None:
            order, base = np.arange(n_in * rows), start  # in order, from ``start`` on: a slice or the whole buffer
        elif rows > 1 or sorted(order.tolist()) != list(range(math.prod(self.phys))):
            raise IntModelError(f"{here}: its input is not a slice of the buffer in order, nor a permutation of it")
        s_x, zp_x = graph.act(ins[0])
        s_y, zp_y = graph.act(outs[0])
        w, s_w, bias = self._weights(op, n_out)
        w_dev = np.empty_like(w)
        w_dev[:, order[:n_in]] = w  # column i reads buffer offset order[i]
        if s_w.size == 1:  # TFLite Micro's per-tensor path: the scales' product in float32, then double
            real = [float(np.float32(s_x) * s_w[0]) / float(s_y)] * n_out
        else:
            real = [float(np.float64(s_x) * np.float64(sw) / np.float64(s_y)) for sw in s_w]
        m0, shift = zip(*(quantize_multiplier(r) for r in real))
        act_min, act_max = _activation_range(opts.fusedActivationFunction, s_y, zp_y, here)
        self.produced(outs[0], FCLayer(weight=np.ascontiguousarray(w_dev), bias=bias, multiplier=np.array(m0, np.int32),
                                       shift=np.array(shift, np.int32), input_offset=-zp_x, output_offset=zp_y,
                                       act_min=act_min, act_max=act_max, output_scale=s_y, rows=rows), at=(base, 0))

    def _operand(self, op: _Op, t: int) -> tuple[int, int, tuple[int, ...]]:
        """(buffer, first byte, its buffer's shape) of a computed tensor lying in order in its buffer,
        whole or a slice of it: an operand of a value-by-value operator of two tensors."""
        if t not in self.values:
            raise IntModelError(f"{op.here}: reads {self.graph.name(t)!r}, which no operator the firmware runs has "
                                "computed")
        buffer, where, phys, computed = self.values[t]
        start = _contiguous(where.reshape(-1))
        if not computed or start is None:
            raise IntModelError(f"{op.here}: reads {self.graph.name(t)!r} as the model input or a transposed view; "
                                "it must read layers' outputs as they lie in the buffer")
        return buffer, start, phys

    def _two_operands(self, op: _Op, what: str) -> tuple[int, int, int, int, tuple[int, ...]]:
        """(buffer, first byte) of each operand of a value-by-value operator of two computed tensors of
        one size (shapes may differ by ones: [1, 8] and [1, 1, 8]), and the output's device shape."""
        graph, a, b = self.graph, op.ins[0], op.ins[1]
        shapes = [graph.shape(t) for t in (a, b, op.outs[0])]
        if len({math.prod(sh) for sh in shapes}) != 1:
            raise IntModelError(f"{op.here}: {what} shapes {list(shapes[0])} and {list(shapes[1])}; the firmware "
                                f"{what} two computed tensors of one size (no broadcasting)")
        (src, at, phys), (src2, at2, _) = self._operand(op, a), self._operand(op, b)
        whole = at == 0 and len(shapes[0]) == 4 and phys == shapes[0][1:] and shapes[0] == shapes[1] == shapes[2]
        return src, at, src2, at2, _device_shape(shapes[0]) if whole else (math.prod(shapes[0]),)

    def _add(self, op: _Op) -> None:
        """ADD (or SUB) of a constant: a table; of two computed tensors (a residual connection, a
        recurrent layer's gates): TFLite's quantized ADD (SUB), with Prepare's multipliers (add_common's
        CalculateOpDataAdd, sub_common's CalculateOpDataSub: the same)."""
        graph, here = self.graph, op.here
        a, b = op.ins[0], op.ins[1]
        if graph.has_data(a) or graph.has_data(b):
            self._lut(op)
            return
        subtract = op.kind == "SUB"
        src, at, src2, at2, shape = self._two_operands(op, "subtracts" if subtract else "adds")
        (s1, z1), (s2, z2), (s_y, z_y) = graph.act(a), graph.act(b), graph.act(op.outs[0])
        twice_max = 2.0 * max(s1, s2)  # the float32 scales, in double
        m1, sh1 = quantize_multiplier(s1 / twice_max)
        m2, sh2 = quantize_multiplier(s2 / twice_max)
        m_y, sh_y = quantize_multiplier(twice_max / ((1 << 20) * s_y))
        if min(sh1, sh2, sh_y) < 0:
            raise IntModelError(f"{here}: output scale {s_y} is too small for TFLite's ADD (its multiplier must be "
                                "below one)")
        act_min, act_max = _activation_range(op.opts.fusedActivationFunction, s_y, z_y, here)
        self.buffer = src
        self._produced_as(op.outs[0], shape, AddLayer(multiplier=(m1, m2, m_y), shift=(sh1, sh2, sh_y),
                                                      input_offset=-z1, input2_offset=-z2, output_offset=z_y,
                                                      act_min=act_min, act_max=act_max, shape=shape,
                                                      subtract=subtract),
                          src2=src2, at=(at, at2))

    def _mul(self, op: _Op) -> None:
        """MUL by a constant: a table; of two computed tensors (a recurrent layer's gate times its
        candidate or state): TFLite's quantized MUL, one multiplier s1 s2 / s_out (mul_common's
        CalculateOpDataMul, in double from the float32 scales)."""
        graph, here = self.graph, op.here
        a, b = op.ins[0], op.ins[1]
        if graph.has_data(a) or graph.has_data(b):
            self._lut(op)
            return
        src, at, src2, at2, shape = self._two_operands(op, "multiplies")
        (s1, z1), (s2, z2), (s_y, z_y) = graph.act(a), graph.act(b), graph.act(op.outs[0])
        m, sh = quantize_multiplier(float(np.float64(s1) * np.float64(s2) / np.float64(s_y)))
        act_min, act_max = _activation_range(op.opts.fusedActivationFunction if op.opts else 0, s_y, z_y, here)
        self.buffer = src
        self._produced_as(op.outs[0], shape, MulLayer(multiplier=m, shift=sh, input_offset=-z1, input2_offset=-z2,
                                                      output_offset=z_y, act_min=act_min, act_max=act_max, shape=shape),
                          src2=src2, at=(at, at2))

    def _produced_as(self, t: int, shape: tuple[int, ...], layer: Layer, src2: int, at: tuple[int, int]) -> None:
        """``layer`` wrote tensor ``t`` in order, its buffer of device shape ``shape`` ((C, H, W) or (N,))."""
        self.emit(layer, src2, at=at)
        self.cur, self.computed = t, True
        self.phys = (shape[1], shape[2], shape[0]) if len(shape) == 3 else shape
        self.where = np.arange(math.prod(shape)).reshape(self.graph.shape(t))

    def _slice(self, op: _Op) -> None:
        """SLICE moves no data: the tensor becomes a view of part of the buffer (a recurrent layer's
        time step or gate); the layer reading it reads there."""
        begin = self.graph.const(op.ins[1]).astype(int).reshape(-1).tolist()
        size = self.graph.const(op.ins[2]).astype(int).reshape(-1).tolist()
        dims = self.where.shape
        if len(begin) != len(dims) or len(size) != len(dims):
            raise IntModelError(f"{op.here}: begin {begin} and size {size} for a tensor of shape {list(dims)}")
        self.where = self.where[tuple(slice(b, d if n < 0 else b + n) for b, n, d in zip(begin, size, dims))]
        if self.where.shape != self.graph.shape(op.outs[0]):
            raise IntModelError(f"{op.here}: a slice of shape {list(self.where.shape)}, the model says "
                                f"{list(self.graph.shape(op.outs[0]))}")
        self.cur = op.outs[0]

    def _concat(self, op: _Op) -> None:
        """CONCATENATION along the buffers' channels of layers' outputs, one scale for all (TFLite's
        int8 rule): one copy layer per input into the output's buffer. The axis is the tensors' last
        in an NHWC graph, or any axis a view puts the buffers' channels on (a 1-D net's [1, C, L])."""
        graph, here = self.graph, op.here
        shape = graph.shape(op.outs[0])
        axis = int(op.opts.axis) % len(shape)
        if op.opts.fusedActivationFunction != 0:
            raise IntModelError(f"{here}: a fused activation on a CONCATENATION has no firmware kernel")
        q_y = graph.act(op.outs[0])
        for t in op.ins:
            if graph.act(t) != q_y:
                raise IntModelError(f"{here}: input {graph.name(t)!r} is quantized differently from the output; "
                                    "TFLite's int8 CONCATENATION takes one scale and zero point for all")
        if all(d == 1 for d in shape[:axis]) and all(self._in_order(t) for t in op.ins):
            self._concat_blocks(op, shape)  # each input one block of the output, one after another
            return
        views = [self._channel_view(op, t, axis) for t in op.ins]
        positions = views[0][1]
        if any(not np.array_equal(p, positions) for _, p, _ in views[1:]):
            raise IntModelError(f"{here}: its inputs lie in their buffers in different orders; the firmware "
                                "concatenates buffers position by position")
        dst = self._new_tensor()
        hw = views[0][2][:-1]
        channels = [phys[-1] for _, _, phys in views]
        c_out = sum(channels)
        layers = [ConcatLayer(channels=c, offset=sum(channels[:i]), out_channels=c_out,
                              positions=(hw[0], hw[1]) if len(hw) == 2 else (1, 1))
                  for i, c in enumerate(channels)]
        for (src, _, _), layer in zip(views, layers):
            self.buffer = src
            self.emit(layer, dst=dst)
        # the output as its own view of the new buffer: position p, channel c at p * c_out + c
        pos = np.expand_dims(positions, axis)
        where = np.concatenate([pos * c_out + (np.arange(c) + sum(channels[:i])).reshape(
            [c if d == axis else 1 for d in range(len(shape))]) for i, c in enumerate(channels)], axis=axis)
        self.cur, self.computed, self.where = op.outs[0], True, where
        self.phys = (*hw, c_out) if len(hw) == 2 else (c_out,)

    def _in_order(self, t: int) -> bool:
        """Whether computed tensor ``t`` lies in its buffer in its own order (whole, or a slice)."""
        return t in self.values and self.values[t][3] and _contiguous(self.values[t][1].reshape(-1)) is not None

    def _concat_blocks(self, op: _Op, shape: tuple[int, ...]) -> None:
        """A CONCATENATION whose inputs are consecutive blocks of its output (a recurrent layer's
        outputs stacked over time, NHWC tensors stacked along rows): each input, in order in its
        buffer, copied after the one before."""
        operands = [self._operand(op, t) for t in op.ins]
        sizes = [math.prod(self.graph.shape(t)) for t in op.ins]
        total = sum(sizes)
        dst = self._new_tensor()
        for (src, start, _), size, offset in zip(operands, sizes, np.cumsum([0, *sizes[:-1]])):
            self.buffer = src
            self.emit(ConcatLayer(channels=size, offset=int(offset), out_channels=total, positions=(1, 1)), dst=dst,
                      at=(start, 0))
        self.cur, self.computed = op.outs[0], True
        self.phys = shape[1:] if len(shape) == 4 else (total,)  # the output tensor itself, in order
        self.where = np.arange(total).reshape(shape)

    def _channel_view(self, op: _Op, t: int, axis: int) -> tuple[int, np.ndarray, tuple[int, ...]]:
        """(tensor id, the buffer position of each index along the other axes, the buffer's shape) of a
        computed tensor whose ``axis`` runs over its buffer's channels, in order."""
        if t not in self.values:
            raise IntModelError(f"{op.here}: reads {self.graph.name(t)!r}, which no operator the firmware runs has "
                                "computed")
        buffer, where, phys, computed = self.values[t]
        channels = phys[-1]
        if not computed:
            raise IntModelError(f"{op.here}: concatenates the model input; the firmware concatenates layers' outputs")
        if sorted(where.reshape(-1).tolist()) != list(range(math.prod(phys))):
            raise IntModelError(f"{op.here}: input {self.graph.name(t)!r} is not a whole buffer")
        moved = np.moveaxis(where, axis, -1)
        if moved.shape[-1] != channels or np.any(moved % channels != np.arange(channels)):
            raise IntModelError(f"{op.here}: concatenates along axis {axis} of {list(self.graph.shape(t))}, which is "
                                "neither the buffers' channels nor their outermost axis (a concatenation along the "
                                "columns of an image has no firmware kernel; concatenate along channels or rows)")
        return buffer, moved[..., 0] // channels, phys

    def _lut(self, op: _Op) -> None:
        """An elementwise int8 operator of the current tensor and constants: its 256 outputs per
        channel, computed by TFLite Micro on the operator alone (``lut_tables``)."""
        self._tabulate(op, [op.k], op.kind)

    def _elementwise(self, k: int, here: str, running: int) -> list[np.ndarray]:
        """The constant operands of operator ``k``, which maps ``running`` value by value, each
        broadcast to its shape; raises for a residual connection or a shape the op changes."""
        graph, op = self.graph, self.g.operators[k]
        others = [int(t) for t in op.inputs if t >= 0 and int(t) != running]
        if running not in [int(t) for t in op.inputs]:
            raise IntModelError(f"{here}: does not read the previous operator's output; only chains are supported")
        for t in others:
            if not graph.has_data(t):
                raise IntModelError(f"{here}: both operands are computed tensors; the firmware adds two tensors "
                                    "(ADD) but has no kernel for another operator of two (one operand must be a "
                                    "constant)")
        x_shape, y_shape = graph.shape(running), graph.shape(int(op.outputs[0]))
        if math.prod(x_shape) != math.prod(y_shape):  # [1, 8] + a [1, 1, 8] constant is [1, 1, 8]: the same values
            raise IntModelError(f"{here}: output shape {list(y_shape)} differs from the input's {list(x_shape)}; only "
                                "value-by-value operators become a table")
        constants = []
        for t in others:
            try:
                constants.append(np.broadcast_to(graph.const(t), y_shape).reshape(x_shape))
            except ValueError:
                raise IntModelError(f"{here}: a constant of shape {list(graph.shape(t))} does not broadcast to the "
                                    f"input's {list(x_shape)}") from None
        return constants

    def _tabulate(self, op: _Op, ops: list[int], name: str) -> None:
        """Operators ``ops`` (a chain from the current int8 tensor to ``op``'s last output, int8) as one
        table, or one per channel of the device's buffer where a constant differs by channel (a
        BatchNorm left as MUL and ADD, on any axis the view puts the buffer's channels: a 1-D net's
        [1, C, 1]). The buffer keeps its layout: the output is the input's view, value by value."""
        graph, here = self.graph, op.here
        running, constants = self.cur, []
        for k in ops:
            constants += self._elementwise(k, here, running)
            running = int(self.g.operators[k].outputs[0])
        graph.act(self.cur)
        graph.act(running)
        if not self.computed:
            raise IntModelError(f"{here}: an elementwise operator on the model's input; put it after a layer")
        at, base, view, phys = self.where.reshape(-1), 0, self.where, self.phys
        if sorted(at.tolist()) != list(range(math.prod(self.phys))):
            start = _contiguous(at)
            if start is None:
                raise IntModelError(f"{here}: its input is part of a buffer out of order (a strided slice or a repeat)")
            # a slice in order: a vector of its own, written to a new tensor
            at, base, phys = at - start, start, (at.size,)
            view = self.where - start
        channels = phys[-1]
        channel = at % channels  # the buffer channel of each value of the tensor, in the tensor's order
        pick = np.zeros(1, np.int64)  # one table for all
        if any(np.any(c != c.reshape(-1)[0]) for c in constants):
            pick = np.full(channels, -1, np.int64)
            pick[channel[::-1]] = np.arange(len(at))[::-1]  # the first value of each channel
            for c in constants:
                flat = c.reshape(-1)
                if np.any(flat != flat[pick][channel]):
                    raise IntModelError(f"{here}: a constant that differs along positions, not only by channel; the "
                                        "firmware's tables are one per channel")
        table = lut_tables(self.graph.data, ops, pick)
        shape = (phys[2], phys[0], phys[1]) if len(phys) == 3 else phys
        self.emit(LutLayer(op=name, table=table, shape=shape), at=(base, 0))
        self.cur, self.computed, self.where, self.phys = running, True, view.reshape(graph.shape(running)), phys

    def _float_island(self, k: int, here: str) -> int:
        """DEQUANTIZE, float operators value by value, QUANTIZE (what a quantizer leaves of an operator it
        has no int8 kernel for, e.g. LEAKY_RELU): one table of the island, computed by TFLite Micro on
        it. Returns the QUANTIZE's index."""
        g = self.g
        for j in range(k + 1, len(g.operators)):
            if self.names[j] == "QUANTIZE":
                out = int(g.operators[j].outputs[0])
                if g.tensors[out].type != self.graph.schema.TensorType.INT8:
                    raise IntModelError(f"{here}: the float island ends in a QUANTIZE to another type than int8")
                inner = [self.names[i] for i in range(k + 1, j)]
                op = _Op(k, "DEQUANTIZE", [int(t) for t in g.operators[k].inputs], [out], None, here)
                if inner == ["REDUCE_MAX"]:
                    self._reduce_max_island(op, k, j)
                    return j
                self._tabulate(op, list(range(k, j + 1)), "+".join(["DEQUANTIZE", *inner, "QUANTIZE"]))
                return j
        raise IntModelError(f"{here}: a DEQUANTIZE with no QUANTIZE after it: the firmware's layers are int8 to the end")

    def _positions(self, axes: list[int], here: str, what: str) -> np.ndarray:
        """The current tensor's channel of each output of a reduction over ``axes``, after checking
        the reduction runs over every position of the channels-last buffer."""
        where = self.where
        if not self.computed or len(self.phys) != 3:
            raise IntModelError(f"{here}: {what} runs over the positions of a convolution's output only")
        h, w_, c = self.phys
        rows = np.moveaxis(where, axes, list(range(where.ndim - len(axes), where.ndim)))
        rows = rows.reshape(-1, math.prod(where.shape[a] for a in axes))
        channel = rows % c
        if (rows.shape[1] != h * w_ or np.any(channel != channel[:, :1])
                or not np.array_equal(np.sort(rows // c, axis=1), np.broadcast_to(np.arange(h * w_), rows.shape))):
            raise IntModelError(f"{here}: {what} over axes {axes} is not over all positions")
        return channel[:, 0]

    def _reduce_max_island(self, op: _Op, k: int, j: int) -> None:
        """DEQUANTIZE, REDUCE_MAX over all positions, QUANTIZE (the quantizer leaves REDUCE_MAX in
        float): the maximum commutes with DEQUANTIZE (a positive scale), so the firmware takes the
        int8 maximum (a max pool over the whole plane), then the table of QUANTIZE(DEQUANTIZE(v)),
        which TFLite Micro computes on the island fed constant planes."""
        graph, here, g = self.graph, op.here, self.g
        reduce = g.operators[k + 1]
        axes = sorted(int(a) % self.where.ndim for a in graph.const(int(reduce.inputs[1])).reshape(-1))
        channel = self._positions(axes, here, "REDUCE_MAX")
        h, w_, c = self.phys
        if h > 255 or w_ > 255:
            raise IntModelError(f"{here}: a {h} x {w_} plane; the firmware's windows span at most 255 x 255")
        if not np.array_equal(channel, np.arange(c)):
            raise IntModelError(f"{here}: REDUCE_MAX's output channels are not in the buffer's order")
        graph.act(self.cur)
        graph.act(op.outs[0])
        self.emit(WindowPoolLayer(kind="max", kernel=(h, w_), stride=1, padding_h=0, padding=0,
                                  act_min=-128, act_max=127, in_shape=(c, h, w_), out_shape=(c, 1, 1)))
        table = lut_tables(self.graph.data, [k, k + 1, j], np.zeros(1, np.int64))
        self.emit(LutLayer(op="DEQUANTIZE+REDUCE_MAX+QUANTIZE", table=table, shape=(c, 1, 1)))
        self.cur, self.phys = op.outs[0], (c,)
        self.where = np.arange(c).reshape(graph.shape(op.outs[0]))

    HANDLERS: ClassVar[dict[str, Callable[[_Lowering, _Op], None]]] = {
        "RESHAPE": _reshape, "SQUEEZE": _reshape, "TRANSPOSE": _transpose, "PAD": _pad, "PADV2": _pad,
        "CONV_2D": _conv, "DEPTHWISE_CONV_2D": _conv, "AVERAGE_POOL_2D": _pool, "MAX_POOL_2D": _pool,
        "MEAN": _mean, "FULLY_CONNECTED": _fully_connected,
        **dict.fromkeys(LUT_OPS, _lut), "ADD": _add, "SUB": _add, "MUL": _mul, "CONCATENATION": _concat, "SLICE": _slice,
    }


def lut_tables(data: bytes, ks: list[int], pick: np.ndarray) -> np.ndarray:
    """The int8 outputs of operators ``ks`` (a chain) for each int8 input value, (tables, 256): the
    model cut down to those operators alone (their constants kept) and run by TFLite Micro on every
    value, so the firmware's lookup is TFLite Micro's own arithmetic (its LOGISTIC and TANH
    approximations, ADD's and MUL's rescaling, a float island's DEQUANTIZE and QUANTIZE) bit for
    bit. Table i is the output at flat index ``pick[i]`` of the input tensor (one table: [0]; one
    per channel: a value of each channel)."""
    import flatbuffers

    try:
        from tflite_micro.python.tflite_micro import runtime
    except ImportError:
        raise TfliteImportError("elementwise operators need tflite-micro to tabulate: pip install 'trickle[export]'") from None
    model = read_model(data)
    g = model.subgraphs[0]
    ops = [g.operators[k] for k in ks]
    graph = _Graph(model, data)
    x = next(int(t) for t in ops[0].inputs if t >= 0 and not graph.has_data(int(t)))
    g.operators, g.inputs, g.outputs = ops, np.array([x], np.int32), np.array([int(ops[-1].outputs[0])], np.int32)
    builder = flatbuffers.Builder(len(data) + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    interpreter = runtime.Interpreter.from_bytes(bytes(builder.Output()))
    shape = graph.shape(x)
    table = np.zeros((len(pick), 256), np.int8)
    for v in range(-128, 128):
        interpreter.set_input(np.full(shape, v, np.int8), 0)
        interpreter.invoke()
        table[:, v + 128] = np.asarray(interpreter.get_output(0)).reshape(-1)[pick]
    return table



def logits_model(data: bytes) -> bytes:
    """The flatbuffer without a last SOFTMAX (its output is then the tensor before it), so TFLite
    Micro's outputs are the ones the firmware computes."""
    import flatbuffers

    model = read_model(data)
    g = model.subgraphs[0]
    if not g.operators or op_names(model)[-1] != "SOFTMAX" or int(g.operators[-1].outputs[0]) != int(g.outputs[0]):
        return data
    last = g.operators.pop()
    g.outputs = np.array([int(last.inputs[0])], dtype=np.int32)
    builder = flatbuffers.Builder(len(data) + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


@contextlib.contextmanager
def _native_stdout() -> Iterator[list[str]]:
    """What C code prints to the process's standard output and error meanwhile (TFLite Micro's
    MicroPrintf), kept from the terminal: the list holds it once the block ends."""
    import ctypes
    import os
    import tempfile

    said: list[str] = []
    with tempfile.TemporaryFile() as sink:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield said
        finally:
            ctypes.CDLL(None).fflush(None)
            for fd, kept in zip((1, 2), saved):
                os.dup2(kept, fd)
                os.close(kept)
            sink.seek(0)
            said.append(sink.read().decode(errors="replace"))


def tflm_interpreter(data: bytes) -> Any:
    """TFLite Micro's interpreter of ``data``, or one TfliteImportError saying why it cannot run it."""
    try:
        from tflite_micro.python.tflite_micro import runtime
    except ImportError:
        raise TfliteImportError("checking against TFLite Micro needs tflite-micro: pip install 'trickle[export]'") from None
    try:
        with _native_stdout() as said:
            return runtime.Interpreter.from_bytes(data)
    except RuntimeError as e:
        model = read_model(data)
        wide = [f"{name} of {len(op.inputs)} inputs" for name, op in zip(op_names(model), model.subgraphs[0].operators)
                if name == "CONCATENATION" and len(op.inputs) > 10]
        why = f" (its {wide[0]}: TFLite Micro's CONCATENATION takes at most 10)" if wide else ""
        printed = " ".join("".join(said).split())
        raise TfliteImportError(f"TFLite Micro cannot run the model{why}: {str(e).strip()}"
                                + (f" ({printed})" if printed else "")) from None


def tflm_outputs(data: bytes, x_q: np.ndarray, full: bool = False) -> np.ndarray:
    """TFLite Micro's int8 outputs (as int32), one row per int8 input, of the model the firmware runs
    (``full``: of the whole model, a last SOFTMAX included)."""
    interpreter = tflm_interpreter(data if full else logits_model(data))
    rows = []
    for x in x_q:
        interpreter.set_input(x[None], 0)
        interpreter.invoke()
        rows.append(np.asarray(interpreter.get_output(0)).reshape(-1).astype(np.int32))
    return np.stack(rows)


def tflm_planned_bytes(data: bytes) -> int:
    """The bytes TFLite Micro's own planner gives the model's tensors and scratch buffers: the head of
    its arena, as its recording allocator reports it (``print_allocations``, read from the process's
    standard output). The anchor ``export.firmware.plan``'s arena is measured against."""
    import re

    interpreter = tflm_interpreter(data)
    with _native_stdout() as said:
        interpreter.print_allocations()
    text = "".join(said)
    found = re.search(r"Arena allocation head (\d+) bytes", text)
    if found is None:
        raise TfliteImportError(f"TFLite Micro did not report its arena: {text[-300:]!r}")
    return int(found.group(1))


def _macs(data: bytes) -> list[dict[str, Any]]:
    """MACs, parameters and outputs of every CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED."""
    model = read_model(data)
    graph = _Graph(model, data)
    layers = []
    for k, (op, kind) in enumerate(zip(graph.g.operators, op_names(model))):
        if kind not in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            continue
        y = graph.shape(int(op.outputs[0]))
        w = graph.shape(int(op.inputs[1]))
        per_output = math.prod(w[1:]) if kind == "CONV_2D" else (w[1] * w[2] if kind == "DEPTHWISE_CONV_2D" else w[1])
        bias = math.prod(graph.shape(int(op.inputs[2]))) if len(op.inputs) > 2 and op.inputs[2] >= 0 else 0
        layers.append({"name": f"{kind.lower()}{k}", "macs": int(math.prod(y) * per_output),
                       "param_bytes": int(math.prod(w) + 4 * bias), "outputs": int(math.prod(y))})
    if not layers:
        raise TfliteImportError("the model has no CONV_2D, DEPTHWISE_CONV_2D or FULLY_CONNECTED: nothing to price")
    return layers


def import_tflite(model_path: Path, examples: Path, out: Path, labels: list[str] | None = None,
                  key: Path | None = None, as_tar: bool = False, bundle_version: int = 1, vectors: int = 16,
                  progress: Callable[[str], None] | None = None) -> Path:
    """Write the bundle of the int8 TFLite classifier at ``model_path``; returns its path."""
    from edge import __version__
    from edge.classify.backends import BackendError, LiteRtBackend
    from export.onnx_import import _calibration, class_names

    data = model_path.read_bytes()
    model = read_model(data)
    graph = _Graph(model, data)
    g = graph.g
    if len(g.inputs) != 1 or len(g.outputs) != 1:
        raise TfliteImportError(f"{model_path}: needs one input and one output (has {len(g.inputs)} and {len(g.outputs)})")
    for role, t in (("input", int(g.inputs[0])), ("output", int(g.outputs[0]))):
        if g.tensors[t].type != graph.schema.TensorType.INT8:
            raise TfliteImportError(f"{model_path}: the {role} is not int8; a fully-int8 model (int8 input and output, "
                                    "e.g. ai-edge-quantizer's static int8 recipe) is needed")
    in_shape = list(graph.shape(int(g.inputs[0])))
    if in_shape[0] != 1:
        raise TfliteImportError(f"{model_path}: input shape {in_shape}; the batch (first) dimension must be 1")
    x, y = _calibration(examples, in_shape[1:])
    layers = _macs(data)
    from edge.classify.backends import quantize_tflite

    scale, zp = graph.act(int(g.inputs[0]))
    x_q = quantize_tflite(x, scale, zp)
    # LiteRT (what a Linux device runs) and TFLite Micro (what the firmware is checked against): a model
    # one of them cannot load is still imported with the other as its oracle, and says so
    try:
        backend = LiteRtBackend(data)
        lite_error = None
    except BackendError as e:
        backend, lite_error = None, str(e)
    try:
        reference = tflm_outputs(data, x_q)
        micro_error = None
    except TfliteImportError as e:
        reference, micro_error = None, str(e)
    if backend is None and reference is None:
        raise TfliteImportError(f"{model_path}: neither LiteRT ({lite_error}) nor TFLite Micro ({micro_error}) runs it")
    if backend is not None:
        logits = np.concatenate([backend.run(x[i : i + 1]) for i in range(len(x))])
    else:  # an older converter's model: TFLite Micro's own outputs, dequantized, stand for LiteRT's
        out_scale, out_zp = graph.act(int(g.outputs[0]))
        logits = ((tflm_outputs(data, x_q, full=True) - out_zp) * out_scale).astype(np.float32)
    names = class_names(model_path, logits, labels, TfliteImportError)
    n_classes = len(names)
    if backend is not None and reference is not None:  # LiteRT's optimized kernels against TFLM's reference ones
        agreement = float((reference.argmax(1) == logits.argmax(1)).mean())
        if agreement < MIN_AGREEMENT:
            raise TfliteImportError(f"{model_path}: LiteRT and TFLite Micro agree on the top class of {agreement:.1%} "
                                    f"of the examples (need {MIN_AGREEMENT:.0%})")
        said = f"LiteRT and TFLite Micro agree on the top class of {agreement:.1%} of {len(x)} examples"
    elif backend is None:
        said = (f"LiteRT cannot load it ({lite_error}); TFLite Micro alone is its oracle (a device running LiteRT "
                "cannot run this bundle; trickle flash can)")
    else:
        said = f"{micro_error}; LiteRT runs it (trickle flash cannot: the firmware is checked against TFLite Micro)"
    if progress:
        progress(f"int8 model read; {said}")
    n = min(vectors, len(x))
    truth = y if y is not None else logits.argmax(1)
    files = {"int8-d00.tflite": data,
             VECTORS_FILE: TestVectors(x[:n], truth[:n], {"int8-d00": logits[:n]}, x[:n]).to_bytes()}
    macs = sum(la["macs"] for la in layers)
    doc = {
        "schema_version": SCHEMA_VERSION, "model": model_path.stem, "task": model_path.stem, "labels": names,
        "inputs": [{"name": "x", "shape": in_shape, "dtype": "float32"}],
        "outputs": [{"name": "logits", "shape": [1, n_classes], "dtype": "float32"}],
        "preprocessing": {"description": f"the model's input as given ({model_path.name}, imported)",
                          "raw": {"shape": in_shape[1:], "dtype": "float32"}, "steps": []},
        "variants": [{"name": "int8-d00", "bits": 8, "drop": 0.0, "formats": {"tflite-int8": "int8-d00.tflite"},
                      "energy_j": {m: p.compute_energy_j(macs) for m, p in MCUS.items()},
                      "accuracy": {} if y is None else {"tflite-int8": float((logits.argmax(1) == y).mean())},
                      "layers": layers}],
        "creator": f"trickle {__version__}", "bundle_version": bundle_version,
        "test_vectors": {"file": VECTORS_FILE, "count": n},
    }
    members = pack(doc, files, load_private_key(key) if key else None)
    return write_bundle(members, out.with_suffix(".tar") if as_tar else out)
