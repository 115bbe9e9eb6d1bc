"""The speculative-decoding benchmark runs end to end in its quick form (tiny target and drafts):
every key the issue names, every greedy method's output equal to the target's own greedy generate,
and its protocol: every speed-up against our own loop without a draft (transformers' ``generate``
a row of its own), each draft's mode picked on a separate selection run, the figures medians of
repeated interleaved runs, and a target measured earlier kept apart from the minimum."""

from __future__ import annotations

import json
from pathlib import Path

from bench import speculative


def test_quick_benchmark_writes_all_keys_and_is_lossless(tmp_path: Path, shared_data: str) -> None:
    # a section of an earlier run (its own protocol) that this run does not measure: kept, not in the minimum
    earlier = {"targets": {"base": {"shape": {"prompts": 1, "prompt_tokens": 4, "new_tokens": 2}, "rows": [],
                                    "target_parameters": 1.0, "target_val_loss": 1.0, "greedy_continuation": "",
                                    "moa_draft_vocabulary_sweep": [], "auto_speedup_vs_target": {"moa T=0": 0.5}}},
               "best_mode": {"base moa T=0": "chain"}}
    (tmp_path / "speculative-quick.json").write_text(json.dumps(earlier))
    out = speculative.main(quick=True, results_dir=tmp_path, docs_dir=tmp_path,
                           corpus=Path(shared_data) / "shakespeare" / "plays")
    doc = json.loads((tmp_path / "speculative-quick.json").read_text())
    for key in speculative.GOALS:
        assert isinstance(doc[key], float) and doc[key] > 0, key
    tiny = doc["targets"]["tiny"]
    assert set(tiny["draft_val_loss"]) == set(speculative.KINDS)
    assert all(tiny["greedy_outputs_equal_target_generate"].values()), tiny["greedy_outputs_equal_target_generate"]
    assert tiny["auto_sampled_outputs_equal_across_drafts"] and tiny["outputs_equal_across_runs"]
    assert min(doc["auto_speedup_vs_target_min"], doc["auto_speedup_vs_target_min_int8_drafts"]) == \
        min(doc["auto_speedup_vs_target"].values())
    assert len(doc["auto_speedup_vs_target"]) == 4 * len(speculative.KINDS)  # float32 and int8 drafts, two temperatures
    assert len(doc["targets"]["tiny"]["int8_draft_speedup_vs_fp32"]) == 2 * len(speculative.KINDS)
    assert "| moa " in (tmp_path / "speculative-quick.md").read_text()
    # the best draft is chosen on the selection run, not on the timed runs: it need not time above MoA there
    assert out["best_speedup_vs_target_greedy"] > 0 and out["moa_speedup_vs_target_greedy"] > 0
    # the earlier target's section is kept as it was, named as such, and stays out of the minimum
    assert doc["targets"]["base"] == earlier["targets"]["base"] and "before issue 48" in doc["measured"]["base"]
    assert doc["auto_speedup_vs_target_over"] == ["tiny"] and doc["best_mode"]["base moa T=0"] == "chain"

    # the baseline at both temperatures is our loop without a draft; transformers' generate is a row of its own
    rows, selection = tiny["rows"], tiny["selection_rows"]
    for t in (0.0, speculative.SAMPLING_T):
        plain = speculative._row(rows, speculative.PLAIN, "none", t)
        assert plain["speedup_vs_target"] == 1.0
    hf = speculative._row(rows, speculative.HF, "—", 0.0)
    assert hf["speedup_vs_target"] == tiny["hf_generate_speedup_vs_target"] != 1.0
    # every draft in every mode on the selection run; each draft's pick is its fastest there
    chosen = {(r["method"], r["mode"], r["temperature"]) for r in selection}
    for kind in speculative.KINDS:
        for t in (0.0, speculative.SAMPLING_T):
            assert {(kind, mode, t) for mode in speculative.MODES} <= chosen
            fastest = max((r for r in selection if r["method"] == kind and r["temperature"] == t),
                          key=lambda r: r["tokens_per_second"])
            assert doc["best_mode"][f"tiny {kind} T={t:g}"] == tiny["picked_mode"][f"{kind} T={t:g}"] == fastest["mode"]
            # measured: the pick and auto, as medians of the repeated runs
            for mode in {fastest["mode"], "auto"}:
                row = speculative._row(rows, kind, mode, t)
                low, high = row["speedup_vs_target_range"]
                assert row["runs"] == 2 and low <= row["speedup_vs_target"] <= high
    # the headline is the picked mode's measured median, not the best of the selection run's rows
    moa = speculative._row(rows, "moa", tiny["picked_mode"]["moa T=0"], 0.0)
    assert out["moa_speedup_vs_target_greedy"] == moa["speedup_vs_target"]
    assert doc["settings"]["repeats"] == 2 and doc["settings"]["protocol"] == speculative.PROTOCOL
