"""The job queue's rows (``server.jobs.queue`` runs them): claims, heartbeats, logs, cancels, and a
finished distillation registered as a bundle in the same transaction."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from server.store.database import Database, JobNotFinishedError, StoreError, VersionTakenError


class Jobs(Database):
    """The job queue."""

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
