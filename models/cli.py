"""Train a model for intermittent power.

    trickle train nexume --dataset fsdd --epochs 30 --out runs/train/fsdd
    trickle train nexume --dataset digits --method qat8          # the fixed 8-bit QAT baseline

Writes OUT/checkpoint.pt (weights, architecture, config, labels, pre-processing) and
OUT/summary.json + OUT/summary.md: accuracy, MACs, weight bytes and energy on the chosen
MCU of every variant (bit-width x dropout level) on the test split.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ALGORITHMS = ("nexume",)
DATASETS = ("fsdd", "basic_motions", "digits")  # models.datasets.DATASETS (a test keeps them equal)
METHODS = ("nexume", "uniform", "qat8", "fp32")  # models.nexume.Method


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("algorithm", choices=ALGORITHMS, help="training algorithm")
    p.add_argument("--dataset", choices=DATASETS, help="which task (default digits)")
    p.add_argument("--method", choices=METHODS,
                   help="nexume (default; DynFit), uniform (energy-unaware ablation), qat8 (fixed 8-bit QAT) or fp32")
    p.add_argument("--epochs", type=int, help="passes over the training split (default 30)")
    p.add_argument("--seed", type=int, help="seeds initialisation, batching and the energy draws (default 0)")
    p.add_argument("--config", type=Path, metavar="FILE", help="TOML file of TrainConfig fields (models/nexume.py)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="any TrainConfig field, value in TOML syntax (repeatable), e.g. --set d_max=0.4 "
                        "--set harvest_scenario='\"indoor_office\"'")
    p.add_argument("--data", type=Path, help="shared data folder (default $TRICKLE_DATA, else shared/data beside the checkout)")
    p.add_argument("--out", type=Path, help="output folder (default runs/train/<dataset>-<method>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def config_from_args(args: argparse.Namespace) -> Any:
    from edge.config import load_config
    from models.nexume import TrainConfig

    flags = {k: getattr(args, k) for k in ("dataset", "method", "epochs", "seed")}
    return load_config(TrainConfig, args.config, args.set, flags, source="train config")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from models.checkpoint import save_checkpoint
    from models.datasets import load
    from models.nexume import train

    cfg = config_from_args(args)
    data = load(cfg.dataset, args.data)
    out = args.out or Path("runs") / "train" / f"{cfg.dataset}-{cfg.method}"
    with tqdm(total=cfg.epochs, unit="epoch", desc=f"{cfg.method} on {cfg.dataset}", file=sys.stderr,
              disable=args.no_progress or None, leave=False) as bar:
        def progress(epoch: int, epochs: int, metrics: dict[str, float]) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc=f"{metrics['train_acc']:.3f}")

        result = train(cfg, data, progress)
    paths = save_checkpoint(result, data, out)
    best = max(result.variants, key=lambda v: v["accuracy"])
    if args.json:
        print(json.dumps({"train_time_s": result.train_time_s, "best": best, "written": [str(p) for p in paths]}))
        return 0
    print(f"trained {cfg.method} on {cfg.dataset} in {result.train_time_s:.1f} s; "
          f"best variant {best['bits']}-bit drop {best['drop']}: accuracy {best['accuracy']:.3f}")
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0
