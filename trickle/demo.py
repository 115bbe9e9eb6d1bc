"""The main job, end to end on this machine: train → sign a bundle → serve → a simulated fleet
runs the bundle and reports over MQTT → report.

    trickle demo [--out runs/demo] [--nodes 20] [--hours 8] [--epochs 15] [--keep-serving]

1. trains a small NExUME model on scikit-learn's digits (shipped with the package, so a fresh
   machine needs nothing else), or reuses OUT/model/checkpoint.pt;
2. exports it as a signed bundle (ONNX fp32 and int8) with a key made in OUT/keys;
3. simulates a fleet of energy-harvesting nodes on scarce energy (default rf_scarce: RF into
   220 uF, less energy than the full model needs) whose task is the bundle's model — DynInfer picks the variant
   by the stored energy, the policy's commits carry work across power failures — and the same
   fleet with a fixed 8-bit deployment for comparison;
4. starts the server (HTTP API and dashboard, MQTT bridge) on free loopback ports, with
   OUT/server as its database, uploads the bundle, and publishes every node's results and
   telemetry over MQTT, each node as its own device with its own store-and-forward link (a
   backlog batched), in virtual time — through Mosquitto with a password file and ACL from the
   registry when it is installed, else the embedded broker;
5. checks what the server stored against the simulation, prints the report and writes
   OUT/demo.md; with --keep-serving the server and its dashboard stay up.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from edge.core.errors import ConfigError, LinkError
from edge.core.files import write_atomic
from edge.core.tables import markdown_table


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="output folder (default runs/demo)")
    p.add_argument("--nodes", type=int, default=20, help="simulated nodes (default 20)")
    p.add_argument("--hours", type=float, default=8.0, help="simulated hours (default 8)")
    p.add_argument("--epochs", type=int, default=15, help="training epochs when no checkpoint is reused (default 15)")
    p.add_argument("--retrain", action="store_true", help="train again even if OUT/model/checkpoint.pt exists")
    p.add_argument("--no-plots", action="store_true", help="skip the simulation's PNG plots")
    p.add_argument("--scenario", default="rf_scarce",
                   help="the fleet's scenario (default rf_scarce: RF harvesting 4 m from the source into 220 uF, a "
                        "sample every 10 s: less energy than the full model needs; see trickle simulate --list)")
    p.add_argument("--broker", choices=("auto", "mosquitto", "embedded"), default="auto",
                   help="auto (default): Mosquitto when installed (password file and ACL from the registry), else the "
                        "embedded broker")
    p.add_argument("--keep-serving", action="store_true",
                   help="keep the server (and its dashboard) running after the report until Ctrl-C")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object (progress goes to stderr)")


class _Steps:
    def __init__(self, to_stderr: bool = False) -> None:
        self.t0 = time.perf_counter()
        self.file = sys.stderr if to_stderr else sys.stdout

    def __call__(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.t0:6.1f} s] {text}", flush=True, file=self.file)


def _model(out: Path, epochs: int, retrain: bool, step: _Steps) -> Path:
    from models.data.datasets import load
    from models.nexume.checkpoint import save_checkpoint
    from models.nexume.train import TrainConfig, train

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
    from edge.contract.bundle import generate_keypair, read_bundle
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
    import contextlib
    import shutil

    import httpx
    import numpy as np

    from edge.classify.runtime import Runtime
    from edge.contract.bundle import read_trusted
    from edge.contract.vectors import npz_bytes
    from models.data.datasets import load
    from server.mqtt.mosquitto import Mosquitto, write_mosquitto_config
    from server.ports import free_port
    from server.service import ServeConfig, Service, read_or_create_token
    from server.store.store import open_store
    from simulator.bundle_model import inference_model
    from simulator.config import load_scenario, scenario_path
    from simulator.fleet import simulate
    from simulator.live import deliver, device_name, node_messages, progress_bars, register
    from simulator.report import write_outputs
    from simulator.workload import InferenceModel

    if args.nodes < 1 or args.hours <= 0 or args.epochs < 1:
        raise ConfigError("--nodes/--hours/--epochs", (args.nodes, args.hours, args.epochs), "must be positive")
    if args.broker == "mosquitto" and shutil.which("mosquitto") is None:
        raise ConfigError("--broker", "mosquitto", "mosquitto is not installed (apt-get install mosquitto)")
    out: Path = args.out
    step = _Steps(to_stderr=args.json)
    ckpt = _model(out, args.epochs, args.retrain, step)
    bundle_path, pub = _bundle(out, ckpt, step)
    bundle = read_trusted(bundle_path, [pub])
    data = load("digits")
    assert data.raw_test is not None
    samples = out / "samples.npz"
    write_atomic(samples, npz_bytes({"x": data.raw_test, "y": data.y_test}))

    runtime = Runtime(bundle)
    x = np.stack([runtime.preprocess(raw) for raw in data.raw_test])
    model = inference_model(bundle, x, data.y_test)
    scenario = load_scenario(scenario_path(args.scenario), name=f"demo-{Path(args.scenario).stem}",
                             run={"duration_s": args.hours * 3600.0, "seed": 0},
                             nodes={"count": args.nodes, "record_traces": min(args.nodes, 100)})
    step(f"simulating {args.nodes} nodes of {args.scenario} for {args.hours:g} h running the bundle (DynInfer) ...")
    result = simulate(scenario, model=model)
    paths = write_outputs(result, out / "simulation", plots=not args.no_plots)
    s = result.summary
    fixed_variant = next((v for v in model.variants if v.bits == 8 and v.drop == 0.0), model.variants[0])
    fixed = simulate(scenario, model=InferenceModel((fixed_variant,), adaptive=False)).summary
    step(f"simulated: {s['power_cycles']} power failures, {s['completed']} results in time of {s['released']} sensing "
         f"events, accuracy within deadline {s['accuracy_within_deadline']:.3f} (fixed 8-bit: "
         f"{fixed['accuracy_within_deadline']:.3f})")

    state = out / "server"
    use_mosquitto = args.broker == "mosquitto" or (args.broker == "auto" and shutil.which("mosquitto") is not None)
    broker = None
    with contextlib.ExitStack() as stack:
        if use_mosquitto:  # hardened: a password file and an ACL from the registry (trickle serve --write-mosquitto-config)
            server_token = read_or_create_token(state / "server.token")
            write_mosquitto_config(open_store(state / "trickle.sqlite"), server_token, out / "mosquitto")
            broker = Mosquitto(out / "mosquitto").start()
            stack.callback(broker.stop)
        config = ServeConfig(state_dir=state, port=free_port(), mqtt_port=free_port(), trusted_keys=[pub],
                             broker=broker.url if broker else "embedded")
        service = Service(config)
        logging_quiet()
        stack.enter_context(service.background())
        step(f"server on {config.url}, MQTT {config.broker_url} ({'Mosquitto' if broker else 'embedded broker'}); "
             f"dashboard: {config.url}/ (admin token in {state / 'admin.token'})")
        admin = {"Authorization": f"Bearer {service.admin_token}"}
        up = httpx.post(config.url + "/v1/bundles", content=bundle_path.read_bytes(), headers=admin, timeout=60)
        if up.status_code not in (201, 409):
            raise LinkError(f"the server refused the bundle: {up.status_code} {up.text[:200]}")
        step(f"bundle {bundle.manifest.model} v{bundle.manifest.bundle_version} uploaded and verified by the server")

        step("publishing every node's results and telemetry over MQTT (store-and-forward, batched, end-to-end acks) ...")
        per_device = node_messages(result, "demo", bundle.manifest.labels, bundle.manifest.bundle_version)
        tokens = register(config.url, service.admin_token, "demo", [r.node_id for r in result.nodes], out / "live")
        if broker is not None:
            write_mosquitto_config(service.store, service.server_token, out / "mosquitto")
            broker.reload()
        with progress_bars() as progress:
            seconds = deliver(per_device, tokens, config.url, config.broker_url, "demo", out / "live", progress=progress)
        messages = sum(len(m) for m in per_device.values())
        keys = {m.key for msgs in per_device.values() for kind, m in msgs if kind == "result"}
        stored = _stored(config.url, admin, [device_name("demo", r.node_id) for r in result.nodes], keys)
        expected = int(sum(len(r.task_log) for r in result.nodes if r.task_log is not None))
        summary = {
            "scenario": args.scenario, "nodes": args.nodes, "hours": args.hours, "sensing_events": s["released"],
            "results_simulated": expected, "results_stored": stored["results"], "lost": expected - stored["results"],
            "accuracy_within_deadline": s["accuracy_within_deadline"],
            "fixed_8bit_accuracy_within_deadline": fixed["accuracy_within_deadline"],
            "stored_correct_fraction": stored["correct_fraction"], "broker": "mosquitto" if broker else "embedded",
            "messages_published": messages, "publish_seconds": seconds, "messages_per_second": messages / seconds,
            "bundle": str(bundle_path), "server_data": str(state), "simulation_files": [str(p) for p in paths],
            **_intermittency(result, fixed, args.nodes, args.hours),
        }
        _write_report(out, summary)
        step(f"server stored {stored['results']} of {expected} results ({summary['messages_per_second']:.0f} msg/s end "
             f"to end); correct {stored['correct_fraction']:.3f} of stored")
        if args.json:
            print(json.dumps(summary, sort_keys=True))
        else:
            print(f"\nreport: {out / 'demo.md'}\nsimulation: {paths[0].parent} (report.md, results.json, plots/)\n"
                  f"server database: {state / 'trickle.sqlite'}")
        if args.keep_serving:
            print(f"dashboard: {config.url}/  (sign in with the token in {state / 'admin.token'}); Ctrl-C stops the "
                  "server", flush=True)
            import signal
            import threading

            stop = threading.Event()  # Ctrl-C or SIGTERM: stop serving and shut down cleanly
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: stop.set())
            stop.wait()
    return 0 if summary["lost"] == 0 else 1


def _intermittency(result: Any, fixed: dict[str, Any], nodes: int, hours: float) -> dict[str, Any]:
    """What the fleet lived through: power failures, the variants DynInfer chose, work rolled back
    and results that a checkpoint carried across a power failure."""
    import numpy as np

    s = result.summary
    spanned = 0  # results whose sensing-to-result span held a power failure (waiting in the queue, or running)
    for r in result.nodes:
        if r.task_done_s is None or r.task_latency_s is None or r.off_at_s is None:
            continue
        failures = np.asarray(r.off_at_s)
        done = np.asarray(r.task_done_s)
        started = done - np.asarray(r.task_latency_s)
        spanned += int(np.sum(np.searchsorted(failures, done) > np.searchsorted(failures, started)))
    variants = {k.removeprefix("variant_").removesuffix("_tasks"): int(v) for k, v in s.items()
                if k.startswith("variant_") and k.endswith("_tasks") and v}
    return {"power_failures_per_node_hour": s["power_cycles"] / nodes / hours, "variant_tasks": variants,
            "task_energy_j": s["load_j"], "work_rolled_back_j": s["lost_work_j"],
            "work_rolled_back_fraction": s["lost_work_j"] / s["load_j"] if s["load_j"] else 0.0,
            "results_across_a_power_failure": spanned,
            "fixed_8bit_power_failures_per_node_hour": fixed["power_cycles"] / nodes / hours,
            "fixed_8bit_work_rolled_back_j": fixed["lost_work_j"],
            "fixed_8bit_results": fixed["completed"] + fixed["missed"]}


def logging_quiet() -> None:
    import logging

    for name in ("amqtt", "transitions", "trickle.server", "trickle.edge", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # amqtt writing to links that closed after their last ack: asyncio warns once per write
    logging.getLogger("asyncio").setLevel(logging.ERROR)


def _stored(url: str, admin: dict[str, str], devices: list[str], keys: set[str]) -> dict[str, Any]:
    """This run's results as the server holds them (``keys``: the results this run published; a
    folder reused with other settings may hold others)."""
    import httpx

    results, correct = 0, 0
    for device in devices:
        rows = httpx.get(f"{url}/v1/devices/{device}/result", params={"limit": 100_000}, headers=admin, timeout=60).json()
        mine = [m for m in rows if m.get("key") in keys]
        results += len(mine)
        correct += sum(1 for m in mine if m.get("correct"))
    return {"results": results, "correct_fraction": correct / results if results else 0.0}


def _write_report(out: Path, summary: dict[str, Any]) -> None:
    f = summary
    lines = ["# trickle demo", "",
             f"{f['nodes']} nodes of `{f['scenario']}` for {f['hours']:g} simulated hours, each running the signed "
             f"bundle `{Path(f['bundle']).name}`; every result and telemetry published to the server over MQTT "
             f"({f['broker']}). The server's dashboard shows them (`trickle demo --keep-serving`).", "",
             "## Living on scarce energy: DynInfer against a fixed 8-bit deployment", "",
             markdown_table(["", "DynInfer (the bundle's variants)", "fixed 8-bit, full width"], [
                 ("power failures per node-hour", f"{f['power_failures_per_node_hour']:.1f}",
                  f"{f['fixed_8bit_power_failures_per_node_hour']:.1f}"),
                 ("results", f["results_simulated"], f["fixed_8bit_results"]),
                 ("accuracy within deadline", f"{f['accuracy_within_deadline']:.3f}",
                  f"{f['fixed_8bit_accuracy_within_deadline']:.3f}"),
                 ("work rolled back by power failures (J)", f"{f['work_rolled_back_j']:.4g}",
                  f"{f['fixed_8bit_work_rolled_back_j']:.4g}"),
             ], align="lrr"), "",
             f"With DynInfer, {f['results_across_a_power_failure']} results came out with a power failure between their "
             f"sensing and their result (waiting in the queue or running: the sample and the loop's progress are in "
             f"non-volatile memory); {100 * f['work_rolled_back_fraction']:.2f} % of the "
             f"{f['task_energy_j']:.4g} J spent on tasks was rolled back.", "",
             "Variants DynInfer chose (tasks):", "",
             markdown_table(["variant", "tasks"], sorted(f["variant_tasks"].items()), align="lr"), "",
             "## The link", "",
             markdown_table(["quantity", "value"], [
                 ("messages published", f["messages_published"]), ("seconds", f"{f['publish_seconds']:.1f}"),
                 ("messages per second, end to end", f"{f['messages_per_second']:.0f}"),
                 ("results stored / simulated", f"{f['results_stored']} / {f['results_simulated']}"),
                 ("lost", f["lost"]), ("stored results correct", f"{f['stored_correct_fraction']:.3f}"),
             ], align="lr"), ""]
    write_atomic(out / "demo.md", "\n".join(lines))
    write_atomic(out / "demo.json", json.dumps(summary, indent=1, sort_keys=True) + "\n")
