"""The edge runtime runs a verified bundle on three backends, without torch, and DynInfer picks by voltage."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from edge.classify.backends import BackendError
from edge.classify.preprocess import PreprocessError
from edge.classify.runtime import Runtime
from edge.contract.bundle import read_bundle
from edge.core.errors import ConfigError, DataError
from tests.conftest import TrainedBundle


@pytest.fixture(scope="module")
def bundle_path(trained_bundle: TrainedBundle) -> Path:
    bundle = trained_bundle("basic_motions", "nexume", epochs=2, formats="all", as_tar=True,
                            harvest_scenario="rf_powercast").bundle
    assert bundle is not None
    return bundle


@pytest.mark.parametrize("backend", ["onnxruntime", "litert", "executorch"])
def test_every_backend_reproduces_the_manifest_accuracy_from_raw_input(bundle_path: Path, backend: str) -> None:
    from models.data.datasets import load

    data = load("basic_motions")
    assert data.raw_test is not None
    rt = Runtime(read_bundle(bundle_path), backend=backend)
    assert len(rt.variants) == (12 if backend == "onnxruntime" else 3)
    for v in rt.variants[:4]:
        preds = [int(rt.infer(raw, variant=v.name).argmax()) for raw in data.raw_test]  # pre-processing applied
        assert float(np.mean(np.array(preds) == data.y_test)) == v.accuracy[rt.format_of(v)]


def test_backends_agree_on_the_float_variant(bundle_path: Path) -> None:
    from models.data.datasets import load

    data = load("basic_motions")
    bundle = read_bundle(bundle_path)
    outputs = {b: np.concatenate([Runtime(bundle, backend=b).infer_features(x, variant="fp32-d25") for x in data.x_test])
               for b in ("onnxruntime", "litert", "executorch")}
    assert np.abs(outputs["litert"] - outputs["onnxruntime"]).max() <= 1e-4
    assert np.abs(outputs["executorch"] - outputs["onnxruntime"]).max() <= 1e-4


def test_dyninfer_choice_by_voltage(bundle_path: Path) -> None:
    rt = Runtime(read_bundle(bundle_path))
    rich = rt.choose(voltage_v=3.3, capacitance_f=0.01, v_cut_v=2.0)
    poor = rt.choose(voltage_v=2.0005, capacitance_f=1e-4, v_cut_v=2.0)
    cheapest = min((v for v in rt.variants if v.energy_j), key=lambda v: v.energy_j["msp430fr5994"])
    assert poor.name == cheapest.name
    assert rich.energy_j["msp430fr5994"] >= poor.energy_j["msp430fr5994"]


def test_bad_input_and_unknown_backend_or_variant(bundle_path: Path) -> None:
    bundle = read_bundle(bundle_path)
    rt = Runtime(bundle)
    with pytest.raises(PreprocessError, match=r"raw input shape \(100, 6\): this bundle takes \(6, 100\)"):
        rt.infer(np.zeros((100, 6), dtype=np.float32))
    with pytest.raises(ConfigError, match="--variant = 'int8-d00': for the litert backend the bundle has"):
        Runtime(bundle, backend="litert").variant("int8-d00")
    with pytest.raises(ConfigError, match="--backend = 'tvm': must be one of"):
        Runtime(bundle, backend="tvm")
    with pytest.raises(DataError, match=r"input shape \(1, 6, 99\): the model takes \(1, 6, 100\)"):
        rt.infer_features(np.zeros((1, 6, 99), dtype=np.float32))
    with pytest.raises(BackendError, match="LiteRT cannot load the model"):
        from edge.classify.backends import load_backend

        load_backend("tflite", b"not a flatbuffer")


def test_inference_runs_where_importing_torch_fails(bundle_path: Path, tmp_path: Path) -> None:
    x = np.linspace(-1, 1, 600, dtype=np.float32).reshape(6, 100)
    np.save(tmp_path / "x.npy", x)
    bundle = read_bundle(bundle_path)
    runs = (("onnxruntime", "int8-d00"), ("litert", "fp32-d00"))
    expected = {b: Runtime(bundle, backend=b).infer(x, variant=v) for b, v in runs}
    script = textwrap.dedent(f"""
        import sys, importlib.abc
        class NoTorch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is not allowed on the device")
        sys.meta_path.insert(0, NoTorch())
        import numpy as np
        from edge.contract.bundle import read_bundle
        from edge.classify.runtime import Runtime
        bundle = read_bundle({str(bundle_path)!r})
        x = np.load({str(tmp_path / 'x.npy')!r})
        np.save({str(tmp_path / 'ort.npy')!r}, Runtime(bundle).infer(x, variant="int8-d00"))
        np.save({str(tmp_path / 'litert.npy')!r}, Runtime(bundle, backend="litert").infer(x, variant="fp32-d00"))
        assert "torch" not in sys.modules
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(tmp_path / "ort.npy"), expected["onnxruntime"])
    assert np.array_equal(np.load(tmp_path / "litert.npy"), expected["litert"])


def test_trickle_edge_infer(bundle_path: Path, tmp_path: Path) -> None:
    import json

    from models.data.datasets import load

    data = load("basic_motions")
    assert data.raw_test is not None
    np.save(tmp_path / "a.npy", data.raw_test[0])
    np.savetxt(tmp_path / "b.csv", data.raw_test[1], delimiter=",")
    cmd = [sys.executable, "-m", "trickle.cli", "edge", "infer", str(bundle_path), str(tmp_path / "a.npy"),
           str(tmp_path / "b.csv")]
    for backend in ("onnxruntime", "litert"):
        proc = subprocess.run([*cmd, "--backend", backend, "--json"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        rows = [json.loads(line) for line in proc.stdout.splitlines()]
        rt = Runtime(read_bundle(bundle_path), backend=backend)
        for row, raw in zip(rows, data.raw_test[:2]):
            assert row["variant"] == rt.choose().name
            assert np.allclose(row["logits"], rt.infer(raw)[0], atol=1e-6)
    bad = subprocess.run([*cmd[:-2], str(tmp_path / "missing.npy")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stderr.strip().endswith("missing.npy: no such file")
    mcu = subprocess.run([*cmd, "--voltage-v", "3.0", "--mcu", "z80"], capture_output=True, text=True, timeout=120)
    assert mcu.returncode == 1 and mcu.stderr.count("\n") == 1  # one line, no traceback, no silent zero energy
    assert "--mcu = 'z80': the bundle has energy costs for ['cortex-m33', 'cortex-m4', 'msp430fr5994']" in mcu.stderr
    selftest = subprocess.run([*cmd[:-2], "--self-test", "--json"], capture_output=True, text=True, timeout=120)
    assert selftest.returncode == 0, selftest.stderr
    report = json.loads(selftest.stdout)
    assert report["passed"] and set(report["agreement"]) == {v.name for v in Runtime(read_bundle(bundle_path)).variants}
