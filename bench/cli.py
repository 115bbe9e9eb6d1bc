"""Run a benchmark from bench/ and write bench/results/NAME.json.

Benchmarks print a table of measured figures and ratios against their goals; they are
never part of the test pass/fail. Available: simulator, nexume, export, firmware, link.
"""

from __future__ import annotations

import argparse
import importlib

from simulator.errors import SimulatorError

USER_ERRORS = (SimulatorError,)
BENCHMARKS = ("simulator", "nexume", "export", "firmware", "link")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=BENCHMARKS, help="which benchmark")
    p.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run (results marked quick)")


def run(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"bench.{args.name}")
    module.main(quick=args.quick)
    return 0
