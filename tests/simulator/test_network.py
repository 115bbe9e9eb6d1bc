"""Gateway resolution against hand-built cases, a brute-force collision oracle and Friis."""

from __future__ import annotations

import math

import numpy as np
import pydantic
import pytest

from edge.core.errors import ConfigError, DataError
from simulator.devices import LORA_SENSITIVITY_DBM
from simulator.network import (
    NetworkConfig,
    Outcome,
    PacketLog,
    node_distances_m,
    packet_airtime_s,
    path_loss_db,
    received_power_dbm,
    resolve,
)

C_M_S = 299_792_458.0
STRONG_DBM = -80.0  # far above every LoRa sensitivity


def make_log(rows: list[tuple], deadline_s: float = math.inf) -> PacketLog:
    """rows of (node_id, start_s, airtime_s, channel, sf, rx_power_dbm)."""
    cols = list(zip(*rows))
    return PacketLog(*cols, deadline_s=np.full(len(rows), deadline_s))


def outcomes(log: PacketLog, **cfg: object) -> list[Outcome]:
    return [Outcome(o) for o in resolve(log, NetworkConfig(**cfg), seed=0).outcome]


def test_path_loss_at_1_m_is_friis() -> None:
    f_hz = 868e6
    friis_db = 20 * math.log10(4 * math.pi * 1.0 * f_hz / C_M_S)
    assert path_loss_db(1.0, f_hz, 2.7) == pytest.approx(friis_db)
    assert friis_db == pytest.approx(31.22, abs=0.01)


def test_path_loss_with_exponent_2_is_friis_at_any_distance() -> None:
    d_m = np.array([3.0, 100.0, 2500.0])
    friis_db = 10 * np.log10((4 * np.pi * d_m * 2.44e9 / C_M_S) ** 2)
    np.testing.assert_allclose(path_loss_db(d_m, 2.44e9, 2.0), friis_db)
    # each decade adds 10 n dB
    assert path_loss_db(1000.0, 868e6, 3.0) - path_loss_db(100.0, 868e6, 3.0) == pytest.approx(30.0)
    assert received_power_dbm(14.0, 1.0, 868e6, 2.7) == pytest.approx(14.0 - 31.22, abs=0.01)
    with pytest.raises(ConfigError, match="distance_m"):
        path_loss_db([10.0, 0.0], 868e6, 2.7)


def test_node_distances_stay_in_annulus_and_do_not_depend_on_fleet_size() -> None:
    cfg = NetworkConfig(min_distance_m=50.0, max_distance_m=500.0)
    small, large = node_distances_m(cfg, 5, seed=3), node_distances_m(cfg, 4000, seed=3)
    np.testing.assert_array_equal(small, large[:5])
    assert large.min() >= 50.0 and large.max() <= 500.0
    # area-uniform: half the nodes lie inside the radius that halves the annulus area
    r_half = math.sqrt((50.0**2 + 500.0**2) / 2)
    assert np.mean(large < r_half) == pytest.approx(0.5, abs=0.03)
    assert not np.array_equal(large, node_distances_m(cfg, 4000, seed=4))


def test_overlapping_equal_power_packets_both_collide() -> None:
    log = make_log([(0, 0.0, 0.05, 0, 7, STRONG_DBM), (1, 0.03, 0.05, 0, 7, STRONG_DBM)])
    assert outcomes(log) == [Outcome.COLLIDED, Outcome.COLLIDED]


def test_ten_db_stronger_packet_survives_by_capture() -> None:
    log = make_log([(0, 0.0, 0.05, 0, 7, STRONG_DBM), (1, 0.03, 0.05, 0, 7, STRONG_DBM + 10)])
    assert outcomes(log) == [Outcome.COLLIDED, Outcome.DELIVERED]
    assert outcomes(log, capture_threshold_db=12.0) == [Outcome.COLLIDED, Outcome.COLLIDED]


def test_packet_inside_a_longer_one_is_seen_by_both() -> None:
    # the long packet starts first and contains the short one entirely
    log = make_log([(0, 0.0, 1.0, 0, 7, STRONG_DBM + 10), (1, 0.4, 0.05, 0, 7, STRONG_DBM)])
    assert outcomes(log) == [Outcome.DELIVERED, Outcome.COLLIDED]


def test_non_overlapping_packets_are_delivered() -> None:
    # back to back: the second starts exactly when the first ends
    log = make_log([(0, 0.0, 0.05, 0, 7, STRONG_DBM), (1, 0.05, 0.05, 0, 7, STRONG_DBM)])
    assert outcomes(log) == [Outcome.DELIVERED, Outcome.DELIVERED]


def test_different_channels_or_spreading_factors_do_not_collide() -> None:
    log = make_log([
        (0, 0.0, 0.05, 0, 7, STRONG_DBM), (1, 0.0, 0.05, 1, 7, STRONG_DBM), (2, 0.0, 0.05, 2, 7, STRONG_DBM),
        (3, 0.0, 0.05, 2, 8, STRONG_DBM),
    ])
    assert outcomes(log) == [Outcome.DELIVERED] * 4


def test_packet_below_sensitivity_is_not_delivered() -> None:
    sens = LORA_SENSITIVITY_DBM[7]
    log = make_log([(0, 0.0, 0.05, 0, 7, sens - 0.5), (1, 1.0, 0.05, 0, 7, sens + 0.5)])
    assert outcomes(log) == [Outcome.BELOW_SENSITIVITY, Outcome.DELIVERED]
    # SF12 hears what SF7 cannot
    assert outcomes(make_log([(0, 0.0, 1.3, 0, 12, sens - 5)])) == [Outcome.DELIVERED]
    # wider bandwidth raises the noise floor by 10 log10(250/125) = 3 dB
    assert outcomes(make_log([(0, 0.0, 0.05, 0, 7, sens + 2)]), bandwidth_hz=250e3) == [Outcome.BELOW_SENSITIVITY]


def test_ble_uses_its_own_sensitivity() -> None:
    log = make_log([(0, 0.0, 376e-6, 37, 0, -94.0), (1, 1.0, 376e-6, 38, 0, -96.0)])
    assert outcomes(log, radio="ble", frequency_hz=2.44e9) == [Outcome.DELIVERED, Outcome.BELOW_SENSITIVITY]


def test_arrival_and_deadline_counts() -> None:
    log = make_log([(0, 0.0, 0.05, 0, 7, STRONG_DBM), (0, 1.0, 0.05, 0, 7, STRONG_DBM)], deadline_s=1.08)
    result = resolve(log, NetworkConfig(backhaul_latency_s=0.05), seed=0)
    np.testing.assert_allclose(result.arrival_s, [0.10, 1.10])
    assert result.node_id.tolist() == [0]
    assert result.delivered.tolist() == [2] and result.delivered_in_time.tolist() == [1]


def brute_force_collided(log: PacketLog, capture_db: float) -> np.ndarray:
    """O(n^2) reference: the collision rule read straight from the specification."""
    end = log.start_s + log.airtime_s
    out = np.zeros(len(log), dtype=bool)
    for i in range(len(log)):
        for j in range(len(log)):
            same = log.channel[i] == log.channel[j] and log.sf[i] == log.sf[j]
            overlap = log.start_s[i] < end[j] and log.start_s[j] < end[i]
            if i != j and same and overlap and log.rx_power_dbm[i] - log.rx_power_dbm[j] < capture_db:
                out[i] = True
    return out


def random_log(n: int, seed: int, n_nodes: int = 40, span_s: float = 20.0) -> PacketLog:
    rng = np.random.default_rng(seed)
    return PacketLog(
        node_id=rng.integers(0, n_nodes, n), start_s=np.round(rng.uniform(0, span_s, n), 2),
        airtime_s=rng.choice([0.05, 0.2, 1.0], n), channel=rng.integers(0, 2, n), sf=rng.choice([7, 9], n),
        rx_power_dbm=rng.uniform(-110, -70, n), deadline_s=np.full(n, np.inf),
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_collisions_match_brute_force(seed: int) -> None:
    log = random_log(300, seed)
    result = resolve(log, NetworkConfig(), seed=0)
    expected = brute_force_collided(log, 6.0)
    assert 20 < expected.sum() < 280  # the case exercises both outcomes
    np.testing.assert_array_equal(result.outcome == Outcome.COLLIDED, expected)


def test_result_does_not_depend_on_concatenation_order() -> None:
    log = random_log(2000, seed=5, n_nodes=50, span_s=200.0)
    per_node = [log.take(np.flatnonzero(log.node_id == k)) for k in range(50)]
    cfg = NetworkConfig(shadowing_sigma_db=6.0, loss_probability=0.2)
    forward = resolve(PacketLog.concatenate(per_node), cfg, seed=11)
    shuffled_logs = [per_node[k] for k in np.random.default_rng(1).permutation(50)]
    shuffled = resolve(PacketLog.concatenate(shuffled_logs), cfg, seed=11)
    for name in ("node_id", "delivered", "collided", "lost", "below_sensitivity", "delivered_in_time"):
        np.testing.assert_array_equal(getattr(forward, name), getattr(shuffled, name))

    def by_packet(logs: list[PacketLog], result: object) -> dict:
        cat = PacketLog.concatenate(logs)
        return {(n, s): (o, p) for n, s, o, p in zip(cat.node_id, cat.start_s, result.outcome, result.rx_power_dbm)}

    assert by_packet(per_node, forward) == by_packet(shuffled_logs, shuffled)
    assert resolve(PacketLog.concatenate(per_node), cfg, seed=12).outcome.tolist() != forward.outcome.tolist()


def test_loss_probability_matches_observed_rate() -> None:
    n = 20_000
    log = make_log([(k % 100, float(k), 0.05, 0, 7, STRONG_DBM) for k in range(n)])
    result = resolve(log, NetworkConfig(loss_probability=0.2), seed=7)
    rate = np.mean(result.outcome == Outcome.LOST)
    assert rate == pytest.approx(0.2, abs=4 * math.sqrt(0.2 * 0.8 / n))
    assert result.lost.sum() + result.delivered.sum() == n


def test_shadowing_has_the_configured_spread() -> None:
    n = 20_000
    log = make_log([(k % 100, float(k), 0.05, 0, 7, STRONG_DBM) for k in range(n)])
    shadow_db = resolve(log, NetworkConfig(shadowing_sigma_db=8.0), seed=3).rx_power_dbm - STRONG_DBM
    assert np.mean(shadow_db) == pytest.approx(0.0, abs=0.2)
    assert np.std(shadow_db) == pytest.approx(8.0, rel=0.03)


def test_300k_packets_resolve_by_the_rule_on_a_fleet_scale_log() -> None:
    # the scale of a large fleet-hour; its speed is a benchmark's business, not a unit test's
    n = 300_000
    rng = np.random.default_rng(0)
    cfg = NetworkConfig(shadowing_sigma_db=4.0, loss_probability=0.01)
    log = PacketLog(
        node_id=rng.integers(0, 5000, n), start_s=rng.uniform(0, 3600, n), airtime_s=np.full(n, packet_airtime_s(cfg)),
        channel=rng.integers(0, 8, n), sf=np.full(n, 7), rx_power_dbm=rng.uniform(-125, -70, n),
        deadline_s=np.full(n, np.inf),
    )
    result = resolve(log, cfg, seed=0)
    assert len(result.outcome) == n
    per_node = result.delivered + result.collided + result.lost + result.below_sensitivity
    assert per_node.sum() == n and np.array_equal(result.node_id, np.unique(log.node_id))
    # a sample of packets decided by the rule read straight from the specification, against all n packets
    rx, end = result.rx_power_dbm, log.start_s + log.airtime_s
    sens = LORA_SENSITIVITY_DBM[7]
    sample = rng.choice(n, 300, replace=False)
    for i in sample:
        others = (np.arange(n) != i) & (log.channel == log.channel[i]) & (log.start_s < end[i]) & (log.start_s[i] < end)
        collided = bool(np.any(rx[i] - rx[others] < cfg.capture_threshold_db))
        if rx[i] < sens:
            assert result.outcome[i] == Outcome.BELOW_SENSITIVITY, i
        elif collided:
            assert result.outcome[i] == Outcome.COLLIDED, i
        else:
            assert result.outcome[i] in (Outcome.DELIVERED, Outcome.LOST), i
    counts = np.bincount(result.outcome, minlength=4)
    assert min(counts[Outcome.DELIVERED], counts[Outcome.COLLIDED], counts[Outcome.BELOW_SENSITIVITY]) > 1000
    heard = counts[Outcome.DELIVERED] + counts[Outcome.LOST]
    assert counts[Outcome.LOST] / heard == pytest.approx(0.01, abs=4 * math.sqrt(0.01 * 0.99 / heard))


def test_config_rejects_bad_values() -> None:
    with pytest.raises(pydantic.ValidationError, match="min_distance_m"):
        NetworkConfig(min_distance_m=500.0, max_distance_m=100.0)
    with pytest.raises(pydantic.ValidationError, match="bandwidth_hz"):
        NetworkConfig(bandwidth_hz=100e3)
    with pytest.raises(pydantic.ValidationError, match="spreading_factor"):
        NetworkConfig(spreading_factor=6)
    with pytest.raises(pydantic.ValidationError, match="loss_probability"):
        NetworkConfig(loss_probability=1.0)
    with pytest.raises(pydantic.ValidationError, match="gateway_count"):
        NetworkConfig(gateway_count=2)
    assert NetworkConfig(radio="ble").channel_count() == 3


def test_bad_logs_are_data_errors() -> None:
    with pytest.raises(DataError, match="equal length"):
        PacketLog([0, 1], [0.0], [0.1], [0], [7], [-80.0], [math.inf])
    with pytest.raises(DataError, match="airtime_s"):
        make_log([(0, 0.0, 0.0, 0, 7, STRONG_DBM)])
    with pytest.raises(DataError, match="spreading factors"):
        resolve(make_log([(0, 0.0, 0.05, 0, 5, STRONG_DBM)]), NetworkConfig(), seed=0)


def test_empty_log_resolves_to_nothing() -> None:
    result = resolve(PacketLog.concatenate([]), NetworkConfig(), seed=0)
    assert len(result.outcome) == 0 and len(result.node_id) == 0
