"""How the load generator reads the task events of a services run: a preempted task runs again, and a failed
task keeps the first reason it was given."""

from __future__ import annotations

import pytest

from megha.common.models import TaskEvent
from megha.loadgen.records import JobRecord, TaskRecord
from megha.loadgen.services import ServicesRun, apply_event


def _run() -> tuple[ServicesRun, TaskRecord, TaskRecord]:
    a = TaskRecord("j.0", "j", 0, "ann", 10.0, (2000, 64))
    b = TaskRecord("j.1", "j", 0, "ann", 10.0, (2000, 64))
    return ServicesRun({"j.0": a, "j.1": b}, {"j": JobRecord("j", 0, 0.0, 2, 10.0)}), a, b


def _event(kind: str, task_id: str = "j.0", error: str = "") -> TaskEvent:
    return TaskEvent(kind=kind, task_id=task_id, job_id="j", lm=0, node=0, at=0.0, error=error)  # type: ignore[arg-type]


def test_a_preempted_task_is_not_ended_and_completes_once_when_it_runs_again() -> None:
    run, a, _ = _run()
    assert apply_event(run, a, _event("started"), 1.0) is False
    assert apply_event(run, a, _event("preempted"), 4.0) is False
    assert (a.preemptions, a.lost_cpu_seconds, a.failed_reason) == (1, pytest.approx(6.0), "")  # 2 CPUs x 3 s
    assert apply_event(run, a, _event("started"), 5.0) is False
    assert apply_event(run, a, _event("finished"), 15.0) is True
    assert (a.completions, a.started_at, a.finished_at, a.failed_reason) == (1, 5.0, 15.0, "")
    assert run.jobs["j"].finished_tasks == 1 and run.jobs["j"].finished_at != run.jobs["j"].finished_at  # NaN


def test_a_failed_task_keeps_the_first_reason_and_its_job_never_finishes() -> None:
    run, a, b = _run()
    assert apply_event(run, a, _event("failed", error="worker agent w0 silent for 31 s"), 2.0) is True
    assert apply_event(run, a, _event("failed", error="worker agent http://w0 unreachable"), 3.0) is True
    assert a.failed_reason == "failed: worker agent w0 silent for 31 s" and a.completions == 0
    assert apply_event(run, b, _event("finished", "j.1"), 10.0) is True
    assert run.jobs["j"].finished_tasks == 1
