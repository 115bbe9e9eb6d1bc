"""The NExUME benchmark runs end to end on one small dataset and reports the keys the issue names."""

from __future__ import annotations

import json
from pathlib import Path

from bench import nexume


def test_small_nexume_benchmark(tmp_path: Path) -> None:
    out = nexume.main(quick=True, results_dir=tmp_path, docs_dir=tmp_path, datasets=("basic_motions",), seeds=(0,), epochs=2)
    doc = json.loads((tmp_path / "nexume-quick.json").read_text())
    for key in nexume.GOALS:
        assert key in doc
    rows = doc["table"]
    assert {r["source"] for r in rows} >= {"rf", "piezo", "continuous"}
    for r in rows:
        for m in nexume.METHODS:
            acc = r[f"{m}_accuracy_within_deadline"]["mean"]
            assert 0.0 <= acc <= 1.0
    assert out["training_time_ratio_vs_qat"] > 0
    assert "| basic_motions | continuous |" in (tmp_path / "nexume-quick.md").read_text()
