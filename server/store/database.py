"""The store's database: one connection per thread, transactions, the versioned schema.

SQLite in WAL mode by default (one file, readers never block the writer); PostgreSQL (psycopg 3)
through ``server.store.store.PostgresStore``. Both run the same SQL (standard ``ON CONFLICT``
upserts; ``?`` placeholders become ``%s`` for psycopg) and the same versioned migrations
(``MIGRATIONS``, recorded in ``schema_migrations``, applied at start in one transaction each).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edge.core.errors import TrickleError

_JOBS_SQL = """
CREATE TABLE IF NOT EXISTS jobs (
    id {serial}, kind TEXT NOT NULL, spec TEXT NOT NULL, state TEXT NOT NULL,
    cancel_requested INTEGER NOT NULL DEFAULT 0, worker TEXT, attempts INTEGER NOT NULL DEFAULT 0,
    progress DOUBLE PRECISION NOT NULL DEFAULT 0, step TEXT NOT NULL DEFAULT '', result TEXT, error TEXT,
    bundle_version BIGINT, announced INTEGER NOT NULL DEFAULT 0, created_s DOUBLE PRECISION NOT NULL,
    started_s DOUBLE PRECISION, finished_s DOUBLE PRECISION, heartbeat_s DOUBLE PRECISION);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, id);
CREATE TABLE IF NOT EXISTS job_logs (
    seq {serial}, job BIGINT NOT NULL, ts_s DOUBLE PRECISION NOT NULL, line TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS job_logs_by_job ON job_logs (job, seq);
"""

# Versioned schema: (version, SQL, or SQL per dialect). Never edit an applied one; add the next.
MIGRATIONS: tuple[tuple[int, str | dict[str, str]], ...] = (
    (1, """
CREATE TABLE IF NOT EXISTS devices (
    device TEXT PRIMARY KEY, fleet TEXT NOT NULL, token TEXT NOT NULL, token_sha256 TEXT NOT NULL,
    created_s DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
    key TEXT PRIMARY KEY, device TEXT NOT NULL, kind TEXT NOT NULL, ts_s DOUBLE PRECISION NOT NULL,
    received_s DOUBLE PRECISION NOT NULL, stored_s DOUBLE PRECISION NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS messages_by_device ON messages (device, kind, ts_s);
CREATE TABLE IF NOT EXISTS bundles (
    version BIGINT PRIMARY KEY, model TEXT NOT NULL, sha256 TEXT NOT NULL, path TEXT NOT NULL,
    uploaded_s DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS assignments (
    target TEXT PRIMARY KEY, version BIGINT NOT NULL REFERENCES bundles (version),
    assigned_s DOUBLE PRECISION NOT NULL);
"""),
    (2, """
CREATE INDEX IF NOT EXISTS messages_by_kind_time ON messages (kind, ts_s);
"""),
    # what the dashboard aggregates, out of the JSON bodies: a result's verdict, the bundle version a
    # message reports, a status's online/offline or an event's name
    (3, """
ALTER TABLE messages ADD COLUMN correct INTEGER;
ALTER TABLE messages ADD COLUMN bundle_version BIGINT;
ALTER TABLE messages ADD COLUMN state TEXT;
CREATE INDEX IF NOT EXISTS messages_by_received ON messages (kind, received_s);
"""),
    # the dashboard's per-device lookups, and the columns of 3 filled in for messages stored before it
    (4, {"sqlite": """
CREATE INDEX IF NOT EXISTS messages_by_device_received ON messages (device, received_s);
UPDATE messages SET correct = CASE json_extract(body, '$.correct') WHEN 1 THEN 1 WHEN 0 THEN 0 END
    WHERE kind = 'result' AND correct IS NULL;
UPDATE messages SET bundle_version = json_extract(body, '$.bundle_version')
    WHERE bundle_version IS NULL AND kind IN ('result', 'status', 'event');
UPDATE messages SET state = json_extract(body, '$.state') WHERE kind = 'status' AND state IS NULL;
UPDATE messages SET state = json_extract(body, '$.event') WHERE kind = 'event' AND state IS NULL;
""", "postgresql": """
CREATE INDEX IF NOT EXISTS messages_by_device_received ON messages (device, received_s);
UPDATE messages SET correct = CASE body::jsonb->>'correct' WHEN 'true' THEN 1 WHEN 'false' THEN 0 END
    WHERE kind = 'result' AND correct IS NULL;
UPDATE messages SET bundle_version = (body::jsonb->>'bundle_version')::bigint
    WHERE bundle_version IS NULL AND kind IN ('result', 'status', 'event');
UPDATE messages SET state = body::jsonb->>'state' WHERE kind = 'status' AND state IS NULL;
UPDATE messages SET state = body::jsonb->>'event' WHERE kind = 'event' AND state IS NULL;
"""}),
    # the job queue (server.jobs.queue): one row a job, its log lines beside it
    (5, {"sqlite": _JOBS_SQL.format(serial="INTEGER PRIMARY KEY AUTOINCREMENT"),
         "postgresql": _JOBS_SQL.format(serial="BIGSERIAL PRIMARY KEY")}),
    # a message is keyed by (the device that sent it, its key): a key is the device's own name space,
    # so nothing one device publishes can shadow, replace or acknowledge another's message; and
    # tokens are looked up by their hash through an index
    (6, {"sqlite": """
CREATE TABLE messages_by_owner (
    key TEXT NOT NULL, device TEXT NOT NULL, kind TEXT NOT NULL, ts_s DOUBLE PRECISION NOT NULL,
    received_s DOUBLE PRECISION NOT NULL, stored_s DOUBLE PRECISION NOT NULL, body TEXT NOT NULL,
    correct INTEGER, bundle_version BIGINT, state TEXT, PRIMARY KEY (device, key));
INSERT INTO messages_by_owner SELECT key, device, kind, ts_s, received_s, stored_s, body, correct, bundle_version, state
    FROM messages;
DROP TABLE messages;
ALTER TABLE messages_by_owner RENAME TO messages;
CREATE INDEX messages_by_device ON messages (device, kind, ts_s);
CREATE INDEX messages_by_kind_time ON messages (kind, ts_s);
CREATE INDEX messages_by_received ON messages (kind, received_s);
CREATE INDEX messages_by_device_received ON messages (device, received_s);
CREATE UNIQUE INDEX IF NOT EXISTS devices_by_token ON devices (token_sha256);
""", "postgresql": """
ALTER TABLE messages DROP CONSTRAINT messages_pkey;
ALTER TABLE messages ADD PRIMARY KEY (device, key);
CREATE UNIQUE INDEX IF NOT EXISTS devices_by_token ON devices (token_sha256);
"""}),
    # API keys of the language model's routes (server.llm.completions): only their sha256 is kept,
    # with what each key used
    (7, """
CREATE TABLE IF NOT EXISTS llm_keys (
    name TEXT PRIMARY KEY, key_sha256 TEXT NOT NULL UNIQUE, created_s DOUBLE PRECISION NOT NULL,
    revoked_s DOUBLE PRECISION, requests BIGINT NOT NULL DEFAULT 0, prompt_tokens BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0, last_used_s DOUBLE PRECISION);
"""),
)
class StoreError(TrickleError):
    """A request the store refuses (unknown device, duplicate id, unknown bundle)."""


class VersionTakenError(StoreError):
    """A bundle version registered meanwhile by someone else."""


class JobNotFinishedError(StoreError):
    """A job's end refused: it was cancelled meanwhile, or its worker no longer owns it."""


class Database:
    """The connection (one per thread), transactions and migrations: SQLite (a file path); ``PostgresStore``
    runs the same statements on PostgreSQL. The repositories (``Devices``, ``Messages``,
    ``FleetQueries``, ``Bundles``, ``Jobs``) run their statements through it."""

    placeholder = "?"
    dialect = "sqlite"
    integrity_errors: tuple[type[BaseException], ...] = (sqlite3.IntegrityError,)

    def __init__(self, path: Path, background_checkpoints: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        # the server's store: WAL checkpoints on a thread of their own, so that a commit never pays
        # for copying the log back (at half load that stall was the publish-to-stored p99)
        self._checkpoints: threading.Event | None = threading.Event() if background_checkpoints else None
        self.migrate()
        if self._checkpoints is not None:
            threading.Thread(target=self._checkpoint_loop, name="trickle-sqlite-checkpoint", daemon=True).start()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path})"

    def _connect(self) -> Any:
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # durable at every checkpoint, safe against corruption
        db.execute("PRAGMA foreign_keys=ON")
        if self._checkpoints is not None:
            db.execute("PRAGMA wal_autocheckpoint=0")
        return db

    def _checkpoint_loop(self, every_s: float = 10.0) -> None:
        assert self._checkpoints is not None
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            while not self._checkpoints.wait(every_s):
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)")  # never blocks the writer
                except sqlite3.OperationalError:  # busy: the next round
                    continue
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()

    def stop_checkpoints(self) -> None:
        """Stop the background checkpoints (after a last full one)."""
        if self._checkpoints is not None:
            self._checkpoints.set()

    def _db(self) -> Any:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._connect()
        return db

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    def _sql(self, query: str) -> str:
        return query if self.placeholder == "?" else query.replace("?", self.placeholder)

    def _run(self, query: str, args: Sequence[Any] = ()) -> Any:
        return self._db().execute(self._sql(query), tuple(args))

    def _all(self, query: str, args: Sequence[Any] = ()) -> list[Any]:
        return list(self._run(query, args).fetchall())

    def _one(self, query: str, args: Sequence[Any] = ()) -> Any:
        return self._run(query, args).fetchone()

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        db = self._db()
        db.execute("BEGIN")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # a failed COMMIT may have ended it already
                db.execute("ROLLBACK")
            raise

    def _script(self, db: Any, sql: str) -> None:
        for statement in (part.strip() for part in sql.split(";")):
            if statement:
                db.execute(statement)

    def migrate(self) -> list[int]:
        """Apply the migrations not yet recorded, each in its own transaction; returns those applied."""
        self._run("CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, "
                  "applied_s DOUBLE PRECISION NOT NULL)")
        done = {int(v) for (v,) in self._all("SELECT version FROM schema_migrations")}
        applied = []
        for version, sql in MIGRATIONS:
            if version in done:
                continue
            with self._transaction() as db:
                self._script(db, sql if isinstance(sql, str) else sql[self.dialect])
                db.execute(self._sql("INSERT INTO schema_migrations VALUES (?, ?) ON CONFLICT DO NOTHING"),
                           (version, time.time()))
            applied.append(version)
        return applied

    def schema_version(self) -> int:
        row = self._one("SELECT MAX(version) FROM schema_migrations")
        return int(row[0]) if row and row[0] is not None else 0

    def ping(self) -> None:
        """A round trip to the database (``/readyz``); raises when it cannot be reached."""
        self._one("SELECT 1")
