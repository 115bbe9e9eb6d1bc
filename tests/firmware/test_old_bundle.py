"""A bundle exported before bundles carried test vectors still flashes, given model inputs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import SUBPROCESS_TIMEOUT_S

OLD = Path(__file__).parents[1] / "edge" / "data" / "digits-v1-2026-11.tar"


def _flash(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trickle", "flash", str(OLD), *args], capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S)


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("make") is None, reason="needs gcc and make")
def test_an_old_bundle_flashes_on_the_host_with_inputs_given(tmp_path: Path) -> None:
    refused = _flash("--board", "host", "--out", str(tmp_path / "a"))
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert "carries no test vectors (it predates them)" in refused.stderr and "--inputs X.npy" in refused.stderr
    from models.data.datasets import load

    np.save(tmp_path / "x.npy", load("digits").x_test[:6])
    ok = _flash("--board", "host", "--out", str(tmp_path / "b"), "--inputs", str(tmp_path / "x.npy"))
    assert ok.returncode == 0, ok.stderr
    assert "6 test vectors x 3 variants" in ok.stdout and "bit-exact with onnxruntime" in ok.stdout
    np.save(tmp_path / "bad.npy", np.zeros((2, 8, 8), dtype=np.float32))
    bad = _flash("--board", "host", "--out", str(tmp_path / "c"), "--inputs", str(tmp_path / "bad.npy"))
    assert bad.returncode == 1 and "shape (2, 8, 8), the model takes (N, 1, 8, 8)" in bad.stderr
