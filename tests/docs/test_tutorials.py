"""The docs tier: every tutorial runs as written (on the small settings its ``<!-- test: -->`` lines
give), so the site cannot drift from the code. See ``tests/docs/tutorial.py`` for the conventions."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.core.files import data_root
from tests.docs.tutorial import reader_setup, run

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = sorted(p for p in (ROOT / "docs" / "tutorials").glob("*.md") if p.name != "index.md")


@pytest.mark.parametrize("page", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs_as_written(page: Path, tmp_path: Path) -> None:
    data = data_root()
    if not data.is_dir():
        pytest.skip(f"the data folder is not at {data} (set TRICKLE_DATA)")
    outcomes = run(page, tmp_path, reader_setup(tmp_path, data))
    assert outcomes, f"{page.name} runs nothing"
    for outcome in outcomes:
        print(f"{page.name}:{outcome.block.line} {outcome.block.language} {outcome.seconds:.1f} s")
