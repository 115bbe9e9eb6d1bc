"""Auto mode's cost model: the line fits follow timings, the best K is the closed form's argmax,
plain decoding wins when drafting cannot pay, and probes come back at a doubling interval."""

from __future__ import annotations

import numpy as np
import pytest

from edge.llm.cost import DecodeCost, Line, expected_tokens


def test_a_line_learns_the_timings_from_a_wrong_prior() -> None:
    line = Line(fixed_s=1.0, per_s=0.0)
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 9))
        line.observe(n, 0.004 + 0.001 * n)
    assert line.fixed_s == pytest.approx(0.004, rel=1e-2) and line.per_s == pytest.approx(0.001, rel=1e-2)
    for _ in range(100):  # a single n: the level moves, the slope stays
        line.observe(3, 0.010)
    assert line.seconds(3) == pytest.approx(0.010, rel=1e-2) and line.per_s > 0


def test_expected_tokens_is_the_geometric_sum() -> None:
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(1.0, 4) == pytest.approx(5, rel=1e-2)  # clipped below 1, near K + 1


def test_best_k_maximises_tokens_per_second_and_falls_to_plain_decoding() -> None:
    cheap = DecodeCost.prior(verify_s=0.010, draft_token_s=0.001, verify_token_s=0.0005)
    for rate in (0.3, 0.6, 0.9):
        speeds = [expected_tokens(rate, k) / cheap.round_s(k) for k in range(9)]
        assert cheap.best_k(rate, 8) == int(np.argmax(speeds))
    assert cheap.best_k(0.9, 8) > cheap.best_k(0.3, 8) > 0
    assert cheap.best_k(0.0, 8) == 0  # nothing is ever accepted: plain decoding
    dear = DecodeCost.prior(verify_s=0.010, draft_token_s=0.012)  # a drafted token costs more than the call it saves
    assert dear.best_k(1.0, 8) == 0 and not dear.can_pay(8) and cheap.can_pay(8)


def test_probes_come_back_after_plain_rounds_at_a_doubling_interval() -> None:
    cost = DecodeCost.prior(verify_s=0.010, draft_token_s=0.003, probe_rounds=4, max_probe_rounds=16)
    session = cost.session(8)
    session.acceptance.kept = 0.05 * session.acceptance.tried
    session.explore_share = 1.0  # the time share for probes never binds here
    ks = []
    for _ in range(60):  # acceptance too low to draft, but a draft could pay
        ks.append(session.choose())
        session.observe_verify(1, 0.010)
    probes = [i for i, k in enumerate(ks) if k]
    assert all(ks[i] == 1 for i in probes) and np.diff(probes).tolist()[:3] == [9, 17, 17]
    never = DecodeCost.prior(verify_s=0.010, draft_token_s=0.020).session(8)
    never.acceptance.kept = 0.9 * never.acceptance.tried
    assert not any(never.choose() for _ in range(100))  # a draft that cannot pay is never probed


def test_probes_stay_within_their_share_of_the_time() -> None:
    cost = DecodeCost.prior(verify_s=0.010, draft_token_s=0.003, probe_rounds=2, max_probe_rounds=2)
    session = cost.session(8)
    session.acceptance.kept = 0.05 * session.acceptance.tried
    ks = []
    for _ in range(400):
        k = session.choose()
        if k:
            session.observe_draft(k, 0.050)  # a probe that catches up on a long text: 5 target calls
        session.observe_verify(k + 1, 0.010)
        ks.append(k)
    # within the share, but for the last probe, which cost more than expected
    assert sum(ks) > 0 and session.probe_s <= 0.02 * session.elapsed_s + 0.050
    assert sum(ks) < 400 // 3  # without the cap, a probe every third round


def test_a_generation_starts_from_the_acceptance_of_earlier_ones_but_not_a_calibrations() -> None:
    cost = DecodeCost.prior(verify_s=0.010, draft_token_s=0.001)
    calibration = cost.session(4, plan=(4, 4))
    for _ in range(2):
        calibration.choose()
        calibration.observe_acceptance(0, 4)
    assert cost.acceptance.rate == pytest.approx(0.6)
    first = cost.session(4)
    for _ in range(50):
        first.choose()
        first.observe_acceptance(4, 4)
    assert cost.session(4).acceptance.rate > 0.9 and first.acceptance.rate > 0.9


def test_a_calibration_plan_comes_first_and_is_checked() -> None:
    session = DecodeCost.prior(verify_s=0.010, draft_token_s=0.020).session(4, plan=(0, 1, 4))
    assert [session.choose() for _ in range(4)] == [0, 1, 4, 0]
    with pytest.raises(ValueError, match="0 <= K <= k_max"):
        DecodeCost.prior(verify_s=0.010, draft_token_s=0.0).session(4, plan=(5,))


class CountingCost(DecodeCost):
    """A cost model that counts how often the best K is worked out."""

    looks = 0

    def best_k(self, rate: float, k_max: int) -> int:
        self.looks += 1
        return super().best_k(rate, k_max)


def test_a_run_of_plain_rounds_works_out_the_best_k_every_few_rounds_only() -> None:
    """Working out the best K is about 1 % of a tiny target's token, every round of auto mode's
    plain decoding (where it drafts nothing: 0.96–0.98× plain decoding with it): in a run of plain
    rounds, where the acceptance it rests on cannot change, it is looked at again every
    ``recheck_rounds`` rounds. A draft that comes to pay (the target slows) is taken up by the next look."""
    cost = CountingCost(Line(0.0, 0.003), Line(0.010, 0.0))
    session = cost.session(8)
    session.acceptance.kept = 0.2 * session.acceptance.tried  # drafting does not pay at 10 ms a target call
    session.explore_share = 0.0  # no probes
    for _ in range(80):
        assert session.choose() == 0
        session.observe_verify(1, 0.010)
    assert cost.looks <= 2 * (80 // session.recheck_rounds + 1)  # each look: the best K, and whether any K could pay
    ks = []
    for _ in range(40):  # the target now takes 100 ms a call: a drafted token at 3 ms pays
        ks.append(session.choose())
        session.observe_verify(ks[-1] + 1, 0.100)
    first = next(i for i, k in enumerate(ks) if k > 0)
    assert first <= 2 * session.recheck_rounds
