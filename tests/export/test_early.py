"""A FIRMBOUND rule as a bundle: the device's streaming decider (numpy and onnxruntime, no torch)
stops where the trained estimator stops, with the same class."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from edge.bundle import read_bundle
from edge.early import EarlyDecider
from edge.errors import DataError, ExportError
from export.early import export_early
from models.firmbound import FirmboundClassifier, gaussian_sequences

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def fitted() -> FirmboundClassifier:
    x, y, _ = gaussian_sequences(1500, n_classes=3, dim=6, length=16, offset=0.8, seed=0)
    return FirmboundClassifier(cost=0.1, hidden=16, context=2, epochs=15).fit(x, y)


def test_the_device_decides_where_the_estimator_does(fitted: FirmboundClassifier, tmp_path: Path) -> None:
    path = export_early(fitted, tmp_path / "b", labels=["a", "b", "c"], name="toy")
    bundle = read_bundle(path)
    assert bundle.manifest.early is not None and bundle.manifest.early.horizon == 16
    xt, yt, _ = gaussian_sequences(300, n_classes=3, dim=6, length=16, offset=0.8, seed=1)
    tau, pred = fitted.decisions(xt)
    decider = EarlyDecider(bundle)
    got = [decider.run(series) for series in xt]
    same = np.mean([d.t == t and d.label == p for d, t, p in zip(got, tau, pred)])
    assert same >= 0.99  # float32 onnxruntime against torch: a tie on the boundary may flip
    assert 2 < np.mean([d.t for d in got]) < 15 and np.mean([d.label == c for d, c in zip(got, yt)]) > 0.9
    d = got[0]
    np.testing.assert_allclose(d.llr, -d.llr.T)
    assert d.posterior.sum() == pytest.approx(1.0)
    # streaming: once final, the decision stands
    decider.reset()
    first = next(dec for dec in (decider.update(s) for s in xt[0].T) if dec.stop)
    assert decider.update(xt[0][:, -1]) is first
    decider.reset()
    with pytest.raises(DataError, match=r"the model takes \(6,\)"):
        decider.update(np.zeros(5))
    # the command line streams a series file
    np.save(tmp_path / "s.npy", xt[0])
    proc = subprocess.run([sys.executable, "-m", "trickle", "edge", "infer", str(path), str(tmp_path / "s.npy"), "--early",
                           "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout)
    assert line["samples"] == got[0].t and line["label"] == "abc"[got[0].label] and line["horizon"] == 16
    # a series the wrong way round is one line; the classifier runtime refuses the bundle in one line
    np.savetxt(tmp_path / "s.csv", xt[0].T, delimiter=",")
    proc = subprocess.run([sys.executable, "-m", "trickle", "edge", "infer", str(path), str(tmp_path / "s.csv"), "--early"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1 and "one row per channel" in proc.stderr
    from edge.errors import BundleError
    from edge.runtime import Runtime

    with pytest.raises(BundleError, match="decides early"):
        Runtime(bundle)
    # the same classifier exports byte for byte the same bundle
    again = export_early(fitted, tmp_path / "again", labels=["a", "b", "c"], name="toy")
    assert {p.name: p.read_bytes() for p in path.iterdir()} == {p.name: p.read_bytes() for p in again.iterdir()}


def test_a_gp_rule_does_not_export(tmp_path: Path) -> None:
    x, y, _ = gaussian_sequences(300, dim=4, length=6, offset=0.8, seed=0)
    clf = FirmboundClassifier(method="gp", hidden=0, epochs=2).fit(x, y)
    with pytest.raises(ExportError, match="only a cfl rule exports"):
        export_early(clf, tmp_path / "b")
