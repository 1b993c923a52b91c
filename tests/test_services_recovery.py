"""Recovery through separate OS processes and a real RabbitMQ: an LM killed (SIGKILL) mid-replay and restarted
rebuilds its cluster from its agents, and a broker killed mid-replay and restarted loses nothing."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable

import httpx

from megha.common.settings import LoadgenSettings
from megha.deploy.broker_node import BrokerNode
from megha.deploy.local import LocalDeployment
from megha.loadgen.services import ServicesRun, replay_services

from servicekit import needs_rabbitmq, wait_until

pytestmark = needs_rabbitmq

TRACE = LoadgenSettings(trace="demo", first_jobs=20, time_scale=0.0002, mode="scaled", mem_scale=1000, timeout=240)


# Slot mode on 8 simulated nodes: 78 tasks of about 0.65 s arrive within 0.43 s, so GMs hold a queue for seconds.
BACKLOG = LoadgenSettings(trace="demo", first_jobs=10, time_scale=0.00001, mode="slot", timeout=240)


def _replay_with_fault(
    deployment: LocalDeployment, fault: Callable[[], None], trace: LoadgenSettings = TRACE
) -> ServicesRun:
    settings = trace.model_copy(
        update={"gm_urls": deployment.gm_urls, "run_id": deployment.run_id, "amqp_url": deployment.amqp_url}
    )
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            fault()
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    thread = threading.Thread(target=guarded)
    thread.start()
    run = asyncio.run(replay_services(settings, lambda line: print(line, file=sys.stderr, flush=True)))
    thread.join()
    assert not errors, errors
    return run


def _assert_nothing_lost(run: ServicesRun, tasks: int = 434) -> None:
    m = run.metrics
    assert m is not None and run.timed_out == [] and m.not_exactly_once == ()
    failed = {tid: r.failed_reason for tid, r in run.tasks.items() if r.failed_reason}
    assert not failed and m.tasks_completed == m.tasks == tasks, failed
    for tid, events in run.events.items():
        assert [e.kind for e in events].count("finished") == 1, (tid, events)


def _state(url: str) -> dict[str, object]:
    """A GM's or an LM's GET /v1/state, or why it did not answer."""
    try:
        return httpx.get(f"{url}/v1/state", timeout=2.0).json()
    except httpx.HTTPError as exc:
        return {"unreachable": str(exc)}


def test_an_lm_killed_mid_replay_and_restarted_rebuilds_from_its_agents_and_loses_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    deployment = LocalDeployment(
        gms=2, lms=2, workers_per_lm=2, log_dir=tmp_path / "logs", heartbeat_interval=0.5, worker_timeout=5.0
    )
    seen: dict[str, object] = {}

    def kill_lm_then_restart() -> None:
        url = deployment.lm_urls[0]
        wait_until(lambda: _state(url).get("running", 0) > 0, 60, lambda: _state(url))  # type: ignore[operator]
        before = _state(url)
        seen["incarnation"], seen["running"] = before["incarnation"], before["running"]
        deployment.kill("lm-0")
        time.sleep(3)
        deployment.restart("lm-0")
        # Its agents register again with the tasks they run; the LM is ready with a new incarnation.
        wait_until(lambda: _state(url).get("ready") is True, 30, lambda: _state(url))
        seen["after"] = _state(url)

    with deployment:
        run = _replay_with_fault(deployment, kill_lm_then_restart)
        wait_until(lambda: all(s["idle"] for s in deployment.lm_states()), 30, deployment.lm_states)
        states = deployment.lm_states()
    _assert_nothing_lost(run)
    after = seen["after"]
    assert isinstance(after, dict) and after["incarnation"] > seen["incarnation"]  # type: ignore[operator]
    # The GMs used the restarted LM's capacity again: it launched tasks after its restart.
    assert states[0]["launched"] > 0
    for state in states:
        assert state["idle"] and state["free"] == state["capacity"] and state["down_nodes"] == {}


def test_a_gm_killed_with_tasks_queued_and_restarted_recovers_its_jobs_from_its_journal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    deployment = LocalDeployment(
        gms=2,
        lms=2,
        workers_per_lm=2,
        nodes_per_worker=2,
        execution="simulated",
        log_dir=tmp_path / "logs",
        heartbeat_interval=0.5,
    )
    seen: dict[str, object] = {}

    def kill_gm_with_a_queue_then_restart() -> None:
        url = deployment.gm_urls[0]

        def backlog() -> int:
            state = _state(url)
            return int(state.get("queued", 0)) + int(state.get("waiting", 0))  # type: ignore[call-overload]

        wait_until(lambda: backlog() > 0 and _state(url).get("running", 0) > 0, 60, lambda: _state(url))  # type: ignore[operator]
        seen["before"] = _state(url)
        deployment.kill("gm-0")
        time.sleep(3)
        deployment.restart("gm-0")
        wait_until(lambda: "gm" in _state(url), 60, lambda: _state(url))
        seen["after"] = _state(url)

    with deployment:
        run = _replay_with_fault(deployment, kill_gm_with_a_queue_then_restart, BACKLOG)
        wait_until(lambda: all(s["idle"] for s in deployment.lm_states()), 30, deployment.lm_states)
        states = deployment.lm_states()
        jobs_at_gm0 = [j for j in run.jobs.values() if j.gm == 0]
        statuses = [httpx.get(f"{deployment.gm_urls[0]}/v1/jobs/{j.job_id}", timeout=5.0) for j in jobs_at_gm0]
    _assert_nothing_lost(run, 78)
    before = seen["before"]
    assert isinstance(before, dict) and before["queued"] + before["waiting"] > 0  # tasks were queued at the kill
    # The restarted GM knows every job it had accepted, each task finished once.
    assert jobs_at_gm0 and all(r.status_code == 200 for r in statuses)
    assert all(t["state"] == "finished" for r in statuses for t in r.json()["tasks"])
    for state in states:
        assert state["idle"] and state["free"] == state["capacity"]


def test_a_broker_killed_mid_replay_and_restarted_loses_nothing() -> None:
    with BrokerNode() as node:
        deployment = LocalDeployment(gms=2, lms=2, workers_per_lm=2, amqp_url=node.url, heartbeat_interval=0.5)

        def kill_broker_then_restart() -> None:
            url = deployment.lm_urls[0]
            wait_until(lambda: _state(url).get("running", 0) > 0, 60, lambda: _state(url))  # type: ignore[operator]
            node.kill()
            time.sleep(5)
            node.start()

        with deployment:
            run = _replay_with_fault(deployment, kill_broker_then_restart)
            wait_until(lambda: all(s["idle"] for s in deployment.lm_states()), 30, deployment.lm_states)
            states = deployment.lm_states()
    _assert_nothing_lost(run)
    for state in states:
        assert state["idle"] and state["free"] == state["capacity"]
