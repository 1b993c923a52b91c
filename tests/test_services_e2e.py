"""End to end through separate OS processes and the real RabbitMQ: GMs, LMs and worker agents that burn real CPU."""

from __future__ import annotations

from megha.common.settings import LoadgenSettings
from megha.deploy.local import LocalDeployment, run_local

from servicekit import api, needs_rabbitmq

CPU_TOLERANCE = 0.95  # burn stops at its target; process CPU accounting is coarse (clock ticks)


pytestmark = needs_rabbitmq


def test_first_20_google_jobs_through_separate_processes_with_real_cpu_burn(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The shipped demo trace is the head of ../shared/traces/GOOG_subtrace.tr: its first 20 jobs are the trace's.
    # Time is scaled 5000x down (tasks of hours last seconds) and memory 1000x (a few MB per task).
    settings = LoadgenSettings(
        trace="demo", first_jobs=20, time_scale=0.0002, mode="scaled", mem_scale=1000, timeout=240.0
    )
    deployment = LocalDeployment(gms=2, lms=2, workers_per_lm=2, log_dir=tmp_path / "logs")
    run, lm_states = run_local(deployment, settings)
    m = run.metrics
    assert m is not None and m.tasks == 434 and m.jobs_rejected == 0
    assert run.timed_out == [] and m.not_exactly_once == ()
    # Every task finished exactly once, and burnt at least its request x duration in CPU-seconds.
    for task_id, rec in run.tasks.items():
        finished = [e for e in run.events[task_id] if e.kind == "finished"]
        assert len(finished) == 1, (task_id, run.events[task_id])
        asked = rec.request[0] / 1000 * rec.duration
        assert finished[0].cpu_seconds >= CPU_TOLERANCE * asked, (task_id, finished[0].cpu_seconds, asked)
    # Allocation times were recorded for every task (arrival at the GM, start on the worker).
    assert m.allocation_time.count == 434 and m.allocation_time.max > 0
    # Every LM's accounting is back to full capacity, with nothing running and no logical node left.
    for state in lm_states:
        assert state["idle"] and state["running"] == 0 and state["logical_nodes"] == 0
        assert state["free"] == state["capacity"]
    assert sum(state["launched"] for state in lm_states) == 434
    # The deployment left no process behind.
    assert deployment.processes == []


def test_a_killed_worker_agent_s_tasks_run_again_elsewhere_and_its_node_returns_when_it_does(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # SIGKILL one agent (and its task processes) while it runs tasks: its LM notices the silence, takes its node
    # out of service and reports its tasks lost; their GM runs them again elsewhere (attempt 2), so every task
    # completes exactly once and none fails. The agent is restarted and its node comes back into service.
    import asyncio
    import threading

    from megha.loadgen.progress import Progress
    from megha.loadgen.services import replay_services

    from servicekit import wait_until

    deployment = LocalDeployment(
        gms=1, lms=2, workers_per_lm=2, log_dir=tmp_path / "logs", heartbeat_interval=0.3, worker_timeout=2.0
    )
    settings = LoadgenSettings(trace="demo", first_jobs=12, time_scale=0.0002, mode="scaled", mem_scale=1000)
    victim = "worker-0-0"
    killed: list[str] = []

    def lm0() -> dict[str, object]:
        return api.get(f"{deployment.lm_urls[0]}/v1/state", timeout=5.0).json()

    def kill_when_busy_then_restart() -> None:
        wait_until(lambda: lm0()["heartbeats"].get(victim, {}).get("running", 0) > 0, 60, lm0)
        deployment.kill(victim)
        killed.append(victim)
        wait_until(lambda: bool(lm0()["down_nodes"]), 30, lm0)  # its LM found it silent
        deployment.restart(victim)

    with deployment:
        api.use(deployment)
        settings = deployment.loadgen(settings)
        fault = threading.Thread(target=kill_when_busy_then_restart)
        fault.start()
        run = asyncio.run(replay_services(settings, Progress()))
        fault.join()
        wait_until(lambda: all(s["idle"] for s in deployment.lm_states()), 30, deployment.lm_states)
        states = deployment.lm_states()
    m = run.metrics
    assert killed, "the victim never ran a task"
    assert m is not None and run.timed_out == [] and m.not_exactly_once == ()
    assert m.tasks_completed == m.tasks and not [r for r in run.tasks.values() if r.failed_reason]
    retried = [tid for tid, rec in run.tasks.items() if rec.retries]
    assert retried, "no task was lost with the agent"
    for tid in retried:
        kinds = [(e.kind, e.attempt) for e in run.events[tid]]
        assert ("lost", 1) in kinds and kinds.count(("finished", 2)) == 1, kinds
        assert [k for k in kinds if k[0] == "finished"] == [("finished", 2)], kinds
    # Back to full capacity: the restarted agent's node is in service, nothing runs, nothing is down.
    for state in states:
        assert state["idle"] and state["down_nodes"] == {} and state["free"] == state["capacity"]
