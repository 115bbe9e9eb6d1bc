"""The fleet dashboard, served by ``trickle serve`` at ``/``: a static page (``server/api/static``, no
build step, no third-party script: its charts are SVG drawn by ``dashboard.js``) over three routes.

- ``GET /v1/dashboard/fleet?page=&per_page=&q=``: one snapshot: totals (devices, online and signed
  off, results in the last hour of the devices' own clocks and received in the server's last hour,
  accuracy where verdicts are known, messages rejected by reason),
  results over the devices' own time (``Store.results_over_time``: a simulated fleet's virtual
  clock on an axis of its own, real clocks over the last day), one page of devices in natural
  order (last heard from by the server's clock, its newest report by its own, the bundle each
  reports running, its assignment and OTA state, results, accuracy, power failures and time
  powered from its newest telemetry), the bundle registry and the assignments.
- ``GET /v1/dashboard/stream?...``: the same snapshot as server-sent events, pushed when something
  was stored, registered, uploaded or assigned (checked every ``interval`` seconds, in memory) and
  at least every 30 s; each viewer's snapshot is its own page's queries (devices paged first, then
  their messages by index). The page reads it with fetch, so the bearer token stays in a header.
- The admin's snapshot also holds the newest jobs (``server.jobs.queue``: state, progress, step,
  attempts, the bundle a distillation made or its error); the page can cancel one. With a
  language model (``trickle serve --llm``) it holds the API keys and what each used.
- ``GET /v1/dashboard/devices/{device}``: one device's newest telemetry (voltage, power
  failures), results timeline, variant choices and events (the last 5000 of each).

These routes are the read path (``server.api.readpath``: one at a time, a bounded share of the
server's time, a rate per token), apart from the devices' own routes; a snapshot is computed and
encoded once per view and interval and shared by its viewers (``SnapshotCache``, counted as
``trickle_dashboard_snapshots_total``). A device token sees only its own device; the registry,
assignments and the OTA form need the admin token. Wall time and device time are kept apart: a
device counts as online when the server received anything from it within ``ONLINE_S`` and its last
status was not offline (it signed off); "last hour" figures say which clock they count by (a
simulated fleet replays hours of its own time in seconds of the server's).
"""

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import prometheus_client
import pydantic_core
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import FileResponse, Response, StreamingResponse

from edge.contract.protocol import Name
from server.api.readpath import ReadPath
from server.api.state import Principal, ServerState

STATIC = Path(__file__).parent / "static"
ONLINE_S = 300.0
JOBS_SHOWN = 20
RESEND_S = 30.0


def _rejected(state: ServerState) -> dict[str, int]:
    out: dict[str, int] = {}
    for metric in state.metrics.rejected.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                out[sample.labels["reason"]] = int(sample.value)
    return out


def _ota_state(assigned: int | None, running: int | None, last_event: str | None) -> str:
    if assigned is None:
        return "none"
    if running == assigned:
        return "up to date"
    if last_event in ("ota_rejected", "ota_rolled_back"):
        return "rejected" if last_event == "ota_rejected" else "rolled back"
    return "pending"


def fleet_snapshot(state: ServerState, who: Principal, page: int = 0, per_page: int = 50, search: str = "") -> dict[str, Any]:
    """What the dashboard shows, for an admin (the fleet) or a device (itself)."""
    store, now = state.store, time.time()
    only = None if who.admin else who.device.device if who.device else ""
    matching, rows = store.fleet_page(now, ONLINE_S, page * per_page, per_page, search, only)
    assignments = store.assignments()
    for row in rows:
        assigned = assignments.get(f"device:{row['device']}", assignments.get(f"fleet:{row['fleet']}"))
        row["assigned_version"] = assigned
        row["ota"] = _ota_state(assigned, row["running_version"], row["last_event"])
    if who.admin:
        totals = store.fleet_totals(now, ONLINE_S)
        over_time = store.results_over_time(now)
        bundles = store.bundles()
        jobs = [_job_row(j) for j in store.jobs(limit=JOBS_SHOWN)]
        llm_keys = store.llm_keys() if state.llm is not None else []
    else:
        totals = {key: sum(r[key] for r in rows) for key in ("online", "signed_off", "results", "results_device_hour",
                                                             "results_received_hour", "labelled", "correct")}
        totals["devices"] = len(rows)
        over_time, bundles, assignments, jobs, llm_keys = [], [], {}, [], []
    return {"now_s": now, "admin": who.admin, "totals": totals, "rejected": _rejected(state) if who.admin else {},
            "results_over_time": over_time, "page": page, "per_page": per_page, "matching": matching, "devices": rows,
            "bundles": bundles, "assignments": assignments, "jobs": jobs, "llm_keys": llm_keys}


@dataclass(frozen=True)
class Snapshot:
    """A computed fleet snapshot as JSON (encoded once, for every viewer it is shared with) and the
    ``changes`` it was computed under."""

    body: bytes
    changes: Any


def _json(value: dict[str, Any]) -> bytes:
    """As FastAPI encodes a route's answer (pydantic's encoder, a third of ``json.dumps``' time), an
    infinite or NaN number (a telemetry field bounded below only) as null, so the page can parse it."""
    return pydantic_core.to_json(value, inf_nan_mode="null")


class SnapshotCache:
    """Fleet snapshots shared between viewers. A view (who, page, search) is computed by one thread
    at a time while the others wait and share it; a snapshot is reused while nothing changed
    (``changes``, the caller's change counter, equal; at most ``max_age_s``) or, under a steady
    stream of changes, for ``ttl_s``: ten viewers of a busy fleet cost one aggregate and one JSON
    encoding per ``ttl_s``. ``computed`` counts the snapshots computed."""

    def __init__(self, compute: Callable[..., dict[str, Any]], ttl_s: float = 2.0, max_age_s: float = 30.0,
                 computed: Callable[[], None] = lambda: None) -> None:
        self.compute, self.ttl_s, self.max_age_s, self.computed = compute, ttl_s, max_age_s, computed
        self._lock = threading.Lock()
        self._entries: dict[tuple[Any, ...], tuple[float, Snapshot]] = {}
        self._busy: dict[tuple[Any, ...], threading.Lock] = {}

    def get(self, who: Principal, page: int, per_page: int, search: str, changes: Any) -> Snapshot:
        key = (who.admin, who.device.device if who.device else None, page, per_page, search)
        with self._lock:
            busy = self._busy.setdefault(key, threading.Lock())
        with busy:
            hit = self._entries.get(key)
            if hit is not None:
                age = time.monotonic() - hit[0]
                if age < self.ttl_s or (hit[1].changes == changes and age < self.max_age_s):
                    return hit[1]
            value = self.compute(who, page, per_page, search)
            self.computed()
            snapshot = Snapshot(_json(value), changes)
            with self._lock:
                if len(self._entries) > 256:  # views nobody asks for any more
                    self._entries.clear()
                    self._busy = {key: busy}
                self._entries[key] = (time.monotonic(), snapshot)
            return snapshot


def _job_row(job: dict[str, Any]) -> dict[str, Any]:
    spec, result = job["spec"], job["result"] or {}
    return {"id": job["id"], "kind": job["kind"], "state": job["state"], "progress": job["progress"],
            "step": job["step"], "attempts": job["attempts"], "cancel_requested": job["cancel_requested"],
            "error": job["error"], "bundle_version": job["bundle_version"],
            "student_accuracy": result.get("student_accuracy"), "created_s": job["created_s"],
            "what": f"{spec.get('dataset', '?')}, {spec.get('selection', '?')} {spec.get('keep_ratio', 0):.0%}"}


def device_detail(state: ServerState, device: str, limit: int = 5000) -> dict[str, Any]:
    record = state.store.device(device)
    if record is None:
        raise HTTPException(404, f"no registered device {device!r}")
    telemetry = [{k: m.get(k) for k in ("ts_s", "voltage_v", "harvested_j", "consumed_j", "power_cycles", "on_time_s")}
                 for m in state.store.messages(device, "telemetry", limit=limit, newest=True)]
    results = [{k: m.get(k) for k in ("ts_s", "label", "correct", "variant", "latency_s", "bundle_version")}
               for m in state.store.messages(device, "result", limit=limit, newest=True)]
    events = [{k: m.get(k) for k in ("ts_s", "event", "bundle_version", "detail")}
              for m in state.store.messages(device, "event", limit=limit, newest=True)]
    return {"device": record.device, "fleet": record.fleet, "telemetry": telemetry, "results": results,
            "events": events, "variants": dict(Counter(r["variant"] for r in results))}


def dashboard_router(state: ServerState, principal: Callable[..., Principal], read: ReadPath,
                     interval_s: float = 1.0) -> APIRouter:
    """The page and its routes; ``read`` gates the stream's work (the other routes are gated by its
    middleware, ``server.api.readpath``)."""
    router = APIRouter()
    Who = Annotated[Any, Depends(principal)]  # a Principal
    computed = prometheus_client.Counter("trickle_dashboard_snapshots", "Fleet snapshots computed (each shared by "
                                         "its viewers)", registry=state.metrics.registry)
    cache = SnapshotCache(lambda who, page, per_page, q: fleet_snapshot(state, who, page, per_page, q),
                          computed=computed.inc)
    Page = Annotated[int, Query(ge=0, le=100_000)]
    PerPage = Annotated[int, Query(ge=1, le=500)]
    Search = Annotated[str, Query(max_length=64)]

    @router.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @router.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> FileResponse:
        files = {p.name: p for p in STATIC.iterdir()}
        if name not in files:
            raise HTTPException(404, f"no static file {name!r}")
        return FileResponse(files[name])

    @router.get("/v1/dashboard/fleet", response_model=dict[str, Any])
    def fleet(who: Who, page: Page = 0, per_page: PerPage = 50, q: Search = "") -> Response:
        snapshot = cache.get(who, page, per_page, q, (state.metrics.stored_count, state.changes))
        return Response(snapshot.body, media_type="application/json")  # encoded once, shared

    @router.get("/v1/dashboard/stream", include_in_schema=False)  # endless: not for generated clients (or fuzzers)
    async def stream(request: Request, who: Who, page: Page = 0, per_page: PerPage = 50, q: Search = ""
                     ) -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            last: tuple[int, int, Any] | None = None
            sent = 0.0
            while not await request.is_disconnected():
                jobs = await read.run(state.store.jobs_version) if who.admin else None
                version = (state.metrics.stored_count, state.changes, jobs)  # what the page shows changed
                if version != last or time.monotonic() - sent >= RESEND_S:
                    snapshot = await read.run(cache.get, who, page, per_page, q, version)
                    yield b"event: fleet\ndata: " + snapshot.body + b"\n\n"
                    last, sent = snapshot.changes, time.monotonic()  # a shared older snapshot: sent again when fresh
                await asyncio.sleep(interval_s)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @router.get("/v1/dashboard/devices/{device}", response_model=dict[str, Any])
    def device(device: Name, who: Who) -> Response:
        if not who.admin and (who.device is None or who.device.device != device):
            raise HTTPException(403, "a device sees only itself")
        return Response(_json(device_detail(state, device)), media_type="application/json")  # encoded on this thread

    return router
