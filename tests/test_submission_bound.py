"""Submission is bounded per user (MEGHA_MAX_UNFINISHED_TASKS_PER_USER): a job that would take a user's unfinished
tasks at a GM past the bound gets 429 naming the user, with Retry-After; one larger than the bound gets 422; other
users are not held back; the load generator waits and submits again, so a replay under the bound still completes
every task."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from megha.common.settings import LoadgenSettings
from megha.deploy.local import LocalDeployment
from megha.loadgen.services import replay_services

from servicekit import api, needs_rabbitmq

pytestmark = needs_rabbitmq

NODE = {"cpu_millicores": 2000, "memory_mb": 4096}


def _job(job_id: str, tasks: int, user: str, duration: float = 600.0) -> dict[str, object]:
    return {"job_id": job_id, "user": user, "tasks": [{"duration": duration, **NODE} for _ in range(tasks)]}


def test_a_user_at_the_bound_gets_429_until_tasks_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEGHA_MAX_UNFINISHED_TASKS_PER_USER", "2")
    deployment = LocalDeployment(gms=1, lms=1, workers_per_lm=1, execution="simulated", log_dir=tmp_path / "logs")
    with deployment:
        api.use(deployment)
        gm = deployment.gm_urls[0]
        assert api.post(f"{gm}/v1/jobs", json=_job("a1", 2, "alice"), timeout=10).status_code == 201
        held = api.post(f"{gm}/v1/jobs", json=_job("a2", 1, "alice"), timeout=10)
        assert held.status_code == 429, held.text
        assert held.headers["retry-after"] == "2"
        assert held.json()["detail"][0]["field"] == "user" and "alice" in held.json()["error"]
        assert "MEGHA_MAX_UNFINISHED_TASKS_PER_USER=2" in held.json()["error"]
        assert api.post(f"{gm}/v1/jobs", json=_job("b1", 1, "bob"), timeout=10).status_code == 201
        too_big = api.post(f"{gm}/v1/jobs", json=_job("a3", 3, "alice"), timeout=10)
        assert too_big.status_code == 422 and too_big.json()["detail"][0]["field"] == "tasks"
        # Once alice's tasks end (here: cancelled), she may submit again.
        assert api.delete(f"{gm}/v1/jobs/a1", timeout=10).status_code == 202
        assert api.post(f"{gm}/v1/jobs", json=_job("a2", 1, "alice"), timeout=10).status_code == 201


def test_a_replay_held_back_by_the_bound_still_completes_every_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="megha.loadgen")
    monkeypatch.setenv("MEGHA_MAX_UNFINISHED_TASKS_PER_USER", "100")
    deployment = LocalDeployment(
        gms=1, lms=1, workers_per_lm=2, nodes_per_worker=4, execution="simulated", log_dir=tmp_path / "logs"
    )
    with deployment:
        api.use(deployment)
        settings = LoadgenSettings(trace="demo", first_jobs=12, time_scale=0.00002, mode="slot", timeout=300.0)
        run = asyncio.run(replay_services(deployment.loadgen(settings)))
    accepted = [r for r in run.tasks.values() if not run.jobs[r.job_id].rejected_reason]
    assert len(accepted) == len(run.tasks) > 100  # more than the bound: some jobs had to wait
    assert all(r.completions == 1 for r in accepted), [r.task_id for r in accepted if r.completions != 1]
    assert any("back (1 times)" in r.getMessage() for r in caplog.records), "no job was held back: a weak test"
