"""Speculative decoding benchmark: tokens/s of every draft against the target alone, batch 1, CPU,
one torch thread, prompts from the held-out plays, all methods in the same run.

    trickle bench speculative [--quick]

Full: two targets. The bench target ``runs/lm/base`` (``trickle train lm --size base``; refused
with one line when missing), its drafts ``runs/lm/draft-{moa,eagle,independent}``, 10 prompts of
64 tokens, 128 new tokens each; and the tiny target (0.19 M parameters, where a draft costs about
what it saves) ``runs/lm/tiny`` with ``runs/lm/tiny-draft-*``, 40 prompts of 16 tokens, 48 new
tokens each. Missing drafts (and the tiny target) are trained here first (``DRAFT_STEPS`` each:
same data, same budget). Quick: a tiny target and drafts trained for seconds, 32 new tokens: a
smoke run of the whole path, whose figures mean nothing.

Methods: the target alone (transformers' greedy ``generate``, and our verify loop with no draft,
which is also the sampling baseline); transformers' assisted generation with the independent
draft (``assistant_model``, its own draft-length schedule); and our loop with each draft in four
modes — a chain of ``K`` tokens, a chain of adaptive length (at most ``K_MAX``), a tree
(``TREE``), and auto (the server's default: costs calibrated once per draft before the runs, then
kept current from timings; K in 0..``K_MAX``) — greedy and at T = 0.7. A draft's headline figure
is its best mode per temperature; ``auto_speedup_vs_target_min`` is the worst auto row over both
targets, both temperatures and all three drafts, all measured in the same run.
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
MODES = ("chain", "adaptive", "tree", "auto")
DRAFT_STEPS = 2000  # ~35 min a draft here; 400 steps left the drafts too weak for the 80-minute target
SAMPLING_T = 0.7
KINDS = ("moa", "eagle", "independent")
GOALS = {
    "auto_speedup_vs_target_min": (">=", 0.95),
    "best_speedup_vs_target_greedy": (">=", 1.6),
    "moa_speedup_vs_eagle_style": (">=", 1.0),
    "moa_speedup_vs_target_greedy": (">=", 2.0),
    "moa_speedup_vs_hf_assisted": (">=", 1.25),
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
         temperature: float, cost: Any = None) -> dict[str, Any]:
    from models.lm.speculative import Tree, speculative_generate

    modes: dict[str, dict[str, Any]] = {"chain": {"k": K}, "adaptive": {"k": K_MAX, "adaptive": True},
                                        "tree": {"tree": Tree(*TREE)}, "auto": {"k": K_MAX, "auto": cost}, "none": {}}
    how = modes[mode]
    tokens = calls = drafted = 0
    seconds = 0.0
    outputs = []
    for i, prompt in enumerate(prompts):
        (out, stats), wall = _time(lambda p=prompt, s=i: speculative_generate(target, drafter, p, new, temperature=temperature,
                                                                              seed=s, **how))
        tokens, calls, seconds = tokens + len(out), calls + stats.target_calls, seconds + wall
        drafted += stats.drafted
        outputs.append(out)
    return {"method": method, "mode": mode, "temperature": temperature, "tokens": tokens, "seconds": seconds,
            "tokens_per_second": tokens / seconds, "accept_length": tokens / calls, "target_calls_per_token": calls / tokens,
            "drafted_per_call": drafted / calls, "outputs": outputs}


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


def _models(size: str, quick: bool, work: Path, corpus: Path) -> tuple[Path, dict[str, Path]]:
    """The target of ``size`` and its three drafts: trained here (quick: a tiny target for seconds;
    full: the tiny target and its drafts in runs/lm when missing), or runs/lm/base, which must exist."""
    from models.lm.draft import train_draft
    from models.lm.target import LMConfig, train_lm

    if quick:
        target, drafts = work / "target", {kind: work / kind for kind in KINDS}
        train_lm(LMConfig.model_validate({"size": "tiny", "steps": 200}), corpus, target)
        for kind, folder in drafts.items():
            train_draft(target, kind, corpus, folder, steps=100, checkpoint_minutes=60)  # type: ignore[arg-type]
        return target, drafts
    target = RUNS / size
    prefix = "" if size == "base" else f"{size}-"
    drafts = {kind: RUNS / f"{prefix}draft-{kind}" for kind in KINDS}
    if not (target / "train.json").is_file():
        if size == "base":
            raise ConfigError("target", str(target), "train it first: trickle train lm --size base --out runs/lm/base")
        print(f"training the {size} target ...", flush=True)
        train_lm(LMConfig.model_validate({"size": size}), corpus, target)
    for kind, folder in drafts.items():
        if not (folder / "draft.json").is_file():
            print(f"training the {kind} draft of the {size} target for {DRAFT_STEPS} steps ...", flush=True)
            train_draft(target, kind, corpus, folder, steps=DRAFT_STEPS)  # type: ignore[arg-type]
    return target, drafts


def _best(rows: list[dict[str, Any]], temperature: float, method: str | None = None) -> dict[str, Any]:
    return max((r for r in rows if (method is None or r["method"] == method) and r["temperature"] == temperature
                and r["mode"] != "none"), key=lambda r: r["tokens_per_second"])


def _measure(size: str, target_dir: Path, draft_dirs: dict[str, Path], corpus: Path, shape: tuple[int, int, int]
             ) -> dict[str, Any]:
    """Every method and mode on one target, greedy and sampled: rows, speed-ups, losslessness."""
    from models.lm.draft import load_drafter, load_target
    from models.lm.speculative import NoDrafter, calibrate, int8_drafter

    n_prompts, prompt_tokens, new = shape
    target, tok = load_target(target_dir)
    prompts = _prompts(tok, corpus, n_prompts, prompt_tokens)
    drafters = {kind: load_drafter(folder, target) for kind, folder in draft_dirs.items()}
    summaries = {kind: json.loads((folder / "draft.json").read_text()) for kind, folder in draft_dirs.items()}
    independent = drafters["independent"].lm.model  # type: ignore[attr-defined]  # an IndependentDrafter
    int8 = {kind: int8_drafter(load_drafter(folder, target)) for kind, folder in draft_dirs.items()}  # server-side int8
    costs = {kind: calibrate(target, drafter, K_MAX) for kind, drafter in drafters.items()}  # auto: measured at load
    costs |= {f"{kind} int8": calibrate(target, drafter, K_MAX) for kind, drafter in int8.items()}
    print(f"{size}: calibrated {costs}", flush=True)
    rows = [_hf("target alone (transformers generate)", target, prompts, new),
            _hf("transformers assisted (independent draft)", target, prompts, new, assistant=independent)]
    for temperature in (0.0, SAMPLING_T):
        rows.append(_run("target alone (verify loop)", "none", target, NoDrafter(), prompts, new, temperature))
        rows += [_run(kind, mode, target, drafters[kind], prompts, new, temperature, costs[kind])
                 for kind in KINDS for mode in MODES]
        rows += [_run(f"{kind} int8", "auto", target, int8[kind], prompts, new, temperature, costs[f"{kind} int8"])
                 for kind in KINDS]
        print(f"{size}: T = {temperature:g} measured", flush=True)
    greedy = rows[0]["outputs"]
    plain = {t: next(r for r in rows if r["method"] == "target alone (verify loop)" and r["temperature"] == t)
             for t in (0.0, SAMPLING_T)}
    for r in rows:
        base = rows[0] if r["temperature"] == 0 else plain[SAMPLING_T]
        r["speedup_vs_target"] = r["tokens_per_second"] / base["tokens_per_second"]
    sweep = _vocab_sweep(target, tok, draft_dirs["moa"], corpus, prompts, new) if size == "base" else []
    for r in sweep:
        r["speedup_vs_target"] = r["tokens_per_second"] / rows[0]["tokens_per_second"]
    auto_sampled = [r["outputs"] for r in rows if r["mode"] == "auto" and r["temperature"] == SAMPLING_T]
    doc = json.loads((target_dir / "train.json").read_text())
    return {
        "rows": rows, "plain": plain, "moa_draft_vocabulary_sweep": sweep,
        "greedy_outputs_equal_target_generate": {f"{r['method']} ({r['mode']})": r["outputs"] == greedy
                                                 for r in rows if r["temperature"] == 0},
        # coupled sampling: the seed fixes the text whatever the draft
        "auto_sampled_outputs_equal_across_drafts": all(o == auto_sampled[0] for o in auto_sampled),
        "auto_speedup_vs_target": {f"{r['method']} T={r['temperature']:g}": r["speedup_vs_target"]
                                   for r in rows if r["mode"] == "auto"},
        # server-side int8 drafts (torch dynamic quantization), auto mode: tokens/s against the float32 draft
        "int8_draft_speedup_vs_fp32": {
            f"{kind} T={t:g}": next(r for r in rows if r["method"] == f"{kind} int8" and r["temperature"] == t)[
                "tokens_per_second"] / next(r for r in rows if r["method"] == kind and r["mode"] == "auto"
                                            and r["temperature"] == t)["tokens_per_second"]
            for kind in KINDS for t in (0.0, SAMPLING_T)},
        "calibrated_costs": {kind: repr(c) for kind, c in costs.items()},
        "target_val_loss": doc["val_loss"], "target_parameters": doc["parameters"],
        "target_example": doc.get("example"),
        "greedy_continuation": tok.decode(greedy[0][:48]),
        "draft_val_loss": {kind: s["val_loss"] for kind, s in summaries.items()},
        "draft_trainable_parameters": {kind: s["trainable_parameters"] for kind, s in summaries.items()},
        "draft_steps": {kind: s["steps"] for kind, s in summaries.items()},
        "shape": {"prompts": n_prompts, "prompt_tokens": prompt_tokens, "new_tokens": new},
    }


VOCAB_SWEEP = (256, 512, 1024, 2048, 0)  # the MoA draft head's vocabulary (0: the target's whole vocabulary)


def _vocab_sweep(target: Any, tok: Any, draft_dir: Path, corpus: Path, prompts: list[list[int]], new: int
                 ) -> list[dict[str, Any]]:
    """The MoA draft (adaptive chain, greedy: a mode that drafts every round, so the head's cost
    shows) with its head read over the N most frequent training tokens, for each N of VOCAB_SWEEP:
    a smaller head costs less per drafted token and proposes fewer of the target's tokens. Trained
    once; the draft vocabulary only acts when drafting."""
    from models.lm.draft import load_drafter
    from models.lm.moa import MoADrafter
    from models.lm.speculative import draft_vocabulary
    from models.lm.target import find_plays, read_texts, token_stream

    train_ids = token_stream(tok.backend_tokenizer, read_texts(find_plays(corpus).train))
    draft = load_drafter(draft_dir, target).draft  # type: ignore[attr-defined]  # a MoADrafter's module
    rows = []
    for n in VOCAB_SWEEP:
        drafter = MoADrafter(draft, draft_vocabulary(train_ids, target.config.vocab_size, n) if n else None)
        row = _run(f"moa, draft vocabulary {n or target.config.vocab_size}", "adaptive", target, drafter, prompts, new, 0.0)
        rows.append({k: v for k, v in row.items() if k != "outputs"} | {"vocabulary": n or target.config.vocab_size})
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    return markdown_table(["method", "mode", "T", "tokens/s", "speed-up", "accept length", "target calls / token"],
                          [(r["method"], r["mode"], f"{r['temperature']:g}", f"{r['tokens_per_second']:.1f}",
                            f"{r['speedup_vs_target']:.2f}×",
                            "—" if r["accept_length"] is None else f"{r['accept_length']:.2f}",
                            "—" if r["target_calls_per_token"] is None else f"{r['target_calls_per_token']:.2f}")
                           for r in rows], align="llrrrrr")


def main(quick: bool = False, results_dir: Path = RESULTS, docs_dir: Path = DOCS, corpus: Path | None = None) -> dict[str, Any]:
    torch.set_num_threads(1)
    corpus = corpus or data_root() / "shakespeare" / "plays"
    sizes = ("tiny",) if quick else ("base", "tiny")
    # the tiny target is ~10x faster: more prompts, so that a row is not a half-second measurement
    shapes = {"base": (10, 64, 128), "tiny": (40, 16, 48)} if not quick else {"tiny": (2, 16, 32)}
    measured: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            target_dir, draft_dirs = _models(size, quick, Path(tmp), corpus)
            measured[size] = _measure(size, target_dir, draft_dirs, corpus, shapes[size])
    main_size = sizes[0]  # the bench target (quick: the tiny one)
    m = measured[main_size]
    rows, plain = m["rows"], m["plain"]
    moa, moa_s = _best(rows, 0.0, "moa"), _best(rows, SAMPLING_T, "moa")
    auto = {f"{size} {key}": v for size, got in measured.items() for key, v in got["auto_speedup_vs_target"].items()}
    out: dict[str, Any] = {
        # the default configuration: auto with each float32 draft; the int8 drafts (an option) apart
        "auto_speedup_vs_target_min": min(v for k, v in auto.items() if " int8 " not in k),
        "auto_speedup_vs_target_min_int8_drafts": min(v for k, v in auto.items() if " int8 " in k),
        "auto_speedup_vs_target": auto,
        "best_speedup_vs_target_greedy": _best(rows, 0.0)["speedup_vs_target"],
        "best_speedup_vs_target_sampling": _best(rows, SAMPLING_T)["speedup_vs_target"],
        "best_greedy": f"{_best(rows, 0.0)['method']} ({_best(rows, 0.0)['mode']})",
        "best_sampling": f"{_best(rows, SAMPLING_T)['method']} ({_best(rows, SAMPLING_T)['mode']})",
        "moa_speedup_vs_target_greedy": moa["speedup_vs_target"],
        "moa_speedup_vs_hf_assisted": moa["tokens_per_second"] / rows[1]["tokens_per_second"],
        "moa_speedup_vs_eagle_style": moa["tokens_per_second"] / _best(rows, 0.0, "eagle")["tokens_per_second"],
        "moa_accept_length_greedy": moa["accept_length"],
        "moa_speedup_vs_target_sampling": moa_s["tokens_per_second"] / plain[SAMPLING_T]["tokens_per_second"],
        "best_mode": {f"{size} {kind} T={t:g}": _best(got["rows"], t, kind)["mode"]
                      for size, got in measured.items() for kind in KINDS for t in (0.0, SAMPLING_T)},
        "targets": {size: {k: ([{c: v for c, v in r.items() if c != "outputs"} for r in v] if k == "rows" else v)
                           for k, v in got.items() if k != "plain"} for size, got in measured.items()},
        "target_val_loss": m["target_val_loss"], "target_parameters": m["target_parameters"],
        "settings": {"k": K, "k_max_adaptive_and_auto": K_MAX, "tree_depth_branch_width": list(TREE), "threads": 1,
                     "sampling_temperature": SAMPLING_T, "shapes": {s: list(shapes[s]) for s in sizes}},
        "goals": {k: f"{op} {g:g}" for k, (op, g) in GOALS.items()}, "quick": quick,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    verdicts = []
    for key, (op, goal) in GOALS.items():
        ok = out[key] >= goal if op == ">=" else out[key] <= goal
        verdicts.append(f"| `{key}` | {out[key]:.3f} | {op} {goal:g} | {'met' if ok else 'not met'} |")
        print(f"{key:34s} {out[key]:8.3f}  {'✔' if ok else '✘'} (goal {op} {goal:g})")
    suffix = "-quick" if quick else ""
    write_atomic(results_dir / f"speculative{suffix}.json", json.dumps(out, indent=1, sort_keys=True) + "\n")
    sections = []
    for size, got in measured.items():
        n_prompts, prompt_tokens, new = got["shape"].values()
        sections.append(
            f"## The {size} target: {got['target_parameters'] / 1e6:.2f} M parameters, validation loss "
            f"{got['target_val_loss']:.3f}\n\n{n_prompts} held-out prompts of {prompt_tokens} tokens, {new} new tokens "
            f"each. Greedy continuation of the first: \"{got['greedy_continuation'].strip()[:160]}\"\n\n"
            + _table(got["rows"])
            + ("\n\nThe MoA draft's head over fewer tokens (adaptive chain, greedy; one trained draft, the vocabulary acts only "
               "when drafting):\n\n" + _table(got["moa_draft_vocabulary_sweep"]) if got["moa_draft_vocabulary_sweep"] else ""))
        print(_table(got["rows"]))
    write_atomic(docs_dir / f"speculative{suffix}.md", "# Speculative decoding (`trickle bench speculative`)\n\n"
                 f"Batch 1, CPU, one thread. Modes: chain of K = {K}; adaptive chain (K ≤ {K_MAX}); tree of depth "
                 f"{TREE[0]}, {TREE[1]} children per expanded node, {TREE[2]} nodes expanded per level; auto (the "
                 f"default with a draft: each round the K in 0..{K_MAX} of most expected tokens per second from costs "
                 f"measured at load and kept current, coupled sampling). Speed-up: against transformers' greedy "
                 f"`generate` (T = 0) or the verify loop with no draft (T = {SAMPLING_T:g}).\n\n"
                 "| key | measured | goal | |\n| --- | ---: | --- | --- |\n" + "\n".join(verdicts) + "\n\n"
                 + "\n\n".join(sections) + "\n")
    print(f"wrote {results_dir / f'speculative{suffix}.json'}")
    return out
