"""A fitted FIRMBOUND classifier on disk: ``checkpoint.pt``, read back without running code.

    paths = save_checkpoint(clf, data, Path("runs/train/coffee-firmbound"), summary)
    clf, payload = load_checkpoint(Path("runs/train/coffee-firmbound/checkpoint.pt"))

The payload is tensors and plain containers only (``models.weights.load_weights`` reads it with
``weights_only``): the estimator's arrays (causal MiniRocket's convolutions and the heads, or the
tandem's frame network), the rule's max-affine pieces per decision point, the class names, the
data set it was trained on (``dataset``, ``dataset_sha256``), raw training series to range an int8
frame model with (the tandem's integer form), and raw test series with the classifier's own
decisions, which ``trickle export`` checks the bundle against.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from edge.classify.rocket import CausalRocket
from edge.core.errors import DataError
from edge.core.files import write_atomic
from models.firmbound.core import ConvexContinuation, DensityRatio, FrameNet, StoppingRule
from models.weights import load_weights

if TYPE_CHECKING:
    from models.firmbound.classifier import FirmboundClassifier

ALGORITHM = "firmbound"
CHECKPOINT_VERSION = 1
CALIBRATION_SERIES = 256  # raw training series kept to range the tandem's int8 frame model
CHECK_SERIES = 16  # raw test series kept, with the classifier's decisions, for export's check
TIMINGS = ("train_time_s",)  # summary keys that are not written (they differ from run to run)


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def _estimator_payload(clf: FirmboundClassifier) -> dict[str, Any]:
    dre = clf.dre_
    if clf.estimator == "rocket":
        r = dre.rocket
        return {"dilations": _tensor(r.dilations), "kernels": _tensor(r.kernels), "channels": _tensor(r.channels),
                "biases": _tensor(r.biases), "pair_of": _tensor(r.pair_of), "points": _tensor(dre.points),
                "mean": _tensor(dre.mean), "std": _tensor(dre.std), "weights": _tensor(dre.weights),
                "head_biases": _tensor(dre.biases)}
    return {"state_dict": dre.net.state_dict(), "context": int(dre.context), "mean": _tensor(dre.mean),
            "std": _tensor(dre.std)}


def _rule_payload(rule: StoppingRule) -> dict[str, Any]:
    if not all(isinstance(m, ConvexContinuation) for m in rule.continuation):
        raise DataError("only a cfl rule is saved (a GP's continuation value has no closed form)")
    return {"cost": float(rule.cost), "loss": float(rule.loss), "symmetric": bool(rule.symmetric),
            "steps": None if rule.steps is None else _tensor(rule.steps),
            "slopes": [_tensor(m.model.slopes) for m in rule.continuation],
            "intercepts": [_tensor(m.model.intercepts) for m in rule.continuation]}


def save_checkpoint(clf: FirmboundClassifier, labels: list[str], raw_train: np.ndarray, raw_test: np.ndarray,
                    out_dir: Path, summary: dict[str, Any], dataset: str | None = None,
                    dataset_sha256: str | None = None) -> list[Path]:
    """checkpoint.pt, summary.json and summary.md in ``out_dir``; ``labels``: the name of each of
    ``clf.classes_``; the raw series as the device senses them (n, channels, T). The files leave out
    ``summary``'s timings: the same seed writes the same bytes."""
    summary = {k: v for k, v in summary.items() if k not in TIMINGS}
    tau, pred = clf.decisions(raw_test[:CHECK_SERIES])
    payload = {
        "version": CHECKPOINT_VERSION, "algorithm": ALGORITHM,
        "params": {k: v for k, v in clf.get_params().items() if isinstance(v, (int, float, str, type(None)))},
        "labels": list(labels), "n_timepoints": int(clf.n_timepoints_), "cost": float(clf.cost_),
        "estimator": _estimator_payload(clf), "rule": _rule_payload(clf.rule_),
        "dataset": dataset, "dataset_sha256": dataset_sha256,
        "calibration": _tensor(np.asarray(raw_train[:CALIBRATION_SERIES], np.float32)),
        "check": {"x": _tensor(np.asarray(raw_test[:CHECK_SERIES], np.float32)), "samples": _tensor(tau.astype(np.int64)),
                  "classes": _tensor(np.searchsorted(clf.classes_, pred).astype(np.int64))},
        "summary": summary,
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    paths = [out_dir / "checkpoint.pt", out_dir / "summary.json", out_dir / "summary.md"]
    write_atomic(paths[0], buf.getvalue())
    write_atomic(paths[1], json.dumps(summary, indent=1, sort_keys=True) + "\n")
    write_atomic(paths[2], _markdown(summary))
    return paths


def _markdown(s: dict[str, Any]) -> str:
    lines = [f"# FIRMBOUND on {s['dataset']}", "",
             f"{s['n_train']} training and {s['n_test']} test series of {s['channels']} channel(s) x {s['length']} "
             f"samples, {len(s['labels'])} classes; estimator {s['estimator']}, cost {s['cost']:.4g} per sample "
             f"({s['cost_choice']}).", "",
             "| on the test split | accuracy | mean samples | earliness | harmonic mean |",
             "| --- | ---: | ---: | ---: | ---: |",
             f"| deciding early | {s['accuracy']:.3f} | {s['mean_samples']:.1f} | {s['earliness']:.3f} | {s['hm']:.3f} |",
             f"| after all {s['length']} samples | {s['full_length_accuracy']:.3f} | {s['length']} | 1.000 | – |"]
    return "\n".join(lines) + "\n"


def is_checkpoint(payload: Any) -> bool:
    return isinstance(payload, dict) and payload.get("algorithm") == ALGORITHM


def read_checkpoint(path: Path) -> dict[str, Any] | None:
    """The payload of a FIRMBOUND checkpoint at ``path``; None if the file is another trickle checkpoint."""
    payload = load_weights(path)
    if not is_checkpoint(payload):
        return None
    if payload.get("version") != CHECKPOINT_VERSION:
        raise DataError(f"{path}: a FIRMBOUND checkpoint of version {payload.get('version')!r}; this trickle reads "
                        f"version {CHECKPOINT_VERSION} (train it again)")
    return dict(payload)


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.numpy()


def classifier(payload: dict[str, Any]) -> FirmboundClassifier:
    """The fitted classifier a checkpoint's payload holds."""
    # imported here: reading a checkpoint (``read_checkpoint``) needs neither sktime nor scikit-learn
    from models.firmbound.classifier import FirmboundClassifier
    from models.firmbound.prefix import PrefixPosteriors

    params = payload["params"]
    clf = FirmboundClassifier(**params)
    est = payload["estimator"]
    k = len(payload["labels"])
    classes = np.arange(k)
    if clf.estimator == "rocket":
        rocket = CausalRocket(_numpy(est["dilations"]), _numpy(est["kernels"]), _numpy(est["channels"]),
                              _numpy(est["biases"]), _numpy(est["pair_of"]))
        clf.dre_ = PrefixPosteriors(rocket, _numpy(est["points"]), _numpy(est["mean"]), _numpy(est["std"]),
                                    _numpy(est["weights"]), _numpy(est["head_biases"]), classes)
        clf.points_ = clf.dre_.points
    else:
        mean = _numpy(est["mean"])
        net = FrameNet(len(mean) * est["context"], k, int(params["hidden"]))
        net.load_state_dict(est["state_dict"])
        net.eval()
        clf.dre_ = DensityRatio(net, int(est["context"]), mean, _numpy(est["std"]), classes)
        clf.context_ = int(est["context"])
        clf.points_ = np.arange(1, payload["n_timepoints"] + 1)
    rule = payload["rule"]
    continuation = []
    for slopes, intercepts in zip(rule["slopes"], rule["intercepts"]):
        m = ConvexContinuation()
        m.model.slopes, m.model.intercepts = _numpy(slopes), _numpy(intercepts)
        continuation.append(m)
    steps = None if rule["steps"] is None else _numpy(rule["steps"])
    clf.rule_ = StoppingRule(rule["cost"], rule["loss"], continuation, steps=steps, symmetric=rule["symmetric"])
    clf.classes_, clf.n_timepoints_, clf.cost_ = classes, int(payload["n_timepoints"]), float(payload["cost"])
    clf._is_fitted = True
    return clf


def load_checkpoint(path: Path) -> tuple[FirmboundClassifier, dict[str, Any]]:
    """The fitted classifier in a FIRMBOUND checkpoint and the checkpoint's payload."""
    payload = read_checkpoint(path)
    if payload is None:
        raise DataError(f"{path}: not a FIRMBOUND checkpoint (trickle train firmbound writes one)")
    return classifier(payload), payload
