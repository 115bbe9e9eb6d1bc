"""A FIRMBOUND classifier as a bundle a device decides early with (``edge.classify.early``).

    path = export_early(clf, Path("bundles/gestures-early"), labels=["idle", "wave"], key=key)

The bundle's one variant is the frame model in ONNX (fp32): the last ``context`` standardized
samples of every channel, flattened channel by channel, in; class logits out. The per-channel
standardization is the manifest's pre-processing of one raw sample. ``early`` in the manifest
names the rule file (``rule.npy``, float64 (T − 1, pieces, K + 1): for every t < T the
max-affine pieces (slopes, then intercept) of the continuation value's negative, padded to one
count with pieces that never win) and the horizon, context, cost and loss.
The rule must be CFL's (a GP's continuation value has no closed form to ship).

Given calibration series, the bundle also carries the rule in integers for the firmware
(``early.integer`` in the manifest; ``edge.classify.early`` runs it bit for bit as the firmware does): the
frame model quantized after training (int8 per-channel weights, int8 activations ranged on the
calibration frames; ``frame-int8.npz``), the pieces and c, L in fixed point (``rule-q.npy``) and
an exp table (``exp-q16.npy``); and the first calibration series as the firmware's test series
(``series.npy``).

A classifier with the ``rocket`` estimator exports its causal MiniRocket convolutions, decision
points and linear heads as ``rocket.npz`` (``early.features``; its one variant names that file as
format ``npz``) and the rule over the sorted posterior; ``edge.classify.early_rocket`` runs it.
It has no integer form: the firmware refuses such a bundle by name.

``export_checkpoint`` does the same for a checkpoint of ``trickle train firmbound`` (what
``trickle export CHECKPOINT`` runs): the tandem's bundle is ranged on the checkpoint's training
series and carries the integer form, and the bundle's own decider (``edge.classify.early``) must
decide the checkpoint's test series as the trained classifier did.
"""

from __future__ import annotations

import io
import math
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edge.contract.bundle import load_private_key, pack, write_bundle
from edge.contract.manifest import SCHEMA_VERSION
from edge.core.errors import ExportError
from export.firmware.intmodel import Q31, FCLayer, IntModel, Layer
from models.firmbound import ConvexContinuation, FirmboundClassifier, stack_frames
from simulator.devices import MCUS

RULE_FILE = "rule.npy"
ROCKET_FILE = "rocket.npz"
INT_FILES = {"frame": "frame-int8.npz", "rule": "rule-q.npy", "exp": "exp-q16.npy"}
SERIES_FILE = "series.npy"
MAX_EXP_TABLE = 4096  # entries (16 KiB of flash): logit scales down to ~0.003
TEST_SERIES = 8


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    """np.savez, byte-deterministic (fixed entry dates)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, a in arrays.items():
            z.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), _npy(a))
    return buf.getvalue()


def _multipliers(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q31 multipliers and right shifts of real multipliers m in (0, 1) (TFLite's)."""
    pairs = []
    for v in m:
        mantissa, exponent = math.frexp(float(v))
        m0 = round(mantissa * Q31)
        if m0 == Q31:
            m0, exponent = m0 // 2, exponent + 1
        pairs.append((m0, -exponent))
    return np.array([p[0] for p in pairs], np.int32), np.array([p[1] for p in pairs], np.int32)


def standardized_frames(clf: FirmboundClassifier, x: np.ndarray) -> np.ndarray:
    """Every frame the device feeds the frame model for series X (n, channels, T): (n·T, channels·context)."""
    dre = clf.dre_
    z = ((np.asarray(x, np.float32) - dre.mean[None, :, None]) / dre.std[None, :, None]).astype(np.float32)
    frames = stack_frames(z, dre.context)
    return frames.reshape(-1, frames.shape[-1])


def quantize_frame(clf: FirmboundClassifier, x_cal: np.ndarray) -> IntModel:
    """The frame model in int8 (post-training: per-channel symmetric weights, activation ranges from
    the calibration series' frames; the logits per tensor, so their sum over time means one scale)."""
    frames = standardized_frames(clf, x_cal).astype(np.float64)
    linears = [m for m in clf.dre_.net.net.modules() if isinstance(m, torch.nn.Linear)]
    input_scale = in_scale = max(float(np.abs(frames).max()), 1e-6) / 127.0
    in_offset, h = 0, frames
    layers: list[Layer] = []
    for i, lin in enumerate(linears):
        w = lin.weight.detach().double().numpy()
        b = lin.bias.detach().double().numpy()
        y = h @ w.T + b
        last = i == len(linears) - 1
        w_max = np.abs(w).max(axis=1)
        w_scale = np.where(w_max > 1e-8, w_max, 127.0) / 127.0  # a dead row: zero weights, an ordinary scale
        if last:
            lo, hi = min(float(y.min()), 0.0), max(float(y.max()), 0.0)
            out_scale = max((hi - lo) / 255.0, 1e-6)
        else:
            y = np.maximum(y, 0.0)
            lo, out_scale = 0.0, max(float(y.max()), 1e-6) / 255.0
        out_scale = max(out_scale, float((in_scale * w_scale).max()) * 1.0001)  # multipliers below 1: right shifts
        zero_point = int(np.clip(round(-128 - lo / out_scale), -128, 127))
        multiplier, shift = _multipliers(in_scale * w_scale / out_scale)
        if np.any((shift < 0) | (shift > 31)):
            raise ExportError(f"frame layer {i + 1}: requantization shifts {shift.min()}..{shift.max()} leave 0..31 "
                              "(a layer whose outputs are far smaller than its inputs' scale)")
        w_q = np.clip(np.rint(w / w_scale[:, None]), -127, 127).astype(np.int8)
        b_q = np.rint(b / (in_scale * w_scale)).astype(np.int64)
        bound = np.abs(b_q) + 255 * np.abs(w_q.astype(np.int64)).sum(axis=1)
        if bound.max() >= 2**31:
            raise ExportError(f"frame layer {i + 1}: its int32 accumulator could overflow")
        layers.append(FCLayer(w_q, b_q.astype(np.int32), multiplier, shift, in_offset, zero_point, zero_point if not last
                              else -128, 127, out_scale))
        in_scale, in_offset, h = out_scale, -zero_point, y
    return IntModel(input_scale=input_scale, input_shape=(frames.shape[1],), layers=layers)


def integer_rule(slopes: np.ndarray, intercepts: np.ndarray, cost: float, loss: float, logit_scale: float
                 ) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """(pieces int32 (T-1, P, K+1) in Q(frac_bits), exp table uint32 Q16, {frac_bits, cost_q, loss_q})."""
    real = intercepts > -1e29
    largest = max(float(np.abs(slopes).max()), float(np.abs(intercepts[real]).max()), cost, loss)
    frac_bits = min(24, 30 - math.ceil(math.log2(largest + 1)))
    if frac_bits < 8:
        raise ExportError(f"the rule's coefficients reach {largest:.3g}: too large for 32-bit fixed point")
    one = 1 << frac_bits
    pieces = np.zeros((*intercepts.shape, slopes.shape[2] + 1), np.int32)
    pieces[..., :-1] = np.rint(slopes * one)
    pieces[..., -1] = np.where(real, np.rint(np.where(real, intercepts, 0) * one), -(2**31) + 1)
    j = np.arange(1, MAX_EXP_TABLE + 1)
    table = np.rint(65536 * np.exp(-j * logit_scale))
    if table[-1] != 0:
        raise ExportError(f"the frame model's logit scale {logit_scale:.3g} needs an exp table of more than "
                          f"{MAX_EXP_TABLE} entries (its logits span too little of int8)")
    exp = np.concatenate([[65536], table[: int(np.argmax(table == 0))]]).astype(np.uint32)
    cost_q, loss_q = round(cost * one), round(loss * one)
    if cost_q < 1:
        raise ExportError(f"cost {cost:g}: below the fixed point's resolution 2^-{frac_bits}")
    return pieces, exp, {"frac_bits": frac_bits, "cost_q": cost_q, "loss_q": loss_q}


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
                 key: Path | None = None, bundle_version: int = 1, calibration: np.ndarray | None = None) -> Path:
    """Write the bundle of a fitted FIRMBOUND classifier; returns its path. ``calibration``: series
    (n, channels, T) to range the int8 frame model with; with them the bundle also carries the
    rule in integers for the firmware."""
    from edge import __version__

    if not hasattr(clf, "rule_"):
        raise ExportError("the classifier is not fitted")
    if clf.estimator == "rocket":
        if calibration is not None:
            raise ExportError("calibration series: the rocket estimator has no integer form for the firmware "
                              "(export without calibration, or fit estimator='tandem' for a board)")
        return export_rocket(clf, out, labels, name, key, bundle_version)
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
    if calibration is not None:
        x_cal = np.asarray(calibration, np.float32)
        if x_cal.ndim != 3 or x_cal.shape[1:] != (channels, clf.n_timepoints_) or not np.all(np.isfinite(x_cal)):
            raise ExportError(f"calibration series of shape {x_cal.shape}: expected (n, {channels}, "
                              f"{clf.n_timepoints_}) finite values")
        model = quantize_frame(clf, x_cal)
        logit_layer = model.layers[-1]
        assert isinstance(logit_layer, FCLayer)
        pieces, exp, fixed = integer_rule(slopes, intercepts, clf.rule_.cost, clf.rule_.loss, logit_layer.output_scale)
        arrays = {}
        for i, layer in enumerate(model.layers):
            assert isinstance(layer, FCLayer)
            arrays.update({f"w{i}": layer.weight, f"b{i}": layer.bias, f"m{i}": layer.multiplier, f"s{i}": layer.shift,
                           f"p{i}": np.array([layer.input_offset, layer.output_offset, layer.act_min, layer.act_max],
                                             np.int32)})
        files |= {INT_FILES["frame"]: _npz(arrays), INT_FILES["rule"]: _npy(pieces), INT_FILES["exp"]: _npy(exp),
                  SERIES_FILE: _npy(x_cal[:TEST_SERIES])}
        early_doc: dict[str, Any] = doc["early"]  # type: ignore[assignment]
        early_doc["integer"] = {**INT_FILES, **fixed, "input_scale": model.input_scale,
                                "logit_zero_point": logit_layer.output_offset, "logit_scale": logit_layer.output_scale}

    return write_bundle(pack(doc, files, load_private_key(key) if key else None), out)


def rocket_arrays(clf: FirmboundClassifier) -> dict[str, np.ndarray]:
    """``rocket.npz``: the convolutions (``edge.classify.rocket.CausalRocket``'s fields), the decision
    points and the heads (logits = weights[p] @ features + head_biases[p], standardization folded in)."""
    est = clf.dre_
    r = est.rocket
    return {"dilations": r.dilations.astype(np.int32), "kernels": r.kernels.astype(np.int32),
            "channels": r.channels.astype(np.uint8), "biases": r.biases.astype(np.float32),
            "pair_of": r.pair_of.astype(np.int32), "points": est.points.astype(np.int32),
            "weights": est.weights.astype(np.float32), "head_biases": est.biases.astype(np.float32)}


def export_rocket(clf: FirmboundClassifier, out: Path, labels: list[str] | None, name: str, key: Path | None,
                  bundle_version: int) -> Path:
    """The bundle of a classifier with the rocket estimator (see the module's docstring)."""
    from edge import __version__

    slopes, intercepts = rule_arrays(clf)
    est = clf.dre_
    r = est.rocket
    channels, k = len(est.mean), len(clf.classes_)
    names = labels or [str(c) for c in clf.classes_]
    if len(names) != k:
        raise ExportError(f"labels: {len(names)} given for {k} classes")
    conv_macs = int(r.channels.sum()) + 9 * len(r.dilations)  # per sample: channel sums, 9 taps per pair
    head_macs = r.n_features * k  # per decision point
    doc = {
        "schema_version": SCHEMA_VERSION, "model": name, "task": name, "labels": names,
        "inputs": [{"name": "x", "shape": [1, channels], "dtype": "float32"}],
        "outputs": [{"name": "logits", "shape": [1, k], "dtype": "float32"}],
        "preprocessing": {"description": "one sample of every channel, standardized; the device updates causal "
                                         "MiniRocket features with it and, at a decision point, a linear head",
                          "raw": {"shape": [channels], "dtype": "float32"},
                          "steps": [{"op": "standardize", "mean": est.mean.tolist(), "std": est.std.tolist()}]},
        "variants": [{"name": "fp32-rocket", "bits": 32, "drop": 0.0, "formats": {"npz": ROCKET_FILE},
                      "energy_j": {m: p.compute_energy_j(conv_macs + head_macs) for m, p in MCUS.items()},
                      "accuracy": {},
                      "layers": [{"name": "rocket", "macs": conv_macs, "param_bytes": 4 * r.n_features,
                                  "outputs": r.n_features},
                                 {"name": "head", "macs": head_macs, "param_bytes": 4 * (head_macs + k) * len(est.points),
                                  "outputs": k}]}],
        "early": {"file": RULE_FILE, "horizon": clf.n_timepoints_, "estimator": "rocket", "features": ROCKET_FILE,
                  "context": r.receptive_field, "cost": clf.rule_.cost, "loss": clf.rule_.loss, "method": "cfl"},
        "creator": f"trickle {__version__}", "bundle_version": bundle_version,
    }
    files = {ROCKET_FILE: _npz(rocket_arrays(clf)),
             RULE_FILE: _npy(np.concatenate([slopes, intercepts[..., None]], axis=2))}
    return write_bundle(pack(doc, files, load_private_key(key) if key else None), out)


CHECK_AGREEMENT = 0.9  # of the checkpoint's test series decided alike (float32 onnxruntime against torch may tie-break)


def export_checkpoint(checkpoint: Path, out: Path, key: Path | None = None, bundle_version: int = 1
                      ) -> tuple[Path, int, int]:
    """The bundle of a ``trickle train firmbound`` checkpoint; returns (its path, the checkpoint's
    test series the bundle's decider decides as the classifier did — same samples, same class —,
    how many were checked). Fewer than 90 % alike is an ExportError and nothing is left at ``out``."""
    from edge.classify.early import early_decider
    from edge.contract.bundle import read_bundle
    from models.firmbound.checkpoint import load_checkpoint

    clf, payload = load_checkpoint(checkpoint)
    calibration = payload["calibration"].numpy() if clf.estimator == "tandem" else None
    name = str(payload["summary"].get("dataset", "early"))
    with tempfile.TemporaryDirectory() as tmp:
        staged = export_early(clf, Path(tmp) / "bundle", payload["labels"], name, key, bundle_version, calibration)
        decider = early_decider(read_bundle(staged))
        check = payload["check"]
        x, samples, classes = check["x"].numpy(), check["samples"].numpy(), check["classes"].numpy()
        decisions = [decider.run(series) for series in x]
        alike = sum(int(d.t == t and d.label == c) for d, t, c in zip(decisions, samples, classes))
        if alike < CHECK_AGREEMENT * len(x):
            raise ExportError(f"{checkpoint}: the bundle decides {len(x) - alike} of the checkpoint's {len(x)} test "
                              "series otherwise than the trained classifier")
        members = {f.name: f.read_bytes() for f in sorted(staged.iterdir())}
    return write_bundle(members, out), alike, len(x)
