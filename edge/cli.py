"""Run a bundle on this machine: ``trickle edge infer`` (one-off inference) and ``trickle edge run``
(the device agent: infer on a sensor source, report to the server over MQTT, take OTA updates).

    trickle edge infer bundles/digits.tar sample.npy
    trickle edge infer bundles/fsdd.tar 7_jackson_12.wav --backend litert --trust keys/signing.pub
    trickle edge infer bundles/digits.tar x.npy --voltage 2.4 --capacitance 0.01 --v-cut 2.0

INPUT files hold one raw example each, as the sensor gives it (the manifest's ``raw`` shape):
.npy, .csv/.txt (numbers), or .wav for audio bundles; the bundle's pre-processing turns it into
the model's input. ``--features`` skips pre-processing (the input is already the model's input).
The variant is the most accurate one, ``--variant NAME``, or DynInfer's choice for the energy
that ``--voltage``/``--capacitance`` leave above ``--v-cut``. ``--backend executorch``
loads the export tier's backend (it needs torch; see edge/backends.py); the others run without.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from edge.backends import BACKENDS, BackendError
from edge.bundle import BundleError
from edge.errors import AgentError
from edge.preprocess import PreprocessError

USER_ERRORS = (BundleError, BackendError, PreprocessError, AgentError)

RUN_HELP = """Run the device agent: read SOURCE, infer with the bundle, publish results and telemetry.

    trickle edge run --bundle bundles/digits.tar --server http://127.0.0.1:8080 \\
        --broker mqtt://127.0.0.1:1883 --device-id node-1 --token-file node-1.token --source samples.npz

Every message is written to an on-disk queue (STATE/outbox.sqlite) before it is sent and
deleted when the broker acknowledges it, so a kill -9, a broker restart or a server restart
loses nothing; the server drops repeats by idempotency key. OTA bundles announced by the
server are verified (signature with --trust, hashes, newer version), switched to atomically,
self-tested on the first samples of the source, and rolled back if the self-test fails.
SOURCE: an .npz with 'x' (raw samples) and optionally 'y' (labels), or a folder of
.npy/.csv/.txt/.wav files."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    infer = sub.add_parser("infer", help="classify input files with a bundle", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    infer.add_argument("bundle", type=Path, help="bundle folder or .tar")
    infer.add_argument("inputs", type=Path, nargs="+", metavar="INPUT", help="raw example files (.npy, .csv, .txt, .wav)")
    infer.add_argument("--backend", choices=list(BACKENDS), default="onnxruntime", help="inference engine (default onnxruntime)")
    infer.add_argument("--variant", help="run this variant (see the manifest) instead of choosing one")
    infer.add_argument("--voltage", type=float, help="capacitor voltage now, V: DynInfer picks what it affords")
    infer.add_argument("--capacitance", type=float, default=0.01, help="storage capacitance, F (default 0.01)")
    infer.add_argument("--v-cut", type=float, default=2.0, help="voltage at which the MCU browns out, V (default 2.0)")
    infer.add_argument("--mcu", default="msp430fr5994", help="MCU profile whose energy costs DynInfer uses")
    infer.add_argument("--trust", type=Path, action="append", default=[], metavar="PUBKEY",
                       help="trusted public key file; with one, the bundle must be signed by a trusted key")
    infer.add_argument("--features", action="store_true", help="inputs are already pre-processed model inputs")
    infer.add_argument("--json", action="store_true", help="print one JSON object per input instead of a table")
    agent = sub.add_parser("run", help="the device agent: infer on a source, report over MQTT, take OTA",
                           description=RUN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    agent.add_argument("--device-id", required=True, help="this device's id, as registered on the server")
    agent.add_argument("--token-file", type=Path, required=True, help="file holding the device's token (from registration)")
    agent.add_argument("--fleet", default="default", help="the device's fleet (default 'default')")
    agent.add_argument("--server", required=True, help="server URL, http(s)://HOST:PORT (bundle downloads)")
    agent.add_argument("--broker", required=True, help="MQTT broker URL, mqtt://HOST:PORT")
    agent.add_argument("--bundle", type=Path, help="the bundle to start with (needed on first run)")
    agent.add_argument("--source", type=Path, help=".npz of raw samples ('x', optional 'y') or a folder of input files")
    agent.add_argument("--state", type=Path, help="state folder (default runs/edge/DEVICE)")
    agent.add_argument("--period-s", type=float, default=0.0, help="seconds between samples (default 0: as fast as possible)")
    agent.add_argument("--count", type=int, help="take only the first N samples")
    agent.add_argument("--trust", type=Path, action="append", default=[], metavar="PUBKEY",
                       help="trusted public key; with one, every bundle must be signed by a trusted key")
    agent.add_argument("--backend", choices=list(BACKENDS), default="onnxruntime", help="inference engine")
    agent.add_argument("--exit-when-done", action="store_true",
                       help="exit once the source is reported and acknowledged (default: keep serving OTA)")


def run(args: argparse.Namespace) -> int:
    return run_agent(args) if args.action == "run" else infer(args)


def run_agent(args: argparse.Namespace) -> int:
    import logging
    import signal

    from edge.agent import Agent, AgentConfig

    if not args.token_file.exists():
        raise BundleError(f"--token-file {args.token_file}: no such file")
    if args.period_s < 0 or (args.count is not None and args.count < 0):
        raise BundleError("--period-s and --count must be >= 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = AgentConfig(device=args.device_id, token=args.token_file.read_text().strip(), server=args.server,
                         broker=args.broker, state_dir=args.state or Path("runs/edge") / args.device_id, fleet=args.fleet,
                         bundle=args.bundle, source=args.source, period_s=args.period_s, count=args.count,
                         trusted_keys=args.trust, backend=args.backend, exit_when_done=args.exit_when_done)
    agent = Agent(config)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    print(f"{args.device_id}: running bundle v{agent.version}, reporting to {args.broker}", flush=True)
    produced = agent.run()
    print(f"{args.device_id}: {produced} results reported this run", flush=True)
    return 0


def infer(args: argparse.Namespace) -> int:
    from edge.bundle import load_public_key, read_bundle
    from edge.preprocess import read_input
    from edge.runtime import Runtime

    keys = [load_public_key(k) for k in args.trust]
    bundle = read_bundle(args.bundle, keys or None, require_signature=bool(keys))
    rt = Runtime(bundle, backend=args.backend)
    energy = {} if args.voltage is None else {"voltage_v": args.voltage, "capacitance_f": args.capacitance,
                                              "v_cut_v": args.v_cut, "mcu": args.mcu}
    variant = rt.variant(args.variant) if args.variant else rt.choose(**energy)
    labels = bundle.manifest["labels"]
    rt.load(variant)
    if not args.json:
        print(f"{bundle.manifest['model']} v{bundle.manifest['bundle_version']}, variant {variant['name']} "
              f"({rt.format_of(variant)} on {args.backend}), "
              f"{'signed by a trusted key' if bundle.signed_by else 'signature not checked'}")
    for path in args.inputs:
        raw = read_input(path, bundle.manifest["preprocessing"])
        x = raw if args.features else rt.preprocess(raw)
        start = time.perf_counter()
        logits = rt.infer_features(x, variant=variant["name"])[0]
        elapsed = time.perf_counter() - start
        p = np.exp(logits - logits.max())
        p /= p.sum()
        top = int(np.argmax(p))
        if args.json:
            print(json.dumps({"input": str(path), "label": labels[top], "probability": round(float(p[top]), 6),
                              "variant": variant["name"], "backend": args.backend, "latency_s": elapsed,
                              "logits": [float(v) for v in logits]}))
        else:
            print(f"  {path}: {labels[top]} (p={p[top]:.3f}, {elapsed * 1e3:.2f} ms)")
    return 0
