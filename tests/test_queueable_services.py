"""Queueable tasks through a real GM, LM and worker agent (separate processes, the real RabbitMQ, real burning
processes; docs/queueable.md): a queueable task waits in the node's queue behind a running task and starts when it
ends; a guaranteed task evicts a running queueable one, which then runs again; a bad `queueable` gets a 422 naming
the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from megha.common.models import JobSubmission, validation_error_body
from megha.deploy.local import LocalDeployment

from servicekit import api, needs_rabbitmq, small_deployment, wait_until

TASK = {"cpu_millicores": 1000, "memory_mb": 64}  # the node's whole CPU: one task at a time


def _job(job_id: str, duration: float, queueable: bool = False) -> dict[str, object]:
    return {"job_id": job_id, "user": "alice", "tasks": [{"duration": duration, "queueable": queueable, **TASK}]}


def test_queueable_must_be_a_bool_naming_the_field() -> None:
    for bad in ("yes", 1, None):
        with pytest.raises(ValidationError) as err:
            JobSubmission.model_validate({"tasks": [{"duration": 1.0, "queueable": bad, **TASK}]})
        assert [d.field for d in validation_error_body(err.value).detail] == ["tasks.0.queueable"]
    job = JobSubmission.model_validate(
        {"tasks": [{"duration": 1.0, "queueable": True, **TASK}, {"duration": 1.0, **TASK}]}
    )
    assert [t.queueable for t in job.to_tasks("j", ("cpu_millicores", "memory_mb"))] == [True, False]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    log_dir = Path(tmp_path_factory.mktemp("queueable")) / "logs"
    with small_deployment(log_dir, execution="real", node_cpu_millicores=1000, node_memory_mb=512) as d:
        api.use(d)
        yield d


def _task(gm: str, job_id: str) -> dict[str, Any]:
    r = api.get(f"{gm}/v1/jobs/{job_id}", timeout=5.0)
    assert r.status_code == 200, r.text
    return r.json()["tasks"][0]  # type: ignore[no-any-return]


def _agent(deployment: LocalDeployment) -> dict[str, Any]:
    return api.get(f"{deployment.process('worker-0-0').url}/v1/state", timeout=5.0).json()  # type: ignore[no-any-return]


@needs_rabbitmq
def test_a_queued_task_starts_when_the_node_frees_and_a_guaranteed_task_evicts_it(
    deployment: LocalDeployment,
) -> None:
    gm = deployment.gm_urls[0]
    refused = api.post(f"{gm}/v1/jobs", json={"tasks": [{"duration": 1.0, "queueable": "yes", **TASK}]}, timeout=10)
    assert refused.status_code == 422 and refused.json()["detail"][0]["field"] == "tasks.0.queueable"

    assert api.post(f"{gm}/v1/jobs", json=_job("first", 1.0), timeout=10.0).status_code == 201
    wait_until(lambda: _agent(deployment)["running"] == ["first.0"], 30, lambda: _agent(deployment))
    assert api.post(f"{gm}/v1/jobs", json=_job("opportunistic", 2.0, queueable=True), timeout=10.0).status_code == 201
    # It fits nowhere, so its GM sends it to the node's queue: it waits there, not at the GM, and does not run.
    seen: list[dict[str, Any]] = []
    wait_until(lambda: seen.append(_agent(deployment)) or seen[-1]["queued"] == ["opportunistic.0"], 30, lambda: seen)
    assert all("opportunistic.0" not in s["running"] for s in seen)
    status = _task(gm, "opportunistic")
    assert status["queueable"] is True and status["state"] == "launched"
    assert _task(gm, "first")["queueable"] is False

    # The running task ends; the queued one starts at once, and the GM hears of the end when the agent's report
    # has reached it through the LM (the broker: a moment later, as in a CI run that read the GM first).
    wait_until(lambda: _agent(deployment)["running"] == ["opportunistic.0"], 60, lambda: _agent(deployment))
    wait_until(lambda: _task(gm, "first")["state"] == "finished", 30, lambda: _task(gm, "first"))

    # A guaranteed task evicts it at once, and it runs again once the guaranteed task has ended.
    assert api.post(f"{gm}/v1/jobs", json=_job("guaranteed", 0.5), timeout=10.0).status_code == 201
    wait_until(lambda: _task(gm, "opportunistic")["preemptions"] == 1, 30, lambda: _task(gm, "opportunistic"))
    wait_until(lambda: _task(gm, "guaranteed")["state"] == "finished", 60, lambda: _task(gm, "guaranteed"))
    wait_until(lambda: _task(gm, "opportunistic")["state"] == "finished", 90, lambda: _task(gm, "opportunistic"))
    lm = api.get(f"{deployment.lm_urls[0]}/v1/state", timeout=5.0).json()
    assert lm["running"] == 0 and lm["free"] == lm["capacity"], lm
    assert _agent(deployment) | {"worker": "", "execution": "real"} == {
        "worker": "",
        "execution": "real",
        "running": [],
        "queued": [],
    }
