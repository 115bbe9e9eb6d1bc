"""The HTTP routes of the job queue (admin only): submit, list, inspect, read the log, cancel.

    POST /v1/jobs                      a JobSpec (server.jobs.DistillJob)  -> 201 the job
    GET  /v1/jobs?state=running        the newest jobs, newest first
    GET  /v1/jobs/{id}                 state, progress, step, attempts, worker, error, result
    GET  /v1/jobs/{id}/logs?after=SEQ  its log lines after SEQ
    POST /v1/jobs/{id}/cancel          queued: cancelled now; running: its worker stops it
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query

from edge.protocol import ROUTES
from models.datasets import DATASETS
from server.jobs import JobError, JobSpec, resolve_teacher
from server.store import Store

JobState = Literal["queued", "running", "done", "failed", "cancelled"]


def jobs_router(store: Store, state_dir: Path, admin: Callable[..., Any]) -> APIRouter:
    router = APIRouter(dependencies=[Depends(admin)], tags=["jobs"])

    def existing(job_id: int) -> dict[str, Any]:
        job = store.job(job_id) if 0 < job_id < 2**62 else None
        if job is None:
            raise HTTPException(404, f"job {job_id} does not exist")
        return job

    @router.post(ROUTES["jobs"], status_code=201)
    def submit(spec: JobSpec) -> dict[str, Any]:
        """Queue a job; a worker runs it (trickle serve --workers N, or trickle worker)."""
        try:
            resolve_teacher(spec, store, state_dir)  # a missing teacher is the submitter's mistake, now
        except JobError as err:
            raise HTTPException(422, str(err)) from None
        # paths as the server sees them: a worker may run in another directory
        absolute = {k: str(Path(v).resolve()) for k, v in (("teacher", spec.teacher), ("dataset", spec.dataset))
                    if not v.startswith(("bundle:", "ucr:")) and v not in DATASETS and Path(v).exists()}
        spec = spec.model_copy(update=absolute)
        return existing(store.add_job(spec.kind, spec.model_dump_json()))

    @router.get(ROUTES["jobs"])
    def jobs(state: JobState | None = None,
             limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> list[dict[str, Any]]:
        return store.jobs(state, limit)

    @router.get(ROUTES["job"])
    def job(job_id: int) -> dict[str, Any]:
        return existing(job_id)

    @router.get(ROUTES["job_logs"])
    def logs(job_id: int, after: Annotated[int, Query(ge=0, le=2**62)] = 0,
             limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> list[dict[str, Any]]:
        existing(job_id)
        return store.job_logs(job_id, after, limit)

    @router.post(ROUTES["job_cancel"])
    def cancel(job_id: int) -> dict[str, Any]:
        """A queued job is cancelled at once; a running one stops at its next progress report."""
        existing(job_id)
        state = store.cancel_job(job_id)
        if state in ("done", "failed"):
            raise HTTPException(409, f"job {job_id} has already ended ({state})")
        return existing(job_id)

    return router
