"""A throwaway PostgreSQL cluster on loopback, for tests and benchmarks.

    with temporary_postgres() as url:        # postgresql://trickle@127.0.0.1:PORT/postgres
        store = open_store(url)

Needs Debian's ``postgresql`` package (``initdb`` and ``pg_ctl``, on PATH or under
/usr/lib/postgresql/VERSION/bin). They refuse to run as root, so as root they run as the
``postgres`` user (``runuser``) on a temporary directory that user owns. Trust authentication on
127.0.0.1 only; the cluster and its directory are removed on exit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edge.core.errors import TrickleError


class PostgresUnavailableError(TrickleError):
    """No PostgreSQL server binaries here, or the cluster would not start."""


def postgres_bin(name: str) -> str:
    """The path of a PostgreSQL server program (the newest installed version's)."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), key=lambda p: int(p.parts[-3]))
    if not versions:
        raise PostgresUnavailableError(f"{name} not found: apt-get install --no-install-recommends postgresql")
    return str(versions[-1])


def available() -> bool:
    try:
        postgres_bin("initdb")
        postgres_bin("pg_ctl")
    except PostgresUnavailableError:
        return False
    return os.geteuid() != 0 or shutil.which("runuser") is not None


@contextmanager
def temporary_postgres(fsync: bool = False) -> Iterator[str]:
    """Start a cluster on a free loopback port; yields its URL. ``fsync``: durable commits (off
    for tests; a benchmark of stored messages keeps it on)."""
    from server.ports import free_port

    initdb, pg_ctl = postgres_bin("initdb"), postgres_bin("pg_ctl")
    root = Path(tempfile.mkdtemp(prefix="trickle-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data, log = root / "data", root / "server.log"
    port = free_port()
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync={'on' if fsync else 'off'}"

    def run(cmd: list[str], what: str) -> None:
        proc = subprocess.run([*as_user, *cmd], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            tail = log.read_text()[-1500:] if log.exists() else ""
            raise PostgresUnavailableError(f"{what} failed: {(proc.stderr or proc.stdout).strip()[-1500:]}\n{tail}")

    try:
        run([initdb, "-D", str(data), "-A", "trust", "-U", "trickle", "-E", "UTF8", "--no-sync"], "initdb")
        run([pg_ctl, "-D", str(data), "-o", options, "-l", str(log), "-w", "-t", "60", "start"], "pg_ctl start")
        try:
            yield f"postgresql://trickle@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True, timeout=120)
    finally:
        shutil.rmtree(root, ignore_errors=True)
