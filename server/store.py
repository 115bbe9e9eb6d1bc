"""The server's storage behind one small repository: devices, messages, bundles, assignments.

SQLite in WAL mode by default (one file, readers never block the writer). Everything the rest
of the server needs goes through ``Store``'s methods, so a real database can replace it by
implementing the same methods. Each thread gets its own connection.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge.errors import TrickleError

SCHEMA = """
CREATE TABLE IF NOT EXISTS devices (
    device TEXT PRIMARY KEY, fleet TEXT NOT NULL, token TEXT NOT NULL, token_sha256 TEXT NOT NULL,
    created_s REAL NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
    key TEXT PRIMARY KEY, device TEXT NOT NULL, kind TEXT NOT NULL, ts_s REAL NOT NULL,
    received_s REAL NOT NULL, stored_s REAL NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS messages_by_device ON messages (device, kind, ts_s);
CREATE TABLE IF NOT EXISTS bundles (
    version INTEGER PRIMARY KEY, model TEXT NOT NULL, sha256 TEXT NOT NULL, path TEXT NOT NULL,
    uploaded_s REAL NOT NULL);
CREATE TABLE IF NOT EXISTS assignments (
    target TEXT PRIMARY KEY, version INTEGER NOT NULL REFERENCES bundles (version), assigned_s REAL NOT NULL);
"""


class StoreError(TrickleError):
    """A request the store refuses (unknown device, duplicate id, unknown bundle)."""


@dataclass(frozen=True)
class Device:
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


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Store:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._db() as db:
            db.executescript(SCHEMA)

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # durable at every checkpoint, safe against corruption
            db.execute("PRAGMA foreign_keys=ON")
            self._local.db = db
        return db

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    # ---- devices ----

    def add_device(self, device: str, fleet: str) -> Device:
        token = secrets.token_urlsafe(32)
        try:
            self._db().execute("INSERT INTO devices VALUES (?, ?, ?, ?, ?)",
                               (device, fleet, token, token_sha256(token), time.time()))
        except sqlite3.IntegrityError:
            raise StoreError(f"device {device!r} is already registered") from None
        return Device(device, fleet, token)

    def device(self, device: str) -> Device | None:
        row = self._db().execute("SELECT device, fleet, token FROM devices WHERE device = ?", (device,)).fetchone()
        return Device(*row) if row else None

    def device_by_token(self, token: str) -> Device | None:
        row = self._db().execute("SELECT device, fleet, token FROM devices WHERE token_sha256 = ?",
                                 (token_sha256(token),)).fetchone()
        return Device(*row) if row else None

    def devices(self) -> list[dict[str, Any]]:
        rows = self._db().execute("SELECT device, fleet, created_s FROM devices ORDER BY device").fetchall()
        return [{"device": d, "fleet": f, "created_s": c} for d, f, c in rows]

    # ---- messages ----

    def add_messages(self, batch: list[Incoming]) -> int:
        """Store a batch in one transaction; a key already stored is skipped. Returns how many were new."""
        db = self._db()
        now = time.time()
        before = db.total_changes
        db.execute("BEGIN")
        try:
            db.executemany("INSERT OR IGNORE INTO messages VALUES (?, ?, ?, ?, ?, ?, ?)",
                           [(m.key, m.device, m.kind, m.ts_s, m.received_s, now, m.body) for m in batch])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return db.total_changes - before

    def messages(self, device: str, kind: str, since_s: float | None = None, until_s: float | None = None,
                 limit: int = 1000) -> list[dict[str, Any]]:
        query = "SELECT body FROM messages WHERE device = ? AND kind = ?"
        args: list[Any] = [device, kind]
        if since_s is not None:
            query += " AND ts_s >= ?"
            args.append(since_s)
        if until_s is not None:
            query += " AND ts_s < ?"
            args.append(until_s)
        rows = self._db().execute(query + " ORDER BY ts_s, key LIMIT ?", (*args, limit)).fetchall()
        return [json.loads(body) for (body,) in rows]

    def message_counts(self) -> dict[str, int]:
        rows = self._db().execute("SELECT kind, COUNT(*) FROM messages GROUP BY kind").fetchall()
        return dict(rows)

    def latencies_s(self) -> list[float]:
        """stored - received per message (the bridge's share of the publish-to-stored latency)."""
        return [r for (r,) in self._db().execute("SELECT stored_s - received_s FROM messages")]

    # ---- bundles and assignments ----

    def add_bundle(self, version: int, model: str, sha256: str, path: Path) -> None:
        try:
            self._db().execute("INSERT INTO bundles VALUES (?, ?, ?, ?, ?)", (version, model, sha256, str(path), time.time()))
        except sqlite3.IntegrityError:
            raise StoreError(f"bundle_version {version} is already uploaded; a new bundle needs a new version") from None

    def bundle(self, version: int) -> dict[str, Any] | None:
        row = self._db().execute("SELECT version, model, sha256, path FROM bundles WHERE version = ?", (version,)).fetchone()
        return dict(zip(("version", "model", "sha256", "path"), row)) if row else None

    def bundles(self) -> list[dict[str, Any]]:
        rows = self._db().execute("SELECT version, model, sha256 FROM bundles ORDER BY version").fetchall()
        return [dict(zip(("version", "model", "sha256"), r)) for r in rows]

    def assign(self, target: str, version: int) -> None:
        """``target`` is ``device:ID`` or ``fleet:NAME``."""
        if self.bundle(version) is None:
            raise StoreError(f"bundle_version {version} is not uploaded")
        self._db().execute("INSERT OR REPLACE INTO assignments VALUES (?, ?, ?)", (target, version, time.time()))

    def assignment(self, device: Device) -> int | None:
        """The version a device should run: its own assignment, else its fleet's."""
        for target in (f"device:{device.device}", f"fleet:{device.fleet}"):
            row = self._db().execute("SELECT version FROM assignments WHERE target = ?", (target,)).fetchone()
            if row:
                return int(row[0])
        return None
