"""A language model served over HTTP: OpenAI-compatible ``POST /v1/completions``, speculative
decoding inside when a draft model is loaded.

    trickle serve --llm runs/lm/base --draft runs/lm/draft-moa --tree 5x2x3 --llm-concurrency 1 --llm-queue 16
    curl -s localhost:8080/v1/completions -d '{"prompt": "ROMEO:", "max_tokens": 32, "temperature": 0}'

The target is a Hugging Face causal LM in a local folder (``save_pretrained``); the draft is a
folder of ``trickle train draft`` (MoA, EAGLE-style or independent) or any causal LM sharing the
target's vocabulary. Decoding is ``auto`` by default: each round drafts the chain length (0, plain
decoding, included) that the costs measured at load and kept current from timings say is fastest
(``edge.llm.cost``), so a draft that does not pay on this machine is left idle, and sampling is
coupled, so a seed gives the same text with any draft or none. Otherwise a chain of K tokens, of
adaptive length, or a tree (``models.lm.speculative``). Without a draft every token is one target
call (the same verify loop with a drafter that proposes nothing). At most ``concurrency``
generations run at once; up to ``queue`` more wait; beyond that a request gets 503 at once, so
memory stays bounded. A prompt that leaves no room for ``max_tokens`` in the model's context gets
400 naming the limit.

Torch and transformers are imported only when a model is loaded (``trickle --help`` stays fast).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
from fastapi import APIRouter, HTTPException
from fastapi.responses import StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import BaseModel, ConfigDict, Field

from edge.core.errors import ConfigError, TrickleError

# OpenAI's path, not one of edge.contract.protocol.ROUTES: those are the device protocol, and this
# route exists only when a model is loaded
COMPLETIONS = "/v1/completions"
MAX_TOKENS = 4096  # per request, whatever the context allows
MAX_PROMPT_CHARS = 1 << 20


class PromptError(TrickleError):
    """A prompt the model cannot take (too long for its context, or no tokens)."""


class QueueFullError(TrickleError):
    """Every generation slot is busy and the waiting queue is full."""


class CompletionIn(BaseModel):
    """OpenAI's completion request (the fields trickle uses; others are ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    max_tokens: int = Field(16, ge=1, le=MAX_TOKENS)
    temperature: float = Field(1.0, ge=0, le=2, description="0 is greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="default: a fresh random seed")
    stream: bool = Field(False, description="server-sent events, one per verified block of tokens")


class Choice(BaseModel):
    """One completion, OpenAI-style."""

    index: int = 0
    text: str
    finish_reason: Literal["length", "stop"] | None


class Usage(BaseModel):
    """Tokens in and out, OpenAI-style."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class DecodeReport(BaseModel):
    """How the completion was decoded: tokens per second, accept length, target calls, and whether a
    draft was used."""

    tokens_per_second: float
    accept_length: float = Field(description="mean tokens added per target call, its own token included")
    target_calls: int
    speculative: bool


class CompletionOut(BaseModel):
    """The answer of ``POST /v1/completions``, OpenAI-style, with trickle's decoding report."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None
    trickle: DecodeReport | None = None


@dataclass
class Completion:
    """One generation: the text, the token counts and what it cost."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: Literal["length", "stop"]
    tokens_per_second: float
    accept_length: float
    target_calls: int
    speculative: bool


def _load_lm(path: Path, field: str) -> Any:
    if not (path / "config.json").is_file():
        raise ConfigError(field, str(path), "needs a folder with a causal LM saved by save_pretrained (config.json, weights)")
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    except (OSError, ValueError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(field, str(path), f"not a loadable causal LM ({first})") from None


def _draft_kind(folder: Path) -> str:
    """The kind a draft folder written by ``trickle train draft`` records; any other LM folder is independent."""
    manifest = folder / "draft.json"
    try:
        return str(json.loads(manifest.read_text())["kind"]) if manifest.is_file() else "independent"
    except (ValueError, KeyError) as err:
        raise ConfigError("llm_draft", str(folder), f"draft.json is unreadable ({err})") from None


class LlmService:
    """A target model, an optional draft, their tokenizer, and the admission limits."""

    def __init__(self, target: Any, tokenizer: Any, draft: Any | None = None, name: str = "trickle-lm",
                 concurrency: int = 1, queue: int = 16, drafter: Callable[[], Any] | None = None, k: int = 4,
                 adaptive: bool = False, tree: str | None = None, auto: bool = True) -> None:
        from models.lm.speculative import Tree

        self.target, self.tokenizer, self.draft, self.name = target, tokenizer, draft, name
        self.k, self.adaptive = k, adaptive
        self.auto = auto and not adaptive and not tree  # auto decoding, unless another mode is asked for
        self.cost: Any = None  # auto's DecodeCost: measured at load (or at the first generation), kept current
        self.draft_vocab: list[int] | None = None  # an independent draft's draft vocabulary (models.lm.speculative.DraftHead)
        self.tree = Tree(*(int(n) for n in tree.split("x"))) if tree else None  # DEPTHxBRANCHxWIDTH
        # a fresh Drafter per request (drafters keep per-sequence state); by default around the draft LM
        self.make_drafter = drafter
        self.concurrency, self.queue = concurrency, queue
        limits = [getattr(m.config, "max_position_embeddings", None) for m in (target, draft) if m is not None]
        self.context = min((int(n) for n in limits if n), default=None)
        self.admitted = 0  # running + waiting; touched only on the event loop
        self._slots: asyncio.Semaphore | None = None
        self._sessions: Any = None
        self._sessions_lock = threading.Lock()
        self.moa: Any = None  # the MoA draft's module, when the draft is one (its states go to devices)

    @classmethod
    def load(cls, target_dir: Path, draft_dir: Path | None = None, concurrency: int = 1, queue: int = 16, k: int = 4,
             adaptive: bool = False, tree: str | None = None, auto: bool = True) -> LlmService:
        import torch

        torch.set_num_threads(1)  # batch 1 on CPU: one thread per generation is faster under contention
        from transformers import AutoTokenizer

        target = _load_lm(target_dir, "llm")
        try:
            tokenizer = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
        except (OSError, ValueError, KeyError) as err:
            raise ConfigError("llm", str(target_dir), f"has no loadable tokenizer ({type(err).__name__})") from None
        decoding: dict[str, Any] = {"k": k, "adaptive": adaptive, "tree": tree, "auto": auto}
        if draft_dir is not None and _draft_kind(draft_dir) in ("moa", "eagle"):  # trickle train draft --kind moa|eagle
            from models.lm.draft import load_drafter

            reader: Any = load_drafter(draft_dir, target)
            # a fresh drafter per request around the same weights (drafters keep per-sequence caches)
            service = cls(target, tokenizer, None, target_dir.name, concurrency, queue,
                          drafter=lambda: type(reader)(reader.draft, reader.vocab), **decoding)
            if _draft_kind(draft_dir) == "moa":
                service.moa = reader.draft
            service.auto_session()  # auto decoding's costs, measured now rather than in the first request
            return service
        draft = _load_lm(draft_dir, "llm_draft") if draft_dir is not None else None
        if draft is not None and draft.config.vocab_size != target.config.vocab_size:
            raise ConfigError("llm_draft", str(draft_dir), f"vocabulary of {draft.config.vocab_size} tokens; the target's "
                              f"has {target.config.vocab_size} (a draft must share the target's tokenizer)")
        service = cls(target, tokenizer, draft, target_dir.name, concurrency, queue, **decoding)
        if draft_dir is not None and (draft_dir / "draft.json").is_file():  # trickle train draft --kind independent
            service.draft_vocab = json.loads((draft_dir / "draft.json").read_text()).get("draft_vocab")
        service.auto_session()
        return service

    def encode(self, prompt: str, max_tokens: int) -> list[int]:
        ids: list[int] = self.tokenizer(prompt)["input_ids"]
        if not ids:
            raise PromptError("the prompt has no tokens")
        if self.context is not None and len(ids) + max_tokens > self.context:
            raise PromptError(f"prompt of {len(ids)} tokens + max_tokens {max_tokens} is over the model's context of "
                              f"{self.context} tokens (at most {self.context - max_tokens} prompt tokens)")
        return ids

    def decode(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))

    def complete(self, prompt: str | list[int], max_tokens: int = 16, temperature: float = 1.0, top_p: float = 1.0,
                 seed: int = 0, on_tokens: Callable[[list[int]], None] | None = None) -> Completion:
        """Generate (blocking): speculative decoding when a draft is loaded, else plain."""
        from models.lm.speculative import speculative_generate

        ids = self.encode(prompt, max_tokens) if isinstance(prompt, str) else prompt
        eos = self.tokenizer.eos_token_id
        tokens, stats = speculative_generate(self.target, self.drafter(), ids, max_tokens, k=self.k, temperature=temperature,
                                             top_p=top_p, seed=seed, eos_token_id=eos, on_tokens=on_tokens,
                                             tree=self.tree if self.speculative else None, adaptive=self.adaptive,
                                             auto=self.auto_session())
        stopped = eos is not None and bool(tokens) and tokens[-1] == eos
        return Completion(self.decode(tokens), len(ids), len(tokens), "stop" if stopped else "length",
                          stats.tokens_per_second, stats.accept_length, stats.target_calls, self.speculative)

    def drafter(self) -> Any:
        """A fresh Drafter for one generation (drafters keep per-sequence state)."""
        from models.lm.speculative import IndependentDrafter, NoDrafter

        if self.make_drafter is not None:
            return self.make_drafter()
        return IndependentDrafter(self.draft, self.draft_vocab) if self.draft is not None else NoDrafter()

    def auto_session(self) -> Any:
        """Auto decoding's per-generation choices (None in another mode). Without a draft every round
        decodes plainly, and sampling is coupled all the same: a seed gives the same text with a draft
        or without."""
        if not self.auto:
            return None
        from edge.llm.cost import DecodeCost
        from models.lm.speculative import calibrate

        if not self.speculative:
            return DecodeCost.prior(verify_s=1.0, draft_token_s=1.0).session(0)
        with self._sessions_lock:
            if self.cost is None:  # measured once, on this machine, then kept current by every generation
                self.cost = calibrate(self.target, self.drafter(), self.k)
        return self.cost.session(self.k)

    def sessions(self) -> Any:
        """The target's client–server verification sessions (``server.llm.verify``), made once."""
        with self._sessions_lock:  # requests run on a thread pool
            if self._sessions is None:
                from server.llm.verify import VerifySessions

                self._sessions = VerifySessions(self.target, moa=self.moa)
            return self._sessions

    @property
    def speculative(self) -> bool:
        return self.draft is not None or self.make_drafter is not None

    # admission: at most `concurrency` running, `queue` waiting, the rest refused (event loop only)
    def admit(self) -> None:
        if self.admitted >= self.concurrency + self.queue:
            raise QueueFullError(f"{self.concurrency} generations running and {self.queue} waiting: try again later")
        self.admitted += 1

    def leave(self) -> None:
        self.admitted -= 1

    @property
    def slots(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.concurrency)
        return self._slots


class LlmMetrics:
    """Prometheus metrics of the language model, in the server's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.tokens = Counter("trickle_llm_tokens_generated", "Completion tokens generated", registry=registry)
        self.requests = Counter("trickle_llm_requests", "Completions served", ["mode"], registry=registry)
        self.rejected = Counter("trickle_llm_requests_rejected", "Completion requests refused", ["reason"],
                                registry=registry)
        self.speed = Histogram("trickle_llm_tokens_per_second", "Decoding speed per request", registry=registry,
                               buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000))
        self.accept = Histogram("trickle_llm_accept_length", "Mean tokens per target call per request",
                                registry=registry, buckets=(1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 8))

    def record(self, done: Completion) -> None:
        self.tokens.inc(done.completion_tokens)
        self.requests.labels("speculative" if done.speculative else "plain").inc()
        self.speed.observe(done.tokens_per_second)
        self.accept.observe(done.accept_length)


def _response(request_id: str, created: int, model: str, text: str, finish: Literal["length", "stop"] | None,
              done: Completion | None) -> CompletionOut:
    usage = report = None
    if done is not None:
        usage = Usage(prompt_tokens=done.prompt_tokens, completion_tokens=done.completion_tokens,
                      total_tokens=done.prompt_tokens + done.completion_tokens)
        report = DecodeReport(tokens_per_second=done.tokens_per_second, accept_length=done.accept_length,
                              target_calls=done.target_calls, speculative=done.speculative)
    return CompletionOut(id=request_id, created=created, model=model, choices=[Choice(text=text, finish_reason=finish)],
                         usage=usage, trickle=report)


class _CancelledError(Exception):
    """The client went away mid-stream."""


def llm_router(llm: LlmService, registry: CollectorRegistry) -> APIRouter:
    """The completion route over ``llm``, its metrics in ``registry``."""
    metrics = LlmMetrics(registry)
    router = APIRouter()
    # client–server verification (server.llm.verify): rounds verified and the batched target forwards they took
    verified = Gauge("trickle_llm_verify_rounds", "Verification rounds answered", registry=registry)
    forwards = Gauge("trickle_llm_verify_forwards", "Target forwards that verified them (batched across sessions)",
                     registry=registry)
    verified.set_function(lambda: llm._sessions.verified if llm._sessions is not None else 0)
    forwards.set_function(lambda: llm._sessions.rounds if llm._sessions is not None else 0)

    def admit(body: CompletionIn) -> list[int]:
        try:
            ids = llm.encode(body.prompt, body.max_tokens)
        except PromptError as err:
            metrics.rejected.labels("context").inc()
            raise HTTPException(400, str(err)) from None
        try:
            llm.admit()
        except QueueFullError as err:
            metrics.rejected.labels("queue_full").inc()
            raise HTTPException(503, str(err), headers={"Retry-After": "1"}) from None
        return ids

    @router.post(COMPLETIONS, response_model=CompletionOut, response_model_exclude_none=False)
    async def completions(body: CompletionIn) -> Any:
        ids = admit(body)
        seed = body.seed if body.seed is not None else secrets.randbits(63)
        request_id, created, model = f"cmpl-{secrets.token_hex(12)}", int(time.time()), body.model or llm.name

        def generate(on_tokens: Callable[[list[int]], None] | None = None) -> Completion:
            return llm.complete(ids, body.max_tokens, body.temperature, body.top_p, seed, on_tokens)

        if not body.stream:
            try:
                async with llm.slots:
                    done = await anyio.to_thread.run_sync(generate)
            finally:
                llm.leave()
            metrics.record(done)
            return _response(request_id, created, model, done.text, done.finish_reason, done)
        return StreamingResponse(_stream(llm, metrics, generate, request_id, created, model),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    return router


async def _stream(llm: LlmService, metrics: LlmMetrics, generate: Callable[[Callable[[list[int]], None]], Completion],
                  request_id: str, created: int, model: str) -> AsyncIterator[str]:
    """SSE: one chunk per verified block (text decoded so far minus text sent), a last chunk with
    the finish reason, usage and cost, then ``[DONE]``."""
    loop = asyncio.get_running_loop()
    blocks: asyncio.Queue[list[int] | None] = asyncio.Queue()
    cancelled = threading.Event()

    def on_tokens(block: list[int]) -> None:
        if cancelled.is_set():
            raise _CancelledError
        loop.call_soon_threadsafe(blocks.put_nowait, block)

    def run() -> Completion:
        try:
            return generate(on_tokens)
        finally:
            loop.call_soon_threadsafe(blocks.put_nowait, None)

    def event(out: CompletionOut) -> str:
        return f"data: {out.model_dump_json(exclude_none=True)}\n\n"

    try:
        async with llm.slots:
            task = loop.run_in_executor(None, run)
            try:
                tokens: list[int] = []
                sent = ""
                while (block := await blocks.get()) is not None:
                    tokens += block
                    text = llm.decode(tokens)
                    if text.endswith("\ufffd") or not text.startswith(sent) or text == sent:
                        continue  # a character split across tokens: wait for the rest of it
                    yield event(_response(request_id, created, model, text[len(sent):], None, None))
                    sent = text
                try:
                    done = await task
                except TrickleError as err:
                    yield f"data: {json.dumps({'error': {'message': str(err)}})}\n\n"
                    return
                metrics.record(done)
                rest = done.text[len(sent):] if done.text.startswith(sent) else done.text
                yield event(_response(request_id, created, model, rest, done.finish_reason, done))
                yield "data: [DONE]\n\n"
            finally:
                cancelled.set()
                if not task.done():  # the client left: the generation stops at its next block
                    await asyncio.shield(asyncio.wait([task]))
    finally:
        llm.leave()
