"""A classifier the user brings as ONNX, bundled like a trained one.

    trickle export model.onnx --calibration calib.npz --out bundles/mine [--labels a,b,c] [--key K]

The fp32 variant is the model as given (batch fixed to 1). The int8 variant is onnxruntime's
static quantization of it in QDQ form (symmetric int8 activations and weights, per tensor,
min/max calibrated on ``calibration['x']``), which ``trickle flash`` reads into the firmware's
integer kernels when its operators are ones they cover. Each layer's MACs come from the graph's
inferred shapes and price the variant on every MCU with the shared cost model. With labels
(``calibration['y']``) the variants' accuracies are measured; the int8 variant must agree with
the fp32 one on the top class of at least ``MIN_AGREEMENT`` of the examples.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edge.contract.bundle import load_private_key, pack, write_bundle
from edge.contract.manifest import SCHEMA_VERSION
from edge.contract.vectors import FILE as VECTORS_FILE
from edge.contract.vectors import TestVectors
from edge.core.errors import BundleError, DataError
from export.bundle import compact_onnx, ort_logits
from simulator.devices import MCUS

MIN_AGREEMENT = 0.95
COST_OPS = ("Conv", "Gemm", "MatMul")


class OnnxImportError(BundleError):
    """The ONNX file or its calibration data cannot become a bundle."""


def _read(path: Path) -> Any:
    import onnx

    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as e:  # onnx raises its own ValidationError, DecodeError, ...
        raise OnnxImportError(f"{path}: not a valid ONNX model: {str(e).splitlines()[0]}") from None
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if len(inputs) != 1 or len(model.graph.output) != 1:
        raise OnnxImportError(f"{path}: needs one input and one output (has {len(inputs)} and {len(model.graph.output)})")
    for value in (inputs[0], model.graph.output[0]):
        dims = value.type.tensor_type.shape.dim
        for k, d in enumerate(dims):
            if k == 0:
                d.Clear()
                d.dim_value = 1  # a device runs one example at a time
            elif not d.dim_value and value is inputs[0]:
                raise OnnxImportError(f"{path}: input {value.name!r} has a free dimension {k} ({d.dim_param or '?'}); "
                                   "give it a fixed size")
    return model


def _layers(model: Any) -> list[dict[str, Any]]:
    """MACs, parameter count and output size of every Conv, Gemm and MatMul, from inferred shapes."""
    import onnx
    from onnx import numpy_helper

    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)}
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    layers = []
    for k, node in enumerate(model.graph.node):
        if node.op_type not in COST_OPS:
            continue
        out = shapes.get(node.output[0])
        weight = inits.get(node.input[1])
        if not out or not all(out) or weight is None:
            raise OnnxImportError(f"{node.op_type} node {node.name or k!r}: its output shape or weights are not "
                               "static; the cost model needs both")
        per_output = math.prod(weight.shape[1:]) if node.op_type == "Conv" else (
            weight.shape[1] if node.op_type == "Gemm" and _attr(node, "transB") else weight.shape[0])
        layers.append({"name": node.name or f"{node.op_type.lower()}{k}", "macs": int(math.prod(out) * per_output),
                       "params": int(weight.size + (inits[node.input[2]].size if len(node.input) > 2 and node.input[2]
                                                    in inits else 0)),
                       "outputs": int(math.prod(out))})
    if not layers:
        raise OnnxImportError("the model has no Conv, Gemm or MatMul with weights: nothing for the cost model to price")
    return layers


def _attr(node: Any, name: str) -> Any:
    import onnx

    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)


def _quantize(fp32: bytes, x: np.ndarray, input_name: str) -> bytes:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.rows = iter(range(len(x)))

        def get_next(self) -> dict[str, np.ndarray] | None:
            i = next(self.rows, None)
            return None if i is None else {input_name: x[i : i + 1]}

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        src.write_bytes(fp32)
        import logging

        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # onnxruntime suggests pre-processing on the root logger at every call
        try:
            quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                            weight_type=QuantType.QInt8, per_channel=False,
                            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
        finally:
            root.setLevel(level)
        return compact_onnx(dst.read_bytes())


def import_onnx(model_path: Path, calibration: Path, out: Path, labels: list[str] | None = None,
                key: Path | None = None, as_tar: bool = False, bundle_version: int = 1, vectors: int = 16,
                progress: Callable[[str], None] | None = None) -> Path:
    """Write the bundle of the ONNX classifier at ``model_path``; returns its path."""
    from edge import __version__

    model = _read(model_path)
    input_name = next(i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer})
    in_shape = [d.dim_value for d in next(i for i in model.graph.input if i.name == input_name)
                .type.tensor_type.shape.dim][1:]
    x, y = _calibration(calibration, in_shape)
    layers = _layers(model)
    fp32 = compact_onnx(model.SerializeToString())
    out_fp32 = ort_logits(_renamed(fp32), x)
    names = class_names(model_path, out_fp32, labels, OnnxImportError)
    n_classes = len(names)
    if progress:
        progress("fp32 read")
    int8 = _quantize(fp32, x, input_name)
    out_int8 = ort_logits(_renamed(int8), x)
    agreement = float((out_int8.argmax(1) == out_fp32.argmax(1)).mean())
    if agreement < MIN_AGREEMENT:
        raise OnnxImportError(f"the int8 model agrees with the fp32 one on the top class of {agreement:.1%} of the "
                           f"calibration examples (need {MIN_AGREEMENT:.0%}): calibrate on more typical data")
    if progress:
        progress(f"int8 quantized (top-1 agreement {agreement:.1%})")
    stem = model_path.stem
    files = {"fp32-d00.onnx": _renamed(fp32), "int8-d00.onnx": _renamed(int8)}
    n = min(vectors, len(x))
    truth = y if y is not None else out_fp32.argmax(1)
    vector_data = TestVectors(x[:n], truth[:n], {"fp32-d00": out_fp32[:n], "int8-d00": out_int8[:n]}, x[:n])
    files[VECTORS_FILE] = vector_data.to_bytes()

    def variant(name: str, bits: int, logits: np.ndarray, fmt: str) -> dict[str, Any]:
        size = 4 if bits == 32 else 1
        energy = {} if bits == 32 else {m: p.compute_energy_j(sum(la["macs"] for la in layers)) for m, p in MCUS.items()}
        return {"name": name, "bits": bits, "drop": 0.0, "formats": {fmt: f"{name}.onnx"}, "energy_j": energy,
                "accuracy": {} if y is None else {fmt: float((logits.argmax(1) == y).mean())},
                "layers": [{"name": la["name"], "macs": la["macs"], "param_bytes": la["params"] * size,
                            "outputs": la["outputs"]} for la in layers]}

    doc = {
        "schema_version": SCHEMA_VERSION, "model": stem, "task": stem, "labels": names,
        "inputs": [{"name": "x", "shape": [1, *in_shape], "dtype": "float32"}],
        "outputs": [{"name": "logits", "shape": [1, n_classes], "dtype": "float32"}],
        "preprocessing": {"description": f"the model's input as given ({model_path.name}, imported)",
                          "raw": {"shape": in_shape, "dtype": "float32"}, "steps": []},
        "variants": [variant("fp32-d00", 32, out_fp32, "onnx"), variant("int8-d00", 8, out_int8, "onnx-int8")],
        "creator": f"trickle {__version__}", "bundle_version": bundle_version,
        "test_vectors": {"file": VECTORS_FILE, "count": n},
    }
    members = pack(doc, files, load_private_key(key) if key else None)
    return write_bundle(members, out.with_suffix(".tar") if as_tar else out)


def class_names(model_path: Path, logits: np.ndarray, labels: list[str] | None, error: type[BundleError]) -> list[str]:
    """The class names of a classifier whose outputs on the examples are ``logits``: ``labels`` or 0, 1, ..."""
    if logits.ndim != 2:
        raise error(f"{model_path}: the output has shape {list(logits.shape)} per batch; a classifier's is (1, classes)")
    n_classes = logits.shape[1]
    names = labels or [str(i) for i in range(n_classes)]
    if len(names) != n_classes:
        raise error(f"--labels: {len(names)} given, the model has {n_classes} outputs")
    return names


def _renamed(onnx_bytes: bytes) -> bytes:
    """The graph with its input named ``x`` and its output ``logits``, as every bundle's are."""
    import onnx

    model = onnx.load_from_string(onnx_bytes)
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    old_in = next(i.name for i in graph.input if i.name not in inits)
    old_out = graph.output[0].name
    for value, new in ((next(i for i in graph.input if i.name == old_in), "x"), (graph.output[0], "logits")):
        value.name = new
    for node in graph.node:
        node.input[:] = ["x" if n == old_in else "logits" if n == old_out else n for n in node.input]
        node.output[:] = ["logits" if n == old_out else n for n in node.output]
    return model.SerializeToString(deterministic=True)


def _calibration(path: Path, in_shape: list[int]) -> tuple[np.ndarray, np.ndarray | None]:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise DataError(f"--calibration {path}: not a readable .npz: {e}") from None
    if "x" not in arrays:
        raise DataError(f"--calibration {path}: needs an array 'x' of model inputs (and optionally labels 'y')")
    x = np.asarray(arrays["x"], dtype=np.float32)
    if list(x.shape[1:]) != in_shape:
        raise DataError(f"--calibration {path}: x holds examples of shape {list(x.shape[1:])}; the model takes "
                        f"{in_shape}")
    if len(x) < 8:
        raise DataError(f"--calibration {path}: {len(x)} examples; give at least 8 to calibrate on")
    y = arrays.get("y")
    if y is not None and len(y) != len(x):
        raise DataError(f"--calibration {path}: y has {len(y)} labels for {len(x)} examples")
    return x, None if y is None else np.asarray(y, dtype=np.int64)
