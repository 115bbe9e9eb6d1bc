"""The ``trickle`` command: one verb per capability, each a thin shell over a library function.

    trickle simulate [--scenario FILE|NAME] [--out DIR] ...
    trickle bench NAME

Verbs import their tier lazily, so ``trickle --help`` stays fast and a device with
only the ``edge`` extra never imports the simulator or torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from trickle import __version__

# verb -> (module that defines add_arguments(parser) and run(args) -> int, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "simulate": ("simulator.cli", "simulate energy-harvesting sensor nodes (SimPy, exact event-driven)"),
    "train": ("models.cli", "train a model for intermittent power (NExUME) and write a checkpoint"),
    "export": ("export.cli", "export a checkpoint as a signed bundle (ONNX fp32/int8, ExecuTorch, TFLite; parity-checked)"),
    "flash": ("export.flash_cli", "build a bundle as Cortex-M4 firmware and run it (host or QEMU mps2-an386)"),
    "keygen": ("edge.keygen_cli", "make an Ed25519 key pair for signing bundles"),
    "edge": ("edge.cli", "run a bundle on this machine: trickle edge infer | trickle edge run (the device agent)"),
    "serve": ("server.cli", "serve the HTTP API and MQTT bridge (telemetry, results, bundles, OTA)"),
    "demo": ("trickle.demo", "the main job: train, sign a bundle, serve, a simulated fleet reports over MQTT"),
    "bench": ("bench.cli", "run a benchmark from bench/ and write bench/results/NAME.json"),
}


def _parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trickle",
        description="Deep learning on energy-harvesting, intermittently powered sensor nodes.",
    )
    parser.add_argument("--version", action="version", version=f"trickle {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    chosen = next((a for a in argv if a in VERBS), None)
    for verb, (module, help_text) in VERBS.items():
        if verb != chosen:
            sub.add_parser(verb, help=help_text)
            continue
        mod = importlib.import_module(module)
        p = sub.add_parser(verb, help=help_text, description=(mod.__doc__ or help_text).strip(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run, _user_errors=getattr(mod, "USER_ERRORS", ()))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser(argv).parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args._run
    try:
        return run(args)
    except args._user_errors as e:  # a bad input or config: one line, no traceback
        print(f"trickle {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"trickle {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
