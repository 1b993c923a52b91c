"""Job arrays and dependencies through real processes (two GMs, one LM, one agent that offers exec, the real
RabbitMQ, authentication on): an array's tasks each print their MEGHA_ARRAY_INDEX; a child submitted at GM 1
waits for its parent at GM 0 and then runs; a parent that fails or is cancelled fails its children with the reason;
an unknown parent, and another user's, are refused alike with a 422 naming `depends_on.0`."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from test_gm_journal import SPEC, _Life

from megha.common.core.lm import LocalMaster
from megha.common.models import JobSubmission
from megha.common.settings import GMSettings
from megha.common.wire.dependencies import ParentJob
from megha.ctl import cli
from megha.deploy.local import LocalDeployment
from megha.services.client import CallError
from megha.services.gm.service import GMService

from servicekit import needs_rabbitmq, wait_until

ENDED = ("finished", "failed", "cancelled")
TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789"}


def exec_task(script: str) -> dict[str, Any]:
    return {"driver": "exec", "command": ["sh", "-c", script], "cpu_millicores": 100, "memory_mb": 32}


class User:
    def __init__(self, name: str) -> None:
        self.headers = {"Authorization": f"Bearer {TOKENS[name]}"}

    def submit(self, gm: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{gm}/v1/jobs", json=body, headers=self.headers, timeout=10.0)

    def accepted(self, gm: str, body: dict[str, Any]) -> str:
        r = self.submit(gm, body)
        assert r.status_code == 201, r.text
        return r.json()["job_id"]  # type: ignore[no-any-return]

    def status(self, gm: str, job_id: str) -> dict[str, Any]:
        r = httpx.get(f"{gm}/v1/jobs/{job_id}", headers=self.headers, timeout=5.0)
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    def ended(self, gm: str, job_id: str) -> dict[str, Any]:
        wait_until(lambda: self.status(gm, job_id)["state"] in ENDED, 60.0, lambda: self.status(gm, job_id))
        return self.status(gm, job_id)


alice, bob = User("alice"), User("bob")


@pytest.fixture(scope="module")
def gms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two GMs (each asks its peer after remote parents every 0.3 s), one LM, one agent offering burn and exec."""
    here = tmp_path_factory.mktemp("deps")
    agents = {"worker-0-0": {"drivers": "burn,exec", "task_log_dir": here / "output"}}
    before = os.environ.get("MEGHA_DEPENDENCY_POLL")
    os.environ["MEGHA_DEPENDENCY_POLL"] = "0.3"  # the GMs inherit it
    try:
        with LocalDeployment(
            gms=2, lms=1, workers_per_lm=1, log_dir=here / "logs", worker_settings=agents, user_tokens=TOKENS
        ) as deployment:
            yield deployment.gm_urls
    finally:
        if before is None:
            del os.environ["MEGHA_DEPENDENCY_POLL"]
        else:
            os.environ["MEGHA_DEPENDENCY_POLL"] = before


@needs_rabbitmq
def test_each_task_of_an_array_sees_its_index(gms: list[str]) -> None:
    gm = gms[0]
    job_id = alice.accepted(gm, {"job_id": "arr", "array": 3, "tasks": [exec_task("echo index=$MEGHA_ARRAY_INDEX")]})
    status = alice.ended(gm, job_id)
    assert status["state"] == "finished" and status["array"] == 3, status
    for i in range(3):
        r = httpx.get(f"{gm}/v1/jobs/arr/tasks/arr.{i}/logs", headers=alice.headers, timeout=10.0)
        assert r.status_code == 200 and r.text == f"index={i}\n", r.text


@needs_rabbitmq
def test_a_child_at_gm_1_waits_for_its_parent_at_gm_0_then_runs(gms: list[str]) -> None:
    gm0, gm1 = gms
    parent = alice.accepted(gm0, {"job_id": "parent", "tasks": [exec_task("sleep 6")]})  # waits through a loaded CI
    child = alice.accepted(gm1, {"job_id": "child", "depends_on": ["parent"], "tasks": [exec_task("true")]})
    waiting = alice.status(gm1, child)
    assert waiting["state"] == "waiting" and waiting["depends_on"] == [parent], waiting
    assert waiting["tasks"][0]["state"] == "queued" and waiting["tasks"][0]["launched_at"] is None
    listed = httpx.get(f"{gm1}/v1/jobs", params={"state": "waiting"}, headers=alice.headers, timeout=5.0).json()
    assert [j["job_id"] for j in listed["jobs"]] == [child], listed
    env = {"COLUMNS": "200", "MEGHA_GM_URL": gm1, "MEGHA_GM_URLS": "", "MEGHA_API_TOKEN": TOKENS["alice"]}
    shown = CliRunner().invoke(cli, ["job", "status", "child"], env=env)
    assert shown.exit_code == 0 and " waiting: " in shown.output and f"depends on: {parent}" in shown.output, shown
    done = alice.ended(gm1, child)
    parent_done = alice.status(gm0, parent)
    assert done["state"] == "finished" and parent_done["state"] == "finished", (done, parent_done)
    assert done["tasks"][0]["launched_at"] >= parent_done["tasks"][0]["finished_at"]
    # When each run started on its worker, as the worker measured it: the parent slept 2 s of it.
    (p,) = parent_done["tasks"]
    assert p["launched_at"] - 1.0 <= p["started_at"] <= p["finished_at"] - 1.9, p


@needs_rabbitmq
def test_a_failed_parent_fails_its_child_naming_it_and_a_cancelled_one_too(gms: list[str]) -> None:
    gm0, gm1 = gms
    parent = alice.accepted(gm0, {"job_id": "bad", "tasks": [exec_task("sleep 1; exit 3")]})
    child = alice.accepted(gm1, {"depends_on": [parent], "tasks": [exec_task("true")] * 2})
    failed = alice.ended(gm1, child)
    assert failed["state"] == "failed", failed
    reason = f"dependency: parent job {parent} failed; this job did not run"
    assert [t["failed_reason"] for t in failed["tasks"]] == [reason, reason]
    assert all(t["launched_at"] is None for t in failed["tasks"])

    # A parent at the child's own GM, cancelled while its child waits; and a waiting job cancelled itself.
    slow = alice.accepted(gm1, {"job_id": "slow", "tasks": [exec_task("sleep 600")]})
    orphan = alice.accepted(gm1, {"depends_on": ["slow"], "tasks": [exec_task("true")]})
    dropped = alice.accepted(gm0, {"depends_on": [slow], "tasks": [exec_task("true")]})
    r = httpx.delete(f"{gm0}/v1/jobs/{dropped}", headers=alice.headers, timeout=10.0)
    assert r.status_code == 202 and r.json()["state"] == "cancelled", r.text
    r = httpx.delete(f"{gm1}/v1/jobs/slow", headers=alice.headers, timeout=10.0)
    assert r.status_code == 202, r.text
    orphaned = alice.ended(gm1, orphan)
    assert orphaned["tasks"][0]["failed_reason"] == f"dependency: parent job {slow} was cancelled; this job did not run"
    assert alice.status(gm0, dropped)["tasks"][0]["state"] == "cancelled"


@needs_rabbitmq
def test_an_unknown_parent_and_another_users_are_refused_alike_naming_depends_on(gms: list[str]) -> None:
    gm0, gm1 = gms
    secret = alice.accepted(gm0, {"job_id": "secret", "tasks": [exec_task("true")]})
    answers = {}
    for parent in (secret, "secret", "alice~secret", "g0-zzz-1", "nothing"):
        r = bob.submit(gm1, {"depends_on": [parent], "tasks": [exec_task("true")]})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"][0]
        assert detail["field"] == "depends_on.0", detail
        answers[parent] = detail["message"].replace(parent, "X")
    assert set(answers.values()) == {"no job X"}, answers
    own = alice.submit(gm1, {"depends_on": [secret], "tasks": [exec_task("true")]})  # alice may
    assert own.status_code == 201, own.text


def test_a_waiting_job_waits_again_after_its_gm_restarts_and_runs_once_its_parent_finished(tmp_path: Path) -> None:
    """In-process (tests/test_gm_journal.py's GM against an LM core the test drives): the journal keeps
    `depends_on`, so a restarted GM holds the child in its gate again, not in its queue."""
    lm = LocalMaster(0, SPEC.partitions[0], ended_runs_kept=100)
    child = {"job_id": "c", "depends_on": ["p"], "tasks": [{"duration": 1.0, "cpu_millicores": 500, "memory_mb": 64}]}

    async def lives() -> None:
        first = _Life(tmp_path, 10, lm)
        await first.service.recover()
        await first.submit("p")
        await first.service.submit(JobSubmission.model_validate(child), time.time())
        assert [p.task.task_id for b in first.batches() for p in b.placements] == ["p.0"]  # lost in the crash
        assert first.service.journal is not None
        first.service.journal.close()

        second = _Life(tmp_path, 10, lm)
        await second.service.recover()
        service, core = second.service, second.service.core
        assert core is not None and list(core.dependencies.jobs) == ["c"]
        status = service.jobs.status("c")
        assert status is not None and (status.state, status.depends_on) == ("waiting", ["p"])
        nodes = second.launch(second.batches())
        assert list(nodes) == ["p.0"]  # the parent runs again; the child does not
        second.finish("p.0", nodes["p.0"])
        await service.parents.step(False, service.parents)  # what the watch does once told of p's end
        assert [p.task.task_id for b in second.batches() for p in b.placements] == ["c.0"]
        assert service.jobs.status("c").state == "running"  # type: ignore[union-attr]
        assert service.journal is not None
        service.journal.close()

    asyncio.run(lives())


def test_a_parent_whose_gm_is_down_is_asked_of_its_stand_in_and_never_taken_for_forgotten() -> None:
    """GM 2 waits for GM 0's job `g0-x-1`. While GM 0 cannot be asked, GM 1 (which stands in for it once it stays
    down) answers; a 404 from GM 1 (not standing in) keeps the child waiting rather than failing it."""
    settings = GMSettings(lm_urls=["http://127.0.0.1:9"], gm_urls=["http://g0", "http://g1", "http://g2"], gm_id=2)
    watch = GMService(settings).parents
    answers: dict[int, ParentJob | None] = {1: None}

    async def ask(gm: int, name: str) -> ParentJob | None:
        if gm not in answers:
            raise CallError(f"GM {gm} unreachable")
        return answers[gm]

    watch._ask = ask  # type: ignore[method-assign]
    assert asyncio.run(watch.outcome("g0-x-1")) is None  # GM 0 down, GM 1 does not hold it: keep waiting
    answers[1] = ParentJob(job_id="g0-x-1", user="alice", gm=0, state="finished")
    assert asyncio.run(watch.outcome("g0-x-1")) == "finished"
    answers[0] = None  # GM 0 is back and no longer knows the job
    assert asyncio.run(watch.outcome("g0-x-1")) == "forgotten"
