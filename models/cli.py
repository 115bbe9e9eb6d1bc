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

from models.datasets import DatasetError
from simulator.errors import SimulatorError

USER_ERRORS = (DatasetError, SimulatorError)
ALGORITHMS = ("nexume",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("algorithm", choices=ALGORITHMS, help="training algorithm")
    p.add_argument("--dataset", help="fsdd, basic_motions or digits (default digits)")
    p.add_argument("--method", help="nexume (default), uniform, qat8 or fp32")
    p.add_argument("--epochs", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="any TrainConfig field, e.g. --set d_max=0.4 --set harvest_scenario=indoor_office")
    p.add_argument("--data", type=Path, help="shared data folder (default $TRICKLE_DATA or ../shared/data)")
    p.add_argument("--out", type=Path, help="output folder (default runs/train/<dataset>-<method>)")
    p.add_argument("--no-progress", action="store_true")


def config_from_args(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from models.nexume import TrainConfig
    from simulator.config import one_line_error, parse_toml_value

    flags = ("dataset", "method", "epochs", "seed")
    values: dict[str, Any] = {k: getattr(args, k) for k in flags if getattr(args, k) is not None}
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SimulatorError(f"--set {item!r}: expected FIELD=VALUE")
        values[key.strip()] = parse_toml_value(raw)
    try:
        return TrainConfig.model_validate(values)
    except ValidationError as e:
        raise one_line_error(e, "train config") from None


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
    print(f"trained {cfg.method} on {cfg.dataset} in {result.train_time_s:.1f} s; "
          f"best variant {best['bits']}-bit drop {best['drop']}: accuracy {best['accuracy']:.3f}")
    print(json.dumps({"written": [str(p) for p in paths]}))
    return 0
