"""The main job, end to end on this machine: train → sign a bundle → serve → a simulated fleet
runs the bundle and reports over MQTT → report.

    trickle demo [--out runs/demo] [--nodes 20] [--hours 24] [--epochs 15]

1. trains a small NExUME model on scikit-learn's digits (shipped with the package, so a fresh
   machine needs nothing else), or reuses OUT/model/checkpoint.pt;
2. exports it as a signed bundle (ONNX fp32 and int8) with a key made in OUT/keys;
3. starts the server (HTTP API, MQTT bridge, embedded broker) on free loopback ports, with
   OUT/server as its database, and uploads the bundle;
4. simulates a fleet of energy-harvesting nodes (the default solar scenario) whose task is the
   bundle's model — DynInfer picks the variant by the stored energy;
5. publishes every node's results to the server over MQTT, each node as its own device with
   its own store-and-forward link, in virtual time;
6. checks what the server stored against the simulation, prints the report and writes
   OUT/demo.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from edge.errors import ConfigError, LinkError
from edge.files import write_atomic
from edge.tables import markdown_table


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="output folder (default runs/demo)")
    p.add_argument("--nodes", type=int, default=20, help="simulated nodes (default 20)")
    p.add_argument("--hours", type=float, default=24.0, help="simulated hours (default 24)")
    p.add_argument("--epochs", type=int, default=15, help="training epochs when no checkpoint is reused (default 15)")
    p.add_argument("--retrain", action="store_true", help="train again even if OUT/model/checkpoint.pt exists")
    p.add_argument("--no-plots", action="store_true", help="skip the simulation's PNG plots")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object (progress goes to stderr)")


class _Steps:
    def __init__(self, to_stderr: bool = False) -> None:
        self.t0 = time.perf_counter()
        self.file = sys.stderr if to_stderr else sys.stdout

    def __call__(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.t0:6.1f} s] {text}", flush=True, file=self.file)


def _model(out: Path, epochs: int, retrain: bool, step: _Steps) -> Path:
    from models.checkpoint import save_checkpoint
    from models.datasets import load
    from models.nexume import TrainConfig, train

    ckpt = out / "model" / "checkpoint.pt"
    if ckpt.exists() and not retrain:
        step(f"reusing {ckpt} (--retrain to train again)")
        return ckpt
    step(f"training NExUME on digits for {epochs} epochs ...")
    data = load("digits")
    result = train(TrainConfig(dataset="digits", method="nexume", epochs=epochs, seed=0), data)
    save_checkpoint(result, data, ckpt.parent)
    return ckpt


def _bundle(out: Path, ckpt: Path, step: _Steps) -> tuple[Path, Path]:
    from edge.bundle import generate_keypair, read_bundle
    from export.bundle import export_bundle

    key, pub = out / "keys" / "signing.key", out / "keys" / "signing.pub"
    if not key.exists():
        generate_keypair(key, pub)
    target = out / "bundles" / "digits.tar"
    if target.exists() and target.stat().st_mtime >= ckpt.stat().st_mtime:
        step(f"reusing {target}")
    else:
        version = read_bundle(target).manifest.bundle_version + 1 if target.exists() else 1
        step(f"exporting a signed bundle v{version} (ONNX fp32 + int8, parity-checked) ...")
        export_bundle(ckpt, target, formats=("onnx", "onnx-int8"), key=key, as_tar=True, bundle_version=version)
    return target, pub


def run(args: argparse.Namespace) -> int:
    import httpx
    import numpy as np

    from edge.bundle import read_trusted
    from edge.runtime import Runtime
    from edge.vectors import npz_bytes
    from models.datasets import load
    from server.service import ServeConfig, Service, free_port
    from simulator.bundle_model import inference_model
    from simulator.config import load_scenario
    from simulator.fleet import simulate
    from simulator.live import publish
    from simulator.report import write_outputs

    if args.nodes < 1 or args.hours <= 0 or args.epochs < 1:
        raise ConfigError("--nodes/--hours/--epochs", (args.nodes, args.hours, args.epochs), "must be positive")
    out: Path = args.out
    step = _Steps(to_stderr=args.json)
    ckpt = _model(out, args.epochs, args.retrain, step)
    bundle_path, pub = _bundle(out, ckpt, step)
    bundle = read_trusted(bundle_path, [pub])
    data = load("digits")
    assert data.raw_test is not None
    samples = out / "samples.npz"
    write_atomic(samples, npz_bytes({"x": data.raw_test, "y": data.y_test}))

    config = ServeConfig(state_dir=out / "server", port=free_port(), mqtt_port=free_port(), trusted_keys=[pub])
    service = Service(config)
    logging_quiet()
    with service.background():
        step(f"server on {config.url}, embedded MQTT broker on {config.broker_url}")
        admin = {"Authorization": f"Bearer {service.admin_token}"}
        up = httpx.post(config.url + "/v1/bundles", content=bundle_path.read_bytes(), headers=admin, timeout=60)
        if up.status_code not in (201, 409):
            raise LinkError(f"the server refused the bundle: {up.status_code} {up.text[:200]}")
        step(f"bundle {bundle.manifest.model} v{bundle.manifest.bundle_version} uploaded and verified by the server")

        runtime = Runtime(bundle)
        x = np.stack([runtime.preprocess(raw) for raw in data.raw_test])
        model = inference_model(bundle, x, data.y_test)
        scenario = load_scenario(None, run={"duration_s": args.hours * 3600.0, "seed": 0},
                                 nodes={"count": args.nodes})
        step(f"simulating {args.nodes} nodes for {args.hours:g} h running the bundle ...")
        result = simulate(scenario, model=model)
        paths = write_outputs(result, out / "simulation", plots=not args.no_plots)
        s = result.summary
        step(f"simulated: {s['completed']} results in time of {s['released']} sensing events, "
             f"accuracy within deadline {s['accuracy_within_deadline']:.3f}")

        step("publishing every node's results over MQTT (store-and-forward, end-to-end acks) ...")
        report = publish(result, config.url, config.broker_url, service.admin_token, "demo", bundle.manifest.labels,
                         bundle.manifest.bundle_version, out / "live")
        stored = _stored(config.url, admin, [f"demo-n{r.node_id}" for r in result.nodes])
    expected = int(sum(len(r.task_log) for r in result.nodes if r.task_log is not None))
    summary = {
        "nodes": args.nodes, "hours": args.hours, "sensing_events": s["released"], "results_simulated": expected,
        "results_stored": stored["results"], "lost": expected - stored["results"],
        "accuracy_within_deadline": s["accuracy_within_deadline"], "stored_correct_fraction": stored["correct_fraction"],
        "messages_published": report.messages, "publish_seconds": report.seconds,
        "messages_per_second": report.messages_per_s, "bundle": str(bundle_path), "server_data": str(out / "server"),
        "simulation_files": [str(p) for p in paths],
    }
    _write_report(out, summary)
    step(f"server stored {stored['results']} of {expected} results ({report.messages_per_s:.0f} msg/s end to end); "
         f"correct {stored['correct_fraction']:.3f} of stored")
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(f"\nreport: {out / 'demo.md'}\nsimulation: {paths[0].parent} (report.md, results.json, plots/)\n"
              f"server database: {out / 'server' / 'trickle.sqlite'}")
    return 0 if summary["lost"] == 0 else 1


def logging_quiet() -> None:
    import logging

    for name in ("amqtt", "transitions", "trickle.server", "trickle.edge", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _stored(url: str, admin: dict[str, str], devices: list[str]) -> dict[str, Any]:
    import httpx

    results, correct = 0, 0
    for device in devices:
        rows = httpx.get(f"{url}/v1/devices/{device}/result", params={"limit": 100_000}, headers=admin, timeout=60).json()
        results += len(rows)
        correct += sum(1 for m in rows if m.get("correct"))
    return {"results": results, "correct_fraction": correct / results if results else 0.0}


def _write_report(out: Path, summary: dict[str, Any]) -> None:
    rows = [(k.replace("_", " "), f"{v:.4g}" if isinstance(v, float) else v) for k, v in summary.items()
            if k != "simulation_files"]
    write_atomic(out / "demo.md", "# trickle demo\n\n" + markdown_table(["quantity", "value"], rows, align="lr") + "\n")
    write_atomic(out / "demo.json", json.dumps(summary, indent=1, sort_keys=True) + "\n")
