"""Capacitor ODE C·v·dv/dt = p − i·v − g·v² against closed forms, quadrature (scipy, mpmath) and solve_ivp.

Every expected number is derived here from the physics, never from ``simulator.storage``
itself: crossing times are the integral t = C ∫ v / f(v) dv (eq. 2 of storage.py),
voltages come from integrating u = v², (C/2) du/dt = p − i √u − g u.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy.integrate import quad, solve_ivp

from simulator.storage import equilibrium_v, time_to, voltage_after

mpmath.mp.dps = 30


# ---- oracles ---------------------------------------------------------------------------


def mp_equilibrium_v(p: float, i: float, g: float) -> float:
    """Positive root of g v² + i v − p = 0 in 30-digit arithmetic (0 when p <= 0, inf when none)."""
    if p <= 0:
        return 0.0
    if g == 0:
        return math.inf if i == 0 else p / i
    p_, i_, g_ = mpmath.mpf(p), mpmath.mpf(i), mpmath.mpf(g)
    return float((-i_ + mpmath.sqrt(i_ * i_ + 4 * g_ * p_)) / (2 * g_))


def mp_time(v0: float, v1: float, p: float, i: float, g: float, c: float) -> float:
    """C ∫_{v0}^{v1} v / (p − i v − g v²) dv by 30-digit Gauss-Legendre quadrature."""
    p_, i_, g_ = mpmath.mpf(p), mpmath.mpf(i), mpmath.mpf(g)
    val = mpmath.quad(lambda v: v / (p_ - i_ * v - g_ * v * v), [mpmath.mpf(v0), mpmath.mpf(v1)], method="gauss-legendre")
    return float(mpmath.mpf(c) * val)


def ivp_voltage(v0: float, dt: float, p: float, i: float, g: float, c: float) -> float:
    """Voltage after dt by DOP853 on u = v²: du/dt = 2 (p − i √u − g u) / C."""

    def du(_t: float, u: np.ndarray) -> np.ndarray:
        return 2.0 * (p - i * np.sqrt(np.maximum(u, 0.0)) - g * u) / c

    sol = solve_ivp(du, (0.0, dt), [v0 * v0], method="DOP853", rtol=1e-12, atol=1e-16 * max(v0 * v0, 1.0))
    assert sol.success
    return math.sqrt(max(sol.y[0, -1], 0.0))


def random_general_cases(n: int, seed: int) -> list[tuple[float, float, float, float, float, float]]:
    """(v0, v1, p, i, g, C) with i, g > 0: charging below equilibrium, decaying above it, and
    strongly negative p (complex roots of f), with g down to 1e-10 S (10 GΩ)."""
    rng = np.random.default_rng(seed)
    cases: list[tuple[float, float, float, float, float, float]] = []

    def log_u(lo: float, hi: float) -> float:
        return float(10 ** rng.uniform(math.log10(lo), math.log10(hi)))

    while len(cases) < n:
        c = log_u(1e-6, 1.0)
        i = log_u(1e-9, 1e-3)
        g = 1e-10 if rng.random() < 0.3 else log_u(1e-10, 1e-3)
        kind = len(cases) % 4
        frac = float(rng.uniform(0.05, 0.9))
        if kind == 0:  # charging towards the equilibrium
            p = log_u(1e-7, 1.0)
            v_eq = mp_equilibrium_v(p, i, g)
            v0 = float(rng.uniform(0.0, 0.9)) * min(v_eq, 50.0)
            v1 = v0 + frac * (min(v_eq, 50.0) - v0)
        elif kind == 1:  # above the equilibrium: decays towards it
            p = log_u(1e-7, 1e-2)
            v_eq = mp_equilibrium_v(p, i, g)
            v0 = v_eq * float(rng.uniform(1.05, 3.0))
            v1 = v_eq + frac * (v0 - v_eq)
        elif kind == 2:  # net drain, p < 0 (real roots, both negative)
            p = -log_u(1e-7, 1.0)
            v0 = float(rng.uniform(0.5, 5.0))
            v1 = frac * v0
        else:  # strongly negative p: i² + 4 g p < 0, complex roots
            p = -(i * i / (4.0 * g)) * log_u(1.5, 1e6)
            if p < -10.0:
                continue
            v0 = float(rng.uniform(0.5, 5.0))
            v1 = 0.0 if rng.random() < 0.25 else frac * v0
        if v1 == v0 or not (math.isfinite(v0) and math.isfinite(v1)):
            continue
        cases.append((v0, v1, p, i, g, c))
    return cases


GENERAL = random_general_cases(160, seed=20240611)
assert sum(1 for (_, _, p, i, g, _) in GENERAL if i * i + 4 * g * p < 0) >= 30
assert sum(1 for case in GENERAL if case[4] == 1e-10) >= 30


# ---- time_to -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "v0, v1, p, g, c",
    [
        (0.0, 3.0, 1e-3, 1e-6, 10e-3),  # charging from empty through 1 MΩ
        (2.0, 3.3, 2e-4, 1e-5, 470e-6),  # towards the equilibrium sqrt(p/g) = 4.47 V
        (3.6, 2.0, -2e-3, 1e-6, 10e-3),  # load larger than harvest
        (3.6, 2.5, 0.0, 1e-4, 1e-3),  # pure RC decay
        (4.0, 2.5, 4e-4, 1e-4, 1e-3),  # above the equilibrium 2 V, decays towards it
        (1.0, 1.9, 4e-4, 1e-4, 1e-3),  # below the equilibrium 2 V, 90 % of the way
        (0.0, 2.0, 1e-3, 1e-10, 1e-3),  # almost no leakage (10 GΩ), from empty
    ],
)
def test_time_to_with_resistive_leakage_only_is_log_ratio(v0: float, v1: float, p: float, g: float, c: float) -> None:
    expected = (c / (2.0 * g)) * math.log((p - g * v0 * v0) / (p - g * v1 * v1))
    if g == 1e-10:  # the log of a ratio within 1e-6 of 1 loses digits: −ln(1 − x) = x + x²/2 + x³/3 + …
        x = g * v1 * v1 / p  # v0 = 0
        expected = (c / (2.0 * g)) * (x + x * x / 2 + x**3 / 3)
    assert time_to(v0, v1, p, 0.0, g, c) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "v0, v1, p, c",
    [(0.0, 3.0, 0.8e-3, 10e-3), (2.0, 3.0, 1e-6, 1e-4), (3.0, 2.0, -3.1e-3, 470e-6), (1.0, 0.0, -1e-3, 1e-3)],
)
def test_time_to_without_leakage_is_energy_over_power(v0: float, v1: float, p: float, c: float) -> None:
    assert time_to(v0, v1, p, 0.0, 0.0, c) == pytest.approx(c * (v1 * v1 - v0 * v0) / (2.0 * p), rel=1e-14)


def test_first_boot_time_from_empty_is_half_c_von_squared_over_power() -> None:
    # 10 mF to 3 V at 0.8 mW into the capacitor: 45 mJ / 0.8 mW = 56.25 s
    assert time_to(0.0, 3.0, 0.8e-3, 0.0, 0.0, 10e-3) == pytest.approx(56.25, rel=1e-15)


@pytest.mark.parametrize("seed", range(4))
def test_time_to_with_current_draw_only_matches_quad(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(25):
        c = float(10 ** rng.uniform(-6, 0))
        i = float(10 ** rng.uniform(-9, -2))
        if rng.random() < 0.5:  # charging towards p / i
            p = float(10 ** rng.uniform(-6, 0))
            v_eq = min(p / i, 40.0)
            v0 = float(rng.uniform(0, 0.8)) * v_eq
            v1 = v0 + float(rng.uniform(0.01, 0.95)) * (v_eq - v0)
        else:  # draining, possibly to 0
            p = -float(10 ** rng.uniform(-7, -1))
            v0 = float(rng.uniform(0.1, 5.0))
            v1 = float(rng.choice([0.0, rng.uniform(0.0, v0)]))
        expected, _ = quad(lambda v: c * v / (p - i * v), v0, v1, epsabs=0.0, epsrel=1e-13, limit=200)
        assert time_to(v0, v1, p, i, 0.0, c) == pytest.approx(expected, rel=1e-10), (v0, v1, p, i, c)


def test_time_to_general_case_matches_30_digit_quadrature() -> None:
    bad = []
    for v0, v1, p, i, g, c in GENERAL:
        got, expected = time_to(v0, v1, p, i, g, c), mp_time(v0, v1, p, i, g, c)
        if not abs(got - expected) <= 1e-10 * abs(expected):
            bad.append(((v0, v1, p, i, g, c), got, expected, abs(got / expected - 1)))
    assert not bad, f"{len(bad)} of {len(GENERAL)} off by more than 1e-10, first: {bad[0]}"


def test_time_to_at_a_double_root_matches_quadrature() -> None:
    # i² + 4 g p = 0 exactly: f = −g (v + i/(2g))²
    i, g, c = 2e-6, 1e-6, 1e-3
    p = -i * i / (4.0 * g)
    assert i * i + 4.0 * g * p == 0.0
    for v0, v1 in [(3.0, 2.0), (3.0, 0.0), (0.5, 0.1)]:
        assert time_to(v0, v1, p, i, g, c) == pytest.approx(mp_time(v0, v1, p, i, g, c), rel=1e-10)


def test_time_to_is_additive_over_an_intermediate_voltage() -> None:
    for v0, v1, p, i, g, c in GENERAL[:40]:
        mid = 0.5 * (v0 + v1)
        whole = mp_time(v0, v1, p, i, g, c)
        assert time_to(v0, mid, p, i, g, c) + time_to(mid, v1, p, i, g, c) == pytest.approx(whole, rel=1e-10)


# ---- unreachable targets ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "v0, v1, p, i, g",
    [
        (0.0, 3.0, 1e-6, 1e-6, 0.0),  # equilibrium p/i = 1 V: 3 V is never reached
        (0.0, 1.0, 1e-6, 1e-6, 0.0),  # ... nor the equilibrium itself
        (0.0, 3.0, 1e-6, 0.0, 1e-6),  # equilibrium sqrt(p/g) = 1 V
        (0.0, 1.0, 1e-6, 0.0, 1e-6),
        (0.0, 3.0, 2e-6, 1e-6, 1e-6),  # equilibrium 1 V (v² + v − 2 = 0)
        (0.0, 1.0, 2e-6, 1e-6, 1e-6),
        (2.0, 1.0, 2e-6, 1e-6, 1e-6),  # above the equilibrium: decays to 1 V, never below
        (2.0, 0.5, 2e-6, 1e-6, 1e-6),
        (2.0, 1.0, 1e-6, 0.0, 1e-6),  # RC towards sqrt(p/g) = 1 V
        (2.0, 0.0, 0.0, 0.0, 1e-6),  # pure RC decay never reaches 0
        (2.0, 3.0, -1e-6, 1e-6, 1e-6),  # draining: never rises
        (2.0, 3.0, 0.0, 1e-6, 0.0),
        (2.0, 3.0, 0.0, 0.0, 0.0),  # nothing flows at all
        (2.0, 1.0, 0.0, 0.0, 0.0),
        (0.5, 0.4, 1e-6, 1e-6, 1e-6),  # charging, target below
    ],
)
def test_unreachable_targets_take_forever(v0: float, v1: float, p: float, i: float, g: float) -> None:
    assert time_to(v0, v1, p, i, g, 1e-3) == math.inf


@pytest.mark.parametrize(
    "v0, p, i, g, expected",
    [
        (2.0, -1e-3, 0.0, 0.0, 1e-3 * 4.0 / 2 / 1e-3),  # energy / power
        (2.0, 0.0, 1e-6, 0.0, 1e-3 * 2.0 / 1e-6),  # C dv/dt = −i: linear
        (2.0, 0.0, 1e-6, 1e-6, 1e-3 * math.log(1 + 1e-6 * 2.0 / 1e-6) / 1e-6),  # C dv/dt = −(i + g v)
    ],
)
def test_draining_to_zero_is_finite_with_a_constant_drain(v0: float, p: float, i: float, g: float, expected: float) -> None:
    assert time_to(v0, 0.0, p, i, g, 1e-3) == pytest.approx(expected, rel=1e-13)


@pytest.mark.parametrize(
    "p, i, g, expected",
    [
        (1e-3, 0.0, 0.0, math.inf),
        (0.0, 0.0, 0.0, 0.0),  # nothing flows: p <= 0 gives 0 before the no-root case gives inf
        (-1e-3, 1e-6, 1e-6, 0.0),
        (0.0, 1e-6, 1e-6, 0.0),
        (1e-3, 1e-6, 0.0, 1000.0),
        (1e-4, 0.0, 1e-6, 10.0),
        (2e-6, 1e-6, 1e-6, 1.0),
        (1e-3, 1e-6, 1e-6, (-1e-6 + math.sqrt(1e-12 + 4e-9)) / 2e-6),
        (1.0, 1e-9, 1e-10, (-1e-9 + math.sqrt(1e-18 + 4e-10)) / 2e-10),
    ],
)
def test_equilibrium_v_closed_form(p: float, i: float, g: float, expected: float) -> None:
    got = equilibrium_v(p, i, g)
    assert got == pytest.approx(expected, rel=1e-9)
    if 0.0 < got < math.inf:
        assert p - i * got - g * got * got == pytest.approx(0.0, abs=1e-12 * p)


# ---- voltage_after -------------------------------------------------------------------------


def test_voltage_after_inverts_time_to() -> None:
    for v0, v1, p, i, g, c in GENERAL:
        if v1 == 0.0:
            continue
        dt = mp_time(v0, v1, p, i, g, c)
        assert voltage_after(v0, dt, p, i, g, c) == pytest.approx(v1, rel=1e-10), (v0, v1, p, i, g, c)


@pytest.mark.parametrize("seed", range(3))
def test_voltage_after_matches_dop853_on_v_squared(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    for _ in range(12):
        c = float(10 ** rng.uniform(-5, -1))
        i = float(rng.choice([0.0, 10 ** rng.uniform(-8, -4)]))
        g = float(rng.choice([0.0, 10 ** rng.uniform(-8, -4)]))
        p = float(rng.choice([1.0, -1.0]) * 10 ** rng.uniform(-6, -2))
        v0 = float(rng.uniform(0.5, 4.0))
        # a horizon of a fraction of the characteristic time C v0² / |p|, stopping short of 0 V
        dt = float(rng.uniform(0.02, 0.3)) * c * v0 * v0 / abs(p)
        expected = ivp_voltage(v0, dt, p, i, g, c)
        assert voltage_after(v0, dt, p, i, g, c) == pytest.approx(expected, rel=1e-9), (v0, dt, p, i, g, c)


def test_voltage_after_without_leakage_is_energy_balance() -> None:
    # ½ C v² grows by p·dt
    assert voltage_after(0.0, 56.25, 0.8e-3, 0.0, 0.0, 10e-3) == pytest.approx(3.0, rel=1e-15)
    assert voltage_after(3.0, 10.0, -1e-3, 0.0, 0.0, 10e-3) == pytest.approx(math.sqrt(9.0 - 2.0), rel=1e-15)


def test_voltage_after_settles_at_equilibrium_and_stops_at_zero() -> None:
    # after many time constants the voltage sits at the positive root of f: v² + v − 2 = 0 → 1 V
    p, i, g, c = 2e-6, 1e-6, 1e-6, 1e-3
    assert voltage_after(0.0, 1e6, p, i, g, c) == pytest.approx(1.0, rel=1e-9)
    assert voltage_after(0.5, 1e6, p, 0.0, 2e-6, c) == pytest.approx(1.0, rel=1e-12)  # RC: sqrt(p/g)
    # a constant drain empties the capacitor in finite time and leaves it at 0, not negative
    assert voltage_after(2.0, 1e4, -1e-3, 1e-6, 1e-6, 1e-3) == 0.0
    assert voltage_after(2.0, 1e4, -1e-3, 0.0, 0.0, 1e-3) == 0.0
    assert voltage_after(2.0, 0.0, -1e-3, 1e-6, 1e-6, 1e-3) == 2.0


def test_voltage_after_settles_at_equilibrium_from_above() -> None:
    # 5 V decaying for 1e9 s (~3e6 time constants) to the 1 V equilibrium of v² + v − 2 = 0
    assert voltage_after(5.0, 1e9, 2e-6, 1e-6, 1e-6, 1e-3) == pytest.approx(1.0, rel=1e-12)


def test_voltage_after_settles_at_equilibrium_from_below() -> None:
    # 0.1 V charging for 1e9 s to the equilibrium of v² + 2v − 1 = 0: √2 − 1
    assert voltage_after(0.1, 1e9, 1e-6, 2e-6, 1e-6, 1e-3) == pytest.approx(math.sqrt(2.0) - 1.0, rel=1e-12)


def test_time_to_within_rounding_of_equilibrium_does_not_raise() -> None:
    # one ulp below the equilibrium is the equilibrium to within rounding: a very long time, or never
    p, i, g, c = 1.1200911395398857e-06, 1.6193434141203448e-07, 4.0772347970328205e-08, 0.0002524207726387186
    v_eq = mp_equilibrium_v(p, i, g)
    v1 = math.nextafter(v_eq, 0.0)
    t = time_to(1.0857320002407904, v1, p, i, g, c)
    t_near = time_to(1.0857320002407904, v1 * (1 - 1e-9), p, i, g, c)
    assert math.isfinite(t_near) and t >= t_near
