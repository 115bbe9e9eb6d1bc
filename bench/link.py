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
  device calls (device_route_p50_s_under_dashboard_load beside it; dashboard_snapshots_served). Since
  issue 49 each device's client is made before the clock starts (``_device_calls``), and a viewer
  refused for the admin token's read rate (429) waits out its Retry-After.
- device_route_p99_ratio_dashboard_load_vs_idle (part ``readload``, ``_read_load``): on one server
  (embedded broker, SQLite, 100 devices' 60,000 messages), 20 device clients poll their own routes
  every 0.2 s alone (idle p99), then with 30 dashboard clients in another process asking as fast as
  they are answered (admin fleet pages, the registry, 1,000-result queries, device details; device
  tokens loading their dashboards; a 429 waited out) (load p99); 5 interleaved rounds of 10 s, the
  median load p99 over the median idle p99 (``read_load`` holds the rounds and the dashboards' answers).
- unauthenticated_300mb_rss_growth_mb: the server's peak RSS growth (psutil, sampled every 10 ms)
  while a client without a token sends a 300 MB body to the bundle upload route.
- sd_sessions_evicted_across_devices (part ``sessions``, ``_session_quota``): speculative-decoding
  sessions of device B dropped while device A opens 80 (must be 0); sd_sessions_probe beside it.
- replicas_messages_per_second_ratio_2_vs_1 (part ``replicas``, ``bench.replicas``): two
  ``trickle serve --replica`` over one replica on PostgreSQL and Mosquitto, medians of alternated
  runs (replicas_messages_per_second, the CPU each part used in replicas_runs); replica_kill_lost,
  replica_kill_duplicated: kill -9 of one of two replicas while five device links publish.
- broker_rss_growth_mb_unauth_200mb_connect, broker_rss_growth_mb_retained_flood (part "broker"):
  a broker process's peak RSS growth while three CONNECTs without a login claim 200 MB each, and
  while one device retains its largest payload on every topic it may publish to and then tries
  32 MB; the larger of Mosquitto (the configuration the server writes) and the embedded broker
  (``broker_limits`` holds both).
- measured: the commit each part (PARTS) was last measured at.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from tenacity import retry, retry_if_result, stop_after_delay, wait_fixed

from bench.measured import measured_commit
from bench.processes import payload_files, publish, serve
from edge.contract.protocol import topic
from edge.core.errors import LinkError
from edge.core.files import write_atomic
from edge.core.tables import console_table
from server.ports import free_port

RESULTS = Path(__file__).parent / "results"
GOALS = {"messages_per_second_stored": (">=", 5000.0), "embedded_messages_per_second_stored": (">=", 2000.0),
         "postgres_messages_per_second_stored": (">=", 5000.0), "p99_latency_s_at_half_load": ("<=", 0.2),
         "lost": ("<=", 0), "duplicated": ("<=", 0), "device_route_p99_s_under_dashboard_load": ("<=", 0.5),
         "unauthenticated_300mb_rss_growth_mb": ("<=", 50.0), "device_route_p99_ratio_dashboard_load_vs_idle": ("<=", 2.0),
         "sd_sessions_evicted_across_devices": ("<=", 0), "replicas_messages_per_second_ratio_2_vs_1": (">=", 1.3),
         "replica_kill_lost": ("<=", 0), "replica_kill_duplicated": ("<=", 0),
         "broker_rss_growth_mb_unauth_200mb_connect": ("<=", 20.0), "broker_rss_growth_mb_retained_flood": ("<=", 20.0)}


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


def rss_growth_mb(pid: int, action: Callable[[], None], settle_s: float = 0.5) -> tuple[float, float]:
    """(peak, final) growth of ``pid``'s RSS in MB (psutil, sampled every 10 ms) while ``action`` runs
    and ``settle_s`` after."""
    import psutil

    proc = psutil.Process(pid)
    before = proc.memory_info().rss
    peak, done = [before], threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], proc.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        action()
        time.sleep(settle_s)
    finally:
        done.set()
        sampler.join()
    return (peak[0] - before) / 2**20, (proc.memory_info().rss - before) / 2**20


def remaining_length(n: int) -> bytes:
    """MQTT's variable-length encoding of a fixed header's remaining length (§2.2.3)."""
    out = bytearray()
    while True:
        n, byte = n // 128, n % 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _publish_paced(broker_port: int, devices: list[tuple[str, str]], messages: int, folder: Path, rate_per_s: float
                   ) -> tuple[float, dict[str, float]]:
    """The same publishers fed one line at a time at ``rate_per_s`` messages/s in all (a steady
    load); a message's publish time is when its line was handed to its publisher."""
    files = payload_files(folder, devices, messages)
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
    start, _ = publish(broker_port, [(f"raw{i}", "x") for i in range(n_devices)], messages, folder)
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
    assert messages < 65535  # message ids do not wrap
    files = payload_files(folder, devices, messages)
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
    proc, url = serve(data, broker, broker_port, store)
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
            start, sent = publish(broker_port, devices, m, work)
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


async def _device_calls(url: str, devices: list[tuple[str, str]], seconds: float, pace_s: float = 0.2) -> list[float]:
    """Every device calls its own routes (its newest 50 results, then the bundle list, in turn) every
    ``pace_s`` (a device polls; it does not hammer) for ``seconds``: each call's time. Each client is
    made before the clock starts: httpx builds an SSL context per client (~30 ms of CPU), which made
    inside the timed loop put seconds on the first calls (this process's time, not the server's)."""
    import asyncio

    async def device(http: httpx.AsyncClient, name: str, until: float, times: list[float]) -> None:
        for i in range(10**9):
            if time.monotonic() >= until:
                return
            route = f"/v1/devices/{name}/result?limit=50" if i % 2 == 0 else "/v1/bundles"
            t0 = time.perf_counter()
            (await http.get(url + route)).raise_for_status()
            times.append(time.perf_counter() - t0)
            await asyncio.sleep(pace_s)

    https = [httpx.AsyncClient(timeout=120, headers={"Authorization": f"Bearer {token}"}) for _, token in devices]
    times: list[float] = []
    until = time.monotonic() + seconds
    try:
        await asyncio.gather(*(device(http, name, until, times) for http, (name, _) in zip(https, devices, strict=True)))
    finally:
        for http in https:
            await http.aclose()
    return times


def _mixed_load(folder: Path, seconds: float, n_devices: int = 100, n_viewers: int = 10) -> dict[str, Any]:
    """Device routes under dashboard load (see the module's docstring)."""
    import asyncio
    data = folder / "mixed"
    proc, url = serve(data, "embedded", free_port())
    try:
        devices = _register(url, data, n_devices)
        _seed(data, devices, 500)
        admin = {"Authorization": f"Bearer {(data / 'admin.token').read_text().strip()}"}
        stop = threading.Event()
        snapshots = [0]

        def viewer() -> None:
            with httpx.Client(timeout=120) as client:
                while not stop.is_set():
                    r = client.get(url + "/v1/dashboard/fleet", headers=admin)
                    if r.status_code == 429:  # over the admin token's read rate: waited out, as the page does
                        stop.wait(float(r.headers.get("Retry-After", "1")))
                        continue
                    r.raise_for_status()
                    snapshots[0] += 1

        viewers = [threading.Thread(target=viewer, daemon=True) for _ in range(n_viewers)]
        for t in viewers:
            t.start()
        try:
            times = asyncio.run(_device_calls(url, devices, seconds))
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


def dashboard_clients(url: str, admin_token: str, device_tokens: list[tuple[str, str]], n_clients: int,
                       stop: Any, served: Any) -> None:
    """``n_clients`` dashboard clients in a process of their own (so their Python does not time the
    devices'), each asking as soon as it has its answer: two in three with the admin token (fleet
    pages, a search, the registry, one device's results, one device's detail), the rest each with
    a device's token (its fleet snapshot and its detail: what a device token could load before).
    A 429 is waited out for its Retry-After, as the dashboard page does. ``served``: [200s, 429s, other]."""
    import asyncio

    async def client(k: int) -> None:
        if k % 3 != 2:
            headers = {"Authorization": f"Bearer {admin_token}"}
            routes = ["/v1/dashboard/fleet", "/v1/dashboard/fleet?page=1", "/v1/dashboard/fleet?q=d1", "/v1/devices",
                      f"/v1/devices/{device_tokens[k % len(device_tokens)][0]}/result?limit=1000",
                      f"/v1/dashboard/devices/{device_tokens[k % len(device_tokens)][0]}"]
        else:
            name, token = device_tokens[k % len(device_tokens)]
            headers = {"Authorization": f"Bearer {token}"}
            routes = ["/v1/dashboard/fleet", f"/v1/dashboard/devices/{name}"]
        async with httpx.AsyncClient(timeout=120) as http:
            for i in range(10**9):
                if stop.is_set():
                    return
                r = await http.get(url + routes[(i + k) % len(routes)], headers=headers)
                slot = 0 if r.status_code == 200 else 1 if r.status_code == 429 else 2
                with served.get_lock():
                    served[slot] += 1
                if r.status_code == 429:
                    await asyncio.sleep(float(r.headers.get("Retry-After", "1")))

    async def run() -> None:
        await asyncio.gather(*(client(k) for k in range(n_clients)))

    asyncio.run(run())


def _read_load(folder: Path, seconds: float, rounds: int, n_devices: int = 20, n_viewers: int = 30) -> dict[str, Any]:
    """Device routes alone, then under dashboard load, on one server (embedded broker, SQLite
    holding 100 devices' 60,000 messages): ``n_devices`` device clients each poll their own routes
    (their newest 50 results, the bundle list) every 0.2 s for ``seconds``, alone (idle) and then
    with ``n_viewers`` dashboard clients (``dashboard_clients``, another process) asking as fast
    as they are answered; ``rounds`` idle/load pairs interleaved. The ratio is the median load p99
    over the median idle p99."""
    import asyncio
    import multiprocessing

    data = folder / "readload"
    proc, url = serve(data, "embedded", free_port())
    spawn = multiprocessing.get_context("spawn")
    try:
        devices = _register(url, data, 100)
        _seed(data, devices, 500)
        admin_token = (data / "admin.token").read_text().strip()
        clients, others = devices[:n_devices], devices[n_devices:]

        idle, load, served = [], [], spawn.Array("q", 3)
        for r in range(rounds):
            print(f"  round {r + 1}/{rounds}: {n_devices} devices alone, then with {n_viewers} dashboard clients ...",
                  flush=True)
            idle.append(float(np.percentile(asyncio.run(_device_calls(url, clients, seconds)), 99)))
            stop = spawn.Event()
            viewers = spawn.Process(target=dashboard_clients, args=(url, admin_token, others, n_viewers, stop, served))
            viewers.start()
            time.sleep(2.0)  # the process is up and its clients asking
            try:
                load.append(float(np.percentile(asyncio.run(_device_calls(url, clients, seconds)), 99)))
            finally:
                stop.set()
                viewers.join(120)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return {"idle_p99_s": idle, "load_p99_s": load, "ratio_per_round": [b / a for a, b in zip(idle, load, strict=True)],
            "idle_p99_s_median": float(np.median(idle)), "load_p99_s_median": float(np.median(load)),
            "ratio": float(np.median(load) / np.median(idle)), "dashboard_answers": {"200": served[0], "429": served[1],
            "other": served[2]}, "devices": n_devices, "viewers": n_viewers, "seconds": seconds, "rounds": rounds}


def _unauthenticated_upload(folder: Path, megabytes: int = 300) -> float:
    """The server's peak RSS growth (MB) while an unauthenticated client sends a ``megabytes`` body."""
    import psutil

    proc, url = serve(folder / "upload", "embedded", free_port())
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


def _session_quota(n_sessions: int = 80) -> dict[str, Any]:
    """Issue 49's probe on the server's verification sessions (``server.llm.verify``, default pool
    64, quota 8 per device) over a tiny random Llama (2 layers, width 32; the sessions' policy, not
    the model, is measured): device B holds a live session while device A opens ``n_sessions``
    from 8 threads at once (batched rounds); then B's next round. ``sd_sessions_evicted_across_devices``:
    sessions of one device dropped for another's."""
    from concurrent.futures import ThreadPoolExecutor

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from edge.contract.protocol import VerifyRequest
    from server.llm.verify import VerifySessions, answer

    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2)).eval()
    sessions = VerifySessions(target)
    live = sessions.verify("b", VerifyRequest(session="live", start=0, tokens=[1, 2, 3], draft=[4]))
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: sessions.verify("a", VerifyRequest(session=f"s{i}", start=0, tokens=[5, 6], draft=[7])),
                      range(n_sessions)))
    took = time.perf_counter() - started
    status, _, _ = answer(sessions, "b", VerifyRequest(session="live", start=live.history, draft=[9]))
    return {"sd_sessions_evicted_across_devices": sessions.evicted_across_devices,
            "sd_sessions_probe": {"opened_by_a": n_sessions, "seconds": round(took, 3), "b_next_round_status": status,
                                  "evictions": dict(sessions.evictions), "max_sessions": sessions.max_sessions,
                                  "max_sessions_per_device": sessions.max_sessions_per_device}}


def _broker_limits(folder: Path) -> dict[str, Any]:
    """Issue 49's broker probes, on Mosquitto with the configuration the server writes and on the
    embedded broker inside ``trickle serve``: the broker process's peak RSS growth (psutil, sampled
    every 10 ms, until 1 s after) while (a) three CONNECTs without credentials, each claiming 200 MB,
    are streamed until the broker closes them; (b) one device publishes its largest payload
    (``server.mqtt.limits.MAX_PACKET_BYTES``) retained on every topic it may publish to, then a 32 MB
    one. Each key is the larger of the two brokers; ``broker_limits`` holds both."""

    import paho.mqtt.client as mqtt

    from edge.contract.protocol import device_topics
    from server.mqtt.limits import MAX_PACKET_BYTES
    from server.mqtt.mosquitto import Mosquitto, write_mosquitto_config
    from server.store.store import open_store

    def growth_mb(pid: int, action: Callable[[], None]) -> float:
        return rss_growth_mb(pid, action, settle_s=1.0)[0]

    def connects(port: int) -> None:
        length = remaining_length(200 << 20)
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(b"\x10" + bytes(length) + b"\x00\x04MQTT\x04\x02\x00\x3c\x00\x05bench")
                try:
                    for _ in range(200):
                        s.sendall(bytes(1 << 20))
                except OSError:  # closed by the broker
                    pass

    def flood(port: int, device: str, token: str) -> None:
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=device)
        client.username_pw_set(device, token)
        client.connect("127.0.0.1", port)
        client.loop_start()
        try:
            for name in device_topics("bench", device)["publish"]:  # first byte, topic, packet id: the rest payload
                client.publish(name, bytes(MAX_PACKET_BYTES - 5 - len(name)), qos=1, retain=True).wait_for_publish(60)
            client.publish(topic("bench", device, "status"), bytes(32 << 20), qos=1, retain=True)
            time.sleep(2.0)  # refused at its fixed header (the connection closed), or taken
        finally:
            client.loop_stop()
            client.disconnect()

    per: dict[str, dict[str, float]] = {}
    work = folder / "broker-mosquitto"
    store = open_store(folder / "broker-mosquitto.sqlite")
    token = store.add_device("d0", "bench").token
    write_mosquitto_config(store, "bench-server-token", work)
    store.close()
    broker = Mosquitto(work).start()
    try:
        assert broker.proc is not None
        per["mosquitto"] = {"unauth_200mb_connect": growth_mb(broker.proc.pid, lambda: connects(broker.port)),
                            "retained_flood": growth_mb(broker.proc.pid, lambda: flood(broker.port, "d0", token))}
    finally:
        broker.stop()
    port = free_port()
    proc, url = serve(folder / "broker-embedded", "embedded", port)
    try:
        (device, token), = _register(url, folder / "broker-embedded", 1)
        per["embedded"] = {"unauth_200mb_connect": growth_mb(proc.pid, lambda: connects(port)),
                           "retained_flood": growth_mb(proc.pid, lambda: flood(port, device, token))}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return {"broker_rss_growth_mb_unauth_200mb_connect": max(p["unauth_200mb_connect"] for p in per.values()),
            "broker_rss_growth_mb_retained_flood": max(p["retained_flood"] for p in per.values()),
            "broker_limits": {"rss_growth_mb": per, "max_packet_bytes": MAX_PACKET_BYTES}}


PARTS = ("mosquitto", "embedded", "mixed", "readload", "upload", "sessions", "replicas", "broker")


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
    mixed load, device routes idle and under dashboard load, the unauthenticated upload). Running some
    of them keeps the others' keys and runs from the committed JSON, and ``measured`` says which
    commit each part was measured at."""
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
        if "readload" in parts:
            seconds, rounds = (5.0, 1) if quick else (10.0, 5)
            print(f"device routes idle and under dashboard load: 20 devices, 30 dashboard clients, {rounds} x {seconds:g} s ...",
                  flush=True)
            readload = _read_load(folder, seconds, rounds)
            out |= {"device_route_p99_ratio_dashboard_load_vs_idle": readload["ratio"], "read_load": readload}
        if "upload" in parts:
            print("a 300 MB body without a token ...", flush=True)
            out["unauthenticated_300mb_rss_growth_mb"] = _unauthenticated_upload(folder)
        if "broker" in parts:
            print("broker limits: 200 MB CONNECTs without a login, a device's retained flood (Mosquitto, embedded) ...",
                  flush=True)
            out |= _broker_limits(folder)
        if "sessions" in parts:
            print("speculative-decoding sessions: device A opens 80 while device B's is live ...", flush=True)
            out |= _session_quota()
        if "replicas" in parts:  # bench.replicas: one vs two trickle serve --replica, and kill -9 of one
            from bench import replicas

            rounds = 1 if quick else 3
            print(f"replicas on PostgreSQL and Mosquitto: one vs two, {rounds} run(s) each, alternated ...", flush=True)
            out |= replicas.measure(folder, rounds)
            print("kill -9 of one of two replicas while 5 devices publish ...", flush=True)
            out |= replicas.chaos(folder)
    order = ("mosquitto", "mosquitto-half-load", "mosquitto-postgresql", "embedded")
    runs.sort(key=lambda r: order.index(r["broker"]) if r["broker"] in order else len(order))
    out |= {"runs": runs, "lost": sum(r["lost"] for r in runs), "duplicated": sum(r["duplicated"] for r in runs),
            "measured": {**previous.get("measured", {}),
                         **dict.fromkeys(parts, measured_commit("server", "edge", "bench/link.py", "bench/replicas.py",
                                                               "bench/processes.py"))}}
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
