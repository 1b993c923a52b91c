"""Priority classes through the wire and the services: `priority_class` is checked by the wire model (syntax) and
the GM (MEGHA_PRIORITY_CLASSES), answered 422 naming the field, echoed in the job's status; and across separate
GM, LM and worker-agent processes with the real RabbitMQ, a high-class job preempts a running low-class job on a
full cluster, and the low one runs again afterwards, to completion, once."""

from __future__ import annotations

import asyncio
import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from rich.console import Console
from test_gm_journal import SPEC, _Life

from megha.client.answers import submission
from megha.common.core.lm import LocalMaster
from megha.common.core.policies.priority import DEFAULT_PRIORITY_CLASSES, parse_class_users, parse_priority_classes
from megha.common.core.resources import DEFAULT_RESOURCE_NAMES
from megha.common.models import JobStatus, JobSubmission, TaskStatus
from megha.ctl.common import Ctl
from megha.ctl.jobs import _show_job
from megha.deploy.local import LocalDeployment

from servicekit import api, needs_rabbitmq, small_deployment, wait_until

TASK = {"cpu_millicores": 1000, "memory_mb": 16}


def test_the_wire_model_checks_the_class_names_syntax_and_the_tasks_carry_the_value() -> None:
    with pytest.raises(ValidationError) as caught:
        JobSubmission.model_validate({"tasks": [{**TASK, "duration": 1}], "priority_class": "no such/class"})
    assert [e["loc"] for e in caught.value.errors()] == [("priority_class",)]
    sub = JobSubmission.model_validate({"tasks": [{**TASK, "duration": 1}], "priority_class": "high"})
    assert sub.priority_class == "high"
    assert [t.priority for t in sub.to_tasks("j", DEFAULT_RESOURCE_NAMES, 1000)] == [1000]
    assert JobSubmission.model_validate({"tasks": [{**TASK, "duration": 1}]}).priority_class is None


def test_the_client_sends_the_class_and_megha_job_status_shows_it() -> None:
    sub = submission({"tasks": [{**TASK, "duration": 1}], "priority_class": "low"})
    assert json.loads(sub.model_dump_json(exclude_unset=True, exclude_none=True))["priority_class"] == "low"
    status = JobStatus(job_id="j", user="alice", gm=0, state="queued", priority_class="low", tasks=[])
    ctl = Ctl([], [], None, False, Console(file=io.StringIO(), width=200))  # type: ignore[arg-type]
    _show_job(ctl, status, SimpleNamespace(urls=["http://gm"]))  # type: ignore[arg-type]
    assert "class low" in ctl.console.file.getvalue()  # type: ignore[attr-defined]


def test_a_restarted_gm_recovers_each_job_s_class_from_its_journal(tmp_path: Path) -> None:
    lm = LocalMaster(0, SPEC.partitions[0], ended_runs_kept=100, priority_classes=True)

    async def lives() -> None:
        first = _Life(tmp_path, 10, lm)
        await first.service.recover()
        body = {"job_id": "h", "priority_class": "high", "tasks": [{**TASK, "duration": 60}]}
        await first.service.submit(JobSubmission.model_validate(body), time.time())
        assert first.service.journal is not None
        first.service.journal.close()  # the crash: the launch never reached the LM
        second = _Life(tmp_path, 10, lm)
        await second.service.recover()
        status = second.service.jobs.status("h")
        assert status is not None and status.priority_class == "high"
        assert [p.task.priority for b in second.batches() for p in b.placements] == [1000]
        assert second.service.journal is not None
        second.service.journal.close()

    asyncio.run(lives())


TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789"}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    """One GM, one LM and one agent of one 1-core node (simulated execution): one task fills the cluster. Users
    alice and bob; alice may name class high (MEGHA_PRIORITY_CLASS_USERS, which the GM inherits)."""
    node = {"node_cpu_millicores": 1000, "node_memory_mb": 256}
    logs = Path(tmp_path_factory.mktemp("priority")) / "logs"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MEGHA_PRIORITY_CLASS_USERS", "high:alice")
        with small_deployment(logs, user_tokens=TOKENS, **node) as running:
            api.use(running)
            yield running


def status(gm: str, job_id: str) -> dict[str, Any]:
    return api.get(f"{gm}/v1/jobs/{job_id}", timeout=5).json()  # type: ignore[no-any-return]


@needs_rabbitmq
def test_an_unknown_class_is_refused_naming_the_field(deployment: LocalDeployment) -> None:
    gm = deployment.gm_urls[0]
    r = api.post(f"{gm}/v1/jobs", json={"tasks": [{**TASK, "duration": 0}], "priority_class": "urgent"})
    assert r.status_code == 422, r.text
    assert [d["field"] for d in r.json()["detail"]] == ["priority_class"]
    assert "urgent" in r.text and "high" in r.text


@needs_rabbitmq
def test_a_high_job_preempts_a_running_low_job_which_runs_again_afterwards(deployment: LocalDeployment) -> None:
    gm, lm = deployment.gm_urls[0], deployment.lm_urls[0]
    r = api.post(f"{gm}/v1/jobs", json={"job_id": "low", "priority_class": "low", "tasks": [{**TASK, "duration": 3}]})
    assert r.status_code == 201, r.text
    low_id = r.json()["job_id"]
    wait_until(lambda: status(gm, low_id)["state"] == "running", 10, lambda: status(gm, low_id))
    r = api.post(f"{gm}/v1/jobs", json={"job_id": "high", "priority_class": "high", "tasks": [{**TASK, "duration": 1}]})
    assert r.status_code == 201, r.text
    high_id = r.json()["job_id"]
    high = wait_until(lambda: (s := status(gm, high_id))["state"] == "finished" and s, 15, lambda: status(gm, high_id))
    low = wait_until(lambda: (s := status(gm, low_id))["state"] == "finished" and s, 20, lambda: status(gm, low_id))
    assert (high["priority_class"], low["priority_class"]) == ("high", "low")
    (low_task,), (high_task,) = low["tasks"], high["tasks"]
    assert low_task["preemptions"] == 1 and high_task["preemptions"] == 0
    assert low_task["finished_at"] >= high_task["finished_at"] + 2.0  # its 3 s ran again, from the start
    r = api.post(f"{gm}/v1/jobs", json={"tasks": [{**TASK, "duration": 0}]})
    assert status(gm, r.json()["job_id"])["priority_class"] == "normal"  # the default class
    lm_state = wait_until(lambda: (s := api.get(f"{lm}/v1/state").json())["idle"] and s, 10)
    assert lm_state["preemptions"] == 1


@needs_rabbitmq
def test_a_class_above_the_default_is_for_operators_and_the_users_listed_for_it(deployment: LocalDeployment) -> None:
    gm = deployment.gm_urls[0]

    def submit(user: str, priority_class: str) -> httpx.Response:
        body = {"priority_class": priority_class, "tasks": [{**TASK, "duration": 0}]}
        return httpx.post(f"{gm}/v1/jobs", json=body, headers={"Authorization": f"Bearer {TOKENS[user]}"}, timeout=5)

    refused = submit("bob", "high")
    assert refused.status_code == 403, refused.text
    assert [d["field"] for d in refused.json()["detail"]] == ["priority_class"]
    assert "only operators and alice may name it" in refused.text
    for user, priority_class in (("alice", "high"), ("bob", "normal"), ("bob", "low")):
        accepted = submit(user, priority_class)
        assert accepted.status_code == 201, (user, priority_class, accepted.text)
        job = accepted.json()["job_id"]
        wait_until(lambda job=job: status(gm, job)["state"] == "finished", 10, lambda job=job: status(gm, job))


def test_the_class_users_setting_names_known_classes_above_the_default_only() -> None:
    classes = parse_priority_classes(DEFAULT_PRIORITY_CLASSES)
    assert parse_class_users("high:alice+bob, high:carol", classes) == {"high": frozenset({"alice", "bob", "carol"})}
    for text, words in (
        ("urgent:alice", "unknown class 'urgent'"),
        ("low:alice", "not above the default class 'normal'"),
        ("high", "is not class:user+user"),
    ):
        with pytest.raises(ValueError, match=re.escape(words)):
            parse_class_users(text, classes)


def test_megha_job_status_shows_a_failure_reason_s_terminal_controls_as_escapes() -> None:
    """A task's stderr tail, its failure reason, may hold escape sequences (a window title, OSC 52's clipboard
    write): `megha job status` prints them as escapes, never to the terminal."""
    reason = "exit code 3: \x1b]0;PWNED\x07\x1b[2J\x1b]52;c;ZWNobw==\x07visible\nnext"
    task = TaskStatus(task_id="j.0", state="failed", failed_reason=reason)
    status = JobStatus(job_id="j", user="alice", gm=0, state="failed", tasks=[task])
    ctl = Ctl([], [], None, False, Console(file=io.StringIO(), width=400))  # type: ignore[arg-type]
    _show_job(ctl, status, SimpleNamespace(urls=["http://gm"]))  # type: ignore[arg-type]
    shown = ctl.console.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b" not in shown and "\x07" not in shown and "\\x1b]0;PWNED\\x07" in shown, repr(shown)
