"""The simulator's report as one self-contained HTML page with interactive plots: nothing fetched
from elsewhere, the same bytes for the same seed, and it renders in a real browser."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from simulator.config import load_scenario, scenario_path
from simulator.fleet import simulate
from simulator.report import write_outputs


def _run(out: Path) -> Path:
    scenario = load_scenario(scenario_path("rf_scarce"), run={"duration_s": 1800.0, "seed": 3, "workers": 1},
                             nodes={"count": 3})
    write_outputs(simulate(scenario), out)
    return out / "report.html"


def test_the_html_report_is_self_contained_and_deterministic(tmp_path: Path) -> None:
    page = _run(tmp_path / "a").read_text()
    assert _run(tmp_path / "b").read_text() == page  # same seed, same bytes (fixed plot ids)
    assert not re.search(r"<script[^>]+src=", page)  # plotly.js is inlined, nothing is fetched
    for plot in ("plot-voltage", "plot-energy", "plot-cycles"):
        assert f'id="{plot}"' in page
    assert "power failures" in page and "rf_scarce" in page


@pytest.mark.browser
@pytest.mark.skipif(shutil.which("chromium") is None, reason="apt-get install chromium")
def test_the_html_report_draws_its_plots_in_a_browser(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    path = _run(tmp_path)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(path.as_uri())
        page.wait_for_selector("#plot-voltage .main-svg", timeout=20_000)
        assert page.locator(".js-plotly-plot").count() >= 3
        browser.close()
