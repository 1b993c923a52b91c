"""End to end through separate OS processes and the real RabbitMQ: GMs, LMs and worker agents that burn real CPU."""

from __future__ import annotations

from megha.common.settings import LoadgenSettings
from megha.deploy.local import LocalDeployment, run_local

from servicekit import needs_rabbitmq

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


def test_a_killed_worker_agent_loses_only_its_tasks_and_they_are_reported_failed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # SIGKILL one agent (and its task processes) while it runs tasks: its LM notices the silence, takes its node
    # out of service and reports its tasks failed with the reason; every other task completes exactly once.
    import asyncio
    import os
    import signal
    import sys
    import threading
    import time

    import httpx

    from megha.loadgen.services import replay_services

    deployment = LocalDeployment(
        gms=1, lms=2, workers_per_lm=2, log_dir=tmp_path / "logs", heartbeat_interval=0.3, worker_timeout=2.0
    )
    settings = LoadgenSettings(trace="demo", first_jobs=12, time_scale=0.0002, mode="scaled", mem_scale=1000)
    victim = "worker-0-0"
    killed: list[str] = []  # the victim's URL, once killed

    def kill_when_busy() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            beats = httpx.get(f"{deployment.lm_urls[0]}/v1/state", timeout=5.0).json()["heartbeats"]
            if beats.get(victim, {}).get("running", 0) > 0:
                process = next(p for p in deployment.processes if p.name == victim)
                os.killpg(process.popen.pid, signal.SIGKILL)
                killed.append(process.url)
                return
            time.sleep(0.05)

    with deployment:
        settings = settings.model_copy(
            update={"gm_urls": deployment.gm_urls, "run_id": deployment.run_id, "amqp_url": deployment.amqp_url}
        )
        killer = threading.Thread(target=kill_when_busy)
        killer.start()
        run = asyncio.run(replay_services(settings, lambda line: print(line, file=sys.stderr, flush=True)))
        killer.join()
        time.sleep(0.2)
        states = deployment.lm_states()
    m = run.metrics
    assert killed, "the victim never ran a task"
    assert m is not None and run.timed_out == [] and m.not_exactly_once == ()
    failed = {tid: rec.failed_reason for tid, rec in run.tasks.items() if rec.failed_reason}
    # Each says why: the agent went silent, or (a launch in flight when it died) it could not be reached.
    assert failed and any(f"worker agent {victim}" in why and "silent for" in why for why in failed.values())
    assert all("silent for" in why or "unreachable" in why for why in failed.values()), set(failed.values())
    assert all(killed[0] in why for why in failed.values()), set(failed.values())
    assert m.tasks_completed == m.tasks - len(failed) > 0
    lost, other = states
    assert list(lost["lost_workers"]) == [victim] and len(lost["down_nodes"]) == 1
    assert lost["running"] == 0 and other["idle"]
    # Exactly the tasks placed on the victim's node failed (the ones it ran and any launch in flight to it).
    (down_node,) = map(int, lost["down_nodes"])
    assert {(run.tasks[tid].lm, run.tasks[tid].node) for tid in failed} == {(0, down_node)}
    # Those running or sent to it when it was found silent; a launch that failed to reach it before that was
    # reported failed then, as unreachable.
    assert 0 < lost["lost_workers"][victim] <= len(failed)
