"""Run a benchmark from bench/ and write bench/results/NAME.json.

Benchmarks print a table of measured figures and ratios against their goals; they are
never part of the test pass/fail. Available: simulator, nexume, export, firmware, link, speculative,
client-server, firmbound, distill, design.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys

BENCHMARKS = ("simulator", "nexume", "export", "firmware", "link", "speculative", "client-server", "firmbound", "distill",
              "design")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=BENCHMARKS, help="which benchmark")
    p.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run (results marked quick)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object (the table goes to stderr)")


def run(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"bench.{args.name.replace('-', '_')}")
    if not args.json:
        module.main(quick=args.quick)
        return 0
    with contextlib.redirect_stdout(sys.stderr):
        out = module.main(quick=args.quick)
    print(json.dumps(out, sort_keys=True, default=str))
    return 0
