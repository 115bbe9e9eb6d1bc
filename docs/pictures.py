"""Draw the site's pictures with the project's own code: ``make docs-pictures`` (about a minute).

- ``images/architecture.png``: the tiers and what each may import, read from the import-linter
  contracts in ``pyproject.toml`` (the rules ``lint-imports`` enforces), not drawn by hand;
- ``images/voltage.png``: a node's capacitor voltage with its power failures, as ``trickle simulate``
  plots it (the bundled ``jit_checkpoint`` scenario, an hour);
- ``images/pareto.png``: a design's Pareto front, as ``trickle design`` plots it (the example spec);
- ``images/tutorial-voltage.png`` and ``tutorial-pareto.png``: the plots the tutorials "Simulate my
  node" and "Design my node" make, from running those pages as the docs tier does;
- ``images/dashboard.png`` and ``dashboard-device.png`` are taken by the dashboard's browser test:
  ``TRICKLE_SCREENSHOTS=docs/images pytest tests/server/api/test_dashboard.py``.

The same command gives the same bytes (the plots carry no version or date stamp).

``python docs/pictures.py --screenshots DIR`` builds the site and photographs a few of its pages in
Debian's chromium (through Playwright): what a reader sees, for a review or a closing note.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"


# what each tier holds (the contracts say only what it may import)
ROLES = {"trickle : bench": "the trickle command, the demo; benchmarks", "server": "HTTP API, MQTT bridge, store, jobs, LM",
         "export": "bundles, importers, the firmware build", "models": "data, NExUME, FIRMBOUND, design, LMs",
         "simulator": "SimPy nodes, fleets, reports", "edge": "device runtime, bundle contract, agent"}


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def architecture(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    contracts = _contracts()
    tiers = next(c for c in contracts if c["type"] == "layers" and "containers" not in c)["layers"]
    inner = {c["containers"][0]: c["layers"] for c in contracts if c["type"] == "layers" and "containers" in c}
    never = {}
    for c in contracts:
        if c["type"] == "forbidden":
            for source in c["source_modules"]:
                never.setdefault(source, []).extend(c["forbidden_modules"])
    fig, ax = plt.subplots(figsize=(11, 6.8))
    ax.set_xlim(0, 11)
    ax.set_ylim(-0.25, len(tiers) + 0.6)
    ax.axis("off")
    colours = ["#b2dfdb", "#c5cae9", "#ffe0b2", "#d7ccc8", "#c8e6c9", "#f8bbd0"]
    for i, tier in enumerate(tiers):
        y = len(tiers) - i - 0.55
        ax.add_patch(FancyBboxPatch((0.3, y - 0.36), 6.4, 0.72, boxstyle="round,pad=0.02", fc=colours[i % len(colours)],
                                    ec="#37474f"))
        names = " · ".join(t.strip() for t in tier.split(":"))
        ax.text(0.5, y + 0.14, names, fontsize=13, weight="bold", va="center")
        ax.text(6.55, y + 0.14, ROLES.get(tier, ""), fontsize=9, va="center", ha="right", style="italic", color="#37474f")
        layers = inner.get(tier.strip())
        if layers:
            ax.text(0.5, y - 0.17, "  >  ".join(layers), fontsize=9, va="center", family="monospace", color="#263238")
        rules = never.get(tier.strip())
        if rules:
            ax.text(7.0, y, "never imports:\n" + ", ".join(sorted(set(rules))), fontsize=8.5, va="center", color="#b71c1c",
                    wrap=True)
        if i < len(tiers) - 1:
            ax.add_patch(FancyArrowPatch((3.5, y - 0.36), (3.5, y - 0.64), arrowstyle="-|>", mutation_scale=12,
                                         color="#37474f"))
    ax.text(0.3, len(tiers) + 0.25, "A tier imports only the tiers below it; inside a tier, a sub-package only those "
            "right of it (a | b: siblings never import each other).", fontsize=9.5, color="#37474f")
    ax.text(0.3, -0.15, "Read from the import-linter contracts in pyproject.toml, which lint-imports checks on every "
            "make test.", fontsize=8.5, color="#607d8b")
    fig.tight_layout()
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _trickle(*args: str, cwd: Path) -> None:
    subprocess.run([str(Path(sys.executable).parent / "trickle"), *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL)


def voltage(out: Path, work: Path) -> None:
    _trickle("simulate", "--scenario", "jit_checkpoint", "--set", "run.duration_s=3600", "--set", "nodes.count=1",
             "--set", "nodes.record_traces=1", "--out", "sim", cwd=work)
    shutil.copy(work / "sim" / "plots" / "voltage.png", out)


def pareto(out: Path, work: Path) -> None:
    _trickle("design", str(ROOT / "examples" / "design" / "indoor_node.toml"), "--out", "design", "--workers", "2",
             cwd=work)
    shutil.copy(work / "design" / "pareto.png", out)


# page, and what to type into the search box first (None: the page as it opens)
PAGES = (("home", "index.html", None), ("tutorial-model-to-board", "tutorials/model-to-board.html", None),
         ("results", "results/index.html", None), ("search", "index.html", "power cuts"))


def screenshots(out: Path, chromium: str = "/usr/bin/chromium") -> None:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--quiet", "-d", str(site)],
                       cwd=ROOT, check=True, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "-d", str(site)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                for name, path, search in PAGES:
                    for _ in range(50):  # until the server answers
                        try:
                            page.goto(f"http://127.0.0.1:{port}/{path}")
                            break
                        except Exception:  # the server is still starting
                            page.wait_for_timeout(100)
                    page.wait_for_load_state("networkidle")
                    if search:
                        page.keyboard.press("/")
                        page.keyboard.type(search)
                        page.wait_for_selector(".md-search-result__item")
                    page.screenshot(path=str(out / f"{name}.png"))
                print(f"photographed {len(PAGES)} pages in chromium {browser.version} into {out}")
                browser.close()
        finally:
            server.terminate()


# tutorial page -> (a plot it writes, the picture it shows)
TUTORIAL_PLOTS = {"simulate-node.md": ("runs/my_node/plots/voltage.png", "tutorial-voltage.png"),
                  "design-node.md": ("runs/design/mine/pareto.png", "tutorial-pareto.png")}


def tutorial_plots(work: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from edge.core.files import data_root
    from tests.docs.tutorial import reader_setup, run

    for page, (plot, picture) in TUTORIAL_PLOTS.items():
        folder = work / page.removesuffix(".md")
        folder.mkdir()
        run(ROOT / "docs" / "tutorials" / page, folder, reader_setup(folder, data_root()))
        shutil.copy(folder / plot, IMAGES / picture)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--screenshots", type=Path, metavar="DIR", help="photograph the built site's pages instead")
    args = parser.parse_args()
    if args.screenshots:
        screenshots(args.screenshots)
        return
    IMAGES.mkdir(parents=True, exist_ok=True)
    architecture(IMAGES / "architecture.png")
    with tempfile.TemporaryDirectory() as tmp:
        voltage(IMAGES / "voltage.png", Path(tmp))
        pareto(IMAGES / "pareto.png", Path(tmp))
        tutorial_plots(Path(tmp))
    print(f"wrote {', '.join(p.name for p in sorted(IMAGES.glob('*.png')))} in {IMAGES}")


if __name__ == "__main__":
    main()
