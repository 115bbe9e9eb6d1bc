"""A plain ONNX classifier made outside the training code becomes a bundle (fp32 as given, int8 by
onnxruntime's static quantization), runs on the edge runtime and the simulator, and flashes to the
host board bit-exact; an operator the firmware lacks is one line naming it and where it sits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from edge.contract.bundle import read_bundle
from edge.contract.vectors import TestVectors
from edge.core.errors import BundleError, DataError
from export.onnx_import import import_onnx
from tests.helpers import trickle


class TinyNet(nn.Module):
    """Conv-ReLU-Conv-ReLU, mean over time, Linear: a user's model, not the training code's."""

    def __init__(self, pool: bool = False) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(3, 8, 5, stride=2, padding=2)
        self.c2 = nn.Conv1d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16, 4)
        self.pool = nn.MaxPool1d(2) if pool else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c1(x))
        if self.pool is not None:
            x = self.pool(x)
        return self.fc(torch.relu(self.c2(x)).mean(-1))




@pytest.fixture(scope="module")
def user_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("onnx")
    torch.manual_seed(0)
    net = TinyNet().eval()
    torch.onnx.export(net, (torch.randn(1, 3, 40),), str(root / "tiny.onnx"), input_names=["signal"],
                      output_names=["scores"], dynamo=False, opset_version=17)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3, 40)).astype(np.float32)
    with torch.no_grad():
        y = net(torch.from_numpy(x)).argmax(1).numpy()
    np.savez(root / "calib.npz", x=x, y=y)
    return root / "tiny.onnx", root / "calib.npz"


def test_an_onnx_classifier_becomes_a_bundle_the_runtime_and_the_simulator_run(user_model: tuple[Path, Path],
                                                                               tmp_path: Path) -> None:
    model, calib = user_model
    proc = trickle("export", str(model), "--calibration", str(calib), "--out", str(tmp_path / "b"), "--labels",
                   "idle,walk,run,fall")
    assert proc.returncode == 0, proc.stderr
    bundle = read_bundle(tmp_path / "b")
    m = bundle.manifest
    assert m.labels == ["idle", "walk", "run", "fall"] and [v.name for v in m.variants] == ["fp32-d00", "int8-d00"]
    # MACs from the graph: conv1 8 x 20 outputs x 3 x 5 taps, conv2 16 x 20 x 8 x 3, fc 4 x 16
    assert [layer.macs for layer in m.variants[1].layers] == [2400, 7680, 64]
    assert m.variants[0].accuracy["onnx"] == 1.0  # the labels are the fp32 model's own answers
    assert m.variants[1].energy_j["msp430fr5994"] > 0

    from edge.classify.backends import load_backend

    assert m.test_vectors is not None
    vectors = TestVectors.from_bytes(bundle.file(m.test_vectors.file))
    for v in m.variants:
        fmt, file = next(iter(v.formats.items()))
        backend = load_backend(fmt, bundle.file(file))
        got = np.concatenate([backend.run(vectors.features[i : i + 1]) for i in range(len(vectors))])
        np.testing.assert_allclose(got, vectors.expected[v.name], rtol=1e-6, atol=1e-6)

    samples = tmp_path / "samples.npz"
    with np.load(calib) as z:
        np.savez(samples, x=z["x"], y=z["y"])
    proc = trickle("simulate", "--scenario", "rf_powercast", "--bundle", str(tmp_path / "b"), "--samples", str(samples),
                   "--nodes", "1", "--duration-s", "300", "--out", str(tmp_path / "sim"), "--no-progress", "--no-plots")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "sim" / "results.json").read_text())["summary"]["released"] > 0


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler")
def test_the_imported_int8_model_flashes_to_the_host_bit_exact(user_model: tuple[Path, Path], tmp_path: Path) -> None:
    from export.firmware.cgen import firmware_variants
    from export.firmware.intmodel import from_qdq

    model, calib = user_model
    path = import_onnx(model, calib, tmp_path / "b")
    proc = trickle("flash", str(path), "--board", "host", "--out", str(tmp_path / "fw"), "--vectors", "8")
    assert proc.returncode == 0, proc.stderr
    assert "bit-exact with onnxruntime" in proc.stdout
    # the integer model the firmware runs answers as onnxruntime's int8 QDQ graph does
    bundle = read_bundle(path)
    variant = firmware_variants(bundle)[0]
    int_model = from_qdq(bundle.file(variant.formats["onnx-int8"]))
    from export.firmware.cgen import integer_logits

    with np.load(calib) as z:
        x = z["x"]
    from edge.classify.backends import load_backend

    qdq = load_backend("onnx-int8", bundle.file(variant.formats["onnx-int8"]))
    ref = np.concatenate([qdq.run(x[i : i + 1]) for i in range(len(x))]).argmax(1)
    got = integer_logits(int_model, int_model.quantize_input(x)).argmax(1)
    assert (got == ref).mean() >= 0.95


def test_an_operator_the_firmware_lacks_is_named_with_its_place(tmp_path: Path) -> None:
    torch.manual_seed(0)
    torch.onnx.export(TinyNet(pool=True).eval(), (torch.randn(1, 3, 40),), str(tmp_path / "pooled.onnx"),
                      dynamo=False, opset_version=17)
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((32, 3, 40)).astype(np.float32))
    path = import_onnx(tmp_path / "pooled.onnx", tmp_path / "calib.npz", tmp_path / "b")  # the runtime runs it
    proc = trickle("flash", str(path), "--board", "host", "--out", str(tmp_path / "fw"))
    assert proc.returncode == 1
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "operator MaxPool (node " in line and " in the graph) has no firmware kernel" in line


def test_bad_onnx_imports_get_one_line(user_model: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = user_model
    np.savez(tmp_path / "wrong.npz", x=np.zeros((16, 3, 30), np.float32))
    with pytest.raises(DataError, match=r"x holds examples of shape \[3, 30\]; the model takes \[3, 40\]"):
        import_onnx(model, tmp_path / "wrong.npz", tmp_path / "b")
    with pytest.raises(BundleError, match=r"--labels: 2 given, the model has 4 outputs"):
        import_onnx(model, calib, tmp_path / "b", labels=["a", "b"])
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(BundleError, match=r"junk.onnx: not a valid ONNX model"):
        import_onnx(tmp_path / "junk.onnx", calib, tmp_path / "b")
    proc = trickle("export", str(model), "--out", str(tmp_path / "c"))
    assert proc.returncode == 1 and "--calibration = None: an ONNX model needs calibration data" in proc.stderr
