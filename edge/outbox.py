"""Store-and-forward: every outgoing message is on disk before it is sent, and leaves only when
the server has acknowledged storing it (``edge.protocol.Ack``).

One SQLite file (WAL, synchronous=FULL: a message the agent reported as queued survives a power
cut or a kill -9). Each message carries its idempotency key, so sending it twice after a crash
is harmless: the server stores a key once. The same file keeps the agent's small durable state
(the source cursor), updated in the same transaction as the message it produced, so a restart
neither skips nor repeats a sample.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path


class Outbox:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(
                "CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT UNIQUE NOT NULL, "
                "topic TEXT NOT NULL, payload BLOB NOT NULL);"
                "CREATE TABLE IF NOT EXISTS state (name TEXT PRIMARY KEY, value TEXT NOT NULL);")

    def put(self, key: str, topic: str, payload: bytes, state: dict[str, str] | None = None) -> None:
        """Queue a message (a key already queued is kept as it was) and, atomically, save ``state``."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("INSERT OR IGNORE INTO outbox (key, topic, payload) VALUES (?, ?, ?)", (key, topic, payload))
                for name, value in (state or {}).items():
                    self._db.execute("INSERT OR REPLACE INTO state VALUES (?, ?)", (name, value))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def pending(self, after_seq: int = 0, limit: int = 100) -> list[tuple[int, str, bytes]]:
        """(seq, topic, payload) of queued messages, oldest first, after ``after_seq``."""
        with self._lock:
            return self._db.execute("SELECT seq, topic, payload FROM outbox WHERE seq > ? ORDER BY seq LIMIT ?",
                                    (after_seq, limit)).fetchall()

    def delete_keys(self, keys: list[str]) -> int:
        """Delete the messages the server acknowledged; returns how many were queued."""
        with self._lock:
            before = self._db.total_changes
            self._db.executemany("DELETE FROM outbox WHERE key = ?", [(k,) for k in keys])
            return self._db.total_changes - before

    def rows(self, seqs: list[int]) -> list[tuple[int, str, bytes]]:
        """(seq, topic, payload) of those of ``seqs`` still queued."""
        with self._lock:
            return [row for seq in seqs for row in
                    self._db.execute("SELECT seq, topic, payload FROM outbox WHERE seq = ?", (seq,)).fetchall()]

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    def get_state(self, name: str, default: str | None = None) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM state WHERE name = ?", (name,)).fetchone()
        return row[0] if row else default

    def set_state(self, name: str, value: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO state VALUES (?, ?)", (name, value))

    def close(self) -> None:
        with self._lock:
            self._db.close()
