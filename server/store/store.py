"""The server's storage: one repository class per aggregate (``Devices``, ``Messages``,
``FleetQueries`` for the dashboard, ``Bundles``, ``Jobs``, ``LlmKeys``) over one ``Database``; ``Store`` is
them together, on SQLite, and ``PostgresStore`` the same on PostgreSQL (``open_store`` picks).
Everything the rest of the server needs goes through ``Store``'s methods. Each thread gets its
own connection.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from server.store.bundles import Bundles
from server.store.database import MIGRATIONS, JobNotFinishedError, StoreError, VersionTakenError
from server.store.devices import RESERVED_USER, Device, Devices, token_sha256
from server.store.fleet import FleetQueries, natural_key
from server.store.jobs import Jobs
from server.store.llm_keys import LlmKeys
from server.store.messages import Incoming, Messages

__all__ = ["MIGRATIONS", "RESERVED_USER", "Device", "Incoming", "JobNotFinishedError", "PostgresStore", "Store",
           "StoreError", "VersionTakenError", "natural_key", "open_store", "redact", "token_sha256"]


class Store(Devices, FleetQueries, Messages, Bundles, Jobs, LlmKeys):
    """The server's store on SQLite (a file path): every repository over one database."""


class PostgresStore(Store):
    """The same store on PostgreSQL (``postgresql://USER@HOST:PORT/DB``), through psycopg 3."""

    placeholder = "%s"
    dialect = "postgresql"
    skip_locked = " FOR UPDATE SKIP LOCKED"

    def __init__(self, url: str) -> None:
        import psycopg

        self.url = url
        self._checkpoints = None
        self.integrity_errors = (psycopg.IntegrityError,)
        self._local = threading.local()
        try:
            self._db()
        except psycopg.OperationalError as e:
            raise StoreError(f"--store {redact(url)}: cannot connect ({str(e).strip().splitlines()[0]})") from None
        self.migrate()

    def __repr__(self) -> str:
        return f"PostgresStore({redact(self.url)})"

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.url, autocommit=True, connect_timeout=10)

    def _db(self) -> Any:
        db = getattr(self._local, "db", None)
        if db is not None and (db.closed or db.broken):  # the server restarted: the next try reconnects
            self._local.db = None
        return super()._db()

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        db = self._db()
        with db.transaction():
            yield db

    def _script(self, db: Any, sql: str) -> None:
        db.execute(sql)

    def _insert_new(self, db: Any, rows: list[tuple[Any, ...]]) -> int:
        with db.cursor() as cur:
            cur.executemany(self._sql(self.INSERT_MESSAGES), rows)
            return max(int(cur.rowcount), 0)


def redact(url: str) -> str:
    """A database URL without its password."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    query = "&".join("password=***" if q.lower().startswith("password=") else q for q in parts.query.split("&")) \
        if parts.query else ""
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def open_store(spec: str | Path, background_checkpoints: bool = False) -> Store:
    """``postgresql://...`` (or ``postgres://``): PostgreSQL; anything else: an SQLite file path
    (``background_checkpoints``: the server's, see ``Store``)."""
    text = str(spec)
    if text.startswith(("postgresql://", "postgres://")):
        return PostgresStore(text)
    return Store(Path(text), background_checkpoints)
