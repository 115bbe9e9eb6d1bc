"""Fleet capacity of one language-model server: N devices generating at once, speculative
(each device drafts, the server verifies) against API only (the server generates every token,
batching the decode steps of all running requests: continuous batching), at a fixed link RTT.

    costs = measure_forward_costs(target, context=96)          # real batched forwards, timed
    traces = record_traces(target, drafter, prompts, new=128)    # the draft against the target
    row = simulate("sd", 16, traces, costs, rtt_s=0.02, draft_token_s=0.002)

32 real drafts cannot share two cores with the server, so this is a discrete-event co-simulation
(SimPy) with measured parts:

- **measured**: the server's target forwards — ``models.lm.cache.batched_logits``, the very code
  that batches verification rounds in ``server.llm.verify``, timed for B sessions of a real
  context each fed N tokens (B in 1..32, N in 1..K+1), and a prompt's prefill; the per-position
  agreement of the draft with the target (``record_traces``: at every position of the target's
  greedy text, how many tokens in a row the draft proposes that the target keeps), from the real
  models; a drafted token's time on the device (measured by the caller);
- **modelled**: the link (a fixed round trip, no bandwidth limit, no loss), queueing at the
  server (one worker: every waiting job goes into the next forward, up to ``MAX_BATCH`` rows;
  a request's prefill runs as its own forward), and the device's choice of K (the same
  ``best_draft_length`` rule ``edge.llm.generate`` uses, from its running acceptance and the
  round time it observes).

Greedy decoding, so a round starting at position i keeps ``min(K, run[i])`` draft tokens and the
target's own next token: replaying the traces is exact for any K. Latency: a round (a decode step
for API only) that delivers n tokens after d seconds gives each of them d / n (time per output
token); the first token's time includes the request's trip and prefill.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from edge.llm.acceptance import AcceptanceRate, best_draft_length

MAX_BATCH = 32
ROWS = (1, 2, 4, 8, 16, 32)
Policy = Literal["sd", "api"]


@dataclass
class ForwardCosts:
    """Seconds of one batched target forward of B sessions fed N tokens each, measured on a grid
    and interpolated linearly in between (beyond the grid: linearly extrapolated in B, never
    downward: a forward of more sessions costs no less, whatever noise the last two rows' timings
    carry)."""

    rows: tuple[int, ...]
    tokens: tuple[int, ...]
    seconds: np.ndarray  # (len(rows), len(tokens))
    prefill_s: float

    def __call__(self, b: int, n: int) -> float:
        by_row = [float(np.interp(n, self.tokens, self.seconds[i])) for i in range(len(self.rows))]
        if b <= self.rows[-1]:
            return float(np.interp(b, self.rows, by_row))
        slope = max(0.0, (by_row[-1] - by_row[-2]) / (self.rows[-1] - self.rows[-2]))
        return by_row[-1] + slope * (b - self.rows[-1])

    def as_dict(self) -> dict[str, Any]:
        return {"rows": list(self.rows), "tokens": list(self.tokens), "prefill_s": self.prefill_s,
                "seconds": [[round(float(s), 6) for s in row] for row in self.seconds]}


def measure_forward_costs(target: Any, context: int, rows: Sequence[int] = ROWS, tokens: Sequence[int] = (1, 2, 4, 8, 13),
                          prompt_tokens: int = 64, reps: int = 3) -> ForwardCosts:
    """Time ``batched_logits`` (the server's batched verification forward) for every (B, N) of the
    grid: B sessions each holding ``context`` tokens, fed N new ones, rolled back after each try;
    the median of ``reps``. And one session's prefill of ``prompt_tokens``."""
    import torch

    from models.lm.cache import CachedLM, batched_logits

    vocab = int(target.config.vocab_size)
    lms = []
    for s in range(max(rows)):
        lm = CachedLM(target, keep_hidden=True)
        lm.reset()
        lm.logits([(31 * s + 7 * i + 3) % vocab for i in range(context + 1)], upto=context)
        lms.append(lm)
    seconds = np.zeros((len(rows), len(tokens)))
    with torch.inference_mode():
        for i, b in enumerate(rows):
            for j, n in enumerate(tokens):
                tries = []
                for r in range(reps):
                    feeds = [[(s + 5 * t + r) % vocab for t in range(n)] for s in range(b)]
                    t0 = time.perf_counter()
                    batched_logits(target, lms[:b], feeds)
                    tries.append(time.perf_counter() - t0)
                    for lm in lms[:b]:
                        lm.crop(context)
                seconds[i, j] = statistics.median(tries)
        prefill = []
        for r in range(reps):  # a prompt's prefill, one session
            lm = CachedLM(target)
            lm.reset()
            t0 = time.perf_counter()
            lm.logits([(11 * i + r) % vocab for i in range(prompt_tokens)])
            prefill.append(time.perf_counter() - t0)
    return ForwardCosts(tuple(rows), tuple(tokens), seconds, statistics.median(prefill))


def measure_forward_only(target: Any, context: int, rows: Sequence[int] = ROWS, tokens: Sequence[int] = (1, 2, 4, 8, 13),
                         prompt_tokens: int = 64, reps: int = 3) -> ForwardCosts:
    """The same grid, timing the target's forward alone on a batched cache kept between steps
    (what a server with a persistent batched KV cache would pay; ``batched_logits`` also copies
    each session's cache in and out of the batch every round)."""
    import torch
    from transformers import DynamicCache

    vocab = int(target.config.vocab_size)
    seconds = np.zeros((len(rows), len(tokens)))
    prefill: list[float] = []
    with torch.inference_mode():
        for i, b in enumerate(rows):
            ids = torch.tensor([[(31 * s + 7 * t + 3) % vocab for t in range(context)] for s in range(b)])
            cache = DynamicCache(config=target.config)
            target(input_ids=ids, cache=cache, use_cache=True)
            for j, n in enumerate(tokens):
                tries = []
                for r in range(reps):
                    feed = torch.tensor([[(s + 5 * t + r) % vocab for t in range(n)] for s in range(b)])
                    positions = context + torch.arange(n).expand(b, n)
                    t0 = time.perf_counter()
                    target(input_ids=feed, cache=cache, use_cache=True, position_ids=positions)
                    tries.append(time.perf_counter() - t0)
                    cache.crop(-n)  # transformers 5: a negative count drops the newest entries
                seconds[i, j] = statistics.median(tries)
        for r in range(reps):
            t0 = time.perf_counter()
            target(input_ids=torch.tensor([[(11 * t + r) % vocab for t in range(prompt_tokens)]]), use_cache=True)
            prefill.append(time.perf_counter() - t0)
    return ForwardCosts(tuple(rows), tuple(tokens), seconds, statistics.median(prefill))


def record_traces(target: Any, drafter: Any, prompts: Sequence[list[int]], new: int, k_max: int) -> list[list[int]]:
    """Per prompt, per position i of the target's greedy continuation: how many of the draft's
    greedy tokens proposed after the first i are the target's own next ones (at most ``k_max``)."""
    import torch

    from models.lm.cache import CachedLM
    from models.lm.speculative import draft_chain

    rng = np.random.default_rng(0)
    traces = []
    with torch.inference_mode():
        for prompt in prompts:
            lm = CachedLM(target, keep_hidden=getattr(drafter, "needs_hidden", False))
            lm.reset()
            drafter.reset(prompt)
            if hasattr(drafter, "attach_target"):
                drafter.attach_target(lm)
            seq = list(prompt)
            if len(seq) > 1:
                lm.logits(seq, upto=len(seq) - 1)
            drafts: list[list[int]] = []
            text: list[int] = []
            for _ in range(new + k_max):
                if len(text) < new:  # the draft's proposal after the verified text so far
                    drafts.append(draft_chain(drafter, seq, k_max, 0.0, 1.0, rng)[0] if drafter.prepare(seq) else [])
                nxt = int(lm.logits(seq)[-1].argmax())  # the target's greedy next token; the cache now holds seq
                text.append(nxt)
                seq.append(nxt)
                if len(text) >= new + k_max:
                    break
            runs = []
            for i, draft in enumerate(drafts):
                run = 0
                while run < len(draft) and draft[run] == text[i + run]:
                    run += 1
                runs.append(run)
            traces.append(runs)
    return traces


class _Fleet:
    """The co-simulation's state: one server worker, the devices' requests, what they measured."""

    def __init__(self, costs: ForwardCosts, rtt_s: float, draft_token_s: float, k_max: int) -> None:
        import simpy

        self.env = simpy.Environment()
        self.costs, self.rtt_s, self.draft_token_s, self.k_max = costs, rtt_s, draft_token_s, k_max
        self.queue: list[tuple[Any, int, bool]] = []  # (event to succeed, tokens to feed, with the prompt's prefill)
        self.wake = self.env.event()
        self.forwards = self.rows = self.tokens = 0
        self.busy_s = 0.0
        self.latencies: list[float] = []  # per generated token, seconds

    def serve(self) -> Any:
        """The server's worker: every waiting job (up to MAX_BATCH) in the next forward."""
        while True:
            if not self.queue:
                yield self.wake
                self.wake = self.env.event()
                continue
            batch, self.queue = self.queue[:MAX_BATCH], self.queue[MAX_BATCH:]
            prefills = sum(p for _, _, p in batch)
            took = self.costs(len(batch), max(n for _, n, _ in batch)) + self.costs.prefill_s * prefills
            self.forwards, self.rows, self.busy_s = self.forwards + 1 + prefills, self.rows + len(batch) + prefills, \
                self.busy_s + took
            yield self.env.timeout(took)
            for done, _, _ in batch:
                done.succeed()

    def submit(self, n: int, prefill: bool) -> Any:
        done = self.env.event()
        self.queue.append((done, n, prefill))
        if not self.wake.triggered:
            self.wake.succeed()
        return done

    def api_request(self, new: int) -> Any:
        """The server decodes one token per step, streamed: each arrives half a round trip after its step."""
        env, started = self.env, self.env.now
        yield env.timeout(self.rtt_s / 2)
        last = None
        for _ in range(new):
            yield self.submit(1, last is None)  # one decode step of the running batch (the first with the prefill)
            self.latencies.append(env.now + self.rtt_s / 2 - started if last is None else env.now - last)
            last = env.now
        self.tokens += new
        yield env.timeout(self.rtt_s / 2)  # the last token's way back

    def sd_request(self, new: int, trace: list[int], acceptance: AcceptanceRate, round_s: list[float]) -> Any:
        """Rounds of K drafted tokens (``best_draft_length``), sent, verified in the next batch, answered."""
        env, started, made = self.env, self.env.now, 0
        yield env.timeout(self.rtt_s / 2)  # the request's way; the first round's draft goes with it
        while made < new:
            k = min(best_draft_length(acceptance.rate, self.k_max, round_s[0], self.draft_token_s), new - made - 1)
            sent = env.now
            yield env.timeout(k * self.draft_token_s + (self.rtt_s / 2 if made else 0.0))
            yield self.submit(k + 1, made == 0)
            yield env.timeout(self.rtt_s / 2)
            kept = min(k, trace[min(made, len(trace) - 1)])
            if k > 0:
                acceptance.update(kept, k)
            round_s[0] = 0.7 * round_s[0] + 0.3 * (env.now - sent - k * self.draft_token_s)
            self.latencies += [(env.now - started) / (kept + 1)] * (kept + 1)
            started, made = env.now, made + kept + 1
        self.tokens += made


def simulate(policy: Policy, devices: int, traces: Sequence[list[int]], costs: ForwardCosts, rtt_s: float,
             draft_token_s: float, new: int = 128, requests: int = 2, k_max: int = 12) -> dict[str, Any]:
    """``devices`` devices each making ``requests`` requests of ``new`` tokens back to back under
    ``policy``; returns the fleet's figures (module doc)."""
    fleet = _Fleet(costs, rtt_s, draft_token_s, k_max)

    def device(d: int) -> Any:
        acceptance, round_s = AcceptanceRate(), [0.05]  # a device's running estimates, across its requests
        for r in range(requests):
            if policy == "api":
                yield from fleet.api_request(new)
            else:
                yield from fleet.sd_request(new, traces[(d + r) % len(traces)], acceptance, round_s)

    fleet.env.process(fleet.serve())
    for d in range(devices):
        fleet.env.process(device(d))
    fleet.env.run()
    wall = fleet.env.now
    return {"policy": policy, "devices": devices, "rtt_ms": rtt_s * 1e3, "tokens": fleet.tokens, "seconds": wall,
            "tokens_per_second": fleet.tokens / wall,
            # target forwards per generated token: per session (a round, a decode step, a prefill), and batched
            "server_rows_per_token": fleet.rows / fleet.tokens, "server_forwards_per_token": fleet.forwards / fleet.tokens,
            "server_busy_share": fleet.busy_s / wall, "mean_batch_rows": fleet.rows / max(fleet.forwards, 1),
            "p95_time_per_token_s": float(np.percentile(fleet.latencies, 95)),
            "mean_time_per_token_s": float(np.mean(fleet.latencies))}


def devices_at_slo(rows: Sequence[dict[str, Any]], policy: Policy, slo_s: float) -> int:
    """The most devices (of those simulated) served with p95 time per token within ``slo_s``,
    every smaller fleet meeting it too; 0 if even one device misses it."""
    best = 0
    for row in sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["devices"]):
        if row["p95_time_per_token_s"] > slo_s:
            break
        best = row["devices"]
    return best


def ratio(a: float, b: float) -> float:
    return a / b if b else (math.inf if a else 1.0)
