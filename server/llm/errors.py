"""OpenAI's error object for every answer of the OpenAI-style API that is not a success, whoever
refused the request: a route (``OpenAIError``), FastAPI's routing and its dependencies (401, 403
from the admin check of the key routes, 404, 405), the body cap (413, ``openai_413``, which
``server.api.limits`` applies), a bug (500, its text never sent). A body that fails its schema is
``server.llm.schema.validation_error``'s 400, as OpenAI answers it (``server.api.app`` picks it).

Which paths are the OpenAI API's (``OpenAIPaths``): its routes (``server.llm.api``: completions,
chat, models and a model, the API keys), and any other ``/v1/`` path not under a root of the
app's other routes (``/v1/devices``, ``/v1/jobs`` …): OpenAI's clients call ``/v1/embeddings`` and
the like, which are not served here. The device protocol's routes keep FastAPI's ``{"detail"}``,
which the device client reads.

    app = FastAPI()
    add_openai_errors(app)
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException
from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY
from starlette.types import Message, Send

from server.llm.api import COMPLETIONS, KEYS, MODELS, PATHS
from server.llm.schema import OpenAIError

# OpenAI's type and code of an error by its status, where the route did not say
KINDS = {400: ("invalid_request_error", "invalid_value"), 401: ("authentication_error", "invalid_api_key"),
         403: ("permission_error", "insufficient_permissions"), 404: ("invalid_request_error", "not_found"),
         405: ("invalid_request_error", "method_not_allowed"), 409: ("invalid_request_error", "conflict"),
         413: ("invalid_request_error", "request_too_large"), 429: ("rate_limit_error", "rate_limit_exceeded")}
KEPT_HEADERS = ("allow", "retry-after", "www-authenticate")


class OpenAIPaths:
    """Whether a request path is the OpenAI API's (the module's rule), from the app's routes as
    they are when first asked (every router is included by then)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._others: frozenset[str] | None = None  # the first segment after /v1/ of every other route
        self.llm_served = False

    def _roots(self) -> frozenset[str]:
        if self._others is None:
            paths = list(self.app.openapi()["paths"])  # every route of every included router (generated once)
            self.llm_served = COMPLETIONS in paths
            self._others = frozenset(p.split("/")[2] for p in paths if p.startswith("/v1/") and not _own(p))
        return self._others

    def __call__(self, path: str) -> bool:
        if _own(path):
            return True
        return path.startswith("/v1/") and path.split("/")[2] not in self._roots()


def _own(path: str) -> bool:
    return path in PATHS or path.startswith(MODELS + "/") or path == KEYS or path.startswith(KEYS + "/")


def error_for(status: int, message: str, headers: Any = None) -> OpenAIError:
    """An OpenAI error of ``status`` with the type and code its status implies."""
    kind, code = KINDS.get(status, ("server_error", "server_error") if status >= 500 else ("invalid_request_error", None))
    kept = {k: v for k, v in (headers or {}).items() if k.lower() in KEPT_HEADERS} or None
    return OpenAIError(status, message, type=kind, code=code, headers=kept)


def too_large(cap: int) -> OpenAIError:
    return error_for(413, f"the request body is over {cap} bytes (the cap of this route)")


def add_openai_errors(app: FastAPI) -> OpenAIPaths:
    """Answer errors on the OpenAI API's paths with OpenAI's error object (the module's doc);
    elsewhere FastAPI's and Starlette's own answers stay. The predicate it installs is returned
    (``server.api.limits.AuthenticateFirst`` takes it for its 401 and 413)."""
    openai = OpenAIPaths(app)

    @app.exception_handler(OpenAIError)
    def openai_error(request: Request, err: OpenAIError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> Response:
        path = request.url.path
        if not openai(path):
            return await http_exception_handler(request, err)
        message = str(err.detail)
        if err.status_code == 413:  # the body cap, found as the body streamed in
            return openai_error(request, too_large(request.scope.get(MAX_BODY_SIZE_SCOPE_KEY, 0)))
        if err.status_code == 404 and message == "Not Found":  # no route: the path is not served here
            message = f"{request.method} {path} is not served here" if openai.llm_served or not _own(path) else \
                f"{request.method} {path}: no language model is served here (trickle serve --llm MODEL)"
        elif err.status_code == 405:
            allowed = (err.headers or {}).get("Allow", "")
            message = f"{request.method} is not a method of {path} (allowed: {allowed})"
        return openai_error(request, error_for(err.status_code, message, err.headers))

    @app.exception_handler(500)
    def server_error(request: Request, err: Exception) -> Response:
        if openai(request.url.path):
            return openai_error(request, error_for(500, "the server failed on this request (its log says why)"))
        return PlainTextResponse("Internal Server Error", status_code=500)

    return openai


def openai_413(send: Send, cap: int) -> Send:
    """``send`` with Starlette's body-cap answer (413, text/plain) replaced by OpenAI's error object."""
    replacing = False

    async def wrapped(message: Message) -> None:
        nonlocal replacing
        if message["type"] == "http.response.start" and message["status"] == 413 and \
                dict(message.get("headers", ())).get(b"content-type", b"").startswith(b"text/plain"):
            replacing = True
            body = json.dumps(too_large(cap).body()).encode()
            await send({"type": "http.response.start", "status": 413,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
        elif not replacing:
            await send(message)

    return wrapped
