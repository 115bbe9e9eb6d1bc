"""Fixed-step reference engine: the same node machine, integrated with forward Euler on u = v².

It validates the exact engine and is the baseline of the speed benchmark. The grid has a
fixed step; a step that would cross a scheduled event (a phase end, a harvest step, a
sensing event) is shortened to end on it, as fixed-step integrators with events do.
Voltage thresholds are detected at the end of a step, so crossings land up to one step late.
"""

from __future__ import annotations

import math

from simulator.node import END, HIBERNATE, OFF, RUN, SEQ, V_CUT, V_JIT, V_ON, Node, NodeEvent


def run_fixed_step(node: Node, step_s: float = 1e-3) -> None:
    """Advance ``node`` to its end time with steps of at most ``step_s``."""
    while True:
        t_sched, kind = node.scheduled()
        crossed = _integrate(node, t_sched, step_s)
        if crossed is not None:
            node.handle(crossed)
        elif kind == END:
            return
        else:
            node.t = t_sched
            node.handle(kind)


def _integrate(node: Node, t_end: float, dt: float) -> NodeEvent | None:
    """Euler steps at constant coefficients up to ``t_end``; stops early at a threshold crossing."""
    p_w, i_a, g_s, c_f = node.net_power_w(), node.i_a, node.g_s, node.c_f
    u_max = node.v_max * node.v_max
    mode = node.mode
    u_up = node.v_on**2 if mode in (OFF, HIBERNATE) else math.inf
    u_cut = node.v_cut**2 if mode != OFF else -math.inf
    jit = mode in (RUN, SEQ) and node.jit_armed and node.v > node.v_jit > node.v_cut
    u_down = node.v_jit**2 if jit else u_cut
    span = t_end - node.t
    n_full = max(int(span / dt), 0)
    last = span - n_full * dt  # the step that ends on the scheduled event
    u = node.v * node.v
    overflow_u = 0.0
    crossed: NodeEvent | None = None
    n = 0
    h = dt
    elapsed = 0.0
    while n <= n_full:
        if n == n_full:
            h = last
            if h <= 0.0:
                break
        elapsed += h
        k = 2.0 * h / c_f
        u += k * (p_w - i_a * math.sqrt(u if u > 0.0 else 0.0) - g_s * u) if i_a else k * (p_w - g_s * u)
        n += 1
        if u > u_max:
            overflow_u += u - u_max
            u = u_max
        if u >= u_up:
            crossed = V_ON
            break
        if u <= u_down:
            crossed = V_JIT if jit and u > u_cut else V_CUT
            break
    node.account(elapsed, math.sqrt(max(u, 0.0)), p_w, 0.5 * c_f * overflow_u)
    return crossed
