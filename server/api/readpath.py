"""The read path (the dashboard and the fleet queries) bounded apart from the device path, so that
no number of dashboard viewers slows the devices. One process serves both: 30 dashboard clients
took the p99 of 20 polling devices from 0.060 to 0.287 s (4.8x; the issue's probe: 0.4 to 4.3-5.0 s);
behind this module, 1.01x (``trickle bench link --part readload``, 5 interleaved rounds; 1.02 and 1.26x in earlier runs).

- Which requests are reads (``is_read``): a GET under ``/v1/dashboard/`` with any token (a device
  token loads its own dashboard view), and the admin's GETs of the registry (``/v1/devices``) and of
  any device's messages (``/v1/devices/{device}/{kind}``). A device's GET of its own messages, its
  bundle list and downloads, verification and MQTT ingestion are the device path and never wait
  here; nor does a request without a token (refused at once, 401).
- A gate: ``concurrency`` reads inside the app at once, so their synchronous handlers hold that many
  of Starlette's 40 worker threads however many viewers ask, and at most ``share`` of the time: the
  threads share one interpreter lock, so the gate bounds the reads' time, not only their number (a
  read that held it ``d`` s keeps it shut ``d * (1 / share - 1)`` s more). At most ``queue`` more
  wait (costing nothing while they wait); beyond that 503. The dashboard's event stream is not held
  at the gate for its lifetime; its periodic work goes through ``ReadPath.run``, the same gate.
- A rate per token (a token bucket, keyed by the token's sha256): ``admin_rate_per_s`` for the admin
  token (shared by every admin viewer and script), ``device_rate_per_s`` for any other (the page
  holds one stream open, so a person stays far below either); over it 429 with Retry-After and a
  detail naming the limit.
- What the gate and the rates did is counted: ``trickle_read_requests_total{outcome}``.

The fleet snapshot itself is computed at most once per short interval per view and shared by every
viewer of it (``server.api.dashboard.SnapshotCache``). The limits are per process: each replica has
its own.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter
from starlette.types import ASGIApp, Receive, Scope, Send

from server.api.limits import bearer

T = TypeVar("T")
DASHBOARD = re.compile(r"/v1/dashboard/.+")
STREAM = "/v1/dashboard/stream"
QUERIES = re.compile(r"/v1/devices(/[^/]+/[^/]+)?")  # the registry; any device's messages (the admin's)
MAX_BUCKETS = 10_000


@dataclass(frozen=True)
class ReadLimits:
    """How much of the server the read path may take."""

    concurrency: int = 1
    """Reads inside the app at once (each holds at most one worker thread)."""
    share: float = 0.25
    """Of the server's time, the most the reads may take: a read that held the gate ``d`` seconds keeps
    it shut ``d * (1 / share - 1)`` more, whatever the mix of cheap and costly reads."""
    queue: int = 64
    """Reads waiting for the gate; one more is answered 503 at once."""
    admin_rate_per_s: float = 50.0
    """Sustained reads per second with the admin token."""
    admin_burst: int = 100
    """Reads the admin token may make at once before its rate applies."""
    device_rate_per_s: float = 5.0
    """Sustained reads per second with any other token (a device's own dashboard view)."""
    device_burst: int = 20
    """Reads such a token may make at once."""

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.queue < 0 or self.admin_burst < 1 or self.device_burst < 1:
            raise ValueError(f"{self}: concurrency and the bursts must be at least 1, the queue at least 0")
        if not 0.0 < self.share <= 1.0 or self.admin_rate_per_s <= 0 or self.device_rate_per_s <= 0:
            raise ValueError(f"{self}: share must be in (0, 1], the rates above 0")


class TokenBuckets:
    """Per key, ``rate_per_s`` sustained and ``burst`` at once (a token bucket). Past ``MAX_BUCKETS``
    keys the refilled buckets are dropped (a full bucket is no bucket), and all of them if that is
    not half (a flood of made-up tokens): memory stays bounded and the pruning amortised O(1)."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate_per_s, self.burst = rate_per_s, burst
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at monotonic s)

    def take(self, key: str) -> float:
        """0 when ``key`` may go now (one token taken), else the seconds until it may."""
        now = time.monotonic()
        tokens, at = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate_per_s)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate_per_s
        self._buckets[key] = (tokens - 1.0, now)
        if len(self._buckets) > MAX_BUCKETS:
            self._buckets = {k: (n, t) for k, (n, t) in self._buckets.items() if n + (now - t) * self.rate_per_s < self.burst}
            if len(self._buckets) > MAX_BUCKETS // 2:
                self._buckets.clear()
        return 0.0


class ReadPath:
    """The read path's gate and rates (see the module's docstring); ``is_admin(token)`` tells the
    admin token from the others (a constant-time comparison, no store lookup)."""

    def __init__(self, is_admin: Callable[[str], bool], limits: ReadLimits | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.is_admin, self.limits = is_admin, limits or ReadLimits()
        self._gate = anyio.Semaphore(self.limits.concurrency)
        self._waiting = 0
        self._resume_s = 0.0  # monotonic time before which no read starts (the reads' share)
        self._admin = TokenBuckets(self.limits.admin_rate_per_s, self.limits.admin_burst)
        self._others = TokenBuckets(self.limits.device_rate_per_s, self.limits.device_burst)
        self.requests = Counter("trickle_read_requests", "Dashboard and query requests, by what the read path did",
                                ["outcome"], registry=registry)

    def is_read(self, method: str, path: str, token: str) -> bool:
        return method == "GET" and (DASHBOARD.fullmatch(path) is not None
                                    or (QUERIES.fullmatch(path) is not None and self.is_admin(token)))

    def refusal(self, token: str) -> JSONResponse | None:
        """429 when ``token`` is over its rate, 503 when the gate's queue is full; else None."""
        admin = self.is_admin(token)
        buckets = self._admin if admin else self._others
        wait_s = buckets.take(hashlib.sha256(token.encode()).hexdigest())
        if wait_s > 0:
            self.requests.labels("rate_limited").inc()
            who = "the admin token" if admin else "a token other than the admin's"
            rate, burst = buckets.rate_per_s, buckets.burst
            return JSONResponse({"detail": f"read rate limit: {rate:g} requests/s (burst {burst}) for {who} on the "
                                           f"dashboard and query routes; retry in {wait_s:.2f} s"},
                                status_code=429, headers={"Retry-After": str(max(1, math.ceil(wait_s)))})
        if self._waiting >= self.limits.queue:
            self.requests.labels("busy").inc()
            return JSONResponse({"detail": f"the read path is busy: {self.limits.concurrency} dashboard and query "
                                           f"requests running and {self.limits.queue} waiting; retry shortly"},
                                status_code=503, headers={"Retry-After": "1"})
        return None

    async def gated(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """``app`` on this request once the gate lets it in."""
        start = await self._enter()
        try:
            self.requests.labels("served").inc()
            await app(scope, receive, send)
        finally:
            self._leave(start)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a worker thread once the gate lets it in (the event stream's work). Never
        from inside a gated request: it would wait for a place its own request holds."""
        start = await self._enter()
        try:
            return await anyio.to_thread.run_sync(fn, *args)
        finally:
            self._leave(start)

    async def _enter(self) -> float:
        """Wait for a place at the gate, then out the rest the reads before owe (``ReadLimits.share``)."""
        self._waiting += 1
        try:
            await self._gate.acquire()
        finally:
            self._waiting -= 1
        try:
            await anyio.sleep(max(0.0, self._resume_s - time.monotonic()))
        except BaseException:
            self._gate.release()
            raise
        return time.monotonic()

    def _leave(self, start_s: float) -> None:
        now = time.monotonic()
        self._resume_s = now + (now - start_s) * (1.0 / self.limits.share - 1.0)
        self._gate.release()


class BoundReads:
    """ASGI middleware: reads (``ReadPath.is_read``) go through their rate and gate; the event
    stream through its rate only (its work is gated as it runs); everything else straight on."""

    def __init__(self, app: ASGIApp, read: ReadPath) -> None:
        self.app, self.read = app, read

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = bearer(scope)
        if token is None or not self.read.is_read(scope["method"], scope["path"], token):
            await self.app(scope, receive, send)  # without a token a read is refused at once (401), ungated
            return
        refused = self.read.refusal(token)
        if refused is not None:
            await refused(scope, receive, send)
        elif scope["path"] == STREAM:
            self.read.requests.labels("stream").inc()
            await self.app(scope, receive, send)
        else:
            await self.read.gated(self.app, scope, receive, send)
