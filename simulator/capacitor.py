"""The capacitor ODE in closed form: the exact engine's physics (compiled with mypyc when built).

Between two events every power and current is constant, so the capacitor obeys

    C · v · dv/dt = f(v) = p_w − i_a · v − g_s · v²                         (1)

with ``p_w`` the constant-power terms (η_in·P_harvest − P_load/η_out), ``i_a`` the
net constant current drawn (dielectric leakage, quiescent currents, loads behind an
LDO; a current source or a cell's photocurrent enters negative) and ``g_s`` the
conductances (1/R_leak; a cell wired to the capacitor adds the slope of its I–V
curve on the current segment). Separating variables gives the time to move
between two voltages in closed form,

    t(v0 → v1) = C · ∫_{v0}^{v1} v / f(v) dv,                                  (2)

which is what threshold crossings need. For ``i_a = 0``, u = v² obeys a linear ODE
and (2) inverts in closed form too; with ``i_a > 0`` the voltage after a given time
is found by safeguarded Newton iteration on (2) — the only root-finding here.

The voltage moves monotonically towards the nearest root of f in the direction of
motion (``target_v``): with i_a >= 0 or p_w > 0 that is the one positive root
(``equilibrium_v``); a current source under a constant-power load (i_a < 0, p_w < 0)
gives two, the lower one unstable. With p_w = 0 (current-only circuits) eq. (1) is
linear in v and ``voltage_after`` is closed form as well.
"""

from __future__ import annotations

import math


def rate(v: float, p_w: float, i_a: float, g_s: float) -> float:
    """f(v) of eq. (1): net power into the capacitor at voltage v."""
    return p_w - i_a * v - g_s * v * v


def equilibrium_v(p_w: float, i_a: float, g_s: float) -> float:
    """For p_w > 0 the voltage the capacitor tends to: the positive root of f (inf if none); 0 for
    p_w <= 0 (with i_a < 0 see ``target_v``)."""
    if p_w <= 0.0:
        return 0.0
    if g_s == 0.0:
        return math.inf if i_a <= 0.0 else p_w / i_a
    # positive root of g v² + i v − p = 0, in the form that avoids cancellation
    sq = math.sqrt(i_a * i_a + 4.0 * g_s * p_w)
    return 2.0 * p_w / (i_a + sq) if i_a >= 0.0 else (sq - i_a) / (2.0 * g_s)


def direction(v: float, p_w: float, i_a: float, g_s: float) -> int:
    """+1 if the voltage rises from v, -1 if it falls, 0 if it rests (at v = 0, the sign of
    dv/dt = f(v)/(C v) in the limit: a pure current source charges an empty capacitor)."""
    if v > 0.0:
        f = p_w - i_a * v - g_s * v * v
        return 1 if f > 0.0 else (-1 if f < 0.0 else 0)
    if p_w != 0.0:
        return 1 if p_w > 0.0 else 0
    return 1 if i_a < 0.0 else 0


def _positive_roots(p: float, i: float, g: float) -> tuple[float, ...]:
    """The roots of f = p − i v − g v² on v > 0, increasing."""
    if g == 0.0:
        return (p / i,) if i != 0.0 and p / i > 0.0 else ()
    disc = i * i + 4.0 * g * p
    if disc < 0.0:
        return ()
    q = -0.5 * (i + math.copysign(math.sqrt(disc), i))  # g v² + i v − p = 0 without cancellation
    roots = (q / g, -p / q) if q != 0.0 else (0.0,)
    return tuple(sorted(r for r in roots if r > 0.0))


def target_v(v0: float, p_w: float, i_a: float, g_s: float) -> float:
    """Where the voltage tends from v0: the nearest root of f in the direction of motion, else
    inf (rising) or 0 (falling); v0 itself when it rests."""
    d = direction(v0, p_w, i_a, g_s)
    if d == 0:
        return v0
    if i_a >= 0.0 or p_w > 0.0:  # at most one positive root: the common case, kept cheap
        v_eq = equilibrium_v(p_w, i_a, g_s)
        return v_eq if (v_eq > v0) == (d > 0) else (math.inf if d > 0 else 0.0)
    roots = _positive_roots(p_w, i_a, g_s)
    if d > 0:
        return next((r for r in roots if r > v0), math.inf)
    return next((r for r in reversed(roots) if r < v0), 0.0)


def time_to(v0: float, v1: float, p_w: float, i_a: float, g_s: float, c_f: float) -> float:
    """Time for the voltage to move from v0 to v1, eq. (2); inf if it never gets there."""
    if v1 == v0:
        return 0.0
    d = direction(v0, p_w, i_a, g_s)
    if d == 0 or (v1 > v0) != (d > 0):
        return math.inf
    v_eq = target_v(v0, p_w, i_a, g_s)
    if v1 > v0 and not v1 < v_eq:
        return math.inf
    if v1 < v0 and not (v1 > v_eq or (v1 == 0.0 and _reaches_zero(p_w, i_a, g_s))):
        return math.inf
    return max(c_f * _integral(v0, v1, p_w, i_a, g_s), 0.0)


def _reaches_zero(p_w: float, i_a: float, g_s: float) -> bool:
    # with p = 0 and only resistive leakage the decay is exponential and never ends
    return p_w < 0.0 or (p_w == 0.0 and i_a > 0.0)


def _integral(v0: float, v1: float, p: float, i: float, g: float) -> float:
    """∫_{v0}^{v1} v / (p − i v − g v²) dv, written in differenced, cancellation-free forms."""
    if g == 0.0 and i == 0.0:
        return (v1 - v0) * (v1 + v0) / (2.0 * p)
    if i == 0.0:
        # u = v²: ∫ du / (2(p − g u)) = ln((p − g u0)/(p − g u1)) / (2g)
        w1 = p - g * v1 * v1
        if w1 * (p - g * v0 * v0) <= 0.0:  # v1 at (or, by rounding, past) the equilibrium
            return math.inf
        return math.log1p(g * (v1 - v0) * (v1 + v0) / w1) / (2.0 * g)
    if p == 0.0:
        # f = −v (i + g v): the integrand is −1/(i + g v)
        dv = v1 - v0
        return -dv / i if g == 0.0 else -math.log1p(g * dv / (i + g * v0)) / g
    if g == 0.0:
        return _integral_linear(v0, v1, p, i)
    return _integral_quadratic(v0, v1, p, i, g)


def _integral_linear(v0: float, v1: float, p: float, i: float) -> float:
    # w = p − i v: ∫ v/w dv = Δv·v0/w0 − p (Δv/w0)² · (log1p(x) − x)/x², x = −i Δv / w0
    dv = v1 - v0
    w0 = p - i * v0
    x = -i * dv / w0
    if x <= -1.0:  # v1 at (or, by rounding, past) the equilibrium
        return math.inf
    return dv * v0 / w0 - p * (dv / w0) ** 2 * _log1p_remainder(x)


def _log1p_remainder(x: float) -> float:
    """(log1p(x) − x) / x², accurate near 0 where it tends to −1/2."""
    if abs(x) < 1e-4:
        return -0.5 + x / 3.0 - x * x / 4.0 + x**3 / 5.0
    return (math.log1p(x) - x) / (x * x)


def _integral_quadratic(v0: float, v1: float, p: float, i: float, g: float) -> float:
    disc = i * i + 4.0 * g * p
    if disc > 0.0:
        # f = −g (v − r1)(v − r2), partial fractions: v/f = −1/(g(r1−r2)) [r1/(v−r1) − r2/(v−r2)]
        sq = math.sqrt(disc)
        q = -0.5 * (i + math.copysign(sq, i))  # roots of g v² + i v − p = 0 without cancellation, any sign of i
        r1, r2 = q / g, -p / q
        if r1 > r2:
            r1, r2 = r2, r1
        dv = v1 - v0
        xa, xb = dv / (v0 - r1), dv / (v0 - r2)
        if xa <= -1.0 or xb <= -1.0:  # v1 at (or, by rounding, past) a root: never reached
            return math.inf
        return -(r1 * math.log1p(xa) - r2 * math.log1p(xb)) / (g * (r1 - r2))
    if disc == 0.0:
        r = -i / (2.0 * g)
        return -(math.log((v1 - r) / (v0 - r)) - r / (v1 - r) + r / (v0 - r)) / g
    # complex roots: f = −g ((v + h)² + k²); both terms below cancel to first order as g → 0,
    # so each is formed as a small difference directly (log1p, and atan a − atan b = atan((a−b)/(1+ab)))
    h = i / (2.0 * g)
    k = math.sqrt(-disc) / (2.0 * g)
    dv = v1 - v0
    log_term = 0.5 * math.log1p(dv * (v1 + v0 + 2.0 * h) / ((v0 + h) ** 2 + k * k))
    a, b = (v1 + h) / k, (v0 + h) / k
    atan_term = (h / k) * math.atan2(dv / k, 1.0 + a * b)
    return -(log_term - atan_term) / g


def voltage_after(v0: float, dt_s: float, p_w: float, i_a: float, g_s: float, c_f: float) -> float:
    """Voltage after ``dt_s`` from v0 under constant coefficients (the inverse of ``time_to``)."""
    if dt_s <= 0.0:
        return v0
    if i_a == 0.0:
        return math.sqrt(max(_u_after(v0 * v0, dt_s, p_w, g_s, c_f), 0.0))
    if p_w == 0.0:  # C dv/dt = −i − g v: linear in v
        if g_s == 0.0:
            return max(v0 - i_a * dt_s / c_f, 0.0)
        return max(v0 + (-i_a / g_s - v0) * -math.expm1(-g_s * dt_s / c_f), 0.0)
    v_eq = equilibrium_v(p_w, i_a, g_s) if i_a >= 0.0 else target_v(v0, p_w, i_a, g_s)
    if v0 == v_eq:
        return v0
    # emptying is possible only past a cheap lower bound on its time; check that first
    if v0 > v_eq == 0.0 and dt_s >= _empty_time_lower_bound(v0, p_w, i_a, g_s, c_f) and dt_s >= time_to(
        v0, 0.0, p_w, i_a, g_s, c_f
    ):
        return 0.0
    return _invert(v0, dt_s, p_w, i_a, g_s, c_f, v_eq)


def _empty_time_lower_bound(v0: float, p: float, i: float, g: float, c: float) -> float:
    """The stored energy over the largest drain on [0, v0]: the capacitor cannot empty sooner."""
    drain_w = max(-p, 0.0) + max(i, 0.0) * v0 + g * v0 * v0
    return 0.5 * c * v0 * v0 / drain_w if drain_w > 0.0 else math.inf


def _u_after(u0: float, dt_s: float, p: float, g: float, c: float) -> float:
    # linear ODE (c/2) du/dt = p − g u: u → p/g with time constant c/(2g)
    if g == 0.0:
        return u0 + 2.0 * p * dt_s / c
    return u0 + (p / g - u0) * -math.expm1(-2.0 * g * dt_s / c)


def _invert(v0: float, dt_s: float, p: float, i: float, g: float, c: float, v_eq: float) -> float:
    """Safeguarded Newton on h(v) = t(v0 → v) − dt, monotone between v0 and the equilibrium."""
    rising = v_eq > v0
    lo, hi = (v0, v_eq) if rising else (v_eq, v0)
    if math.isinf(hi):
        hi = _upper_bracket(v0, dt_s, p, i, g, c)
    # initial guess: the resistive-only closed form with the current draw frozen at the
    # midpoint of a first such estimate; its error is second order in the voltage change
    v = math.sqrt(max(_u_after(v0 * v0, dt_s, p - i * v0, g, c), 0.0))
    v = math.sqrt(max(_u_after(v0 * v0, dt_s, p - i * 0.5 * (v0 + v), g, c), 0.0))
    integral = _integral_quadratic if g > 0.0 and p != 0.0 else _integral
    for _ in range(60):
        if not lo < v < hi:
            v = 0.5 * (lo + hi)
        h = c * integral(v0, v, p, i, g) - dt_s
        if (h < 0.0) == rising:
            lo = v
        else:
            hi = v
        if math.isinf(h):  # v sits on the equilibrium within rounding: bisect
            if hi - lo <= 4e-16 * hi:
                return v
            v = 0.5 * (lo + hi)
            continue
        step = h * rate(v, p, i, g) / (c * v) if v > 0.0 else math.inf
        v_next = v - step
        # Newton converges quadratically: after a step this small the error is below rounding
        if abs(step) <= 1e-9 * v or hi - lo <= 4e-16 * hi:
            return v_next if lo <= v_next <= hi else v
        v = v_next
    return v


def _upper_bracket(v0: float, dt_s: float, p: float, i: float, g: float, c: float) -> float:
    hi = max(2.0 * v0, 1e-6)
    while c * _integral(v0, hi, p, i, g) < dt_s:
        hi *= 2.0
    return hi


# 8-point Gauss–Legendre nodes and weights on [0, 1]
_GL_X = tuple(0.5 + 0.5 * x for x in (-0.9602898564975363, -0.7966664774136267, -0.5255324099163290, -0.1834346424956498,
                                         0.1834346424956498, 0.5255324099163290, 0.7966664774136267, 0.9602898564975363))
_GL_W = tuple(0.5 * w for w in (0.1012285362903763, 0.2223810344533745, 0.3137066238177402, 0.3626837833783620,
                                  0.3626837833783620, 0.3137066238177402, 0.2223810344533745, 0.1012285362903763))


def voltage_moments(v0: float, v1: float, dt_s: float, p_w: float, i_a: float, g_s: float, c_f: float) -> tuple[float, float]:
    """(∫ v dt, ∫ v² dt) over a stretch from v0 to v1 under constant coefficients: what a current
    (I·∫v dt) or a conductance (G·∫v² dt) takes from the capacitor.

    Integrating by parts with the closed-form time t(v) of eq. (2),
    ∫ v dt = v1·dt − ∫_{v0}^{v1} t(v) dv, and t(v) is smooth and bounded on the stretch, so
    8-point Gauss–Legendre in v is accurate to ~1e-9 relative even close to an equilibrium.
    A stretch that empties the capacitor ends where v reaches 0."""
    if v1 == v0 or dt_s <= 0.0:
        return v0 * dt_s, v0 * v0 * dt_s
    dv = v1 - v0
    m1 = m2 = 0.0
    for x, w in zip(_GL_X, _GL_W):
        v = v0 + x * dv
        t = min(c_f * _integral(v0, v, p_w, i_a, g_s), dt_s)
        m1 += w * t
        m2 += w * t * v
    return v1 * dt_s - m1 * dv, v1 * v1 * dt_s - 2.0 * m2 * dv
