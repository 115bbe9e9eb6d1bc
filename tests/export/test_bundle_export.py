"""Export to a bundle: onnxruntime parity, byte-identical output, signature, and a loud parity failure."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from edge.classify.runtime import Runtime
from edge.contract.bundle import generate_keypair, load_public_key, read_bundle
from edge.contract.vectors import TestVectors
from export.bundle import ExportError, check_parity, export_bundle, export_variant, ort_logits
from models.data.datasets import load
from tests.conftest import TrainedBundle


@pytest.fixture(scope="module")
def checkpoint(trained_bundle: TrainedBundle) -> Path:
    return trained_bundle("basic_motions", "qat8", epochs=3).checkpoint


def test_fp32_bundle_is_signed_reproducible_and_matches_pytorch(checkpoint: Path, tmp_path: Path) -> None:
    priv, pub = tmp_path / "k.key", tmp_path / "k.pub"
    generate_keypair(priv, pub)
    a = export_bundle(checkpoint, tmp_path / "a.tar", formats=("onnx",), key=priv, as_tar=True)
    b = export_bundle(checkpoint, tmp_path / "b.tar", formats=("onnx",), key=priv, as_tar=True)
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    bundle = read_bundle(a, [load_public_key(pub)])
    variant = bundle.manifest.variants[0]
    assert variant.bits == 32 and variant.formats == {"onnx": "fp32-d00.onnx"}
    data = load("basic_motions")
    logits = ort_logits(bundle.file("fp32-d00.onnx"), data.x_test)
    assert float((logits.argmax(1) == data.y_test).mean()) == variant.accuracy["onnx"]
    # the bundle's own test vectors: the first examples of the test split, with onnxruntime's outputs
    info = bundle.manifest.test_vectors
    assert info is not None and info.count == min(32, len(data.y_test))
    vectors = TestVectors.from_bytes(bundle.file(info.file))
    assert np.array_equal(vectors.features, data.x_test[: info.count])
    assert np.array_equal(vectors.labels, data.y_test[: info.count])
    assert np.array_equal(vectors.raw, data.raw_test[: info.count])  # type: ignore[index]
    assert np.array_equal(vectors.expected["fp32-d00"], logits[: info.count])
    report = Runtime(bundle).self_test()
    assert report is not None and report.passed and report.agreement == {"fp32-d00": 1.0}
    assert report.preprocessing_max_abs_diff is not None and report.preprocessing_max_abs_diff <= 1e-6


def test_self_test_catches_a_model_that_does_not_match_its_vectors(checkpoint: Path, tmp_path: Path) -> None:
    from edge.contract.bundle import pack, write_bundle

    bundle = read_bundle(export_bundle(checkpoint, tmp_path / "a", formats=("onnx",), vectors=8))
    vectors = TestVectors.from_bytes(bundle.file("test_vectors.npz"))
    wrong = TestVectors(vectors.features, vectors.labels, {"fp32-d00": np.roll(vectors.expected["fp32-d00"], 1, axis=1)},
                        vectors.raw * 2)  # type: ignore[operator]
    files = {**bundle.files, "test_vectors.npz": wrong.to_bytes()}
    report = Runtime(read_bundle(write_bundle(pack(bundle.manifest, files), tmp_path / "b"))).self_test()
    assert report is not None and not report.passed
    assert report.failures[0].startswith("pre-processing: the raw test vectors become inputs ")
    assert report.failures[1].startswith("fp32-d00: top-1 agrees with the bundle's expected outputs on ")


def test_parity_failure_is_loud(checkpoint: Path) -> None:
    from models.nexume.checkpoint import load_checkpoint

    model, _ = load_checkpoint(checkpoint)
    data = load("basic_motions")
    onnx_bytes = export_variant(model, 32, 0.0, torch.from_numpy(data.x_test[:1]))
    with torch.no_grad():
        model.classifier.bias.add_(1.0)  # the PyTorch model no longer matches the exported graph
    with pytest.raises(ExportError, match=r"fp32-d00: onnx differs from PyTorch by"):
        check_parity(model, 32, 0.0, onnx_bytes, data, "fp32-d00")


def test_unknown_format_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="--formats coreml: must be among onnx,onnx-int8,pte,tflite"):
        export_bundle(checkpoint, tmp_path / "x", formats=("coreml", "onnx"))
    assert not (tmp_path / "x").exists()


def test_executorch_and_tflite_match_pytorch(checkpoint: Path, tmp_path: Path) -> None:
    from edge.classify.backends import load_backend
    from export.bundle import backend_logits
    from models.nexume.checkpoint import load_checkpoint

    bundle = read_bundle(export_bundle(checkpoint, tmp_path / "b", formats=("pte", "tflite")))
    (variant,) = bundle.manifest.variants
    assert variant.formats == {"pte-xnnpack": "fp32-d00.xnnpack.pte", "pte-portable": "fp32-d00.portable.pte",
                                  "tflite": "fp32-d00.tflite"}
    model, _ = load_checkpoint(checkpoint)
    model.configure(32, 0.0)
    data = load("basic_motions")
    with torch.no_grad():
        reference = model(torch.from_numpy(data.x_test)).numpy()
    for fmt, file in variant.formats.items():
        logits = backend_logits(load_backend(fmt, bundle.file(file)), data.x_test)
        assert float(abs(logits - reference).max()) <= 1e-4, fmt
        assert float((logits.argmax(1) == data.y_test).mean()) == variant.accuracy[fmt]


def test_int8_qdq_matches_the_quantized_model_on_a_2d_cnn(trained_bundle: TrainedBundle) -> None:
    # the digits CNN once lost 9 points to onnxruntime's saturating fused u8 x s8 kernels
    trained = trained_bundle("digits", "qat8", epochs=2, formats=("onnx-int8",))
    data = trained.data
    assert trained.bundle is not None
    bundle = read_bundle(trained.bundle)
    (variant,) = bundle.manifest.variants
    assert (variant.bits, variant.drop) == (8, 0.0)
    logits = ort_logits(bundle.file(variant.formats["onnx-int8"]), data.x_test)
    model = copy.deepcopy(trained.result.model).configure(8, 0.0)  # the trained model, shared by the session
    with torch.no_grad():
        reference = model(torch.from_numpy(data.x_test)).numpy()
    assert float((logits.argmax(1) == reference.argmax(1)).mean()) >= 0.99
