"""FIRMBOUND benchmark: early classification against the exact optimum and against sktime's peers.

    trickle bench firmbound [--quick]

Synthetic (the paper's Gaussian sequences, two classes): FIRMBOUND-CFL and -GP against the exact
backward induction with the true LLR (``models.firmbound.exact_backward_induction``), and a
static-threshold SPRT (Wald; its threshold the one of least training risk) at the same cost.

Real streams: sktime's offline UCR/UEA copies BasicMotions, GunPoint, ItalyPowerDemand,
JapaneseVowels, and FSDD as 13 MFCCs over 63 frames (the goal's five), and ArrowHead, OSULeaf and
ACSF1 (hold-out sets, reported beside them, never counted nor tuned on). FIRMBOUND reads causal
MiniRocket prefix posteriors (``models.firmbound.prefix``: a logistic head at each of up to 64
decision points; the rule learned on out-of-fold posteriors of the training series). Curves:
FIRMBOUND-CFL swept over the sampling cost c; the static SPRT on the same posteriors, swept
over its threshold; sktime's ``ProbabilityThresholdEarlyClassifier`` (swept over its threshold)
and ``TEASER`` (one point) on MiniRocket + logistic regression at 8 classification points, as a
user would set them up; the full-length classifier (one point). AUSAT: the area under accuracy
against the mean hitting time (points sorted by time, each accuracy held until the next point,
the last until T), over T.

Operating points chosen on training data alone: ``FirmboundClassifier()`` with its defaults (the
cost of best harmonic mean on out-of-fold posteriors) against ProbabilityThreshold at the
threshold of best harmonic mean on a held-out quarter of the training series (then refitted on
all of it): the harmonic mean of accuracy and 1 − earliness on the test series.

Simulated nodes: the exported bundle (``edge.classify.early_rocket``; its decision points and
cost chosen on out-of-fold posteriors: the least MACs per decision within 1 point of their
full-length accuracy) on solar nodes that sense sample by sample, against the same bundle deciding after all T samples:
energy per decision. Writes bench/results/firmbound.json and docs/results/firmbound.md (with a
plot per data set).
"""

from __future__ import annotations

import json
import os
import platform
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from edge.core.files import write_atomic
from edge.core.tables import markdown_table
from models.firmbound import (
    LOSS_L,
    FirmboundClassifier,
    backward_induction,
    bayes_risk,
    exact_backward_induction,
    fit_density_ratio,
    fit_prefix_posteriors,
    gaussian_sequences,
    harmonic_mean,
    posteriors,
)
from models.firmbound.classifier import choose_cost, costs_for

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOCS = REPO / "docs" / "results"
GOAL_SETS = ("BasicMotions", "GunPoint", "ItalyPowerDemand", "JapaneseVowels", "FSDD")
HOLDOUT_SETS = ("ArrowHead", "OSULeaf", "ACSF1")  # reported beside the goal's, never tuned on
REAL_SETS = GOAL_SETS + HOLDOUT_SETS
ENERGY_SETS = GOAL_SETS[:4]  # the energy goal counts these four
DECISION_POINTS = 64


def node_scenario(channels: int, quick: bool) -> dict[str, Any]:
    """Solar nodes through an office day (indoor_office's cell and light: 500 lux from 8 to 18 h,
    50 lux otherwise), one sample per channel a byte, sensed for 1 ms at 1 mW; a series starts
    every 2 minutes; loop continuation."""
    return {"name": "firmbound-node",
            "run": {"duration_s": 24 * 3600.0, "workers": 1, "seed": 0},
            "harvester": {"kind": "iv_curve", "cell": "AM1417", "lux": 50, "schedule": [[8.0, 18.0, 500.0]]},
            "storage": {"capacitance_f": 4.7e-3},
            "workload": {"sense_period_s": 120.0, "sense_time_s": 1e-3, "sense_power_w": 1e-3,
                         "input_bytes": channels, "policy": "loop_continuation", "deadline_s": 60.0},
            "network": {"radio": "ble", "payload_bytes": 16, "min_distance_m": 2, "max_distance_m": 15},
            "nodes": {"count": 4}}
GOALS = {"synthetic_bayes_risk_ratio_vs_optimal": ("<=", 1.05), "ausat_sets_ahead_of_best_peer": (">=", 4),
         "hm_sets_ahead_of_probability_threshold": (">=", 4), "energy_per_decision_ratio_vs_full_length": ("<=", 0.6),
         "energy_sets_within_1pt_count": (">=", 3), "defaults_accuracy_ratio_vs_bench_procedure": (">=", 0.95)}
THRESHOLDS = (0.55, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99, 0.999)  # 0.85: sktime's default


def ausat(points: list[tuple[float, float]], length: int) -> float:
    """Area under accuracy over mean hitting time (1..T), normalized by T."""
    pts = sorted(points)
    area = 0.0
    for (m, acc), nxt in zip(pts, [p[0] for p in pts[1:]] + [float(length)]):
        area += (nxt - m) * acc
    return area / length


def static_sprt(pi: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Wald's rule with a constant threshold on the top posterior (= on the LLR), truncated at T."""
    n = len(pi)
    hit = pi.max(-1) >= threshold
    hit[:, -1] = True
    tau = hit.argmax(1) + 1
    return tau, pi[np.arange(n), tau - 1].argmax(1)


def synthetic(quick: bool) -> dict[str, Any]:
    length, offset, dim = (20, 0.5, 8) if quick else (40, 0.5, 32)
    cost = 0.1 * LOSS_L / length
    n_train, n_test = (2000, 4000) if quick else (8000, 20000)
    x, y, _ = gaussian_sequences(n_train, dim=dim, length=length, offset=offset, seed=0)
    xt, yt, acc_t = gaussian_sequences(n_test, dim=dim, length=length, offset=offset, seed=1)
    exact = exact_backward_induction(offset, length, cost)
    tau_o, pred_o = exact.decide(acc_t[:, :, 0] - acc_t[:, :, 1])
    dre = fit_density_ratio(x, y, hidden=0, epochs=20 if quick else 30)
    pi, pi_t = posteriors(dre.accumulated(x)), posteriors(dre.accumulated(xt))
    out: dict[str, Any] = {"length": length, "dim": dim, "offset": offset, "cost": cost, "train": n_train,
                           "test": n_test, "exact_bayes_risk": exact.risk,
                           "oracle_policy_test_risk": bayes_risk(tau_o, pred_o == yt, cost),
                           "oracle_policy": {"mean_hitting_time": float(tau_o.mean()),
                                             "hitting_time_std": float(tau_o.std()),
                                             "accuracy": float((pred_o == yt).mean())},
                           "dre_train_s": dre.train_seconds}
    for method in ("cfl", "gp"):
        rule = backward_induction(pi, cost, method)
        tau, pred = rule.decide(pi_t)
        out[method] = {"bayes_risk": bayes_risk(tau, pred == yt, cost), "accuracy": float((pred == yt).mean()),
                       "mean_hitting_time": float(tau.mean()), "hitting_time_std": float(tau.std()),
                       "train_s": rule.train_seconds}
    risks = {th: bayes_risk(*_scored(static_sprt(pi, th), y), cost) for th in np.linspace(0.5, 0.9999, 400)}
    best = min(risks, key=lambda th: risks[th])
    tau_s, pred_s = static_sprt(pi_t, best)
    out["static_sprt"] = {"threshold": float(best), "bayes_risk": bayes_risk(tau_s, pred_s == yt, cost),
                          "accuracy": float((pred_s == yt).mean()), "mean_hitting_time": float(tau_s.mean()),
                          "hitting_time_std": float(tau_s.std())}
    full = pi_t[:, -1].argmax(1) == yt
    out["full_length"] = {"bayes_risk": bayes_risk(np.full(len(yt), length), full, cost), "accuracy": float(full.mean())}
    return out


def _scored(decision: tuple[np.ndarray, np.ndarray], y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    tau, pred = decision
    return tau, pred == y


def _peer_estimator() -> Any:
    """The peers' shared base classifier: MiniRocket features, a logistic regression on them (so
    the early classifiers get graded probabilities; Rocket's ridge gives 0/1), behind a
    scikit-learn face (sktime 1.2's TEASER cross-validates it with scikit-learn 1.9, which needs
    ``__sklearn_tags__``)."""
    from sklearn.base import BaseEstimator, ClassifierMixin
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sktime.transformations.panel.rocket import MiniRocketMultivariate

    class MiniRocketLogistic(ClassifierMixin, BaseEstimator):
        def __init__(self, random_state: int = 0) -> None:
            self.random_state = random_state

        def fit(self, x: np.ndarray, y: np.ndarray) -> Any:
            self.rocket_ = MiniRocketMultivariate(num_kernels=1000, random_state=self.random_state).fit(x)
            self.head_ = make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=2000))
            self.head_.fit(np.asarray(self.rocket_.transform(x)), y)
            self.classes_ = self.head_.classes_
            return self

        def predict_proba(self, x: np.ndarray) -> np.ndarray:
            return np.asarray(self.head_.predict_proba(np.asarray(self.rocket_.transform(x))))

        def predict(self, x: np.ndarray) -> np.ndarray:
            return np.asarray(self.classes_[self.predict_proba(x).argmax(1)])

    return MiniRocketLogistic()


def _points(length: int, n: int = 8) -> list[int]:
    start = min(9, length)  # MiniRocket needs 9 samples
    return sorted({round(float(v)) for v in np.linspace(start, length, n)})


def probability_threshold_points(x: np.ndarray, y: np.ndarray, xt: np.ndarray, yt: np.ndarray,
                                 thresholds: tuple[float, ...] = THRESHOLDS) -> dict[float, tuple[float, float]]:
    """sktime's ProbabilityThresholdEarlyClassifier fitted on (x, y) once, its threshold swept on
    (xt, yt): threshold -> (mean hitting time, accuracy)."""
    from sktime.classification.early_classification import ProbabilityThresholdEarlyClassifier

    length = x.shape[2]
    points = _points(length)
    clf = ProbabilityThresholdEarlyClassifier(estimator=_peer_estimator(), classification_points=points,
                                              random_state=0)
    clf.fit(x, y)
    probas = [clf.predict_proba(xt[:, :, :p]) for p in points]
    out = {}
    for threshold in thresholds:
        clf.probability_threshold = threshold
        tau = np.full(len(yt), length)
        pred = probas[-1].argmax(1)
        state = None
        decided = np.zeros(len(yt), bool)
        for p, proba in zip(points, probas):
            safe, state = clf.decide_prediction_safety(xt[:, :, :p], proba, state)
            new = np.asarray(safe, bool) & ~decided
            tau[new], pred[new] = p, proba[new].argmax(1)
            decided |= new
        out[threshold] = (float(tau.mean()), float((clf.classes_[pred] == yt).mean()))
    return out


def probability_threshold_operating_point(x: np.ndarray, y: np.ndarray, xt: np.ndarray, yt: np.ndarray
                                          ) -> dict[str, float]:
    """ProbabilityThreshold at the threshold of best harmonic mean on a held-out quarter of the
    training series (fitted on the other three), then fitted on all of them: its test scores."""
    from sklearn.model_selection import train_test_split

    length = x.shape[2]
    fit_idx, val_idx = train_test_split(np.arange(len(x)), test_size=0.25, random_state=0, stratify=y)
    val = probability_threshold_points(x[fit_idx], y[fit_idx], x[val_idx], y[val_idx])
    best = max(val, key=lambda th: harmonic_mean(val[th][1], val[th][0] / length))
    tau, acc = probability_threshold_points(x, y, xt, yt, (best,))[best]
    return {"threshold": best, "accuracy": acc, "earliness": tau / length, "hm": harmonic_mean(acc, tau / length)}


def teaser_point(x: np.ndarray, y: np.ndarray, xt: np.ndarray, yt: np.ndarray) -> tuple[float, float]:
    from sktime.classification.early_classification import TEASER

    length = x.shape[2]
    points = _points(length)
    clf = TEASER(estimator=_peer_estimator(), classification_points=points, random_state=0)
    clf.fit(x, y)
    tau = np.full(len(yt), length)
    pred = np.empty(len(yt), dtype=yt.dtype)
    open_idx = np.arange(len(yt))  # TEASER's update_predict takes the cases still open, in order
    for k, p in enumerate(points):
        if not len(open_idx):
            break
        labels, safe = (clf.predict if k == 0 else clf.update_predict)(xt[open_idx, :, :p])
        safe = np.ones(len(open_idx), bool) if p == length else np.asarray(safe, bool)
        tau[open_idx[safe]], pred[open_idx[safe]] = p, np.asarray(labels)[safe]
        open_idx = open_idx[~safe]
    return float(tau.mean()), float((pred == yt).mean())


def full_length_point(x: np.ndarray, y: np.ndarray, xt: np.ndarray, yt: np.ndarray) -> tuple[float, float]:
    clf = _peer_estimator().fit(x, y)
    return float(x.shape[2]), float((clf.predict(xt) == yt).mean())


def load_real(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, x_test, y_test): a UCR/UEA set, or FSDD as 13 MFCCs over 63 frames."""
    if name == "FSDD":
        from models.data.datasets import load

        d = load("fsdd")
        return d.x_train, d.y_train, d.x_test, d.y_test
    from models.data.userdata import UserData, load_user

    data = load_user(f"ucr:{name}", UserData(pad=True))
    return data.x_train, data.y_train, data.x_test, data.y_test


def node_operating_point(est: Any, oof: np.ndarray, truth: np.ndarray) -> tuple[Any, Any, dict[str, Any]]:
    """The node's estimator and rule, from the training series alone: among the decision points
    thinned by a stride of 1, 2, 4 or 8 (a head costs F·K MACs at every point reached) and the
    costs, the rule of least expected MACs per decision on the out-of-fold posteriors whose
    out-of-fold accuracy stays within 1 point of their full-length accuracy."""
    r = est.rocket
    conv, head = int(r.channels.sum()) + 9 * len(r.dilations), r.n_features * len(est.classes)
    full = float((oof[:, -1].argmax(1) == truth).mean())
    length = int(est.points[-1])
    best: tuple[float, int, float, Any, np.ndarray] | None = None
    for stride in (1, 2, 4, 8):
        index = np.arange(len(est.points) - 1, -1, -stride)[::-1]
        if len(index) < 2:
            continue
        pts, sub = est.points[index], oof[:, index]
        for cost in costs_for(length):
            rule = backward_induction(sub, cost, "cfl", steps=np.diff(pts), symmetric=True)
            tau, pred = rule.decide(sub)
            macs = float(pts[tau - 1].mean() * conv + tau.mean() * head)
            if (pred == truth).mean() >= full - 0.01 and (best is None or macs < best[0]):
                best = (macs, stride, cost, rule, index)
    found = best is not None
    if best is None:  # nothing within 1 point: the densest points at the least cost
        index = np.arange(len(est.points))
        cost = min(costs_for(length))
        rule = backward_induction(oof, cost, "cfl", steps=np.diff(est.points), symmetric=True)
        best = (float(length * conv + head), 1, cost, rule, index)
    macs, stride, cost, rule, index = best
    return est.subset(index), rule, {"stride": stride, "cost": cost, "decision_points": len(index),
                                     "oof_macs_per_decision": macs, "oof_full_length_accuracy": full,
                                     "within_1pt_on_training": found}


def real_set(name: str, quick: bool, simulate_node: bool = True) -> dict[str, Any]:
    x, y, xt, yt = load_real(name)
    length = x.shape[2]
    started = time.perf_counter()
    est, oof = fit_prefix_posteriors(x, y, DECISION_POINTS, n_features=500 if quick else 1000)
    pi_t = est.posteriors(xt)
    truth, truth_t = np.searchsorted(est.classes, y), np.searchsorted(est.classes, yt)
    points, steps = est.points, np.diff(est.points)
    curves: dict[str, list[tuple[float, float]]] = {"FIRMBOUND-CFL": []}
    rules = {}
    for cost in costs_for(length):
        rules[cost] = rule = backward_induction(oof, cost, "cfl", steps=steps, symmetric=True)
        tau, pred = rule.decide(pi_t)
        curves["FIRMBOUND-CFL"].append((float(points[tau - 1].mean()), float((pred == truth_t).mean())))
    curves["static SPRT"] = [(float(points[t - 1].mean()), float((p == truth_t).mean()))
                             for t, p in (static_sprt(pi_t, th) for th in THRESHOLDS)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        curves["ProbabilityThreshold"] = list(probability_threshold_points(x, y, xt, yt).values())
        curves["TEASER"] = [teaser_point(x, y, xt, yt)]
        curves["full length"] = [full_length_point(x, y, xt, yt)]
        pt_op = probability_threshold_operating_point(x, y, xt, yt)
    areas = {k: ausat(v, length) for k, v in curves.items() if v}
    peers = [k for k in areas if not k.startswith("FIRMBOUND")]
    best_peer = max(peers, key=lambda k: areas[k])
    # the class with its defaults, fitted through sktime's interface as a user would
    fitted = time.perf_counter()
    defaults = FirmboundClassifier(n_features=500 if quick else 1000)
    defaults.fit(x, y)
    hm, acc, earliness = defaults.score(xt, yt)
    defaults_s = time.perf_counter() - fitted
    # the bench's own procedure at the same criterion: the cost of best harmonic mean on the OOF posteriors
    bench_cost, _ = choose_cost(oof, truth, points, "cfl", LOSS_L, 0, symmetric=True)
    tau_b, pred_b = rules[bench_cost].decide(pi_t)
    bench_acc = float((pred_b == truth_t).mean())
    full_acc = float((pi_t[:, -1].argmax(1) == truth_t).mean())
    out = {"length": length, "channels": x.shape[1], "train": len(x), "test": len(xt), "classes": len(est.classes),
           "decision_points": len(points), "features": est.rocket.n_features, "curves": curves, "ausat": areas,
           "best_peer": best_peer, "ausat_gain_vs_best_peer": areas["FIRMBOUND-CFL"] - areas[best_peer],
           "prefix_estimator_train_s": est.train_seconds, "estimator_full_length_accuracy": full_acc,
           "operating_points": {"FirmboundClassifier()": {"cost": defaults.cost_, "accuracy": acc,
                                                          "earliness": earliness, "hm": hm, "fit_s": defaults_s},
                                "ProbabilityThreshold": pt_op,
                                "bench procedure": {"cost": bench_cost, "accuracy": bench_acc,
                                                    "earliness": float((points[tau_b - 1] / length).mean())}},
           "hm_gain_vs_probability_threshold": hm - pt_op["hm"],
           "defaults_accuracy_ratio_vs_bench_procedure": acc / bench_acc if bench_acc else None}
    if simulate_node:
        node_est, node_rule, chosen = node_operating_point(est, oof, truth)
        out["node"] = simulated_node(name, node_est, node_rule, x, xt, yt, quick)
        out["node"]["chosen_on_training"] = chosen
    out["seconds"] = time.perf_counter() - started
    return out


def simulated_node(name: str, est: Any, rule: Any, x: np.ndarray, xt: np.ndarray, yt: np.ndarray, quick: bool
                   ) -> dict[str, Any]:
    """Energy per decision and accuracy within deadline of nodes that sense sample by sample and
    stop where the exported rule stops, against the same bundle deciding at T."""
    import tempfile

    from edge.contract.bundle import read_bundle
    from export.early import export_early
    from simulator.bundle_model import early_model
    from simulator.config import load_scenario
    from simulator.fleet import simulate

    clf = FirmboundClassifier(cost=rule.cost)
    clf.dre_, clf.rule_, clf.classes_, clf.n_timepoints_, clf.points_ = est, rule, est.classes, x.shape[2], est.points
    scenario = load_scenario(None, **node_scenario(x.shape[1], quick))
    out: dict[str, Any] = {"scenario": node_scenario(x.shape[1], quick)}
    with tempfile.TemporaryDirectory() as tmp:
        bundle = read_bundle(export_early(clf, Path(tmp) / "b", name=name.lower()))
        for kind, full in (("early", False), ("full_length", True)):
            model = early_model(bundle, xt, yt, full_length=full)
            summary = simulate(scenario, model=model).summary
            out[kind] = {"offline_accuracy": model.variants[0].accuracy,
                         "offline_samples_mean": float(model.early.samples.mean()) if model.early else None,
                         "macs_per_sample": sum(layer.macs for layer in model.variants[0].layers),
                         **{k: summary[k] for k in ("energy_per_decision_j", "samples_per_decision",
                                                    "accuracy_within_deadline", "decisions", "released",
                                                    "power_cycles", "load_energy_per_result_j")}}
    out["energy_ratio"] = out["early"]["energy_per_decision_j"] / out["full_length"]["energy_per_decision_j"]
    out["accuracy_gap_pts"] = 100 * (out["full_length"]["offline_accuracy"] - out["early"]["offline_accuracy"])
    return out


def main(quick: bool = False, results_dir: Path = RESULTS, docs_dir: Path = DOCS,
         sets: tuple[str, ...] = REAL_SETS) -> dict[str, Any]:
    torch.set_num_threads(1)
    started = time.perf_counter()
    syn = synthetic(quick)
    print(f"synthetic: FIRMBOUND-CFL risk {syn['cfl']['bayes_risk']:.4f}, exact optimum {syn['exact_bayes_risk']:.4f}")
    real = {}
    for name in tqdm(sets, desc="data sets", unit="set"):
        real[name] = real_set(name, quick, simulate_node=name in ENERGY_SETS)
        r = real[name]
        tqdm.write(f"{name}: AUSAT {r['ausat']['FIRMBOUND-CFL']:.3f} ({r['ausat_gain_vs_best_peer']:+.3f} vs "
                   f"{r['best_peer']}); HM {r['hm_gain_vs_probability_threshold']:+.3f} vs ProbabilityThreshold")
    goal = {k: r for k, r in real.items() if k in GOAL_SETS}
    gains = {k: r["ausat_gain_vs_best_peer"] for k, r in goal.items()}
    hm_gains = {k: r["hm_gain_vs_probability_threshold"] for k, r in goal.items()}
    nodes = {k: r["node"] for k, r in real.items() if "node" in r}
    ratios = {k: n["energy_ratio"] for k, n in nodes.items()}
    gaps = {k: n["accuracy_gap_pts"] for k, n in nodes.items()}
    within = sorted(k for k in gaps if gaps[k] <= 1.0)
    defaults = [r["defaults_accuracy_ratio_vs_bench_procedure"] for r in real.values()
                if r["defaults_accuracy_ratio_vs_bench_procedure"] is not None]
    out: dict[str, Any] = {
        "synthetic_bayes_risk_ratio_vs_optimal": syn["cfl"]["bayes_risk"] / syn["exact_bayes_risk"],
        "synthetic_bayes_risk_ratio_gp_vs_optimal": syn["gp"]["bayes_risk"] / syn["exact_bayes_risk"],
        "synthetic_bayes_risk_ratio_vs_oracle_policy_same_test": syn["cfl"]["bayes_risk"] / syn["oracle_policy_test_risk"],
        "ausat_gain_vs_best_peer": gains,
        "ausat_gain_vs_best_peer_mean": float(np.mean(list(gains.values()))) if gains else None,
        "ausat_sets_ahead_of_best_peer": int(sum(g > 0 for g in gains.values())),
        "hm_gain_vs_probability_threshold": hm_gains,
        "hm_sets_ahead_of_probability_threshold": int(sum(g > 0 for g in hm_gains.values())),
        "holdout": {k: {"ausat_gain_vs_best_peer": r["ausat_gain_vs_best_peer"], "best_peer": r["best_peer"],
                        "hm_gain_vs_probability_threshold": r["hm_gain_vs_probability_threshold"]}
                    for k, r in real.items() if k not in GOAL_SETS},
        # mean over the goal's four sets, whatever their accuracy gap (reported beside it, per set)
        "energy_per_decision_ratio_vs_full_length": float(np.mean(list(ratios.values()))) if ratios else None,
        "energy_per_decision_ratio_per_set": ratios,
        "energy_accuracy_gap_pts_per_set": gaps,
        "energy_sets_within_1pt": within,
        "energy_sets_within_1pt_count": len(within),
        "defaults_accuracy_ratio_vs_bench_procedure": float(np.mean(defaults)) if defaults else None,
        "gp_train_time_ratio_vs_cfl": syn["gp"]["train_s"] / syn["cfl"]["train_s"],
        "synthetic": syn, "real": real, "quick": quick, "seconds": time.perf_counter() - started,
        "goals": {k: f"{op} {g}" for k, (op, g) in GOALS.items()},
        "retired": {"hitting_time_std_ratio_vs_static_sprt": "the exact Bayes-optimal rule itself scores "
                    f"{syn['oracle_policy']['hitting_time_std'] / syn['static_sprt']['hitting_time_std']:.3f} on this "
                    "task: the goal of 0.8 was unreachable by being optimal (issue 30)"},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    _write(out, results_dir, docs_dir, quick)
    return out


def _write(out: dict[str, Any], results_dir: Path, docs_dir: Path, quick: bool) -> None:
    suffix = "-quick" if quick else ""
    write_atomic(results_dir / f"firmbound{suffix}.json", json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")
    plots = docs_dir / f"firmbound{suffix}"
    plots.mkdir(parents=True, exist_ok=True)
    syn = out["synthetic"]
    lines = ["# FIRMBOUND: early classification", "",
             "Produced by `trickle bench firmbound`" + (" --quick" if quick else "") + f" in {out['seconds'] / 60:.0f} min.",
             "", f"## Synthetic Gaussian sequences (T = {syn['length']}, {syn['dim']} dimensions, c = {syn['cost']:.3g}, "
             f"L = {LOSS_L:g})", ""]
    syn_rows: list[tuple[str, ...]] = [("exact backward induction (true LLR)", f"{syn['exact_bayes_risk']:.4f}", "–", "–", "–"),
            *((name, f"{syn[k]['bayes_risk']:.4f}", f"{100 * syn[k]['accuracy']:.1f}",
               f"{syn[k].get('mean_hitting_time', syn['length']):.2f}", f"{syn[k].get('hitting_time_std', 0.0):.2f}")
              for name, k in (("FIRMBOUND-CFL", "cfl"), ("FIRMBOUND-GP", "gp"), ("static SPRT", "static_sprt"),
                              ("full length", "full_length")))]
    lines.append(markdown_table(["method", "Bayes risk", "accuracy (%)", "mean τ", "std τ"], syn_rows, align="lrrrr"))
    lines += ["", "## Real streams: AUSAT (higher is better)", "",
              "FIRMBOUND reads causal MiniRocket prefix posteriors (a logistic head per decision point, up to "
              f"{DECISION_POINTS} points; the rule learned on out-of-fold posteriors of the training series, over the "
              "sorted posterior); the static SPRT thresholds the same posteriors; ProbabilityThreshold and TEASER "
              "run on sktime's MiniRocket + logistic regression at 8 classification points. AUSAT: accuracy over "
              "the mean hitting time, each point's accuracy held until the next, the last until T, divided by T. "
              "A lone point at T (the full-length classifier) has none by this definition; its accuracy is in the "
              "last column. Gain: FIRMBOUND-CFL minus the best peer. Sets below the line are hold-outs: never "
              "counted, never tuned on.", ""]
    methods = list(next(iter(out["real"].values()))["ausat"]) if out["real"] else []
    rows: list[tuple[str, ...]] = []
    for name, r in out["real"].items():
        if name == HOLDOUT_SETS[0]:
            rows.append(("*hold-out*", *([""] * (len(methods) + 2))))
        rows.append((name, *(f"{r['ausat'].get(m, float('nan')):.3f}" for m in methods),
                     f"{r['ausat_gain_vs_best_peer']:+.3f}", f"{100 * r['curves']['full length'][0][1]:.1f}"))
    lines.append(markdown_table(["data set", *methods, "gain vs best peer", "full-length accuracy (%)"], rows,
                                align="l" + "r" * (len(methods) + 2)))
    lines += ["", "## Operating points chosen on training data: harmonic mean of accuracy and 1 − earliness", "",
              "`FirmboundClassifier()` with its defaults (its cost the one of best harmonic mean on out-of-fold "
              "posteriors), fitted through sktime's interface; ProbabilityThreshold at the threshold of best "
              "harmonic mean on a held-out quarter of the training series, then refitted on all of it; the "
              "bench's procedure (the same estimator and criterion, inside the bench). Accuracy / earliness on "
              "the test series.", ""]
    rows = []  # of the operating points
    for name, r in out["real"].items():
        op = r["operating_points"]
        d, p, b = op["FirmboundClassifier()"], op["ProbabilityThreshold"], op["bench procedure"]
        rows.append((name, f"{d['hm']:.3f} ({100 * d['accuracy']:.1f} / {d['earliness']:.2f})",
                     f"{p['hm']:.3f} ({100 * p['accuracy']:.1f} / {p['earliness']:.2f}, th {p['threshold']:g})",
                     f"{r['hm_gain_vs_probability_threshold']:+.3f}", f"{100 * b['accuracy']:.1f}",
                     f"{r['defaults_accuracy_ratio_vs_bench_procedure']:.3f}"))
    lines.append(markdown_table(["data set", "FirmboundClassifier() HM (acc % / earliness)",
                                 "ProbabilityThreshold HM", "HM gain", "bench procedure accuracy (%)",
                                 "defaults / bench accuracy"], rows, align="lrrrrr"))
    nodes = {k: r["node"] for k, r in out["real"].items() if "node" in r}
    if nodes:
        sc = next(iter(nodes.values()))["scenario"]
        lines += ["", "## Simulated nodes: energy per decision", "",
                  f"{sc['nodes']['count']} solar nodes for {sc['run']['duration_s'] / 3600:.0f} h (the indoor_office "
                  "cell and light), a series every 2 minutes, each sample sensed for 1 ms at 1 mW; per sample the "
                  "causal MiniRocket update, and a linear head at each decision point reached (charged per sample "
                  "taken); the full-length decision runs one head, at T. The exported bundle's rule (its decision "
                  "points, thinned by a stride of 1, 2, 4 or 8, and its cost chosen on out-of-fold posteriors of the "
                  "training series: the least MACs per decision within 1 point of their full-length accuracy) against "
                  "the same bundle deciding after all T samples. Energy per decision: the load "
                  "energy of the decisions' tasks plus work lost to power failures, per decision (boot, restore and "
                  "sleep energy left out on both sides). Within 1 point of full-length accuracy on the test series: "
                  f"{', '.join(out['energy_sets_within_1pt']) or 'none'}.", ""]
        node_rows: list[tuple[str, ...]] = []
        for name, n in nodes.items():
            e, f = n["early"], n["full_length"]
            node_rows.append((name, f"{100 * e['offline_accuracy']:.1f} / {100 * f['offline_accuracy']:.1f}",
                              f"{e['samples_per_decision']:.1f} / {f['samples_per_decision']:.0f}",
                              f"{e['macs_per_sample']} / {f['macs_per_sample']}",
                              f"{1e3 * e['energy_per_decision_j']:.3f} / {1e3 * f['energy_per_decision_j']:.3f}",
                              f"{n['energy_ratio']:.3f}",
                              f"{100 * e['accuracy_within_deadline']:.1f} / {100 * f['accuracy_within_deadline']:.1f}"))
        lines.append(markdown_table(["data set", "accuracy, early / full (%)", "samples per decision",
                                     "MACs per sample", "energy per decision (mJ)", "ratio",
                                     "accuracy within deadline (%)"], node_rows, align="lrrrrrr"))
    _plots(out, plots, suffix, lines)
    goals = [(k, "not measured" if out[k] is None else f"{out[k]:.3g}", f"{op} {g}") for k, (op, g) in GOALS.items()]
    goals.append(("gp_train_time_ratio_vs_cfl", f"{out['gp_train_time_ratio_vs_cfl']:.3g}", "reported"))
    lines += ["", "## Goals", "", markdown_table(["key", "measured", "goal"], goals, align="lrl"), "",
              "Retired: `hitting_time_std_ratio_vs_static_sprt` — "
              f"{out['retired']['hitting_time_std_ratio_vs_static_sprt']}."]
    write_atomic(docs_dir / f"firmbound{suffix}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def _plots(out: dict[str, Any], plots: Path, suffix: str, lines: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, r in out["real"].items():
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for method, pts in r["curves"].items():
            pts = sorted(pts)
            ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", ms=3, label=method,
                    lw=2 if method.startswith("FIRMBOUND") else 1)
        ax.set_xlabel("mean hitting time (samples)")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"{name} (T = {r['length']})" + (" — hold-out" if name in HOLDOUT_SETS else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(plots / f"{name}.png", dpi=110)
        plt.close(fig)
        lines += ["", f"![{name}](firmbound{suffix}/{name}.png)"]
