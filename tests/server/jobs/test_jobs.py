"""Jobs on the server: a distillation submitted over HTTP ends as an OTA update on a real agent;
dead workers resume or fail a job, never leave it half-registered; cancel; restarts."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.ports import free_port
from tests.conftest import TrainedBundle
from tests.server.conftest import Bundles, ServerProc, agent_cmd, start_agent, wait_for


@pytest.fixture(scope="module")
def teacher(trained_bundle: TrainedBundle) -> Path:
    return trained_bundle("digits", "nexume", epochs=3).checkpoint


def upload_teacher(server: ServerProc, checkpoint: Path) -> str:
    """The teacher reference of a checkpoint uploaded to the server (POST /v1/checkpoints)."""
    r = httpx.post(server.url + "/v1/checkpoints", content=checkpoint.read_bytes(), headers=server.admin, timeout=60)
    assert r.status_code == 201, r.text
    return str(r.json()["teacher"])


def submit(server: ServerProc, **spec: Any) -> httpx.Response:
    """POST a distill job; a teacher given as a local checkpoint file is uploaded first."""
    if isinstance(spec.get("teacher"), Path):
        spec["teacher"] = upload_teacher(server, spec["teacher"])
    return httpx.post(server.url + "/v1/jobs", json={"kind": "distill", **spec}, headers=server.admin, timeout=10)


def job(server: ServerProc, job_id: int) -> dict[str, Any]:
    r = httpx.get(f"{server.url}/v1/jobs/{job_id}", headers=server.admin, timeout=10)
    r.raise_for_status()
    return r.json()


def logs(server: ServerProc, job_id: int) -> list[str]:
    r = httpx.get(f"{server.url}/v1/jobs/{job_id}/logs", headers=server.admin, timeout=10)
    r.raise_for_status()
    return [line["line"] for line in r.json()]


def bundle_versions(server: ServerProc) -> list[int]:
    return [b["version"] for b in httpx.get(server.url + "/v1/bundles", headers=server.admin, timeout=10).json()]


def test_a_distill_job_over_http_reaches_the_fleet_by_ota(tmp_path: Path, bundles: Bundles, teacher: Path) -> None:
    server = ServerProc(tmp_path / "server", free_port(), "embedded", free_port(), trust=bundles.pub,
                        extra=["--workers", "1"])
    server.start()
    agent = None
    try:
        assert httpx.post(server.url + "/v1/bundles", content=bundles.v1.read_bytes(), headers=server.admin).status_code == 201
        token = server.register("s1", fleet="field")
        state = tmp_path / "s1"
        cmd = agent_cmd(server, "s1", token, state, bundles.v1, bundles.source, "--trust", str(bundles.pub),
                        "--trust", str(server.data / "signing.pub"), "--period-s", "0.5")  # samples beyond the job
        cmd[cmd.index("--fleet") + 1] = "field"
        agent = start_agent(cmd, tmp_path / "agent.log")
        wait_for(lambda: server.messages("s1", "result"), 60, "the agent's first results")

        # bad specs are refused with the reason, and only the admin may submit
        a_path = submit(server, teacher=str(teacher))  # a job names what the server holds, never a file path
        assert a_path.status_code == 422 and "teacher" in a_path.text
        missing = submit(server, teacher="checkpoint:" + "0" * 64)
        assert missing.status_code == 422 and "no checkpoint with that sha256" in missing.text
        assert submit(server, teacher=teacher, q_min=8, q_max=4).status_code == 422
        assert "must be among" in submit(server, teacher=teacher, formats=["gguf"]).text
        device = {"Authorization": f"Bearer {token.read_text()}"}
        assert httpx.post(server.url + "/v1/jobs", json={"teacher": "job:1"}, headers=device).status_code == 403

        r = submit(server, teacher=teacher, dataset="digits", keep_ratio=0.5, epochs=2, formats=["onnx"],
                   then_assign="field")
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        done = wait_for(lambda: (j := job(server, job_id))["state"] in ("done", "failed") and j, 300, "the job")
        assert done["state"] == "done", (done["error"], logs(server, job_id))
        assert done["progress"] == 1.0 and done["attempts"] == 1
        result = done["result"]
        assert result["bundle_version"] == 2 and result["assigned"] == "fleet:field"
        assert result["kept"] == 10 * int(result["n_train"] / 10 * 0.5)  # ⌊N/C·r⌋ per class
        lines = logs(server, job_id)
        assert any("epoch 2/2" in line for line in lines) and any("registered bundle v2" in line for line in lines)
        assert bundle_versions(server) == [1, 2]

        # the device takes it by the usual OTA path (signature, self-test) and reports with it
        wait_for(lambda: any(m["event"] == "ota_applied" for m in server.messages("s1", "event")), 120, "ota_applied")
        assert json.loads((state / "current.json").read_text())["path"] == "bundles/v2.tar"
        wait_for(lambda: any(m.get("bundle_version") == 2 for m in server.messages("s1", "result")), 60,
                 "a result from the distilled bundle")
    finally:
        if agent is not None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(30)
        server.stop()


def test_killed_workers_resume_then_fail_a_job_and_never_half_register(tmp_path: Path, teacher: Path) -> None:
    server = ServerProc(tmp_path / "server", free_port(), "embedded", free_port(), extra=["--workers", "1"])
    server.start()
    try:
        job_id = submit(server, teacher=teacher, epochs=400, formats=["onnx"]).json()["id"]

        def kill_when_training(attempt: int) -> None:
            running = wait_for(lambda: (j := job(server, job_id))["attempts"] == attempt
                               and j["step"].startswith("epoch") and j, 120, f"attempt {attempt} training")
            os.kill(int(running["worker"].split(":")[1]), signal.SIGKILL)

        kill_when_training(1)
        again = wait_for(lambda: (j := job(server, job_id))["attempts"] == 2 and j, 60, "the job resumed")
        assert again["state"] in ("queued", "running")
        assert any("died (exit status -9): job resumed" in line for line in logs(server, job_id))
        kill_when_training(2)
        failed = wait_for(lambda: (j := job(server, job_id))["state"] == "failed" and j, 60, "the job failed")
        assert "died" in failed["error"] and failed["result"] is None and failed["bundle_version"] is None
        assert bundle_versions(server) == []
        assert not list((server.data / "bundles").glob("v*.tar"))

        # cancel: a running job stops at its next epoch, a queued one at once
        long_id = submit(server, teacher=teacher, epochs=400, formats=["onnx"]).json()["id"]
        queued_id = submit(server, teacher=teacher, epochs=1, formats=["onnx"]).json()["id"]
        wait_for(lambda: job(server, long_id)["step"].startswith("epoch"), 120, "the long job training")
        r = httpx.post(f"{server.url}/v1/jobs/{queued_id}/cancel", headers=server.admin)
        assert r.status_code == 200 and r.json()["state"] == "cancelled"
        assert httpx.post(f"{server.url}/v1/jobs/{long_id}/cancel", headers=server.admin).json()["cancel_requested"]
        wait_for(lambda: job(server, long_id)["state"] == "cancelled", 60, "the running job cancelled")
        assert httpx.post(f"{server.url}/v1/jobs/{job_id}/cancel", headers=server.admin).status_code == 409
        assert httpx.get(f"{server.url}/v1/jobs/999", headers=server.admin).status_code == 404
        assert bundle_versions(server) == []
    finally:
        server.stop()


def test_a_restarted_server_runs_queued_jobs_once(tmp_path: Path, teacher: Path) -> None:
    server = ServerProc(tmp_path / "server", free_port(), "embedded", free_port())  # no workers: the job waits
    server.start()
    job_id = submit(server, teacher=teacher, epochs=1, formats=["onnx"]).json()["id"]
    server.stop()
    server.extra = ["--workers", "1"]
    server.start()
    done = wait_for(lambda: (j := job(server, job_id))["state"] == "done" and j, 300, "the queued job after a restart")
    server.stop()
    server.start()
    again = job(server, job_id)
    assert again["state"] == "done" and again["attempts"] == 1 and again["finished_s"] == done["finished_s"]
    assert bundle_versions(server) == [1]
    # a teacher may be the checkpoint a job made
    second = submit(server, teacher="bundle:1", epochs=1, formats=["onnx"])
    assert second.status_code == 201, second.text
    assert submit(server, teacher=f"job:{job_id}", epochs=1, formats=["onnx"]).status_code == 201
    assert submit(server, teacher="bundle:7").status_code == 422
    assert submit(server, teacher="job:99").status_code == 422
    server.stop()


def test_the_job_spec_offers_every_selection_models_distill_knows() -> None:
    from typing import get_args

    from models.distill import SELECTIONS
    from server.jobs.queue import Selection

    assert get_args(Selection) == SELECTIONS


def test_a_stopped_server_hands_its_running_job_back(tmp_path: Path, teacher: Path) -> None:
    from server.store.store import open_store

    server = ServerProc(tmp_path / "server", free_port(), "embedded", free_port(), extra=["--workers", "1"])
    server.start()
    try:
        job_id = submit(server, teacher=teacher, epochs=400, formats=["onnx"]).json()["id"]
        wait_for(lambda: job(server, job_id)["step"].startswith("epoch"), 120, "the job training")
    finally:
        server.stop()  # SIGTERM: the worker stops at its next epoch and hands the job back
    store = open_store(server.data / "trickle.sqlite")
    try:
        stopped = store.job(job_id)
        assert stopped is not None
        assert (stopped["state"], stopped["attempts"], stopped["worker"]) == ("queued", 0, None)  # no attempt spent
        assert any("handed back" in line["line"] for line in store.job_logs(job_id))
    finally:
        store.close()
