"""Choose a node's design by Bayesian optimisation over the simulator.

    trickle design examples/design/indoor_node.toml --out runs/design/indoor
    trickle design SPEC.toml --out DIR --resume          # continue an interrupted study
    trickle design SPEC.toml --trials 80 --workers 2 --cluster ray:auto

SPEC.toml names a base scenario, the fields to choose (a range, an ordered list of values, or
capacitor parts from a catalogue with their volume, cost and leakage), the cases each design must
serve (days of light, placements: overrides of the base), the seeds, objectives (maximise or
minimise a summary metric, reduced over cases and seeds by the mean or the worst; or a design
metric such as capacitor_volume_mm3) and constraints (min/max of a metric). See
models/design/spec.py for every field.

The search is Optuna's GP sampler (log expected improvement, or log expected hypervolume
improvement with several objectives; constraints respected), after random startup designs, with
--workers designs simulated at a time (or as Ray tasks with --cluster). OUT/study.log keeps the
study: --resume continues it (Ctrl-C stops a study cleanly; designs cut short are left out).
Written to OUT: design.json (every design), design.md and the
self-contained design.html (the Pareto front against the capacitor, convergence against random
search with the same budget), best/design-N.toml (ready for trickle simulate --scenario) and
chosen/ (the simulation report of the best design).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", type=Path, metavar="SPEC.toml", help="the design study (see above)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default runs/design/NAME)")
    p.add_argument("--trials", type=int, default=None, help="designs to evaluate (default: the spec's trials)")
    p.add_argument("--workers", type=int, default=None, help="designs simulated at a time (default: every core)")
    p.add_argument("--resume", action="store_true", help="continue the study kept in OUT/study.log")
    p.add_argument("--cluster", metavar="ray[:ADDRESS]", default=None,
                   help="simulate the designs as Ray tasks (a local Ray, or a cluster: ray:auto)")
    p.add_argument("--no-random-baseline", action="store_true", help="skip the random search of the same budget")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from edge.core.errors import ConfigError
    from models.design.report import write_report
    from models.design.search import run_study
    from models.design.spec import load_spec, prepare

    spec = load_spec(args.spec)
    updates: dict[str, object] = {}
    if args.trials is not None:
        if args.trials < 2:
            raise ConfigError("--trials", args.trials, "must be >= 2")
        updates["trials"] = args.trials
    if args.no_random_baseline:
        updates["random_baseline"] = False
    spec = spec.model_copy(update=updates)
    workers = args.workers or os.cpu_count() or 1
    if workers < 1:
        raise ConfigError("--workers", workers, "must be >= 1")
    out = args.out or Path("runs") / "design" / spec.name
    base_dir = args.spec.resolve().parent
    spec = prepare(spec, base_dir)  # every field and value checked against the scenario before a design runs
    total = spec.trials * (2 if spec.random_baseline else 1)
    started = time.perf_counter()
    try:
        with tqdm(total=total, desc="designs", unit="design", disable=args.no_progress) as bar:
            study = run_study(spec, base_dir, out, workers, args.resume, args.cluster, progress=bar.update)
            random_study = run_study(spec, base_dir, out, workers, args.resume, args.cluster, sampler_kind="random",
                                     progress=bar.update) if spec.random_baseline and spec.sampler != "random" else None
    except KeyboardInterrupt:
        again = f"trickle design {args.spec} --out {out} --resume" + (f" --trials {args.trials}" if args.trials else "")
        print(f"trickle design: interrupted; resume with: {again}", file=sys.stderr)
        return 130
    doc = write_report(spec, base_dir, study, random_study, out, time.perf_counter() - started)
    if args.json:
        print(json.dumps({k: v for k, v in doc.items() if k != "trials"}, default=str))
        return 0
    print((out / "design.md").read_text().split("\n## ")[1].split("\n", 1)[1].strip().split("\n\n")[0])
    print(f"{doc['evaluated']} designs (and {doc['evaluated'] if random_study is not None else 0} of random search) "
          f"at {doc['design_evals_per_second']:.2f} designs/s")
    print(f"wrote {out / 'design.md'}, {out / 'design.html'}, {len(doc['scenario_files'])} scenario files in "
          f"{out / 'best'}" + (f" and the chosen design's report in {out / 'chosen'}" if doc.get("chosen_report") else ""))
    return 0
