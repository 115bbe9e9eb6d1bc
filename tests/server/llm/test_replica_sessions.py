"""Speculative-decoding sessions live in one replica: when it dies (kill -9) and the load balancer
sends the device's next round to another replica, that one answers 409 and the device sends its
history again from the start, which rebuilds the session there; the text is the target's own."""

from __future__ import annotations

import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from edge.llm.draft import OnnxMoADraft
from edge.llm.generate import HttpVerifyLink, generate
from tests.language import Models
from tests.server.conftest import needs_mosquitto
from tests.server.llm.test_verify import _greedy
from tests.server.mqtt.test_replicas import running_cluster

pytestmark = [needs_mosquitto, pytest.mark.slow]


class Balancer:
    """A load balancer in front of the replicas: every request goes to ``upstream``, which the test
    moves when a replica dies; it keeps each answer's status."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.statuses = upstream, []
        balancer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
                r = httpx.post(balancer.upstream + self.path, content=body, headers=headers, timeout=30)
                balancer.statuses.append(r.status_code)
                self.send_response(r.status_code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True, name="balancer").start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"


def test_a_device_s_session_is_rebuilt_on_another_replica_after_kill_9(
        models: Models, moa: tuple[Path, Path], postgres_url: str, tmp_path: Path) -> None:
    flags = ("--llm", str(models.target), "--draft", str(moa[0]), "--llm-open")
    with running_cluster(tmp_path, postgres_url, None, *flags) as cluster:
        a, b = cluster.replicas["a"], cluster.replicas["b"]
        token = a.register("g1").read_text()
        balancer = Balancer(a.url)
        n, prompt = 40, [1, 5, 9, 40]
        blocks = []

        def on_tokens(block: list[int], verified: bool) -> None:
            blocks.append(verified)
            if len(blocks) == 1:  # after the first verified block, the replica holding the session dies
                a.stop(signal.SIGKILL)
                balancer.upstream = b.url

        try:
            result = generate(OnnxMoADraft(moa[1]), HttpVerifyLink(balancer.url, token, timeout_s=10), prompt, n, k=4,
                              on_tokens=on_tokens)
        finally:
            balancer.http.shutdown()
    assert 409 in balancer.statuses  # replica b did not hold the session: the device sent it again
    assert result.verified == n and result.tokens == _greedy(models.target, prompt, n)
