"""The server's storage behind one small repository: devices, messages, bundles, assignments.

SQLite in WAL mode by default (one file, readers never block the writer); PostgreSQL (psycopg 3)
when the server is given a ``postgresql://`` URL (``open_store``). Both run the same SQL (standard
``ON CONFLICT`` upserts; ``?`` placeholders become ``%s`` for psycopg) and the same versioned
migrations (``MIGRATIONS``, recorded in ``schema_migrations``, applied at start in one
transaction each). Everything the rest of the server needs goes through ``Store``'s methods. Each
thread gets its own connection.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

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
)
VIRTUAL_BEFORE_S = 1e9  # a device time before 2001-09-09 counts from the device's own start (a simulation)
ROUND_BINS_S = (1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0, 10800.0,
                21600.0, 43200.0, 86400.0, 2 * 86400.0, 7 * 86400.0, 14 * 86400.0, 30 * 86400.0)
RESERVED_USER = "trickle-server"  # the bridge's MQTT user (server.mqtt.bridge.SERVER_USER)
MESSAGE_COLUMNS = "key, device, kind, ts_s, received_s, stored_s, body, correct, bundle_version, state"


def natural_key(name: str) -> tuple[list[str | int], str]:
    """Sort key that reads numbers as numbers: n2 before n10 (then by the name itself)."""
    return [int(part) if k % 2 else part.lower() for k, part in enumerate(re.split(r"(\d+)", name))], name


class StoreError(TrickleError):
    """A request the store refuses (unknown device, duplicate id, unknown bundle)."""


class VersionTakenError(StoreError):
    """A bundle version registered meanwhile by someone else."""


class JobNotFinishedError(StoreError):
    """A job's end refused: it was cancelled meanwhile, or its worker no longer owns it."""


@dataclass(frozen=True)
class Device:
    """A registered device: its name, fleet and token."""

    device: str
    fleet: str
    token: str


@dataclass(frozen=True)
class Incoming:
    """A validated device message on its way to the table."""

    key: str
    device: str
    kind: str
    ts_s: float
    received_s: float
    body: str
    correct: bool | None = None  # a result's verdict, when the truth is known
    bundle_version: int | None = None  # the bundle a result, status or event reports
    state: str | None = None  # a status's online/offline, an event's name


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Store:
    """SQLite (a file path). ``PostgresStore`` runs the same statements on PostgreSQL."""

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

    # ---- devices ----

    def add_device(self, device: str, fleet: str) -> Device:
        if device == RESERVED_USER:
            raise StoreError(f"device {device!r}: the name is the server's own MQTT user")
        token = secrets.token_urlsafe(32)
        try:
            self._run("INSERT INTO devices VALUES (?, ?, ?, ?, ?)", (device, fleet, token, token_sha256(token), time.time()))
        except self.integrity_errors:
            raise StoreError(f"device {device!r} is already registered") from None
        return Device(device, fleet, token)

    def device(self, device: str) -> Device | None:
        row = self._one("SELECT device, fleet, token FROM devices WHERE device = ?", (device,))
        return Device(*row) if row else None

    def device_by_token(self, token: str) -> Device | None:
        row = self._one("SELECT device, fleet, token FROM devices WHERE token_sha256 = ?", (token_sha256(token),))
        return Device(*row) if row else None

    def devices(self) -> list[dict[str, Any]]:
        rows = self._all("SELECT device, fleet, created_s FROM devices ORDER BY device")
        return [{"device": d, "fleet": f, "created_s": c} for d, f, c in rows]

    # ---- messages ----

    INSERT_MESSAGES = f"INSERT INTO messages ({MESSAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"

    def _insert_new(self, db: Any, rows: list[tuple[Any, ...]]) -> int:
        before = db.total_changes
        db.executemany(self.INSERT_MESSAGES, rows)
        return int(db.total_changes - before)

    def add_messages(self, batch: list[Incoming]) -> int:
        """Store a batch in one transaction; a key already stored is skipped. Returns how many were new."""
        now = time.time()
        rows = [(m.key, m.device, m.kind, m.ts_s, m.received_s, now, m.body,
                 None if m.correct is None else int(m.correct), m.bundle_version, m.state) for m in batch]
        with self._transaction() as db:
            return self._insert_new(db, rows)

    def messages(self, device: str, kind: str, since_s: float | None = None, until_s: float | None = None,
                 limit: int = 1000, newest: bool = False) -> list[dict[str, Any]]:
        """A device's messages of one kind in time order: the first ``limit`` (or with ``newest``, the last)."""
        query = "SELECT body FROM messages WHERE device = ? AND kind = ?"
        args: list[Any] = [device, kind]
        if since_s is not None:
            query += " AND ts_s >= ?"
            args.append(since_s)
        if until_s is not None:
            query += " AND ts_s < ?"
            args.append(until_s)
        order = " ORDER BY ts_s DESC, key DESC LIMIT ?" if newest else " ORDER BY ts_s, key LIMIT ?"
        rows = self._all(query + order, (*args, limit))
        return [json.loads(body) for (body,) in (reversed(rows) if newest else rows)]

    def stored_times(self, kind: str) -> list[tuple[str, float]]:
        """(key, stored_s) of every message of ``kind`` (what the link benchmark times)."""
        return [(k, float(t)) for k, t in self._all("SELECT key, stored_s FROM messages WHERE kind = ?", (kind,))]

    def ping(self) -> None:
        """A round trip to the database (``/readyz``); raises when it cannot be reached."""
        self._one("SELECT 1")

    def message_counts(self) -> dict[str, int]:
        return {kind: int(n) for kind, n in self._all("SELECT kind, COUNT(*) FROM messages GROUP BY kind")}

    def latencies_s(self) -> list[float]:
        """stored - received per message (the bridge's share of the publish-to-stored latency)."""
        return [float(r) for (r,) in self._all("SELECT stored_s - received_s FROM messages")]

    # ---- the dashboard's aggregates ----

    def fleet_totals(self, now_s: float, online_s: float) -> dict[str, Any]:
        """Devices (and how many are online: a message within ``online_s`` and no later offline
        status), results, results within the last hour, verdicts known and right, per kind."""
        devices, online = self._one(
            "SELECT COUNT(*), COALESCE(SUM(CASE WHEN (SELECT MAX(received_s) FROM messages m WHERE m.device = d.device) >= ? "
            "AND COALESCE((SELECT state FROM messages s WHERE s.device = d.device AND s.kind = 'status' "
            "ORDER BY s.received_s DESC, s.key DESC LIMIT 1), '') <> 'offline' THEN 1 ELSE 0 END), 0) FROM devices d",
            (now_s - online_s,))
        results, hour, labelled, right = self._one(
            "SELECT COUNT(*), COALESCE(SUM(CASE WHEN received_s >= ? THEN 1 ELSE 0 END), 0), COUNT(correct), "
            "COALESCE(SUM(correct), 0) FROM messages WHERE kind = 'result'", (now_s - 3600.0,))
        return {"devices": int(devices), "online": int(online), "results": int(results), "results_last_hour": int(hour),
                "labelled": int(labelled), "correct": int(right), "messages": self.message_counts()}

    def results_over_time(self, now_s: float, bins: int = 48) -> list[dict[str, Any]]:
        """Results counted by the time the device gave them (``ts_s``), not when they arrived: one
        series per clock that has any. ``virtual``: a simulation's (or a device without a real-time
        clock's) own seconds since its start, any ``ts_s`` before ``VIRTUAL_BEFORE_S``; its bins
        cover the whole span seen, about ``bins`` of a round size. ``wall``: the last 24 h in hours
        (whole hours, ending with the current one). Each is ``{clock, start_s, bin_s, counts}``."""
        out = []
        lo, hi, n = self._one("SELECT MIN(ts_s), MAX(ts_s), COUNT(*) FROM messages WHERE kind = 'result' AND ts_s < ?",
                              (VIRTUAL_BEFORE_S,))
        if n:
            lo = min(lo, 0.0)  # a virtual clock's axis starts at its start
            bin_s = next((b for b in ROUND_BINS_S if b * bins >= hi - lo), ROUND_BINS_S[-1])
            start = math.floor(lo / bin_s) * bin_s
            out.append({"clock": "virtual", "start_s": start, "bin_s": bin_s,
                        "counts": self._binned(start, bin_s, int((hi - start) // bin_s) + 1)})
        end = math.ceil(now_s / 3600.0) * 3600.0
        counts = self._binned(end - 24 * 3600.0, 3600.0, 24)
        if any(counts):
            out.append({"clock": "wall", "start_s": end - 24 * 3600.0, "bin_s": 3600.0, "counts": counts})
        return out

    def _binned(self, start_s: float, bin_s: float, n: int) -> list[int]:
        """Results with ``start_s <= ts_s < start_s + n * bin_s``, counted per bin."""
        bucket = "FLOOR((ts_s - ?) / ?)" if self.dialect == "postgresql" else "CAST((ts_s - ?) / ? AS INTEGER)"
        counts = [0] * n
        for k, count in self._all(f"SELECT {bucket} AS k, COUNT(*) FROM messages WHERE kind = 'result' AND ts_s >= ? "
                                  "AND ts_s < ? GROUP BY k", (start_s, bin_s, start_s, start_s + n * bin_s)):
            if 0 <= int(k) < n:
                counts[int(k)] += int(count)
        return counts

    def fleet_page(self, now_s: float, online_s: float, offset: int = 0, limit: int = 50, search: str = "",
                   only: str | None = None) -> tuple[int, list[dict[str, Any]]]:
        """(devices matching, one page of them in natural order: n2 before n10): per device its
        fleet, last seen, online, the bundle it reports running, results (all and last hour),
        verdicts known and right, its last event, and from its newest telemetry (by the device's
        time) its power failures and time powered."""
        pattern = "%" + search.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        where = "WHERE (LOWER(device) LIKE ? ESCAPE '\\' OR LOWER(fleet) LIKE ? ESCAPE '\\')"
        args: list[Any] = [pattern, pattern]
        if only is not None:
            where, args = where + " AND device = ?", [*args, only]
        names = sorted((name for (name,) in self._all(f"SELECT device FROM devices {where}", args)), key=natural_key)
        chosen = names[offset : offset + limit]
        if not chosen:
            return len(names), []
        rows = self._all(
            "SELECT d.device, d.fleet, MAX(m.received_s), "
            "COALESCE(SUM(CASE WHEN m.kind = 'result' THEN 1 ELSE 0 END), 0), "
            "COALESCE(SUM(CASE WHEN m.kind = 'result' AND m.received_s >= ? THEN 1 ELSE 0 END), 0), "
            "COUNT(m.correct), COALESCE(SUM(m.correct), 0), "
            "(SELECT b.bundle_version FROM messages b WHERE b.device = d.device AND b.bundle_version IS NOT NULL "
            " ORDER BY b.ts_s DESC, b.key DESC LIMIT 1), "
            "(SELECT s.state FROM messages s WHERE s.device = d.device AND s.kind = 'status' "
            " ORDER BY s.received_s DESC, s.key DESC LIMIT 1), "
            "(SELECT e.state FROM messages e WHERE e.device = d.device AND e.kind = 'event' "
            " ORDER BY e.ts_s DESC, e.key DESC LIMIT 1), "
            "(SELECT t.body FROM messages t WHERE t.device = d.device AND t.kind = 'telemetry' "
            " ORDER BY t.ts_s DESC, t.key DESC LIMIT 1) "
            f"FROM (SELECT device, fleet FROM devices WHERE device IN ({', '.join('?' * len(chosen))})) d "
            "LEFT JOIN messages m ON m.device = d.device GROUP BY d.device, d.fleet",
            (now_s - 3600.0, *chosen))
        page = []
        for device, fleet, seen, results, hour, labelled, right, running, status, event, telemetry in rows:
            online = seen is not None and seen >= now_s - online_s and status != "offline"
            last = json.loads(telemetry) if telemetry else {}
            page.append({"device": device, "fleet": fleet, "last_seen_s": seen, "online": bool(online),
                         "running_version": running, "results": int(results), "results_last_hour": int(hour),
                         "labelled": int(labelled), "correct": int(right), "last_event": event,
                         "power_cycles": last.get("power_cycles"), "on_time_s": last.get("on_time_s")})
        order = {name: k for k, name in enumerate(chosen)}
        return len(names), sorted(page, key=lambda row: order[row["device"]])

    # ---- bundles and assignments ----

    def add_bundle(self, version: int, model: str, sha256: str, path: Path) -> None:
        try:
            self._run("INSERT INTO bundles VALUES (?, ?, ?, ?, ?)", (version, model, sha256, str(path), time.time()))
        except self.integrity_errors:
            raise StoreError(f"bundle_version {version} is already uploaded; a new bundle needs a new version") from None

    def bundle(self, version: int) -> dict[str, Any] | None:
        row = self._one("SELECT version, model, sha256, path FROM bundles WHERE version = ?", (version,))
        return dict(zip(("version", "model", "sha256", "path"), row)) if row else None

    def bundles(self) -> list[dict[str, Any]]:
        rows = self._all("SELECT version, model, sha256 FROM bundles ORDER BY version")
        return [dict(zip(("version", "model", "sha256"), r)) for r in rows]

    def assign(self, target: str, version: int) -> None:
        """``target`` is ``device:ID`` or ``fleet:NAME``."""
        if self.bundle(version) is None:
            raise StoreError(f"bundle_version {version} is not uploaded")
        self._run("INSERT INTO assignments VALUES (?, ?, ?) ON CONFLICT (target) DO UPDATE SET "
                  "version = excluded.version, assigned_s = excluded.assigned_s", (target, version, time.time()))

    def assignment(self, device: Device) -> int | None:
        """The version a device should run: its own assignment, else its fleet's."""
        for target in (f"device:{device.device}", f"fleet:{device.fleet}"):
            row = self._one("SELECT version FROM assignments WHERE target = ?", (target,))
            if row:
                return int(row[0])
        return None

    def assignments(self) -> dict[str, int]:
        """Every assignment: target -> bundle version."""
        return {t: int(v) for t, v in self._all("SELECT target, version FROM assignments ORDER BY target")}


    # ---- jobs (server.jobs.queue) ----

    JOB_COLUMNS = ("id", "kind", "spec", "state", "cancel_requested", "worker", "attempts", "progress", "step", "result",
                   "error", "bundle_version", "created_s", "started_s", "finished_s", "heartbeat_s")
    skip_locked = ""  # PostgreSQL: workers claiming at once skip each other's row instead of waiting

    def add_job(self, kind: str, spec: str) -> int:
        row = self._one("INSERT INTO jobs (kind, spec, state, created_s) VALUES (?, ?, 'queued', ?) RETURNING id",
                        (kind, spec, time.time()))
        return int(row[0])

    def _job(self, row: Sequence[Any]) -> dict[str, Any]:
        job = dict(zip(self.JOB_COLUMNS, row))
        job["spec"] = json.loads(job["spec"])
        job["result"] = json.loads(job["result"]) if job["result"] else None
        job["cancel_requested"] = bool(job["cancel_requested"])
        return job

    def job(self, job_id: int) -> dict[str, Any] | None:
        row = self._one(f"SELECT {', '.join(self.JOB_COLUMNS)} FROM jobs WHERE id = ?", (job_id,))
        return self._job(row) if row else None

    def jobs(self, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The newest ``limit`` jobs (of one ``state``), newest first."""
        where, args = ("WHERE state = ?", [state]) if state else ("", [])
        rows = self._all(f"SELECT {', '.join(self.JOB_COLUMNS)} FROM jobs {where} ORDER BY id DESC LIMIT ?", (*args, limit))
        return [self._job(r) for r in rows]

    def claim_job(self, worker: str) -> dict[str, Any] | None:
        """The oldest queued job, now running on ``worker`` (atomically: no two workers get one job)."""
        now = time.time()
        row = self._one(
            "UPDATE jobs SET state = 'running', worker = ?, attempts = attempts + 1, started_s = ?, heartbeat_s = ?, "
            "progress = 0, step = 'started', error = NULL "
            "WHERE id = (SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1"
            f"{self.skip_locked}) AND state = 'queued' RETURNING id", (worker, now, now))
        return self.job(int(row[0])) if row else None

    def job_heartbeat(self, job_id: int, worker: str, progress: float | None = None,
                      step: str | None = None) -> Literal["running", "cancel", "lost"]:
        """Record that ``worker`` still runs the job (and how far it is): ``running``; ``cancel`` when
        a cancellation was asked for; ``lost`` when the worker no longer owns the job (the server
        took it back from a worker it thought dead)."""
        row = self._one("UPDATE jobs SET heartbeat_s = ?, progress = COALESCE(?, progress), step = COALESCE(?, step) "
                        "WHERE id = ? AND worker = ? AND state = 'running' RETURNING cancel_requested",
                        (time.time(), progress, step, job_id, worker))
        return "lost" if not row else "cancel" if row[0] else "running"

    def job_log(self, job_id: int, line: str) -> None:
        self._run("INSERT INTO job_logs (job, ts_s, line) VALUES (?, ?, ?)", (job_id, time.time(), line))

    def job_logs(self, job_id: int, after: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        rows = self._all("SELECT seq, ts_s, line FROM job_logs WHERE job = ? AND seq > ? ORDER BY seq LIMIT ?",
                         (job_id, after, limit))
        return [{"seq": int(q), "ts_s": float(t), "line": line} for q, t, line in rows]

    def end_job(self, job_id: int, worker: str | None, state: str, error: str | None = None) -> bool:
        """Mark a job failed or cancelled (by its worker, or with ``worker`` None by the server);
        False when it had already ended."""
        owner = " AND worker = ?" if worker is not None else ""
        row = self._one(f"UPDATE jobs SET state = ?, error = ?, finished_s = ? WHERE id = ? AND state IN "
                        f"('queued', 'running'){owner} RETURNING id",
                        (state, error, time.time(), job_id, *([worker] if worker is not None else [])))
        return bool(row)

    def cancel_job(self, job_id: int) -> str | None:
        """A queued job is cancelled now; a running one is asked to stop (its worker ends it). The
        job's state after, or None for an unknown job."""
        # each UPDATE guards the state it changes: a worker claiming, handing back or finishing the
        # job between them makes it miss, and the next round sees the new state
        for _ in range(5):
            if self._one("UPDATE jobs SET state = 'cancelled', finished_s = ? WHERE id = ? AND state = 'queued' "
                         "RETURNING id", (time.time(), job_id)):
                return "cancelled"
            if self._one("UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND state = 'running' RETURNING id", (job_id,)):
                return "running"
            row = self._one("SELECT state FROM jobs WHERE id = ?", (job_id,))
            if row is None or row[0] not in ("queued", "running"):
                return None if row is None else str(row[0])
        raise StoreError(f"job {job_id} kept changing state while being cancelled; try again")

    def requeue_job(self, job_id: int, worker: str, heartbeat_s: float, max_attempts: int, why: str) -> str | None:
        """A running job whose worker is gone: queued again while it has attempts left, else failed.
        The state it is left in, or None when ``worker`` no longer ran it or beat since
        ``heartbeat_s`` (what the caller saw: it was alive after all)."""
        row = self._one("UPDATE jobs SET state = CASE WHEN attempts < ? AND cancel_requested = 0 THEN 'queued' "
                        "WHEN cancel_requested = 1 THEN 'cancelled' ELSE 'failed' END, "
                        "worker = NULL, error = ?, finished_s = CASE WHEN attempts < ? AND cancel_requested = 0 "
                        "THEN NULL ELSE ? END "
                        "WHERE id = ? AND worker = ? AND state = 'running' AND heartbeat_s = ? RETURNING state",
                        (max_attempts, why, max_attempts, time.time(), job_id, worker, heartbeat_s))
        return str(row[0]) if row else None

    def release_job(self, job_id: int, worker: str) -> None:
        """A job its worker hands back (stopped politely): queued again, the attempt not counted; or
        cancelled, when that was asked for meanwhile."""
        self._run("UPDATE jobs SET state = CASE WHEN cancel_requested = 1 THEN 'cancelled' ELSE 'queued' END, "
                  "finished_s = CASE WHEN cancel_requested = 1 THEN ? ELSE NULL END, worker = NULL, "
                  "attempts = attempts - 1 WHERE id = ? AND worker = ? AND state = 'running'", (time.time(), job_id, worker))

    def running_jobs(self) -> list[tuple[int, str, float]]:
        """(id, worker, heartbeat_s) of every running job."""
        return [(int(i), str(w), float(h)) for i, w, h in
                self._all("SELECT id, worker, heartbeat_s FROM jobs WHERE state = 'running'")]

    def jobs_version(self) -> tuple[Any, ...]:
        """Changes whenever a job is added, ends or moves on (the dashboard's stream compares it)."""
        return tuple(self._one(
            "SELECT COALESCE(MAX(id), 0), COALESCE(MAX(finished_s), 0), (SELECT COUNT(*) FROM jobs WHERE state = "
            "'running'), (SELECT COALESCE(SUM(progress + attempts + cancel_requested), 0) FROM jobs "
            "WHERE state IN ('queued', 'running')) FROM jobs"))

    def job_by_bundle(self, version: int) -> dict[str, Any] | None:
        """The finished job that made bundle ``version`` here."""
        row = self._one(f"SELECT {', '.join(self.JOB_COLUMNS)} FROM jobs WHERE bundle_version = ? AND state = 'done'",
                        (version,))
        return self._job(row) if row else None

    def next_bundle_version(self) -> int:
        (top,) = self._one("SELECT COALESCE(MAX(version), 0) FROM bundles")
        return int(top) + 1

    def finish_job(self, job_id: int, worker: str, result: dict[str, Any], bundle: tuple[int, str, str, Path] | None,
                   assign: str | None, place: Callable[[], None] = lambda: None) -> None:
        """A job's end in one transaction: its bundle (version, model, sha256, path) registered,
        assigned to ``assign`` (``fleet:NAME``), and the job done; ``place()`` (moving the bundle's
        file to its path) runs inside it, so a crash leaves either all of it or none. VersionTakenError
        when the version was taken meanwhile; JobNotFinishedError when the worker no longer owns the job
        or a cancellation was asked for (nothing registered)."""
        now = time.time()
        try:
            with self._transaction() as db:
                if bundle is not None:
                    version, model, sha, path = bundle
                    db.execute(self._sql("INSERT INTO bundles VALUES (?, ?, ?, ?, ?)"), (version, model, sha, str(path), now))
                    if assign is not None:
                        db.execute(self._sql("INSERT INTO assignments VALUES (?, ?, ?) ON CONFLICT (target) DO UPDATE SET "
                                             "version = excluded.version, assigned_s = excluded.assigned_s"),
                                   (assign, version, now))
                done = db.execute(self._sql(
                    "UPDATE jobs SET state = 'done', progress = 1, step = 'done', result = ?, bundle_version = ?, "
                    "finished_s = ?, error = NULL WHERE id = ? AND worker = ? AND state = 'running' "
                    "AND cancel_requested = 0 RETURNING id"),
                    (json.dumps(result, sort_keys=True), bundle[0] if bundle else None, now, job_id, worker)).fetchone()
                if done is None:
                    raise JobNotFinishedError(f"job {job_id} was cancelled or is no longer run by {worker}")
                place()
        except self.integrity_errors:
            raise VersionTakenError(f"bundle_version {bundle[0] if bundle else '?'} was taken meanwhile") from None

    def unannounced_jobs(self) -> list[dict[str, Any]]:
        """Finished jobs whose assignment the server has not yet pushed to the devices."""
        rows = self._all(f"SELECT {', '.join(self.JOB_COLUMNS)} FROM jobs WHERE state = 'done' AND announced = 0 ORDER BY id")
        return [self._job(r) for r in rows]

    def mark_announced(self, job_id: int) -> None:
        self._run("UPDATE jobs SET announced = 1 WHERE id = ?", (job_id,))


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
