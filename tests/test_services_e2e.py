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
