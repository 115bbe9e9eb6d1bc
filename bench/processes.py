"""What the link benchmarks start and drive (``bench.link``, ``bench.replicas``): ``trickle serve`` as
its own process, once it is healthy, and devices' publishers (``mosquitto_pub``, C) fed pre-encoded
signed messages."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
from tenacity import retry, retry_if_result, stop_after_delay, wait_fixed

from edge.contract.protocol import Telemetry, encode, topic
from server.ports import free_port


def serve(folder: Path, broker: str, mqtt_port: int, store: str | None = None, *flags: str
            ) -> tuple[subprocess.Popen[bytes], str]:
    """``trickle serve`` on ``folder`` (more ``flags`` after), once it is healthy and its bridge connected."""
    port = free_port()
    cmd = [sys.executable, "-m", "trickle.cli", "serve", "--state-dir", str(folder), "--port", str(port), "--broker", broker]
    cmd += ["--store", store] if store else []
    cmd += flags
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


def payload_files(folder: Path, devices: list[tuple[str, str]], messages: int) -> dict[str, Path]:
    """One file per device of pre-encoded signed messages, a JSON line each."""
    files = {}
    for device, token in devices:
        path = folder / f"{device}.lines"
        with open(path, "wb") as fh:
            for i in range(messages):
                fh.write(encode(Telemetry(key=f"{device}:{i}", device=device, ts_s=float(i), voltage_v=2.5), token) + b"\n")
        files[device] = path
    return files


def publish(broker_port: int, devices: list[tuple[str, str]], messages: int, folder: Path) -> tuple[float, dict[str, float]]:
    """Every device publishes its messages at QoS 1 from its own ``mosquitto_pub -l`` (C, so the
    publishers measure the link, not Python). Returns the first publish time and, per key, its
    publish time, interpolated over its publisher's run (they send at a steady pace)."""
    files = payload_files(folder, devices, messages)
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
