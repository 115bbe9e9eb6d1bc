"""A FIRMBOUND classifier as a bundle a device decides early with (``edge.early``).

    path = export_early(clf, Path("bundles/gestures-early"), labels=["idle", "wave"], key=key)

The bundle's one variant is the frame model in ONNX (fp32): the last ``context`` standardized
samples of every channel, flattened channel by channel, in; class logits out. The per-channel
standardization is the manifest's pre-processing of one raw sample. ``early`` in the manifest
names the rule file (``rule.npy``, float64 (T − 1, pieces, K + 1): for every t < T the
max-affine pieces (slopes, then intercept) of the continuation value's negative, padded to one
count with pieces that never win) and the horizon, context, cost and loss.
The rule must be CFL's (a GP's continuation value has no closed form to ship).
"""

from __future__ import annotations

import io
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from edge.bundle import load_private_key, pack, write_bundle
from edge.errors import ExportError
from edge.manifest import SCHEMA_VERSION
from models.firmbound import ConvexContinuation, FirmboundClassifier
from simulator.devices import MCUS

RULE_FILE = "rule.npy"


def rule_arrays(clf: FirmboundClassifier) -> tuple[np.ndarray, np.ndarray]:
    """(slopes (T-1, pieces, K), intercepts (T-1, pieces)) of the continuation value's negative."""
    models = clf.rule_.continuation
    if not all(isinstance(m, ConvexContinuation) for m in models):
        raise ExportError("only a cfl rule exports (a GP's continuation value has no closed form); fit with "
                          "method='cfl'")
    if not models:
        raise ExportError("a rule over one sample has nothing to decide early")
    pieces = max(len(m.model.intercepts) for m in models)
    k = len(clf.classes_)
    slopes = np.zeros((len(models), pieces, k))
    intercepts = np.full((len(models), pieces), -1e30)  # padding pieces never win the max
    for t, m in enumerate(models):
        n = len(m.model.intercepts)
        slopes[t, :n], intercepts[t, :n] = m.model.slopes, m.model.intercepts
    return slopes, intercepts


def frame_onnx(clf: FirmboundClassifier) -> bytes:
    """The frame model as ONNX: (1, channels x context) -> (1, K) logits."""
    net = clf.dre_.net.net.eval()
    n_in = len(clf.dre_.mean) * clf.dre_.context
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter: one Linear (+ ReLU) needs no more
        path = Path(tmp) / "frame.onnx"
        torch.onnx.export(net, (torch.zeros(1, n_in),), str(path), input_names=["x"], output_names=["logits"],
                          dynamo=False, opset_version=17)
        return path.read_bytes()


def export_early(clf: FirmboundClassifier, out: Path, labels: list[str] | None = None, name: str = "early",
                 key: Path | None = None, bundle_version: int = 1) -> Path:
    """Write the bundle of a fitted FIRMBOUND classifier; returns its path."""
    from edge import __version__

    if not hasattr(clf, "rule_"):
        raise ExportError("the classifier is not fitted")
    slopes, intercepts = rule_arrays(clf)
    buf = io.BytesIO()
    np.save(buf, np.concatenate([slopes, intercepts[..., None]], axis=2), allow_pickle=False)  # byte-deterministic
    dre = clf.dre_
    channels, k = len(dre.mean), len(clf.classes_)
    n_in = channels * dre.context
    names = labels or [str(c) for c in clf.classes_]
    if len(names) != k:
        raise ExportError(f"labels: {len(names)} given for {k} classes")
    net = dre.net.net
    macs = sum(m.in_features * m.out_features for m in net.modules() if isinstance(m, torch.nn.Linear))
    doc = {
        "schema_version": SCHEMA_VERSION, "model": name, "task": name, "labels": names,
        "inputs": [{"name": "x", "shape": [1, n_in], "dtype": "float32"}],
        "outputs": [{"name": "logits", "shape": [1, k], "dtype": "float32"}],
        "preprocessing": {"description": "one sample of every channel, standardized; the device keeps the last "
                                         f"{dre.context} and feeds them flattened channel by channel",
                          "raw": {"shape": [channels], "dtype": "float32"},
                          "steps": [{"op": "standardize", "mean": dre.mean.tolist(), "std": dre.std.tolist()}]},
        "variants": [{"name": "fp32-d00", "bits": 32, "drop": 0.0, "formats": {"onnx": "frame.onnx"},
                      "energy_j": {m: p.compute_energy_j(macs) for m, p in MCUS.items()}, "accuracy": {},  # per frame
                      "layers": [{"name": "frame", "macs": macs, "param_bytes": 4 * sum(p.numel() for p in
                                                                                        net.parameters()),
                                  "outputs": k}]}],
        "early": {"file": RULE_FILE, "horizon": clf.n_timepoints_, "context": dre.context,
                  "cost": clf.rule_.cost, "loss": clf.rule_.loss, "method": "cfl"},
        "creator": f"trickle {__version__}", "bundle_version": bundle_version,
    }
    files = {"frame.onnx": frame_onnx(clf), RULE_FILE: buf.getvalue()}
    return write_bundle(pack(doc, files, load_private_key(key) if key else None), out)
