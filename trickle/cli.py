"""The ``trickle`` command: one verb per capability, each a thin shell over a library function.

    trickle simulate [--scenario FILE|NAME] [--out DIR] ...
    trickle bench NAME

Each verb lives in its tier's ``cli.py``: ``add_<verb>_arguments(parser)`` and ``run_<verb>(args)
-> int``, whose docstring is the verb's ``--help`` (a module with a single verb may call them
``add_arguments`` and ``run``, its docstring the help). Verbs import their tier
lazily, so ``trickle <verb> --help`` answers in well under a second and a device with only the
``edge`` extra never imports the simulator or torch.

Errors: whatever a user can cause is an ``edge.core.errors.TrickleError``, caught here once and
printed as one line (exit status 1); argparse's usage errors exit with 2; anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from collections.abc import Callable, Sequence

from edge.core.errors import TrickleError

# verb -> (tier module defining add_<verb>_arguments and run_<verb>, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "simulate": ("simulator.cli", "simulate energy-harvesting sensor nodes (SimPy, exact event-driven)"),
    "design": ("models.design.cli", "choose capacitor, thresholds and duty cycle by Bayesian optimisation over the simulator"),
    "train": ("models.cli", "train NExUME for intermittent power, or the server's language model (trickle train lm)"),
    "export": ("export.cli", "export a checkpoint as a signed bundle (ONNX fp32/int8, ExecuTorch, TFLite; parity-checked)"),
    "flash": ("export.cli", "build a bundle as Cortex-M4 firmware and run it (host or QEMU mps2-an386)"),
    "keygen": ("edge.cli", "make an Ed25519 key pair for signing bundles"),
    "edge": ("edge.cli", "run a bundle on this machine: trickle edge infer | trickle edge run (the device agent)"),
    "serve": ("server.cli", "serve the HTTP API and MQTT bridge (telemetry, results, bundles, OTA)"),
    "worker": ("server.cli", "run the server's queued jobs (distillation) in this process"),
    "demo": ("trickle.demo", "the main job: train, sign a bundle, serve, a simulated fleet reports over MQTT"),
    "bench": ("bench.cli", "run a benchmark from bench/ and write bench/results/NAME.json"),
}


class _Version(argparse.Action):
    """--version, with the version looked up only when asked (it costs ~0.1 s)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        import edge

        parser.exit(message=f"trickle {edge.__version__}\n")


def _parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trickle",
        description="Deep learning on energy-harvesting, intermittently powered sensor nodes.",
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    chosen = next((a for a in argv if a in VERBS), None)
    for verb, (module, help_text) in VERBS.items():
        if verb != chosen:
            sub.add_parser(verb, help=help_text)
            continue
        mod = importlib.import_module(module)
        run = getattr(mod, f"run_{verb}", None)
        add = getattr(mod, f"add_{verb}_arguments", None)
        doc = run.__doc__ if run is not None else mod.__doc__
        p = sub.add_parser(verb, help=help_text, description=inspect.cleandoc(doc or help_text),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        (add or mod.add_arguments)(p)
        p.set_defaults(_run=run or mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser(argv).parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args._run
    try:
        return run(args)
    except TrickleError as e:  # something the user can fix: one line, no traceback
        print(f"trickle {args.verb}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"trickle {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
