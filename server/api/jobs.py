"""The HTTP routes of the job queue (admin only): submit, list, inspect, read the log, cancel.

    POST /v1/checkpoints               trickle train's checkpoint.pt as the body -> {"teacher": "checkpoint:SHA256"}
    POST /v1/jobs                      a JobSpec (server.jobs.queue.DistillJob)  -> 201 the job
    GET  /v1/jobs?state=running        the newest jobs, newest first
    GET  /v1/jobs/{id}                 state, progress, step, attempts, worker, error, result
    GET  /v1/jobs/{id}/logs?after=SEQ  its log lines after SEQ
    POST /v1/jobs/{id}/cancel          queued: cancelled now; running: its worker stops it
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool

from edge.contract.protocol import ROUTES
from edge.core.errors import DataError
from server.api.limits import OCTET_STREAM, receive_file
from server.jobs.queue import JobError, JobSpec, checkpoint_store, resolve_dataset, resolve_teacher
from server.store.store import Store

MAX_CHECKPOINT_BYTES = 64 << 20


def _check_checkpoint(path: Path) -> None:
    """A checkpoint trickle train wrote, loaded as weights only (never code): DataError if not."""
    from models.nexume.checkpoint import load_checkpoint

    load_checkpoint(path)

JobState = Literal["queued", "running", "done", "failed", "cancelled"]


def jobs_router(store: Store, state_dir: Path, admin: Callable[..., Any]) -> APIRouter:
    router = APIRouter(dependencies=[Depends(admin)], tags=["jobs"])

    def existing(job_id: int) -> dict[str, Any]:
        job = store.job(job_id) if 0 < job_id < 2**62 else None
        if job is None:
            raise HTTPException(404, f"job {job_id} does not exist")
        return job

    @router.post(ROUTES["checkpoints"], status_code=201, max_body_size=MAX_CHECKPOINT_BYTES, openapi_extra=OCTET_STREAM)
    async def upload_checkpoint(request: Request) -> dict[str, Any]:
        """A teacher for jobs: trickle train's checkpoint.pt as the body. It is loaded as weights only
        (a file that would need code to load is refused) and kept under its sha256."""
        folder = checkpoint_store(state_dir)
        tmp, digest, size = await receive_file(request, folder, ".pt")
        try:
            await run_in_threadpool(_check_checkpoint, tmp)
        except DataError:
            raise HTTPException(400, "not a checkpoint trickle train wrote (it must load as weights only)") from None
        else:
            tmp.replace(folder / f"{digest}.pt")
        finally:
            tmp.unlink(missing_ok=True)
        return {"teacher": f"checkpoint:{digest}", "sha256": digest, "bytes": size}

    @router.post(ROUTES["jobs"], status_code=201)
    def submit(spec: JobSpec) -> dict[str, Any]:
        """Queue a job; a worker runs it (trickle serve --workers N, or trickle worker)."""
        try:  # a missing teacher or data set is the submitter's mistake, now
            resolve_teacher(spec, store, state_dir)
            resolve_dataset(spec, state_dir)
        except JobError as err:
            raise HTTPException(422, str(err)) from None
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
