"""A bundle's int8 QDQ variant as an integer-only model: what the firmware computes, bit for bit.

The QDQ graph (brevitas QCDQ: QuantizeLinear → DequantizeLinear → float Conv → Relu →
QuantizeLinear ...) is read back into integer layers with TFLite/CMSIS-NN arithmetic:

- activations are int8 with a zero point (a ReLU's uint8 q is stored as q - 128);
- a conv accumulates (x + input_offset) * w in int32, adds an int32 bias
  (round(bias / (s_x * s_w))), and requantizes with a Q31 multiplier and a right shift:
  RoundingDivideByPOT(SaturatingRoundingDoublingHighMul(acc, m0), shift) + output zero point,
  clamped to the activation's range (the ReLU);
- ordered dropout's channel rescale is folded into the next layer's input scale, and the
  dropped channels are removed (the device computes only the kept ones);
- the global average pool is an int32 sum; its 1/N goes into the classifier's scale;
- the classifier writes int32 logits (``logit_scale`` turns them into the float logits).

``integer_onnx`` writes the same integer model as an ONNX graph of exact operations (float Conv
on integer values below 2^24, int64 arithmetic for the requantization) so onnxruntime is the
independent executor the firmware is checked against.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from edge.core.errors import BundleError

Q31 = 1 << 31
EXACT_FLOAT_SUM = 1 << 24  # below this, float32 sums of integers are exact in any order


class IntModelError(BundleError):
    """A graph this reader does not know, or one whose integers would overflow."""


@dataclass
class ConvLayer:
    """An int8 convolution as the firmware runs it: weights, int32 bias, per-channel requantization,
    offsets, clamp and geometry."""

    weight: np.ndarray  # int8 (out, in, *kernel): kernel 1-D (conv1d) or 2-D (conv2d)
    bias: np.ndarray  # int32 (out,)
    multiplier: np.ndarray  # int32 Q31 (out,)
    shift: np.ndarray  # int32 right shift (out,), >= 0
    input_offset: int  # added to every input value (= -input zero point)
    output_offset: int  # the output zero point
    act_min: int
    act_max: int
    stride: int
    padding: int  # columns on the left (and rows on top for a 2-D conv, unless padding_h says otherwise)
    in_shape: tuple[int, ...]  # (C, L) or (C, H, W)
    out_shape: tuple[int, ...]
    padding_h: int | None = None  # rows on top, when they differ from the columns (TFLite's SAME, PAD)
    stride_h: int | None = None  # rows between windows, when they differ from the columns' stride
    dilation: int = 1  # columns between a window's taps
    dilation_h: int = 1  # rows between a window's taps

    @property
    def macs(self) -> int:
        return int(math.prod(self.out_shape) * math.prod(self.weight.shape[1:]))


@dataclass
class DepthwiseLayer:  # TFLite's DEPTHWISE_CONV_2D: output channel o reads input channel o // multiplier
    """An int8 depthwise convolution (TFLite's DEPTHWISE_CONV_2D), requantized per channel."""

    weight: np.ndarray  # int8 (kh, kw, out), TFLite's layout
    bias: np.ndarray  # int32 (out,)
    multiplier: np.ndarray  # int32 Q31 (out,)
    shift: np.ndarray  # int32 (out,): a right shift, negative for a left one
    input_offset: int
    output_offset: int
    act_min: int
    act_max: int
    stride: int  # columns between windows
    padding_h: int
    padding: int
    in_shape: tuple[int, ...]  # (C, H, W)
    out_shape: tuple[int, ...]
    stride_h: int | None = None  # rows between windows, when they differ from the columns'
    dilation: int = 1  # columns between a window's taps
    dilation_h: int = 1  # rows between a window's taps

    @property
    def macs(self) -> int:
        return int(math.prod(self.out_shape) * self.weight.shape[0] * self.weight.shape[1])


@dataclass
class WindowPoolLayer:  # TFLite's AVERAGE_POOL_2D / MAX_POOL_2D: same scale in and out
    """An int8 average or max pool over windows, same scale in and out (TFLite's pools)."""

    kind: str  # "avg" or "max"
    kernel: tuple[int, int]
    stride: int  # columns between windows
    padding_h: int
    padding: int
    act_min: int
    act_max: int
    in_shape: tuple[int, ...]  # (C, H, W)
    out_shape: tuple[int, ...]
    stride_h: int | None = None  # rows between windows, when they differ from the columns'

    @property
    def macs(self) -> int:
        return 0  # no multiply-accumulates: its work is counted as instructions only (MACs: conv, depthwise, FC)


@dataclass
class MeanLayer:  # TFLite Micro's MEAN over all positions
    """An int8 mean over all positions with 1/positions folded into the multiplier (TFLite Micro's
    MEAN)."""

    multiplier: int  # Q31, 1/positions folded in
    shift: int  # a right shift, negative for a left one
    input_offset: int
    output_offset: int
    in_shape: tuple[int, ...]  # (C, H, W)

    @property
    def macs(self) -> int:
        return 0  # no multiply-accumulates: its work is counted as instructions only (MACs: conv, depthwise, FC)


@dataclass
class FCLayer:  # TFLite's FULLY_CONNECTED, int8 in and out; the last one's outputs are the logits
    """An int8 fully connected layer, requantized (TFLite's); the last one's outputs are the logits."""

    weight: np.ndarray  # int8 (out, in), columns in the order of the firmware's buffer
    bias: np.ndarray  # int32 (out,)
    multiplier: np.ndarray  # int32 Q31 (out,)
    shift: np.ndarray  # int32 (out,)
    input_offset: int
    output_offset: int
    act_min: int
    act_max: int
    output_scale: float  # float logits = (int8 output - output_offset) * output_scale
    rows: int = 1  # rows of inputs, each multiplied by the weights (a dense layer applied per time step)

    @property
    def macs(self) -> int:
        return int(self.weight.size) * self.rows




@dataclass
class PoolLayer:  # global sum over positions of (x + input_offset), int32
    """The trained models' global sum over positions: int8 in, int32 out."""

    input_offset: int
    in_shape: tuple[int, ...]

    @property
    def macs(self) -> int:
        return 0  # no multiply-accumulates: its work is counted as instructions only (MACs: conv, depthwise, FC)


@dataclass
class DenseLayer:  # int32 logits = bias + W @ x, x int32
    """The trained models' classifier: int32 pooled sums in, int32 logits out."""

    weight: np.ndarray  # int8 (out, in)
    bias: np.ndarray  # int32 (out,)
    logit_scale: float  # float logits = int32 logits * logit_scale

    @property
    def macs(self) -> int:
        return int(self.weight.size)


@dataclass
class LutLayer:  # int8 -> int8, value by value: LOGISTIC, TANH, ADD/SUB/MUL with a constant, QUANTIZE
    """An elementwise int8 operator as a table of its 256 outputs, one table, or one per channel
    (channels last) when a constant operand differs by channel (a BatchNorm left as MUL and ADD)."""

    op: str  # the TFLite operator it stands for
    table: np.ndarray  # int8 (tables, 256): table[c, x + 128]
    shape: tuple[int, ...]  # (C, H, W), or (N,) after a vector layer

    @property
    def macs(self) -> int:
        return 0


@dataclass
class AddLayer:  # TFLite's quantized ADD (or SUB) of two computed tensors of one shape (a residual connection)
    """An int8 ADD (or SUB) of two tensors as TFLite computes it: each input's offset added and shifted left
    by 20, rescaled by its own multiplier, the sum (or difference) requantized by a third
    (``multiplier``/``shift``: inputs 1 and 2, then the output), clamped."""

    multiplier: tuple[int, int, int]  # Q31
    shift: tuple[int, int, int]  # right shifts
    input_offset: int
    input2_offset: int
    output_offset: int
    act_min: int
    act_max: int
    shape: tuple[int, ...]  # (C, H, W), or (N,) after a vector layer
    subtract: bool = False  # TFLite's SUB: the second input's rescaled value subtracted

    @property
    def macs(self) -> int:
        return 0


@dataclass
class MulLayer:  # TFLite's quantized MUL of two computed tensors of one size (a recurrent layer's gates)
    """An int8 product of two tensors as TFLite computes it: (x1 + offset1) (x2 + offset2), requantized
    by one multiplier (s1 s2 / s_out), plus the output zero point, clamped."""

    multiplier: int  # Q31
    shift: int  # a right shift, negative for a left one
    input_offset: int
    input2_offset: int
    output_offset: int
    act_min: int
    act_max: int
    shape: tuple[int, ...]  # (C, H, W), or (N,)

    @property
    def macs(self) -> int:
        return 0  # no multiply-accumulates: its work is counted as instructions only (MACs: conv, depthwise, FC)


@dataclass
class ConcatLayer:  # one input of TFLite's CONCATENATION along channels (int8: one scale for all)
    """One input's channels copied into channels ``offset`` ... of the concatenation's output."""

    channels: int  # this input's
    offset: int  # its first channel in the output
    out_channels: int
    positions: tuple[int, int]  # (H, W)

    @property
    def macs(self) -> int:
        return 0


Layer = (ConvLayer | PoolLayer | DenseLayer | DepthwiseLayer | WindowPoolLayer | MeanLayer | FCLayer | LutLayer
         | AddLayer | MulLayer | ConcatLayer)


@dataclass
class IntModel:
    """A network as the firmware computes it: the input's quantization and layout, then integer layers."""

    input_scale: float  # int8 input = clamp(round(x / input_scale) + input_zero_point, -128, 127)
    input_shape: tuple[int, ...]
    layers: list[Layer] = field(default_factory=list)
    input_zero_point: int = 0  # nonzero: a TFLite model, rounding half away from zero as TFLite's Quantize
    # where each value of the firmware's input buffer comes from in the flattened model input; None:
    # channels-first in, channels-last on the device
    input_gather: np.ndarray | None = None
    # the tensors each layer reads and writes, (src, src2, dst) ids with -1 for no second input, the
    # model input 0 (export.firmware.plan places them in the arena); None: a chain, layer i reading
    # tensor i and writing tensor i + 1
    routes: list[tuple[int, int, int]] | None = None
    # where in its input tensors each layer reads, (src, src2) bytes from the tensors' starts (a slice of
    # a tensor, e.g. one time step of a recurrent layer's projections); None: every layer reads whole tensors
    views: list[tuple[int, int]] | None = None

    @property
    def macs(self) -> int:
        return sum(layer.macs for layer in self.layers)

    def quantize_input(self, x: np.ndarray) -> np.ndarray:
        if self.input_gather is not None:
            from edge.classify.backends import quantize_tflite

            return quantize_tflite(x, self.input_scale, self.input_zero_point)
        q = np.rint(np.asarray(x, dtype=np.float32) / np.float32(self.input_scale))
        return np.clip(q, -128, 127).astype(np.int8)

    def device_input(self, x_q: np.ndarray) -> np.ndarray:
        """int8 model inputs (batch first) in the order the firmware reads them, one row per input."""
        if self.input_gather is None:
            return np.moveaxis(x_q, 1, -1).reshape(len(x_q), -1)  # channels last (HWC)
        return x_q.reshape(len(x_q), -1)[:, self.input_gather]


def quantize_multiplier(m: float) -> tuple[int, int]:
    """m (0 < m < 1) as a Q31 multiplier and a right shift: m ≈ m0 / 2^31 / 2^shift (TFLite's)."""
    if not 0.0 < m < 1.0:
        raise IntModelError(f"requantization multiplier {m}: must be in (0, 1)")
    mantissa, exponent = math.frexp(m)  # m = mantissa * 2^exponent, mantissa in [0.5, 1)
    m0 = round(mantissa * Q31)
    if m0 == Q31:
        m0, exponent = m0 // 2, exponent + 1
    return m0, -exponent


# ---- reading the QDQ graph --------------------------------------------------------------------


def from_qdq(onnx_bytes: bytes) -> IntModel:
    """The integer model of a QDQ graph (conv stack, ReLU, global average pool, Gemm): brevitas' QCDQ
    export of a trained model, or onnxruntime's static quantization of an imported one."""
    return _QdqReader(onnx_bytes).run()


class _QdqReader:
    """Walks a QDQ graph's chain from its input, one handler per operator (``HANDLERS``), keeping the
    scale and offset of the current integer tensor, the channels the device computes (``keep_in``:
    ordered dropout drops some) and its shape."""

    def __init__(self, onnx_bytes: bytes) -> None:
        import onnx
        from onnx import numpy_helper

        self.model = onnx.load_from_string(onnx_bytes)
        self.graph = self.model.graph
        self.consts = {i.name: numpy_helper.to_array(i) for i in self.graph.initializer}
        self.producer = {out: node for node in self.graph.node for out in node.output}
        self.consumers: dict[str, list[Any]] = {}
        for node in self.graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.inputs = [i for i in self.graph.input if i.name not in self.consts]  # old exporters list initializers too

    # ---- reading the graph ----

    def value(self, name: str) -> np.ndarray:
        """A tensor that does not depend on the graph input: an initializer or a constant subgraph."""
        if name in self.consts:
            return self.consts[name]
        import onnx
        import onnxruntime as ort

        probe = onnx.ModelProto()
        probe.CopyFrom(self.model)
        probe.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feed = {i.name: np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim], np.float32) for i in self.inputs}
        self.consts[name] = np.asarray(session.run([name], feed)[0])
        return self.consts[name]

    def only(self, name: str, op: str) -> Any:
        users = self.consumers.get(name, [])
        if len(users) != 1 or users[0].op_type != op:
            raise IntModelError(f"{name}: expected one {op} after it, found {[u.op_type for u in users]}")
        return users[0]

    def after(self, name: str) -> list[str]:
        return [u.op_type for u in self.consumers.get(name, [])]

    def int_weight(self, name: str) -> tuple[np.ndarray, float]:
        dq = self.producer[name]
        if dq.op_type != "DequantizeLinear":
            raise IntModelError(f"weight {name}: not dequantized from integers ({dq.op_type})")
        q = dq.input[0]
        if q not in self.consts and self.producer[q].op_type == "Clip":  # brevitas' narrow-range clip of the int weights
            clip = self.producer[q]
            q_val = np.clip(self.value(clip.input[0]), self.value(clip.input[1]), self.value(clip.input[2]))
        else:
            q_val = self.value(q)
        zp = self.value(dq.input[2]) if len(dq.input) > 2 else np.zeros(1)
        scale = self.value(dq.input[1])
        if np.any(zp != 0) or scale.size != 1:
            raise IntModelError(f"weight {name}: expected a symmetric per-tensor quantization")
        return q_val.astype(np.int8), float(scale)

    @staticmethod
    def attrs_of(node: Any) -> dict[str, Any]:
        import onnx

        return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}

    def ort_conv_output(self, conv: Any) -> tuple[float, int, int, str]:
        """(output scale, clamp low, clamp high, value after) of onnxruntime's Conv → Q → DQ [→ Relu → Q → DQ].

        The QDQ graph rounds a ReLU's input to the conv output's scale and then to the ReLU's; the
        integer model requantizes once, to the ReLU's scale, clamped at 0."""
        q = self.only(conv.output[0], "QuantizeLinear")
        zp = self.value(q.input[2])
        if zp.dtype != np.int8 or int(zp) != 0:
            raise IntModelError(f"{q.name}: expected symmetric int8 activations (ActivationSymmetric)")
        dq = self.only(q.output[0], "DequantizeLinear")
        if self.after(dq.output[0]) != ["Relu"]:
            return float(self.value(q.input[1])), -128, 127, dq.output[0]
        relu = self.only(dq.output[0], "Relu")
        q2 = self.only(relu.output[0], "QuantizeLinear")
        zp2 = self.value(q2.input[2])
        if zp2.dtype != np.int8 or int(zp2) != 0:
            raise IntModelError(f"{q2.name}: expected symmetric int8 activations (ActivationSymmetric)")
        return float(self.value(q2.input[1])), 0, 127, self.only(q2.output[0], "DequantizeLinear").output[0]

    def brevitas_conv_output(self, conv: Any) -> tuple[float, int, int, str]:
        """(output scale, clamp low, clamp high, value after) of brevitas' QCDQ: ReLU, then uint8
        codes (stored as q - 128), clipped to fewer bits where the variant has them."""
        relu = self.only(conv.output[0], "Relu")
        q = self.only(relu.output[0], "QuantizeLinear")
        s_y, zp_y = float(self.value(q.input[1])), self.value(q.input[2])
        if zp_y.dtype != np.uint8 or int(zp_y) != 0:
            raise IntModelError(f"{q.name}: expected the uint8 zero-point-0 quantization of a ReLU")
        act_min, act_max, after_q = -128, 127, q.output[0]
        if self.after(after_q) == ["Clip"]:  # fewer bits: clipped uint8 codes
            clip = self.consumers[after_q][0]
            act_min, act_max = int(self.value(clip.input[1])) - 128, int(self.value(clip.input[2])) - 128
            after_q = clip.output[0]
        return s_y, act_min, act_max, self.only(after_q, "DequantizeLinear").output[0]

    # ---- the walk ----

    def run(self) -> IntModel:
        if len(self.inputs) != 1:
            raise IntModelError(f"expected one graph input, found {[i.name for i in self.inputs]}")
        inp = self.inputs[0]
        shape = tuple(d.dim_value for d in inp.type.tensor_type.shape.dim)[1:]
        quant = self.only(inp.name, "QuantizeLinear")
        s_in, zp_in = float(self.value(quant.input[1])), int(self.value(quant.input[2]))
        if zp_in != 0 or self.value(quant.input[2]).dtype != np.int8:
            raise IntModelError("input: expected a symmetric int8 quantization")
        self.out = IntModel(s_in, shape)
        self.x_scale, self.x_offset = s_in, 0
        self.cur: str = self.only(quant.output[0], "DequantizeLinear").output[0]
        self.keep_in = np.arange(shape[0])  # the input channels the device computes
        self.in_shape: tuple[int, ...] = shape
        self.pooled = False
        while True:
            users = [u for u in self.consumers.get(self.cur, []) if u.op_type != "Shape"]  # Shape feeds a flatten
            if len(users) != 1:
                raise IntModelError(f"{self.cur}: used by {[u.op_type for u in users]}; only chains are supported")
            node = users[0]
            if self.pooled and node.op_type in ("QuantizeLinear", "DequantizeLinear", "Flatten", "Reshape"):
                self.cur = node.output[0]  # onnxruntime requantizes the pooled values: the integer model keeps the sums
                continue
            handler = self.HANDLERS.get(node.op_type)
            if handler is None:
                index = list(self.graph.node).index(node) + 1
                raise IntModelError(f"operator {node.op_type} (node {node.name!r}, {index} of {len(self.graph.node)} in "
                                    "the graph) has no firmware kernel: the firmware runs Conv (with ReLU), global "
                                    "average pooling and a final Gemm")
            if handler(self, node):
                return self.out

    def _conv(self, node: Any) -> bool:
        attrs = self.attrs_of(node)
        w, s_w = self.int_weight(node.input[1])
        bias = self.value(node.input[2]).astype(np.float64) if len(node.input) > 2 else np.zeros(w.shape[0])
        if self.after(node.output[0]) == ["QuantizeLinear"]:  # onnxruntime's QDQ: int8 output, then an optional ReLU
            s_y, act_min, act_max, self.cur = self.ort_conv_output(node)
            out_offset, next_offset = 0, 0
        else:  # brevitas' QCDQ
            s_y, act_min, act_max, self.cur = self.brevitas_conv_output(node)
            out_offset, next_offset = -128, 128
        mult = np.ones(w.shape[0])
        users = self.consumers.get(self.cur, [])
        if len(users) == 1 and users[0].op_type == "Mul":  # ordered dropout: per-channel 0 or C/keep
            mult = self.value(users[0].input[1]).reshape(-1).astype(np.float64)
            self.cur = users[0].output[0]
        keep_out = np.flatnonzero(mult != 0)
        kernel = tuple(attrs["kernel_shape"])
        strides, pads = tuple(attrs.get("strides", [1] * len(kernel))), tuple(attrs.get("pads", [0] * 2 * len(kernel)))
        if len(set(strides)) != 1 or len(set(pads)) != 1 or attrs.get("group", 1) != 1:
            raise IntModelError(f"{node.name}: only square strides/padding and group = 1 are supported")
        stride, pad = strides[0], pads[0]
        spatial = tuple((n + 2 * pad - k) // stride + 1 for n, k in zip(self.in_shape[1:], kernel))
        w_kept = w[np.ix_(keep_out, self.keep_in)]
        eff = self.x_scale * s_w
        m0s, shifts = zip(*(quantize_multiplier(eff / s_y) for _ in keep_out))
        layer = ConvLayer(weight=np.ascontiguousarray(w_kept),
                          bias=np.round(bias[keep_out] / eff).astype(np.int32),
                          multiplier=np.array(m0s, np.int32), shift=np.array(shifts, np.int32),
                          input_offset=self.x_offset, output_offset=out_offset, act_min=act_min, act_max=act_max,
                          stride=stride, padding=pad, in_shape=(len(self.keep_in), *self.in_shape[1:]),
                          out_shape=(len(keep_out), *spatial))
        bound = int(np.abs(w_kept.astype(np.int64)).reshape(len(keep_out), -1).sum(1).max()) * 256
        if bound >= EXACT_FLOAT_SUM:
            raise IntModelError(f"{node.name}: accumulators up to {bound} exceed 2^24 (the float oracle is inexact)")
        self.out.layers.append(layer)
        scale_kept = mult[keep_out]
        if len(set(scale_kept.tolist())) != 1:
            raise IntModelError(f"{node.name}: dropout rescale differs across kept channels")
        self.x_scale, self.x_offset = s_y * float(scale_kept[0]), next_offset  # brevitas: stored q - 128, so add 128 back
        self.keep_in, self.in_shape = np.arange(len(keep_out)), (len(keep_out), *spatial)
        return False

    def _pool(self, next_value: str, pooled: bool) -> None:
        positions = math.prod(self.in_shape[1:])
        self.out.layers.append(PoolLayer(input_offset=self.x_offset, in_shape=self.in_shape))
        self.x_scale, self.x_offset, self.cur = self.x_scale / positions, 0, next_value
        self.pooled = self.pooled or pooled
        self.in_shape = (self.in_shape[0],)

    def _reshape(self, node: Any) -> bool:  # brevitas' graph: flatten, then a mean over positions
        self._pool(self.only(node.output[0], "ReduceMean").output[0], pooled=False)
        return False

    def _reduce_mean(self, node: Any) -> bool:  # onnxruntime's graph: pooling over positions
        axes = self.attrs_of(node).get("axes")
        if node.op_type == "ReduceMean" and (axes is None or sorted(a % (len(self.in_shape) + 1) for a in axes)
                                             != list(range(2, len(self.in_shape) + 1))):
            raise IntModelError(f"{node.name}: ReduceMean over axes {axes}; the firmware pools over all positions")
        self._pool(node.output[0], pooled=True)
        return False

    def _gemm(self, node: Any) -> bool:
        w, s_w = self.int_weight(node.input[1])
        if not self.attrs_of(node).get("transB", 0):
            raise IntModelError(f"{node.name}: expected Gemm with transB = 1")
        bias = self.value(node.input[2]).astype(np.float64)
        eff = self.x_scale * s_w
        self.out.layers.append(DenseLayer(np.ascontiguousarray(w[:, self.keep_in]), np.round(bias / eff).astype(np.int32),
                                          eff))
        return True  # the logits: the end of the chain

    HANDLERS: ClassVar[dict[str, Callable[[_QdqReader, Any], bool]]] = {
        "Conv": _conv, "Reshape": _reshape, "ReduceMean": _reduce_mean, "GlobalAveragePool": _reduce_mean,
        "Gemm": _gemm,
    }


# ---- the integer model as an exact ONNX graph (the oracle) -------------------------------------


def integer_onnx(model: IntModel) -> bytes:
    """ONNX graph: int8 input (1, *shape) -> int32 logits (1, classes), every step exact."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    counter = iter(range(10**6))

    def const(arr: np.ndarray) -> str:
        name = f"c{next(counter)}"
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def op(kind: str, inputs: list[str], **attrs: Any) -> str:
        name = f"v{next(counter)}"
        nodes.append(helper.make_node(kind, inputs, [name], **attrs))
        return name

    def requant(acc: str, layer: ConvLayer | FCLayer, dims: int) -> str:
        view = (1, -1, *([1] * dims))
        ab = op("Mul", [acc, const(layer.multiplier.astype(np.int64).reshape(view))])
        nudge = op("Where", [op("GreaterOrEqual", [ab, const(np.array(0, np.int64))]),
                             const(np.array(1 << 30, np.int64)), const(np.array(1 - (1 << 30), np.int64))])
        high = op("Div", [op("Add", [ab, nudge]), const(np.array(Q31, np.int64))])  # integer Div truncates
        shift = layer.shift.astype(np.int64)
        half = np.where(shift > 0, np.left_shift(1, np.maximum(shift, 1) - 1), 0).reshape(view).astype(np.int64)
        mag = op("Div", [op("Add", [op("Abs", [high]), const(half)]), const(np.left_shift(1, shift).reshape(view))])
        y = op("Add", [op("Mul", [op("Sign", [high]), mag]), const(np.array(layer.output_offset, np.int64))])
        return op("Clip", [y, const(np.array(layer.act_min, np.int64)), const(np.array(layer.act_max, np.int64))])

    x = op("Cast", ["x"], to=TensorProto.INT64)
    for layer in model.layers:
        if isinstance(layer, ConvLayer):
            dims = len(layer.in_shape) - 1
            xf = op("Cast", [op("Add", [x, const(np.array(layer.input_offset, np.int64))])], to=TensorProto.FLOAT)
            acc_f = op("Conv", [xf, const(layer.weight.astype(np.float32))], strides=[layer.stride] * dims,
                       pads=[layer.padding] * 2 * dims, kernel_shape=list(layer.weight.shape[2:]))
            acc = op("Add", [op("Cast", [acc_f], to=TensorProto.INT64),
                             const(layer.bias.astype(np.int64).reshape(1, -1, *([1] * dims)))])
            x = requant(acc, layer, dims)
        elif isinstance(layer, PoolLayer):
            axes = list(range(2, 2 + len(layer.in_shape) - 1))
            x = op("ReduceSum", [op("Add", [x, const(np.array(layer.input_offset, np.int64))]), const(np.array(axes, np.int64))],
                   keepdims=0)
        elif isinstance(layer, DenseLayer):
            x = op("Add", [op("MatMul", [x, const(layer.weight.T.astype(np.int64))]), const(layer.bias.astype(np.int64))])
        elif isinstance(layer, FCLayer) and model.input_gather is None and np.all(layer.shift >= 0):
            # a trickle-quantized frame model (export.early): int8 in, int8 out, right shifts only
            shifted = op("Add", [x, const(np.array(layer.input_offset, np.int64))])
            acc = op("Add", [op("MatMul", [shifted, const(layer.weight.T.astype(np.int64))]),
                             const(layer.bias.astype(np.int64))])
            x = requant(acc, layer, 0)
        else:  # a TFLite model's layer: TFLite Micro's interpreter is its oracle
            raise IntModelError(f"integer_onnx: {type(layer).__name__} is checked against TFLite Micro, not this graph")
    nodes.append(helper.make_node("Cast", [x], ["logits"], to=TensorProto.INT32))
    n_out = model.layers[-1].weight.shape[0] if isinstance(model.layers[-1], (DenseLayer, FCLayer)) else 0
    x_info = helper.make_tensor_value_info("x", TensorProto.INT8, [1, *model.input_shape])
    graph = helper.make_graph(nodes, "trickle-int", [x_info],
                              [helper.make_tensor_value_info("logits", TensorProto.INT32, [1, n_out])], inits)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(onnx_model)
    return onnx_model.SerializeToString(deterministic=True)
