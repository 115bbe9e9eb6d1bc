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

from edge.classify.early import EarlyDecider
from edge.contract.bundle import read_bundle
from edge.core.errors import DataError, ExportError
from export.early import export_early
from models.firmbound import FirmboundClassifier, gaussian_sequences
from tests.helpers import SUBPROCESS_TIMEOUT_S

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def fitted() -> FirmboundClassifier:
    x, y, _ = gaussian_sequences(1500, n_classes=3, dim=6, length=16, offset=0.8, seed=0)
    return FirmboundClassifier(estimator="tandem", cost=0.1, hidden=16, context=2, epochs=15).fit(x, y)


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
                           "--json"], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout)
    assert line["samples"] == got[0].t and line["label"] == "abc"[got[0].label] and line["horizon"] == 16
    # a series the wrong way round is one line; the classifier runtime refuses the bundle in one line
    np.savetxt(tmp_path / "s.csv", xt[0].T, delimiter=",")
    proc = subprocess.run([sys.executable, "-m", "trickle", "edge", "infer", str(path), str(tmp_path / "s.csv"), "--early"],
                          capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1 and "one row per channel" in proc.stderr
    from edge.classify.runtime import Runtime
    from edge.core.errors import BundleError

    with pytest.raises(BundleError, match="decides early"):
        Runtime(bundle)
    # the same classifier exports byte for byte the same bundle
    again = export_early(fitted, tmp_path / "again", labels=["a", "b", "c"], name="toy")
    assert {p.name: p.read_bytes() for p in path.iterdir()} == {p.name: p.read_bytes() for p in again.iterdir()}


def test_a_gp_rule_does_not_export(tmp_path: Path) -> None:
    x, y, _ = gaussian_sequences(300, dim=4, length=6, offset=0.8, seed=0)
    clf = FirmboundClassifier(estimator="tandem", method="gp", cost=0.1, hidden=0, context=1, epochs=2).fit(x, y)
    with pytest.raises(ExportError, match="only a cfl rule exports"):
        export_early(clf, tmp_path / "b")


def test_the_firmware_decides_as_the_edge_does_bit_for_bit(fitted: FirmboundClassifier, tmp_path: Path) -> None:
    """The rule in integers: edge.classify.early's int8 path against the C firmware's tn_early_update, on the
    host (sanitized, and with a power cut after every commit) and under QEMU; the edge's integer
    frame model against onnxruntime's exact integer graph; and the int8 rule against the float one."""
    import onnxruntime as ort

    from export.early import quantize_frame, standardized_frames
    from export.firmware.cgen import generate_early
    from export.firmware.flash import build, flash, run_board, write_sources
    from export.firmware.intmodel import integer_onnx

    x, _, _ = gaussian_sequences(300, n_classes=3, dim=6, length=16, offset=0.8, seed=0)
    path = export_early(fitted, tmp_path / "b", labels=["a", "b", "c"], name="toy", calibration=x)
    bundle = read_bundle(path)
    assert bundle.manifest.early is not None and bundle.manifest.early.integer is not None
    xt, yt, _ = gaussian_sequences(200, n_classes=3, dim=6, length=16, offset=0.8, seed=1)
    tau, pred = fitted.decisions(xt)
    decider = EarlyDecider(bundle, integer=True)
    got = [decider.run(s) for s in xt]
    assert np.mean([d.t == t and d.label == p for d, t, p in zip(got, tau, pred)]) >= 0.85
    assert abs(np.mean([d.label == c for d, c in zip(got, yt)]) - np.mean(pred == yt)) <= 0.03
    assert abs(np.mean([d.t for d in got]) - tau.mean()) <= 0.5
    # the numpy integer frame model is onnxruntime's integer graph, bit for bit
    model = quantize_frame(fitted, x)
    q = model.quantize_input(standardized_frames(fitted, xt[:10]))
    session = ort.InferenceSession(integer_onnx(model), providers=["CPUExecutionProvider"])
    oracle = np.concatenate([session.run(None, {"x": row[None]})[0] for row in q])
    mine = []
    for row in q:
        v = row.astype(np.int64)
        for layer in decider.layers:
            v = layer(v)
        mine.append(v)
    np.testing.assert_array_equal(np.array(mine), oracle)
    # the firmware: 8 series on the host, and every power cut of two of them under ASan + UBSan
    sources, _ = generate_early(bundle, xt[:8])
    gen = tmp_path / "gen"
    write_sources(sources, gen)
    exe = build(gen, "host", tmp_path / "host", sanitize=True)
    run = run_board(exe, "host", tmp_path / "host", mode="early")
    want = [decider.run(s) for s in xt[:8]]
    assert run.mismatches == 0 and [run.decisions[i] for i in range(8)] == [(d.t, d.label) for d in want]
    assert {t for t, _ in run.decisions.values()} != {16}  # some decide early
    cuts = subprocess.run([str(exe), "early-cuts", "2"], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert cuts.returncode == 0, cuts.stdout + cuts.stderr
    trials = int(cuts.stdout.split()[1])
    assert trials > 20 and cuts.stdout.split()[3] == str(trials)
    # Cortex-M4 under QEMU, from the bundle's own test series
    report = flash(bundle, "mps2-an386", tmp_path / "m4")
    assert report["mismatches"] == 0 and report["decisions"] == report["expected_decisions"]
    assert len(report["instructions_per_series"]) == report["series"] == 8


def test_a_rocket_rule_runs_on_the_edge_as_the_estimator_decides_and_the_firmware_refuses_it(tmp_path: Path) -> None:
    """The rocket estimator's bundle: causal MiniRocket features, a head per decision point and the
    rule over the sorted posterior, streamed by edge.classify.early_rocket in numpy without torch;
    decisions equal to the estimator's on >= 99 % of test series. The firmware cannot run it and
    says so by name, as does an export with calibration series; the simulator charges its heads."""
    from edge.classify.early import early_decider
    from edge.core.errors import BundleError
    from export.firmware.cgen import generate_early
    from export.firmware.intmodel import IntModelError
    from simulator.bundle_model import early_model

    x, y, _ = gaussian_sequences(240, n_classes=3, dim=3, length=30, offset=0.5, seed=0)
    xt, yt, _ = gaussian_sequences(200, n_classes=3, dim=3, length=30, offset=0.5, seed=1)
    clf = FirmboundClassifier(n_features=252, decision_points=16).fit(x, y)
    bundle = read_bundle(export_early(clf, tmp_path / "b", labels=["a", "b", "c"], name="rocket"))
    assert bundle.manifest.early is not None and bundle.manifest.early.estimator == "rocket"
    tau, pred = clf.decisions(xt)
    decider = early_decider(bundle)
    got = [decider.run(s) for s in xt]
    assert np.mean([d.t == t and d.label == p for d, t, p in zip(got, tau, pred)]) >= 0.99
    assert 1 < tau.mean() < 30 and {d.t for d in got} <= set(clf.points_.tolist())
    with pytest.raises(IntModelError, match="estimator 'rocket'.*firmware does not run"):
        generate_early(bundle, xt[:2])
    with pytest.raises(BundleError, match="no integer form"):
        early_decider(bundle, integer=True)
    with pytest.raises(ExportError, match="rocket estimator has no integer form"):
        export_early(clf, tmp_path / "c", calibration=x)
    early, full = early_model(bundle, xt, yt), early_model(bundle, xt, yt, full_length=True)
    head = {v.name: v.macs for v in bundle.manifest.variants[0].layers}["head"]
    assert early.variants[0].layers[1].macs > full.variants[0].layers[1].macs == round(head / 30)
    assert early.early is not None and early.early.samples.mean() == pytest.approx(tau.mean())
