"""Speculative decoding benchmark: tokens/s of every draft against the target alone, batch 1, CPU,
one torch thread, prompts from the held-out plays, all methods in the same run.

    trickle bench speculative [--quick] [--part tiny]

Full: two targets. The bench target ``runs/lm/base`` (``trickle train lm --size base``; refused
with one line when missing), its drafts ``runs/lm/draft-{moa,eagle,independent}``, 10 prompts of
64 tokens, 128 new tokens each; and the tiny target (0.19 M parameters, where a draft costs about
what it saves) ``runs/lm/tiny`` with ``runs/lm/tiny-draft-*``, 40 prompts of 16 tokens, 48 new
tokens each. Missing drafts (and the tiny target) are trained here first (``DRAFT_STEPS`` each:
same data, same budget). ``--part tiny`` (or ``base``) measures one target and keeps the other's
section from the committed JSON, with the commit and protocol it was measured at (``measured``).
Quick: a tiny target and drafts trained for seconds, 32 new tokens: a smoke run of the whole path,
whose figures mean nothing.

Methods: the target alone — our verify loop with no draft, the baseline of every speed-up at both
temperatures, and transformers' greedy ``generate``, a row of its own; transformers' assisted
generation with the independent draft (``assistant_model``, its own draft-length schedule); and
our loop with each draft in four modes — a chain of ``K`` tokens, a chain of adaptive length (at
most ``K_MAX``), a tree (``TREE``), and auto (the server's default: costs calibrated once per draft
before the runs, then kept current from timings; K in 0..``K_MAX``) — greedy and at T = 0.7.

Protocol (each target): first a selection run, on prompts of their own, times every draft in every
mode once and picks each draft's mode per temperature (its headline) and the best draft and mode.
Then ``REPEATS`` measured runs on the bench prompts time the baseline, transformers' rows, each
draft's picked mode and auto, and the int8 drafts' auto. Within a run each prompt is decoded by
every method in turn, the order rotated from prompt to prompt (and from run to run), so a change
in the machine's load falls on all methods alike; a row's figures are the medians over the runs,
its speed-up the median of its run-by-run ratios to the baseline of the same run.
``auto_speedup_vs_target_min`` is the worst float32 auto row over the targets measured with this
protocol, both temperatures and all three drafts.
Results: ``bench/results/speculative.json`` and the table ``docs/results/speculative.md``.
"""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.measured import measured_commit
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
PARTS = ("base", "tiny")  # the targets; the first is the bench target of the headline keys
REPEATS = 5  # measured runs per target (quick: 2)
PROTOCOL = ("own loop baseline at both temperatures; mode picked on a separate selection run; medians of "
            "interleaved repeated runs")
PLAIN = "target alone (verify loop)"
HF = "target alone (transformers generate)"
ASSISTED = "transformers assisted (independent draft)"
GOALS = {
    "auto_speedup_vs_target_min": (">=", 0.95),
    "best_speedup_vs_target_greedy": (">=", 1.6),
    "moa_speedup_vs_eagle_style": (">=", 1.0),
    "moa_speedup_vs_target_greedy": (">=", 2.0),
    "moa_speedup_vs_hf_assisted": (">=", 1.25),
    "moa_accept_length_greedy": (">=", 3.5),
    "moa_speedup_vs_target_sampling": (">=", 1.5),
}


def _prompts(tok: Any, corpus: Path, n: int, tokens: int, phase: int = 0) -> list[list[int]]:
    """``n`` prompts of ``tokens`` tokens from the middle of the held-out plays; ``phase`` 1: from
    half-way between phase 0's (the selection run's prompts)."""
    from models.lm.target import find_plays, read_texts

    held = read_texts(find_plays(corpus).held_out)
    out = []
    for i in range(n):
        text = held[i % len(held)]
        start = len(text) * (2 * i + 2 + phase) // (2 * n + 4)
        ids = tok.backend_tokenizer.encode(text[start : start + 20 * tokens]).ids[:tokens]  # no "too long" warning
        out.append(ids)
    return out


@dataclass
class Method:
    """One row of the table: how it decodes a prompt, ``decode(prompt, seed)`` -> (tokens, target
    calls, drafted tokens), the counts None for transformers' own loops."""

    method: str
    mode: str
    temperature: float
    decode: Callable[[list[int], int], tuple[list[int], int | None, int | None]]


def _ours(method: str, mode: str, target: Any, drafter: Any, new: int, temperature: float, cost: Any = None) -> Method:
    from models.lm.speculative import Tree, speculative_generate

    modes: dict[str, dict[str, Any]] = {"chain": {"k": K}, "adaptive": {"k": K_MAX, "adaptive": True},
                                        "tree": {"tree": Tree(*TREE)}, "auto": {"k": K_MAX, "auto": cost}, "none": {}}
    how = modes[mode]

    def decode(prompt: list[int], seed: int) -> tuple[list[int], int | None, int | None]:
        out, stats = speculative_generate(target, drafter, prompt, new, temperature=temperature, seed=seed, **how)
        return out, stats.target_calls, stats.drafted

    return Method(method, mode, temperature, decode)


def _hf(method: str, target: Any, new: int, assistant: Any = None) -> Method:
    kwargs = {"assistant_model": assistant} if assistant is not None else {}

    def decode(prompt: list[int], seed: int) -> tuple[list[int], int | None, int | None]:
        ids = torch.tensor([prompt])
        # eos_token_id=None: exactly `new` tokens, as the verify loop makes (no EOS stop, no EOS suppression)
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                              eos_token_id=None, pad_token_id=target.config.pad_token_id, **kwargs)
        return out[0, len(prompt):].tolist(), None, None

    return Method(method, "—", 0.0, decode)


def _interleaved(methods: list[Method], prompts: list[list[int]], rotate: int = 0) -> list[dict[str, Any]]:
    """Every method over every prompt, one prompt at a time: each prompt is decoded by every method
    in turn, the order rotated by one from prompt to prompt (and by ``rotate``). Per method its
    tokens, wall seconds, tokens/s and, for our loop, target calls and drafted tokens."""
    n = len(methods)
    tokens, seconds, calls, drafted = [0] * n, [0.0] * n, [0] * n, [0] * n
    outputs: list[list[list[int]]] = [[] for _ in methods]
    for i, prompt in enumerate(prompts):
        for j in ((i + rotate + step) % n for step in range(n)):
            t0 = time.perf_counter()
            out, c, d = methods[j].decode(prompt, i)
            seconds[j] += time.perf_counter() - t0
            tokens[j] += len(out)
            calls[j] += c or 0
            drafted[j] += d or 0
            outputs[j].append(out)
    rows = []
    for j, m in enumerate(methods):
        ours = m.mode != "—"
        rows.append({"method": m.method, "mode": m.mode, "temperature": m.temperature, "tokens": tokens[j],
                     "seconds": seconds[j], "tokens_per_second": tokens[j] / seconds[j],
                     "accept_length": tokens[j] / calls[j] if ours else None,
                     "target_calls_per_token": calls[j] / tokens[j] if ours else None,
                     "drafted_per_call": drafted[j] / calls[j] if ours else None, "outputs": outputs[j]})
    return rows


def _plain(rows: list[dict[str, Any]], temperature: float) -> dict[str, Any]:
    return next(r for r in rows if r["method"] == PLAIN and r["temperature"] == temperature)


def _with_speedups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row's tokens/s over the verify loop's without a draft at its temperature (same run)."""
    return [r | {"speedup_vs_target": r["tokens_per_second"] / _plain(rows, r["temperature"])["tokens_per_second"]}
            for r in rows]


def _row(rows: list[dict[str, Any]], method: str, mode: str, temperature: float) -> dict[str, Any]:
    return next(r for r in rows if (r["method"], r["mode"], r["temperature"]) == (method, mode, temperature))


def _medians(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of repeated runs (the same rows in the same order) as one: each figure's median over
    the runs, the speed-up's range beside it; the outputs of the first run, and whether every run
    gave the same."""
    out = []
    for i, first in enumerate(runs[0]):
        same = [run[i] for run in runs]
        row = {k: v for k, v in first.items() if k != "outputs"}
        for key in ("seconds", "tokens_per_second", "speedup_vs_target", "accept_length", "target_calls_per_token",
                    "drafted_per_call"):
            if first[key] is not None:
                row[key] = statistics.median(r[key] for r in same)
        row["speedup_vs_target_range"] = [min(r["speedup_vs_target"] for r in same),
                                          max(r["speedup_vs_target"] for r in same)]
        row["runs"] = len(runs)
        row["outputs"] = first["outputs"]
        row["outputs_equal_across_runs"] = all(r["outputs"] == first["outputs"] for r in same)
        out.append(row)
    return out


def _paired(runs: list[list[dict[str, Any]]], a: tuple[str, str, float], b: tuple[str, str, float]) -> float:
    """The median over the runs of row ``a``'s tokens/s over row ``b``'s in the same run."""
    return statistics.median(_row(run, *a)["tokens_per_second"] / _row(run, *b)["tokens_per_second"] for run in runs)


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
            raise ConfigError("target", str(target), "train it first: trickle train lm --size base --out runs/lm/base "
                                                     "(or measure the tiny target alone: --part tiny)")
        print(f"training the {size} target ...", flush=True)
        train_lm(LMConfig.model_validate({"size": size}), corpus, target)
    for kind, folder in drafts.items():
        if not (folder / "draft.json").is_file():
            print(f"training the {kind} draft of the {size} target for {DRAFT_STEPS} steps ...", flush=True)
            train_draft(target, kind, corpus, folder, steps=DRAFT_STEPS)  # type: ignore[arg-type]
    return target, drafts


def _pick(rows: list[dict[str, Any]], temperature: float, method: str | None = None) -> dict[str, Any]:
    """The fastest row with a draft at ``temperature`` (of ``method``)."""
    return max((r for r in rows if (method is None or r["method"] == method) and r["temperature"] == temperature
                and r["method"] in KINDS), key=lambda r: r["tokens_per_second"])


def _measure(size: str, target_dir: Path, draft_dirs: dict[str, Path], corpus: Path, shape: tuple[int, int, int],
             repeats: int) -> dict[str, Any]:
    """Every method and mode on one target, greedy and sampled (the module's protocol): the
    selection run's rows and picks, the measured rows (medians), speed-ups, losslessness."""
    from models.lm.draft import load_drafter, load_target
    from models.lm.speculative import NoDrafter, calibrate, int8_drafter

    n_prompts, prompt_tokens, new = shape
    target, tok = load_target(target_dir)
    prompts = _prompts(tok, corpus, n_prompts, prompt_tokens)
    chosen_on = _prompts(tok, corpus, n_prompts, prompt_tokens, phase=1)
    drafters = {kind: load_drafter(folder, target) for kind, folder in draft_dirs.items()}
    summaries = {kind: json.loads((folder / "draft.json").read_text()) for kind, folder in draft_dirs.items()}
    independent = drafters["independent"].lm.model  # type: ignore[attr-defined]  # an IndependentDrafter
    int8 = {kind: int8_drafter(load_drafter(folder, target)) for kind, folder in draft_dirs.items()}  # server-side int8
    costs = {kind: calibrate(target, drafter, K_MAX) for kind, drafter in drafters.items()}  # auto: measured at load
    costs |= {f"{kind} int8": calibrate(target, drafter, K_MAX) for kind, drafter in int8.items()}
    print(f"{size}: calibrated {costs}", flush=True)
    temperatures = (0.0, SAMPLING_T)

    def plain(t: float) -> Method:
        return _ours(PLAIN, "none", target, NoDrafter(), new, t)

    selection: list[dict[str, Any]] = []
    for t in temperatures:
        methods = [plain(t), *([_hf(HF, target, new)] if t == 0 else []),
                   *(_ours(kind, mode, target, drafters[kind], new, t, costs[kind]) for kind in KINDS for mode in MODES)]
        selection += _interleaved(methods, chosen_on)
    selection = _with_speedups(selection)
    picked = {(kind, t): _pick(selection, t, kind)["mode"] for kind in KINDS for t in temperatures}
    best = {t: (_pick(selection, t)["method"], _pick(selection, t)["mode"]) for t in temperatures}
    print(f"{size}: selection run done; picked {picked}", flush=True)

    runs: list[list[dict[str, Any]]] = []
    for r in range(repeats):
        rows: list[dict[str, Any]] = []
        for t in temperatures:
            methods = [plain(t), *([_hf(HF, target, new), _hf(ASSISTED, target, new, independent)] if t == 0 else [])]
            for kind in KINDS:
                methods += [_ours(kind, mode, target, drafters[kind], new, t, costs[kind])
                            for mode in dict.fromkeys((picked[kind, t], "auto"))]
            methods += [_ours(f"{kind} int8", "auto", target, int8[kind], new, t, costs[f"{kind} int8"]) for kind in KINDS]
            rows += _interleaved(methods, prompts, rotate=r)
        runs.append(_with_speedups(rows))
        print(f"{size}: measured run {r + 1} of {repeats}", flush=True)
    rows = _medians(runs)

    greedy = _row(rows, HF, "—", 0.0)["outputs"]
    greedy_chosen_on = _row(selection, HF, "—", 0.0)["outputs"]
    sweep = _vocab_sweep(target, tok, draft_dirs["moa"], corpus, prompts, new) if size == "base" else []
    for swept in sweep:
        swept["speedup_vs_target"] = swept["tokens_per_second"] / _plain(rows, 0.0)["tokens_per_second"]
    auto_sampled = [r["outputs"] for r in rows if r["mode"] == "auto" and r["temperature"] == SAMPLING_T]
    doc = json.loads((target_dir / "train.json").read_text())
    return {
        "protocol": PROTOCOL, "rows": rows, "selection_rows": selection, "moa_draft_vocabulary_sweep": sweep,
        "runs": runs, "picked_mode": picked, "best": best,
        "greedy_outputs_equal_target_generate": {
            **{f"{r['method']} ({r['mode']})": r["outputs"] == greedy for r in rows if r["temperature"] == 0},
            **{f"{r['method']} ({r['mode']}), selection run": r["outputs"] == greedy_chosen_on
               for r in selection if r["temperature"] == 0}},
        "outputs_equal_across_runs": all(r["outputs_equal_across_runs"] for r in rows),
        # coupled sampling: the seed fixes the text whatever the draft
        "auto_sampled_outputs_equal_across_drafts": all(o == auto_sampled[0] for o in auto_sampled),
        "auto_speedup_vs_target": {f"{r['method']} T={r['temperature']:g}": r["speedup_vs_target"]
                                   for r in rows if r["mode"] == "auto"},
        # transformers' greedy generate against our loop without a draft (what T = 0 was measured against before)
        "hf_generate_speedup_vs_target": _row(rows, HF, "—", 0.0)["speedup_vs_target"],
        # server-side int8 drafts (torch dynamic quantization), auto mode: tokens/s against the float32 draft
        "int8_draft_speedup_vs_fp32": {f"{kind} T={t:g}": _paired(runs, (f"{kind} int8", "auto", t), (kind, "auto", t))
                                       for kind in KINDS for t in temperatures},
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
    sizes = [n or target.config.vocab_size for n in VOCAB_SWEEP]
    methods = [_ours(f"moa, draft vocabulary {size}", "adaptive", target,
                     MoADrafter(draft, draft_vocabulary(train_ids, target.config.vocab_size, n) if n else None), new, 0.0)
               for n, size in zip(VOCAB_SWEEP, sizes)]
    return [{k: v for k, v in row.items() if k != "outputs"} | {"vocabulary": size}
            for row, size in zip(_interleaved(methods, prompts), sizes)]


def _table(rows: list[dict[str, Any]]) -> str:
    def speedup(r: dict[str, Any]) -> str:
        spread = r.get("speedup_vs_target_range")
        return f"{r['speedup_vs_target']:.2f}×" + (f" ({spread[0]:.2f}–{spread[1]:.2f})" if spread else "")

    return markdown_table(["method", "mode", "T", "tokens/s", "speed-up", "accept length", "target calls / token"],
                          [(r["method"], r["mode"], f"{r['temperature']:g}", f"{r['tokens_per_second']:.1f}", speedup(r),
                            "—" if r["accept_length"] is None else f"{r['accept_length']:.2f}",
                            "—" if r["target_calls_per_token"] is None else f"{r['target_calls_per_token']:.2f}")
                           for r in rows], align="llrrrrr")


def _headline(got: dict[str, Any]) -> dict[str, Any]:
    """The headline keys of the bench target: the draft and mode picked on the selection run,
    their measured medians."""
    rows, runs, picked, best = got["rows"], got["runs"], got["picked_mode"], got["best"]
    moa, moa_s = ("moa", picked["moa", 0.0], 0.0), ("moa", picked["moa", SAMPLING_T], SAMPLING_T)
    (greedy, greedy_mode), (sampled, sampled_mode) = best[0.0], best[SAMPLING_T]
    return {
        "best_speedup_vs_target_greedy": _row(rows, greedy, greedy_mode, 0.0)["speedup_vs_target"],
        "best_speedup_vs_target_sampling": _row(rows, sampled, sampled_mode, SAMPLING_T)["speedup_vs_target"],
        "best_greedy": f"{best[0.0][0]} ({best[0.0][1]})",
        "best_sampling": f"{best[SAMPLING_T][0]} ({best[SAMPLING_T][1]})",
        "moa_speedup_vs_target_greedy": _row(rows, *moa)["speedup_vs_target"],
        "moa_speedup_vs_hf_assisted": _paired(runs, moa, (ASSISTED, "—", 0.0)),
        "moa_speedup_vs_eagle_style": _paired(runs, moa, ("eagle", picked["eagle", 0.0], 0.0)),
        "moa_accept_length_greedy": _row(rows, *moa)["accept_length"],
        "moa_speedup_vs_target_sampling": _row(rows, *moa_s)["speedup_vs_target"],
        "target_val_loss": got["target_val_loss"], "target_parameters": got["target_parameters"],
    }


def main(quick: bool = False, results_dir: Path = RESULTS, docs_dir: Path = DOCS, corpus: Path | None = None,
         parts: tuple[str, ...] = PARTS, repeats: int | None = None) -> dict[str, Any]:
    """Run the benchmark on the targets ``parts`` (quick: the tiny one, trained here). Measuring
    some of them keeps the others' sections and keys from the committed JSON; ``measured`` names
    the commit each target's figures come from."""
    unknown = set(parts) - set(PARTS)
    if unknown or not parts:
        raise ConfigError("--part", ",".join(parts), f"must be among {', '.join(PARTS)}")
    torch.set_num_threads(1)
    corpus = corpus or data_root() / "shakespeare" / "plays"
    sizes = ("tiny",) if quick else tuple(p for p in PARTS if p in parts)
    repeats = repeats or (2 if quick else REPEATS)
    # the tiny target is ~10x faster: more prompts, so that a row is not a half-second measurement
    shapes = {"base": (10, 64, 128), "tiny": (40, 16, 48)} if not quick else {"tiny": (2, 16, 32)}
    suffix = "-quick" if quick else ""
    path = results_dir / f"speculative{suffix}.json"
    previous = json.loads(path.read_text()) if path.exists() and set(sizes) != set(PARTS) else {}
    measured: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            target_dir, draft_dirs = _models(size, quick, Path(tmp), corpus)
            measured[size] = _measure(size, target_dir, draft_dirs, corpus, shapes[size], repeats)
    commit = measured_commit("models/lm", "edge/llm", "bench/speculative.py")
    when = dict(previous.get("measured", {}))
    for size in previous.get("targets", {}):
        when.setdefault(size, "an earlier run, before issue 48's protocol (T = 0 against transformers' generate; each "
                              "row timed once; each draft's best of four modes)")
    when |= dict.fromkeys(sizes, commit)
    targets = {size: got for size, got in previous.get("targets", {}).items() if size not in sizes}
    targets |= {size: {k: ([{c: v for c, v in r.items() if c != "outputs"} for r in v] if k in ("rows", "selection_rows")
                           else {f"{kind} T={t:g}": mode for (kind, t), mode in v.items()} if k == "picked_mode"
                           else {f"T={t:g}": f"{kind} ({mode})" for t, (kind, mode) in v.items()} if k == "best" else v)
                       for k, v in got.items() if k != "runs"} for size, got in measured.items()}
    # the minimum over the targets measured with this protocol (an earlier one's section is kept as it was)
    current = [size for size, got in targets.items() if got.get("protocol") == PROTOCOL]
    auto = {f"{size} {key}": v for size in current for key, v in targets[size]["auto_speedup_vs_target"].items()}
    out: dict[str, Any] = {k: v for k, v in previous.items() if k in GOALS or k in ("best_greedy", "best_sampling",
                                                                                   "target_val_loss", "target_parameters")}
    if PARTS[0] in measured or quick:
        out |= _headline(measured["tiny" if quick else PARTS[0]])
    out |= {
        # the default configuration: auto with each float32 draft; the int8 drafts (an option) apart
        "auto_speedup_vs_target_min": min(v for k, v in auto.items() if " int8 " not in k),
        "auto_speedup_vs_target_min_int8_drafts": min(v for k, v in auto.items() if " int8 " in k),
        "auto_speedup_vs_target": auto,
        "auto_speedup_vs_target_over": current,
        "best_mode": {f"{size} {kind} T={t:g}": got["picked_mode"][kind, t]
                      for size, got in measured.items() for kind in KINDS for t in (0.0, SAMPLING_T)},
        "targets": targets, "measured": when, "headline_target": "tiny" if quick else PARTS[0],
        "settings": {"k": K, "k_max_adaptive_and_auto": K_MAX, "tree_depth_branch_width": list(TREE), "threads": 1,
                     "sampling_temperature": SAMPLING_T, "shapes": {s: list(shapes[s]) for s in sizes},
                     "repeats": repeats, "protocol": PROTOCOL,
                     "baseline": "our verify loop without a draft, at each temperature"},
        "goals": {k: f"{op} {g:g}" for k, (op, g) in GOALS.items()}, "quick": quick,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    if previous and "best_mode" in previous:  # a kept target's picks (an earlier run's best of four)
        out["best_mode"] = {k: v for k, v in previous["best_mode"].items() if k.split()[0] not in sizes} | out["best_mode"]
    for key, (op, goal) in GOALS.items():
        ok = out[key] >= goal if op == ">=" else out[key] <= goal
        print(f"{key:34s} {out[key]:8.3f}  {'✔' if ok else '✘'} (goal {op} {goal:g})")
    write_atomic(path, json.dumps(out, indent=1, sort_keys=True) + "\n")
    for size in sizes:
        print(_table(targets[size]["rows"]))
    write_atomic(docs_dir / f"speculative{suffix}.md", report(out))
    print(f"wrote {path}")
    return out


def report(out: dict[str, Any]) -> str:
    """``docs/results/speculative.md`` from the results' JSON."""
    when, targets = out["measured"], out["targets"]
    verdicts = []
    for key, (op, goal) in GOALS.items():
        ok = out[key] >= goal if op == ">=" else out[key] <= goal
        verdicts.append(f"| `{key}` | {out[key]:.3f} | {op} {goal:g} | {'met' if ok else 'not met'} |")
    sections = []
    for size, got in targets.items():
        n_prompts, prompt_tokens, new = (got["shape"][k] for k in ("prompts", "prompt_tokens", "new_tokens"))
        kept = got.get("protocol") != PROTOCOL
        intro = (f"Kept from {when[size]}: speed-ups at T = 0 are against transformers' `generate`, each row timed "
                 "once, each draft's headline its best of four modes." if kept else
                 f"Measured at {when[size]}. The medians of {out['settings']['repeats']} interleaved runs (the speed-up's "
                 "range over them in brackets); each draft's modes beside auto as picked on the selection run below.")
        sections.append(
            f"## The {size} target: {got['target_parameters'] / 1e6:.2f} M parameters, validation loss "
            f"{got['target_val_loss']:.3f}\n\n{intro}\n\n{n_prompts} held-out prompts of {prompt_tokens} tokens, {new} "
            f"new tokens each. Greedy continuation of the first: \"{got['greedy_continuation'].strip()[:160]}\"\n\n"
            + _table(got["rows"])
            + ("\n\nSelection run (other prompts, every mode timed once; it picks the modes above):\n\n"
               + _table(got["selection_rows"]) if not kept else "")
            + ("\n\nThe MoA draft's head over fewer tokens (adaptive chain, greedy; one trained draft, the vocabulary acts only "
               "when drafting):\n\n" + _table(got["moa_draft_vocabulary_sweep"]) if got["moa_draft_vocabulary_sweep"] else ""))
    headline = out["headline_target"]
    return ("# Speculative decoding (`trickle bench speculative`)\n\n"
            f"Batch 1, CPU, one thread. Modes: chain of K = {K}; adaptive chain (K ≤ {K_MAX}); tree of depth "
            f"{TREE[0]}, {TREE[1]} children per expanded node, {TREE[2]} nodes expanded per level; auto (the "
            f"default with a draft: each round the K in 0..{K_MAX} of most expected tokens per second from costs "
            f"measured at load and kept current, coupled sampling). Speed-up: against our verify loop with no "
            f"draft at the same temperature, in the same run (transformers' `generate` is a row of its own). "
            f"Protocol: {PROTOCOL}. The headline keys are the {headline} target's (measured at {when.get(headline, '—')}); "
            f"`auto_speedup_vs_target_min` is over the targets measured with this protocol: "
            f"{', '.join(out['auto_speedup_vs_target_over'])}.\n\n"
            "| key | measured | goal | |\n| --- | ---: | --- | --- |\n" + "\n".join(verdicts) + "\n\n"
            + "\n\n".join(sections) + "\n")
