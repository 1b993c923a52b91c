"""Cancelling and listing jobs through a real GM, LM and worker agent (separate processes, the real RabbitMQ):
`DELETE /v1/jobs/{id}` drops a job's queued tasks, stops its running ones on their agent, frees their resources
at the LM and in the GM's view, and the job ends cancelled, never finished, also across a GM crash;
`GET /v1/jobs` lists jobs by user and state, a page at a time."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from megha.common.core.task import JobSpec
from megha.deploy.local import LocalDeployment
from megha.services.gm.jobs import JobTable

from corekit import task
from servicekit import api, needs_rabbitmq, wait_until

NODE = {"cpu_millicores": 2000, "memory_mb": 4096}  # the whole node of LocalDeployment's agents


def _job(job_id: str, tasks: int, duration: float, user: str = "alice") -> dict[str, object]:
    return {"job_id": job_id, "user": user, "tasks": [{"duration": duration, **NODE} for _ in range(tasks)]}


def _status(gm: str, job_id: str) -> dict[str, object]:
    r = api.get(f"{gm}/v1/jobs/{job_id}", timeout=5.0)
    assert r.status_code == 200, r.text
    return r.json()


def _states(gm: str, job_id: str) -> list[str]:
    return [t["state"] for t in _status(gm, job_id)["tasks"]]  # type: ignore[index]


@needs_rabbitmq
def test_cancel_stops_running_tasks_drops_queued_ones_and_frees_the_node(tmp_path: Path) -> None:
    deployment = LocalDeployment(gms=1, lms=1, workers_per_lm=1, execution="simulated", log_dir=tmp_path / "logs")
    with deployment:
        api.use(deployment)
        gm, lm = deployment.gm_urls[0], deployment.lm_urls[0]
        assert api.post(f"{gm}/v1/jobs", json=_job("long", 3, 600.0), timeout=10.0).status_code == 201
        wait_until(lambda: _states(gm, "long").count("launched") == 1, 30, lambda: _states(gm, "long"))
        wait_until(lambda: api.get(f"{lm}/v1/state").json()["running"] == 1, 30)

        listed = api.get(f"{gm}/v1/jobs", params={"state": "running"}, timeout=5.0).json()
        assert [j["job_id"] for j in listed["jobs"]] == ["long"]
        assert listed["jobs"][0]["task_states"] == {"launched": 1, "queued": 2}

        r = api.delete(f"{gm}/v1/jobs/long", timeout=10.0)
        assert r.status_code == 202, r.text
        assert r.json()["state"] == "cancelled"
        wait_until(lambda: _states(gm, "long") == ["cancelled"] * 3, 30, lambda: _status(gm, "long"))
        lm_state = api.get(f"{lm}/v1/state", timeout=5.0).json()
        assert lm_state["running"] == 0 and lm_state["free"] == lm_state["capacity"], lm_state
        assert lm_state["stopped"] == 1  # the running one, stopped on its agent; the queued ones never left the GM
        assert api.get(f"{gm}/v1/state", timeout=5.0).json()["cancelled"] == 3

        # The node is usable at once: a new job's task runs to the end on it.
        assert api.post(f"{gm}/v1/jobs", json=_job("short", 1, 0.2), timeout=10.0).status_code == 201
        wait_until(lambda: _states(gm, "short") == ["finished"], 30, lambda: _status(gm, "short"))
        assert _states(gm, "long") == ["cancelled"] * 3  # never ran again

        assert api.delete(f"{gm}/v1/jobs/long", timeout=5.0).status_code == 202  # a repeat answers the status
        refused = api.delete(f"{gm}/v1/jobs/short", timeout=5.0)
        assert refused.status_code == 409 and refused.json()["detail"][0]["field"] == "job_id"
        missing = api.delete(f"{gm}/v1/jobs/nope", timeout=5.0)
        assert missing.status_code == 404 and missing.json()["detail"][0]["field"] == "job_id"


def _refused(rule: list[str]) -> int:
    """How many packets the iptables `rule` (chain first) has refused."""
    listing = subprocess.run(["iptables", "-L", rule[0], "-v", "-x", "-n"], capture_output=True, text=True, timeout=10)
    dport = f"dpt:{rule[rule.index('--dport') + 1]}"
    return sum(int(line.split()[0]) for line in listing.stdout.splitlines() if "REJECT" in line and dport in line)


@needs_rabbitmq
def test_a_cancel_outlives_a_gm_crash(tmp_path: Path) -> None:
    """The cancel is in the GM's journal before it is answered: a GM killed right after it comes back with the
    job cancelled, its queued tasks not queued again and its running one stopped."""
    deployment = LocalDeployment(gms=1, lms=1, workers_per_lm=1, execution="simulated", log_dir=tmp_path / "logs")
    with deployment:
        api.use(deployment)
        gm, lm = deployment.gm_urls[0], deployment.lm_urls[0]
        assert api.post(f"{gm}/v1/jobs", json=_job("long", 3, 600.0), timeout=10.0).status_code == 201
        wait_until(lambda: api.get(f"{lm}/v1/state").json()["running"] == 1, 30)
        # The LM's port refuses connections (iptables: reset), so the stop of the running task cannot reach it
        # before the GM is killed (nor later: no orphaned socket of the dead GM holds it to retransmit): only the
        # journal's cancel record says that task is to be stopped.
        rule = ["INPUT", "-p", "tcp", "--dport", lm.rsplit(":", 1)[1], "-j", "REJECT", "--reject-with", "tcp-reset"]
        subprocess.run(["iptables", "-I", *rule], check=True, timeout=10)
        try:
            assert api.delete(f"{gm}/v1/jobs/long", timeout=10.0).status_code == 202
            wait_until(lambda: _refused(rule) > 0, 10)  # the stop call is out, and refused
            deployment.kill("gm-0")
        finally:
            subprocess.run(["iptables", "-D", *rule], check=False, timeout=10)
        assert api.get(f"{lm}/v1/state", timeout=5.0).json()["running"] == 1  # the stop never arrived
        deployment.restart("gm-0")
        deployment.wait_healthy()
        wait_until(lambda: _states(gm, "long") == ["cancelled"] * 3, 30, lambda: _status(gm, "long"))
        assert _status(gm, "long")["state"] == "cancelled"
        wait_until(lambda: api.get(f"{lm}/v1/state").json()["running"] == 0, 30)
        lm_state = api.get(f"{lm}/v1/state", timeout=5.0).json()
        assert lm_state["free"] == lm_state["capacity"], lm_state


@needs_rabbitmq
def test_list_jobs_filters_by_user_queue_and_state_and_pages(tmp_path: Path) -> None:
    deployment = LocalDeployment(gms=1, lms=1, workers_per_lm=1, execution="simulated", log_dir=tmp_path / "logs")
    with deployment:
        api.use(deployment)
        gm = deployment.gm_urls[0]
        for k in range(5):
            body = _job(f"j{k}", 1, 0.05, user="alice" if k % 2 == 0 else "bob")
            assert api.post(f"{gm}/v1/jobs", json=body, timeout=10.0).status_code == 201
        for k in range(5):
            wait_until(lambda k=k: _states(gm, f"j{k}") == ["finished"], 30)

        def ids(**params: object) -> list[str]:
            return [j["job_id"] for j in api.get(f"{gm}/v1/jobs", params=params, timeout=5.0).json()["jobs"]]

        assert ids() == ["j0", "j1", "j2", "j3", "j4"]
        assert ids(user="alice") == ids(queue="alice") == ["j0", "j2", "j4"]
        assert ids(state="finished", user="bob") == ["j1", "j3"] and ids(state="queued") == []
        first = api.get(f"{gm}/v1/jobs", params={"limit": 2}, timeout=5.0).json()
        assert [j["job_id"] for j in first["jobs"]] == ["j0", "j1"] and first["total"] == 5
        last = api.get(f"{gm}/v1/jobs", params={"limit": 2, "offset": 4}, timeout=5.0).json()
        assert [j["job_id"] for j in last["jobs"]] == ["j4"] and last["next_offset"] is None
        assert first["next_offset"] == 2
        bad = api.get(f"{gm}/v1/jobs", params={"state": "sleeping"}, timeout=5.0)
        assert bad.status_code == 422 and "state" in bad.text


def test_job_states_follow_their_tasks() -> None:
    table = JobTable(0)
    job = JobSpec("j", (task("j.0"), task("j.1")), 0.0)
    table.job_arrived(job, 0, 0.0)
    assert table.status("j").state == "queued"  # type: ignore[union-attr]
    table.tasks["j.0"].state = "launched"
    assert table.status("j").state == "running"  # type: ignore[union-attr]
    table.task_completed(job.tasks[0], "", 1.0)
    table.task_failed(job.tasks[1], "no", 1.0)
    assert table.status("j").state == "failed"  # type: ignore[union-attr]
    table.job_arrived(JobSpec("k", (task("k.0"),), 0.0), 0, 0.0)
    table.jobs["k"].cancelled = True
    table.task_cancelled(task("k.0"), 2.0)
    table.task_completed(task("k.0"), "", 3.0)  # a late end does not turn it finished
    summary = table.summaries(state="cancelled")
    assert [s.job_id for s in summary] == ["k"] and summary[0].task_states == {"cancelled": 1}
    assert table.unfinished() == 0
    with pytest.raises(KeyError):
        table.tasks["nope"]
