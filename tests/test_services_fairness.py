"""Fair scheduling through the services: a user below its share preempts, across separate GM, LM and worker-agent
processes with the real RabbitMQ, a task of the user over its share; the agent stops the task's process, which is
reported preempted and runs again later, to completion, exactly once."""

from __future__ import annotations

import time
from pathlib import Path

from megha.deploy.local import LocalDeployment

from servicekit import api, needs_rabbitmq

pytestmark = needs_rabbitmq


def wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def job_tasks(gm_url: str, job_id: str) -> list[dict[str, object]]:
    return api.get(f"{gm_url}/v1/jobs/{job_id}", timeout=5).json()["tasks"]


def test_a_user_below_its_share_preempts_across_processes_and_nothing_is_lost(tmp_path: Path) -> None:
    # One LM with two agents of one 1-core node; user A's queue on GM 0, B's on GM 1, half the data centre each.
    deployment = LocalDeployment(
        gms=2,
        lms=1,
        workers_per_lm=2,
        nodes_per_worker=1,
        execution="real",
        node_cpu_millicores=1000,
        node_memory_mb=256,
        queues="A:0.5:0,B:0.5:1",
        share_policy="drf",
        log_dir=tmp_path / "logs",
    )
    with deployment:
        api.use(deployment)
        gm_a, gm_b = deployment.gm_urls
        lm = deployment.lm_urls[0]
        task = {"cpu_millicores": 1000, "memory_mb": 16}
        r = api.post(f"{gm_a}/v1/jobs", json={"user": "A", "job_id": "a", "tasks": [{**task, "duration": 5}] * 2})
        assert r.status_code == 201, r.text
        wait_for(lambda: api.get(f"{lm}/v1/state").json()["running"] == 2, 10, "A's two tasks to run")
        time.sleep(1.5)  # a delta tells GM 1 that A holds the whole data centre
        # B is refused by the GM that does not serve its queue, with the reason.
        r = api.post(f"{gm_a}/v1/jobs", json={"user": "B", "tasks": [{**task, "duration": 1}]})
        assert r.status_code == 422 and "served by GM 1" in r.text
        submitted = time.time()
        r = api.post(f"{gm_b}/v1/jobs", json={"user": "B", "job_id": "b", "tasks": [{**task, "duration": 1}]})
        assert r.status_code == 201, r.text
        (b,) = wait_for(lambda: [t for t in job_tasks(gm_b, "b") if t["state"] == "finished"], 20, "B's task to finish")
        assert b["finished_at"] - submitted < 6.0, "B waited for A's tasks instead of preempting"

        def a_finished() -> list[dict[str, object]] | None:
            tasks = job_tasks(gm_a, "a")
            return tasks if all(t["state"] == "finished" for t in tasks) else None

        a_tasks = wait_for(a_finished, 30, "A's tasks to finish")
        assert sorted(t["preemptions"] for t in a_tasks) == [0, 1]
        # The stopped task ran again from the start, after B's task: its 5 s of work began again.
        (again,) = [t for t in a_tasks if t["preemptions"] == 1]
        assert again["finished_at"] >= b["finished_at"] + 4.0
        queues = api.get(f"{gm_b}/v1/queues").json()
        assert queues["fair_scheduling"] and queues["policy"] == "drf"
        assert {q["user"]: q["share"] for q in queues["queues"]} == {"A": 0.5, "B": 0.5}
        gm_b_state = api.get(f"{gm_b}/v1/state").json()
        assert gm_b_state["preemption_attempts"] >= 1 and gm_b_state["preemptions"] == 1
        state = wait_for(
            lambda: (s := api.get(f"{lm}/v1/state").json())["idle"] and s, 10, "the LM to be back at full capacity"
        )
        assert state["preemptions"] == 1 and state["free"] == state["capacity"] and state["launched"] == 4
    assert deployment.processes == []  # the deployment left no process behind
