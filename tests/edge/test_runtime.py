"""The edge runtime runs a verified bundle without torch, and DynInfer picks by voltage."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from edge.bundle import read_bundle
from edge.runtime import Runtime


@pytest.fixture(scope="module")
def bundle_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export.bundle import export_bundle
    from models.checkpoint import save_checkpoint
    from models.datasets import load
    from models.nexume import TrainConfig, train

    data = load("basic_motions")
    result = train(TrainConfig(dataset="basic_motions", method="nexume", epochs=2, harvest_scenario="rf_powercast"), data)
    root = tmp_path_factory.mktemp("rt")
    save_checkpoint(result, data, root / "ckpt")
    return export_bundle(root / "ckpt" / "checkpoint.pt", root / "bundle.tar", as_tar=True)


def test_runtime_matches_export_accuracy(bundle_path: Path) -> None:
    from models.datasets import load

    rt = Runtime(read_bundle(bundle_path))
    data = load("basic_motions")
    for v in rt.variants[:4]:
        fmt = "onnx-int8" if "onnx-int8" in v["formats"] else "onnx"
        preds = [int(rt.infer(x, variant=v["name"]).argmax()) for x in data.x_test]
        assert float(np.mean(np.array(preds) == data.y_test)) == v["accuracy"][fmt]


def test_dyninfer_choice_by_voltage(bundle_path: Path) -> None:
    rt = Runtime(read_bundle(bundle_path))
    rich = rt.choose(voltage_v=3.3, capacitance_f=0.01, v_cut_v=2.0)
    poor = rt.choose(voltage_v=2.0005, capacitance_f=1e-4, v_cut_v=2.0)
    cheapest = min((v for v in rt.variants if v["energy_j"]), key=lambda v: v["energy_j"]["msp430fr5994"])
    assert poor["name"] == cheapest["name"]
    assert rich["energy_j"]["msp430fr5994"] >= poor["energy_j"]["msp430fr5994"]


def test_inference_runs_where_importing_torch_fails(bundle_path: Path, tmp_path: Path) -> None:
    x = np.zeros((6, 100), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    expected = Runtime(read_bundle(bundle_path)).infer(x, variant="int8-d00")
    script = textwrap.dedent(f"""
        import sys, importlib.abc
        class NoTorch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is not allowed on the device")
        sys.meta_path.insert(0, NoTorch())
        import numpy as np
        from edge.bundle import read_bundle
        from edge.runtime import Runtime
        out = Runtime(read_bundle({str(bundle_path)!r})).infer(np.load({str(tmp_path / 'x.npy')!r}), variant="int8-d00")
        np.save({str(tmp_path / 'y.npy')!r}, out)
        assert "torch" not in sys.modules
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(tmp_path / "y.npy"), expected)
