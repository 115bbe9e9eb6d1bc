"""The HTTP API (FastAPI): devices, bundles and OTA, queries, health and metrics.

Every route but /healthz, /metrics and the dashboard's page at / (``server.api.dashboard``) takes a
bearer token: the admin token, or a device's own token (a device reads only its own messages and
downloads bundles). The OpenAI-style routes of ``trickle serve --llm`` (``server.llm.completions``)
take an API key the admin made (or the admin token), or none with ``--llm-open``; their errors are
OpenAI's error objects. The OpenAPI spec is at /openapi.json (open, like the page; the Swagger and
ReDoc pages are not served: they load their scripts from a CDN, which the page's policy forbids).
Routes are ``edge.contract.protocol.ROUTES``.

Every response carries ``SECURITY_HEADERS``: a Content-Security-Policy that lets the dashboard's page
load its own script and style sheet and talk to its own origin, nothing else (it has no inline script
or style, no third-party file), and no framing, no MIME sniffing, no referrer. The dashboard and the
fleet queries go through the read path's gate and rates (``server.api.readpath``), apart from the
devices' routes.
"""

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edge.core.errors import ConfigError
from server.api.auth import auth
from server.api.bundles import bundles_router
from server.api.dashboard import dashboard_router
from server.api.devices import devices_router
from server.api.health import health_router
from server.api.jobs import jobs_router
from server.api.limits import AuthenticateFirst, excerpt, invalid_request
from server.api.readpath import BoundReads, ReadLimits, ReadPath
from server.api.state import ServerState
from server.api.verify import verify_router
from server.llm.api import PATHS as LLM_PATHS
from server.llm.api import LlmAccess, llm_router
from server.llm.errors import add_openai_errors
from server.llm.schema import validation_error

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer"}


class SecurityHeaders:
    """ASGI middleware: ``SECURITY_HEADERS`` on every response (those a route set itself kept)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, with_headers)


def create_app(state: ServerState, on_start: Callable[[], None] | None = None,
               on_stop: Callable[[], None] | None = None, read_limits: ReadLimits | None = None) -> FastAPI:
    """The API over ``state``: one router per route group, behind the bounded-input middleware, the
    read path's gate and rates (``read_limits``, default ``ReadLimits()``) and the security headers."""
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if on_start:
            on_start()
        yield
        if on_stop:
            on_stop()

    app = FastAPI(title="trickle server", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Telemetry and results from energy-harvesting devices, bundles and OTA.")
    who = auth(state)
    read = ReadPath(who.is_admin, read_limits, state.metrics.registry)

    def known(token: str) -> bool:
        return who.known(token) or (state.llm is not None and state.store.llm_key_name(token) is not None)

    # the OpenAI-style API's errors are OpenAI's error object, whatever refuses the request (server.llm.errors)
    openai = add_openai_errors(app)
    # a request's body is read only once its token is known (the routes then check what it may do)
    app.add_middleware(AuthenticateFirst, known=known, anonymous=frozenset(LLM_PATHS if state.llm_open else ()),
                       openai=openai)
    app.add_middleware(BoundReads, read=read)  # outside AuthenticateFirst: a refused read costs no lookup
    app.add_middleware(SecurityHeaders)  # outermost: on every answer, refusals included

    @app.exception_handler(RequestValidationError)
    def bad_request(request: Request, err: RequestValidationError) -> Response:
        if openai(request.url.path):  # OpenAI's clients read OpenAI's error object
            bad = validation_error(list(err.errors()))
            return JSONResponse(bad.body(), status_code=bad.status)
        return invalid_request(request, err)

    @app.exception_handler(ConfigError)
    def config_error(request: Request, err: ConfigError) -> JSONResponse:
        """A typed body's own check (a job spec's MCU, formats, bit-widths): the one-line reason."""
        return JSONResponse({"detail": excerpt(str(err), 300)}, status_code=422)

    app.include_router(health_router(state))
    app.include_router(devices_router(state, who))
    app.include_router(bundles_router(state, who))
    app.include_router(dashboard_router(state, who.principal, read))
    app.include_router(jobs_router(state.store, state.bundle_dir.parent, who.admin))
    if state.llm is not None:
        access = LlmAccess(state.llm_open, who.is_admin, state.store, who.admin)
        app.include_router(llm_router(state.llm, state.metrics.registry, access))
    app.include_router(verify_router(state, who))
    return app
