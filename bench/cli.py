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
    p.add_argument("--part", action="append", metavar="PART",
                   help="firmware only: run just this part (trained, tflite or mlperf; repeatable) and keep the other "
                        "parts' keys from the committed results, each part marked with the commit it was measured at")


def run(args: argparse.Namespace) -> int:
    from edge.core.errors import ConfigError

    if args.part and args.name != "firmware":
        raise ConfigError("--part", ",".join(args.part), "splits the firmware benchmark only")
    module = importlib.import_module(f"bench.{args.name.replace('-', '_')}")
    options = {"parts": tuple(args.part)} if args.part else {}
    if args.part and set(args.part) - set(module.PARTS):
        raise ConfigError("--part", ",".join(args.part), f"must be among {', '.join(module.PARTS)}")
    if not args.json:
        module.main(quick=args.quick, **options)
        return 0
    with contextlib.redirect_stdout(sys.stderr):
        out = module.main(quick=args.quick, **options)
    print(json.dumps(out, sort_keys=True, default=str))
    return 0
