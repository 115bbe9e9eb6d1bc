"""Network weather in-process (this machine's kernel has no ``tc netem``): a TCP proxy that adds
round-trip latency, jitter and a bandwidth cap, and drops or refuses connections on command.

    with NetemProxy("127.0.0.1", server_port, rtt_s=0.1, bandwidth_bps=50e6) as proxy:
        link = HttpVerifyLink(proxy.url, token)       # the device talks to the proxy
        proxy.drop()                            # every open connection cut, as a lost link
        proxy.down = True                       # new connections are closed at once
        proxy.down = False

Each direction delays every chunk by half the round trip (plus uniform jitter) and then holds it
for its transmission time at the capped rate; chunks keep their order. The proxy runs its own
event loop in a daemon thread.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from types import TracebackType


class NetemProxy:
    """An in-process TCP proxy that adds round-trip time, jitter, a bandwidth cap and dropped links
    (this kernel has no tc netem)."""

    def __init__(self, host: str, port: int, rtt_s: float = 0.0, jitter_s: float = 0.0,
                 bandwidth_bps: float | None = None, seed: int = 0) -> None:
        self.target = (host, port)
        self.rtt_s, self.jitter_s, self.bandwidth_bps = rtt_s, jitter_s, bandwidth_bps
        self.down = False
        self.bytes_down = self.bytes_up = 0  # server → client, client → server
        self._random = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="netem")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> NetemProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, "127.0.0.1", 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def drop(self) -> None:
        """Cut every open connection (both ends see it closed)."""
        def cut() -> None:
            for writer in list(self._writers):
                writer.transport.abort()
        self._loop.call_soon_threadsafe(cut)

    def close(self) -> None:
        """Cut every connection, stop listening, end every task, stop the loop."""
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            # the cut connections end their tasks; only what is left is cancelled (a cancelled
            # connection task makes Python 3.11's asyncio.streams log a spurious CancelledError)
            _, left = await asyncio.wait(tasks, timeout=1.0) if tasks else (set(), set())
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> NetemProxy:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.down:
            client_w.transport.abort()
            return
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.transport.abort()
            return
        self._writers |= {client_w, server_w}
        await asyncio.gather(self._pipe(client_r, server_w, up=True), self._pipe(server_r, client_w, up=False),
                             return_exceptions=True)
        for writer in (client_w, server_w):
            self._writers.discard(writer)
            writer.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: bool) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        free_at = 0.0  # when the capped link finishes sending what is queued

        async def send() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    writer.transport.abort()
                    return
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(chunk)
                await writer.drain()

        sender = asyncio.create_task(send())
        try:
            while chunk := await reader.read(65536):
                if up:
                    self.bytes_up += len(chunk)
                else:
                    self.bytes_down += len(chunk)
                now = time.monotonic()
                arrive = now + self.rtt_s / 2 + self._random.uniform(0, self.jitter_s)
                if self.bandwidth_bps:
                    free_at = max(free_at, now) + 8 * len(chunk) / self.bandwidth_bps
                    arrive = max(arrive, free_at + self.rtt_s / 2)
                queue.put_nowait((arrive, chunk))
        finally:
            queue.put_nowait((0.0, b""))
            await asyncio.wait([sender], timeout=self.rtt_s + 5)
