"""Replicas benchmark (``trickle bench link``'s part ``replicas``): messages stored per second by one
``trickle serve --replica`` and by two, on one PostgreSQL (fsync on) and one Mosquitto with the
configuration the server writes (passwords, ACL, client id = user), the publishers alike.

Each run is fresh (a new database, new server processes): 10 devices publish 3,000 signed
telemetry messages each at QoS 1 from their own ``mosquitto_pub -l`` (C, as in the link
benchmark's Mosquitto rows); the rate is messages / (last stored - first published). One and two
replicas alternate (1, 2, 2, 1, 1, 2, ...); each figure is the median of its runs, the ratio is
the median two-replica rate over the median one-replica rate. Both use the replica mode (MQTT v5, a
shared subscription with one member or two), so only the number of replicas differs.

What bounds the ratio on this machine is reported beside it: the CPU seconds each part used during
the runs (the replicas, Mosquitto, PostgreSQL, the publishers) over the wall time, on two cores.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
from tenacity import retry, retry_if_result, stop_after_delay, wait_fixed

from bench.processes import publish, serve

DEVICES, MESSAGES = 10, 3000


def _replica(state: Path, store: str, broker: str, name: str) -> tuple[subprocess.Popen[bytes], str]:
    return serve(state, broker, 0, store, "--replica", name)


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _postgres() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] == "postgres"]


def _one_run(folder: Path, pg: str, n_replicas: int, run: int) -> dict[str, Any]:
    """A fresh database and broker files, ``n_replicas`` replicas, the publishers; the rate and the CPU used."""
    import psycopg

    from server.mqtt.mosquitto import Mosquitto, write_mosquitto_config
    from server.service import read_or_create_token
    from server.store.store import open_store

    name = f"r{run}_{n_replicas}"
    with psycopg.connect(pg, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    store_url = pg.rsplit("/", 1)[0] + "/" + name
    state = folder / name
    state.mkdir(parents=True)
    store = open_store(store_url)
    devices = [(f"d{i}", store.add_device(f"d{i}", "bench").token) for i in range(DEVICES)]
    names = ["a", "b", "c", "d"][:n_replicas]
    write_mosquitto_config(store, read_or_create_token(state / "server.token"), state / "mosquitto", replicas=names)
    broker = Mosquitto(state / "mosquitto").start()
    replicas: list[subprocess.Popen[bytes]] = []
    try:
        replicas = [_replica(state, store_url, broker.url, r)[0] for r in names]
        watched = [psutil.Process(p.pid) for p in replicas]
        assert broker.proc is not None
        mosquitto, postgres = psutil.Process(broker.proc.pid), _postgres()
        before = [_cpu(watched), _cpu([mosquitto]), _cpu(postgres), psutil.cpu_times()]
        work = state / "publishers"
        work.mkdir()
        start, _ = publish(broker.port, devices, MESSAGES, work)
        total = DEVICES * MESSAGES

        @retry(retry=retry_if_result(lambda done: not done), stop=stop_after_delay(300), wait=wait_fixed(0.1),
               retry_error_callback=lambda state: False)
        def all_stored() -> bool:
            return store.message_counts().get("telemetry", 0) >= total

        all_stored()
        wall = time.time() - start
        after = [_cpu(watched), _cpu([mosquitto]), _cpu(postgres), psutil.cpu_times()]
        rows = store.stored_times("telemetry")
        keys = [k for k, _ in rows]
        last = max(t for _, t in rows)
        machine = sum(after[3]) - sum(before[3]) - (after[3].idle - before[3].idle)
        used = {"replicas": after[0] - before[0], "mosquitto": after[1] - before[1], "postgres": after[2] - before[2]}
        used["publishers_and_rest"] = machine - sum(used.values())
    finally:
        for proc in replicas:
            proc.send_signal(signal.SIGTERM)
        for proc in replicas:
            proc.wait(60)
        broker.stop()
        store.close()
    return {"replicas": n_replicas, "published": total, "stored": len(set(keys)), "lost": total - len(set(keys)),
            "duplicated": len(keys) - len(set(keys)), "messages_per_second_stored": len(set(keys)) / (last - start),
            "cpu_cores_used": {k: round(v / wall, 2) for k, v in used.items()}}


def measure(folder: Path, rounds: int = 3) -> dict[str, Any]:
    """One and two replicas, ``rounds`` runs each, alternated; the ratio of the medians."""
    from server.store.pgtemp import available, temporary_postgres

    if not available():
        return {"skipped": "apt-get install postgresql"}
    runs: list[dict[str, Any]] = []
    order = [n for r in range(rounds) for n in ((1, 2) if r % 2 == 0 else (2, 1))]
    with temporary_postgres(fsync=True) as pg:
        for i, n in enumerate(order):
            print(f"  replicas run {i + 1}/{len(order)}: {n} replica(s) ...", flush=True)
            runs.append(_one_run(folder, pg, n, i))
    rate = {n: float(np.median([r["messages_per_second_stored"] for r in runs if r["replicas"] == n])) for n in (1, 2)}
    return {"replicas_messages_per_second_ratio_2_vs_1": rate[2] / rate[1],
            "replicas_messages_per_second": {"1": rate[1], "2": rate[2]},
            "replicas_lost": sum(r["lost"] for r in runs), "replicas_duplicated": sum(r["duplicated"] for r in runs),
            "replicas_runs": runs}


def chaos(folder: Path, n_devices: int = 5, messages: int = 2000, rate_per_s: float = 1000.0) -> dict[str, Any]:
    """kill -9 of one of two replicas while devices publish: ``n_devices`` edge links (the agent's
    ``edge.agent.link.Link``: on-disk outbox, end-to-end acks, resend) send ``messages`` telemetry
    messages each at ``rate_per_s`` in all; 3 s in, replica a hangs (SIGSTOP) for 1.5 s while the
    broker keeps handing it its share, then is killed (SIGKILL). Lost: published keys never stored;
    duplicated: rows beyond one per key; redelivered: copies the surviving replica skipped by key."""
    import re
    import threading

    import psycopg

    from edge.agent.link import Link
    from edge.agent.outbox import Outbox
    from edge.contract.protocol import Telemetry
    from server.mqtt.mosquitto import Mosquitto, write_mosquitto_config
    from server.service import read_or_create_token
    from server.store.pgtemp import available, temporary_postgres
    from server.store.store import open_store

    if not available():
        return {"skipped": "apt-get install postgresql"}
    with temporary_postgres(fsync=True) as pg:
        with psycopg.connect(pg, autocommit=True) as admin:
            admin.execute("CREATE DATABASE chaos")
        store_url = pg.rsplit("/", 1)[0] + "/chaos"
        state = folder / "chaos"
        state.mkdir(parents=True)
        store = open_store(store_url)
        devices = [(f"c{i}", store.add_device(f"c{i}", "bench").token) for i in range(n_devices)]
        write_mosquitto_config(store, read_or_create_token(state / "server.token"), state / "mosquitto", replicas=["a", "b"])
        broker = Mosquitto(state / "mosquitto").start()
        replicas = [_replica(state, store_url, broker.url, r) for r in ("a", "b")]
        links = [Link(Outbox(state / f"{d}.outbox"), d, token, broker.url, fleet="bench", resend_s=1.0)
                 for d, token in devices]
        try:
            for link in links:
                link.start()

            def feed() -> None:
                start = time.monotonic()
                for i in range(messages):
                    time.sleep(max(0.0, start + i * n_devices / rate_per_s - time.monotonic()))
                    for link in links:
                        link.send("telemetry", Telemetry(key=f"{link.device}:{i}", device=link.device, ts_s=float(i),
                                                         voltage_v=2.5))

            feeder = threading.Thread(target=feed)
            feeder.start()
            time.sleep(3.0)
            replicas[0][0].send_signal(signal.SIGSTOP)
            time.sleep(1.5)
            replicas[0][0].kill()
            replicas[0][0].wait(10)
            feeder.join()

            @retry(retry=retry_if_result(lambda done: not done), stop=stop_after_delay(120), wait=wait_fixed(0.2),
                   retry_error_callback=lambda state: False)
            def drained() -> bool:
                return all(link.drained() for link in links)

            drained()
            time.sleep(1.0)  # the last acknowledged batch committed: counted below
            rows = store.stored_times("telemetry")
            found = re.search(r"^trickle_messages_duplicate_total (\S+)$", httpx.get(replicas[1][1] + "/metrics").text, re.M)
        finally:
            for link in links:
                link.stop()
            for proc, _ in replicas:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(60)
            broker.stop()
            store.close()
    keys = [k for k, _ in rows]
    published = n_devices * messages
    return {"replica_kill_lost": published - len(set(keys)), "replica_kill_duplicated": len(keys) - len(set(keys)),
            "replica_kill": {"published": published, "stored": len(set(keys)), "devices": n_devices,
                             "redelivered_copies_skipped": int(float(found.group(1))) if found else 0}}
