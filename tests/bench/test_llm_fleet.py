"""The fleet-capacity co-simulation (bench/llm_fleet.py): closed-form cases of the event model,
traces of a perfect and a useless draft, and the measured cost table's shape on a tiny model."""

from __future__ import annotations

import numpy as np
import pytest

from bench.llm_fleet import ForwardCosts, devices_at_slo, measure_forward_costs, measure_forward_only, record_traces, simulate
from models.lm.speculative import IndependentDrafter
from tests.models.lm.test_speculative import AlwaysWrong, _llama


def _flat(step_s: float, prefill_s: float) -> ForwardCosts:
    return ForwardCosts((1, 32), (1, 13), np.full((2, 2), step_s), prefill_s)


def test_one_device_api_only_is_the_closed_form() -> None:
    rtt, step, prefill, new = 0.02, 0.005, 0.03, 10
    row = simulate("api", 1, [[0]], _flat(step, prefill), rtt_s=rtt, draft_token_s=0.001, new=new, requests=1)
    assert row["seconds"] == pytest.approx(rtt + prefill + new * step)
    assert row["tokens"] == new and row["server_rows_per_token"] == pytest.approx((new + 1) / new)
    # the first token waits for the trip, the prefill and its step; the others a step each
    assert row["mean_time_per_token_s"] == pytest.approx((rtt + prefill + step + (new - 1) * step) / new)


def test_speculation_with_a_perfect_draft_verifies_k_plus_one_tokens_per_row() -> None:
    k, new = 4, 50
    row = simulate("sd", 1, [[k] * new], _flat(0.005, 0.0), rtt_s=0.0, draft_token_s=0.0, new=new, requests=1, k_max=k)
    rounds = -(-new // (k + 1))
    assert row["server_forwards_per_token"] == pytest.approx((rounds + 1) / new)  # the rounds and one prefill
    useless = simulate("sd", 1, [[0] * new], _flat(0.005, 0.0), rtt_s=0.0, draft_token_s=0.0, new=new, requests=1, k_max=k)
    assert useless["server_rows_per_token"] > 1


def test_a_busy_server_batches_and_slows_every_device() -> None:
    costs = ForwardCosts((1, 32), (1, 13), np.array([[0.01, 0.02], [0.1, 0.2]]), 0.02)
    rows = [simulate(p, n, [[2] * 64], costs, rtt_s=0.02, draft_token_s=0.002, new=64) for p in ("api", "sd") for n in (1, 8, 32)]
    api = [r for r in rows if r["policy"] == "api"]
    assert api[0]["mean_batch_rows"] < api[2]["mean_batch_rows"]
    assert api[0]["p95_time_per_token_s"] < api[2]["p95_time_per_token_s"]
    assert api[2]["tokens_per_second"] > api[0]["tokens_per_second"]
    assert devices_at_slo(rows, "api", slo_s=api[1]["p95_time_per_token_s"]) == 8
    assert devices_at_slo(rows, "api", slo_s=1e-6) == 0


def test_traces_of_a_perfect_and_a_useless_draft() -> None:
    target = _llama(0)
    perfect = record_traces(target, IndependentDrafter(target), [[1, 2, 3]], new=12, k_max=5)
    assert perfect == [[5] * 12]
    assert record_traces(target, AlwaysWrong(target), [[1, 2, 3]], new=12, k_max=5) == [[0] * 12]


def test_costs_beyond_the_grid_never_fall() -> None:
    """Stop 40's run: timings of a 2 x 2 grid taken while both cores were busy fell from B = 1 to B = 2,
    and the extrapolated cost of B = 4 came out at -0.98 ms."""
    noisy = ForwardCosts(rows=(1, 2), tokens=(1, 3), seconds=np.array([[2e-3, 3e-3], [1e-3, 1.5e-3]]), prefill_s=1e-3)
    assert noisy(4, 1) == pytest.approx(1e-3) and noisy(4, 3) == pytest.approx(1.5e-3)
    rising = ForwardCosts(rows=(1, 2), tokens=(1, 3), seconds=np.array([[1e-3, 2e-3], [2e-3, 3e-3]]), prefill_s=1e-3)
    assert rising(4, 1) == pytest.approx(4e-3)


def test_measured_costs_cover_the_grid() -> None:
    target = _llama(0)
    for measure in (measure_forward_costs, measure_forward_only):
        costs = measure(target, context=8, rows=(1, 2), tokens=(1, 3), prompt_tokens=8, reps=1)
        assert costs.seconds.shape == (2, 2) and (costs.seconds > 0).all() and costs.prefill_s > 0
        assert costs(1, 2) == pytest.approx(costs.seconds[0].mean())
        assert costs(4, 1) > 0
