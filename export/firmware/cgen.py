"""C sources for firmware/ from a bundle's int8 variants: weights, requantization, descriptors, test vectors.

    sources, info = generate(bundle)        # {"model.c": ..., "model.h": ...}, what was generated

Every array is ``alignas(16) const`` (flash on a microcontroller). The test vectors are the
bundle's own (``edge.contract.vectors``; or the inputs given) quantized to int8, and the expected logits
are onnxruntime's outputs of the integer graph (``export.firmware.intmodel.integer_onnx``), or for a model
imported from TFLite, TFLite Micro's own interpreter's outputs, so a board checks itself bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edge.contract.bundle import Bundle
from edge.contract.manifest import Variant
from edge.contract.vectors import TestVectors
from export.firmware.intmodel import (
    AddLayer,
    ConcatLayer,
    ConvLayer,
    DenseLayer,
    DepthwiseLayer,
    FCLayer,
    IntModel,
    IntModelError,
    Layer,
    LutLayer,
    MeanLayer,
    MulLayer,
    PoolLayer,
    WindowPoolLayer,
    from_qdq,
    integer_onnx,
)
from export.firmware.plan import MemoryPlan, plan

INT8_FORMATS = ("onnx-int8", "tflite-int8")  # what the firmware is generated from


def firmware_variants(bundle: Bundle) -> list[Variant]:
    """The bundle's 8-bit variants (QDQ ONNX, or an imported int8 TFLite model), widest first:
    what the firmware carries."""
    chosen = [v for v in bundle.manifest.variants if v.bits == 8 and any(f in v.formats for f in INT8_FORMATS)]
    if not chosen:
        raise IntModelError("the bundle has no 8-bit int8 variant (export with --formats onnx-int8)")
    return sorted(chosen, key=lambda v: v.drop)


def integer_model(bundle: Bundle, variant: Variant) -> tuple[IntModel, str]:
    """The integer model of an 8-bit variant and the name of its bit-exact oracle."""
    if "onnx-int8" in variant.formats:
        return from_qdq(bundle.file(variant.formats["onnx-int8"])), "onnxruntime"
    from export.firmware.tflite_import import from_tflite

    return from_tflite(bundle.file(variant.formats["tflite-int8"])), "TFLite Micro"


def expected_logits(bundle: Bundle, variant: Variant, model: IntModel, x_q: np.ndarray) -> np.ndarray:
    """The oracle's int32 outputs for int8 inputs: onnxruntime on the exact integer graph, or TFLite
    Micro's interpreter on the TFLite model itself."""
    if "onnx-int8" in variant.formats:
        return integer_logits(model, x_q)
    from export.firmware.tflite_import import tflm_outputs

    return tflm_outputs(bundle.file(variant.formats["tflite-int8"]), x_q)


def bundle_inputs(bundle: Bundle) -> np.ndarray:
    """The model inputs of the bundle's own test vectors (``edge.contract.vectors``)."""
    info = bundle.manifest.test_vectors
    if info is None:
        raise IntModelError("the bundle carries no test vectors (it predates them): export it again, "
                            "or give model inputs to compile in (trickle flash --inputs X.npy)")
    return TestVectors.from_bytes(bundle.file(info.file), info.file).features


def integer_logits(model: IntModel, x_q: np.ndarray) -> np.ndarray:
    """onnxruntime's int32 logits of the integer graph, one row per int8 input."""
    import onnxruntime as ort

    session = ort.InferenceSession(integer_onnx(model), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"x": x_q[i : i + 1]})[0] for i in range(len(x_q))])


def _array(ctype: str, name: str, values: np.ndarray, per_line: int = 24) -> str:
    flat = [str(int(v)) for v in np.asarray(values).reshape(-1)]
    lines = [", ".join(flat[i : i + per_line]) for i in range(0, len(flat), per_line)]
    body = ",\n    ".join(lines)
    return f"alignas(16) static const {ctype} {name}[{len(flat)}] = {{\n    {body}\n}};\n"


def conv_rows(weight: np.ndarray) -> np.ndarray:
    """A conv's weights as the firmware stores them, int16 (widened here once, so that the kernel's
    inner loop only loads and multiplies; firmware/src/conv.c): a row per output channel, taps in
    (kh, kw, cin) order (activations are HWC), zero-padded to a multiple of four; the rows of
    channels 2p and 2p + 1 interleaved group of four taps by group (one LDM reads both channels'
    group), an odd last channel's row after them as it is."""
    rows = np.moveaxis(weight, 1, -1).reshape(weight.shape[0], -1)  # OIHW -> OHWI: HWC windows
    cout, depth = rows.shape[0], -(-rows.shape[1] // 4) * 4
    padded = np.zeros((cout, depth), dtype=np.int16)
    padded[:, : rows.shape[1]] = rows
    groups = padded.reshape(cout, depth // 4, 4)
    even = cout - cout % 2
    paired = groups[:even].reshape(even // 2, 2, depth // 4, 4).transpose(0, 2, 1, 3).reshape(even, depth)
    return np.concatenate([paired, groups[even:].reshape(cout - even, depth)])


def depthwise_weights(layer: DepthwiseLayer) -> np.ndarray:
    """A depthwise conv's weights as the firmware stores them, widened to int16 (the kernel loads a
    tap's four weights with one LDRD instead of unpacking a word with two SXTB16 per window and
    position): where four channels are computed together (a depth multiplier of 1, 2 or a multiple
    of 4), each quad's taps in turn, ``[cout / 4][kh][kw][w0, w2, w1, w3]`` (the lane pairs the input's
    SXTAB16 words meet), so the kernel walks a quad's window with one post-incremented load; then
    the other channels in TFLite's order, ``[kh][kw][rest]``."""
    kh, kw, cout = layer.weight.shape
    mult = cout // layer.in_shape[0]
    quads = cout // 4 * 4 if mult in (1, 2) or mult % 4 == 0 else 0
    grouped = layer.weight[:, :, :quads].reshape(kh * kw, quads // 4, 4).transpose(1, 0, 2)[:, :, [0, 2, 1, 3]]
    return np.concatenate([grouped.reshape(-1), layer.weight[:, :, quads:].reshape(-1)]).astype(np.int16)


PACKED_TAPS = 64  # firmware/include/tn.h TN_PACKED_TAPS: the most taps a packed depthwise window has
BOUND = 1 << 30  # |accumulator| and |output stage base| of a packed stream: doubled, they fit an int32


def _halves(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """int32 words of two int16 values each, lo in the low half (little-endian ``int16`` pairs)."""
    return np.stack([lo, hi], axis=-1).astype(np.int16).view(np.int32)[..., 0]


def doubled_rows(layer: ConvLayer | DepthwiseLayer | FCLayer, reach: np.ndarray) -> np.ndarray | None:
    """The output stage rows ``[channel][3]`` = {multiplier, 2^(s-1) + zero point 2^s, s} of a packed stream
    (firmware/src/kernel.h's requant_doubled), or None where they cannot be used: a shift below 1 (a
    zero multiplier, whose output is the zero point at any shift, takes 1), a base of 2^30 or more, or
    an accumulator that may reach 2^30 (reach: the most |sum of products| each channel adds to its
    bias)."""
    multiplier, shift = np.asarray(layer.multiplier, np.int64), np.asarray(layer.shift, np.int64)
    shift = np.where(multiplier != 0, shift, 1)
    if shift.min() < 1 or shift.max() > 30:
        return None
    base = (1 << (shift - 1)) + layer.output_offset * (1 << shift)
    if np.any(np.abs(base) >= BOUND) or np.any(np.abs(np.asarray(layer.bias, np.int64)) + reach >= BOUND):
        return None
    return np.stack([multiplier, base, shift], axis=1)


def _tap_table(kh: int, kw: int, row_bytes: int, tap_bytes: int) -> np.ndarray:
    """Where a window's taps lie, in bytes from its first: in pairs, then -1 and the odd last tap's
    offset (or 0), padded to kh kw + 2 words."""
    at = (np.arange(kh)[:, None] * row_bytes + np.arange(kw)[None, :] * tap_bytes).reshape(-1)
    tail = [-1, at[-1], 0] if at.size % 2 else [-1, 0]
    return np.concatenate([at[: at.size - at.size % 2], tail])


def packed_depthwise(layer: DepthwiseLayer) -> np.ndarray | None:
    """A depthwise conv's tn_layer.packed (firmware/include/tn.h), or None where the layer does not
    qualify (a depth multiplier other than 1 or 2, input channels not whole quads, fewer than 2 or more
    than PACKED_TAPS taps, or ``doubled_rows`` refuses).
    The tap tables, in the input and in a gathered window; then per quad of output channels the doubled
    biases with the input offset folded in; each pair of taps (TFLite's (ky, kx) order) as one word per
    channel, (2 w_t, 2 w_t+1); an odd last tap in the lanes its input gives, (2 w_c, 2 w_c+2), (2 w_c+1,
    2 w_c+3) (a multiplier of 2: (c, c + 1), (c + 2, c + 3)); the output stage rows."""
    kh, kw, cout = layer.weight.shape
    cin, n = layer.in_shape[0], kh * kw
    if cout not in (cin, 2 * cin) or cin % 4 or not 2 <= n <= PACKED_TAPS:
        return None
    rows = doubled_rows(layer, np.full(cout, n * 255 * 128, np.int64))
    if rows is None:
        return None
    w_in = _hw(layer.in_shape)[1]
    tables = [_tap_table(kh, kw, layer.dilation_h * w_in * cin, layer.dilation * cin),  # in place in the input
              _tap_table(kh, kw, kw * cin, cin)]  # gathered
    taps = layer.weight.reshape(n, cout).astype(np.int64)
    bias = np.asarray(layer.bias, np.int64) + layer.input_offset * taps.sum(axis=0)  # the taps read the raw input
    w2 = 2 * taps.reshape(n, cout // 4, 4).transpose(1, 0, 2)  # [quad][tap][4]
    parts = [2 * bias.reshape(-1, 4), _halves(w2[:, 0 : n - 1 : 2], w2[:, 1:n:2]).reshape(cout // 4, -1)]
    if n % 2:
        last, lanes = w2[:, n - 1], ([0, 1], [2, 3]) if cout == cin else ([0, 2], [1, 3])
        parts.append(_halves(last[:, lanes[0]], last[:, lanes[1]]))
    parts.append(rows.reshape(-1, 12))
    quads = np.concatenate([np.asarray(part, np.int64) for part in parts], axis=1).reshape(-1)
    return np.concatenate([*tables, quads]).astype(np.int32)


def packed_pointwise(layer: ConvLayer) -> np.ndarray | None:
    """A 1 x 1 conv's tn_layer.packed (firmware/src/conv.c's packed pointwise path), or None where the
    layer does not qualify: 8 or 16 input channels (an even cout for 8), no padding, an output range of
    all int8, ``doubled_rows``. Blocks of two channels (cin 8) or one: the doubled biases; each channel's
    doubled weights per input word as int16 halves (w0, w2), (w1, w3) (the lanes SXTB16 gives); the
    output stage rows."""
    cout, cin = layer.weight.shape[:2]
    block = 2 if cin == 8 else 1
    if (layer.weight.shape[2:] not in ((1,), (1, 1)) or cin not in (8, 16) or cout % block or layer.padding
            or layer.padding_h or (layer.act_min, layer.act_max) != (-128, 127)):
        return None
    rows = doubled_rows(layer, np.full(cout, cin * 255 * 128, np.int64))
    if rows is None:
        return None
    w2 = 2 * layer.weight.reshape(cout, cin // 4, 4).astype(np.int64)
    words = _halves(w2[:, :, [0, 1]], w2[:, :, [2, 3]]).reshape(cout // block, -1)  # (w0, w2), (w1, w3) per word
    bias = 2 * np.asarray(layer.bias, np.int64).reshape(-1, block)
    return np.concatenate([bias, words, rows.reshape(-1, 3 * block)], axis=1).astype(np.int32).reshape(-1)


def packed_fc(layer: FCLayer) -> np.ndarray | None:
    """A fully connected layer's tn_layer.packed (firmware/src/dense.c), or None where it does not qualify:
    cin a multiple of 8, cout of 4, an output range of all int8, ``doubled_rows``. Blocks of four rows:
    their biases with the input offset folded in (the kernel doubles the sum itself); per four inputs,
    each row's four int8 weights as one word; the output stage rows. The stream replaces the weights
    (tn_layer.weight is 0)."""
    cout, cin = layer.weight.shape
    if cin % 8 or cout % 4 or (layer.act_min, layer.act_max) != (-128, 127):
        return None
    rows = doubled_rows(layer, np.full(cout, cin * 255 * 128, np.int64))
    if rows is None:
        return None
    weight = np.asarray(layer.weight, np.int8)
    bias = np.asarray(layer.bias, np.int64) + layer.input_offset * weight.sum(axis=1, dtype=np.int64)
    words = weight.reshape(cout // 4, 4, cin // 4, 4).transpose(0, 2, 1, 3).copy().view(np.int32)  # [block][group][row]
    return np.concatenate([bias.reshape(-1, 4), words.reshape(cout // 4, -1), rows.reshape(-1, 12)],
                          axis=1).astype(np.int32).reshape(-1)


def packed_stream(prefix: str, layer: Layer) -> tuple[str, str]:
    """(array, its name) of a layer's tn_layer.packed, or ("", "0") where its kernel has none."""
    stream = None
    if isinstance(layer, DepthwiseLayer):
        stream = packed_depthwise(layer)
    elif isinstance(layer, ConvLayer):
        stream = packed_pointwise(layer)
    elif isinstance(layer, FCLayer):
        stream = packed_fc(layer)
    if stream is None:
        return "", "0"
    return _array("int32_t", f"{prefix}_pk", stream), f"{prefix}_pk"


def _init(kind: str, cin: int, hin: int, win: int, cout: int, hout: int, wout: int, kh: int = 0, kw: int = 0,
          stride: int = 0, pad: int = 0, pad_h: int = 0, in_offset: int = 0, out_offset: int = 0, act_min: int = 0,
          act_max: int = 0, arrays: str = "", refs: tuple[str, ...] = ("0", "0", "0", "0"),
          geometry: tuple[int, int, int] = (0, 0, 0), in2_offset: int = 0) -> tuple[str, str]:
    """(arrays, a tn_layer initializer but its buffers, ``routed`` adds them); refs: the weight, bias,
    multiplier and shift arrays' names; geometry: the row stride and the dilations (``_geometry``), 0
    where they are the defaults; in2_offset: an ADD's second input offset, a concatenation's first
    channel."""
    stride_h, dil_h, dil_w = geometry
    for name, value, top in (("channels in", cin, 0xFFFF), ("rows in", hin, 0xFFFF), ("columns in", win, 0xFFFF),
                             ("channels out", cout, 0xFFFF), ("rows out", hout, 0xFFFF), ("columns out", wout, 0xFFFF),
                             ("kernel rows", kh, 0xFF), ("kernel columns", kw, 0xFF), ("stride", stride, 0xFF),
                             ("padding", pad, 0xFF), ("row padding", pad_h, 0xFF), ("row stride", stride_h, 0xFF),
                             ("row dilation", dil_h, 0xFF), ("column dilation", dil_w, 0xFF)):
        if not 0 <= value <= top:
            raise IntModelError(f"a {kind} layer with {value} {name}: the firmware's descriptor holds 0 to {top}")
    tail = f", {stride_h}, {dil_h}, {dil_w}, {in2_offset}"
    return arrays, (f"{{{kind}, {cin}, {hin}, {win}, {cout}, {hout}, {wout}, {kh}, {kw}, {stride}, {pad}, {pad_h}, "
                    f"{in_offset}, {out_offset}, {act_min}, {act_max}, {', '.join(refs)}{tail}")


def routed(init: str, offsets: tuple[int, int, int], requant: str = "0", packed: str = "0") -> str:
    """A layer initializer closed with the arena offsets of the tensors it reads and writes
    (``export.firmware.plan``), its requantization table (``requant_table``) and its packed stream
    (``packed_stream``)."""
    src, src2, dst = offsets
    return f"{init}, {src}u, {src2}u, {dst}u, {requant}, {packed}}}"


def add_tables(layer: AddLayer) -> np.ndarray:
    """An ADD's two inputs rescaled, for each int8 value: int32 (2, 256), ``[i][v + 128]`` =
    RoundingDivideByPOT(SaturatingRoundingDoublingHighMul((v + offset_i) * 2^20, m_i), s_i), what
    TFLite's ADD computes of each input before the sum (a function of the one int8 value)."""
    v = np.arange(-128, 128, dtype=np.int64)
    rows = []
    for offset, m, shift in ((layer.input_offset, layer.multiplier[0], layer.shift[0]),
                             (layer.input2_offset, layer.multiplier[1], layer.shift[1])):
        high = (((v + offset) << 20) * m + (1 << 30)) >> 31  # |x m| < 2^59: never saturates
        mask = (1 << shift) - 1
        rows.append((high >> shift) + ((high & mask) > (mask >> 1) + (high < 0)))
    if layer.subtract:  # TFLite's SUB: the same rescaling, the second input's value subtracted
        rows[1] = -rows[1]
    return np.stack(rows).astype(np.int32)


def requant_table(prefix: str, layer: Layer) -> tuple[str, str]:
    """(array, its name) of a conv, depthwise or fully connected layer's per-channel requantization
    (an ADD's output stage: one row) as the firmware's fast path reads it, {multiplier, 2^(shift - 2)
    + zero point 2^(shift - 1), shift - 1} per channel (firmware/src/kernel.h's mbqm_row); ("", "0")
    where a shift is below 2 or the zero point's share could overflow the high word (the kernels then
    take multiplier, shift and offset)."""
    if isinstance(layer, AddLayer):
        multiplier, shift = np.array(layer.multiplier[2:], np.int64), np.array(layer.shift[2:], np.int64)
    elif isinstance(layer, (ConvLayer, DepthwiseLayer, FCLayer)):
        multiplier, shift = np.asarray(layer.multiplier, np.int64), np.asarray(layer.shift, np.int64)
    else:
        return "", "0"
    zp = layer.output_offset
    live = multiplier != 0  # a zero multiplier (TFLite's flush of a tiny scale) gives the zero point at any shift
    if live.any() and not live.all():
        shift = np.where(live, shift, shift[live].max())
    # |base| = 2^(30+s) + |zp| 2^(31+s) + 2^31 stays below 2^62, so base + acc m (below 2^62) fits an int64
    if shift.min() < 2 or shift.max() > 31 or np.any((abs(zp) << (shift - 1)) + (1 << (shift - 2)) >= 1 << 29):
        return "", "0"
    rows = np.stack([multiplier, (1 << (shift - 2)) + (zp << (shift - 1)), shift - 1], axis=1)
    return _array("int32_t", f"{prefix}_rq", rows), f"{prefix}_rq"


def _geometry(layer: ConvLayer | DepthwiseLayer | WindowPoolLayer) -> tuple[int, int, int]:
    """The descriptor's row stride and dilations (rows, columns): 0 where they are the defaults."""
    stride_h = layer.stride_h if layer.stride_h is not None and layer.stride_h != layer.stride else 0
    if isinstance(layer, WindowPoolLayer):
        return stride_h, 0, 0
    return stride_h, layer.dilation_h if layer.dilation_h > 1 else 0, layer.dilation if layer.dilation > 1 else 0


def _requant_arrays(prefix: str, layer: ConvLayer | DepthwiseLayer | FCLayer) -> str:
    if not np.all((layer.multiplier >= 0) & (layer.multiplier < 2**31)):
        raise IntModelError(f"{prefix}: requantization multipliers must be Q31 values of 0 to 1")
    if not np.all((layer.shift > -32) & (layer.shift < 32)):
        raise IntModelError(f"{prefix}: requantization shifts must be within 31 bits either way")
    return (_array("int32_t", f"{prefix}_b", layer.bias) + _array("int32_t", f"{prefix}_m", layer.multiplier)
            + _array("int32_t", f"{prefix}_s", layer.shift))


def _hw(shape: tuple[int, ...]) -> tuple[int, int]:
    return (1, shape[1]) if len(shape) == 2 else (shape[1], shape[2])


def _chw(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """An elementwise layer's (C, H, W) device shape, or (N,) as N channels of one position."""
    return (shape[0], *_hw(shape)) if len(shape) == 3 else (shape[0], 1, 1)


def _layer(prefix: str, layer: Layer) -> tuple[str, str]:
    """(arrays, initializer) of one layer."""
    refs = (f"{prefix}_w", f"{prefix}_b", f"{prefix}_m", f"{prefix}_s")
    if isinstance(layer, DepthwiseLayer):
        kh, kw, c_out = layer.weight.shape
        return _init("TN_DWCONV", layer.in_shape[0], *_hw(layer.in_shape), c_out, *_hw(layer.out_shape), kh, kw,
                     layer.stride, layer.padding, layer.padding_h, layer.input_offset, layer.output_offset,
                     layer.act_min, layer.act_max,
                     _array("int16_t", f"{prefix}_w", depthwise_weights(layer)) + _requant_arrays(prefix, layer),
                     (f"(const int8_t *){prefix}_w", *refs[1:]),
                     _geometry(layer))
    if isinstance(layer, WindowPoolLayer):
        return _init("TN_AVGPOOL" if layer.kind == "avg" else "TN_MAXPOOL", layer.in_shape[0], *_hw(layer.in_shape),
                     layer.out_shape[0], *_hw(layer.out_shape), *layer.kernel, layer.stride, layer.padding,
                     layer.padding_h, act_min=layer.act_min, act_max=layer.act_max, geometry=_geometry(layer))
    if isinstance(layer, MeanLayer):
        c = layer.in_shape[0]
        if not -32 < layer.shift < 32:
            raise IntModelError(f"{prefix}: the mean's requantization shift {layer.shift} exceeds 31 bits")
        arrays = (_array("int32_t", f"{prefix}_m", np.array([layer.multiplier]))
                  + _array("int32_t", f"{prefix}_s", np.array([layer.shift])))
        return _init("TN_MEAN", c, *_hw(layer.in_shape), c, 1, 1, in_offset=layer.input_offset,
                     out_offset=layer.output_offset, arrays=arrays, refs=("0", "0", f"{prefix}_m", f"{prefix}_s"))
    if isinstance(layer, FCLayer):
        n_out, n_in = layer.weight.shape
        packed = packed_fc(layer) is not None  # its stream carries the weights
        return _init("TN_FC", n_in, layer.rows, 1, n_out, layer.rows, 1, in_offset=layer.input_offset,
                     out_offset=layer.output_offset,
                     act_min=layer.act_min, act_max=layer.act_max,
                     arrays=("" if packed else _array("int8_t", f"{prefix}_w", layer.weight))
                     + _requant_arrays(prefix, layer), refs=("0", *refs[1:]) if packed else refs)
    if isinstance(layer, ConvLayer):
        if not np.all((layer.multiplier >= 0) & (layer.multiplier < 2**31)):
            raise IntModelError(f"{prefix}: requantization multipliers must be Q31 values of 0 to 1")
        c_in, *s_in = layer.in_shape
        c_out, *s_out = layer.out_shape
        h_in, w_in = (1, s_in[0]) if len(s_in) == 1 else s_in
        h_out, w_out = (1, s_out[0]) if len(s_out) == 1 else s_out
        kh, kw = (1, layer.weight.shape[2]) if layer.weight.ndim == 3 else layer.weight.shape[2:]
        pad_h = layer.padding_h if layer.padding_h is not None else (layer.padding if kh > 1 else 0)
        return _init("TN_CONV", c_in, h_in, w_in, c_out, h_out, w_out, kh, kw, layer.stride, layer.padding, pad_h,
                     layer.input_offset, layer.output_offset, layer.act_min, layer.act_max,
                     _array("int16_t", f"{prefix}_w", conv_rows(layer.weight)) + _requant_arrays(prefix, layer),
                     (f"(const int8_t *){prefix}_w", *refs[1:]),
                     _geometry(layer))
    if isinstance(layer, LutLayer):
        c, h, w = _chw(layer.shape)
        return _init("TN_LUT", len(layer.table), h, w, c, h, w, arrays=_array("int8_t", f"{prefix}_w", layer.table),
                     refs=(f"{prefix}_w", "0", "0", "0"))
    if isinstance(layer, AddLayer):
        c, h, w = _chw(layer.shape)
        if not all(0 <= m < 2**31 for m in layer.multiplier) or not all(0 <= sh < 32 for sh in layer.shift):
            raise IntModelError(f"{prefix}: an ADD's multipliers must be Q31 values of 0 to 1, its shifts right ones")
        arrays = (_array("int32_t", f"{prefix}_m", np.array(layer.multiplier))
                  + _array("int32_t", f"{prefix}_s", np.array(layer.shift))
                  + _array("int32_t", f"{prefix}_b", add_tables(layer)))
        return _init("TN_ADD", c, h, w, c, h, w, in_offset=layer.input_offset, out_offset=layer.output_offset,
                     act_min=layer.act_min, act_max=layer.act_max, arrays=arrays,
                     refs=("0", f"{prefix}_b", f"{prefix}_m", f"{prefix}_s"), in2_offset=layer.input2_offset)
    if isinstance(layer, MulLayer):
        c, h, w = _chw(layer.shape)
        if not 0 <= layer.multiplier < 2**31 or not -32 < layer.shift < 32:
            raise IntModelError(f"{prefix}: a MUL's multiplier must be a Q31 value of 0 to 1, its shift within 31 bits")
        arrays = (_array("int32_t", f"{prefix}_m", np.array([layer.multiplier]))
                  + _array("int32_t", f"{prefix}_s", np.array([layer.shift])))
        return _init("TN_MUL", c, h, w, c, h, w, in_offset=layer.input_offset, out_offset=layer.output_offset,
                     act_min=layer.act_min, act_max=layer.act_max, arrays=arrays,
                     refs=("0", "0", f"{prefix}_m", f"{prefix}_s"), in2_offset=layer.input2_offset)
    if isinstance(layer, ConcatLayer):
        h, w = layer.positions
        return _init("TN_CONCAT", layer.channels, h, w, layer.out_channels, h, w, in2_offset=layer.offset)
    if isinstance(layer, PoolLayer):
        c = layer.in_shape[0]
        return _init("TN_POOL", c, *_hw(layer.in_shape), c, 1, 1, in_offset=layer.input_offset)
    n_out, n_in = layer.weight.shape
    return _init("TN_DENSE", n_in, 1, 1, n_out, 1, 1, refs=(f"{prefix}_w", f"{prefix}_b", "0", "0"),
                 arrays=_array("int8_t", f"{prefix}_w", layer.weight) + _array("int32_t", f"{prefix}_b", layer.bias))


def _padded(layer: DepthwiseLayer) -> bool:
    """Whether some window reaches into the padding (on top, left, below or right): its tiles gather it."""
    kh, kw = layer.weight.shape[:2]
    (h_in, w_in), (h_out, w_out) = _hw(layer.in_shape), _hw(layer.out_shape)
    stride_h = layer.stride_h if layer.stride_h is not None else layer.stride
    return bool(layer.padding or layer.padding_h or (h_out - 1) * stride_h + (kh - 1) * layer.dilation_h >= h_in
                or (w_out - 1) * layer.stride + (kw - 1) * layer.dilation >= w_in)


def column_need(layer: Layer) -> int:
    """int16 scratch (TN_MAX_COLUMN) a layer's tiles use: a conv's columns of TN_TILE_POSITIONS
    positions; a depthwise window gathered at the padding (kh x kw x cin bytes; a 3 x 3 one's always)."""
    if isinstance(layer, ConvLayer):
        return 2 * (-(-int(np.prod(layer.weight.shape[1:])) // 4) * 4)
    if isinstance(layer, DepthwiseLayer) and layer.weight.shape[:2] == (3, 3):
        return -(-9 * layer.in_shape[0] // 2)
    if isinstance(layer, DepthwiseLayer) and _padded(layer) and packed_depthwise(layer) is not None:
        return -(-int(np.prod(layer.weight.shape[:2])) * layer.in_shape[0] // 2)
    return 0


def build_config(models: Sequence[IntModel], plans: Sequence[MemoryPlan], extra_column: int = 0) -> dict[str, int]:
    """What the build must hold for every variant (tn_config.h): the arena, the outputs, the pooled
    channels, the column scratch."""
    pooled = [layer.in_shape[0] for m in models for layer in m.layers if isinstance(layer, PoolLayer)]
    return {"TN_ARENA_BYTES": max(p.arena_bytes for p in plans),
            "TN_MAX_CLASSES": max(n_outputs(m) for m in models),
            "TN_MAX_CHANNELS": max([1, *pooled]),
            "TN_MAX_COLUMN": max([8, extra_column, *(column_need(la) for m in models for la in m.layers)])}


def config_header(config: dict[str, int]) -> str:
    lines = "".join(f"#define {k} {v}\n" for k, v in config.items())
    return ("/* Generated by trickle export.firmware.cgen: the arena, outputs and scratch this model's variants "
            f"need (firmware/Makefile includes it in every file). Do not edit. */\n#ifndef TN_CONFIG_H\n#define "
            f"TN_CONFIG_H\n{lines}#endif\n")


def n_outputs(model: IntModel) -> int:
    last = model.layers[-1] if model.layers else None
    if not isinstance(last, (DenseLayer, FCLayer)):
        raise IntModelError("the model must end in a fully connected layer: its outputs are the device's results")
    return int(last.weight.shape[0]) * (last.rows if isinstance(last, FCLayer) else 1)


def flash_refusal(tflite: bytes) -> str | None:
    """Why ``trickle flash`` cannot run an int8 .tflite (the operator and its place, or a dimension
    the firmware's descriptor cannot hold), or None when it can: what ``trickle export`` says at
    export time. Whether it fits a board's memory is the board's question (``trickle flash``)."""
    from export.firmware.tflite_import import TfliteImportError, from_tflite, logits_model, tflm_interpreter

    try:
        model = from_tflite(tflite)
        for k, layer in enumerate(model.layers):
            _layer(f"layer {k + 1}", layer)
        tflm_interpreter(logits_model(tflite))  # the oracle every flash is checked against must run it
    except (IntModelError, TfliteImportError) as e:
        return str(e)
    return None


def generate(bundle: Bundle, x_test: np.ndarray | None = None, mcu: str = "cortex-m4", max_vectors: int | None = None
             ) -> tuple[dict[str, str], dict[str, Any]]:
    """C sources for the firmware and a description (variants, test vectors, expected logits).
    ``x_test``: model inputs to compile in as test vectors; by default the bundle's own."""
    variants = firmware_variants(bundle)
    if x_test is None:
        x_test = bundle_inputs(bundle)
    models, oracles = zip(*(integer_model(bundle, v) for v in variants))
    plans = [plan(m) for m in models]
    scales = {(m.input_scale, m.input_zero_point) for m in models}
    if len(set(oracles)) != 1:
        raise IntModelError("the bundle mixes int8 variants from ONNX and from TFLite; the firmware takes one kind")
    if len(scales) != 1:
        raise IntModelError(f"variants quantize the input differently ({sorted(scales)}); one input scale is needed")
    x = x_test if max_vectors is None else x_test[:max_vectors]
    x_q = models[0].quantize_input(x)
    expected = [expected_logits(bundle, v, m, x_q) for v, m in zip(variants, models)]
    n_classes = expected[0].shape[1]
    parts = ["/* Generated by trickle export.firmware.cgen from bundle "
             f"{bundle.manifest.model} v{bundle.manifest.bundle_version}. Do not edit. */\n",
             '#include <stdalign.h>\n#include "model.h"\n\n']
    descriptors = []
    for vi, (v, m, mp) in enumerate(zip(variants, models, plans)):
        inits = []
        for li, layer in enumerate(m.layers):
            arrays, init = _layer(f"v{vi}_l{li}", layer)
            table, ref = requant_table(f"v{vi}_l{li}", layer)
            stream, stream_ref = packed_stream(f"v{vi}_l{li}", layer)
            parts.append(arrays + table + stream)
            inits.append(routed(init, mp.routes[li], ref, stream_ref))
        parts.append(f"static const tn_layer v{vi}_layers[{len(inits)}] = {{\n    " + ",\n    ".join(inits) + "\n};\n")
        energy_nj = round(v.energy_j.get(mcu, 0.0) * 1e9)
        accuracy = round(next((v.accuracy[f] for f in INT8_FORMATS if f in v.accuracy), 0.0) * 1000)  # 0: unmeasured
        input_bytes = int(np.prod(x.shape[1:]))
        parts.append(f'const tn_model tn_variant_{vi} = {{"{v.name}", {len(inits)}, v{vi}_layers, {input_bytes}, '
                     f"{n_classes}, {m.macs}, {energy_nj}, {accuracy}, {mp.arena_bytes}u, {mp.input_offset}u}};\n\n")
        descriptors.append({"name": v.name, "macs": m.macs, "energy_nj": energy_nj, "accuracy_permille": accuracy})
    parts.append("const tn_model *const tn_variants[TN_N_VARIANTS] = {" +
                 ", ".join(f"&tn_variant_{i}" for i in range(len(models))) + "};\n")
    device = np.stack([m.device_input(x_q) for m in models])  # the firmware's activations are channels-last
    if np.any(device != device[0]):
        raise IntModelError("variants read their inputs in different orders; one input layout is needed")
    parts.append(_array("int8_t", "tn_inputs_flat", device[0]).replace("static const", "const"))
    parts.append(_array("int32_t", "tn_expected_flat", np.stack(expected, axis=1)).replace("static const", "const"))
    header = (
        "#ifndef TN_MODEL_H\n#define TN_MODEL_H\n#include \"tn.h\"\n"
        f"#define TN_N_VARIANTS {len(models)}\n#define TN_N_VECTORS {len(x_q)}\n"
        f"#define TN_INPUT_BYTES {int(np.prod(x.shape[1:]))}\n#define TN_N_CLASSES {n_classes}\n"
        "extern const tn_model *const tn_variants[TN_N_VARIANTS];\n"
        "/* [vector][row][column][channel]: int8 inputs, channels last (HWC) */\nextern const int8_t tn_inputs_flat[];\n"
        f"/* [vector][variant][class]: {oracles[0]}'s outputs (the oracle) */\n"
        "extern const int32_t tn_expected_flat[];\n#endif\n"
    )
    config = build_config(models, plans)
    info = {"variants": descriptors, "vectors": len(x_q), "n_classes": n_classes, "inputs": x_q, "expected": expected,
            "models": list(models), "oracle": oracles[0], "plans": plans, "config": config,
            "arena_bytes": config["TN_ARENA_BYTES"], "input_bytes": int(np.prod(x.shape[1:]))}
    return {"model.c": "".join(parts), "model.h": header, "tn_config.h": config_header(config)}, info


def generate_early(bundle: Bundle, series: np.ndarray | None = None) -> tuple[dict[str, str], dict[str, Any]]:
    """C sources of a bundle's integer early rule (``early.integer``): the int8 frame model as the one
    variant (its test vectors: the first series' frames, onnxruntime's integer graph the oracle),
    the rule, and test series (raw (n, channels, T); by default the bundle's own) with the
    decisions ``edge.classify.early`` takes on them, which the board must take too."""
    import io

    from edge.classify.early import EarlyDecider

    early = bundle.manifest.early
    if early is not None and early.estimator != "tandem":
        raise IntModelError(f"bundle {bundle.manifest.model}: its early rule reads causal MiniRocket features "
                            f"(estimator {early.estimator!r}), which the firmware does not run; fit "
                            "FirmboundClassifier(estimator='tandem') and export it with calibration series for a board")
    if early is None or early.integer is None:
        raise IntModelError(f"bundle {bundle.manifest.model}: no integer early rule (export.early with calibration "
                            "series)")
    decider = EarlyDecider(bundle, integer=True)
    if series is None:
        if "series.npy" not in bundle.files:
            raise IntModelError(f"bundle {bundle.manifest.model}: no test series (series.npy); give series")
        series = np.load(io.BytesIO(bundle.file("series.npy")), allow_pickle=False)
    series = np.asarray(series, np.float32)
    if series.ndim != 3 or series.shape[1:] != (decider.channels, decider.horizon):
        raise IntModelError(f"test series of shape {series.shape}: expected (n, {decider.channels}, {decider.horizon})")
    q = early.integer
    layers: list[Layer] = [FCLayer(fc.weight, fc.bias, fc.multiplier, fc.shift, fc.input_offset, fc.output_offset, fc.act_min,
                      fc.act_max, q.logit_scale) for fc in decider.layers]
    model = IntModel(input_scale=q.input_scale, input_shape=(decider.channels * decider.context,), layers=layers)
    frame_plan = plan(model)
    samples = np.stack([[decider.quantize(s[:, t]) for t in range(decider.horizon)] for s in series])  # (n, T, C)
    expected = []
    for s in samples:
        decider.reset()
        d = next(d for d in map(decider.update_int8, s) if d.stop)
        expected.append((d.t, d.label))
    # the frame model's own vectors: the frames of the first series, as the device builds them
    ctx, n_frames = decider.context, min(decider.horizon, 8)
    padded = np.concatenate([np.zeros((ctx - 1, decider.channels), np.int8), samples[0]])
    frames = np.stack([padded[t : t + ctx].T.reshape(-1) for t in range(n_frames)])
    logits = integer_logits(model, frames)
    n_classes = logits.shape[1]
    parts = [f"/* Generated by trickle export.firmware.cgen (early rule) from bundle {bundle.manifest.model} "
             f"v{bundle.manifest.bundle_version}. Do not edit. */\n", '#include <stdalign.h>\n#include "model.h"\n\n']
    inits = []
    for li, layer in enumerate(layers):
        arrays, init = _layer(f"v0_l{li}", layer)
        table, ref = requant_table(f"v0_l{li}", layer)
        stream, stream_ref = packed_stream(f"v0_l{li}", layer)
        parts.append(arrays + table + stream)
        inits.append(routed(init, frame_plan.routes[li], ref, stream_ref))
    parts.append(f"static const tn_layer v0_layers[{len(inits)}] = {{\n    " + ",\n    ".join(inits) + "\n};\n")
    parts.append(f'const tn_model tn_variant_0 = {{"frame", {len(inits)}, v0_layers, {frames.shape[1]}, {n_classes}, '
                 f"{model.macs}, 0, 0, {frame_plan.arena_bytes}u, {frame_plan.input_offset}u}};\n\n"
                 "const tn_model *const tn_variants[TN_N_VARIANTS] = {&tn_variant_0};\n")
    pieces = decider.pieces_q
    parts.append(_array("uint32_t", "early_exp", decider.exp_q16) + _array("int32_t", "early_pieces", pieces))
    parts.append(f"const tn_early tn_early_rule = {{&tn_variant_0, {decider.channels}, {ctx}, {decider.horizon}, "
                 f"{n_classes}, {pieces.shape[1]}, {q.logit_zero_point}, {len(decider.exp_q16)}, early_exp, "
                 f"early_pieces, {q.frac_bits}, {q.cost_q}, {q.loss_q}}};\n")
    for name, ctype, values in (("tn_inputs_flat", "int8_t", frames), ("tn_expected_flat", "int32_t", logits),
                                ("tn_early_series_flat", "int8_t", samples),
                                ("tn_early_expected", "uint32_t", np.array(expected))):
        parts.append(_array(ctype, name, values).replace("static const", "const"))
    header = (
        "#ifndef TN_MODEL_H\n#define TN_MODEL_H\n#include \"tn.h\"\n"
        f"#define TN_N_VARIANTS 1\n#define TN_N_VECTORS {len(frames)}\n#define TN_INPUT_BYTES {frames.shape[1]}\n"
        f"#define TN_N_CLASSES {n_classes}\n#define TN_EARLY 1\n#define TN_EARLY_SERIES {len(samples)}\n"
        f"#define TN_EARLY_LENGTH {decider.horizon}\n#define TN_EARLY_CHANNELS {decider.channels}\n"
        "extern const tn_model *const tn_variants[TN_N_VARIANTS];\n"
        "/* [frame][channel][time]: the frame model's int8 inputs */\nextern const int8_t tn_inputs_flat[];\n"
        "/* [frame][1][class]: onnxruntime's outputs of the integer graph (the oracle) */\n"
        "extern const int32_t tn_expected_flat[];\nextern const tn_early tn_early_rule;\n"
        "/* [series][t][channel]: int8 samples */\nextern const int8_t tn_early_series_flat[];\n"
        "/* [series][2]: edge.classify.early's decision (samples taken, class) */\nextern const uint32_t tn_early_expected[];\n"
        "#endif\n"
    )
    info = {"variants": [{"name": "frame", "macs": model.macs, "energy_nj": 0, "accuracy_permille": 0}],
            "vectors": len(frames), "n_classes": n_classes, "inputs": frames, "expected": [logits], "models": [model],
            "oracle": "onnxruntime", "series": len(samples), "decisions": expected, "plans": [frame_plan]}
    config = build_config([model], [frame_plan], extra_column=-(-frames.shape[1] // 2))
    info |= {"config": config, "arena_bytes": config["TN_ARENA_BYTES"], "input_bytes": int(frames.shape[1])}
    return {"model.c": "".join(parts), "model.h": header, "tn_config.h": config_header(config)}, info
