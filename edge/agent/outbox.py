"""Store-and-forward: every outgoing message is on disk before it is sent, and leaves only when
the server has acknowledged storing it (``edge.contract.protocol.Ack``).

One SQLite file (WAL, synchronous=FULL: a message the agent reported as queued survives a power
cut or a kill -9). Each message carries its idempotency key, so sending it twice after a crash
is harmless: the server stores a key once. The same file keeps the agent's small durable state
(the source cursor), updated in the same transaction as the message it produced, so a restart
neither skips nor repeats a sample.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from edge.core.errors import DataError

RECOVER_HINT = "run trickle edge run with --recover-outbox to save it aside and keep what can still be read"
F = TypeVar("F", bound=Callable[..., Any])


class OutboxDamagedError(DataError):
    """The outbox file is not a readable SQLite database (a torn write, a bad sector, an edit)."""


def _guarded(method: F) -> F:
    """SQLite's 'file is not a database' / 'malformed' as one OutboxDamagedError naming the file."""

    @functools.wraps(method)
    def run(self: Outbox, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.DatabaseError as err:
            busy = isinstance(err, sqlite3.OperationalError) and "locked" in str(err)
            if busy or isinstance(err, (sqlite3.IntegrityError, sqlite3.ProgrammingError)):
                raise  # a busy file or a row it cannot take, not a damaged file
            raise OutboxDamagedError(f"{self.path}: the outbox is damaged ({err}); {RECOVER_HINT}") from None
    return run  # type: ignore[return-value]


class Outbox:
    """The device's on-disk queue of outgoing messages and its small durable state (one SQLite file,
    see the module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        try:
            self._open()
        except BaseException:
            self._db.close()
            raise

    @_guarded
    def _open(self) -> None:
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(
                "CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT UNIQUE NOT NULL, "
                "topic TEXT NOT NULL, payload BLOB NOT NULL);"
                "CREATE TABLE IF NOT EXISTS state (name TEXT PRIMARY KEY, value TEXT NOT NULL);")
            # a damaged page anywhere is found now, at start, not by the sender thread mid-run
            problems = [row[0] for row in self._db.execute("PRAGMA quick_check(3)").fetchall()]
        if problems != ["ok"]:
            raise OutboxDamagedError(f"{self.path}: the outbox is damaged ({'; '.join(problems)[:200]}); {RECOVER_HINT}")

    def put(self, key: str, topic: str, payload: bytes, state: dict[str, str] | None = None) -> None:
        """Queue a message (a key already queued is kept as it was) and, atomically, save ``state``."""
        self._queue([(key, topic, payload)], state or {})

    def put_many(self, messages: Iterable[tuple[str, str, bytes]]) -> int:
        """Queue many (key, topic, payload) in one transaction, one fsync: a bulk producer (a
        simulated fleet's backlog) pays for one durable write, not one per message. A key already
        queued is kept as it was; all or none are queued. Returns how many were new."""
        return self._queue(messages, {})

    @_guarded
    def _queue(self, messages: Iterable[tuple[str, str, bytes]], state: dict[str, str]) -> int:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                before = self._db.total_changes
                self._db.executemany("INSERT OR IGNORE INTO outbox (key, topic, payload) VALUES (?, ?, ?)", messages)
                added = self._db.total_changes - before
                self._db.executemany("INSERT OR REPLACE INTO state VALUES (?, ?)", state.items())
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return added

    @_guarded
    def pending(self, after_seq: int = 0, limit: int = 100) -> list[tuple[int, str, bytes]]:
        """(seq, topic, payload) of queued messages, oldest first, after ``after_seq``."""
        with self._lock:
            return self._db.execute("SELECT seq, topic, payload FROM outbox WHERE seq > ? ORDER BY seq LIMIT ?",
                                    (after_seq, limit)).fetchall()

    @_guarded
    def delete_keys(self, keys: list[str]) -> list[int]:
        """Delete the messages the server acknowledged; returns the sequence numbers of those that
        were queued."""
        seqs: list[int] = []
        with self._lock:
            for i in range(0, len(keys), 500):
                part = keys[i : i + 500]
                marks = ",".join("?" * len(part))
                seqs += [row[0] for row in self._db.execute(f"SELECT seq FROM outbox WHERE key IN ({marks})", part)]
                self._db.execute(f"DELETE FROM outbox WHERE key IN ({marks})", part)
        return seqs

    @_guarded
    def rows(self, seqs: list[int]) -> list[tuple[int, str, bytes]]:
        """(seq, topic, payload) of those of ``seqs`` still queued."""
        with self._lock:
            return [row for seq in seqs for row in
                    self._db.execute("SELECT seq, topic, payload FROM outbox WHERE seq = ?", (seq,)).fetchall()]

    @_guarded
    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    @_guarded
    def get_state(self, name: str, default: str | None = None) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM state WHERE name = ?", (name,)).fetchone()
        return row[0] if row else default

    @_guarded
    def set_state(self, name: str, value: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO state VALUES (?, ?)", (name, value))

    def close(self) -> None:
        with self._lock:
            self._db.close()


def recover_outbox(path: Path) -> tuple[Path | None, int, int]:
    """Save a damaged (or missing) outbox aside and start a new one holding what SQLite can still
    read of it: (where the damaged file went, messages kept, state rows kept). Rows are read in
    ranges of their sequence numbers, halving a range that fails, so one bad page costs only the
    rows on it."""
    aside = None
    if path.exists():
        aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(path, aside)
        for suffix in ("-wal", "-shm"):
            side = path.with_name(path.name + suffix)
            if side.exists():
                os.replace(side, aside.with_name(aside.name + suffix))
    rows: list[tuple[Any, ...]] = []
    state: list[tuple[Any, ...]] = []
    if aside is not None:
        with contextlib.closing(sqlite3.connect(f"file:{aside}?mode=ro", uri=True)) as old:
            rows = list(_readable(old, "SELECT seq, key, topic, payload FROM outbox WHERE seq BETWEEN ? AND ?"))
            state = list(_readable(old, "SELECT rowid, name, value FROM state WHERE rowid BETWEEN ? AND ?"))
    fresh = Outbox(path)
    try:
        with fresh._lock:
            fresh._db.execute("BEGIN IMMEDIATE")
            fresh._db.executemany("INSERT OR IGNORE INTO outbox (seq, key, topic, payload) VALUES (?, ?, ?, ?)", rows)
            fresh._db.executemany("INSERT OR REPLACE INTO state VALUES (?, ?)", [(n, v) for _, n, v in state])
            fresh._db.execute("COMMIT")
    finally:
        fresh.close()
    return aside, len(rows), len(state)


def _readable(db: sqlite3.Connection, query: str, top: int = 1 << 24, tries: int = 20_000) -> Iterator[tuple[Any, ...]]:
    """The rows ``query`` (over a closed id range) can read between 1 and ``top``, skipping what
    fails, in at most ``tries`` queries."""
    try:
        db.execute("SELECT 1").fetchone()
    except sqlite3.DatabaseError:  # not a database at all: nothing to keep
        return
    ranges = [(1, top)]
    while ranges and tries > 0:
        lo, hi = ranges.pop()
        tries -= 1
        try:
            found = db.execute(query, (lo, hi)).fetchall()
        except sqlite3.DatabaseError:
            if lo < hi:
                mid = (lo + hi) // 2
                ranges += [(mid + 1, hi), (lo, mid)]
            continue
        yield from found
