"""What a design study writes: ``design.json`` (every design), ``design.md`` and a self-contained
``design.html`` (the Pareto front against the capacitor, convergence against random search, the
best designs), the best designs as ready-to-run scenario files (``best/*.toml``) and the usual
simulation report of the chosen one (``chosen/``).
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

from edge.core.files import write_atomic
from edge.core.tables import markdown_table
from models.design.search import best_so_far, evaluated, feasible, pareto, useful
from models.design.spec import DESIGN_METRICS, DesignSpec, prepare, scenario_data

BEST = 5  # designs written as scenario files


def shown_params(spec: DesignSpec, params: dict[str, Any]) -> dict[str, Any]:
    """A design's parameters as a reader wants them: values, not list indices (a part: its name)."""
    out: dict[str, Any] = {}
    for p in spec.parameter:
        v = params[p.field]
        choices = p.choices
        if p.parts is not None and choices is not None:
            out[p.field] = choices[int(v)].name
        elif choices is not None:
            out[p.field] = choices[int(v)]
        else:
            out[p.field] = p.value(v)
    return out


def trial_rows(spec: DesignSpec, trials: list[Any]) -> list[dict[str, Any]]:
    """design.json's rows: every finished design (refused ones without values; ``trials`` holds no
    design an interrupt cut short: see ``finished``)."""
    rows = []
    for t in sorted(trials, key=lambda t: t.number):
        refused = "error" in t.user_attrs
        rows.append({"number": t.number, "state": "REFUSED" if refused else t.state.name,
                     "params": shown_params(spec, t.params), "values": None if refused else t.values,
                     "metrics": t.user_attrs.get("metrics", {}), "feasible": feasible(t),
                     "error": t.user_attrs.get("error"), "per_run": t.user_attrs.get("per_run", [])})
    return rows


def finished(study: Any | None) -> list[Any]:
    """The study's finished designs: trials an interrupt cut short (failed, perhaps with only some
    parameters chosen) are left out of every report."""
    return [t for t in study.get_trials(deepcopy=False) if evaluated(t)] if study is not None else []


def deciding_run(spec: DesignSpec, trial: Any) -> dict[str, Any]:
    """The run (case and seed) whose figure a design's first objective reports: under the worst
    statistic the worst run; under the mean (or for a design metric) the first."""
    runs = trial.user_attrs.get("per_run") or [{"case": _case_names(spec)[0], "seed": spec.seeds[0]}]
    first = spec.objective[0]
    if spec.statistic != "worst" or first.metric in DESIGN_METRICS:
        return dict(runs[0])
    pick = min if first.goal == "maximize" else max
    return dict(pick(runs, key=lambda run: run[first.metric]))  # the first such run on a tie


def _case_names(spec: DesignSpec) -> list[str]:
    return [c.name for c in spec.case] or ["base"]


def design_scenario(spec: DesignSpec, base_dir: Path, trial: Any, run: dict[str, Any]) -> dict[str, Any]:
    """A design as one scenario: the base, the spec's set, the design's fields, the run's case and seed."""
    case = next((c.set for c in spec.case if c.name == run["case"]), {})
    return scenario_data(spec, base_dir, {**spec.overrides(trial.params), **case, "run.seed": run["seed"]})


def write_best(spec: DesignSpec, base_dir: Path, best: list[Any], out_dir: Path) -> list[Path]:
    """Each best design as a full scenario TOML: the base with the spec's set, the design's fields
    and the case and seed of the run that decides its first objective, so that simulating the file
    gives the figure reported (under the mean of several runs: that run's figure, listed)."""
    import tomli_w

    paths = []
    for rank, t in enumerate(best[:BEST], 1):
        run = deciding_run(spec, t)
        data = design_scenario(spec, base_dir, t, run)
        data["name"] = f"{spec.name}-design-{rank}"
        runs = t.user_attrs.get("per_run") or []
        first = spec.objective[0].metric
        head = (f"# {spec.name}, design {rank} (trial {t.number}): "
                + ", ".join(f"{k} = {v}" for k, v in shown_params(spec, t.params).items())
                + f"\n# objectives ({spec.statistic} over cases {_case_names(spec)} x seeds {spec.seeds}): "
                + ", ".join(f"{o.metric} = {v:.6g}" for o, v in zip(spec.objective, t.values))
                + f"\n# this file: case {run['case']!r}, seed {run['seed']}"
                + (f" ({first} = {run[first]:.6g})" if first in run else "")
                + ("".join(f"\n#   case {r['case']!r}, seed {r['seed']}: {first} = {r[first]:.6g}" for r in runs
                           if first in r) if len(runs) > 1 else "")
                + "\n")
        path = out_dir / "best" / f"design-{rank}.toml"
        write_atomic(path, (head + tomli_w.dumps(_toml_safe(data))).encode())
        paths.append(path)
    return paths


def resimulate_best(spec: DesignSpec, doc: dict[str, Any], out_dir: Path) -> list[dict[str, Any]]:
    """Simulate each best design's file again: its metrics against those its run reported."""
    from simulator import load_scenario, simulate

    out = []
    for entry in doc["best"]:
        summary = simulate(load_scenario(out_dir / entry["scenario_file"])).summary
        again = {k: float(summary[k]) for k in entry["file_metrics"] if k in summary}
        out.append({"scenario_file": entry["scenario_file"], "reported": entry["file_metrics"], "resimulated": again,
                    "matches": again == entry["file_metrics"]})
    return out


def _toml_safe(value: Any) -> Any:
    """TOML has no null: a None leakage reads back as "none"."""
    if isinstance(value, dict):
        return {k: _toml_safe(v) for k, v in value.items() if v is not None or k == "leakage_r_ohm"}
    if isinstance(value, list):
        return [_toml_safe(v) for v in value]
    return "none" if value is None else value


def _figures(spec: DesignSpec, trials: list[Any], random_trials: list[Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    done = [t for t in trials if "error" not in t.user_attrs]  # built (a refused design has no figures)
    front = pareto(spec, trials)
    first = spec.objective[0]
    with_parts = any(p.parts is not None for p in spec.parameter)
    x_metric = "capacitor_volume_mm3" if with_parts else "capacitance_f"
    if len(spec.objective) > 1 and spec.objective[1].metric in ("capacitor_volume_mm3", "capacitor_cost_usd"):
        x_metric = spec.objective[1].metric
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    groups: list[tuple[list[Any], str, str, int, str]] = [
        (done, "0.7", "o", 14, "evaluated"),
        ([t for t in done if not feasible(t)], "tab:red", "x", 14, "violates a constraint"),
        (front, "tab:blue", "o", 30, "Pareto front" if len(spec.objective) > 1 else "best")]
    for group, colour, marker, size, label in groups:
        xs = [t.user_attrs["metrics"].get(x_metric, math.nan) for t in group]
        ax.scatter(xs, [t.values[0] for t in group], c=colour, marker=marker, s=size, label=label)
    ax.set_xscale("log")
    ax.set_xlabel(x_metric)
    ax.set_ylabel(f"{first.metric} ({spec.statistic}, {first.goal})")
    ax.legend(fontsize=8)
    ax.set_title(f"{spec.name}: designs")
    paths.append(_save(fig, out_dir / "pareto.png"))
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(range(1, len(trials) + 1), best_so_far(spec, trials), label=f"{spec.sampler} (Bayesian optimisation)"
            if spec.sampler == "gp" else spec.sampler)
    if random_trials:
        ax.plot(range(1, len(random_trials) + 1), best_so_far(spec, random_trials), label="random search", ls="--")
    ax.set_xlabel("designs evaluated")
    ax.set_ylabel(f"best {first.metric}")
    ax.legend(fontsize=8)
    ax.set_title("convergence")
    paths.append(_save(fig, out_dir / "convergence.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})  # no version stamp: same bytes each run
    plt.close(fig)
    write_atomic(path, buf.getvalue())
    return path


def _best_table(spec: DesignSpec, best: list[Any]) -> str:
    rows = []
    for rank, t in enumerate(best[:BEST], 1):
        shown = shown_params(spec, t.params)
        rows.append([rank, t.number, *[_fmt(shown[p.field]) for p in spec.parameter],
                     *[_fmt(v) for v in t.values]])
    headers = ["rank", "trial", *[p.field for p in spec.parameter], *[f"{o.metric} ({o.goal[:3]})" for o in spec.objective]]
    return markdown_table(headers, rows)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def summary(spec: DesignSpec, study: Any, random_study: Any | None) -> dict[str, Any]:
    """design.json (less the files written): ``spec`` as ``prepare`` returned it."""
    trials, random_trials = finished(study), finished(random_study)
    best = pareto(spec, trials)
    built = [t for t in trials if "error" not in t.user_attrs]
    out: dict[str, Any] = {
        "name": spec.name, "sampler": spec.sampler, "directions": spec.directions,
        "objectives": [o.metric for o in spec.objective], "statistic": spec.statistic,
        "cases": _case_names(spec), "seeds": spec.seeds,
        "evaluated": len(trials), "failed": len(trials) - len(built),
        "interrupted": len(study.get_trials(deepcopy=False)) - len(trials),
        "infeasible": sum(not feasible(t) for t in built),
        "complete_nothing": sum(feasible(t) and not useful(spec, t) for t in built),
        "parts_excluded": [e for p in spec.parameter for e in p.excluded],
        "best": [_best_entry(spec, t) for t in best[:BEST]],
        "best_so_far": best_so_far(spec, trials),
        "random_best_so_far": best_so_far(spec, random_trials) if random_trials else None,
        "trials": trial_rows(spec, trials),
    }
    return out


def _best_entry(spec: DesignSpec, t: Any) -> dict[str, Any]:
    run = deciding_run(spec, t)
    return {"number": t.number, "params": shown_params(spec, t.params), "values": t.values,
            "metrics": t.user_attrs.get("metrics", {}), "file_case": run["case"], "file_seed": run["seed"],
            "file_metrics": {k: v for k, v in run.items() if k not in ("case", "seed")}}


def write_report(spec: DesignSpec, base_dir: Path, study: Any, random_study: Any | None, out_dir: Path,
                 wall_s: float, chosen_report: bool = True) -> dict[str, Any]:
    """Write everything; returns the summary written to design.json."""
    spec = prepare(spec, base_dir)  # as run_study searched it (the parts rated for the clamp)
    trials, random_trials = finished(study), finished(random_study)
    doc = summary(spec, study, random_study)
    best = pareto(spec, trials)
    figures = _figures(spec, trials, random_trials, out_dir) if trials else []
    scenario_files = write_best(spec, base_dir, best, out_dir)
    doc["scenario_files"] = [str(p.relative_to(out_dir)) for p in scenario_files]
    for entry, path in zip(doc["best"], doc["scenario_files"]):
        entry["scenario_file"] = path
    if chosen_report and best:
        doc["chosen_report"] = str(_chosen(scenario_files[0], out_dir).relative_to(out_dir))
    write_atomic(out_dir / "design.json", (json.dumps(doc, indent=1, sort_keys=True, default=_json) + "\n").encode())
    # wall time is the machine's, not the study's: kept out of design.json (same spec, same bytes)
    evals = len(trials) + len(random_trials)
    doc["design_evals_per_second"] = evals / wall_s if wall_s > 0 else None
    md = _markdown(spec, doc, best)
    write_atomic(out_dir / "design.md", md.encode())
    write_atomic(out_dir / "design.html", _html(spec, doc, md, figures).encode())
    return doc


def _json(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else str(v)


def _chosen(scenario_file: Path, out_dir: Path) -> Path:
    """The chosen design's simulation report (its file: the run that decides its figure), as trickle
    simulate writes it."""
    from simulator import load_scenario, simulate
    from simulator.report import write_outputs

    write_outputs(simulate(load_scenario(scenario_file)), out_dir / "chosen")
    return out_dir / "chosen" / "report.md"


def _markdown(spec: DesignSpec, doc: dict[str, Any], best: list[Any]) -> str:
    lines = [f"# Design study: {spec.name}", "",
             f"Base scenario `{spec.scenario}`; {len(spec.parameter)} parameters; objectives "
             + ", ".join(f"{o.metric} ({o.goal})" for o in spec.objective)
             + f"; each design simulated in {len(doc['cases'])} case(s) x {len(spec.seeds)} seed(s), "
             f"reduced by the {spec.statistic}.", "",
             f"{doc['evaluated']} designs evaluated by {spec.sampler}"
             + (f" ({spec.startup_trials} random first)" if spec.sampler != "random" else "")
             + f", {doc['failed']} refused by the scenario, {doc['infeasible']} outside the constraints, "
             f"{doc['complete_nothing']} completing nothing (left out of the designs offered)"
             + (f"; {doc['interrupted']} cut short by an interrupt, left out" if doc.get("interrupted") else "")
             + ".", ""]
    if doc.get("parts_excluded"):
        lines += ["Parts left out: " + "; ".join(doc["parts_excluded"]) + ".", ""]
    if spec.constraint:
        lines += ["Constraints: " + ", ".join(
            f"{c.metric} {'>= ' + format(c.min, 'g') if c.min is not None else ''}"
            f"{' and ' if c.min is not None and c.max is not None else ''}"
            f"{'<= ' + format(c.max, 'g') if c.max is not None else ''}" for c in spec.constraint), ""]
    title = "Pareto front" if len(spec.objective) > 1 else "Best designs"
    lines += [f"## {title}", "", _best_table(spec, best) if best else "No design met the constraints and completed anything.", ""]
    if doc.get("random_best_so_far"):
        bo, rs = doc["best_so_far"][-1], doc["random_best_so_far"][-1]
        lines += ["## Against random search", "",
                  f"Best {spec.objective[0].metric} after {len(doc['best_so_far'])} designs: {_fmt(bo)} "
                  f"({spec.sampler}) vs {_fmt(rs)} (random search, same budget).", ""]
    lines += ["![designs](pareto.png)", "", "![convergence](convergence.png)", ""]
    if doc.get("scenario_files"):
        lines += ["Ready-to-run scenarios: " + ", ".join(f"`{p}`" for p in doc["scenario_files"])
                  + f" (`trickle simulate --scenario {doc['scenario_files'][0]}`); each in the case and seed that "
                  "decides its first objective: "
                  + "; ".join(f"{e['scenario_file']}: {e['file_case']}, seed {e['file_seed']}" for e in doc["best"])
                  + ".", ""]
    if doc.get("chosen_report"):
        lines += [f"The chosen design's simulation: [{doc['chosen_report']}]({doc['chosen_report']}).", ""]
    return "\n".join(lines)


def _html(spec: DesignSpec, doc: dict[str, Any], md: str, figures: list[Path]) -> str:
    """design.md as a page with its images inlined: one file to mail or open offline."""
    import html

    body = []
    images = {p.name: base64.b64encode(p.read_bytes()).decode() for p in figures}
    for line in md.splitlines():
        if line.startswith("!["):
            name = line[line.index("(") + 1 : -1]
            if name in images:
                body.append(f'<img alt="{html.escape(name)}" src="data:image/png;base64,{images[name]}">')
        elif line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= set("-: "):
                continue
            tag = "th" if not body or not body[-1].startswith("<tr") else "td"
            body.append("<tr>" + "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in cells) + "</tr>")
        elif line:
            body.append(f"<p>{html.escape(line)}</p>")
    out, in_table = [], False
    for part in body:
        if part.startswith("<tr") and not in_table:
            out.append("<table>")
            in_table = True
        elif not part.startswith("<tr") and in_table:
            out.append("</table>")
            in_table = False
        out.append(part)
    if in_table:
        out.append("</table>")
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 8px;font-size:90%}img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(spec.name)}</title>"
            f"<style>{style}</style></head><body>{''.join(out)}</body></html>\n")
