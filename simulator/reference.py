"""Fixed-step reference engine: the same node machine, integrated with forward Euler on u = v².

It validates the exact engine and is the baseline of the speed benchmark. Events take
effect at the first grid point at or after their time; a phase that ends between grid
points hands its overshoot to the next phase so task durations do not drift.
"""

from __future__ import annotations

import math

from simulator.node import _FINITE, Event, Mode, Node


def run_fixed_step(node: Node, step_s: float = 1e-3) -> None:
    """Advance ``node`` to its end time on a grid of ``step_s``."""
    while node.t < node.end_s * (1.0 - 1e-15):
        t_sched, kind = node.scheduled()
        n_max = max(1, math.ceil((t_sched - node.t) / step_s - 1e-9))
        crossed = _integrate(node, n_max, step_s)
        if crossed is not None:
            node.handle(crossed)
            continue
        overshoot_s = node.t - t_sched
        if kind == Event.END:
            return
        node.handle(kind)
        if kind == Event.PHASE and node.mode in _FINITE and overshoot_s > 0.0:
            node.remaining_s -= overshoot_s
            if node.mode == Mode.RUN:
                node.pos.elapsed_s += overshoot_s


def _integrate(node: Node, n_max: int, dt: float) -> Event | None:
    """Up to ``n_max`` Euler steps at constant coefficients; stops early at a threshold crossing."""
    p_w, i_a, g_s, c_f = node.net_power_w(), node.i_a, node.g_s, node.c_f
    k = 2.0 * dt / c_f
    u_max = node.v_max * node.v_max
    mode = node.mode
    u_up = node.v_on**2 if mode in (Mode.OFF, Mode.HIBERNATE) else math.inf
    u_cut = node.v_cut**2 if mode != Mode.OFF else -math.inf
    jit = mode == Mode.RUN and node.jit_armed and node.v > node.v_jit > node.v_cut
    u_down = max(u_cut, node.v_jit**2) if jit else u_cut
    u = node.v * node.v
    overflow_u = 0.0
    crossed: Event | None = None
    n = 0
    while n < n_max:
        u += k * (p_w - i_a * math.sqrt(u if u > 0.0 else 0.0) - g_s * u) if i_a else k * (p_w - g_s * u)
        n += 1
        if u > u_max:
            overflow_u += u - u_max
            u = u_max
        if u >= u_up:
            crossed = Event.V_ON
            break
        if u <= u_down:
            crossed = Event.V_JIT if jit and u > u_cut else Event.V_CUT
            break
    u = max(u, 0.0)
    node.account(n * dt, math.sqrt(u), p_w, 0.5 * c_f * overflow_u)
    return crossed
