"""How the load generator reads the task events of a services run (`EventRecorder`): a preempted task runs again,
a failed task keeps the first reason it was given, an event delivered again is kept once, and a task ends once."""

from __future__ import annotations

import pytest

from megha.common.core.lifecycle import State
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.models import TaskEvent
from megha.loadgen.events import EventRecorder
from megha.loadgen.records import TaskColumns


def _recorder() -> EventRecorder:
    recorder = EventRecorder()
    tasks = tuple(TaskSpec(f"j.{i}", "j", "ann", 10.0, (2000, 64), 0) for i in range(2))
    recorder.expect(0, JobSpec("j", tasks, 0.0))
    return recorder


def _event(
    kind: str, task_id: str = "j.0", error: str = "", at: float = 0.0, attempt: int = 1, run_number: int = 1
) -> TaskEvent:
    return TaskEvent(
        kind=kind,  # type: ignore[arg-type]
        task_id=task_id,
        job_id="j",
        lm=0,
        node=0,
        at=at,
        error=error,
        attempt=attempt,
        run_number=run_number,
    )


def test_a_preempted_task_is_not_ended_and_completes_once_when_it_runs_again() -> None:
    recorder = _recorder()
    assert recorder.record(_event("started", at=1.0), 1.0) is False
    assert recorder.record(_event("preempted", at=4.0), 4.0) is False
    a = recorder.tasks["j.0"]
    assert (a.preemptions, a.lost_cpu_seconds, a.failed_reason) == (1, pytest.approx(6.0), "")  # 2 CPUs x 3 s
    assert recorder.record(_event("started", at=5.0), 5.0) is False
    assert recorder.record(_event("finished", at=15.0), 15.0) is True
    a = recorder.tasks["j.0"]
    assert (a.completions, a.started_at, a.finished_at, a.failed_reason) == (1, 5.0, 15.0, "")
    job = recorder.jobs["j"]
    assert job.finished_tasks == 1 and job.finished_at != job.finished_at  # NaN: j.1 is still to finish


def test_a_run_lost_before_its_start_came_is_no_illegal_event() -> None:
    """A worker agent killed with the start in its outbox: its LM reports the run lost while the recorder, which
    sees no decisions, still has the task QUEUED (35 such in a `megha local` run with an agent killed). It runs
    again and completes once."""
    recorder = _recorder()
    assert recorder.record(_event("lost", at=3.0), 3.0) is False
    assert recorder.illegal == 0 and recorder.states[recorder.tasks.number["j.0"]] == State.QUEUED
    assert recorder.record(_event("started", at=5.0, attempt=2), 5.0) is False
    assert recorder.record(_event("finished", at=15.0, attempt=2), 15.0) is True
    assert recorder.illegal == 0 and recorder.tasks["j.0"].completions == 1
    assert recorder.record(_event("finished", "j.1", at=1.0), 1.0) is True
    assert recorder.record(_event("lost", "j.1", at=2.0), 2.0) is False  # news of a run after the end: no-op
    assert recorder.illegal == 0


def test_a_later_run_that_starts_ends_the_run_seen_running_as_lost_not_as_an_illegal_event() -> None:
    """A run whose worker, LM and GM were killed together ends unseen (no service is left to report it lost); its
    restarted GM runs the task again under a new run number (`megha chaos --faults all-kill`: `STARTED is not
    allowed in state RUNNING`). That start ends the run seen running, as lost; the start of an earlier run after a
    later one's is news of a run that is over; the same run started twice is still counted illegal."""
    recorder = _recorder()
    assert recorder.record(_event("started", at=1.0), 1.0) is False
    assert recorder.record(_event("started", at=8.0, run_number=1001), 8.0) is False
    row = recorder.tasks.number["j.0"]
    assert recorder.illegal == 0 and recorder.states[row] == State.RUNNING and recorder.tasks["j.0"].retries == 1
    assert recorder.record(_event("started", at=9.0, attempt=2, run_number=1), 9.0) is False  # a later attempt
    assert recorder.illegal == 0 and recorder.tasks["j.0"].retries == 2
    assert recorder.record(_event("started", at=2.0, run_number=1001), 2.0) is False  # an earlier run's, late
    assert recorder.illegal == 0 and recorder.tasks["j.0"].started_at == 9.0
    assert recorder.record(_event("finished", at=19.0, attempt=2), 19.0) is True
    assert recorder.tasks["j.0"].completions == 1
    assert recorder.record(_event("started", "j.1", at=1.0), 1.0) is False
    assert recorder.record(_event("started", "j.1", at=2.0), 2.0) is False  # the same run again: illegal
    assert recorder.illegal == 1


def test_a_failed_task_keeps_the_first_reason_and_its_job_never_finishes() -> None:
    recorder = _recorder()
    assert recorder.record(_event("failed", error="worker agent w0 silent for 31 s", at=2.0), 2.0) is True
    assert recorder.record(_event("failed", error="worker agent http://w0 unreachable", at=3.0), 3.0) is False
    a = recorder.tasks["j.0"]
    assert (a.failed_reason, a.finished_at, a.completions) == ("failed: worker agent w0 silent for 31 s", 2.0, 0)
    assert recorder.record(_event("finished", "j.1", at=10.0), 10.0) is True
    assert recorder.jobs["j"].finished_tasks == 1 and recorder.ended == 2


def test_an_event_delivered_again_is_kept_once() -> None:
    recorder = _recorder()
    for _ in range(2):
        recorder.record(_event("started", at=1.0), 1.0)
        recorder.record(_event("finished", at=2.0), 2.0)
    assert [e.kind for e in recorder.events["j.0"]] == ["started", "finished"]
    assert recorder.tasks["j.0"].completions == 1 and recorder.ended == 1


def test_a_second_completion_is_kept_as_evidence_but_changes_no_time_and_no_job() -> None:
    recorder = _recorder()
    recorder.accept(recorder_job(recorder))
    assert recorder.record(_event("finished", at=2.0), 2.0) is True
    assert recorder.record(_event("finished", at=9.0, attempt=2), 9.0) is False
    a = recorder.tasks["j.0"]
    assert (a.completions, a.finished_at) == (2, 2.0)  # reported as not completed exactly once
    assert recorder.jobs["j"].finished_tasks == 1 and recorder.open == 1


def test_a_start_reported_after_its_run_ended_is_recorded_and_the_task_stays_ended() -> None:
    recorder = _recorder()
    assert recorder.record(_event("finished", at=3.0), 3.0) is True
    assert recorder.record(_event("started", at=1.0), 1.0) is False
    assert recorder.tasks["j.0"].started_at == 1.0
    assert recorder.states[recorder.tasks.number["j.0"]] == State.COMPLETED and recorder.illegal == 0


def test_an_event_out_of_the_lifecycle_is_counted_and_recorded_as_reported() -> None:
    recorder = _recorder()
    assert recorder.record(_event("preempted", at=1.0), 1.0) is False  # before its run's start
    assert recorder.illegal == 1 and recorder.tasks["j.0"].preemptions == 1


def test_tasks_ended_before_their_job_was_accepted_are_not_awaited_and_the_rest_are_given_up() -> None:
    recorder = _recorder()
    recorder.record(_event("finished", at=1.0), 1.0)
    recorder.accept(recorder_job(recorder))
    assert recorder.open == 1
    assert recorder.give_up("no completion") == ["j.1"]
    assert recorder.tasks["j.1"].failed_reason == "no completion"


def test_a_rejected_job_fails_each_of_its_tasks_at_submission() -> None:
    recorder = _recorder()
    recorder.reject(recorder_job(recorder), "422: unknown user")
    assert recorder.jobs["j"].rejected_reason == "422: unknown user"
    assert {r.failed_reason for r in recorder.tasks.values()} == {"rejected at submission: 422: unknown user"}


def test_the_events_read_back_as_they_were_received() -> None:
    recorder = _recorder()
    sent = [_event("started", at=1.5), _event("lost", error="agent w0 lost", at=2.5), _event("started", at=3.0)]
    sent.append(TaskEvent(kind="finished", task_id="j.0", job_id="j", lm=1, node=7, at=4.0, cpu_seconds=0.5, attempt=2))
    for event in sent:
        recorder.record(event, event.at)
    assert recorder.events["j.0"] == sent and dict(recorder.events) == {"j.0": sent}
    assert "j.1" not in recorder.events and recorder.events.get("j.1", []) == []


def recorder_job(recorder: EventRecorder) -> JobSpec:
    tasks = tuple(TaskSpec(t, "j", "ann", 10.0, (2000, 64), 0) for t in recorder.tasks)
    return JobSpec("j", tasks, 0.0)


def test_a_task_s_row_reads_and_writes_its_columns_like_a_record() -> None:
    recorder = _recorder()
    row = recorder.tasks["j.1"]
    row.started_at, row.finished_at, row.repartitioned = 2.0, 3.0, True
    again = recorder.tasks["j.1"]
    assert (again.started_at, again.finished_at, again.repartitioned) == (2.0, 3.0, True)
    assert recorder.tasks.array("started_at", float).tolist()[1] == 2.0 and recorder.tasks.column("repartitioned")[1]
    assert TaskColumns.of(list(recorder.tasks.values())).column("started_at")[1] == 2.0
