"""The export benchmark runs end to end in its quick form and reports every key the issue names."""

from __future__ import annotations

import json
from pathlib import Path

from bench import export as bench


def test_quick_benchmark_writes_all_keys(tmp_path: Path) -> None:
    out = bench.main(quick=True, results_dir=tmp_path)
    doc = json.loads((tmp_path / "export-quick.json").read_text())
    for key in bench.GOALS:
        assert key in doc, key
    assert doc["quick"] is True and doc["edge_install_size_ratio"] is None
    (digits,) = out["datasets"]
    formats = {(r["variant"], r["format"]) for r in digits["rows"]}
    for fmt in ("torch-eager", "onnx", "pte-xnnpack", "pte-portable", "tflite"):
        assert ("fp32-d00", fmt) in formats
    assert ("int8-d00", "onnx-int8") in formats
    assert all(r["latency_s"] > 0 for r in digits["rows"])
    # the float formats all agree with PyTorch (the export's parity check), so their accuracy is one number
    assert len({r["accuracy"] for r in digits["rows"] if r["variant"] == "fp32-d00"}) == 1
