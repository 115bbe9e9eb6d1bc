"""Results on disk: JSON (byte-identical for the same seed), a Markdown report, and PNG plots.

Every file is written to a temporary name and renamed, so an interrupted run never
leaves a half-written result behind.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from edge.core.files import write_atomic
from edge.core.tables import markdown_table
from simulator.node import Mode, NodeEvent
from simulator.results import SimulationResult
from simulator.summary import PACKET_OUTCOMES, period_stats

SCHEMA_VERSION = 1


def result_dict(result: SimulationResult) -> dict[str, Any]:
    """The JSON document: scenario, fleet summary, one record per node. No wall-clock values."""
    res = result.resolution
    per_node_net = {k: dict(zip(res.node_id.tolist(), getattr(res, k).tolist())) for k in PACKET_OUTCOMES}
    nodes = []
    for r in result.nodes:
        on, off = r.periods()
        record: dict[str, Any] = {"node_id": r.node_id, "harvest_scale": r.harvest_scale,
                                  "distance_m": float(result.distances_m[r.node_id]), **asdict(r.stats),
                                  **period_stats(on, "on_period"), **period_stats(off, "off_period")}
        for k in PACKET_OUTCOMES:
            record[f"packets_{k}"] = per_node_net[k].get(r.node_id, 0)
        nodes.append(record)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "scenario": result.scenario.model_dump(mode="json"),
        # a current source's trace is its current (A); every other source's, its power at MPP (W)
        ("harvest_mean_current_a" if result.scenario.harvester.kind == "current" else "harvest_mean_power_w"):
            result.harvest.mean_power_w(),
        # what the nodes took in: below the MPP power when the cell is not held at its MPP (a direct coupling)
        "harvested_mean_power_w": harvested_mean_power_w(result),
        "summary": result.summary,
        "nodes": nodes,
    }
    return _finite(doc)


def harvested_mean_power_w(result: SimulationResult) -> float:
    """Mean power the transducers delivered to the nodes (harvested_j over nodes and time), per node."""
    s = result.summary
    return float(s["harvested_j"]) / (len(result.nodes) * result.scenario.run.duration_s)


def cycles_csv(result: SimulationResult) -> str:
    """One row per on-period of every node: when it booted and when power failed (empty when the
    run ended first): the power rail's edges, as a logic analyser records them."""
    rows = ["node_id,boot_s,power_failure_s,on_s"]
    for r in result.nodes:
        on = r.on_at_s if r.on_at_s is not None else np.zeros(0)
        off = r.off_at_s if r.off_at_s is not None else np.zeros(0)
        for k, boot in enumerate(on.tolist()):
            fail = off[k] if k < len(off) else None
            rows.append(f"{r.node_id},{boot!r},{'' if fail is None else repr(float(fail))},"
                        f"{'' if fail is None else repr(float(fail) - boot)}")
    return "\n".join(rows) + "\n"


def trace_csv(trace: dict[str, Any]) -> str:
    """A recorded node's event log: at every event, what happened, the voltage and the mode entered
    (which holds until the next row). Events: start, harvest (the source steps), phase (one ends),
    sense, v_on, v_cut (power failure), v_jit, v_max (clamp reached), v_seg (a region edge of the
    power path), mppt (the charger stops to sample V_oc, or resumes), v_bank (a bank capacitor
    connects or is isolated). ``phase``: the phase running after the row (empty when none);
    ``ended``: on a phase row, the phase that finished (a program phase's name, else its kind)."""
    rows = ["time_s,event,voltage_v,mode,phase,ended"]
    modes = {int(m): m.name.lower() for m in Mode}
    events = {-1: "start", **{int(e): e.name.lower() for e in NodeEvent}}
    for t, e, v, m, ph, end in zip(trace["time_s"], trace["event"], trace["voltage_v"], trace["mode"], trace["phase"],
                                   trace["ended"]):
        rows.append(f"{float(t)!r},{events[int(e)]},{float(v)!r},{modes[int(m)]},{ph},{end}")
    return "\n".join(rows) + "\n"


def _finite(x: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def to_json(result: SimulationResult) -> str:
    return json.dumps(result_dict(result), sort_keys=True, indent=1, allow_nan=False) + "\n"


def write_outputs(result: SimulationResult, out_dir: str | Path, plots: bool = True) -> list[Path]:
    """results.json, report.md, cycles.csv, traces/node-N.csv (the nodes ``nodes.record_traces``
    names) and (optionally) plots/*.png and report.html (interactive, self-contained) in
    ``out_dir``; returns the paths."""
    out = Path(out_dir)
    written = [out / "results.json", out / "report.md", out / "cycles.csv"]
    write_atomic(written[0], to_json(result))
    write_atomic(written[2], cycles_csv(result))
    for r in result.nodes:
        if r.trace is not None:
            written.append(write_atomic(out / "traces" / f"node-{r.node_id}.csv", trace_csv(r.trace)))
    images = write_plots(result, out / "plots") if plots else []
    write_atomic(written[1], markdown(result, [p.relative_to(out) for p in images]))
    if plots:
        images.append(write_html(result, out / "report.html"))
    return written + images


# ---- Markdown ------------------------------------------------------------------------

_SUMMARY_ROWS = (
    ("nodes", "nodes", "{:.0f}"),
    ("duration_s", "simulated time per node", "duration"),
    ("availability", "availability (on-time fraction)", "{:.3f}"),
    ("power_cycles", "power failures", "{:.0f}"),
    ("on_period_mean_s", "on-period, mean (s; boot to power failure)", "{:.4g}"),
    ("on_period_min_s", "on-period, min (s)", "{:.4g}"),
    ("on_period_max_s", "on-period, max (s)", "{:.4g}"),
    ("off_period_mean_s", "off-period, mean (s; power failure to boot)", "{:.4g}"),
    ("off_period_min_s", "off-period, min (s)", "{:.4g}"),
    ("off_period_max_s", "off-period, max (s)", "{:.4g}"),
    ("released", "sensing events", "{:.0f}"),
    ("completed", "results within deadline", "{:.0f}"),
    ("missed", "results after deadline", "{:.0f}"),
    ("lost_off", "events lost (node off)", "{:.0f}"),
    ("dropped", "events dropped (queue full)", "{:.0f}"),
    ("unfinished", "tasks unfinished at the end", "{:.0f}"),
    ("tasks_completed_ratio", "tasks completed within deadline / sensing events", "{:.3f}"),
    ("inferences_per_node_hour", "inferences per node-hour", "{:.2f}"),
    ("load_energy_per_result_j", "load energy per result (mJ)", "mJ"),
    ("lost_work_j", "energy of rolled-back work (J)", "{:.4g}"),
    ("mean_latency_s", "mean latency (s)", "{:.3f}"),
    ("packets_delivered", "packets delivered", "{:.0f}"),
    ("packets_delivered_in_time", "packets delivered in time", "{:.0f}"),
    ("packets_collided", "packets collided", "{:.0f}"),
    ("packets_below_sensitivity", "packets below sensitivity", "{:.0f}"),
    ("packets_delivered_ratio", "packets delivered / packets sent", "{:.3f}"),
)

_ENERGY_ROWS = ("harvested_j", "input_loss_j", "wasted_j", "leaked_j", "load_j", "output_loss_j", "stored_delta_j",
                "switching_loss_j")


def _power(w: float) -> str:
    return f"{w * 1e3:.4g} mW" if w >= 1e-3 else f"{w * 1e6:.4g} uW"


def _fmt(value: float | int | None, style: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if style == "h":
        return f"{value / 3600:.2f}"
    if style == "duration":  # in the unit a reader of this run's length wants
        scale, label = _time_unit(float(value))
        return f"{value / scale:.4g} {label.removeprefix('time (').rstrip(')')}"
    if style == "mJ":
        return f"{value * 1e3:.3f}"
    return style.format(value)


def markdown(result: SimulationResult, images: list[Path]) -> str:
    sc, s = result.scenario, result.summary
    th = sc.thresholds
    mean = result.harvest.mean_power_w()
    taken = harvested_mean_power_w(result)
    source = (f"mean {mean * 1e3:.3f} mA" if sc.harvester.kind == "current" else f"mean {mean * 1e3:.3f} mW at MPP")
    source += f"; the nodes harvested {_power(taken)} each on average"
    task = (f"program `{' → '.join(p.name for p in sc.workload.program)}`" if sc.workload.program
            else f"policy `{sc.workload.policy}`")
    completions = [(k.removeprefix("phase_").removesuffix("_completed"), s[k]) for k in s if k.startswith("phase_")]
    lines = [
        f"# Simulation: {sc.name}",
        "",
        f"Harvester `{sc.harvester.kind}` ({source} before per-node scaling) through `{sc.input.kind}`, "
        f"{sc.storage.capacitance_f * 1e3:g} mF switching the load on at {th.v_on:g} V and off at {th.v_cut:g} V "
        + (f"(plus the drop across its {sc.storage.esr_ohm:g} Ω ESR under the peak load) " if sc.storage.esr_ohm else "")
        + f"through `{sc.output.kind}`, MCU `{sc.workload.mcu}`, {task}, radio `{sc.network.radio}`, "
        f"seed {sc.run.seed}, engine `{sc.run.engine}`.",
        "",
        markdown_table(["quantity", "value"], [(label, _fmt(s.get(key), style)) for key, label, style in _SUMMARY_ROWS],
                       align="lr"),
        "", "## Phases completed (whole fleet)", "",
        markdown_table(["phase", "completed"], completions, align="lr") if completions else "(none)",
        "", "## Energy (J, whole fleet)", "",
        markdown_table(["term", "J"], [(k.removesuffix("_j").replace("_", " "), f"{s[k]:.6g}") for k in _ENERGY_ROWS],
                       align="lr"),
        "", "## Nodes", "",
    ]
    doc_nodes = {r.node_id: r for r in result.nodes[:20]}
    delivered = dict(zip(result.resolution.node_id.tolist(), result.resolution.delivered.tolist()))
    headers = ["node", "harvest scale", "on-time (h)", "power failures", "completed", "missed", "lost off", "delivered"]
    rows = [(i, f"{r.harvest_scale:.3f}", f"{r.stats.on_time_s / 3600:.2f}", r.stats.power_cycles, r.stats.completed,
             r.stats.missed, r.stats.lost_off, delivered.get(i, 0)) for i, r in doc_nodes.items()]
    lines.append(markdown_table(headers, rows, align="r" * len(headers)))
    if len(result.nodes) > 20:
        lines.append(f"\n({len(result.nodes) - 20} more nodes in results.json)")
    lines += [""] + [f"![{p.stem}]({p.as_posix()})" for p in images]
    return "\n".join(lines) + "\n"


# ---- plots ---------------------------------------------------------------------------

_MODE_COLORS = {Mode.OFF: "#dddddd", Mode.BOOT: "#f4a259", Mode.RESTORE: "#f4a259", Mode.RUN: "#2a9d8f",
                Mode.CHECKPOINT: "#e76f51", Mode.IDLE: "#8ecae6", Mode.HIBERNATE: "#6a4c93",
                Mode.SEQ: "#52b788"}


def write_plots(result: SimulationResult, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    paths = []
    traced = [r for r in result.nodes if r.trace is not None]
    if traced:
        paths.append(_save(_voltage_figure(result, traced), out_dir / "voltage.png"))
        paths.append(_save(_timeline_figure(result, traced), out_dir / "timeline.png"))
    paths.append(_save(_energy_figure(result), out_dir / "energy.png"))
    periods = [r.periods() for r in result.nodes]
    if any(len(on) or len(off) for on, off in periods):
        paths.append(_save(_cycles_figure(result, periods), out_dir / "cycles.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    write_atomic(path, buf.getvalue())
    return path


def _hours_axis(result: SimulationResult) -> tuple[float, str]:
    return _time_unit(result.scenario.run.duration_s)


ENVELOPE_BINS = 600  # the fleet panel's time bins
WINDOW_CYCLES = 12  # the node panel shows about this many charge/discharge cycles


def representative_window(result: SimulationResult, traced: list[Any]) -> tuple[Any, float, float]:
    """(node, start_s, end_s): the traced node with the median number of power failures, and a
    window in the middle of the run holding about ``WINDOW_CYCLES`` of its cycles (the whole run
    when it has fewer), so its sawtooth is drawn wide enough to read."""
    d = result.scenario.run.duration_s
    ranked = sorted(traced, key=lambda r: (r.stats.power_cycles, r.node_id))
    node = ranked[(len(ranked) - 1) // 2]
    cycles = node.stats.power_cycles
    width = d if cycles <= WINDOW_CYCLES else max(d * WINDOW_CYCLES / cycles, min(d, 1.0))
    start = max(0.0, d / 2 - width / 2)
    return node, start, min(d, start + width)


def voltage_envelope(result: SimulationResult, traced: list[Any], bins: int = ENVELOPE_BINS
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(bin edges, lowest, median, highest) storage voltage of the traced nodes per time bin: the
    lowest and highest any node reached in the bin (the voltage held from its last event counts)
    and the median over nodes of each node's mean event voltage in the bin."""
    d = result.scenario.run.duration_s
    edges = np.linspace(0.0, d, bins + 1)
    lo, hi, mean = (np.full((len(traced), bins), np.nan) for _ in range(3))
    for row, r in enumerate(traced):
        t, v = np.asarray(r.trace["time_s"], float), np.asarray(r.trace["voltage_v"], float)
        if not len(t):
            continue
        k = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
        held_at = np.searchsorted(t, edges[:-1], side="right") - 1  # the value each bin starts with
        held = np.where(held_at >= 0, v[np.maximum(held_at, 0)], np.nan)
        lo[row], hi[row] = held, held
        np.fmin.at(lo[row], k, v)
        np.fmax.at(hi[row], k, v)
        sums, counts = np.bincount(k, v, bins), np.bincount(k, None, bins)
        mean[row] = np.where(counts > 0, sums / np.maximum(counts, 1), held)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN: a bin before any node's first event
        return edges, np.nanmin(lo, axis=0), np.nanmedian(mean, axis=0), np.nanmax(hi, axis=0)


def _voltage_figure(result: SimulationResult, traced: list[Any]) -> Any:
    """Two panels: the fleet's envelope over the whole run, and a readable window of one
    representative node (the window is shaded in the fleet panel)."""
    import matplotlib.pyplot as plt

    st = result.scenario.storage
    scale, label = _hours_axis(result)
    fig, (fleet, one) = plt.subplots(2, 1, figsize=(10, 6.5), gridspec_kw={"height_ratios": [1, 1.2]})
    edges, lo, mid, hi = voltage_envelope(result, traced)
    centres = (edges[:-1] + edges[1:]) / 2 / scale
    fleet.fill_between(centres, lo, hi, step="mid", color="#9ecae1", lw=0, label="lowest to highest node")
    fleet.plot(centres, mid, lw=0.9, color="#08519c", label="median node (mean per bin)")
    node, a, b = representative_window(result, traced)
    fleet.axvspan(a / scale, b / scale, color="#f4a259", alpha=0.25, lw=0, label="window shown below")
    fleet.set(xlim=(0, result.scenario.run.duration_s / scale), xlabel=label, ylabel="voltage (V)",
              title=f"{result.scenario.name}: storage voltage of {len(traced)} traced nodes, whole run")
    fleet.legend(fontsize=7, loc="upper right")

    t, v = np.asarray(node.trace["time_s"], float), np.asarray(node.trace["voltage_v"], float)
    i0, i1 = max(int(np.searchsorted(t, a, side="right")) - 1, 0), int(np.searchsorted(t, b, side="right")) + 1
    w_scale, w_label = _time_unit(b - a)
    one.plot(t[i0:i1] / w_scale, v[i0:i1], lw=0.9, color="#2a9d8f", drawstyle="default")
    for level, name in ((st.v_on_v, "v_on"), (st.v_off_v, "v_off"), (st.v_max_v, "v_max")):
        one.axhline(level, ls="--", lw=0.6, color="grey")
        one.text(a / w_scale, level, f" {name}", va="bottom", fontsize=7, color="grey")
    one.set(xlim=(a / w_scale, b / w_scale), xlabel=w_label, ylabel="voltage (V)",
            title=f"node {node.node_id} (median power failures: {node.stats.power_cycles}; harvest x"
                  f"{node.harvest_scale:.2f}), {(b - a) / w_scale:.3g} {w_label.split('(')[1].rstrip(')')} "
                  "from the middle of the run, at events")
    fig.tight_layout()
    return fig


def _time_unit(span_s: float) -> tuple[float, str]:
    return (3600.0, "time (h)") if span_s >= 3 * 3600 else ((60.0, "time (min)") if span_s >= 180 else (1.0, "time (s)"))


def _timeline_figure(result: SimulationResult, traced: list[Any]) -> Any:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    scale, label = _hours_axis(result)
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.45 * len(traced)))
    end = result.scenario.run.duration_s
    for row, r in enumerate(traced):
        t = np.append(np.asarray(r.trace["time_s"]), end)
        modes = np.asarray(r.trace["mode"])
        for m, color in _MODE_COLORS.items():
            sel = modes == m
            spans = [(a / scale, (b - a) / scale) for a, b in zip(t[:-1][sel], t[1:][sel]) if b > a]
            if spans:
                ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=color)
    ax.set_yticks(range(len(traced)), [f"node {r.node_id}" for r in traced])
    ax.set(xlabel=label, xlim=(0, end / scale), ylim=(-0.6, len(traced) - 0.4))
    ax.set_title("mode over time", pad=22)
    ax.legend(handles=[Patch(color=c, label=m.name.lower()) for m, c in _MODE_COLORS.items()],
              fontsize=7, ncol=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def _energy_figure(result: SimulationResult) -> Any:
    """Fleet energy by destination on a log axis: the load is often a sliver of what is harvested."""
    import matplotlib.pyplot as plt

    s = result.summary
    terms = [("harvested", "harvested_j"), ("input converter loss", "input_loss_j"), ("wasted at clamp", "wasted_j"),
             ("leakage + quiescent", "leaked_j"), ("output converter loss", "output_loss_j"),
             ("delivered to load", "load_j"), ("lost to rolled-back work", "lost_work_j")]
    values = [max(float(s[key]), 1e-12) for _, key in terms]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    y = np.arange(len(terms))[::-1]
    ax.barh(y, values, color=["#264653", "#8d99ae", "#e76f51", "#f4a261", "#8d99ae", "#2a9d8f", "#e9c46a"])
    for yi, v in zip(y, values):
        share = v / values[0] * 100
        pct = f"{share:.0f}" if share >= 1 else f"{share:.2g}"
        ax.text(v, yi, f"  {v:.3g} J ({pct} %)", va="center", fontsize=8)
    ax.set_yticks(y, [name for name, _ in terms])
    ax.set_xscale("log")
    ax.set_xlim(min(values) / 2, values[0] * 50)
    ax.set(xlabel="energy, whole fleet (J, log scale)", title="where the harvested energy went")
    fig.tight_layout()
    return fig


def _cycles_figure(result: SimulationResult, periods: list[tuple[np.ndarray, np.ndarray]]) -> Any:
    """Histograms of every on-period and off-period, fleet-wide, on log-spaced bins: what a
    logic-analyser capture of the power rail is compared against."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, which, name, color in ((axes[0], 0, "on-periods (boot to power failure)", "#2a9d8f"),
                                   (axes[1], 1, "off-periods (power failure to boot)", "#8d99ae")):
        x = np.concatenate([p[which] for p in periods])
        x = x[x > 0]
        if len(x):
            lo, hi = float(x.min()), float(x.max())
            bins = np.geomspace(lo, hi * 1.0001, 30) if hi > lo * 1.01 else 10
            ax.hist(x, bins=bins, color=color)
            if hi > lo * 1.01:
                ax.set_xscale("log")
            ax.axvline(float(x.mean()), color="black", lw=0.8, ls="--")
            ax.set_title(f"{name}\n{len(x)} periods, mean {x.mean():.3g} s, min {lo:.3g} s, max {hi:.3g} s", fontsize=9)
        else:
            ax.set_title(f"{name}: none", fontsize=9)
        ax.set(xlabel="duration (s)", ylabel="count")
    fig.suptitle(f"{result.scenario.name}: power cycles", fontsize=10)
    fig.tight_layout()
    return fig


# ---- one self-contained HTML page with interactive plots (Plotly) -------------------------------

HTML_POINTS = 4000  # per traced node: the voltage trace is thinned to at most this many points


def write_html(result: SimulationResult, path: Path) -> Path:
    """``report.html``: the summary and interactive plots (zoom, hover, toggle nodes) in one file
    that needs nothing else (plotly.js inlined once). Plot ids are fixed, so the same result
    writes the same bytes."""
    import html

    import plotly.graph_objects as go
    import plotly.io as pio

    s = result.summary
    figures: list[tuple[str, Any]] = []
    traced = [r for r in result.nodes if r.trace is not None]
    scale, label = _hours_axis(result)
    if traced:
        fig = go.Figure()
        edges, lo, mid, hi = voltage_envelope(result, traced)
        centres = (edges[:-1] + edges[1:]) / 2 / scale
        fig.add_trace(go.Scatter(x=centres, y=lo, mode="lines", line={"width": 0, "shape": "hvh"}, showlegend=False,
                                 hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=centres, y=hi, mode="lines", fill="tonexty", line={"width": 0, "shape": "hvh"},
                                 fillcolor="rgba(158,202,225,0.6)", name="fleet: lowest to highest"))
        fig.add_trace(go.Scatter(x=centres, y=mid, mode="lines", line={"width": 1, "color": "#08519c"},
                                 name="fleet: median node"))
        node, a, b = representative_window(result, traced)
        for r in traced:  # the chosen node (nearly) whole, the others thinned and shown on a click
            assert r.trace is not None
            t, v = np.asarray(r.trace["time_s"]), np.asarray(r.trace["voltage_v"])
            step = max(1, len(t) // (HTML_POINTS * (25 if r is node else 1)))
            fig.add_trace(go.Scattergl(x=t[::step] / scale, y=v[::step], mode="lines", line={"width": 1},
                                       name=f"node {r.node_id}" + (" (median failures)" if r is node else ""),
                                       visible=True if r is node else "legendonly"))
        st = result.scenario.storage
        for value, name in ((st.v_on_v, "v_on"), (st.v_off_v, "v_off")):
            fig.add_hline(y=value, line_dash="dash", line_color="grey", annotation_text=name)
        fig.update_layout(title=f"storage voltage: the fleet's envelope, and node {node.node_id} (zoom out for the "
                                "whole run)", xaxis_title=label, yaxis_title="V",
                          xaxis_range=[a / scale, b / scale])
        figures.append(("voltage", fig))
    parts = {"harvested": s["harvested_j"], "to the load": s["load_j"], "wasted at the clamp": s["wasted_j"],
             "leaked": s["leaked_j"], "input converter": s["input_loss_j"], "output converter": s["output_loss_j"],
             "rolled-back work": s["lost_work_j"]}
    figures.append(("energy", go.Figure(go.Bar(x=list(parts), y=list(parts.values())))
                    .update_layout(title="energy, whole fleet", yaxis_title="J")))
    on, off = (np.concatenate([p[i] for p in (r.periods() for r in result.nodes)]) for i in (0, 1))
    if len(on) or len(off):
        fig = go.Figure()
        fig.add_trace(go.Histogram(x=on, name="on-periods (boot to failure)", opacity=0.7))
        fig.add_trace(go.Histogram(x=off, name="off-periods (failure to boot)", opacity=0.7))
        fig.update_layout(title="power cycles", xaxis_title="s", barmode="overlay")
        figures.append(("cycles", fig))
    variants = {k.removeprefix("variant_").removesuffix("_tasks"): v for k, v in s.items()
                if k.startswith("variant_") and k.endswith("_tasks")}
    if variants:
        figures.append(("variants", go.Figure(go.Bar(x=list(variants), y=list(variants.values())))
                        .update_layout(title="tasks per model variant (DynInfer's choices)", yaxis_title="tasks")))
    rows = "".join(f"<tr><th scope='row'>{html.escape(name)}</th><td>{html.escape(_fmt(s[key], fmt))}</td></tr>"
                   for key, name, fmt in _SUMMARY_ROWS if key in s)
    body = [f"<h1>{html.escape(result.scenario.name)}</h1>", f"<table>{rows}</table>"]
    for i, (name, fig) in enumerate(figures):
        fig.update_layout(template="plotly_white", height=420)
        body.append(pio.to_html(fig, full_html=False, include_plotlyjs=i == 0, div_id=f"plot-{name}",
                                config={"displaylogo": False}))
    page = ("<!doctype html><html lang='en'><head><meta charset='utf-8'><title>"
            f"{html.escape(result.scenario.name)}: trickle simulation</title><style>body{{font-family:system-ui,"
            "sans-serif;margin:1.5rem;color:#1b1f24}}table{{border-collapse:collapse}}th,td{{text-align:left;"
            "padding:.2rem .6rem;border-bottom:1px solid #ccd}}</style></head><body>" + "\n".join(body) + "</body></html>\n")
    return write_atomic(path, page)
