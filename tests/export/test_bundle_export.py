"""Export to a bundle: onnxruntime parity, byte-identical output, signature, and a loud parity failure."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from edge.bundle import generate_keypair, load_public_key, read_bundle
from export.bundle import ExportError, check_parity, export_bundle, export_variant, ort_logits
from models.checkpoint import save_checkpoint
from models.datasets import load
from models.nexume import TrainConfig, train


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = load("basic_motions")
    result = train(TrainConfig(dataset="basic_motions", method="qat8", epochs=3), data)
    out = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(result, data, out)
    return out / "checkpoint.pt"


def test_fp32_bundle_is_signed_reproducible_and_matches_pytorch(checkpoint: Path, tmp_path: Path) -> None:
    priv, pub = tmp_path / "k.key", tmp_path / "k.pub"
    generate_keypair(priv, pub)
    a = export_bundle(checkpoint, tmp_path / "a.tar", formats=("onnx",), key=priv, as_tar=True)
    b = export_bundle(checkpoint, tmp_path / "b.tar", formats=("onnx",), key=priv, as_tar=True)
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    bundle = read_bundle(a, [load_public_key(pub)])
    variant = bundle.manifest["variants"][0]
    assert variant["bits"] == 32 and variant["formats"] == {"onnx": "fp32-d00.onnx"}
    data = load("basic_motions")
    logits = ort_logits(bundle.file("fp32-d00.onnx"), data.x_test)
    assert float((logits.argmax(1) == data.y_test).mean()) == variant["accuracy"]["onnx"]


def test_parity_failure_is_loud(checkpoint: Path) -> None:
    from models.checkpoint import load_checkpoint

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
    from edge.backends import load_backend
    from export.bundle import backend_logits
    from models.checkpoint import load_checkpoint

    bundle = read_bundle(export_bundle(checkpoint, tmp_path / "b", formats=("pte", "tflite")))
    (variant,) = bundle.manifest["variants"]
    assert variant["formats"] == {"pte-xnnpack": "fp32-d00.xnnpack.pte", "pte-portable": "fp32-d00.portable.pte",
                                  "tflite": "fp32-d00.tflite"}
    model, _ = load_checkpoint(checkpoint)
    model.configure(32, 0.0)
    data = load("basic_motions")
    with torch.no_grad():
        reference = model(torch.from_numpy(data.x_test)).numpy()
    for fmt, file in variant["formats"].items():
        logits = backend_logits(load_backend(fmt, bundle.file(file)), data.x_test)
        assert float(abs(logits - reference).max()) <= 1e-4, fmt
        assert float((logits.argmax(1) == data.y_test).mean()) == variant["accuracy"][fmt]


def test_int8_qdq_matches_the_quantized_model_on_a_2d_cnn(tmp_path: Path) -> None:
    # the digits CNN once lost 9 points to onnxruntime's saturating fused u8 x s8 kernels
    data = load("digits")
    result = train(TrainConfig(dataset="digits", method="qat8", epochs=2), data)
    save_checkpoint(result, data, tmp_path / "ckpt")
    out = export_bundle(tmp_path / "ckpt" / "checkpoint.pt", tmp_path / "bundle", formats=("onnx-int8",))
    bundle = read_bundle(out)
    (variant,) = bundle.manifest["variants"]
    assert (variant["bits"], variant["drop"]) == (8, 0.0)
    logits = ort_logits(bundle.file(variant["formats"]["onnx-int8"]), data.x_test)
    result.model.configure(8, 0.0)
    with torch.no_grad():
        reference = result.model(torch.from_numpy(data.x_test)).numpy()
    assert float((logits.argmax(1) == reference.argmax(1)).mean()) >= 0.99
