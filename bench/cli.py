"""Run a benchmark from bench/ and write bench/results/NAME.json.

Benchmarks print a table of measured figures and ratios against their goals; they are
never part of the test pass/fail. Available: simulator, nexume, export, firmware, link, speculative,
client-server, firmbound, distill, design, userdata.

    trickle bench nexume --dataset walks.csv --id-column walk --label-column activity [--out DIR]

runs the NExUME benchmark's protocol on your data (read as trickle train nexume reads it) and
writes DIR/nexume.json and DIR/nexume.md (default DIR: runs/bench/nexume-<data set>), never the
committed results.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from models.data.arguments import add_user_data_arguments, given, user_data_fields

BENCHMARKS = ("simulator", "nexume", "export", "firmware", "link", "speculative", "client-server", "firmbound", "distill",
              "design", "userdata")
ON_USER_DATA = ("nexume",)  # benchmarks whose main() takes the user's data set (data=)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=BENCHMARKS, help="which benchmark")
    p.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run (results marked quick)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object (the table goes to stderr)")
    p.add_argument("--part", action="append", metavar="PART",
                   help="firmware, firmbound, link and speculative: run just this part (firmware: trained, tflite, "
                        "mlperf or cmsis-nn; firmbound: synthetic, streams, defaults or nodes; link: mosquitto, embedded, "
                        "mixed, readload, upload, sessions, replicas or broker; speculative: the target, base or tiny; "
                        "repeatable) and keep the other parts' keys from the "
                        "committed results, each part marked with the commit it was measured at")
    p.add_argument("--dataset", metavar="PATH",
                   help="nexume only: run the benchmark's protocol on your data set instead of the built-in ones (a "
                        "folder of audio per label, a .csv/.parquet table, an .npz, or ucr:NAME; as trickle train "
                        "nexume --dataset reads it)")
    p.add_argument("--peer", metavar="cmsis-nn[=PATH]",
                   help="firmware only: measure the MLPerf Tiny models layer by layer beside Arm's CMSIS-NN, read from "
                        "PATH (default ../shared/peers/cmsis-nn, or $TRICKLE_PEERS/cmsis-nn); without --part, runs just "
                        "that part (cmsis-nn)")
    add_user_data_arguments(p, "with --dataset")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="with --dataset: the folder for nexume.json and nexume.md (default runs/bench/nexume-<data set>)")


def run(args: argparse.Namespace) -> int:
    from edge.core.errors import ConfigError

    if args.part and args.name not in ("firmware", "firmbound", "link", "speculative"):
        raise ConfigError("--part", ",".join(args.part), "splits the firmware, firmbound, link and speculative "
                          "benchmarks only")
    options: dict[str, Any] = user_data_options(args)  # read (and refused) before the benchmark imports torch
    if args.peer is not None:
        name, _, path = args.peer.partition("=")
        if args.name != "firmware" or name != "cmsis-nn":
            raise ConfigError("--peer", args.peer, "is cmsis-nn or cmsis-nn=PATH, for trickle bench firmware")
        options["peer"] = path or None
        from bench.cmsis_nn import peer_folder

        peer_folder(path or None)  # absent: one line, before anything runs
        if not args.part:
            options["parts"] = ("cmsis-nn",)
    module = importlib.import_module(f"bench.{args.name.replace('-', '_')}")
    if args.part:
        options["parts"] = tuple(args.part)
    if args.part and set(args.part) - set(module.PARTS):
        raise ConfigError("--part", ",".join(args.part), f"must be among {', '.join(module.PARTS)}")
    if not args.json:
        module.main(quick=args.quick, **options)
        return 0
    with contextlib.redirect_stdout(sys.stderr):
        out = module.main(quick=args.quick, **options)
    print(json.dumps(out, sort_keys=True, default=str))
    return 0


def user_data_options(args: argparse.Namespace) -> dict[str, Any]:
    """``data``, ``results_dir`` and ``docs_dir`` for a benchmark run on the user's data set (none
    without --dataset), the data read as ``trickle train nexume`` reads it."""
    from edge.core.config import load_config
    from edge.core.errors import ConfigError

    if args.dataset is None:
        extra = given(args) + (["--out"] if args.out is not None else [])
        if extra:
            raise ConfigError(extra[0], getattr(args, extra[0][2:].replace("-", "_")), "applies with --dataset only")
        return {}
    if args.name not in ON_USER_DATA:
        raise ConfigError("--dataset", args.dataset, f"applies to trickle bench {' or '.join(ON_USER_DATA)} only")
    from models.data.datasets import DATASETS, dataset_name
    from models.nexume.config import TrainConfig  # no torch: a bad data set is one line, at once

    if args.dataset in DATASETS:
        raise ConfigError("--dataset", args.dataset, "is a built-in data set, which trickle bench nexume runs "
                          "without --dataset; give a path to your data (or ucr:NAME)")
    cfg = load_config(TrainConfig, None, (), {"dataset": args.dataset, **user_data_fields(args)}, source="bench options")
    data = cfg.load_data()
    out = args.out or Path("runs") / "bench" / f"nexume-{dataset_name(cfg.dataset)}"
    return {"data": data, "results_dir": out, "docs_dir": out}
