"""The dashboard in a real browser (Playwright driving Debian's chromium): a simulated fleet reports
live while the page is open, and the numbers on the page must equal the database's; an OTA
assignment is made through the page; 1,000 devices page without freezing. Screenshots land in
the test's folder (and in $TRICKLE_SCREENSHOTS when set: how docs/dashboard*.png are made)."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import TrainedBundle
from tests.server.conftest import Bundles, ServerProc, wait_for

chromium = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(chromium is None, reason="apt-get install chromium")


@pytest.fixture
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield b
        b.close()


def _screenshot(page: Any, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / name), full_page=True)
    target = os.environ.get("TRICKLE_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / name, Path(target) / name)


def _sign_in(page: Any, server: ServerProc, token: str) -> None:
    page.goto(server.url)
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector("#live.on", timeout=20_000)


def _number(page: Any, testid: str) -> str:
    return str(page.locator(f'[data-testid="{testid}"]').inner_text())


def _simulated_fleet(bundles: Bundles, nodes: int, traces: int = 3, scenario: str | None = None) -> Any:
    from edge.classify.runtime import Runtime
    from edge.contract.bundle import read_bundle
    from simulator.bundle_model import inference_model
    from simulator.config import load_scenario, scenario_path
    from simulator.fleet import simulate

    bundle = read_bundle(bundles.v1)
    with np.load(bundles.source) as data:
        raw, y = data["x"], data["y"]
    runtime = Runtime(bundle)
    model = inference_model(bundle, np.stack([runtime.preprocess(r) for r in raw]), y)
    config = load_scenario(scenario and scenario_path(scenario), name="dash",
                           run={"duration_s": 8 * 3600.0, "seed": 0, "workers": 1},
                           nodes={"count": nodes, "record_traces": traces})
    return bundle, simulate(config, model=model)


def test_the_page_shows_what_the_database_holds_live_and_assigns_a_bundle(embedded_server: ServerProc, bundles: Bundles,
                                                                           browser: Any, tmp_path: Path,
                                                                           trained_bundle: TrainedBundle) -> None:
    from simulator.live import publish

    server = embedded_server
    admin_token = (server.data / "admin.token").read_text().strip()
    bundle, result = _simulated_fleet(bundles, nodes=12)
    up = httpx.post(server.url + "/v1/bundles", content=bundles.v1.read_bytes(), headers=server.admin, timeout=60)
    assert up.status_code == 201, up.text
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    _sign_in(page, server, admin_token)
    assert _number(page, "devices-total") == "0"
    # the fleet reports while the page is open: the page follows without a reload
    done: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: done.setdefault("report", publish(
        result, server.url, server.broker_url, admin_token, "dash", bundle.manifest.labels, 1, tmp_path / "live")))
    worker.start()
    worker.join(300)
    assert "report" in done, "publishing did not finish"
    results = {f"dash-n{r.node_id}": server.messages(f"dash-n{r.node_id}", "result") for r in result.nodes}
    total = sum(len(v) for v in results.values())
    labelled = [m for v in results.values() for m in v if m["correct"] is not None]
    assert total > 50
    wait_for(lambda: _number(page, "results-total") == str(total), 30, f"the page to show {total} results")
    assert _number(page, "devices-total") == str(len(server_devices(server)))
    # two clocks kept apart: 8 h of the devices' own time arrived in seconds of the server's, and every
    # device signed off when it was done: offline, heard from seconds ago, its last report at 8 h
    device_hour = {device: _last_device_hour(stored, server.messages(device, "telemetry"))
                   for device, stored in results.items()}
    assert 0 < sum(device_hour.values()) < total
    wait_for(lambda: _number(page, "devices-signed-off") == "12", 30, "every device signed off")
    assert _number(page, "results-hour") == str(sum(device_hour.values()))
    assert "device time" in page.locator(".card", has=page.locator('[data-testid="results-hour"]')).inner_text()
    assert _number(page, "results-received-hour") == str(total)  # all of them arrived just now
    assert _number(page, "devices-online") == "0"
    assert _number(page, "accuracy") == f"{100 * sum(m['correct'] for m in labelled) / len(labelled):.1f} %"
    for device, stored in list(results.items())[:3]:
        row = page.locator(f'tr[data-device="{device}"] td')
        assert row.nth(2).inner_text() == "offline (signed off)"
        assert re.fullmatch(r"\d+ s ago", row.nth(3).inner_text())  # heard from: the server's clock
        assert row.nth(4).inner_text() == "t = 8.00 h (simulated)"  # its last report: its own clock
        assert row.nth(8).inner_text() == f"{device_hour[device]} / {len(stored)}"
        assert row.nth(5).inner_text() == "1"  # the bundle its results report
    _screenshot(page, tmp_path, "dashboard.png")

    # an OTA assignment through the page, refused first for a fleet that does not exist
    page.get_by_label("Target").fill("fleet:nowhere")
    page.get_by_label("Bundle version").select_option("1")
    page.get_by_role("button", name="Assign").click()
    wait_for(lambda: "refused" in page.locator("#ota-result").inner_text(), 20, "the refusal")
    page.get_by_label("Target").fill("fleet:dash")
    page.get_by_role("button", name="Assign").click()
    wait_for(lambda: "assigned v1 to fleet:dash" in page.locator("#ota-result").inner_text(), 20, "the assignment")
    assert httpx.get(server.url + "/v1/assignments", headers=server.admin).json() == {"fleet:dash": 1}
    wait_for(lambda: page.locator('tr[data-device="dash-n0"] td').nth(7).inner_text() == "up to date", 30,
             "the OTA column")

    # a job (no workers here: it waits in the queue) shows up live and is cancelled from the page
    checkpoint = trained_bundle("digits", "nexume", epochs=3).checkpoint.read_bytes()
    teacher = httpx.post(server.url + "/v1/checkpoints", content=checkpoint, headers=server.admin, timeout=60).json()
    spec = {"kind": "distill", "teacher": teacher["teacher"], "dataset": "digits", "keep_ratio": 0.3, "selection": "random"}
    job_id = httpx.post(server.url + "/v1/jobs", json=spec, headers=server.admin, timeout=10).json()["id"]
    row = page.locator(f'tr[data-job="{job_id}"] td')
    wait_for(lambda: row.count() and row.nth(3).inner_text() == "queued", 30, "the queued job on the page")
    assert row.nth(2).inner_text() == "digits, random 30%"
    page.get_by_role("button", name=f"cancel job {job_id}").click()
    wait_for(lambda: row.nth(3).inner_text() == "cancelled", 30, "the job cancelled on the page")
    assert httpx.get(f"{server.url}/v1/jobs/{job_id}", headers=server.admin).json()["state"] == "cancelled"

    # one device's page
    page.get_by_role("link", name="dash-n0", exact=True).click()
    wait_for(lambda: _number(page, "device-results") == str(len(results["dash-n0"])), 20, "the device page")
    telemetry = server.messages("dash-n0", "telemetry")
    assert _number(page, "device-failures") == str(telemetry[-1]["power_cycles"])
    _screenshot(page, tmp_path, "dashboard-device.png")

    # a device's own token shows that device only, and no registry
    device_token = _device_token(tmp_path / "live", "dash-n1")
    page2 = browser.new_page()
    _sign_in(page2, server, device_token)
    wait_for(lambda: _number(page2, "devices-total") == "1", 20, "the device's own view")
    assert page2.locator("tbody#devices tr").count() == 1 and page2.locator("#admin-only").is_hidden()


def _last_device_hour(results: list[dict[str, Any]], telemetry: list[dict[str, Any]]) -> int:
    """A simulated device's results within the hour up to its newest report, by its own clock."""
    newest = max(m["ts_s"] for m in [*results, *telemetry])
    return sum(m["ts_s"] > newest - 3600.0 for m in results)


def server_devices(server: ServerProc) -> list[dict[str, Any]]:
    return list(httpx.get(server.url + "/v1/devices", headers=server.admin).json())


def _device_token(state_dir: Path, device: str) -> str:
    """The token simulator.live registered for a device (kept in its state folder)."""
    return str(json.loads((state_dir / "tokens.json").read_text())[device])


def test_a_thousand_devices_page_without_freezing(embedded_server: ServerProc, browser: Any, tmp_path: Path) -> None:
    server = embedded_server
    with httpx.Client(base_url=server.url, headers=server.admin, timeout=30) as client:
        for i in range(1000):
            client.post("/v1/devices", json={"device": f"n{i:04d}", "fleet": f"f{i % 7}"}).raise_for_status()
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    _sign_in(page, server, (server.data / "admin.token").read_text().strip())
    wait_for(lambda: _number(page, "devices-total") == "1000", 20, "1000 devices")
    assert page.locator("tbody#devices tr").count() == 50 and _number(page, "page-range") == "1–50 of 1000"
    page.get_by_role("button", name="next page").click()
    wait_for(lambda: _number(page, "page-range") == "51–100 of 1000", 20, "the second page")
    assert page.locator("tbody#devices tr").first.get_attribute("data-device") == "n0050"
    page.get_by_label("Filter").fill("n09")
    wait_for(lambda: _number(page, "page-range") == "1–50 of 100", 20, "the filter")
    # the page stays responsive: a script task answers at once while the stream keeps pushing
    waited_ms = page.evaluate("() => new Promise(r => { const t = performance.now(); "
                              "setTimeout(() => r(performance.now() - t), 0); })")
    assert waited_ms < 200


def test_a_simulated_fleet_reads_in_its_own_time_and_matches_its_results_json(
        embedded_server: ServerProc, bundles: Bundles, browser: Any, tmp_path: Path) -> None:
    """A simulate --live fleet publishes 8 virtual hours in seconds: its charts count them on a
    simulated-time axis of their own (not one receipt-time bar), every axis has a title and units,
    the voltage axis never magnifies a small change into a cliff, devices sort as people count,
    and each device's power failures and on-time equal the simulation's results.json."""
    from simulator.live import publish
    from simulator.report import write_outputs

    server = embedded_server
    admin_token = (server.data / "admin.token").read_text().strip()
    bundle, result = _simulated_fleet(bundles, nodes=12, traces=12, scenario="rf_scarce")
    write_outputs(result, tmp_path / "sim", plots=False)
    expected = {f"dash-n{n['node_id']}": n for n in json.loads((tmp_path / "sim" / "results.json").read_text())["nodes"]}
    assert sum(n["power_cycles"] > 100 for n in expected.values()) >= 3  # nodes that live on the edge
    seen: list[tuple[str, int, int]] = []
    report = publish(result, server.url, server.broker_url, admin_token, "dash", bundle.manifest.labels, 1,
                     tmp_path / "live", progress=lambda stage, done, total: seen.append((stage, done, total)))
    # each device's backlog was queued in one step, then acknowledged to the last message
    queued = [s for s in seen if s[0] == "queued"]
    assert len(queued) == 12 and queued[-1] == ("queued", report.messages, report.messages)
    assert [s for s in seen if s[0] == "acknowledged"][-1] == ("acknowledged", report.messages, report.messages)

    page = browser.new_page(viewport={"width": 1366, "height": 900})
    _sign_in(page, server, admin_token)
    wait_for(lambda: page.locator("tbody#devices tr").count() == 12, 30, "12 devices")
    order = [page.locator("tbody#devices tr").nth(k).get_attribute("data-device") for k in range(12)]
    assert order == [f"dash-n{k}" for k in range(12)]  # n2 before n10
    for device, node in expected.items():
        row = page.locator(f'tr[data-device="{device}"] td')
        wait_for(lambda: row.nth(10).inner_text() != "–", 20, f"{device}'s telemetry")
        assert row.nth(10).inner_text() == str(node["power_cycles"])
        assert float(row.nth(11).get_attribute("data-seconds")) == pytest.approx(node["on_time_s"], rel=1e-12)
    # results over the fleet's own 8 h, on a simulated-time axis
    figure = page.locator('#results-charts figure[data-clock="virtual"]')
    assert "simulated time" in figure.locator("figcaption").inner_text()
    assert figure.locator("text.x-title").text_content() == "simulated time (h since the start)"
    assert figure.locator("text.y-title").text_content() == "results"
    heights = [float(h) for h in figure.locator("rect.bar").evaluate_all("bars => bars.map(b => b.getAttribute('height'))")]
    assert len(heights) >= 24 and sum(h > 0 for h in heights) >= 12
    assert page.locator('#results-charts figure[data-clock="wall"]').count() == 0
    _screenshot(page, tmp_path, "dashboard-simulated.png")

    # one device: its axes, a voltage range no narrower than 0.5 V, its figures
    page.goto(f"{server.url}/#/device/dash-n3")
    node = expected["dash-n3"]
    wait_for(lambda: _number(page, "device-failures") == str(node["power_cycles"]), 20, "the device page")
    voltage = page.locator("svg#voltage")
    wait_for(lambda: voltage.locator("polyline.series").count() == 1, 20, "the voltage chart")
    assert float(voltage.get_attribute("data-y-max")) - float(voltage.get_attribute("data-y-min")) >= 0.5
    assert voltage.locator("text.y-title").text_content() == "voltage (V)"
    for chart in ("voltage", "failures", "timeline"):
        assert page.locator(f"svg#{chart} text.x-title").text_content().startswith("simulated time")
        assert page.locator(f"svg#{chart} text.x-tick").count() >= 3
    assert page.locator("svg#failures text.y-title").text_content() == "power failures"
    _screenshot(page, tmp_path, "dashboard-simulated-device.png")

    # an unknown route and a device that cannot exist: a plain "not found"
    for hash_ in ("#/nowhere", "#/device/no%20such!", "#/device/dash-n99"):
        page.goto(f"{server.url}/{hash_}")
        wait_for(lambda: page.locator("#not-found").is_visible(), 20, f"not found for {hash_}")
        assert "[object Object]" not in page.locator("main").inner_text()
        assert page.locator("#fleet-view").is_hidden() and page.locator("#device-view").is_hidden()
        assert page.locator("#error").is_hidden()
