"""Checkpoint → signed, reproducible bundle: ONNX fp32 and int8 (QDQ), ExecuTorch and TFLite, parity-checked.

    trickle export runs/train/digits-nexume/checkpoint.pt --out bundles/digits --key keys/signing.key

Each stage is a plain function over plain values (ExecuTorch's export flow is the model):
``load_checkpoint`` → ``export_file`` (bytes per format) → ``check_parity`` (with the device
backend of that format: onnxruntime, ExecuTorch runtime, LiteRT) → ``manifest`` →
``edge.contract.bundle.pack`` → folder or tar. The same checkpoint and options give byte-identical files.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edge.classify.backends import Backend, load_backend, quiet
from edge.contract.bundle import load_private_key, pack, write_bundle
from edge.contract.manifest import SCHEMA_VERSION, Layer, Preprocessing, Tensor, TestVectorsInfo, Variant
from edge.contract.vectors import FILE as VECTORS_FILE
from edge.contract.vectors import TestVectors
from edge.core.errors import ExportError
from export.formats import FILE_FORMATS, FLOAT_FORMATS, FORMATS, TEST_VECTORS
from models.data.base import Dataset
from models.data.datasets import dataset_name
from models.nexume.checkpoint import checkpoint_data, load_checkpoint
from models.nexume.switchable import FLOAT_BITS, SwitchableNet
from models.nexume.train import calibrate_int8, deployable_variants, drop_levels, variant_energy_j
from simulator.devices import MCUS

OPSET = 17
FP32_MAX_ABS_DIFF = 1e-4
INT8_MIN_AGREEMENT = 0.99
INT8_MAX_ACCURACY_LOSS = 0.01


@dataclass(frozen=True)
class VariantFiles:
    """One variant as exported: its name, bit-width and dropout, its file per format and the accuracy
    measured with each format's runtime."""

    name: str
    bits: int
    drop: float
    files: dict[str, tuple[str, bytes]]  # manifest format -> (file name, bytes)
    accuracy: dict[str, float]  # manifest format -> test accuracy measured with that format's runtime
    logits: np.ndarray  # outputs on the test split from the first format's runtime


def export_variant(model: SwitchableNet, bits: int, drop: float, example: torch.Tensor) -> bytes:
    """ONNX bytes of one variant: float graph for bits = 32, brevitas QCDQ (int8 QDQ) otherwise."""
    model.eval()
    model.configure(bits, drop)
    with quiet(), tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        if bits == FLOAT_BITS:
            torch.onnx.export(model, (example,), str(path), input_names=["x"], output_names=["logits"], dynamo=False,
                              opset_version=OPSET)
        else:
            from brevitas.export import export_onnx_qcdq

            export_onnx_qcdq(model, args=example, export_path=str(path), opset_version=OPSET, dynamo=False,
                             input_names=["x"], output_names=["logits"])
        return compact_onnx(path.read_bytes())


def compact_onnx(model_bytes: bytes) -> bytes:
    """The same graph with short value and node names and no doc strings.

    Exporters name every value after its module path (``/convs.2/quant.8/weight_quant/...``):
    a third of an int8 file of this size. The graph's inputs and outputs keep their names.
    """
    import onnx

    model = onnx.load_from_string(model_bytes)
    graph = model.graph
    keep = {v.name for v in graph.input} | {v.name for v in graph.output}
    names: dict[str, str] = {}

    def short(name: str) -> str:
        if not name or name in keep:
            return name
        return names.setdefault(name, f"t{len(names)}")

    for init in graph.initializer:
        init.name = short(init.name)
    for i, node in enumerate(graph.node):
        node.name = f"n{i}"
        node.doc_string = ""
        node.input[:] = [short(n) for n in node.input]
        node.output[:] = [short(n) for n in node.output]
    for info in graph.value_info:
        info.name = short(info.name)
    graph.doc_string = ""
    model.doc_string = ""
    onnx.checker.check_model(model)
    return model.SerializeToString(deterministic=True)


def export_pte(model: SwitchableNet, drop: float, example: torch.Tensor, delegate: bool) -> bytes:
    """ExecuTorch program of the float variant: XNNPACK-delegated, or on the portable kernels."""
    model.eval()
    model.configure(FLOAT_BITS, drop)
    with quiet():
        from executorch.exir import to_edge, to_edge_transform_and_lower

        program = torch.export.export(model, (example,))
        if delegate:
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

            edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
        else:
            edge = to_edge(program)
        return bytes(edge.to_executorch().buffer)


def export_tflite(model: SwitchableNet, drop: float, example: torch.Tensor) -> bytes:
    """TFLite flatbuffer of the float variant, converted by litert-torch."""
    model.eval()
    model.configure(FLOAT_BITS, drop)
    with quiet(), tempfile.TemporaryDirectory() as tmp:
        import litert_torch

        path = Path(tmp) / "model.tflite"
        litert_torch.convert(model, (example,)).export(str(path))
        return path.read_bytes()


def export_file(model: SwitchableNet, bits: int, drop: float, fmt: str, example: torch.Tensor) -> bytes:
    """Bytes of one variant in one manifest format."""
    if fmt in ("onnx", "onnx-int8"):
        return export_variant(model, bits, drop, example)
    if fmt in ("pte-xnnpack", "pte-portable"):
        return export_pte(model, drop, example, delegate=fmt == "pte-xnnpack")
    if fmt == "tflite":
        return export_tflite(model, drop, example)
    raise ExportError(f"format {fmt!r}: not one this exporter writes")


def backend_logits(backend: Backend, x: np.ndarray) -> np.ndarray:
    """A backend's outputs for every row of x, at batch 1 (the graph's shape)."""
    return np.concatenate([backend.run(x[i : i + 1]) for i in range(len(x))])


def ort_logits(onnx_bytes: bytes, x: np.ndarray) -> np.ndarray:
    """onnxruntime's outputs for every row of x, with the device's session settings."""
    return backend_logits(load_backend("onnx", onnx_bytes), x)


@torch.no_grad()
def check_parity(model: SwitchableNet, bits: int, drop: float, model_bytes: bytes, data: Dataset, label: str,
                 fmt: str = "onnx") -> tuple[float, np.ndarray]:
    """Raise ExportError unless the format's runtime matches PyTorch; returns that runtime's test
    accuracy and its outputs on the test split."""
    model.configure(bits, drop)
    ref = model(torch.from_numpy(data.x_test)).numpy()
    with quiet():
        got = backend_logits(load_backend(fmt, model_bytes), data.x_test)
    acc = float((got.argmax(1) == data.y_test).mean())
    if bits == FLOAT_BITS:
        diff = float(np.abs(got - ref).max())
        if diff > FP32_MAX_ABS_DIFF:
            raise ExportError(f"{label}: {fmt} differs from PyTorch by {diff:.2e} > {FP32_MAX_ABS_DIFF:g}")
        return acc, got
    agreement = float((got.argmax(1) == ref.argmax(1)).mean())
    acc_torch = float((ref.argmax(1) == data.y_test).mean())
    if agreement < INT8_MIN_AGREEMENT or abs(acc - acc_torch) > INT8_MAX_ACCURACY_LOSS:
        raise ExportError(f"{label}: {fmt} agrees with the quantized PyTorch model on {agreement:.1%} of the "
                          f"test set (need {INT8_MIN_AGREEMENT:.0%}), accuracy {acc:.3f} vs {acc_torch:.3f}")
    return acc, got


def variant_plan(method: str, formats: Sequence[str], drops: Sequence[float] | None = None
                 ) -> list[tuple[int, float, list[str]]]:
    """(bits, drop, manifest formats) for every variant the bundle carries: the float graph of each
    dropout level the model runs, and the quantized graph of each (bits, drop) it was trained for."""
    deployable = [(b, d) for b, d in deployable_variants(method) if drops is None or d in drops]
    float_formats = [f for fmt in FLOAT_FORMATS if fmt in formats for f in FILE_FORMATS[fmt]]
    plan: list[tuple[int, float, list[str]]] = []
    for drop in sorted({d for _, d in deployable}):
        if float_formats:
            plan.append((FLOAT_BITS, drop, float_formats))
        if "onnx-int8" in formats:
            plan.extend((bits, d, ["onnx-int8"]) for bits, d in deployable if d == drop)
    return plan


def manifest(payload: dict[str, Any], model: SwitchableNet, data: Dataset, variants: list[VariantFiles],
             bundle_version: int, creator: str, vectors: int) -> dict[str, Any]:
    """The manifest's fields, typed, but for ``files``: ``edge.contract.bundle.pack`` adds their hashes and
    validates the whole as an ``edge.contract.manifest.Manifest``."""
    cfg = payload["config"]
    entries = []
    for v in variants:
        bits_on_device = 8 if v.bits == FLOAT_BITS else v.bits
        layers = [Layer(name=c.name, macs=c.macs, outputs=c.outputs,
                        param_bytes=math.ceil(c.weights * min(v.bits, 8) / 8) if v.bits != FLOAT_BITS else c.weights * 4)
                  for c in model.layer_costs(v.drop)]
        energy = {} if v.bits == FLOAT_BITS else {m: variant_energy_j(model, bits_on_device, v.drop, m) for m in sorted(MCUS)}
        entries.append(Variant(name=v.name, bits=v.bits, drop=v.drop, layers=layers, energy_j=energy,
                               accuracy=v.accuracy, formats={fmt: file for fmt, (file, _) in v.files.items()}))
    return {
        "schema_version": SCHEMA_VERSION, "model": f"{dataset_name(cfg['dataset'])}-{cfg['method']}",
        "task": dataset_name(cfg["dataset"]),
        "labels": payload["labels"],
        "inputs": [Tensor(name="x", shape=[1, *data.input_shape], dtype="float32")],
        "outputs": [Tensor(name="logits", shape=[1, len(payload["labels"])], dtype="float32")],
        "preprocessing": Preprocessing.model_validate(payload["preprocessing"]),
        "variants": entries, "creator": creator, "bundle_version": bundle_version,
        "test_vectors": TestVectorsInfo(file=VECTORS_FILE, count=vectors),
    }


def collect_test_vectors(data: Dataset, variants: list[VariantFiles], count: int) -> TestVectors:
    """The first ``count`` test examples, stratified by nothing but order (the test split is already
    shuffled or split by speaker), with every variant's outputs from its own runtime."""
    n = min(count, len(data.y_test))
    raw = data.raw_test[:n] if data.raw_test is not None else None
    return TestVectors(data.x_test[:n], data.y_test[:n], {v.name: v.logits[:n] for v in variants}, raw)


def export_bundle(checkpoint: Path, out: Path, formats: Sequence[str] = FORMATS, key: Path | None = None,
                  as_tar: bool = False, bundle_version: int = 1, data_root: Path | None = None,
                  progress: Callable[[str], None] | None = None, vectors: int = TEST_VECTORS,
                  module: torch.nn.Module | None = None, dataset: str | None = None) -> Path:
    """Write the bundle of ``checkpoint`` to ``out`` (a folder, or a .tar with ``as_tar``); returns the path.
    ``dataset``: where the user's data trained on is now, if not at the path the checkpoint records."""
    from edge import __version__

    unknown = sorted(set(formats) - set(FORMATS))
    if unknown or not formats:
        raise ExportError(f"--formats {','.join(unknown)}: must be among {','.join(FORMATS)}")
    model, payload = load_checkpoint(checkpoint, module)
    method = payload["config"]["method"]
    data = checkpoint_data(checkpoint, payload, dataset, data_root)  # the same split as in training
    if method == "fp32" and "onnx-int8" in formats:
        calibrate_int8(model, data.x_train)  # a float model is quantized after training
    example = torch.tensor(data.x_test[:1])  # fresh strides: ExecuTorch refuses a 0 stride
    variants: list[VariantFiles] = []
    suffix = {f: sfx for per in FILE_FORMATS.values() for f, sfx in per.items()}
    for bits, drop, fmts in variant_plan(method, formats, drop_levels(model)):
        name = f"{'fp32' if bits == FLOAT_BITS else f'int{bits}'}-d{round(drop * 100):02d}"
        files: dict[str, tuple[str, bytes]] = {}
        accuracy: dict[str, float] = {}
        outputs: list[np.ndarray] = []
        for fmt in fmts:
            blob = export_file(model, bits, drop, fmt, example)
            accuracy[fmt], logits = check_parity(model, bits, drop, blob, data, name, fmt)
            outputs.append(logits)
            files[fmt] = (f"{name}{suffix[fmt]}", blob)
            if progress:
                progress(f"{name} {fmt}")
        variants.append(VariantFiles(name, bits, drop, files, accuracy, outputs[0]))
    vector_data = collect_test_vectors(data, variants, vectors)
    doc = manifest(payload, model, data, variants, bundle_version, f"trickle {__version__}", len(vector_data))
    files_out = {file: blob for v in variants for file, blob in v.files.values()}
    files_out[VECTORS_FILE] = vector_data.to_bytes()
    members = pack(doc, files_out, load_private_key(key) if key else None)
    return write_bundle(members, out.with_suffix(".tar") if as_tar else out)
