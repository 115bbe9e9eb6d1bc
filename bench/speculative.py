"""Speculative decoding benchmark: tokens/s of every draft against the target alone, batch 1, CPU,
one torch thread, prompts from the held-out plays, all methods in the same run.

    trickle bench speculative [--quick]

Full: the target is ``runs/lm/base`` (``trickle train lm --size base``; refused with one line when
missing) and the drafts ``runs/lm/draft-{moa,eagle,independent}``, trained here first when
missing (``DRAFT_STEPS`` each: same data, same budget). 128 new tokens per prompt. Quick: a tiny
target and drafts trained for seconds, 32 new tokens: a smoke run of the whole path, whose
figures mean nothing.

Methods: the target alone (transformers' greedy ``generate``, and our verify loop with no draft,
which is also the sampling baseline); transformers' assisted generation with the independent
draft (``assistant_model``, its own draft-length schedule); and our loop with each draft in three
modes — a chain of ``K`` tokens, a chain of adaptive length (at most ``K_MAX``), and a tree
(``TREE``) — greedy and at T = 0.8. A draft's headline figure is its best mode per temperature,
all modes measured in the same run (every row is in the JSON and the table).
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

from edge.core.errors import ConfigError
from edge.core.files import data_root, write_atomic
from edge.core.tables import markdown_table

RESULTS = Path(__file__).parent / "results"
DOCS = Path(__file__).parent.parent / "docs" / "results"
RUNS = Path("runs") / "lm"
K, K_MAX = 5, 8
TREE = (5, 2, 2)  # depth, branch, width (models.lm.speculative.Tree)
MODES = ("chain", "adaptive", "tree")
DRAFT_STEPS = 400
SAMPLING_T = 0.8
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
    from models.lm.target import find_plays, read_texts

    held = read_texts(find_plays(corpus).held_out)
    out = []
    for i in range(n):
        text = held[i % len(held)]
        start = len(text) * (i + 1) // (n + 2)
        ids = tok.backend_tokenizer.encode(text[start : start + 20 * tokens]).ids[:tokens]  # no "too long" warning
        out.append(ids)
    return out


def _time(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0


def _run(method: str, mode: str, target: Any, drafter: Any, prompts: list[list[int]], new: int,
         temperature: float) -> dict[str, Any]:
    from models.lm.speculative import Tree, speculative_generate

    modes: dict[str, dict[str, Any]] = {"chain": {"k": K}, "adaptive": {"k": K_MAX, "adaptive": True},
                                        "tree": {"tree": Tree(*TREE)}, "none": {}}
    how = modes[mode]
    tokens = calls = 0
    seconds = 0.0
    outputs = []
    for i, prompt in enumerate(prompts):
        (out, stats), wall = _time(lambda p=prompt, s=i: speculative_generate(target, drafter, p, new, temperature=temperature,
                                                                              seed=s, **how))
        tokens, calls, seconds = tokens + len(out), calls + stats.target_calls, seconds + wall
        outputs.append(out)
    return {"method": method, "mode": mode, "temperature": temperature, "tokens": tokens, "seconds": seconds,
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
    return {"method": method, "mode": "—", "temperature": 0.0, "tokens": tokens, "seconds": seconds,
            "tokens_per_second": tokens / seconds,
            "accept_length": None, "target_calls_per_token": None, "outputs": outputs}


def _models(quick: bool, work: Path, corpus: Path) -> tuple[Path, dict[str, Path]]:
    from models.lm.draft import train_draft
    from models.lm.target import LMConfig, train_lm

    if quick:
        target = work / "target"
        train_lm(LMConfig.model_validate({"size": "tiny", "steps": 200}), corpus, target)
        drafts = {kind: work / kind for kind in KINDS}
        for kind, folder in drafts.items():
            train_draft(target, kind, corpus, folder, steps=100, checkpoint_minutes=60)  # type: ignore[arg-type]
        return target, drafts
    target = RUNS / "base"
    if not (target / "train.json").is_file():
        raise ConfigError("target", str(target), "train it first: trickle train lm --size base --out runs/lm/base")
    drafts = {kind: RUNS / f"draft-{kind}" for kind in KINDS}
    for kind, folder in drafts.items():
        if not (folder / "draft.json").is_file():
            print(f"training the {kind} draft for {DRAFT_STEPS} steps ...", flush=True)
            train_draft(target, kind, corpus, folder, steps=DRAFT_STEPS)  # type: ignore[arg-type]
    return target, drafts


def _best(rows: list[dict[str, Any]], method: str, temperature: float) -> dict[str, Any]:
    return max((r for r in rows if r["method"] == method and r["temperature"] == temperature),
               key=lambda r: r["tokens_per_second"])


def main(quick: bool = False, results_dir: Path = RESULTS, docs_dir: Path = DOCS, corpus: Path | None = None) -> dict[str, Any]:
    from models.lm.draft import load_drafter, load_target
    from models.lm.speculative import NoDrafter

    torch.set_num_threads(1)
    corpus = corpus or data_root() / "shakespeare" / "plays"
    n_prompts, prompt_tokens, new = (2, 24, 32) if quick else (10, 64, 128)
    with tempfile.TemporaryDirectory() as tmp:
        target_dir, draft_dirs = _models(quick, Path(tmp), corpus)
        target, tok = load_target(target_dir)
        prompts = _prompts(tok, corpus, n_prompts, prompt_tokens)
        drafters = {kind: load_drafter(folder, target) for kind, folder in draft_dirs.items()}
        summaries = {kind: json.loads((folder / "draft.json").read_text()) for kind, folder in draft_dirs.items()}
        independent = drafters["independent"].lm.model  # type: ignore[attr-defined]  # an IndependentDrafter
        rows = [_hf("target alone (transformers generate)", target, prompts, new),
                _hf("transformers assisted (independent draft)", target, prompts, new, assistant=independent)]
        for temperature in (0.0, SAMPLING_T):
            rows.append(_run("target alone (verify loop)", "none", target, NoDrafter(), prompts, new, temperature))
            rows += [_run(kind, mode, target, drafters[kind], prompts, new, temperature) for kind in KINDS for mode in MODES]
        target_doc = json.loads((target_dir / "train.json").read_text())
    greedy = rows[0]["outputs"]
    lossless = {f"{r['method']} ({r['mode']})": r["outputs"] == greedy for r in rows if r["temperature"] == 0}
    plain = {t: next(r for r in rows if r["method"] == "target alone (verify loop)" and r["temperature"] == t)
             for t in (0.0, SAMPLING_T)}
    for r in rows:
        base = rows[0] if r["temperature"] == 0 else plain[SAMPLING_T]
        r["speedup_vs_target"] = r["tokens_per_second"] / base["tokens_per_second"]
    best = {(kind, t): _best(rows, kind, t) for kind in KINDS for t in (0.0, SAMPLING_T)}
    moa, moa_s = best[("moa", 0.0)], best[("moa", SAMPLING_T)]
    out: dict[str, Any] = {
        "moa_speedup_vs_target_greedy": moa["tokens_per_second"] / rows[0]["tokens_per_second"],
        "moa_speedup_vs_hf_assisted": moa["tokens_per_second"] / rows[1]["tokens_per_second"],
        "moa_speedup_vs_eagle_style": moa["tokens_per_second"] / best[("eagle", 0.0)]["tokens_per_second"],
        "moa_accept_length_greedy": moa["accept_length"],
        "moa_speedup_vs_target_sampling": moa_s["tokens_per_second"] / plain[SAMPLING_T]["tokens_per_second"],
        "best_mode": {f"{kind} T={t:g}": best[(kind, t)]["mode"] for kind, t in best},
        "target_val_loss": target_doc["val_loss"], "target_parameters": target_doc["parameters"],
        "draft_val_loss": {kind: s["val_loss"] for kind, s in summaries.items()},
        "draft_trainable_parameters": {kind: s["trainable_parameters"] for kind, s in summaries.items()},
        "draft_steps": {kind: s["steps"] for kind, s in summaries.items()},
        "greedy_outputs_equal_target_generate": lossless,
        "rows": [{k: v for k, v in r.items() if k != "outputs"} for r in rows],
        "settings": {"k": K, "k_max_adaptive": K_MAX, "tree_depth_branch_width": list(TREE), "prompts": n_prompts,
                     "prompt_tokens": prompt_tokens, "new_tokens": new, "threads": 1, "sampling_temperature": SAMPLING_T},
        "goals": {k: f"{op} {g:g}" for k, (op, g) in GOALS.items()}, "quick": quick,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    table = markdown_table(["method", "mode", "T", "tokens/s", "speed-up", "accept length", "target calls / token"],
                           [(r["method"], r["mode"], f"{r['temperature']:g}", f"{r['tokens_per_second']:.1f}",
                             f"{r['speedup_vs_target']:.2f}×",
                             "—" if r["accept_length"] is None else f"{r['accept_length']:.2f}",
                             "—" if r["target_calls_per_token"] is None else f"{r['target_calls_per_token']:.2f}")
                            for r in rows], align="llrrrrr")
    print(table)
    verdicts = []
    for key, (op, goal) in GOALS.items():
        ok = out[key] >= goal if op == ">=" else out[key] <= goal
        verdicts.append(f"| `{key}` | {out[key]:.3f} | {op} {goal:g} | {'met' if ok else 'not met'} |")
        print(f"{key:34s} {out[key]:8.3f}  {'✔' if ok else '✘'} (goal {op} {goal:g})")
    suffix = "-quick" if quick else ""
    write_atomic(results_dir / f"speculative{suffix}.json", json.dumps(out, indent=1, sort_keys=True) + "\n")
    write_atomic(docs_dir / f"speculative{suffix}.md", "# Speculative decoding (`trickle bench speculative`)\n\n"
                 f"Batch 1, CPU, one thread; {n_prompts} held-out prompts of {prompt_tokens} tokens, {new} new tokens each. "
                 f"Target: {target_doc['parameters'] / 1e6:.1f} M parameters, validation loss {target_doc['val_loss']:.3f}. "
                 f"Modes: chain of K = {K}; adaptive chain (K ≤ {K_MAX}); tree of depth {TREE[0]}, {TREE[1]} children "
                 f"per expanded node, {TREE[2]} nodes expanded per level. Speed-up: against transformers' greedy "
                 f"`generate` (T = 0) or the verify loop with no draft (T = {SAMPLING_T:g}).\n\n" + table +
                 "\n\n| key | measured | goal | |\n| --- | ---: | --- | --- |\n" + "\n".join(verdicts) + "\n")
    print(f"wrote {results_dir / f'speculative{suffix}.json'}")
    return out
