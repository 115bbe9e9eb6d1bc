"""Liveness (``/healthz``), readiness (``/readyz``: broker, store and job workers, 503 naming what
is not ready) and Prometheus metrics: the routes that need no token."""

from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import generate_latest

from edge.contract.protocol import ROUTES
from server.api.limits import excerpt
from server.api.state import ServerState


def health_router(state: ServerState) -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get(ROUTES["health"])
    def health() -> dict[str, Any]:
        """Liveness: the process answers (and whether its bridge's writer failed); /readyz tells
        whether it can do its work."""
        connected = state.bridge.connected.is_set() if state.bridge else False
        failure = state.bridge.failure if state.bridge else None
        return {"status": "ok" if failure is None else "failing", "broker_connected": connected, "mqtt": state.broker_url,
                **({"failure": failure} if failure else {})}

    @router.get(ROUTES["ready"])
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

    @router.get(ROUTES["metrics"], response_class=PlainTextResponse)
    def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type="text/plain; version=0.0.4")

    return router
