"""Bounded input: a request's sender is known before its body is read, no body is read past its
route's cap, and no error quotes more than a short excerpt of what was sent.

- ``AuthenticateFirst`` (ASGI middleware): a request with a body to any route but the anonymous
  ones must carry a known bearer token (the admin's, a device's or an LLM API key), checked from
  its headers alone; otherwise it is answered 401 before a byte of its body is read. Which principal may use
  which route is still each route's own dependency.
- Caps (Starlette's body limit: Content-Length checked first, then the bytes counted as they
  arrive): ``JSON_BODY_BYTES`` for every route, more where a route sets FastAPI's ``max_body_size``
  (those that take files).
- ``receive_file``: a body streamed to a temporary file and hashed on the way, in O(chunk) memory.
- ``invalid_request``: 422 replies with at most ``MAX_ERRORS`` errors, each with a short excerpt.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.middleware.body_limit import RequestBodyLimitMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from server.llm.errors import openai_413

JSON_BODY_BYTES = 64 << 10  # a JSON request's body, unless its route allows more
MAX_ERRORS = 5
EXCERPT_CHARS = 80
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# the OpenAPI request body of a route that streams a file (application/octet-stream)
OCTET_STREAM = {"requestBody": {"required": True, "content": {"application/octet-stream": {
    "schema": {"type": "string", "format": "binary"}}}}}


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters (with how long it was)."""
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


class AuthenticateFirst:
    """Refuse (401) a request with a body whose bearer token is missing or unknown, before reading
    the body; ``known(token)`` says whether a token is the admin's or a device's. Then the body is
    read through Starlette's limit, ``default_cap`` unless the route sets its own ``max_body_size``."""

    def __init__(self, app: ASGIApp, known: Callable[[str], bool], anonymous: frozenset[str] = frozenset(),
                 default_cap: int = JSON_BODY_BYTES, openai: Callable[[str], bool] = lambda path: False) -> None:
        self.app, self.known, self.anonymous = RequestBodyLimitMiddleware(app, default_cap), known, anonymous
        self.openai = openai  # whether a path's errors are OpenAI's error object (server.llm.errors)
        self.default_cap = default_cap

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in BODY_METHODS and scope["path"] not in self.anonymous:
            token = bearer(scope)
            if token is None or len(token) > 512 or not await run_in_threadpool(self.known, token):
                detail = "missing bearer token" if token is None else "unknown token"
                body: dict[str, Any] = {"detail": detail}
                if self.openai(scope["path"]):
                    body = {"error": {"message": f"{detail} (Authorization: Bearer API_KEY)",
                                      "type": "authentication_error", "param": None, "code": "invalid_api_key"}}
                response = JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        if scope["type"] == "http" and self.openai(scope["path"]):  # the body cap's 413 as OpenAI's error object
            send = openai_413(send, self.default_cap)
        await self.app(scope, receive, send)


async def receive_file(request: Request, folder: Path, suffix: str) -> tuple[Path, str, int]:
    """The request's body in a new temporary file in ``folder``: (its path, sha256, size). The
    route's ``max_body_size`` stops a body over its cap while it streams (413); the file is removed
    on any failure."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(suffix=suffix, dir=folder, prefix=".upload-")
    digest, size = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as fh:
            async for chunk in request.stream():
                digest.update(chunk)
                size += len(chunk)
                fh.write(chunk)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name), digest.hexdigest(), size


def invalid_request(request: Request, err: Exception) -> JSONResponse:
    """422 for a body or parameter that fails its schema: where and why, the input only as an excerpt."""
    assert isinstance(err, RequestValidationError)
    errors = err.errors()
    shown: list[dict[str, Any]] = []
    for e in errors[:MAX_ERRORS]:
        item: dict[str, Any] = {"loc": [excerpt(part, 40) if isinstance(part, str) else part for part in e.get("loc", ())],
                                "msg": excerpt(str(e.get("msg", "")), 200), "type": str(e.get("type", ""))}
        if "input" in e and isinstance(e["input"], str | int | float | bool):
            item["input"] = excerpt(e["input"])
        shown.append(item)
    return JSONResponse({"detail": shown, "errors": len(errors)}, status_code=422)
