"""Simulate energy-harvesting sensor nodes.

Runs the default scenario (a small fleet on outdoor solar from pvlib's TMY data,
MSP430FR5994 nodes running a small CNN with per-layer checkpoints and LoRa uplinks)
unless --scenario names a TOML file or one of the bundled scenarios. Writes
results.json, report.md and plots/*.png to --out.

examples:
  trickle simulate
  trickle simulate --scenario nrel_24h --nodes 50 --out runs/nrel
  trickle simulate --scenario my.toml --set storage.capacitance_f=0.047 --seed 3
  trickle simulate --list
  trickle simulate --bundle bundles/digits.tar --samples samples.npz     # the nodes run that model
  trickle simulate --bundle B --samples S --live http://127.0.0.1:8080 --admin-token-file runs/server/admin.token

--bundle makes the nodes' task a real bundle: its variants' layer costs from the manifest, and
their answers on --samples (an .npz with raw 'x' and labels 'y', as the edge agent reads) computed
by the edge runtime, so the report adds accuracy within deadline. --live then publishes every
node's results to a trickle server over MQTT, each node as its own device, with the simulated
timestamps (virtual time, sent as fast as the link takes them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge.core.errors import ConfigError, DataError, LinkError
from edge.core.files import DATA_ENV

if TYPE_CHECKING:
    from simulator.config import Scenario


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", metavar="FILE|NAME", help="TOML scenario file, or the name of a bundled one (see --list)")
    p.add_argument("--list", action="store_true", help="list the bundled scenarios and exit")
    p.add_argument("--out", metavar="DIR", type=Path, help="output folder (default: runs/<scenario name>)")
    p.add_argument("--seed", type=int, help="override run.seed")
    p.add_argument("--nodes", type=int, help="override nodes.count")
    p.add_argument("--duration-s", type=float, help="override run.duration_s (simulated seconds)")
    p.add_argument("--engine", choices=("exact", "fixed_step"), help="override run.engine")
    p.add_argument("--workers", type=int, help="override run.workers (processes; default all cores)")
    p.add_argument("--cluster", metavar="ray[:ADDRESS]",
                   help="run the shards as Ray tasks: 'ray' starts a local Ray (run.workers CPUs), 'ray:ADDRESS' joins "
                        "a cluster (e.g. ray:auto); same results as the local run (needs trickle[cluster])")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override any field, value in TOML syntax (repeatable), e.g. --set workload.policy='\"jit\"'")
    p.add_argument("--data", type=Path, help="shared data folder for the data files a scenario names "
                                             "(default $TRICKLE_DATA, else shared/data beside the checkout)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object instead of a table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--bundle", type=Path, help="run this bundle's model on the nodes (needs --samples)")
    p.add_argument("--samples", type=Path, help=".npz with raw test samples 'x' and labels 'y' for --bundle (for a "
                                                "bundle with an early-decision rule, 'x' holds whole series (n, "
                                                "channels, T): each task senses until the rule stops)")
    p.add_argument("--trust", type=Path, action="append", default=[], metavar="PUBKEY",
                   help="with --bundle: require a signature by this key")
    p.add_argument("--live", metavar="URL", help="publish the nodes' results to this trickle server (needs --bundle)")
    p.add_argument("--admin-token-file", type=Path, help="with --live: the server's admin token (registers the devices)")
    p.add_argument("--broker", help="with --live: MQTT broker URL (default: the one the server reports at /healthz)")


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    from edge.core.config import apply_sets
    from simulator.config import load_scenario, scenario_path

    overrides: dict[str, dict[str, Any]] = {}
    for key, value in (("seed", args.seed), ("duration_s", args.duration_s), ("engine", args.engine), ("workers", args.workers)):
        if value is not None:
            overrides.setdefault("run", {})[key] = value
    if args.nodes is not None:
        overrides.setdefault("nodes", {})["count"] = args.nodes
    apply_sets(overrides, args.set)
    path = scenario_path(args.scenario) if args.scenario else None
    return load_scenario(path, **overrides)


def run(args: argparse.Namespace) -> int:
    if args.list:
        from simulator.config import SCENARIO_DIR

        for path in sorted(SCENARIO_DIR.glob("*.toml")):
            first = next((ln[1:].strip() for ln in path.read_text().splitlines() if ln.startswith("#")), "")
            print(f"{path.stem:24s} {first}")
        return 0
    from simulator.fleet import simulate
    from simulator.report import write_outputs

    if args.data is not None:  # read by simulator.data in this process and in the workers
        os.environ[DATA_ENV] = str(args.data)
    scenario = scenario_from_args(args)
    if args.live and not (args.bundle and args.admin_token_file):
        raise ConfigError("--live", args.live, "needs --bundle, --samples and --admin-token-file")
    bundle, model = _bundle_model(args)
    out = args.out or Path("runs") / scenario.name
    started = time.perf_counter()
    with _progress(scenario, disable=args.no_progress) as bar:
        result = simulate(scenario, progress=bar.update, model=model, cluster=args.cluster)
    wall_s = time.perf_counter() - started
    paths = write_outputs(result, out, plots=not args.no_plots)
    report = None
    if args.live and bundle is not None:
        report = publish_live(result, bundle, args.live, args.admin_token_file, args.broker, out / "live",
                              disable_progress=args.no_progress)
    if args.json:
        live = None if report is None else {"messages": report.messages, "devices": report.devices, "seconds": report.seconds}
        print(json.dumps({"summary": result.summary, "wall_s": wall_s, "written": [str(p) for p in paths], "live": live},
                         default=float))
        return 0
    _print_summary(result.summary, wall_s)
    plots = [p for p in paths if p.suffix == ".png"]
    traces = [p for p in paths if p.parent.name == "traces"]
    print(f"wrote {', '.join(str(p) for p in paths[:3])}" + (f", {len(traces)} node traces" if traces else "")
          + (f" and {len(plots)} plots" if plots else ""))
    if report is not None:
        print(f"published {report.messages} messages of {report.devices} devices to {args.live} in {report.seconds:.1f} s "
              f"({report.messages_per_s:.0f} msg/s)")
    return 0


def _bundle_model(args: argparse.Namespace) -> tuple[Any, Any]:
    if args.bundle is None:
        if args.samples is not None:
            raise ConfigError("--samples", str(args.samples), "goes with --bundle")
        return None, None
    import numpy as np

    from edge.classify.runtime import Runtime
    from edge.contract.bundle import read_trusted
    from simulator.bundle_model import inference_model

    if args.samples is None or not args.samples.exists():
        raise ConfigError("--samples", str(args.samples), "an existing .npz with raw 'x' and labels 'y' is needed with --bundle")
    bundle = read_trusted(args.bundle, args.trust)
    try:
        with np.load(args.samples) as data:
            x_raw, y = data["x"], data["y"]
    except (OSError, ValueError, KeyError) as err:
        raise DataError(f"--samples {args.samples}: not an .npz with raw 'x' and labels 'y' ({err})") from None
    if bundle.manifest.early is not None:  # early classification: 'x' holds whole series (n, channels, T)
        from simulator.bundle_model import early_model

        return bundle, early_model(bundle, x_raw, y)
    runtime = Runtime(bundle)
    x = np.stack([runtime.preprocess(raw) for raw in x_raw])
    return bundle, inference_model(bundle, x, y)


def publish_live(result: Any, bundle: Any, server: str, token_file: Path, broker: str | None, state_dir: Path,
                 disable_progress: bool = False) -> Any:
    import httpx

    from simulator.live import progress_bars, publish

    try:
        broker = broker or httpx.get(server.rstrip("/") + "/healthz", timeout=10).json()["mqtt"]
        with progress_bars(disable=disable_progress or None) as progress:
            return publish(result, server, broker, token_file.read_text().strip(), result.scenario.name.replace("_", "-"),
                           bundle.manifest.labels, bundle.manifest.bundle_version, state_dir, progress=progress)
    except (httpx.HTTPError, OSError, KeyError, ValueError) as err:  # ValueError: /healthz did not answer JSON
        raise LinkError(f"--live {server}: publishing failed: {err}") from None


def _progress(scenario: Scenario, disable: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=scenario.nodes.count, unit="node", desc=f"simulating {scenario.name}",
                disable=disable or None, file=sys.stderr, leave=False)


def _print_summary(s: dict[str, Any], wall_s: float) -> None:
    from edge.core.tables import console_table

    node_s = s["nodes"] * s["duration_s"]
    rows = [
        ("nodes x simulated time", f"{s['nodes']} x {s['duration_s'] / 3600:.2f} h"),
        ("availability", f"{s['availability']:.3f}"),
        ("power failures", f"{s['power_cycles']}"),
        ("sensing events", f"{s['released']}"),
        ("results in time / late", f"{s['completed']} / {s['missed']}"),
        ("lost off / dropped / unfinished", f"{s['lost_off']} / {s['dropped']} / {s['unfinished']}"),
        ("packets delivered / collided", f"{s['packets_delivered']} / {s['packets_collided']}"),
        ("energy harvested / to load (J)", f"{s['harvested_j']:.4g} / {s['load_j']:.4g}"),
        ("wall time", f"{wall_s:.2f} s ({node_s / wall_s:.3g} node-s per s)"),
    ]
    if "accuracy_within_deadline" in s:
        rows.insert(5, ("accuracy within deadline", f"{s['accuracy_within_deadline']:.3f}"))
    print(console_table(rows))
