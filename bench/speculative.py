"""Speculative decoding benchmark: tokens/s of every draft against the target alone, batch 1, CPU,
one torch thread, prompts from the held-out plays, all methods in the same run.

    trickle bench speculative [--quick]

Full: the target is ``runs/lm/base`` (``trickle train lm --size base``; refused with one line when
missing) and the drafts ``runs/lm/draft-{moa,eagle,independent}``, trained here first when
missing (``DRAFT_MINUTES`` each, same data and budget). 128 new tokens per prompt. Quick: a tiny
target and drafts trained for seconds, 32 new tokens: a smoke run of the whole path, whose
figures mean nothing.

Methods: the target alone (transformers' greedy ``generate``, and our verify loop with no draft,
which is also the sampling baseline); transformers' assisted generation with the independent
draft (``assistant_model``); and our loop with each draft, chain drafting, K = ``K``.
Results: ``bench/results/speculative.json`` and the table ``docs/results/speculative.md``.
"""

from __future__ import annotations

import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from edge.errors import ConfigError
from edge.files import data_root, write_atomic
from edge.tables import markdown_table

RESULTS = Path(__file__).parent / "results"
DOCS = Path(__file__).parent.parent / "docs" / "results"
RUNS = Path("runs") / "lm"
K = 4
DRAFT_MINUTES = 8.0
KINDS = ("moa", "eagle", "independent")
GOALS = {
    "moa_speedup_vs_target_greedy": (">=", 2.0),
    "moa_speedup_vs_hf_assisted": (">=", 1.25),
    "moa_speedup_vs_eagle_style": (">=", 1.05),
    "moa_accept_length_greedy": (">=", 3.5),
    "moa_speedup_vs_target_sampling": (">=", 1.5),
}


def _prompts(tok: Any, corpus: Path, n: int, tokens: int) -> list[list[int]]:
    """``n`` prompts of ``tokens`` tokens from the middle of the held-out plays."""
    from models.lm import find_plays, read_texts

    held = read_texts(find_plays(corpus).held_out)
    out = []
    for i in range(n):
        text = held[i % len(held)]
        start = len(text) * (i + 1) // (n + 2)
        ids = tok(text[start : start + 20 * tokens]).input_ids[:tokens]
        out.append(ids)
    return out


def _time(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0


def _run(method: str, target: Any, drafter: Any, prompts: list[list[int]], new: int, temperature: float) -> dict[str, Any]:
    from models.speculative import speculative_generate

    tokens = calls = 0
    seconds = 0.0
    outputs = []
    for i, prompt in enumerate(prompts):
        (out, stats), wall = _time(lambda p=prompt, s=i: speculative_generate(target, drafter, p, new, k=K,
                                                                              temperature=temperature, seed=s))
        tokens, calls, seconds = tokens + len(out), calls + stats.target_calls, seconds + wall
        outputs.append(out)
    return {"method": method, "temperature": temperature, "tokens": tokens, "seconds": seconds,
            "tokens_per_second": tokens / seconds, "accept_length": tokens / calls, "target_calls_per_token": calls / tokens,
            "outputs": outputs}


def _hf(method: str, target: Any, prompts: list[list[int]], new: int, assistant: Any = None) -> dict[str, Any]:
    tokens, seconds, outputs = 0, 0.0, []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        kwargs = {"assistant_model": assistant} if assistant is not None else {}
        # eos_token_id=None: exactly `new` tokens, as the verify loop makes (no EOS stop, no EOS suppression)
        out, wall = _time(lambda i=ids, kw=kwargs: target.generate(i, attention_mask=torch.ones_like(i), max_new_tokens=new,
                                                                   do_sample=False, eos_token_id=None,
                                                                   pad_token_id=target.config.pad_token_id, **kw))
        tokens, seconds = tokens + out.shape[1] - len(prompt), seconds + wall
        outputs.append(out[0, len(prompt):].tolist())
    return {"method": method, "temperature": 0.0, "tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds,
            "accept_length": None, "target_calls_per_token": None, "outputs": outputs}


def _models(quick: bool, work: Path, corpus: Path) -> tuple[Path, dict[str, Path]]:
    from models.draft import train_draft
    from models.lm import LMConfig, train_lm

    if quick:
        target = work / "target"
        train_lm(LMConfig.model_validate({"size": "tiny", "steps": 200}), corpus, target)
        drafts = {kind: work / kind for kind in KINDS}
        for kind, folder in drafts.items():
            train_draft(target, kind, corpus, folder, steps=100)  # type: ignore[arg-type]
        return target, drafts
    target = RUNS / "base"
    if not (target / "train.json").is_file():
        raise ConfigError("target", str(target), "train it first: trickle train lm --size base --out runs/lm/base")
    drafts = {kind: RUNS / f"draft-{kind}" for kind in KINDS}
    for kind, folder in drafts.items():
        if not (folder / "draft.json").is_file():
            print(f"training the {kind} draft for {DRAFT_MINUTES:g} min ...", flush=True)
            train_draft(target, kind, corpus, folder, steps=10**9, minutes=DRAFT_MINUTES)  # type: ignore[arg-type]
    return target, drafts


def main(quick: bool = False, results_dir: Path = RESULTS, docs_dir: Path = DOCS, corpus: Path | None = None) -> dict[str, Any]:
    from models.draft import load_drafter, load_target
    from models.speculative import NoDrafter

    torch.set_num_threads(1)
    corpus = corpus or data_root() / "shakespeare" / "plays"
    n_prompts, prompt_tokens, new = (3, 24, 32) if quick else (8, 64, 128)
    with tempfile.TemporaryDirectory() as tmp:
        target_dir, draft_dirs = _models(quick, Path(tmp), corpus)
        target, tok = load_target(target_dir)
        prompts = _prompts(tok, corpus, n_prompts, prompt_tokens)
        drafters = {kind: load_drafter(folder, target) for kind, folder in draft_dirs.items()}
        summaries = {kind: json.loads((folder / "draft.json").read_text()) for kind, folder in draft_dirs.items()}
        independent = drafters["independent"].lm.model  # type: ignore[attr-defined]  # an IndependentDrafter
        rows = [_hf("target (transformers generate)", target, prompts, new),
                _run("target (verify loop, no draft)", target, NoDrafter(), prompts, new, 0.0),
                _hf("hf assisted (independent draft)", target, prompts, new, assistant=independent)]
        rows += [_run(kind, target, drafters[kind], prompts, new, 0.0) for kind in KINDS]
        rows += [_run("target (verify loop, no draft)", target, NoDrafter(), prompts, new, 0.8),
                 _run("moa", target, drafters["moa"], prompts, new, 0.8)]
        target_val = json.loads((target_dir / "train.json").read_text())["val_loss"]
    greedy = rows[0]["outputs"]
    lossless = {r["method"]: r["outputs"] == greedy for r in rows if r["temperature"] == 0}
    by = {(r["method"], r["temperature"]): r for r in rows}
    moa, moa_s = by[("moa", 0.0)], by[("moa", 0.8)]
    out: dict[str, Any] = {
        "moa_speedup_vs_target_greedy": moa["tokens_per_second"] / rows[0]["tokens_per_second"],
        "moa_speedup_vs_hf_assisted": moa["tokens_per_second"] / rows[2]["tokens_per_second"],
        "moa_speedup_vs_eagle_style": moa["tokens_per_second"] / by[("eagle", 0.0)]["tokens_per_second"],
        "moa_accept_length_greedy": moa["accept_length"],
        "moa_speedup_vs_target_sampling":
            moa_s["tokens_per_second"] / by[("target (verify loop, no draft)", 0.8)]["tokens_per_second"],
        "target_val_loss": target_val,
        "draft_val_loss": {kind: s["val_loss"] for kind, s in summaries.items()},
        "draft_trainable_parameters": {kind: s["trainable_parameters"] for kind, s in summaries.items()},
        "greedy_outputs_equal_target_generate": lossless,
        "rows": [{k: v for k, v in r.items() if k != "outputs"} for r in rows],
        "settings": {"k": K, "prompts": n_prompts, "prompt_tokens": prompt_tokens, "new_tokens": new, "threads": 1},
        "goals": {k: f"{op} {g:g}" for k, (op, g) in GOALS.items()}, "quick": quick,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    table = markdown_table(["method", "T", "tokens/s", "accept length", "target calls / token"],
                           [(r["method"], f"{r['temperature']:g}", f"{r['tokens_per_second']:.1f}",
                             "—" if r["accept_length"] is None else f"{r['accept_length']:.2f}",
                             "—" if r["target_calls_per_token"] is None else f"{r['target_calls_per_token']:.2f}")
                            for r in rows], align="lrrrr")
    print(table)
    for key, (op, goal) in GOALS.items():
        ok = out[key] >= goal if op == ">=" else out[key] <= goal
        print(f"{key:34s} {out[key]:8.3f}  {'✔' if ok else '✘'} (goal {op} {goal:g})")
    suffix = "-quick" if quick else ""
    write_atomic(results_dir / f"speculative{suffix}.json", json.dumps(out, indent=1, sort_keys=True) + "\n")
    write_atomic(docs_dir / f"speculative{suffix}.md", "# Speculative decoding (`trickle bench speculative`)\n\n"
                 f"Batch 1, CPU, one thread, chain drafting with K = {K}, {n_prompts} held-out prompts of {prompt_tokens} "
                 f"tokens, {new} new tokens.\n\n" + table + "\n")
    print(f"wrote {results_dir / f'speculative{suffix}.json'}")
    return out
