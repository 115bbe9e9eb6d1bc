"""The speculative-decoding benchmark runs end to end in its quick form (tiny target and drafts):
every key the issue names, and every greedy method's output equal to the target's own greedy generate."""

from __future__ import annotations

import json
from pathlib import Path

from bench import speculative


def test_quick_benchmark_writes_all_keys_and_is_lossless(tmp_path: Path, shared_data: str) -> None:
    out = speculative.main(quick=True, results_dir=tmp_path, docs_dir=tmp_path,
                           corpus=Path(shared_data) / "shakespeare" / "plays")
    doc = json.loads((tmp_path / "speculative-quick.json").read_text())
    for key in speculative.GOALS:
        assert isinstance(doc[key], float) and doc[key] > 0, key
    tiny = doc["targets"]["tiny"]
    assert set(tiny["draft_val_loss"]) == set(speculative.KINDS)
    assert all(tiny["greedy_outputs_equal_target_generate"].values()), tiny["greedy_outputs_equal_target_generate"]
    assert tiny["auto_sampled_outputs_equal_across_drafts"]
    assert min(doc["auto_speedup_vs_target_min"], doc["auto_speedup_vs_target_min_int8_drafts"]) == \
        min(doc["auto_speedup_vs_target"].values())
    assert len(doc["auto_speedup_vs_target"]) == 4 * len(speculative.KINDS)  # float32 and int8 drafts, two temperatures
    assert len(doc["targets"]["tiny"]["int8_draft_speedup_vs_fp32"]) == 2 * len(speculative.KINDS)
    assert "| moa " in (tmp_path / "speculative-quick.md").read_text()
    assert out["best_speedup_vs_target_greedy"] >= out["moa_speedup_vs_target_greedy"]
    measured = {(r["method"], r["mode"], r["temperature"]) for r in tiny["rows"]}
    for kind in speculative.KINDS:  # every draft in every mode, greedy and sampling
        assert {(kind, mode, t) for mode in speculative.MODES for t in (0.0, speculative.SAMPLING_T)} <= measured
