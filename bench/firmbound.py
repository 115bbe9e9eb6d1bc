"""FIRMBOUND benchmark: early classification against the exact optimum and against sktime's peers.

    trickle bench firmbound [--quick]

Synthetic (the paper's Gaussian sequences, two classes): FIRMBOUND-CFL and -GP against the exact
backward induction with the true LLR (``models.firmbound.exact_backward_induction``), and a
static-threshold SPRT (Wald; its threshold the one of least training risk) at the same cost.
Real streams (sktime's offline UCR/UEA copies: BasicMotions, GunPoint, ItalyPowerDemand,
JapaneseVowels; and FSDD as 13 MFCCs over 63 frames, reported beside the goal's four): the frame
length chosen on a held-out quarter of the training series, then speed–accuracy curves of
FIRMBOUND-CFL (swept over the sampling cost c), FIRMBOUND-GP (three costs), the static SPRT (swept over its threshold), sktime's
``ProbabilityThresholdEarlyClassifier`` (swept over its threshold) and ``TEASER`` (one point),
and the full-length classifier (one point); the peers share one base classifier (MiniRocket features, logistic regression).
AUSAT: the area under accuracy against the mean hitting time (points sorted by time, each
accuracy held until the next point, the last until T), over T.
Simulated nodes: the exported bundle (its integer rule, as the firmware runs it) on solar nodes
that sense sample by sample, against the same bundle deciding after all T samples: energy per decision.
Writes bench/results/firmbound.json and docs/results/firmbound.md (with a plot per data set).
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

from edge.core.files import write_atomic
from edge.core.tables import markdown_table
from models.firmbound import (
    LOSS_L,
    backward_induction,
    bayes_risk,
    exact_backward_induction,
    fit_density_ratio,
    gaussian_sequences,
    posteriors,
)

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOCS = REPO / "docs" / "results"
REAL_SETS = ("BasicMotions", "GunPoint", "ItalyPowerDemand", "JapaneseVowels", "FSDD")
GOAL_SETS = REAL_SETS[:4]  # the goal counts these four; FSDD is reported beside them
CONTEXT_FRACTIONS = (0.05, 0.25, 0.5)  # frame lengths tried, as fractions of T
HIDDEN = 64


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
GOALS = {"synthetic_bayes_risk_ratio_vs_optimal": ("<=", 1.05), "ausat_sets_with_gain": (">=", 3),
         "hitting_time_std_ratio_vs_static_sprt": ("<=", 0.8), "energy_per_decision_ratio_vs_full_length": ("<=", 0.6)}
COST_BASES = (0.02, 0.1, 0.5, 2.0, 5.0, 10.0, 20.0, 50.0)  # c = base x L / T, as the paper scales it; c <= L / 2
GP_COST_BASES = (0.1, 2.0, 10.0)
THRESHOLDS = (0.55, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999)


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


def probability_threshold_curve(x: np.ndarray, y: np.ndarray, xt: np.ndarray, yt: np.ndarray
                                ) -> list[tuple[float, float]]:
    """sktime's ProbabilityThresholdEarlyClassifier, fitted once, its threshold swept."""
    from sktime.classification.early_classification import ProbabilityThresholdEarlyClassifier

    length = x.shape[2]
    points = _points(length)
    clf = ProbabilityThresholdEarlyClassifier(estimator=_peer_estimator(), classification_points=points,
                                              random_state=0)
    clf.fit(x, y)
    probas = [clf.predict_proba(xt[:, :, :p]) for p in points]
    curve = []
    for threshold in THRESHOLDS:
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
        curve.append((float(tau.mean()), float((clf.classes_[pred] == yt).mean())))
    return curve


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


def choose_on_validation(x: np.ndarray, y: np.ndarray, quick: bool) -> tuple[int, dict[int, float], float]:
    """Hyper-parameters from the training series alone, on a held-out quarter of them: the frame
    length (a fraction of T) whose frame model, trained on the other three quarters, is most
    accurate averaged over every prefix length; and, with it, the node's sampling-cost base: the
    largest whose CFL rule stays within 1 point of the same model's full-length accuracy."""
    rng = np.random.default_rng(0)
    order = rng.permutation(len(x))
    cut = len(x) * 3 // 4
    fit_idx, val_idx = order[:cut], order[cut:]
    scores, fitted = {}, {}
    for frac in CONTEXT_FRACTIONS:
        context = max(3, round(x.shape[2] * frac))
        if context in scores:
            continue
        dre = fit_density_ratio(x[fit_idx], y[fit_idx], context=context, hidden=HIDDEN, epochs=30 if quick else 150,
                                batch_size=16)
        pi = posteriors(dre.accumulated(x[val_idx]))
        truth = np.searchsorted(dre.classes, y[val_idx])
        scores[context] = float((pi.argmax(-1) == truth[:, None]).mean())
        fitted[context] = (dre, pi, truth)
    best = max(scores, key=lambda c: scores[c])
    dre, pi_val, truth = fitted[best]
    pi_fit = posteriors(dre.accumulated(x[fit_idx]))
    full = float((pi_val[:, -1].argmax(1) == truth).mean())
    length, base = x.shape[2], min(COST_BASES)
    for b in sorted(COST_BASES):
        if b * LOSS_L / length > LOSS_L / 2:
            break
        _, pred = backward_induction(pi_fit, b * LOSS_L / length, "cfl").decide(pi_val)
        if (pred == truth).mean() >= full - 0.01:
            base = b
    return best, scores, base


def load_real(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, x_test, y_test): a UCR/UEA set, or FSDD as 13 MFCCs over 63 frames."""
    if name == "FSDD":
        from models.data.datasets import load

        d = load("fsdd")
        return d.x_train, d.y_train, d.x_test, d.y_test
    from models.data.userdata import UserData, load_user

    data = load_user(f"ucr:{name}", UserData(pad=True))
    return data.x_train, data.y_train, data.x_test, data.y_test


def real_set(name: str, quick: bool) -> dict[str, Any]:
    x, y, xt, yt = load_real(name)
    length = x.shape[2]
    started = time.perf_counter()
    context, context_scores, node_base = choose_on_validation(x, y, quick)
    dre = fit_density_ratio(x, y, context=context, hidden=HIDDEN, epochs=30 if quick else 150, batch_size=16)
    pi, pi_t = posteriors(dre.accumulated(x)), posteriors(dre.accumulated(xt))
    curves: dict[str, list[tuple[float, float]]] = {"FIRMBOUND-CFL": [], "FIRMBOUND-GP": []}
    train_s = {"cfl": 0.0, "gp": 0.0}
    rules = {}
    for base in (b for b in COST_BASES if b * LOSS_L / length <= LOSS_L / 2):
        for method in ("cfl", "gp"):
            if method == "gp" and (quick or base not in GP_COST_BASES):
                continue
            rule = backward_induction(pi, base * LOSS_L / length, method)
            rules[(method, base)] = rule
            train_s[method] += rule.train_seconds
            tau, pred = rule.decide(pi_t)
            curves[f"FIRMBOUND-{method.upper()}"].append((float(tau.mean()), float((pred == yt).mean())))
    curves["static SPRT"] = [(float(t.mean()), float((p == yt).mean()))
                             for t, p in (static_sprt(pi_t, th) for th in THRESHOLDS)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        curves["ProbabilityThreshold"] = probability_threshold_curve(x, y, xt, yt)
        curves["TEASER"] = [teaser_point(x, y, xt, yt)]
        curves["full length"] = [full_length_point(x, y, xt, yt)]
    areas = {k: ausat(v, length) for k, v in curves.items() if v}
    # the same frame model sees every sample, so energy per decision is proportional to samples taken:
    # the earliest FIRMBOUND point within 1 point of the same model's full-length accuracy
    full_acc = float((pi_t[:, -1].argmax(1) == np.searchsorted(dre.classes, yt)).mean())
    matched = [m for m, acc in curves["FIRMBOUND-CFL"] if acc >= full_acc - 0.01]
    peers = [k for k in areas if not k.startswith("FIRMBOUND")]
    best_peer = max(peers, key=lambda k: areas[k])
    # the node: the rule at the cost chosen on held-out training series, exported with its integer
    # rule, against the same bundle deciding after all T samples, on simulated nodes
    node = simulated_node(name, dre, rules[("cfl", node_base)], x, xt, yt, quick)
    node["cost_base"] = node_base
    return {"length": length, "train": len(x), "test": len(xt), "classes": len(dre.classes), "curves": curves,
            "context": context, "context_validation_accuracy": context_scores, "node": node,
            "ausat": areas, "best_peer": best_peer, "dre_full_length_accuracy": full_acc,
            "samples_ratio_at_full_accuracy": min(matched) / length if matched else None,
            "ausat_gain_vs_best_peer": areas["FIRMBOUND-CFL"] - areas[best_peer],
            "gp_train_s": train_s["gp"], "cfl_train_s": train_s["cfl"], "seconds": time.perf_counter() - started}


def simulated_node(name: str, dre: Any, rule: Any, x: np.ndarray, xt: np.ndarray, yt: np.ndarray, quick: bool
                   ) -> dict[str, Any]:
    """Energy per decision and accuracy within deadline of nodes that sense sample by sample and
    stop where the exported (integer) rule stops, against the same bundle deciding at T."""
    import tempfile

    from edge.contract.bundle import read_bundle
    from export.early import export_early
    from models.firmbound import FirmboundClassifier
    from simulator.bundle_model import early_model
    from simulator.config import load_scenario
    from simulator.fleet import simulate

    clf = FirmboundClassifier(cost=rule.cost, context=dre.context, hidden=HIDDEN)
    clf.dre_, clf.rule_, clf.classes_, clf.n_timepoints_ = dre, rule, dre.classes, x.shape[2]
    scenario = load_scenario(None, **node_scenario(x.shape[1], quick))
    out: dict[str, Any] = {"scenario": node_scenario(x.shape[1], quick)}
    with tempfile.TemporaryDirectory() as tmp:
        bundle = read_bundle(export_early(clf, Path(tmp) / "b", name=name.lower(), calibration=x))
        for kind, full in (("early", False), ("full_length", True)):
            model = early_model(bundle, xt, yt, full_length=full)
            summary = simulate(scenario, model=model).summary
            out[kind] = {"offline_accuracy": model.variants[0].accuracy,
                         "offline_samples_mean": float(model.early.samples.mean()) if model.early else None,
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
    for name in sets:
        real[name] = real_set(name, quick)
        print(f"{name}: AUSAT gain {real[name]['ausat_gain_vs_best_peer']:+.3f} vs {real[name]['best_peer']}")
    gains = [r["ausat_gain_vs_best_peer"] for k, r in real.items() if k in GOAL_SETS]
    ratios = {k: r["node"]["energy_ratio"] for k, r in real.items()}
    gaps = {k: r["node"]["accuracy_gap_pts"] for k, r in real.items()}
    goal_ratios = [ratios[k] for k in GOAL_SETS if k in ratios]
    out: dict[str, Any] = {
        "synthetic_bayes_risk_ratio_vs_optimal": syn["cfl"]["bayes_risk"] / syn["exact_bayes_risk"],
        "synthetic_bayes_risk_ratio_gp_vs_optimal": syn["gp"]["bayes_risk"] / syn["exact_bayes_risk"],
        "synthetic_bayes_risk_ratio_vs_oracle_policy_same_test": syn["cfl"]["bayes_risk"] / syn["oracle_policy_test_risk"],
        "ausat_gain_vs_best_peer": {k: r["ausat_gain_vs_best_peer"] for k, r in real.items()},
        "ausat_gain_vs_best_peer_mean": float(np.mean(gains)),
        "ausat_sets_with_gain": int(sum(g > 0 for g in gains)),
        "hitting_time_std_ratio_vs_static_sprt": syn["cfl"]["hitting_time_std"] / syn["static_sprt"]["hitting_time_std"],
        # the exact optimum's own ratio: how low this task lets any Bayes-optimal rule go
        "hitting_time_std_ratio_exact_optimum_vs_static_sprt": (syn["oracle_policy"]["hitting_time_std"]
                                                                / syn["static_sprt"]["hitting_time_std"]),
        # mean over the goal's four sets, whatever their accuracy gap (reported beside it, per set)
        "energy_per_decision_ratio_vs_full_length": float(np.mean(goal_ratios)) if goal_ratios else None,
        "energy_per_decision_ratio_per_set": ratios,
        "energy_accuracy_gap_pts_per_set": gaps,
        "energy_sets_within_1pt": sorted(k for k in GOAL_SETS if k in gaps and gaps[k] <= 1.0),
        "samples_per_decision_ratio_vs_full_length": {k: r["samples_ratio_at_full_accuracy"] for k, r in real.items()},
        "gp_train_time_ratio_vs_cfl": syn["gp"]["train_s"] / syn["cfl"]["train_s"],
        "synthetic": syn, "real": real, "quick": quick, "seconds": time.perf_counter() - started,
        "goals": {k: f"{op} {g}" for k, (op, g) in GOALS.items()},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    _write(out, results_dir, docs_dir, quick)
    return out


def _write(out: dict[str, Any], results_dir: Path, docs_dir: Path, quick: bool) -> None:
    suffix = "-quick" if quick else ""
    write_atomic(results_dir / f"firmbound{suffix}.json", json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")
    plots = docs_dir / f"firmbound{suffix}"
    plots.mkdir(parents=True, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    syn = out["synthetic"]
    lines = ["# FIRMBOUND: early classification", "",
             "Produced by `trickle bench firmbound`" + (" --quick" if quick else "") + f" in {out['seconds'] / 60:.0f} min.",
             "", f"## Synthetic Gaussian sequences (T = {syn['length']}, {syn['dim']} dimensions, c = {syn['cost']:.3g}, "
             f"L = {LOSS_L:g})", ""]
    rows = [("exact backward induction (true LLR)", f"{syn['exact_bayes_risk']:.4f}", "–", "–", "–"),
            *((name, f"{syn[k]['bayes_risk']:.4f}", f"{100 * syn[k]['accuracy']:.1f}",
               f"{syn[k].get('mean_hitting_time', syn['length']):.2f}", f"{syn[k].get('hitting_time_std', 0.0):.2f}")
              for name, k in (("FIRMBOUND-CFL", "cfl"), ("FIRMBOUND-GP", "gp"), ("static SPRT", "static_sprt"),
                              ("full length", "full_length")))]
    lines.append(markdown_table(["method", "Bayes risk", "accuracy (%)", "mean τ", "std τ"], rows, align="lrrrr"))
    lines += ["", "## Real streams: AUSAT (higher is better)", "",
              "AUSAT: accuracy over the mean hitting time, each point's accuracy held until the next, the last "
              "until T, divided by T. A lone point at T (the full-length classifier) has none by this definition; "
              "its accuracy is in the JSON. Gain: FIRMBOUND-CFL minus the best peer.", ""]
    methods = list(next(iter(out["real"].values()))["ausat"]) if out["real"] else []
    rows = [(name, *(f"{r['ausat'].get(m, float('nan')):.3f}" for m in methods), f"{r['ausat_gain_vs_best_peer']:+.3f}",
             f"{100 * r['curves']['full length'][0][1]:.1f}")
            for name, r in out["real"].items()]
    lines.append(markdown_table(["data set", *methods, "gain vs best peer", "full-length accuracy (%)"], rows,
                                align="l" + "r" * (len(methods) + 2)))
    if out["real"]:
        sc = next(iter(out["real"].values()))["node"]["scenario"]
        lines += ["", "## Simulated nodes: energy per decision", "",
                  f"{sc['nodes']['count']} solar nodes for {sc['run']['duration_s'] / 3600:.0f} h (the indoor_office "
                  "cell and light), a series every 2 minutes, each sample sensed for 1 ms at 1 mW and run through the "
                  "int8 frame model (loop continuation); the exported bundle's integer rule (its cost chosen on a "
                  "held-out quarter of the training series: the largest whose rule stayed within 1 point of the "
                  "same model's full-length accuracy there) against the same bundle deciding after all T samples "
                  "(the same frame model on every sample: the ratio is about the ratio of samples taken). Energy "
                  "per decision: the load energy of the decisions' tasks plus work lost to power failures, per "
                  "decision (boot, restore and sleep energy left out on both sides). On the test series the early "
                  f"rule stayed within 1 point of full-length accuracy on: {', '.join(out['energy_sets_within_1pt']) or 'none'}"
                  ".", ""]
        node_rows: list[tuple[str, ...]] = []
        for name, r in out["real"].items():
            n = r["node"]
            e, f = n["early"], n["full_length"]
            node_rows.append((name, str(r["context"]), f"{100 * e['offline_accuracy']:.1f} / {100 * f['offline_accuracy']:.1f}",
                         f"{e['samples_per_decision']:.1f} / {f['samples_per_decision']:.0f}",
                         f"{1e3 * e['energy_per_decision_j']:.3f} / {1e3 * f['energy_per_decision_j']:.3f}",
                         f"{n['energy_ratio']:.3f}",
                         f"{100 * e['accuracy_within_deadline']:.1f} / {100 * f['accuracy_within_deadline']:.1f}"))
        lines.append(markdown_table(["data set", "frame (samples)", "accuracy, early / full (%)",
                                     "samples per decision", "energy per decision (mJ)", "ratio",
                                     "accuracy within deadline (%)"], node_rows, align="lrrrrrr"))
    for name, r in out["real"].items():
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for method, pts in r["curves"].items():
            pts = sorted(pts)
            ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", ms=3, label=method)
        ax.set_xlabel("mean hitting time (samples)")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"{name} (T = {r['length']})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(plots / f"{name}.png", dpi=110)
        plt.close(fig)
        lines += ["", f"![{name}](firmbound{suffix}/{name}.png)"]
    lines += ["", "Hitting-time spread: FIRMBOUND-CFL's standard deviation over the static SPRT's is "
              f"{out['hitting_time_std_ratio_vs_static_sprt']:.3f}; the exact Bayes-optimal rule's own is "
              f"{out['hitting_time_std_ratio_exact_optimum_vs_static_sprt']:.3f} on the same test sequences, so on this "
              "task no rule reaches the goal's 0.8 by being optimal."]
    goals = [(k, "not measured" if out[k] is None else f"{out[k]:.3g}", f"{op} {g}") for k, (op, g) in GOALS.items()]
    goals.append(("gp_train_time_ratio_vs_cfl", f"{out['gp_train_time_ratio_vs_cfl']:.3g}", "reported"))
    lines += ["", "## Goals", "", markdown_table(["key", "measured", "goal"], goals, align="lrl")]
    write_atomic(docs_dir / f"firmbound{suffix}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
