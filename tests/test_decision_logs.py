"""Every decision an operator asks about is logged with the ids it concerns (docs/deploy.md, "Logs"): in-process
through the GM's job table, and through a real GM, LM and worker agents (separate processes, the real RabbitMQ)
writing JSON lines (MEGHA_LOG_FORMAT=json): a refused submission, a worker taken out of service and its tasks
lost and run again, a cancelled job's runs stopped, refused launches at the LM and at an agent."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from megha.common.core.messages import Placement
from megha.common.core.task import JobSpec
from megha.services.gm.jobs import JobTable
from megha.services.logs import JsonFormatter, ids

from corekit import task
from servicekit import api, needs_rabbitmq, small_deployment, wait_until

NODE = {"cpu_millicores": 2000, "memory_mb": 4096}  # the whole node of LocalDeployment's agents


def _json(record: logging.LogRecord) -> dict[str, object]:
    return json.loads(JsonFormatter("gm-0").format(record))


def _table(caplog: pytest.LogCaptureFixture) -> tuple[JobTable, JobSpec]:
    caplog.set_level(logging.DEBUG, logger="megha.gm")
    table = JobTable(3)
    job = JobSpec("j", (replace(task("j.0"), user="ann"), replace(task("j.1"), user="ann")), 0.0)
    table.job_arrived(job, 3, 0.0)
    return table, job


def test_ids_keep_the_given_ones_under_the_documented_keys() -> None:
    assert ids(job="j", task=["a", "b"], node=0, worker=None) == {"job": "j", "task": ["a", "b"], "node": 0}
    with pytest.raises(TypeError):
        ids(tasks=["a"])  # type: ignore[call-arg]


def test_an_inconsistency_a_loss_and_a_failure_are_logged_with_their_ids(caplog: pytest.LogCaptureFixture) -> None:
    table, job = _table(caplog)
    first = job.tasks[0]
    table.decided([Placement(first, 1, 7, False, 3)], 1.0)
    table.inconsistency(Placement(first, 1, 7, False, 3), 1.0)
    table.decided([Placement(first, 1, 8, False, 3)], 2.0)
    table.task_lost(first, "worker agent w silent for 9 s", 3.0)
    table.task_failed(replace(first, attempt=2), "LM 1: malformed", 4.0)

    logged = [(r.levelname, _json(r)) for r in caplog.records]
    assert [level for level, _ in logged] == ["INFO", "WARNING", "WARNING"], caplog.text
    common = {"job": "j", "task": "j.0", "gm": 3, "lm": 1, "user": "ann"}
    (_, inconsistency), (_, lost), (_, failed) = logged
    assert inconsistency.items() >= (common | {"attempt": 1, "node": 7}).items()
    assert "inconsistency" in str(inconsistency["message"])
    assert lost.items() >= (common | {"attempt": 1, "node": 8}).items()
    assert "runs again as attempt 2" in str(lost["message"])
    assert failed.items() >= (common | {"attempt": 2, "node": 8}).items()
    assert "LM 1: malformed" in str(failed["message"])


def test_repartitions_are_counted_per_batch_at_info_and_named_per_task_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    table, job = _table(caplog)
    table.decided([Placement(job.tasks[0], 0, 1, False, 3)], 1.0)
    assert caplog.records == []  # a placement in the GM's own partition is not news
    table.decided([Placement(job.tasks[1], 0, 5, True, 3)], 1.0)
    info = [_json(r) for r in caplog.records if r.levelno == logging.INFO]
    debug = [_json(r) for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(info) == 1 and info[0]["gm"] == 3 and info[0]["lm"] == 0 and "task" not in info[0]
    assert "1 of 1 tasks" in str(info[0]["message"])
    assert len(debug) == 1 and debug[0]["task"] == "j.1" and debug[0]["node"] == 5 and debug[0]["job"] == "j"


# ------------------------------------------------------------------ through the real services


def _records(log: Path) -> list[dict[str, object]]:
    """The JSON lines of a service's log (a line that is not JSON fails the test: the format is JSON)."""
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def _find(log: Path, match: Callable[[dict[str, object]], bool]) -> Callable[[], list[dict[str, object]]]:
    return lambda: [r for r in _records(log) if match(r)]


def _job(job_id: str, tasks: int, duration: float) -> dict[str, object]:
    return {"job_id": job_id, "user": "alice", "tasks": [{"duration": duration, **NODE} for _ in range(tasks)]}


def _status(gm: str, job_id: str) -> dict[str, object]:
    return api.get(f"{gm}/v1/jobs/{job_id}", timeout=5.0).json()


@needs_rabbitmq
def test_the_services_log_refusals_losses_retries_and_stops_with_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEGHA_LOG_FORMAT", "json")
    logs = tmp_path / "logs"
    deployment = small_deployment(logs, workers_per_lm=2, heartbeat_interval=0.3, worker_timeout=2.0, takeover_after=0)
    with deployment:
        api.use(deployment)
        gm, lm = deployment.gm_urls[0], deployment.lm_urls[0]
        gm_log, lm_log = logs / "gm-0.log", logs / "lm-0.log"

        # A refused submission: a resent job id (409).
        assert api.post(f"{gm}/v1/jobs", json=_job("long", 2, 600.0), timeout=10.0).status_code == 201
        assert api.post(f"{gm}/v1/jobs", json=_job("long", 2, 600.0), timeout=10.0).status_code == 409
        refused = _find(gm_log, lambda r: r.get("job") == "long" and r["level"] == "WARNING")
        wait_until(refused, 10, gm_log.read_text)
        assert refused()[0].items() >= {"job": "long", "user": "alice", "gm": 0, "service": "gm-0"}.items()
        assert "409" in str(refused()[0]["message"])

        # Both tasks run, one on each agent's node.
        wait_until(lambda: [t["state"] for t in _status(gm, "long")["tasks"]] == ["launched"] * 2, 30)  # type: ignore[index]
        victim = deployment.process("worker-0-0").url
        on_victim = api.get(f"{victim}/v1/state", timeout=5.0).json()["running"]
        assert len(on_victim) == 1, on_victim
        (lost_task,) = on_victim
        node = next(t["node"] for t in _status(gm, "long")["tasks"] if t["task_id"] == lost_task)  # type: ignore[union-attr]

        # A worker killed: the LM takes it out of service with its node and names the task lost; the GM runs that
        # task again as its next attempt.
        deployment.kill("worker-0-0")
        down = _find(lm_log, lambda r: r.get("worker") == "worker-0-0" and r["level"] == "ERROR")
        wait_until(down, 30, lm_log.read_text)
        assert down()[0].items() >= {"worker": "worker-0-0", "lm": 0, "node": [node], "task": [lost_task]}.items()
        assert down()[0]["job"] == ["long"] and down()[0]["gm"] == [0]
        retried = _find(gm_log, lambda r: r.get("task") == lost_task and "runs again" in str(r["message"]))
        wait_until(retried, 30, gm_log.read_text)
        assert retried()[0].items() >= {"job": "long", "attempt": 1, "lm": 0, "node": node, "gm": 0}.items()

        # A refused launch at the LM (sent to the wrong LM) and at the surviving agent (from the wrong LM).
        placement = {"task": {"task_id": "x.0", "job_id": "x", "user": "bob", "duration": 1.0, "request": [1, 1],
                              "constraints": []}, "lm": 5, "node": 1, "repartition": False, "gm": 0}  # fmt: skip
        as_gm = deployment.headers_as("gm", "0")  # past authentication
        launch = {"gm": 0, "lm": 5, "seq": 9, "placements": [placement]}
        r = httpx.post(f"{lm}/v1/launch", json=launch, headers=as_gm, timeout=5.0)
        assert r.status_code == 422, r.text
        lm_refusal = _find(lm_log, lambda r: r.get("task") == ["x.0"])
        wait_until(lm_refusal, 10, lm_log.read_text)
        assert lm_refusal()[0].items() >= {"level": "WARNING", "job": ["x"], "gm": 0, "lm": 5}.items()
        survivor = deployment.process("worker-0-1")
        as_lm = deployment.headers_as("lm", "0")
        r = httpx.post(f"{survivor.url}/v1/tasks", json={"lm": 5, "launches": [placement]}, headers=as_lm, timeout=5.0)
        assert r.status_code == 422, r.text
        agent_log = logs / "worker-0-1.log"
        agent_refusal = _find(agent_log, lambda r: r.get("task") == ["x.0"])
        wait_until(agent_refusal, 10, agent_log.read_text)
        assert agent_refusal()[0].items() >= {"level": "WARNING", "worker": "worker-0-1", "node": [1]}.items()

        # A cancelled job: the GM names its tasks, the LM and the agent the run they stop.
        running = next(t["task_id"] for t in _status(gm, "long")["tasks"] if t["task_id"] != lost_task)  # type: ignore[union-attr]
        assert api.delete(f"{gm}/v1/jobs/long", timeout=10.0).status_code == 202
        cancelled = _find(gm_log, lambda r: r.get("job") == "long" and "cancelled" in str(r["message"]))
        wait_until(cancelled, 10, gm_log.read_text)
        assert sorted(cancelled()[0]["task"]) == sorted([lost_task, running])  # type: ignore[type-var]
        assert cancelled()[0]["user"] == "alice"
        stopped_at_lm = _find(lm_log, lambda r: r.get("task") == [running] and "cancelled" in str(r["message"]))
        wait_until(stopped_at_lm, 30, lm_log.read_text)
        assert stopped_at_lm()[0].items() >= {"gm": 0, "lm": 0}.items()
        stopped_at_agent = _find(agent_log, lambda r: r.get("task") == [running] and r["level"] == "INFO")
        wait_until(stopped_at_agent, 30, agent_log.read_text)
        assert stopped_at_agent()[0].items() >= {"job": ["long"], "worker": "worker-0-1", "lm": 0}.items()
