"""C sources for firmware/ from a bundle's int8 variants: weights, requantization, descriptors, test vectors.

    sources, info = generate(bundle)        # {"model.c": ..., "model.h": ...}, what was generated

Every array is ``alignas(16) const`` (flash on a microcontroller). The test vectors are the
bundle's own (``edge.vectors``; or the inputs given) quantized to int8, and the expected logits
are onnxruntime's outputs of the integer graph (``export.intmodel.integer_onnx``), so a board checks itself bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edge.bundle import Bundle
from edge.manifest import Variant
from edge.vectors import TestVectors
from export.intmodel import ConvLayer, DenseLayer, IntModel, IntModelError, PoolLayer, from_qdq, integer_onnx


def firmware_variants(bundle: Bundle) -> list[Variant]:
    """The bundle's 8-bit QDQ variants, widest first: what the firmware carries."""
    chosen = [v for v in bundle.manifest.variants if v.bits == 8 and "onnx-int8" in v.formats]
    if not chosen:
        raise IntModelError("the bundle has no 8-bit int8 QDQ variant (export with --formats onnx-int8)")
    return sorted(chosen, key=lambda v: v.drop)


def bundle_inputs(bundle: Bundle) -> np.ndarray:
    """The model inputs of the bundle's own test vectors (``edge.vectors``)."""
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
    """A conv's int8 weights as the firmware stores them: one row per output channel, taps in
    (kh, kw, cin) order (activations are HWC), zero-padded to a multiple of four, each group of four as w0, w2, w1, w3
    (what SXTB16 and SXTB16 ROR #8 unpack into the pairs (w0, w1) and (w2, w3))."""
    rows = np.moveaxis(weight, 1, -1).reshape(weight.shape[0], -1)  # OIHW -> OHWI: HWC windows
    depth = -(-rows.shape[1] // 4) * 4
    padded = np.zeros((rows.shape[0], depth), dtype=np.int8)
    padded[:, : rows.shape[1]] = rows
    return padded.reshape(rows.shape[0], depth // 4, 4)[:, :, [0, 2, 1, 3]].reshape(rows.shape[0], depth)


def _layer(prefix: str, layer: ConvLayer | PoolLayer | DenseLayer) -> tuple[str, str]:
    """(arrays, initializer) of one layer."""
    if isinstance(layer, ConvLayer):
        if not np.all((layer.multiplier > 0) & (layer.multiplier < 2**31)):
            raise IntModelError(f"{prefix}: requantization multipliers must be positive Q31 values")
        c_in, *s_in = layer.in_shape
        c_out, *s_out = layer.out_shape
        h_in, w_in = (1, s_in[0]) if len(s_in) == 1 else s_in
        h_out, w_out = (1, s_out[0]) if len(s_out) == 1 else s_out
        kh, kw = (1, layer.weight.shape[2]) if layer.weight.ndim == 3 else layer.weight.shape[2:]
        arrays = (_array("int8_t", f"{prefix}_w", conv_rows(layer.weight)) + _array("int32_t", f"{prefix}_b", layer.bias)
                  + _array("int32_t", f"{prefix}_m", layer.multiplier) + _array("int32_t", f"{prefix}_s", layer.shift))
        init = (f"{{TN_CONV, {c_in}, {h_in}, {w_in}, {c_out}, {h_out}, {w_out}, {kh}, {kw}, {layer.stride}, "
                f"{layer.padding}, {layer.input_offset}, {layer.output_offset}, {layer.act_min}, {layer.act_max}, "
                f"{prefix}_w, {prefix}_b, {prefix}_m, {prefix}_s}}")
        return arrays, init
    if isinstance(layer, PoolLayer):
        c, *s = layer.in_shape
        h, w = (1, s[0]) if len(s) == 1 else s
        return "", f"{{TN_POOL, {c}, {h}, {w}, {c}, 1, 1, 0, 0, 0, 0, {layer.input_offset}, 0, 0, 0, 0, 0, 0, 0}}"
    n_out, n_in = layer.weight.shape
    arrays = _array("int8_t", f"{prefix}_w", layer.weight) + _array("int32_t", f"{prefix}_b", layer.bias)
    return arrays, f"{{TN_DENSE, {n_in}, 1, 1, {n_out}, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, {prefix}_w, {prefix}_b, 0, 0}}"


def generate(bundle: Bundle, x_test: np.ndarray | None = None, mcu: str = "cortex-m4", max_vectors: int | None = None
             ) -> tuple[dict[str, str], dict[str, Any]]:
    """C sources for the firmware and a description (variants, test vectors, expected logits).
    ``x_test``: model inputs to compile in as test vectors; by default the bundle's own."""
    variants = firmware_variants(bundle)
    if x_test is None:
        x_test = bundle_inputs(bundle)
    models = [from_qdq(bundle.file(v.formats["onnx-int8"])) for v in variants]
    scales = {m.input_scale for m in models}
    if len(scales) != 1:
        raise IntModelError(f"variants quantize the input differently ({sorted(scales)}); one input scale is needed")
    x = x_test if max_vectors is None else x_test[:max_vectors]
    x_q = models[0].quantize_input(x)
    expected = [integer_logits(m, x_q) for m in models]
    n_classes = expected[0].shape[1]
    parts = ["/* Generated by trickle export.cgen from bundle "
             f"{bundle.manifest.model} v{bundle.manifest.bundle_version}. Do not edit. */\n",
             '#include <stdalign.h>\n#include "model.h"\n\n']
    descriptors = []
    for vi, (v, m) in enumerate(zip(variants, models)):
        inits = []
        for li, layer in enumerate(m.layers):
            arrays, init = _layer(f"v{vi}_l{li}", layer)
            parts.append(arrays)
            inits.append(init)
        parts.append(f"static const tn_layer v{vi}_layers[{len(inits)}] = {{\n    " + ",\n    ".join(inits) + "\n};\n")
        energy_nj = round(v.energy_j.get(mcu, 0.0) * 1e9)
        accuracy = round(v.accuracy["onnx-int8"] * 1000)
        input_bytes = int(np.prod(x.shape[1:]))
        parts.append(f'const tn_model tn_variant_{vi} = {{"{v.name}", {len(inits)}, v{vi}_layers, {input_bytes}, '
                     f"{n_classes}, {m.macs}, {energy_nj}, {accuracy}}};\n\n")
        descriptors.append({"name": v.name, "macs": m.macs, "energy_nj": energy_nj, "accuracy_permille": accuracy})
    parts.append("const tn_model *const tn_variants[TN_N_VARIANTS] = {" +
                 ", ".join(f"&tn_variant_{i}" for i in range(len(models))) + "};\n")
    hwc = np.moveaxis(x_q, 1, -1)  # the firmware's activations are channels-last
    parts.append(_array("int8_t", "tn_inputs_flat", hwc).replace("static const", "const"))
    parts.append(_array("int32_t", "tn_expected_flat", np.stack(expected, axis=1)).replace("static const", "const"))
    header = (
        "#ifndef TN_MODEL_H\n#define TN_MODEL_H\n#include \"tn.h\"\n"
        f"#define TN_N_VARIANTS {len(models)}\n#define TN_N_VECTORS {len(x_q)}\n"
        f"#define TN_INPUT_BYTES {int(np.prod(x.shape[1:]))}\n#define TN_N_CLASSES {n_classes}\n"
        "extern const tn_model *const tn_variants[TN_N_VARIANTS];\n"
        "/* [vector][row][column][channel]: int8 inputs, channels last (HWC) */\nextern const int8_t tn_inputs_flat[];\n"
        "/* [vector][variant][class]: onnxruntime's int32 logits of the integer graph */\n"
        "extern const int32_t tn_expected_flat[];\n#endif\n"
    )
    info = {"variants": descriptors, "vectors": len(x_q), "n_classes": n_classes, "inputs": x_q, "expected": expected,
            "models": models}
    return {"model.c": "".join(parts), "model.h": header}, info
