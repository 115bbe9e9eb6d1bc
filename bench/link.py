"""Link benchmark: N devices × M messages through a broker into the server's store.

    trickle bench link [--quick]
    python -c "from bench import link; link.main(parts=('embedded',))"   # one part; the others' keys kept

The server runs as its own process (`trickle serve`; it and the publishers share the two
cores). Through Mosquitto, each of N devices publishes M signed telemetry messages (encoded
beforehand) at QoS 1 from its own ``mosquitto_pub -l``; a message's publish time is
interpolated over its publisher's run, and publish-to-stored latency is the store's
``stored_s`` minus it. Through the embedded broker the same publishers (one message per publish)
time each message as they put it on the wire (``mosquitto_pub -d`` logs every PUBLISH with its
message id), and stay connected until everything is stored (amqtt acknowledges a message before
it is safely queued and drops it if the publisher leaves at once). Configurations: Mosquitto (Debian's, started here) with
SQLite, the same at half the measured rate (publishers paced, each message timed as it is
handed over), Mosquitto with a throwaway PostgreSQL (fsync on; skipped without the
postgresql package), and the server's embedded amqtt broker. The raw Mosquitto rate — the
same publishers, one plain QoS-1 subscriber, no server — is the ratio's baseline. Keys of
bench/results/link.json (goals in GOALS):

- messages_per_second_stored (Mosquitto, SQLite): messages / (last stored - first published);
  embedded_messages_per_second_stored, postgres_messages_per_second_stored: the same for those
  (embedded: one message per publish like the Mosquitto rows; before issue 48 the agent's link
  batched a backlog, many messages per publish, and its latencies were spread over the delivery).
- p50_latency_s, p99_latency_s: publish to committed, at full speed (a backlog);
  p99_latency_s_at_half_load: the same with publishers at half the measured capacity.
- lost: published - distinct keys stored; duplicated: keys stored more than once (every run; both must be 0).
- ratio_vs_raw_mosquitto: messages_per_second_stored / the raw Mosquitto rate.
- device_route_p99_s_under_dashboard_load: a mixed load on one server (embedded broker, SQLite
  holding 100 devices' 60,000 messages): 100 device clients call their own routes (their results,
  the bundle list) while 10 dashboard viewers poll the fleet snapshot, for 30 s; the p99 of the
  device calls (device_route_p50_s_under_dashboard_load beside it; dashboard_snapshots_served).
- unauthenticated_300mb_rss_growth_mb: the server's peak RSS growth (psutil, sampled every 10 ms)
  while a client without a token sends a 300 MB body to the bundle upload route.
- measured: the commit each part (PARTS) was last measured at.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from tenacity import retry, retry_if_result, stop_after_delay, wait_fixed

from bench.measured import measured_commit
from edge.contract.protocol import Telemetry, encode, topic
from edge.core.errors import LinkError
from edge.core.files import write_atomic
from edge.core.tables import console_table
from server.ports import free_port

RESULTS = Path(__file__).parent / "results"
GOALS = {"messages_per_second_stored": (">=", 5000.0), "embedded_messages_per_second_stored": (">=", 2000.0),
         "postgres_messages_per_second_stored": (">=", 5000.0), "p99_latency_s_at_half_load": ("<=", 0.2),
         "lost": ("<=", 0), "duplicated": ("<=", 0), "device_route_p99_s_under_dashboard_load": ("<=", 0.5),
         "unauthenticated_300mb_rss_growth_mb": ("<=", 50.0)}


def _mosquitto(folder: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    conf = folder / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_inflight_messages 1000\n"
                    "max_queued_messages 10000000\npersistence false\n")
    proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @retry(retry=retry_if_result(lambda up: not up), stop=stop_after_delay(10), wait=wait_fixed(0.05),
           retry_error_callback=lambda state: False)
    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    if not listening():
        proc.terminate()
        raise RuntimeError(f"mosquitto did not listen on port {port}")
    return proc, port


def _server(folder: Path, broker: str, mqtt_port: int, store: str | None = None) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "trickle.cli", "serve", "--state-dir", str(folder), "--port", str(port), "--broker", broker]
    cmd += ["--store", store] if store else []
    if broker == "embedded":
        cmd += ["--mqtt-port", str(mqtt_port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    @retry(retry=retry_if_result(lambda up: not up), stop=stop_after_delay(60), wait=wait_fixed(0.1),
           retry_error_callback=lambda state: False)
    def healthy() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        try:
            return bool(httpx.get(url + "/healthz", timeout=1).json()["broker_connected"])
        except httpx.HTTPError:
            return False

    if not healthy():
        proc.terminate()
        raise RuntimeError("the server did not start")
    return proc, url


def _payload_files(folder: Path, devices: list[tuple[str, str]], messages: int) -> dict[str, Path]:
    """One file per device of pre-encoded signed messages, a JSON line each."""
    files = {}
    for device, token in devices:
        path = folder / f"{device}.lines"
        with open(path, "wb") as fh:
            for i in range(messages):
                fh.write(encode(Telemetry(key=f"{device}:{i}", device=device, ts_s=float(i), voltage_v=2.5), token) + b"\n")
        files[device] = path
    return files


def _publish(broker_port: int, devices: list[tuple[str, str]], messages: int, folder: Path) -> tuple[float, dict[str, float]]:
    """Every device publishes its messages at QoS 1 from its own ``mosquitto_pub -l`` (C, so the
    publishers measure the link, not Python). Returns the first publish time and, per key, its
    publish time, interpolated over its publisher's run (they send at a steady pace)."""
    files = _payload_files(folder, devices, messages)
    start = time.time()
    procs = []
    for device, token in devices:
        cmd = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker_port), "-q", "1", "-i", f"bench-{device}",
               "-u", device, "-P", token, "-t", topic("bench", device, "telemetry"), "-l"]
        with open(files[device], "rb") as lines:  # the child keeps its own descriptor
            procs.append((device, subprocess.Popen(cmd, stdin=lines)))
    sent: dict[str, float] = {}
    for device, proc in procs:
        if proc.wait(600) != 0:
            raise RuntimeError(f"mosquitto_pub for {device} exited {proc.returncode}")
        end = time.time()
        for i in range(messages):
            sent[f"{device}:{i}"] = start + (end - start) * (i + 1) / messages
    return start, sent


def _publish_paced(broker_port: int, devices: list[tuple[str, str]], messages: int, folder: Path, rate_per_s: float
                   ) -> tuple[float, dict[str, float]]:
    """The same publishers fed one line at a time at ``rate_per_s`` messages/s in all (a steady
    load); a message's publish time is when its line was handed to its publisher."""
    files = _payload_files(folder, devices, messages)
    procs = []
    for device, token in devices:
        cmd = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker_port), "-q", "1", "-i", f"bench-{device}",
               "-u", device, "-P", token, "-t", topic("bench", device, "telemetry"), "-l"]
        procs.append((device, files[device].read_bytes().splitlines(keepends=True),
                      subprocess.Popen(cmd, stdin=subprocess.PIPE)))
    time.sleep(0.5)  # connected
    sent: dict[str, float] = {}
    start = time.time()
    tick = len(devices) / rate_per_s
    for i in range(messages):
        wake = start + i * tick
        time.sleep(max(0.0, wake - time.time()))
        for device, lines, proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(lines[i])
            proc.stdin.flush()
            sent[f"{device}:{i}"] = time.time()
    for device, _, proc in procs:
        assert proc.stdin is not None
        proc.stdin.close()
        if proc.wait(600) != 0:
            raise RuntimeError(f"mosquitto_pub for {device} exited {proc.returncode}")
    return start, sent


def _raw_rate(broker_port: int, n_devices: int, messages: int, folder: Path) -> float:
    """Messages/s from the same publishers to one ``mosquitto_sub`` (QoS 1), no server."""
    total = n_devices * messages
    sub = subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(broker_port), "-q", "1", "-i", "bench-raw",
                            "-t", "trickle/v1/bench/+/telemetry", "-C", str(total)], stdout=subprocess.DEVNULL)
    time.sleep(0.3)
    start, _ = _publish(broker_port, [(f"raw{i}", "x") for i in range(n_devices)], messages, folder)
    sub.wait(600)
    return total / (time.time() - start)


SENDING = re.compile(rb"sending PUBLISH \(d\d, q\d, r\d, m(\d+),")


def _publish_logged(broker_port: int, devices: list[tuple[str, str]], messages: int, folder: Path
                    ) -> tuple[float, dict[str, float], list[subprocess.Popen[bytes]]]:
    """Every device's ``mosquitto_pub -l`` (its name as client id: the embedded broker binds them),
    one message per publish at QoS 1 as in the Mosquitto rows, each message timed as its publisher
    puts it on the wire: ``-d`` logs every PUBLISH it sends with its message id (1, 2, ... in line
    order), read line-buffered (``stdbuf -oL``) by a thread per publisher. The publishers stay
    connected, to be closed once everything is stored: amqtt acknowledges a message before it is
    safely queued and drops it if the publisher leaves at once. Returns the time the first line
    was handed over, the send time per key, and the publishers."""
    import threading

    assert messages < 65535  # message ids do not wrap
    files = _payload_files(folder, devices, messages)
    procs = []
    for device, token in devices:
        cmd = ["stdbuf", "-oL", "mosquitto_pub", "-d", "-h", "127.0.0.1", "-p", str(broker_port), "-q", "1",
               "-i", device, "-u", device, "-P", token, "-t", topic("bench", device, "telemetry"), "-l"]
        procs.append((device, subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)))
    sent: dict[str, float] = {}

    def watch(device: str, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.time()
            found = SENDING.search(line)
            if found:  # a resend (d1) keeps the first send's time
                sent.setdefault(f"{device}:{int(found.group(1)) - 1}", now)

    def feed(device: str, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None
        proc.stdin.write(files[device].read_bytes())
        proc.stdin.flush()

    threads = [threading.Thread(target=watch, args=job, daemon=True) for job in procs]
    for t in threads:
        t.start()
    time.sleep(0.5)  # connected
    start = time.time()
    feeders = [threading.Thread(target=feed, args=job) for job in procs]
    for t in feeders:
        t.start()
    for t in feeders:
        t.join()
    return start, sent, [proc for _, proc in procs]


def _close(publishers: list[subprocess.Popen[bytes]]) -> None:
    for proc in publishers:
        assert proc.stdin is not None
        proc.stdin.close()
    for proc in publishers:
        if proc.wait(60) != 0:
            raise RuntimeError(f"mosquitto_pub exited {proc.returncode}")


def _register(url: str, data: Path, n: int) -> list[tuple[str, str]]:
    admin = {"Authorization": f"Bearer {(data / 'admin.token').read_text().strip()}"}
    out = []
    for i in range(n):
        r = httpx.post(url + "/v1/devices", json={"device": f"d{i}", "fleet": "bench"}, headers=admin, timeout=30)
        r.raise_for_status()
        out.append((f"d{i}", r.json()["token"]))
    return out


def _run(name: str, broker: str, broker_port: int, folder: Path, n: int, m: int, store: str | None = None,
         rate_per_s: float | None = None) -> dict[str, Any]:
    """One configuration: the server on ``broker`` (and ``store``, default SQLite), n devices x m
    messages, published as fast as the publishers go (or paced at ``rate_per_s``)."""
    from server.store.store import open_store

    data = folder / name
    proc, url = _server(data, broker, broker_port, store)
    publishers: list[subprocess.Popen[bytes]] = []
    try:
        devices = _register(url, data, n)
        work = folder / f"{name}-publishers"
        work.mkdir()
        if broker == "embedded":
            start, sent, publishers = _publish_logged(broker_port, devices, m, work)
        elif rate_per_s is not None:
            start, sent = _publish_paced(broker_port, devices, m, work, rate_per_s)
        else:
            start, sent = _publish(broker_port, devices, m, work)
        total = n * m
        db = open_store(store or data / "trickle.sqlite")

        @retry(retry=retry_if_result(lambda done: not done), stop=stop_after_delay(600), wait=wait_fixed(0.2),
               retry_error_callback=lambda state: False)
        def all_stored() -> bool:  # what is missing after the wait counts as lost
            return db.message_counts().get("telemetry", 0) >= total

        all_stored()
        _close(publishers)
        publishers = []
        rows = db.stored_times("telemetry")
        keys = [k for k, _ in rows]
        latency = np.array([stored_s - sent[k] for k, stored_s in rows])
        last = max(stored_s for _, stored_s in rows) if rows else start
        db.close()
    finally:
        for publisher in publishers:
            publisher.kill()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return {"broker": name, "store": "postgresql" if store else "sqlite", "devices": n, "messages_per_device": m,
            "published": total, "rate_per_s": rate_per_s,
            "stored": len(set(keys)), "lost": total - len(set(keys)), "duplicated": len(keys) - len(set(keys)),
            "messages_per_second_stored": len(set(keys)) / (last - start),
            "p50_latency_s": float(np.percentile(latency, 50)) if len(latency) else None,
            "p99_latency_s": float(np.percentile(latency, 99)) if len(latency) else None}


def _seed(state: Path, devices: list[tuple[str, str]], per_device: int) -> None:
    """Results and telemetry for every device, straight into the server's store (what the
    dashboard aggregates)."""
    from server.store.store import Incoming, open_store

    store = open_store(state / "trickle.sqlite")
    now = time.time()
    for device, _ in devices:
        rows = [Incoming(f"{device}:result:{i}", device, "result", now - i, now - i,
                         json.dumps({"key": f"{device}:result:{i}", "correct": i % 3 != 0}), i % 3 != 0, 1)
                for i in range(per_device)]
        rows += [Incoming(f"{device}:telemetry:{i}", device, "telemetry", now - i, now - i, "{}")
                 for i in range(per_device // 5)]
        store.add_messages(rows)
    store.close()


def _mixed_load(folder: Path, seconds: float, n_devices: int = 100, n_viewers: int = 10) -> dict[str, Any]:
    """Device routes under dashboard load (see the module's docstring)."""
    import asyncio
    import threading

    data = folder / "mixed"
    proc, url = _server(data, "embedded", free_port())
    try:
        devices = _register(url, data, n_devices)
        _seed(data, devices, 500)
        admin = {"Authorization": f"Bearer {(data / 'admin.token').read_text().strip()}"}
        stop = threading.Event()
        snapshots = [0]

        def viewer() -> None:
            with httpx.Client(timeout=120) as client:
                while not stop.is_set():
                    client.get(url + "/v1/dashboard/fleet", headers=admin).raise_for_status()
                    snapshots[0] += 1

        async def device(name: str, token: str, until: float, times: list[float]) -> None:
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(timeout=120) as client:
                for i in range(10**9):
                    if time.monotonic() >= until:
                        return
                    route = f"/v1/devices/{name}/result?limit=50" if i % 2 == 0 else "/v1/bundles"
                    t0 = time.perf_counter()
                    (await client.get(url + route, headers=headers)).raise_for_status()
                    times.append(time.perf_counter() - t0)
                    await asyncio.sleep(0.2)  # a device polls; it does not hammer

        async def devices_run() -> list[float]:
            times: list[float] = []
            until = time.monotonic() + seconds
            await asyncio.gather(*(device(d, t, until, times) for d, t in devices))
            return times

        viewers = [threading.Thread(target=viewer, daemon=True) for _ in range(n_viewers)]
        for t in viewers:
            t.start()
        try:
            times = asyncio.run(devices_run())
        finally:
            stop.set()
            for t in viewers:
                t.join(120)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return {"device_calls": len(times), "device_route_p50_s": float(np.percentile(times, 50)),
            "device_route_p99_s": float(np.percentile(times, 99)), "dashboard_snapshots_served": snapshots[0],
            "devices": n_devices, "viewers": n_viewers, "seconds": seconds}


def _unauthenticated_upload(folder: Path, megabytes: int = 300) -> float:
    """The server's peak RSS growth (MB) while an unauthenticated client sends a ``megabytes`` body."""
    import threading

    import psutil

    proc, url = _server(folder / "upload", "embedded", free_port())
    try:
        server = psutil.Process(proc.pid)
        before = server.memory_info().rss
        peak = [before]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.01):
                peak[0] = max(peak[0], server.memory_info().rss)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(f"POST /v1/bundles HTTP/1.1\r\nHost: bench\r\nContent-Length: {megabytes << 20}\r\n\r\n".encode())
            chunk = bytes(1 << 20)
            try:
                for _ in range(megabytes):
                    s.sendall(chunk)
            except OSError:  # refused and closed: the server reads no more
                pass
        time.sleep(0.5)
        done.set()
        sampler.join()
        return (peak[0] - before) / 2**20
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


PARTS = ("mosquitto", "embedded", "mixed", "upload")


def _mosquitto_part(folder: Path, n: int, m: int) -> dict[str, Any]:
    """The raw rate and the server behind Mosquitto: full speed, half load, PostgreSQL."""
    runs = []
    broker, port = _mosquitto(folder)
    try:
        print(f"raw Mosquitto: {n} publishers x {m} messages, one subscriber ...", flush=True)
        (folder / "raw").mkdir()
        raw = _raw_rate(port, n, m, folder / "raw")
        print(f"server behind Mosquitto: {n} devices x {m} messages ...", flush=True)
        runs.append(_run("mosquitto", f"mqtt://127.0.0.1:{port}", port, folder, n, m))
        half = runs[0]["messages_per_second_stored"] / 2
        print(f"server behind Mosquitto at half that load ({half:.0f} msg/s) ...", flush=True)
        # three times the messages: the run lasts longer than the store's background checkpoint period (10 s)
        runs.append(_run("mosquitto-half-load", f"mqtt://127.0.0.1:{port}", port, folder, n, 3 * m, rate_per_s=half))
        from server.store.pgtemp import available, temporary_postgres

        if available():
            print(f"server behind Mosquitto, PostgreSQL store: {n} devices x {m} messages ...", flush=True)
            with temporary_postgres(fsync=True) as pg:
                runs.append(_run("mosquitto-postgresql", f"mqtt://127.0.0.1:{port}", port, folder, n, m, store=pg))
    finally:
        broker.terminate()
        broker.wait(10)
    by = {r["broker"]: r for r in runs}
    main_run = by["mosquitto"]
    return {"messages_per_second_stored": main_run["messages_per_second_stored"],
            "postgres_messages_per_second_stored": by["mosquitto-postgresql"]["messages_per_second_stored"]
            if "mosquitto-postgresql" in by else None,
            "p99_latency_s_at_half_load": by["mosquitto-half-load"]["p99_latency_s"],
            "p50_latency_s": main_run["p50_latency_s"], "p99_latency_s": main_run["p99_latency_s"],
            "raw_mosquitto_messages_per_second": raw, "ratio_vs_raw_mosquitto": main_run["messages_per_second_stored"] / raw,
            "runs": runs}


def main(quick: bool = False, results_dir: Path = RESULTS, parts: tuple[str, ...] = PARTS) -> dict[str, Any]:
    """Run the benchmark's ``parts`` (the Mosquitto rows with the raw rate, the embedded broker, the
    mixed load, the unauthenticated upload). Running some of them keeps the others' keys and runs
    from the committed JSON, and ``measured`` says which commit each part was measured at."""
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"parts {sorted(unknown)}: must be among {', '.join(PARTS)}")
    n, m = (4, 500) if quick else (10, 3000)
    if shutil.which("mosquitto") is None:
        raise LinkError("trickle bench link needs Mosquitto: apt-get install mosquitto mosquitto-clients")
    path = results_dir / ("link-quick.json" if quick else "link.json")
    previous = json.loads(path.read_text()) if path.exists() and set(parts) != set(PARTS) else {}
    out: dict[str, Any] = {**previous, "quick": quick, "goals": {k: f"{op} {goal:g}" for k, (op, goal) in GOALS.items()}}
    runs: list[dict[str, Any]] = list(previous.get("runs", []))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if "mosquitto" in parts:
            keys = _mosquitto_part(folder, n, m)
            runs = [r for r in runs if not r["broker"].startswith("mosquitto")] + keys.pop("runs")
            out |= keys
        if "embedded" in parts:
            print(f"server with its embedded broker: {n} devices x {m} messages, one a publish ...", flush=True)
            embedded = _run("embedded", "embedded", free_port(), folder, n, m)
            runs = [r for r in runs if r["broker"] != "embedded"] + [embedded]
            out["embedded_messages_per_second_stored"] = embedded["messages_per_second_stored"]
        if "mixed" in parts:
            seconds = 5.0 if quick else 30.0
            print(f"device routes under dashboard load: 100 devices, 10 viewers, {seconds:g} s ...", flush=True)
            mixed = _mixed_load(folder, seconds)
            out |= {"device_route_p99_s_under_dashboard_load": mixed["device_route_p99_s"],
                    "device_route_p50_s_under_dashboard_load": mixed["device_route_p50_s"], "mixed_load": mixed}
        if "upload" in parts:
            print("a 300 MB body without a token ...", flush=True)
            out["unauthenticated_300mb_rss_growth_mb"] = _unauthenticated_upload(folder)
    order = ("mosquitto", "mosquitto-half-load", "mosquitto-postgresql", "embedded")
    runs.sort(key=lambda r: order.index(r["broker"]) if r["broker"] in order else len(order))
    out |= {"runs": runs, "lost": sum(r["lost"] for r in runs), "duplicated": sum(r["duplicated"] for r in runs),
            "measured": {**previous.get("measured", {}),
                         **dict.fromkeys(parts, measured_commit("server", "edge", "bench/link.py"))}}
    rows = [(r["broker"], f"{r['messages_per_second_stored']:.0f}", f"{r['p50_latency_s']:.4f}", f"{r['p99_latency_s']:.4f}",
             r["lost"], r["duplicated"]) for r in runs]
    print("\n" + console_table(rows, headers=["broker", "stored/s", "p50 s", "p99 s", "lost", "dup"], align="lrrrrr"))
    if "raw_mosquitto_messages_per_second" in out:
        print(f"raw Mosquitto (no server): {out['raw_mosquitto_messages_per_second']:.0f} msg/s; "
              f"stored / raw = {out['ratio_vs_raw_mosquitto']:.3f}")
    for key, (op, goal) in GOALS.items():
        if out.get(key) is None:
            print(f"{key:32s} not measured")
            continue
        ok = out[key] <= goal if op == "<=" else out[key] >= goal
        print(f"{key:32s} {out[key]:10.4g}  {'✔' if ok else '✘'} (goal {op} {goal:g})")
    write_atomic(path, json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}")
    return out
