"""Device messages, stored once each under (device, key)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from server.store.database import Database

MESSAGE_COLUMNS = "key, device, kind, ts_s, received_s, stored_s, body, correct, bundle_version, state"




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


class Messages(Database):
    """Storing batches of messages once, and reading a device's back in time order."""

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

    def message_counts(self) -> dict[str, int]:
        return {kind: int(n) for kind, n in self._all("SELECT kind, COUNT(*) FROM messages GROUP BY kind")}

    def latencies_s(self) -> list[float]:
        """stored - received per message (the bridge's share of the publish-to-stored latency)."""
        return [float(r) for (r,) in self._all("SELECT stored_s - received_s FROM messages")]
