"""Fair scheduling through the services: a user below its share preempts, across separate GM, LM and worker-agent
processes with the real RabbitMQ, a task of the user over its share; the agent stops the task's process, which is
reported preempted and runs again later, to completion, exactly once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from servicekit import api, needs_rabbitmq, small_deployment, wait_until

pytestmark = needs_rabbitmq


def state(url: str) -> dict[str, Any]:
    return api.get(f"{url}/v1/state", timeout=5).json()  # type: ignore[no-any-return]


def usage_of(user: str, gm_url: str) -> list[int]:
    """What GM `gm_url` knows `user` holds, resource by resource."""
    (usage,) = [q["usage"] for q in api.get(f"{gm_url}/v1/queues", timeout=5).json()["queues"] if q["user"] == user]
    return usage  # type: ignore[no-any-return]


def job_tasks(gm_url: str, job_id: str) -> list[dict[str, object]]:
    return api.get(f"{gm_url}/v1/jobs/{job_id}", timeout=5).json()["tasks"]


def test_a_user_below_its_share_preempts_across_processes_and_nothing_is_lost(tmp_path: Path) -> None:
    # One LM with two agents of one 1-core node; user A's queue on GM 0, B's on GM 1, half the data centre each.
    node = {"node_cpu_millicores": 1000, "node_memory_mb": 256, "execution": "real"}
    deployment = small_deployment(
        tmp_path / "logs", gms=2, workers_per_lm=2, queues="A:0.5:0,B:0.5:1", share_policy="drf", **node
    )
    with deployment:
        api.use(deployment)
        gm_a, gm_b = deployment.gm_urls
        lm = deployment.lm_urls[0]
        task = {"cpu_millicores": 1000, "memory_mb": 16}
        r = api.post(f"{gm_a}/v1/jobs", json={"user": "A", "job_id": "a", "tasks": [{**task, "duration": 5}] * 2})
        assert r.status_code == 201, r.text
        wait_until(lambda: state(lm)["running"] == 2, 10, lambda: state(lm))
        # A delta tells GM 1 that A holds the whole data centre.
        wait_until(lambda: usage_of("A", gm_b) == [2000, 32], 10, lambda: api.get(f"{gm_b}/v1/queues").json())
        # B is refused by the GM that does not serve its queue, with the reason.
        r = api.post(f"{gm_a}/v1/jobs", json={"user": "B", "tasks": [{**task, "duration": 1}]})
        assert r.status_code == 422 and "served by GM 1" in r.text
        submitted = time.time()
        r = api.post(f"{gm_b}/v1/jobs", json={"user": "B", "job_id": "b", "tasks": [{**task, "duration": 1}]})
        assert r.status_code == 201, r.text
        (b,) = wait_until(
            lambda: [t for t in job_tasks(gm_b, "b") if t["state"] == "finished"], 20, lambda: job_tasks(gm_b, "b")
        )
        assert b["finished_at"] - submitted < 6.0, "B waited for A's tasks instead of preempting"

        def a_finished() -> list[dict[str, object]] | None:
            tasks = job_tasks(gm_a, "a")
            return tasks if all(t["state"] == "finished" for t in tasks) else None

        a_tasks = wait_until(a_finished, 60, lambda: job_tasks(gm_a, "a"))
        assert sorted(t["preemptions"] for t in a_tasks) == [0, 1]
        # The stopped task ran again from the start, after B's task: its 5 s of work began again.
        (again,) = [t for t in a_tasks if t["preemptions"] == 1]
        assert again["finished_at"] >= b["finished_at"] + 4.0
        queues = api.get(f"{gm_b}/v1/queues").json()
        assert queues["fair_scheduling"] and queues["policy"] == "drf"
        assert {q["user"]: q["share"] for q in queues["queues"]} == {"A": 0.5, "B": 0.5}
        gm_b_state = api.get(f"{gm_b}/v1/state").json()
        assert gm_b_state["preemption_attempts"] >= 1 and gm_b_state["preemptions"] == 1
        lm_state = wait_until(lambda: (s := state(lm))["idle"] and s, 10, lambda: state(lm))
        assert lm_state["preemptions"] == 1 and lm_state["free"] == lm_state["capacity"] and lm_state["launched"] == 4
    assert deployment.processes == []  # the deployment left no process behind
