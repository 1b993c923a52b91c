"""Gang jobs through the real services (separate GM, LM and agent processes, a real RabbitMQ): a gang spanning two
LMs starts every task (prepare, commit); a gang too big for the free capacity waits and none of its tasks starts
until capacity frees, or fails once its gang_timeout passes; the job status echoes `gang` and `gang_timeout`; bad
gang fields get a 422 naming them; a gang starving behind a stream of small jobs runs once its GM holds LMs for
it (MEGHA_GANG_RESERVE_AFTER)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from megha.common.core.resources import DEFAULT_RESOURCE_NAMES
from megha.common.models import JobSubmission
from megha.ctl import cli
from megha.deploy.local import LocalDeployment

from servicekit import api, needs_rabbitmq, small_deployment, wait_until

CORE = {"cpu_millicores": 1000, "memory_mb": 64}  # a whole node of the deployment below


def test_a_bad_gang_timeout_is_a_422_naming_it() -> None:
    tasks = [{**CORE, "duration": 1}]
    for body in ({"gang": True, "gang_timeout": -1}, {"gang": True, "gang_timeout": 0}, {"gang_timeout": 5}):
        with pytest.raises(ValidationError) as err:
            JobSubmission.model_validate({"tasks": tasks, **body})
        assert [e["loc"] for e in err.value.errors()] == [("gang_timeout",)], body
    assert JobSubmission.model_validate({"tasks": tasks, "gang": True}).core_gang == float("inf")
    assert JobSubmission.model_validate({"tasks": tasks, "gang": True, "gang_timeout": 3}).core_gang == 3
    assert JobSubmission.model_validate({"tasks": tasks}).core_gang is None


def test_a_retry_rule_on_a_gang_is_accepted_and_a_gang_array_is_a_gang_of_its_tasks() -> None:
    tasks = [{**CORE, "duration": 1}]
    ruled = JobSubmission.model_validate({"tasks": tasks, "gang": True, "retry": {"max_attempts": 2}})
    assert ruled.retry is not None and ruled.retry.max_attempts == 2
    job = ruled.to_job("r", DEFAULT_RESOURCE_NAMES, 0.0)
    assert job.gang == float("inf") and job.retry is not None and job.retry.max_attempts == 2
    with pytest.raises(ValidationError) as err:
        JobSubmission.model_validate({"tasks": [*tasks, {**tasks[0], "queueable": True}], "gang": True})
    assert [e["loc"] for e in err.value.errors()] == [("tasks.1.queueable",)]
    job = JobSubmission.model_validate({"tasks": tasks, "gang": True, "array": 3}).to_job(
        "j", DEFAULT_RESOURCE_NAMES, 0.0
    )
    assert job.gang == float("inf") and [t.task_id for t in job.tasks] == ["j.0", "j.1", "j.2"]


@pytest.fixture(scope="module")
def two_lms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    """One GM, two LMs of one 1-core node each (simulated execution)."""
    logs: Path = tmp_path_factory.mktemp("gang") / "logs"
    deployment = small_deployment(logs, lms=2, node_cpu_millicores=1000, node_memory_mb=256)
    with deployment:
        api.use(deployment)
        yield deployment


def status(deployment: LocalDeployment, job_id: str) -> dict[str, Any]:
    return api.get(f"{deployment.gm_urls[0]}/v1/jobs/{job_id}", timeout=5).json()  # type: ignore[no-any-return]


def submit(deployment: LocalDeployment, body: dict[str, Any]) -> str:
    r = api.post(f"{deployment.gm_urls[0]}/v1/jobs", json=body, timeout=10)
    assert r.status_code == 201, r.text
    return r.json()["job_id"]  # type: ignore[no-any-return]


def ended(deployment: LocalDeployment, job_id: str) -> dict[str, Any] | None:
    s = status(deployment, job_id)
    return s if s["state"] in ("finished", "failed", "cancelled") else None


@needs_rabbitmq
def test_a_gang_spanning_both_lms_starts_all_its_tasks(two_lms: LocalDeployment) -> None:
    job = submit(two_lms, {"gang": True, "gang_timeout": 60, "tasks": [{**CORE, "duration": 0.5}] * 2})
    s = wait_until(lambda: ended(two_lms, job), 30, lambda: status(two_lms, job))
    assert s["state"] == "finished" and s["gang"] is True and s["gang_timeout"] == 60
    assert sorted(t["lm"] for t in s["tasks"]) == [0, 1]  # one node per LM: it had to span both
    token = api.headers["Authorization"].removeprefix("Bearer ")
    env = {"COLUMNS": "200", "MEGHA_GM_URLS": "", "MEGHA_LM_URLS": "", "MEGHA_API_TOKEN": token}
    shown = CliRunner().invoke(cli, ["job", "status", job, "--gm", two_lms.gm_urls[0]], env=env)
    assert shown.exit_code == 0 and "gang: all tasks start or none; gang_timeout 60 s" in shown.output, shown.output


@needs_rabbitmq
def test_a_gang_too_big_for_the_free_capacity_waits_whole_until_it_frees(two_lms: LocalDeployment) -> None:
    blocker = submit(two_lms, {"tasks": [{**CORE, "duration": 3}]})
    wait_until(lambda: status(two_lms, blocker)["state"] == "running", 20, lambda: status(two_lms, blocker))
    job = submit(two_lms, {"gang": True, "tasks": [{**CORE, "duration": 0.5}] * 2})
    assert status(two_lms, job)["gang_timeout"] is None
    impatient = submit(two_lms, {"gang": True, "gang_timeout": 0.5, "tasks": [{**CORE, "duration": 0.5}] * 2})
    gave_up = wait_until(lambda: ended(two_lms, impatient), 30, lambda: status(two_lms, impatient))
    assert gave_up["state"] == "failed" and all(t["started_at"] is None for t in gave_up["tasks"]), gave_up
    assert all("gang_timeout=0.5s" in (t["failed_reason"] or "") for t in gave_up["tasks"]), gave_up
    b = wait_until(lambda: ended(two_lms, blocker), 30, lambda: status(two_lms, blocker))
    s = wait_until(lambda: ended(two_lms, job), 30, lambda: status(two_lms, job))
    assert s["state"] == "finished"
    (freed_at,) = [t["finished_at"] for t in b["tasks"]]
    # One node was free all along, yet neither task of the gang started before the other node freed.
    assert all(t["launched_at"] >= freed_at for t in s["tasks"]), (freed_at, s["tasks"])
    assert all(t["started_at"] >= freed_at for t in s["tasks"] if t["started_at"] is not None)


@needs_rabbitmq
def test_a_gang_bad_field_over_http_is_a_422_naming_it(two_lms: LocalDeployment) -> None:
    r = api.post(
        f"{two_lms.gm_urls[0]}/v1/jobs",
        json={"gang": True, "gang_timeout": -5, "tasks": [{**CORE, "duration": 1}]},
        timeout=10,
    )
    assert r.status_code == 422 and [d["field"] for d in r.json()["detail"]] == ["gang_timeout"], r.text


@needs_rabbitmq
def test_only_the_gm_itself_may_prepare_commit_or_abort_a_gang_at_an_lm(two_lms: LocalDeployment) -> None:
    """The gang routes take launch's rule: the caller must act as the GM the body names."""
    lm = two_lms.lm_urls[0]
    spec = {"task_id": "f.0", "job_id": "f", "user": "bob", "duration": 1.0, "request": [1, 1], "constraints": []}
    placement = {"task": spec, "lm": 0, "node": 0, "repartition": False, "gm": 0}
    calls = [
        ("prepare", {"gm": 0, "lm": 0, "seq": 99, "gang": "f", "placements": [placement], "lease_s": 5.0}),
        ("commit", {"gm": 0, "lm": 0, "seq": 99, "gang": "f"}),
        ("abort", {"gm": 0, "lm": 0, "seq": 99, "gang": "f"}),
    ]
    for step, body in calls:
        for who, headers in (("gm 1", two_lms.headers_as("gm", "1")), ("operator", two_lms.headers)):
            r = httpx.post(f"{lm}/v1/gangs/{step}", json=body, headers=headers, timeout=5)
            assert r.status_code == 403 and r.json()["detail"][0]["field"] in ("gm", "authorization"), (step, who)
    gm0 = two_lms.headers_as("gm", "0")
    term = httpx.get(f"{lm}/v1/gms/0/state", headers=gm0, timeout=5).json()["term"]
    r = httpx.post(f"{lm}/v1/gangs/abort?term={term}", json=calls[2][1], headers=gm0, timeout=5)
    assert r.status_code == 200 and r.json() == {"gang": "f"}, r.text  # an abort of nothing is nothing
    # A lease is at most a day: one of 2**63 s held the gang's resources for ever.
    endless = calls[0][1] | {"lease_s": 2.0**63}
    r = httpx.post(f"{lm}/v1/gangs/prepare?term={term}", json=endless, headers=gm0, timeout=5)
    assert r.status_code == 422 and [d["field"] for d in r.json()["detail"]] == ["lease_s"], r.text


@needs_rabbitmq
def test_a_gang_starving_behind_a_stream_of_small_jobs_runs_once_its_gm_holds_lms_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MEGHA_GANG_RESERVE_AFTER through the real services: a gang of the whole data centre (four 1-core nodes on two
    LMs) behind small jobs that keep every node taken. Without the reservation it waits as long as the stream
    lasts (over 40 s when tried by hand); with it, its GM stops placing the small jobs on the LMs it holds once the
    gang waited 2 s, and the gang runs while the stream goes on."""
    monkeypatch.setenv("MEGHA_GANG_RESERVE_AFTER", "2")
    deployment = small_deployment(
        tmp_path / "logs", lms=2, workers_per_lm=2, node_cpu_millicores=1000, node_memory_mb=256
    )
    with deployment:
        api.use(deployment)
        small = {"tasks": [{**CORE, "duration": 1.5}]}
        smalls = [submit(deployment, small) for _ in range(4)]  # every node taken
        gang = submit(deployment, {"gang": True, "tasks": [{**CORE, "duration": 0.5}] * 4})

        def gang_started() -> bool:
            smalls.append(submit(deployment, small))  # the stream: a small job each poll
            return status(deployment, gang)["state"] in ("running", "finished")

        wait_until(gang_started, 30, every=0.4)
        done = wait_until(lambda: ended(deployment, gang), 30)
        assert [t["state"] for t in done["tasks"]] == ["finished"] * 4
        for job in smalls:  # the held-back small jobs run once the gang is placed: nothing is lost
            assert wait_until(lambda job=job: ended(deployment, job), 60)["state"] == "finished"
