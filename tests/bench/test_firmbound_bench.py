"""The FIRMBOUND benchmark's protocol (issue 48): every method at the same decision points, AUSAT over
a common [1, T] with chance accuracy before a method's first point, equal sweeps chosen on training
data, and the accuracy-constrained operating point beside the harmonic mean's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.firmbound import (
    CANDIDATES,
    COMMON_POINTS,
    SWEEP,
    SWEPT,
    _points,
    ausat,
    candidate_costs,
    candidate_thresholds,
    chance_accuracy,
    pick,
    spread,
    streams,
)
from models.firmbound import LOSS_L, gaussian_sequences

torch.set_num_threads(1)


def test_ausat_is_chance_before_a_methods_first_point_over_the_same_span() -> None:
    # by hand: chance 0.5 over [1, 5), 0.9 over [5, 11], divided by 10
    assert ausat([(5.0, 0.9)], 11, chance=0.5) == pytest.approx((4 * 0.5 + 6 * 0.9) / 10)
    # a lone point at T (the full-length classifier) scores chance: it decides nothing early
    assert ausat([(11.0, 0.97)], 11, chance=0.5) == pytest.approx(0.5)
    # stopping after one sample at chance accuracy buys no area (the issue: FIRMBOUND's highest costs did)
    later = [(9.0, 0.8), (15.0, 0.95)]
    assert ausat([(1.0, 0.5), *later], 20, chance=0.5) == pytest.approx(ausat(later, 20, chance=0.5))
    # and a method starting later is not charged zero accuracy before its first point
    assert ausat(later, 20, chance=0.5) > ausat(later, 20, chance=0.0)


def test_every_method_gets_as_many_settings_spread_over_its_stops_on_training_data() -> None:
    """Of 32 candidates, 20 of which stop at the first point (a cost that makes waiting dear), the
    sweep takes 8 distinct ones from the earliest stop to the latest: no setting wasted on a
    duplicate point."""
    stops = [9.0] * 20 + list(np.linspace(10, 24, 12))
    validation = {float(i): (t, 0.5 + t / 50) for i, t in enumerate(stops)}
    chosen = spread(validation)
    assert len(chosen) == SWEEP == len(set(chosen))
    times = sorted(validation[s][0] for s in chosen)
    assert times[0] == 9.0 and times[-1] == 24.0 and sum(t == 9.0 for t in times) == 1
    assert chosen == [s for s in validation if s in chosen]  # in the candidates' order


def test_costs_and_thresholds_are_the_same_candidates_in_stopping_risk() -> None:
    points = _points(150)
    assert points[0] == 9 and points[-1] == 150 and len(points) == COMMON_POINTS
    thresholds = candidate_thresholds(4)
    costs = candidate_costs(4, points)
    assert len(thresholds) == len(costs) == CANDIDATES
    assert thresholds[0] == pytest.approx(0.25) and thresholds[-1] == pytest.approx(1 - 1e-4)
    step = (150 - 9) / (COMMON_POINTS - 1)
    np.testing.assert_allclose(np.array(costs) * step, LOSS_L * (1 - np.array(thresholds)))


def test_the_accuracy_constrained_point_is_the_earliest_within_one_point() -> None:
    validation = {0.1: (3.0, 0.70), 0.2: (6.0, 0.945), 0.3: (8.0, 0.955), 0.4: (10.0, 0.96)}
    chosen = pick(validation, full=0.96, length=10, n=200)
    assert chosen["accurate"] == 0.3 and chosen["accurate_found"]  # 0.945 is 1.5 points short
    assert chosen["hm"] == 0.1  # the harmonic mean's pick stops earliest, 26 points below
    # on fewer than 100 validation series one series is the tolerance: 1/20 here
    assert pick(validation, full=0.96, length=10, n=20)["accurate"] == 0.2
    none = pick({0.1: (3.0, 0.5), 0.2: (6.0, 0.6)}, full=0.96, length=10, n=200)
    assert none["accurate"] == 0.2 and not none["accurate_found"]  # the latest stop when none is within
    assert chance_accuracy(np.array([0, 1, 1, 1]), np.array([1, 1, 0, 0])) == 0.5


@pytest.mark.slow
def test_every_method_decides_at_the_same_points_with_equal_sweeps() -> None:
    x, y, _ = gaussian_sequences(80, n_classes=2, dim=2, length=20, offset=0.4, seed=0)
    xt, yt, _ = gaussian_sequences(60, n_classes=2, dim=2, length=20, offset=0.4, seed=1)
    r = streams("toy", x, y, xt, yt, quick=True)
    assert r["decision_points"] == _points(20) == [9, 11, 12, 14, 15, 17, 18, 20]
    assert {m: len(r["sweeps"][m]) for m in SWEPT} == dict.fromkeys(SWEPT, SWEEP)
    assert {m: len(c) for m, c in r["curves"].items()} == {**dict.fromkeys(SWEPT, SWEEP), "TEASER": 1, "full length": 1}
    for m, curve in r["curves"].items():  # no method decides before the first common point
        assert all(9.0 <= t <= 20.0 for t, _ in curve), m
        assert r["ausat"][m] == pytest.approx(ausat(curve, 20, r["chance_accuracy"]))
    assert r["ausat"]["full length"] == pytest.approx(r["chance_accuracy"])
    for m in SWEPT:
        op = r["common_operating_points"][m]
        assert op["accurate"]["setting"] in r["sweeps"][m] and op["hm"]["setting"] in r["sweeps"][m]
        assert op["accurate"]["gap_pts"] == pytest.approx(100 * (op["full_length_accuracy"] - op["accurate"]["accuracy"]))
