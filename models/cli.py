"""Train a model: for intermittent power (nexume) or the target language model of speculative decoding (lm).

    trickle train nexume --dataset fsdd --epochs 30 --out runs/train/fsdd
    trickle train nexume --dataset digits --method qat8          # the fixed 8-bit QAT baseline
    trickle train nexume --dataset fsdd --set harvest_scenario=piezo_machine   # for the node it will run on
    trickle train nexume --dataset fsdd --nproc 2                 # data-parallel through torchrun (gloo)
    trickle train nexume --nproc 2 --nnodes 2 --node-rank 0 --rdzv-endpoint host0:29400   # on each node
    trickle train lm --size base --out runs/lm/base               # 80 min, plays from DATA/shakespeare/plays
    trickle train lm --size small --steps 2000 --out runs/lm/small --resume
    trickle train firmbound --dataset Coffee.npz --out runs/train/coffee-firmbound   # decide early, then:
    trickle export runs/train/coffee-firmbound/checkpoint.pt --out bundles/coffee-early

nexume writes OUT/checkpoint.pt (weights, architecture, config, labels, pre-processing) and
OUT/summary.json + OUT/summary.md: accuracy, MACs, weight bytes and energy on the chosen
MCU of every variant (bit-width x dropout level) on the test split.

firmbound writes OUT/checkpoint.pt (the estimator, the stopping rule, the class names; no code) and
OUT/summary.json + OUT/summary.md: accuracy, mean samples taken and earliness on the test split,
beside the accuracy after every sample. See models/firmbound/train.py.

lm writes a Llama (transformers' save_pretrained: config.json, model.safetensors, tokenizer.json)
that AutoModelForCausalLM/AutoTokenizer.from_pretrained(OUT) load, OUT/train.json (validation
loss on the four held-out plays, perplexity, an example generation) and OUT/checkpoint/ (every
few minutes; --resume continues from it). See models/lm/target.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from models.data.arguments import DESTS, add_user_data_arguments, user_data_fields

ALGORITHMS = ("nexume", "lm", "draft", "firmbound")
DATASETS = ("fsdd", "basic_motions", "digits")  # models.data.datasets.DATASETS (a test keeps them equal)
METHODS = ("nexume", "uniform", "qat8", "fp32")  # models.nexume.config.Method
LM_SIZES = ("tiny", "small", "base")  # models.lm.target.Size
DRAFT_KINDS = ("moa", "eagle", "independent")  # models.lm.draft.KINDS
ONLY = {"nexume": ("dataset", "method", "epochs", "threads", *DESTS, "model", "nproc", "nnodes", "node_rank",
                   "rdzv_endpoint"),
        "lm": ("size",),
        "draft": ("target", "kind"),
        "firmbound": ("estimator", "cost", "decision_points", "features", "energy_per_sample_j", "joules_per_loss")}
# nexume's options that firmbound takes too: the data set and how to read it, and (--estimator tandem) epochs and threads
FIRMBOUND_TAKES = ("dataset", "epochs", "threads", *DESTS)
FIRMBOUND_ESTIMATORS = ("rocket", "tandem")  # models.firmbound.FirmboundClassifier's estimator
SHARED = {"lm": ("corpus", "minutes", "steps", "resume"), "draft": ("corpus", "minutes", "steps", "resume")}  # lm and draft


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("algorithm", choices=ALGORITHMS,
                   help="nexume (a switchable CNN for intermittent power), lm (the target LM of speculative decoding) "
                        "or draft (a draft model for a trained target), firmbound (an early-decision rule for a "
                        "series classifier: stop sensing once the class is safe; it takes nexume's data options)")
    p.add_argument("--target", type=Path, metavar="DIR", help="draft only: the target LM folder (trickle train lm's --out)")
    p.add_argument("--kind", choices=DRAFT_KINDS,
                   help="draft only: moa (Mixture of Attentions, the default), eagle (EAGLE-style: one layer on the "
                        "target's last hidden state) or independent (a small Llama distilled from the target)")
    p.add_argument("--dataset", metavar="NAME|PATH",
                   help="nexume only: fsdd, basic_motions, digits (default), or your own data: a folder with one "
                        "sub-folder of WAV/FLAC files per label, a .csv/.parquet table of series, an .npz with X and y "
                        "(optionally X_test, y_test), or ucr:NAME (a UCR/UEA set sktime ships)")
    add_user_data_arguments(p, "nexume and firmbound")
    p.add_argument("--model", metavar="PKG.MODULE:FUNCTION",
                   help="nexume only: your network instead of the built-in CNN: a function of (input shape, number of "
                        "classes) returning a torch.nn.Module; its Conv1d/Conv2d/Linear layers become switchable-"
                        "precision ones (models.nexume.custom)")
    p.add_argument("--method", choices=METHODS,
                   help="nexume only: nexume (default; DynFit), uniform (energy-unaware ablation), qat8 (fixed 8-bit QAT) "
                        "or fp32")
    p.add_argument("--epochs", type=int, help="nexume only: passes over the training split (default 30)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="nexume: torch's threads (default: half this machine's cores, at most 4; 1 on 2 cores). More "
                        "threads than idle cores slows training many times over (30 epochs: 221 s with torch's default "
                        "on a busy 2-core machine, 17 s with one)")
    p.add_argument("--nproc", type=int, metavar="N",
                   help="nexume: train data-parallel in N processes (per node) through torchrun; the same seed "
                        "and batch give the same model as one process, within float rounding")
    p.add_argument("--nnodes", type=int, metavar="N", help="nexume with --nproc: nodes taking part (default 1)")
    p.add_argument("--node-rank", type=int, metavar="I", help="nexume with --nproc: this node's rank, 0..nnodes-1")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                   help="nexume with --nproc on several nodes: where torchrun's ranks meet (node 0's address)")
    p.add_argument("--corpus", type=Path, metavar="DIR",
                   help="lm and draft: folder of plain-text plays (*.txt; the last four by name are held out; "
                        "default DATA/shakespeare/plays)")
    p.add_argument("--size", choices=LM_SIZES,
                   help="lm only: tiny (~0.2 M parameters, tests), small (~3.7 M) or base (~12 M; the default)")
    p.add_argument("--minutes", type=float,
                   help="lm and draft: budget in minutes of training (lm: default 40 for base, 15 small, 1 tiny; "
                        "none with --steps)")
    p.add_argument("--steps", type=int, help="lm and draft: budget in optimizer steps (deterministic: same seed, same weights)")
    p.add_argument("--resume", action="store_true",
                   help="lm and draft: continue from OUT/checkpoint/ (same config; --minutes and --steps may change)")
    p.add_argument("--estimator", choices=FIRMBOUND_ESTIMATORS,
                   help="firmbound only: rocket (default: causal MiniRocket features and a logistic head at each "
                        "decision point; runs on Linux-class devices) or tandem (SPRT-TANDEM's frame network; its "
                        "bundle also carries the rule in integers for trickle flash)")
    p.add_argument("--cost", metavar="accurate|auto|C",
                   help="firmbound only: the sampling cost per sample, in units of the misclassification loss; "
                        "accurate (default: the earliest stop within 1 point of full-length accuracy on held-out "
                        "training posteriors), auto (the best harmonic mean of accuracy and 1 - earliness, sktime's "
                        "score: earlier, less accurate), or a number")
    p.add_argument("--decision-points", type=int, metavar="N",
                   help="firmbound, rocket: decision points spread over the series (default 64; at most its length)")
    p.add_argument("--features", type=int, metavar="N", help="firmbound, rocket: MiniRocket features (default 1000, at "
                                                             "least 84)")
    p.add_argument("--energy-per-sample-j", type=float, metavar="J",
                   help="firmbound: the cost from energy: joules one more sample costs (with --joules-per-loss)")
    p.add_argument("--joules-per-loss", type=float, metavar="J",
                   help="firmbound: what a wrong decision costs, in joules (with --energy-per-sample-j)")
    p.add_argument("--seed", type=int, help="seeds initialisation, batching and (nexume) the energy draws (default 0)")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="TOML file of TrainConfig fields (nexume, models/nexume/train.py) or LMConfig fields "
                        "(lm, models/lm/target.py)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="any TrainConfig (nexume) or LMConfig (lm) field, value in TOML syntax (repeatable), e.g. "
                        "--set d_max=0.4 --set harvest_scenario='\"indoor_office\"' or --set lr=2e-3")
    p.add_argument("--data", type=Path, help="shared data folder (default $TRICKLE_DATA, else shared/data beside the checkout)")
    p.add_argument("--out", type=Path,
                   help="output folder (default runs/train/<dataset>-<method> for nexume, runs/lm/<size> for lm)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def check_applies(args: argparse.Namespace) -> None:
    """An option of the other algorithm is a mistake, not something to ignore."""
    from edge.core.errors import ConfigError

    for algorithm, names in ONLY.items():
        given = [n for n in names if getattr(args, n) not in (None, False)
                 and not (args.algorithm == "firmbound" and n in FIRMBOUND_TAKES)]
        if algorithm != args.algorithm and given:
            who = "nexume and firmbound" if algorithm == "nexume" and given[0] in FIRMBOUND_TAKES else algorithm
            raise ConfigError(f"--{given[0]}", getattr(args, given[0]), f"applies to trickle train {who} only")
    shared = [n for n in SHARED["lm"] if getattr(args, n) not in (None, False)]
    if args.algorithm in ("nexume", "firmbound") and shared:
        raise ConfigError(f"--{shared[0]}", getattr(args, shared[0]), "applies to trickle train lm and draft only")


def config_from_args(args: argparse.Namespace) -> Any:
    from edge.core.config import load_config
    from models.nexume.config import TrainConfig  # no torch: a bad option or data set is one line, at once

    flags = {k: getattr(args, k) for k in ("dataset", "method", "epochs", "seed", "model")}
    flags.update(user_data_fields(args))
    return load_config(TrainConfig, args.config, args.set, flags, source="train config")


def run(args: argparse.Namespace) -> int:
    check_applies(args)
    return {"lm": run_lm, "draft": run_draft, "nexume": run_nexume, "firmbound": run_firmbound}[args.algorithm](args)


def run_draft(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from edge.core.errors import ConfigError
    from models.lm.draft import Kind, train_draft
    from models.lm.target import default_corpus

    if args.target is None:
        raise ConfigError("--target", None, "trickle train draft needs the target LM folder")
    if args.config is not None or args.set:
        raise ConfigError("--config/--set", args.config or args.set, "trickle train draft takes its options as flags")
    kind: Kind = args.kind or "moa"
    out = args.out or Path("runs") / "lm" / f"draft-{kind}"
    steps = args.steps or (1_000_000 if args.minutes else 1000)
    with tqdm(total=None if args.minutes else steps, unit="step", desc=f"draft {kind}", file=sys.stderr,
              disable=args.no_progress or None, leave=False) as bar:
        def progress(step: int, loss: float) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")

        summary = train_draft(args.target, kind, args.corpus or default_corpus(args.data), out, steps=steps,
                              minutes=args.minutes, seed=args.seed or 0, resume=args.resume, progress=progress)
    if args.json:
        print(json.dumps({**summary, "out": str(out)}))
        return 0
    print(f"trained a {kind} draft ({summary['trainable_parameters'] / 1e6:.2f} M trained parameters) for "
          f"{summary['steps']} steps in {summary['train_seconds']:.0f} s; validation loss {summary['val_loss']:.3f}")
    print(f"wrote {out} (draft.json)")
    return 0


def run_nexume(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from edge.core.errors import ConfigError
    from models.data.datasets import dataset_name

    cfg = config_from_args(args)
    if args.threads is not None and args.threads < 1:
        raise ConfigError("--threads", args.threads, "must be 1 or more")
    data = cfg.load_data(args.data)  # also before torchrun: a bad data set is one clear error here, not each rank's
    import torch  # only once the data are known good: a bad data set is one line in well under 2 s

    from models.nexume.checkpoint import save_checkpoint
    from models.nexume.train import train

    torch.set_num_threads(args.threads or default_threads())
    name = dataset_name(cfg.dataset)
    out = args.out or Path("runs") / "train" / f"{name}-{cfg.method}"
    if args.nproc is not None or args.nnodes is not None or args.rdzv_endpoint is not None:
        return run_torchrun(args, cfg, name, out)
    with tqdm(total=cfg.epochs, unit="epoch", desc=f"{cfg.method} on {name}", file=sys.stderr,
              disable=args.no_progress or None, leave=False) as bar:
        def progress(epoch: int, epochs: int, metrics: dict[str, float]) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc=f"{metrics['train_acc']:.3f}")

        result = train(cfg, data, progress)
    print(f"data: {data.name}, {len(data.y_train)} training and {len(data.y_test)} test examples of "
          f"{list(data.input_shape)}, classes {', '.join(data.labels[:8])}{' …' if len(data.labels) > 8 else ''}; "
          f"{data.preprocessing['description']}", file=sys.stderr)
    paths = save_checkpoint(result, data, out)
    return _report(args, f"{cfg.method} on {name}", result.train_time_s, result.variants, paths, {})


def default_threads() -> int:
    """Half the cores this process may use, at most 4: torch's default (every core) oversubscribes a machine
    that runs anything else, and these networks gain little from more than a few."""
    import os

    return max(1, min(4, len(os.sched_getaffinity(0)) // 2))


def run_torchrun(args: argparse.Namespace, cfg: Any, name: str, out: Path) -> int:
    from models.nexume.launch import launch

    nproc = args.nproc or 1
    print(f"training {cfg.method} in {nproc} process(es) per node through torchrun ...", file=sys.stderr)
    summary = launch(cfg.model_dump_json(), out, args.data, nproc, args.nnodes or 1, args.node_rank or 0,
                     args.rdzv_endpoint)
    if not summary:  # global rank 0 ran on another node
        print("done; the node that ran global rank 0 wrote the checkpoint")
        return 0
    paths = [out / f for f in ("checkpoint.pt", "summary.json", "summary.md")]
    return _report(args, f"{cfg.method} on {name} in {nproc} process(es)", float(summary["train_time_s"]),  # type: ignore[arg-type]
                   summary["variants"], paths, {"nproc": nproc})  # type: ignore[arg-type]


def _report(args: argparse.Namespace, what: str, seconds: float, variants: list[dict[str, float]], paths: list[Path],
            extra: dict[str, Any]) -> int:
    best = max(variants, key=lambda v: v["accuracy"])
    if args.json:
        print(json.dumps({"train_time_s": seconds, "best": best, "written": [str(p) for p in paths], **extra}))
        return 0
    print(f"trained {what} in {seconds:.1f} s; best variant {best['bits']}-bit drop {best['drop']}: "
          f"accuracy {best['accuracy']:.3f}")
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


def run_lm(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from edge.core.config import load_config
    from models.lm.target import LMConfig, default_corpus, train_lm

    flags = {k: getattr(args, k) for k in ("size", "minutes", "steps", "seed")}
    cfg = load_config(LMConfig, args.config, args.set, flags, source="lm config")
    out = args.out or Path("runs") / "lm" / cfg.size
    corpus = args.corpus or default_corpus(args.data)
    seconds = None if cfg.minutes is None else round(60 * cfg.minutes)  # a time budget: the bar counts its seconds
    with tqdm(total=seconds or cfg.steps, unit="s" if seconds else "step", desc=f"lm {cfg.size}", file=sys.stderr,
              disable=args.no_progress or None, leave=False) as bar:
        def progress(step: int, fraction: float, loss: float) -> None:
            bar.n = round(fraction * seconds) if seconds else step
            bar.set_postfix(step=step, loss=f"{loss:.3f}")

        summary = train_lm(cfg, corpus, out, resume=args.resume, progress=progress)
    if args.json:
        print(json.dumps({**summary, "out": str(out)}))
        return 0
    print(f"trained lm {cfg.size} ({summary['parameters'] / 1e6:.2f} M parameters) for {summary['steps']} steps "
          f"in {summary['train_time_s']:.0f} s; validation loss {summary['val_loss']:.3f} "
          f"(perplexity {summary['val_perplexity']:.1f}) on {', '.join(summary['held_out_plays'])}")
    print(f"example: {summary['example']['prompt'][-80:]!r} -> {summary['example']['greedy_continuation'][:160]!r}")
    print(f"wrote {out} (train.json, model.safetensors, tokenizer.json; checkpoint/)")
    return 0


def firmbound_params(args: argparse.Namespace) -> dict[str, Any]:
    """FirmboundClassifier's parameters from the flags, checked before any data is read or torch imported."""
    from edge.core.errors import ConfigError

    estimator = args.estimator or "rocket"
    params: dict[str, Any] = {"estimator": estimator, "random_state": args.seed or 0, "cost": _firmbound_cost(args)}
    energy = (args.energy_per_sample_j, args.joules_per_loss)
    if (energy[0] is None) != (energy[1] is None):
        flag = "--energy-per-sample-j" if energy[0] is not None else "--joules-per-loss"
        raise ConfigError(flag, energy[0] if energy[0] is not None else energy[1],
                          "needs --energy-per-sample-j and --joules-per-loss together")
    if energy[0] is not None:
        for flag, value in zip(("--energy-per-sample-j", "--joules-per-loss"), energy):
            if not 0 < value < float("inf"):
                raise ConfigError(flag, value, "must be a positive number of joules")
        if args.cost is not None:
            raise ConfigError("--cost", args.cost, "is derived from --energy-per-sample-j / --joules-per-loss; give one")
        params |= {"energy_per_sample_j": energy[0], "joules_per_loss": energy[1]}
    only = {"rocket": ("decision_points", "features"), "tandem": ("epochs",)}
    for kind, names in only.items():
        given = [n for n in names if getattr(args, n) is not None]
        if kind != estimator and given:
            raise ConfigError(f"--{given[0].replace('_', '-')}", getattr(args, given[0]),
                              f"applies to --estimator {kind} only")
    for flag, value, least in (("--decision-points", args.decision_points, 2), ("--features", args.features, 84),
                               ("--epochs", args.epochs, 1), ("--threads", args.threads, 1)):
        if value is not None and value < least:
            raise ConfigError(flag, value, f"must be {least} or more")
    if args.decision_points is not None:
        params["decision_points"] = args.decision_points
    if args.features is not None:
        params["n_features"] = args.features
    if args.epochs is not None:
        params["epochs"] = args.epochs
    return params


def _firmbound_cost(args: argparse.Namespace) -> float | str:
    from edge.core.errors import ConfigError

    if args.cost in (None, "accurate", "auto"):
        return str(args.cost or "accurate")
    try:
        cost = float(args.cost)
    except ValueError:
        raise ConfigError("--cost", args.cost, "must be accurate, auto or a positive number") from None
    if not 0 < cost < float("inf"):
        raise ConfigError("--cost", args.cost, "must be accurate, auto or a positive number")
    return cost


def user_data(args: argparse.Namespace) -> Any:
    """``models.data.userdata.UserData`` from the data flags given (its defaults for the others)."""
    import dataclasses

    from models.data.userdata import UserData

    flags = {**user_data_fields(args), "seed": args.seed}
    flags["ignore_columns"] = tuple(flags["ignore_columns"]) if flags["ignore_columns"] else None
    names = {f.name for f in dataclasses.fields(UserData)}
    return UserData(**{k: v for k, v in flags.items() if k in names and v not in (None, False)})


def run_firmbound(args: argparse.Namespace) -> int:
    """``trickle train firmbound``: models.firmbound.train.train_firmbound on the data set given."""
    from tqdm import tqdm

    from edge.core.errors import ConfigError
    from models.data.datasets import DATASETS, dataset_name, load
    from models.data.raw import raw_series
    from models.data.userdata import fingerprint

    if args.config is not None or args.set:
        raise ConfigError("--config/--set", args.config or args.set, "trickle train firmbound takes its options as flags")
    params = firmbound_params(args)
    spec = args.dataset or "basic_motions"
    if spec not in DATASETS and not spec.startswith("ucr:") and Path(spec).expanduser().exists():
        spec = str(Path(spec).expanduser().resolve())  # the checkpoint records where the data were
    data = load(spec, args.data, options=user_data(args))
    raw_series(data)  # a set FIRMBOUND cannot stream is one line here, before torch
    print(f"data: {data.name}, {len(data.y_train)} training and {len(data.y_test)} test examples of "
          f"{list(data.input_shape)}, classes {', '.join(data.labels[:8])}{' …' if len(data.labels) > 8 else ''}",
          file=sys.stderr)
    import torch  # only once the data are known good

    from models.firmbound.train import train_firmbound

    torch.set_num_threads(args.threads or default_threads())
    out = args.out or Path("runs") / "train" / f"{dataset_name(spec)}-firmbound"
    with tqdm(unit="step", desc="firmbound", file=sys.stderr, disable=args.no_progress or None, leave=False) as bar:
        now = {"stage": ""}

        def progress(stage: str, done: int, total: int) -> None:  # heads per decision point, costs, epochs
            if now["stage"] != stage or bar.total != total:
                now["stage"] = stage
                bar.reset(total=total)
                bar.set_description(f"firmbound: {stage}")
            bar.n = done
            bar.refresh()

        _, summary, paths = train_firmbound(data, params, out, progress, dataset=spec, dataset_sha256=fingerprint(spec))
    if args.json:
        print(json.dumps({**summary, "written": [str(p) for p in paths]}))
        return 0
    print(f"trained FIRMBOUND ({summary['estimator']}) on {summary['dataset']} in {summary['train_time_s']:.1f} s; "
          f"cost {summary['cost']:.4g} per sample ({summary['cost_choice']})")
    print(f"test split: accuracy {summary['accuracy']:.3f} after {summary['mean_samples']:.1f} of {summary['length']} "
          f"samples on average (earliness {summary['earliness']:.2f}, harmonic mean {summary['hm']:.3f}); after all "
          f"{summary['length']}: {summary['full_length_accuracy']:.3f}")
    print(f"wrote {', '.join(str(p) for p in paths)}; trickle export {paths[0]} --out BUNDLE makes its bundle")
    return 0
