"""The HTTP API (FastAPI): devices, bundles and OTA, queries, health and metrics.

Every route but /healthz, /metrics, the dashboard's page at / (``server.api.dashboard``) and
/v1/completions (there only with ``trickle serve --llm``, see ``server.llm.completions``) takes a
bearer token: the admin token, or a device's own token (a device reads only its own messages and
downloads bundles). The OpenAPI spec is at /openapi.json. Routes are ``edge.contract.protocol.ROUTES``.
"""


import hmac
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import generate_latest
from pydantic import BaseModel, Field

from edge.contract.bundle import BundleError, read_trusted
from edge.contract.protocol import DEVICE_KINDS, ROUTES, Name, OtaCommand, VerifyRequest, VerifyResponse
from edge.core.errors import ConfigError
from server.api.dashboard import dashboard_router
from server.api.jobs import jobs_router
from server.api.limits import OCTET_STREAM, AuthenticateFirst, excerpt, invalid_request, receive_file
from server.api.state import Principal, ServerState
from server.llm.completions import llm_router
from server.store.store import Device, StoreError

log = logging.getLogger("trickle.server.http")
MAX_BUNDLE_BYTES = 64 << 20
ANONYMOUS_WITH_BODY = ("/v1/completions",)  # the language model's OpenAI-style route (server.llm.completions) takes no token


class DeviceIn(BaseModel):
    device: Name
    fleet: Name = "default"


class DeviceOut(BaseModel):
    device: str
    fleet: str
    token: str = Field(description="bearer token for HTTP, MQTT password, and the key of the device's HMAC signatures")


class BundleOut(BaseModel):
    version: int
    model: str
    sha256: str


class AssignmentIn(BaseModel):
    target: str = Field(pattern=r"^(device|fleet):[A-Za-z0-9_-]{1,64}$", description="device:ID or fleet:NAME")
    bundle_version: int = Field(ge=1, le=2**62)


class AssignmentOut(BaseModel):
    target: str
    bundle_version: int
    notified: list[str]


def ota_command(bundle: dict[str, Any]) -> OtaCommand:
    """What a device is told about a bundle (a row of ``Store.bundle``)."""
    return OtaCommand(bundle_version=bundle["version"], sha256=bundle["sha256"],
                      path=ROUTES["bundle"].format(version=bundle["version"]))


def targets_of(state: ServerState, target: str) -> list[Device]:
    """The registered devices ``device:ID`` or ``fleet:NAME`` names."""
    kind, name = target.split(":", 1)
    names = [d["device"] for d in state.store.devices() if (d["device"] if kind == "device" else d["fleet"]) == name]
    return [device for device in map(state.store.device, names) if device is not None]


def notify_assignment(state: ServerState, target: str, version: int) -> list[str]:
    """Tell the devices of ``target`` whose assignment is now ``version`` (a retained OTA command
    on their ota topic); the devices told."""
    state.changes += 1
    record = state.store.bundle(version)
    assert record is not None
    command = ota_command(record).model_dump_json().encode()
    notified = []
    for device in targets_of(state, target):
        if state.store.assignment(device) == version and state.bridge is not None:
            state.bridge.publish(device.fleet, device.device, "ota", command, retain=True)
            notified.append(device.device)
    return notified


def create_app(state: ServerState, on_start: Callable[[], None] | None = None,
               on_stop: Callable[[], None] | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if on_start:
            on_start()
        yield
        if on_stop:
            on_stop()

    app = FastAPI(title="trickle server", version="1", lifespan=lifespan,
                  description="Telemetry and results from energy-harvesting devices, bundles and OTA.")
    bearer = HTTPBearer(auto_error=False)

    def known(token: str) -> bool:
        return hmac.compare_digest(token.encode(), state.admin_token.encode()) or state.store.device_by_token(token) is not None

    # a request's body is read only once its token is known (the routes then check what it may do)
    app.add_middleware(AuthenticateFirst, known=known, anonymous=frozenset(ANONYMOUS_WITH_BODY))
    app.add_exception_handler(RequestValidationError, invalid_request)

    def principal(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Principal:
        if credentials is None:
            raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        token = credentials.credentials
        if hmac.compare_digest(token.encode(), state.admin_token.encode()):
            return Principal(True, None)
        device = state.store.device_by_token(token)
        if device is None:
            raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        return Principal(False, device)

    def admin(who: Annotated[Principal, Depends(principal)]) -> Principal:
        if not who.admin:
            raise HTTPException(403, "needs the admin token")
        return who

    @app.get(ROUTES["health"])
    def health() -> dict[str, Any]:
        """Liveness: the process answers (and whether its bridge's writer failed); /readyz tells
        whether it can do its work."""
        connected = state.bridge.connected.is_set() if state.bridge else False
        failure = state.bridge.failure if state.bridge else None
        return {"status": "ok" if failure is None else "failing", "broker_connected": connected, "mqtt": state.broker_url,
                **({"failure": failure} if failure else {})}

    @app.get(ROUTES["ready"])
    def ready() -> JSONResponse:
        """Readiness: the broker connected, the store answering, the job workers alive (when the
        server runs any); 503 naming what is not."""
        checks: dict[str, Any] = {"broker": state.bridge is not None and state.bridge.connected.is_set()
                                  and state.bridge.failure is None}
        try:
            state.store.ping()
            checks["store"] = True
        except Exception as err:  # any database error: not ready, said in one line
            checks["store"] = False
            checks["store_error"] = excerpt(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__, 200)
        if state.workers is not None:
            alive, wanted = state.workers()
            checks["workers"] = alive >= wanted
            checks["workers_alive"] = f"{alive}/{wanted}"
        ok = all(v for k, v in checks.items() if isinstance(v, bool))
        return JSONResponse({"status": "ready" if ok else "not ready", **checks}, status_code=200 if ok else 503)

    @app.get(ROUTES["metrics"], response_class=PlainTextResponse)
    def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type="text/plain; version=0.0.4")

    @app.post(ROUTES["devices"], status_code=201, response_model=DeviceOut)
    def register(body: DeviceIn, _: Annotated[Principal, Depends(admin)]) -> DeviceOut:
        try:
            d = state.store.add_device(body.device, body.fleet)
        except StoreError as err:
            raise HTTPException(409, str(err)) from None
        log.info("registered device %s in fleet %s", d.device, d.fleet)
        state.changes += 1
        return DeviceOut(device=d.device, fleet=d.fleet, token=d.token)

    @app.get(ROUTES["devices"])
    def devices(_: Annotated[Principal, Depends(admin)]) -> list[dict[str, Any]]:
        return state.store.devices()

    @app.post(ROUTES["bundles"], status_code=201, response_model=BundleOut, max_body_size=MAX_BUNDLE_BYTES,
              openapi_extra=OCTET_STREAM)
    async def upload(request: Request, _: Annotated[Principal, Depends(admin)]) -> BundleOut:
        """A signed bundle's tar as the body (application/octet-stream), at most MAX_BUNDLE_BYTES."""
        tmp, digest, _size = await receive_file(request, state.bundle_dir, ".tar")
        try:
            try:
                bundle = await run_in_threadpool(read_trusted, tmp, state.trusted_keys)
            except BundleError as err:
                log.warning("refused a bundle upload: %s", err)
                raise HTTPException(400, str(err).replace(str(tmp), "upload")) from None
            version, model = bundle.manifest.bundle_version, bundle.manifest.model
            target = state.bundle_dir / f"v{version}.tar"
            try:
                state.store.add_bundle(version, model, digest, target)
            except StoreError as err:
                raise HTTPException(409, str(err)) from None
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        log.info("stored bundle %s v%d", model, version)
        state.changes += 1
        return BundleOut(version=version, model=model, sha256=digest)

    @app.get(ROUTES["bundles"], response_model=list[BundleOut])
    def bundles(_: Annotated[Principal, Depends(principal)]) -> list[dict[str, Any]]:
        return state.store.bundles()

    @app.get(ROUTES["bundle"], response_class=FileResponse)
    def download(version: int, _: Annotated[Principal, Depends(principal)]) -> FileResponse:
        record = state.store.bundle(version) if 0 < version < 2**62 else None
        if record is None:
            raise HTTPException(404, f"bundle_version {version} is not uploaded")
        return FileResponse(record["path"], media_type="application/x-tar", filename=f"v{version}.tar")

    @app.post(ROUTES["assignments"], response_model=AssignmentOut)
    def assign(body: AssignmentIn, _: Annotated[Principal, Depends(admin)]) -> AssignmentOut:
        kind, name = body.target.split(":", 1)
        if not targets_of(state, body.target):
            raise HTTPException(404, f"no registered {kind} {name!r}")
        try:
            state.store.assign(body.target, body.bundle_version)
        except StoreError as err:
            raise HTTPException(404, str(err)) from None
        notified = notify_assignment(state, body.target, body.bundle_version)
        return AssignmentOut(target=body.target, bundle_version=body.bundle_version, notified=notified)

    @app.get(ROUTES["messages"])
    def messages(device: Name, kind: str, who: Annotated[Principal, Depends(principal)],
                 since_s: Annotated[float | None, Query(ge=0, le=1e11)] = None,
                 until_s: Annotated[float | None, Query(ge=0, le=1e11)] = None,
                 limit: Annotated[int, Query(ge=1, le=100_000)] = 1000) -> list[dict[str, Any]]:
        if kind not in DEVICE_KINDS:
            raise HTTPException(404, f"kind {kind!r}: must be one of {', '.join(DEVICE_KINDS)}")
        if not who.admin and (who.device is None or who.device.device != device):
            raise HTTPException(403, "a device reads only its own messages")
        return state.store.messages(device, kind, since_s, until_s, limit)

    @app.get(ROUTES["assignments"])
    def assignments(_: Annotated[Principal, Depends(admin)]) -> dict[str, int]:
        """Every assignment: target (device:ID or fleet:NAME) -> bundle version."""
        return state.store.assignments()

    app.include_router(dashboard_router(state, principal))
    app.include_router(jobs_router(state.store, state.bundle_dir.parent, admin))

    @app.exception_handler(ConfigError)
    def config_error(request: Request, err: ConfigError) -> JSONResponse:
        """A typed body's own check (a job spec's MCU, formats, bit-widths): the one-line reason."""
        return JSONResponse({"detail": excerpt(str(err), 300)}, status_code=422)
    if state.llm is not None:
        app.include_router(llm_router(state.llm, state.metrics.registry))

    @app.post(ROUTES["verify"], response_model=VerifyResponse)
    def verify(body: VerifyRequest, who: Annotated[Principal, Depends(principal)]) -> VerifyResponse:
        """One round of client–server speculative decoding (``server.llm.verify``): 409 when the
        session must be resent from its start, 400 when the target cannot take the request, 404
        when the server has no language model."""
        from server.llm.verify import answer

        sessions = state.llm.sessions() if state.llm is not None else None
        status, detail, response = answer(sessions, "admin" if who.device is None else who.device.device, body)
        if response is None:
            raise HTTPException(status, detail)
        return response

    return app
