"""The OpenAI API as clients send it: the requests of ``/v1/completions`` and ``/v1/chat/completions``
and OpenAI's error object.

Every field a client may send is named here; anything else (``tools``, ``response_format``,
``suffix`` …) is refused with a 400 that names it, never ignored. A few fields are accepted only
at the value that means "off" (``best_of`` 1, penalties 0, an empty ``logit_bias``), so a client
that always sends them still works. Prompts are a string, a list of strings, token ids or a list
of token-id lists (one set of ``n`` choices per prompt).
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_TOKENS = 4096  # per choice, whatever the context allows
MAX_PROMPT_CHARS = 1 << 20
MAX_CHOICES = 16  # prompts × n in one request
MAX_STOPS = 4  # OpenAI's limit
MAX_MESSAGES = 256
ERROR_CHARS = 300  # an error's message is cut to this (never the whole input)


class OpenAIError(Exception):
    """An error answered as OpenAI's ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        message = self.message if len(self.message) <= ERROR_CHARS else self.message[:ERROR_CHARS] + "…"
        return {"error": {"message": message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    """What a stream adds: a last chunk of usage."""

    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False
    """A last chunk (no choices) with the request's token counts."""


class _Request(BaseModel):
    """What both routes take."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    """A model of ``GET /v1/models`` (default: the one served)."""
    max_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS)
    temperature: float = Field(1.0, ge=0, le=2, description="0 is greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="choices per prompt; choice j samples with seed + j")
    stop: str | list[str] | None = None
    """Up to 4 texts; a choice ends before the first of them (finish_reason "stop")."""
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="default: a fresh random seed")
    stream: bool = Field(False, description="server-sent events, one per verified block of text")
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256, description="the end user's name (recorded nowhere)")
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > MAX_STOPS or any(not s or len(s) > 256 for s in stops):
            raise ValueError(f"at most {MAX_STOPS} stop texts of 1 to 256 characters")
        return stops

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float) -> float:
        if value:
            raise ValueError("not supported (only 0)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("not supported (only an empty one)")
        return value

    @property
    def stops(self) -> list[str]:
        return list(self.stop or [])  # a list once validated

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionIn(_Request):
    """OpenAI's completion request."""

    prompt: Prompt = Field(description="a string, a list of strings, token ids or a list of token-id lists")
    logprobs: int | None = Field(None, ge=0, le=5, description="the log-probability of each token and its top ones")
    echo: bool = Field(False, description="the prompt before the completion (its tokens' logprobs too)")
    best_of: int | None = Field(None, ge=1, le=1, description="only 1")
    suffix: None = Field(None, description="not supported")

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, prompt: Prompt) -> Prompt:
        items = _items(prompt)
        if not items or any(not item for item in items):
            raise ValueError("needs at least one prompt, none empty")
        if len(items) > MAX_CHOICES:
            raise ValueError(f"at most {MAX_CHOICES} prompts")
        if sum(len(item) for item in items) > MAX_PROMPT_CHARS:
            raise ValueError(f"prompts of at most {MAX_PROMPT_CHARS} characters or tokens in all")
        return prompt

    def prompts(self) -> list[str | list[int]]:
        """Each prompt: a string or its token ids."""
        return _items(self.prompt)


def _items(prompt: Prompt) -> list[str | list[int]]:
    """A request's prompts: one string or id list, or each of a list of them."""
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(t, int) for t in prompt):
        return [[t for t in prompt if isinstance(t, int)]]
    return [item if isinstance(item, str) else list(item) for item in prompt if not isinstance(item, int)]


class TextPart(BaseModel):
    """A part of a message's content: only text is served."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class Message(BaseModel):
    """A chat message: a role and its text (a string or text parts)."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = Field(None, max_length=64)

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatIn(_Request):
    """OpenAI's chat completion request (text only)."""

    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type") != "text":
            raise ValueError('not supported (only {"type": "text"})')
        return value

    @field_validator("messages")
    @classmethod
    def _bounded(cls, messages: list[Message]) -> list[Message]:
        if sum(len(m.text()) for m in messages) > MAX_PROMPT_CHARS:
            raise ValueError(f"at most {MAX_PROMPT_CHARS} characters in all")
        return messages

    @model_validator(mode="after")
    def _chat(self) -> "ChatIn":
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def validation_error(errors: list[Any]) -> OpenAIError:
    """The first of a request's schema errors as OpenAI's 400: which parameter and why."""
    first = errors[0] if errors else {}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = loc[0] if loc else None
    if first.get("type") == "extra_forbidden":
        return OpenAIError(400, f"{'.'.join(loc)!r} is not supported by this server", param=param,
                           code="unsupported_parameter")
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    where = ".".join(loc)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return OpenAIError(400, f"{where}: {message}{more}" if where else message + more, param=param,
                       code="invalid_value")
