"""The language model's OpenAI API (``trickle serve --llm``): ``POST /v1/completions``,
``POST /v1/chat/completions``, ``GET /v1/models``, and the admin's API keys at ``/v1/llm/keys``.

    client = openai.OpenAI(base_url="http://127.0.0.1:8080/v1", api_key=KEY)
    client.chat.completions.create(model="base", messages=[{"role": "user", "content": "Who's there?"}])

What each request may ask is ``server.llm.schema``; the generation is ``LlmService``
(``server.llm.completions``). A request holds one generation slot for all its choices, run one
after another: choice i is prompt i // n sampled with seed + i % n, so a seed fixes every choice
and the draft changes none. ``logprobs`` are the target's own, from one forward over the prompt and
the choice once it is done (whatever decoded it). Streaming sends OpenAI's chunks: a choice's text
as it is verified (never text a stop may still cut), ``finish_reason`` null until its last chunk,
then with ``stream_options.include_usage`` a chunk of usage and no choices, then ``[DONE]``.

Access: an API key the admin made (``server.store.llm_keys``: stored as its sha256, its use counted
per key and shown on the dashboard) or the admin token; anyone with ``--llm-open``. Errors are
OpenAI's error objects (``OpenAIError``), their messages bounded.
"""

import asyncio
import json
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import BaseModel, ConfigDict, Field

from edge.core.errors import TrickleError
from server.llm.completions import Completion, LlmService, PromptError, QueueFullError, TokenScore
from server.llm.schema import MAX_CHOICES, MAX_TOKENS, ChatIn, CompletionIn, OpenAIError

# OpenAI's paths, not edge.contract.protocol.ROUTES (the device protocol): they exist only when a
# model is loaded
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
MODELS = "/v1/models"
KEYS = "/v1/llm/keys"  # admin: the API keys of these routes
PATHS = (COMPLETIONS, CHAT, MODELS)  # the OpenAI-style routes: errors in OpenAI's shape, API keys
NOT_STREAMED = "logprobs with stream is not supported: ask without stream"


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


@dataclass
class LlmAccess:
    """Who may use the LLM routes: ``open`` (anyone), else the admin token or a live API key of
    ``keys`` (the store: ``server.store.llm_keys``); ``admin`` is the admin-only dependency that
    guards the key routes."""

    open: bool
    is_admin: Callable[[str], bool]
    keys: Any
    admin: Callable[..., Any]

    def caller(self, token: str | None) -> str | None:
        """The key's name ("admin" for the admin token; None when open and anonymous); 401 otherwise."""
        if token and self.is_admin(token):
            return "admin"
        name = self.keys.llm_key_name(token) if token and len(token) <= 512 else None
        if name is not None:
            return str(name)
        if self.open:
            return None
        raise OpenAIError(401, "missing API key (Authorization: Bearer KEY)" if not token else "invalid or revoked API key",
                          type="authentication_error", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class KeyIn(BaseModel):
    """A new API key's name."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass
class Admitted:
    """One admitted request: its prompts as token ids, its sampling, who asked."""

    id: str
    object: str  # "text_completion" or "chat.completion"
    created: int
    model: str
    prompts: list[list[int]]
    max_tokens: int
    body: Any
    seed: int
    caller: str | None

    @property
    def choices(self) -> int:
        return len(self.prompts) * int(self.body.n)

    def prompt(self, index: int) -> list[int]:
        return self.prompts[index // self.body.n]

    def head(self, suffix: str = "") -> dict[str, Any]:
        return {"id": self.id, "object": self.object + suffix, "created": self.created, "model": self.model}

    def usage(self, done: list[Completion]) -> dict[str, int]:
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(c.completion_tokens for c in done)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class OpenAIApi:
    """The routes' work over one ``LlmService``: admission, generation of the choices, logprobs,
    the response bodies and the use of each key."""

    def __init__(self, llm: LlmService, metrics: LlmMetrics, access: LlmAccess) -> None:
        self.llm, self.metrics, self.access = llm, metrics, access

    def served(self, model: str | None) -> str:
        if model is not None and model != self.llm.name:
            raise OpenAIError(404, f"model {model[:80]!r} is not served here (GET /v1/models: {self.llm.name!r})",
                              param="model", code="model_not_found")
        return self.llm.name

    def card(self) -> dict[str, Any]:
        llm = self.llm
        return {"id": llm.name, "object": "model", "created": llm.loaded, "owned_by": "trickle",
                "context": llm.context, "speculative": llm.speculative}

    def admit(self, body: Any, prompts: list[str | list[int]], max_tokens: int | None, who: str | None,
              chat: bool = False) -> Admitted:
        """Checked prompts and a generation slot's place in the queue (400, 404, 503 otherwise)."""
        model, llm = self.served(body.model), self.llm
        if len(prompts) * body.n > MAX_CHOICES:
            raise OpenAIError(400, f"{len(prompts)} prompts × n {body.n} is over {MAX_CHOICES} choices a request", param="n")
        if body.stream and body.logprobs not in (None, False):
            raise OpenAIError(400, NOT_STREAMED, param="logprobs")
        try:
            if max_tokens is None:  # chat without a limit: what the context leaves
                first = llm.encode(prompts[0], 0, chat)
                max_tokens = min(MAX_TOKENS, (llm.context or MAX_TOKENS + len(first)) - len(first))
                if max_tokens < 1:
                    raise PromptError(f"the messages fill the model's context of {llm.context} tokens")
            ids = [llm.encode(p, max_tokens, chat) for p in prompts]  # a chat template's markers are its own
        except PromptError as err:
            self.metrics.rejected.labels("context").inc()
            raise OpenAIError(400, str(err), param="max_tokens" if "max_tokens" in str(err) else "prompt",
                              code="context_length_exceeded" if "context" in str(err) else "invalid_prompt") from None
        try:
            llm.admit()
        except QueueFullError as err:
            self.metrics.rejected.labels("queue_full").inc()
            raise OpenAIError(503, str(err), type="server_error", code="overloaded", headers={"Retry-After": "1"}) from None
        seed = body.seed if body.seed is not None else secrets.randbits(62)
        return Admitted(f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}",
                        "chat.completion" if chat else "text_completion", int(time.time()), model, ids, max_tokens,
                        body, seed, who)

    def generate(self, req: Admitted, index: int, on_text: Callable[[str], None] | None = None) -> Completion:
        """Choice ``index`` (blocking)."""
        b = req.body
        done = self.llm.complete(req.prompt(index), req.max_tokens, b.temperature, b.top_p,
                                 (req.seed + index % b.n) % 2**63, on_text, b.stops)
        self.metrics.record(done)
        return done

    async def run(self, req: Admitted, index: int, on_text: Callable[[str], None] | None = None) -> Completion:
        return await anyio.to_thread.run_sync(self.generate, req, index, on_text)

    async def all_choices(self, req: Admitted, logprobs: Callable[[Admitted, int, Completion], Any] | None
                          ) -> tuple[list[Completion], list[Any]]:
        """Every choice, and its logprobs when asked, holding a generation slot (not streamed)."""
        try:
            async with self.llm.slots:
                done = [await self.run(req, i) for i in range(req.choices)]
                scored = [await anyio.to_thread.run_sync(logprobs, req, i, d) if logprobs else None
                          for i, d in enumerate(done)]
        finally:
            self.llm.leave()
        await anyio.to_thread.run_sync(self.record_use, req, done)
        return done, scored

    def record_use(self, req: Admitted, done: list[Completion]) -> None:
        if req.caller is not None and req.caller != "admin":
            use = req.usage(done)
            self.access.keys.record_llm_use(req.caller, use["prompt_tokens"], use["completion_tokens"])

    def report(self, done: list[Completion]) -> dict[str, Any]:
        """trickle's decoding report of some choices."""
        calls = sum(c.target_calls for c in done)
        tokens = sum(c.completion_tokens for c in done)
        seconds = sum(c.completion_tokens / c.tokens_per_second for c in done if c.tokens_per_second)
        return {"tokens_per_second": tokens / seconds if seconds else 0.0, "accept_length": tokens / calls if calls else 0.0,
                "target_calls": calls, "speculative": self.llm.speculative}

    def scores(self, req: Admitted, index: int, done: Completion, top: int, echo: bool = False) -> list[TokenScore]:
        """The target's logprobs of choice ``index`` (and of its prompt when ``echo``)."""
        prompt = req.prompt(index)
        return self.llm.score(prompt + _kept_tokens(self.llm, done), 0 if echo else len(prompt), top)

    def text_logprobs(self, req: Admitted, index: int, done: Completion) -> dict[str, Any]:
        """OpenAI's completion logprobs: tokens, their logprobs, the top ones, text offsets."""
        scores = self.scores(req, index, done, req.body.logprobs, req.body.echo)
        offsets = [sum(len(s.text) for s in scores[:i]) for i in range(len(scores))]
        # reversed: of tokens spelled alike (bytes of one character), the likeliest is kept
        return {"tokens": [s.text for s in scores], "token_logprobs": [s.logprob for s in scores],
                "top_logprobs": [dict(reversed(s.top)) if s.logprob is not None else None for s in scores],
                "text_offset": offsets}

    def chat_logprobs(self, req: Admitted, index: int, done: Completion) -> dict[str, Any]:
        """OpenAI's chat logprobs: per token its text, logprob, bytes and top alternatives."""
        def entry(text: str, logprob: float) -> dict[str, Any]:
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        return {"content": [{**entry(s.text, s.logprob or 0.0), "top_logprobs": [entry(t, v) for t, v in s.top]}
                            for s in self.scores(req, index, done, req.body.top_logprobs or 0)]}

    async def completion(self, body: CompletionIn, who: str | None) -> Any:
        req = self.admit(body, body.prompts(), body.max_tokens if body.max_tokens is not None else 16, who)
        echo = [p if isinstance(p, str) else self.llm.decode(list(p)) for p in body.prompts()] if body.echo else None

        def choice(i: int, text: str, finish: str | None, logprobs: Any = None) -> dict[str, Any]:
            return {"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish}

        if not body.stream:
            done, lp = await self.all_choices(req, self.text_logprobs if body.logprobs is not None else None)
            return {**req.head(), "usage": req.usage(done), "trickle": self.report(done),
                    "choices": [choice(i, (echo[i // body.n] if echo else "") + d.text, d.finish_reason, lp[i])
                                for i, d in enumerate(done)]}

        async def chunks(i: int, done: list[Completion]) -> AsyncIterator[dict[str, Any]]:
            if echo is not None:
                yield {"choices": [choice(i, echo[i // body.n], None)]}
            async for piece in self.streamed(req, i, done):
                yield {"choices": [choice(i, piece, None)]}
            yield {"choices": [choice(i, "", done[-1].finish_reason)], "trickle": self.report(done[-1:])}

        return self.sse(req, chunks, "")

    async def chat(self, body: ChatIn, who: str | None) -> Any:
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
        try:
            rendered = self.llm.render_chat(messages)
        except PromptError as err:
            raise OpenAIError(400, str(err), param="messages", code="no_chat_template") from None
        except Exception as err:  # the template's own checks (e.g. roles it does not take): the user's error
            raise OpenAIError(400, f"the model's chat template refused the messages: {err}", param="messages") from None
        req = self.admit(body, [rendered], body.completion_limit, who, chat=True)
        if not body.stream:
            done, lp = await self.all_choices(req, self.chat_logprobs if body.logprobs else None)
            return {**req.head(), "usage": req.usage(done), "trickle": self.report(done),
                    "choices": [{"index": i, "message": {"role": "assistant", "content": d.text, "refusal": None},
                                 "logprobs": lp[i], "finish_reason": d.finish_reason} for i, d in enumerate(done)]}

        def choice(i: int, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return {"choices": [{"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}]}

        async def chunks(i: int, done: list[Completion]) -> AsyncIterator[dict[str, Any]]:
            yield choice(i, {"role": "assistant", "content": ""}, None)
            async for piece in self.streamed(req, i, done):
                yield choice(i, {"content": piece}, None)
            yield {**choice(i, {}, done[-1].finish_reason), "trickle": self.report(done[-1:])}

        return self.sse(req, chunks, ".chunk")

    async def streamed(self, req: Admitted, index: int, done: list[Completion]) -> AsyncIterator[str]:
        """Choice ``index``'s text as it is verified; its Completion appended to ``done`` at the end."""
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[str | None] = asyncio.Queue()
        cancelled = threading.Event()

        def on_text(piece: str) -> None:
            if cancelled.is_set():
                raise _CancelledError
            loop.call_soon_threadsafe(pieces.put_nowait, piece)

        async def produce() -> Completion:
            try:
                return await self.run(req, index, on_text)
            finally:
                pieces.put_nowait(None)

        task = asyncio.ensure_future(produce())
        try:
            while (piece := await pieces.get()) is not None:
                yield piece
            done.append(await task)
        finally:
            cancelled.set()
            if not task.done():  # the client left: the generation stops at its next block
                await asyncio.shield(asyncio.wait([task]))

    def sse(self, req: Admitted, chunks: Callable[[int, list[Completion]], AsyncIterator[dict[str, Any]]],
            suffix: str) -> StreamingResponse:
        """Server-sent events of every choice's chunks (``req.head`` + each), the usage chunk when
        asked, ``[DONE]``; the request's generation slot held while they run."""
        def event(chunk: dict[str, Any]) -> str:
            return f"data: {json.dumps({**req.head(suffix), **chunk})}\n\n"

        async def events() -> AsyncIterator[str]:
            try:
                async with self.llm.slots:
                    done: list[Completion] = []
                    try:
                        for i in range(req.choices):
                            async for chunk in chunks(i, done):
                                yield event(chunk)
                    except TrickleError as err:
                        yield f"data: {json.dumps(OpenAIError(500, str(err), type='server_error').body())}\n\n"
                        return
                    await anyio.to_thread.run_sync(self.record_use, req, done)
                    if req.body.include_usage:
                        yield event({"choices": [], "usage": req.usage(done)})
                    yield "data: [DONE]\n\n"
            finally:
                self.llm.leave()

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def llm_router(llm: LlmService, registry: CollectorRegistry, access: LlmAccess) -> APIRouter:
    """The OpenAI-style routes over ``llm`` (completions, chat, models) and the admin's API-key
    routes, their metrics in ``registry``."""
    api = OpenAIApi(llm, LlmMetrics(registry), access)
    router = APIRouter()
    bearer = HTTPBearer(auto_error=False)
    # client–server verification (server.llm.verify): rounds verified and the batched target forwards they took
    verified = Gauge("trickle_llm_verify_rounds", "Verification rounds answered", registry=registry)
    forwards = Gauge("trickle_llm_verify_forwards", "Target forwards that verified them (batched across sessions)",
                     registry=registry)
    verified.set_function(lambda: llm._sessions.verified if llm._sessions is not None else 0)
    forwards.set_function(lambda: llm._sessions.rounds if llm._sessions is not None else 0)

    def caller(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> str | None:
        return access.caller(credentials.credentials if credentials else None)

    def not_a_key(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
        """An API key is known, but not the admin's: 403, not the admin check's 401 for a token it does not know."""
        token = credentials.credentials if credentials else None
        if token and len(token) <= 512 and access.keys.llm_key_name(token) is not None:
            raise OpenAIError(403, "the key routes need the admin token, not an API key", type="permission_error",
                              code="insufficient_permissions")

    Caller = Annotated[str | None, Depends(caller)]
    Admin = Annotated[Any, Depends(access.admin)]
    admin_only = [Depends(not_a_key)]  # before Admin: an API key's 403

    @router.get(MODELS)
    def models(_: Caller) -> dict[str, Any]:
        return {"object": "list", "data": [api.card()]}

    @router.get(MODELS + "/{model}")
    def model(model: str, _: Caller) -> dict[str, Any]:
        api.served(model)
        return api.card()

    @router.post(COMPLETIONS)
    async def completions(body: CompletionIn, who: Caller) -> Any:
        return await api.completion(body, who)

    @router.post(CHAT)
    async def chat(body: ChatIn, who: Caller) -> Any:
        return await api.chat(body, who)

    @router.post(KEYS, status_code=201, dependencies=admin_only)
    def add_key(body: KeyIn, _: Admin) -> dict[str, Any]:
        """A new API key for the LLM routes (shown only in this answer; the server keeps its hash)."""
        try:
            return {"name": body.name, "key": access.keys.add_llm_key(body.name)}
        except TrickleError as err:
            raise OpenAIError(409, str(err), param="name", code="key_exists") from None

    @router.get(KEYS, dependencies=admin_only)
    def keys(_: Admin) -> dict[str, Any]:
        """Every API key (never the key itself) with what it used."""
        return {"keys": access.keys.llm_keys()}

    @router.delete(KEYS + "/{name}", dependencies=admin_only)
    def revoke(name: str, _: Admin) -> dict[str, Any]:
        if not access.keys.revoke_llm_key(name):
            raise OpenAIError(404, f"no live API key named {name[:80]!r}", code="key_not_found")
        return {"name": name, "revoked": True}

    return router


def _kept_tokens(llm: LlmService, done: Completion) -> list[int]:
    """The choice's tokens up to the text it returns (a stop text cuts inside the last block; an
    end-of-text token stays, with its logprob)."""
    if done.finish_reason == "stop" and llm.decode(done.tokens) != done.text:
        for n in range(len(done.tokens) + 1):
            if len(llm.decode(done.tokens[:n])) >= len(done.text):
                return done.tokens[:n]
    return done.tokens


class _CancelledError(Exception):
    """The client went away mid-stream."""
