"""The read path cannot starve the device path, and the page's headers (issue 49), on a real
``trickle serve`` over real HTTP: security headers on every answer, the CDN-loading docs pages closed,
a token over its read rate refused with 429 and Retry-After, concurrent viewers sharing one snapshot
computation, and device-route latency under dashboard load within twice its idle latency."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np
import pytest

from server.api.app import SECURITY_HEADERS
from server.api.dashboard import STATIC
from server.api.readpath import ReadLimits, ReadPath
from server.ports import free_port
from tests.server.conftest import ServerProc, wait_for

chromium = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def plain_server(tmp_path: Path) -> Iterator[ServerProc]:
    """``trickle serve`` with its embedded broker and SQLite, no trusted keys (nothing here uploads)."""
    server = ServerProc(tmp_path / "server", free_port(), "embedded", free_port())
    server.start()
    yield server
    server.stop()


def _seed(server: ServerProc, devices: list[str], results: int) -> None:
    """``results`` results and a fifth as much telemetry per device, straight into the server's store."""
    from server.store.store import Incoming, open_store

    store, now = open_store(server.data / "trickle.sqlite"), time.time()
    for device in devices:
        rows = [Incoming(f"{device}:result:{i}", device, "result", now - i, now - i,
                         json.dumps({"key": f"{device}:result:{i}", "correct": i % 3 != 0}), i % 3 != 0, 1)
                for i in range(results)]
        rows += [Incoming(f"{device}:telemetry:{i}", device, "telemetry", now - i, now - i, "{}") for i in range(results // 5)]
        store.add_messages(rows)
    store.close()


def _metric(server: ServerProc, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", server.metrics(), re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.needs_broker
def test_every_answer_carries_the_security_headers_and_the_cdn_docs_are_closed(plain_server: ServerProc) -> None:
    """The page, an API answer, a refusal and the spec all carry CSP, X-Frame-Options DENY, nosniff
    and no-referrer; /docs and /redoc (Swagger and ReDoc from a CDN) are gone, /openapi.json stays."""
    server = plain_server
    answers = {"/": httpx.get(server.url + "/"), "/v1/devices": httpx.get(server.url + "/v1/devices", headers=server.admin),
               "/v1/devices (no token)": httpx.get(server.url + "/v1/devices"),
               "/openapi.json": httpx.get(server.url + "/openapi.json")}
    assert [r.status_code for r in answers.values()] == [200, 200, 401, 200]
    for what, r in answers.items():
        for name, value in SECURITY_HEADERS.items():
            assert r.headers.get(name) == value, f"{what}: {name} is {r.headers.get(name)!r}"
    assert "frame-ancestors 'none'" in SECURITY_HEADERS["Content-Security-Policy"]
    assert "/v1/dashboard/fleet" in answers["/openapi.json"].json()["paths"]
    for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert httpx.get(server.url + page).status_code == 404, page


def test_the_gate_holds_reads_to_their_share_of_the_time_and_refuses_past_its_queue() -> None:
    """Three reads of 0.1 s through a gate with share 0.5 take 0.5 s (each but the last followed by as
    long a rest), one at a time; with the queue full the next read is refused (503, Retry-After)."""
    read = ReadPath(lambda token: False, ReadLimits(share=0.5, queue=1))
    running: list[int] = []

    def work() -> None:
        running.append(1)
        assert len(running) == 1, "two reads inside the gate at once"
        time.sleep(0.1)
        running.pop()

    async def three() -> tuple[float, int | None]:
        t0 = time.monotonic()
        async with anyio.create_task_group() as tasks:
            for _ in range(3):
                tasks.start_soon(read.run, work)
            await anyio.sleep(0.05)
            refused = read.refusal("someone")
        return time.monotonic() - t0, refused.status_code if refused else None

    elapsed, refused = anyio.run(three)
    assert 0.48 <= elapsed < 1.0, elapsed
    assert refused == 503


def test_read_limits_refuse_what_cannot_work() -> None:
    for bad in ({"share": 0.0}, {"share": 1.5}, {"concurrency": 0}, {"device_rate_per_s": 0.0}, {"admin_burst": 0}):
        with pytest.raises(ValueError, match="must be"):
            ReadLimits(**bad)  # type: ignore[arg-type]


def test_the_page_needs_nothing_its_policy_forbids() -> None:
    """The policy allows only the page's own files: so the page has no inline script or style, no
    style attribute, no file from elsewhere, and its script builds no code from strings."""
    html = (STATIC / "index.html").read_text()
    script = (STATIC / "dashboard.js").read_text().replace('"http://www.w3.org/2000/svg"', "SVG_NAMESPACE")
    assert re.findall(r"<script\b[^>]*>", html) == ['<script src="/static/dashboard.js">']
    assert "<style" not in html and not re.search(r"\sstyle=", html) and not re.search(r"\son[a-z]+=", html)
    assert set(re.findall(r'(?:src|href)="([^"#]+)"', html)) == {"/static/dashboard.css", "/static/dashboard.js"}
    for forbidden in ("eval(", "new Function", '"style"', "innerHTML", "http://", "https://"):
        assert forbidden not in script, forbidden


@pytest.mark.needs_broker
@pytest.mark.skipif(chromium is None, reason="apt-get install chromium")
@pytest.mark.browser
def test_the_page_runs_under_its_policy_in_a_browser(plain_server: ServerProc) -> None:
    """Chromium enforces the headers: the page signs in and goes live with no policy violation."""
    from playwright.sync_api import sync_playwright

    server = plain_server
    server.register("n1")
    violations: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
            page.goto(server.url)
            page.get_by_label("Token").fill((server.data / "admin.token").read_text().strip())
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_selector("#live.on", timeout=20_000)
            assert page.locator('[data-testid="devices-total"]').inner_text() == "1"
        finally:
            browser.close()
    assert violations == []


@pytest.mark.needs_broker
def test_a_token_over_its_read_rate_gets_429_with_retry_after(plain_server: ServerProc) -> None:
    """A device token asking for its dashboard view as fast as it can is refused past its burst (429,
    Retry-After, the limit named); its own device routes, and the admin, are not held up by that."""
    server = plain_server
    token = server.register("eager").read_text()
    device = {"Authorization": f"Bearer {token}"}
    with httpx.Client(timeout=30) as client:
        answers = [client.get(server.url + "/v1/dashboard/fleet", headers=device) for _ in range(40)]
        refused = [r for r in answers if r.status_code == 429]
        assert refused, [r.status_code for r in answers]
        assert {r.status_code for r in answers} == {200, 429}
        assert int(refused[0].headers["Retry-After"]) >= 1
        assert refused[0].json()["detail"].startswith("read rate limit: 5 requests/s (burst 20)")
        assert client.get(server.url + "/v1/devices/eager/result", headers=device).status_code == 200
        assert client.get(server.url + "/v1/bundles", headers=device).status_code == 200
        assert client.get(server.url + "/v1/dashboard/fleet", headers=server.admin).status_code == 200
        time.sleep(float(refused[-1].headers["Retry-After"]))
        assert client.get(server.url + "/v1/dashboard/fleet", headers=device).status_code == 200
    assert _metric(server, 'trickle_read_requests_total{outcome="rate_limited"}') == len(refused)


@pytest.mark.needs_broker
def test_concurrent_viewers_share_one_snapshot_computation(plain_server: ServerProc) -> None:
    """30 admin viewers and 10 of one device asking at once cost one snapshot per view (counted at
    /metrics), each viewer of a view getting the same one; a registration shows within the cache's
    time to live (2 s)."""
    server = plain_server
    names = [f"n{i}" for i in range(20)]
    tokens = {name: server.register(name).read_text() for name in names}
    _seed(server, names, 100)
    before = _metric(server, "trickle_dashboard_snapshots_total")
    start = threading.Barrier(40)
    answers: list[tuple[str, dict[str, Any]]] = []

    def view(who: str, headers: dict[str, str]) -> None:
        with httpx.Client(timeout=60) as client:
            start.wait()
            r = client.get(server.url + "/v1/dashboard/fleet", headers=headers)
            r.raise_for_status()
            answers.append((who, r.json()))

    viewers = [threading.Thread(target=view, args=("admin", server.admin)) for _ in range(30)]
    viewers += [threading.Thread(target=view, args=("n3", {"Authorization": f"Bearer {tokens['n3']}"})) for _ in range(10)]
    for t in viewers:
        t.start()
    for t in viewers:
        t.join()
    assert len(answers) == 40
    computed = _metric(server, "trickle_dashboard_snapshots_total") - before
    assert 2 <= computed <= 4, computed  # two views; a second round of each at most, had 2 s passed
    admin_views = {a["now_s"] for who, a in answers if who == "admin"}
    assert len(admin_views) <= 2 and all(a["totals"]["devices"] == 20 for who, a in answers if who == "admin")
    assert all(a["devices"] and a["devices"][0]["device"] == "n3" for who, a in answers if who == "n3")
    server.register("late")
    wait_for(lambda: httpx.get(server.url + "/v1/dashboard/fleet", headers=server.admin).json()["totals"]["devices"] == 21,
             5, "the new device in the snapshot")


def _device_p99(url: str, clients: list[tuple[str, str]], seconds: float) -> float:
    """Every device polls its newest 50 results and the bundle list every 0.1 s for ``seconds``
    (the bench's pollers, ``bench.link._device_calls``): the p99 of their calls."""
    from bench.link import _device_calls

    return float(np.percentile(asyncio.run(_device_calls(url, clients, seconds, pace_s=0.1)), 99))


@pytest.mark.needs_broker
@pytest.mark.slow
def test_device_routes_under_dashboard_load_stay_within_twice_idle(plain_server: ServerProc) -> None:
    """10 devices polling their own routes, alone and then with 20 dashboard clients asking as fast
    as they are answered (another process: admin fleet pages, the registry, 1,000-result queries,
    device details; device tokens loading their dashboards), three rounds interleaved: the devices'
    median p99 under load stays within twice the idle one (+ 30 ms for a shared CI machine;
    measured here: about 1.1x, and 3.4x before the read path was bounded)."""
    from bench.link import dashboard_clients

    server = plain_server
    names = [f"d{i}" for i in range(40)]
    tokens = [(name, server.register(name).read_text()) for name in names]
    _seed(server, names, 300)
    admin = (server.data / "admin.token").read_text().strip()
    spawn = multiprocessing.get_context("spawn")
    served = spawn.Array("q", 3)
    idle, load = [], []
    for _ in range(3):  # interleaved; medians: one round disturbed by the machine does not decide
        idle.append(_device_p99(server.url, tokens[:10], 4.0))
        stop = spawn.Event()
        viewers = spawn.Process(target=dashboard_clients, args=(server.url, admin, tokens[10:], 20, stop, served))
        viewers.start()
        try:
            time.sleep(1.0)
            load.append(_device_p99(server.url, tokens[:10], 4.0))
        finally:
            stop.set()
            viewers.join(60)
    assert served[0] > 100 and served[2] == 0, list(served)  # the dashboards were answered, none with an error
    assert np.median(load) <= 2 * np.median(idle) + 0.03, f"idle p99 {idle}, under dashboard load {load}"
