"""The GM service's job table stays bounded: finished jobs beyond the limit are forgotten, oldest first."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from megha.common.core.messages import Completion, Placement
from megha.common.core.retry import RetryRule
from megha.common.core.task import JobSpec, TaskSpec
from megha.services.gm.jobs import JobTable


def _job(job_id: str, tasks: int) -> JobSpec:
    return JobSpec(job_id, tuple(TaskSpec(f"{job_id}.{i}", job_id, "u", 1.0, (1, 1), 0) for i in range(tasks)), 0.0)


def _t(task_id: str) -> TaskSpec:
    return TaskSpec(task_id, task_id.split(".")[0], "u", 1.0, (1, 1), 0)


def test_finished_jobs_beyond_the_limit_are_forgotten_oldest_first_and_open_ones_never() -> None:
    table = JobTable(0, finished_tasks_kept=3)
    a, b, c = _job("a", 2), _job("b", 2), _job("c", 1)
    for job in (a, b, c):
        table.job_arrived(job, 0, 0.0)
    assert table.unfinished() == 5
    table.task_completed(_t("b.0"), "", 1.0)
    table.task_completed(_t("b.1"), "", 1.0)  # b ends: 2 finished tasks held
    table.task_completed(_t("a.0"), "", 1.0)  # a still has a.1 open
    table.task_completed(_t("c.0"), "", 1.0)  # c ends: 3 held, at the limit
    assert (table.unfinished(), table.dropped_jobs) == (1, 0)
    assert table.status("a") is not None and table.status("b") is not None
    table.task_failed(a.tasks[1], "LM 0: unreachable", 2.0)  # a ends: 5 held > 3, so b (the oldest) goes
    assert (table.unfinished(), table.dropped_jobs) == (0, 1)
    assert table.status("b") is None and set(table.tasks) == {"a.0", "a.1", "c.0"}
    status = table.status("a")
    assert status is not None and [t.state for t in status.tasks] == ["finished", "failed"]
    # Late news of a forgotten job's task is ignored; news of an ended task does not count it twice.
    table.task_completed(_t("b.0"), "", 3.0)
    table.task_failed(b.tasks[1], "late", 3.0)
    table.task_completed(_t("a.1"), "", 3.0)
    assert (table.unfinished(), table.dropped_jobs, len(table.jobs)) == (0, 1, 2)


def test_a_preempted_task_keeps_its_job_open() -> None:
    table = JobTable(0, finished_tasks_kept=0)
    job = _job("j", 2)
    table.job_arrived(job, 0, 0.0)
    table.task_completed(_t("j.0"), "", 1.0)
    table.tasks["j.1"].state = "launched"
    table.task_preempted(_t("j.1"), 1.5)  # back in its queue: the job must stay
    assert table.unfinished() == 1 and table.status("j") is not None
    table.task_completed(_t("j.1"), "", 2.0)
    assert table.unfinished() == 0 and table.status("j") is None and table.dropped_jobs == 1


def test_a_task_shows_when_its_last_run_to_its_end_started_and_no_preempted_lost_or_older_run() -> None:
    table = JobTable(0)
    table.job_arrived(_job("j", 1), 0, 0.0)
    assert table.status("j").tasks[0].started_at is None  # type: ignore[union-attr]
    state = ((0, 0), (), 0)
    table.runs_started([Completion("j.0", state, preempted=True, started_at=1.0)])
    table.runs_started([Completion("j.0", state, lost=True, started_at=2.0)])
    table.runs_started([Completion("j.0", state, attempt=2, started_at=3.0)])  # not the run placed last
    assert table.status("j").tasks[0].started_at is None  # type: ignore[union-attr]
    table.runs_started([Completion("j.0", state, "exit code 1", started_at=4.0), Completion("gone.0", state)])
    assert table.status("j").tasks[0].started_at == 4.0  # type: ignore[union-attr]


def test_an_end_no_lm_announced_is_kept_for_the_gm_to_publish_once() -> None:
    table = JobTable(0)
    job = _job("j", 3)
    table.job_arrived(job, 0, 0.0)
    table.task_completed(job.tasks[0], "", 1.0)  # announced by its LM: nothing for the GM to publish
    table.task_completed(job.tasks[1], "", 1.0, forwarded=True)
    table.task_completed(job.tasks[1], "", 1.1, forwarded=True)  # a repeat
    table.task_failed(job.tasks[2], "LM 1 unreachable", 2.0)
    assert [(e.task_id, e.kind, e.reason) for e in table.ended_here] == [
        ("j.1", "finished", ""),
        ("j.2", "failed", "LM 1 unreachable"),
    ]


def test_a_forwarded_end_repeated_is_announced_again_at_its_worker_s_time_only_for_the_run_it_ended_with() -> None:
    """An LM killed after telling its GM of an end and before announcing it forwards the end again once rebuilt; the
    GM, which applied it already, keeps it to publish, at the time the worker measured (the same event as the LM's,
    had the LM announced it). Not for another attempt, another run of the attempt (a restarted GM's relaunch ended,
    and the earlier run's end was forwarded after: found by `megha chaos --faults all-kill`), another LM, a preempted
    or lost run, another outcome, or a task that has not ended."""
    table = JobTable(0)
    job = _job("j", 3)
    table.job_arrived(job, 0, 0.0)
    table.decided([Placement(t, 1, 2, False, 0) for t in job.tasks], 0.5)
    table.task_completed(job.tasks[0], "", 1.0)  # announced by its LM
    table.task_completed(job.tasks[1], "exit code 3", 1.0)
    state = ((0, 0), (), 0)
    for item in [
        Completion("j.0", state, attempt=2, forwarded=True, finished_at=0.9),  # another attempt's
        Completion("j.0", state, forwarded=True, finished_at=0.9, run_number=7),  # another run's of the attempt
        Completion("j.0", state, preempted=True, forwarded=True, finished_at=0.9),
        Completion("j.0", state, lost=True, forwarded=True, finished_at=0.9),
        Completion("j.0", state, "exit code 1", forwarded=True, finished_at=0.9),  # not how it ended
        Completion("j.2", state, forwarded=True, finished_at=0.9),  # j.2 has not ended
        Completion("gone.0", state, forwarded=True, finished_at=0.9),
    ]:
        table.forwarded_end_repeated(1, item, 5.0)
    table.forwarded_end_repeated(0, Completion("j.0", state, forwarded=True, finished_at=0.9), 5.0)  # another LM
    assert table.ended_here == []
    table.forwarded_end_repeated(1, Completion("j.0", state, forwarded=True, finished_at=0.9), 5.0)
    table.forwarded_end_repeated(1, Completion("j.1", state, "exit code 3", forwarded=True), 5.0)
    assert [tuple(e) for e in table.ended_here] == [
        ("j.0", "j", 1, "finished", "", 1, 2, 0.9),
        ("j.1", "j", 1, "failed", "exit code 3", 1, 2, 1.0),  # no worker time: when the GM recorded the end
    ]
    assert [t.state for t in table.status("j").tasks] == ["finished", "failed", "launched"]  # type: ignore[union-attr]


def test_each_run_of_a_task_is_found_where_it_ran_for_its_output() -> None:
    """A task lost on one node and placed again on another: the output of each attempt is asked of the node that
    attempt ran on (GET /v1/jobs/{id}/tasks/{task}/logs?attempt=N); a placement the LM rejected never ran."""
    table = JobTable(0)
    job = _job("j", 1)
    table.job_arrived(job, 0, 0.0)
    task = job.tasks[0]
    assert table.where_ran("j.0", None) is None and table.attempts_run("j.0") == []
    rejected = Placement(task, 1, 7, False)
    table.decided([rejected], 0.5)
    table.inconsistency(rejected, 0.6)  # never ran on LM 1 node 7
    table.decided([Placement(task, 0, 2, False)], 1.0)
    table.task_lost(task, "agent lost", 2.0)
    second = replace(task, attempt=2)
    table.decided([Placement(second, 1, 3, True)], 3.0)
    table.task_preempted(second, 4.0)
    third = replace(task, attempt=3)
    table.decided([Placement(third, 0, 0, False)], 5.0)
    assert table.where_ran("j.0", 1) == (0, 2)
    assert table.where_ran("j.0", 2) == (1, 3)
    assert table.where_ran("j.0", 3) == table.where_ran("j.0", None) == (0, 0)
    assert table.where_ran("j.0", 4) is None and table.where_ran("nope.0", None) is None
    assert table.attempts_run("j.0") == [1, 2, 3]


def test_a_task_ends_once_and_later_news_changes_neither_its_state_nor_its_finish_time() -> None:
    table = JobTable(0)
    job = _job("j", 2)
    table.job_arrived(job, 0, 0.0)
    table.decided([Placement(job.tasks[0], 0, 1, False)], 0.5)
    table.task_failed(job.tasks[0], "LM 0 unreachable", 1.0)
    table.task_completed(job.tasks[0], "", 2.0)  # the LM's late report of the run the GM gave up on
    table.task_completed(job.tasks[1], "", 3.0)
    table.task_completed(job.tasks[1], "", 4.0, forwarded=True)  # a duplicate completion
    status = table.status("j")
    assert status is not None
    assert [(t.state, t.finished_at, t.failed_reason) for t in status.tasks] == [
        ("failed", None, "LM 0 unreachable"),
        ("finished", 3.0, None),
    ]
    assert [e.kind for e in table.ended_here] == ["failed"] and table.illegal == 0


def test_a_decision_for_a_cancelled_task_is_logged_and_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    table = JobTable(0)
    job = _job("j", 1)
    table.job_arrived(job, 0, 0.0)
    table.task_cancelled(job.tasks[0], 1.0)
    table.decided([Placement(job.tasks[0], 0, 1, False)], 2.0)
    assert table.tasks["j.0"].state == "cancelled" and table.tasks["j.0"].launched_at is None
    assert table.illegal == 1 and "task j.0: DECIDED is not allowed in state CANCELLED" in caplog.text


def test_a_refused_preemption_request_puts_its_task_back_in_the_queue() -> None:
    table = JobTable(0)
    job = _job("j", 1)
    table.job_arrived(job, 0, 0.0)
    request = Placement(job.tasks[0], 0, -1, False)  # a preemption request names no node
    table.decided([request], 1.0)
    table.decided([replace(request, lm=1)], 1.5)  # LM 0 refused: the next LM is asked
    assert table.tasks["j.0"].state == "launched" and table.tasks["j.0"].lm == 1
    table.rescheduled(job.tasks[0], 2.0)  # LM 1 refused too: it waits
    assert table.tasks["j.0"].state == "queued" and table.illegal == 0


def test_the_job_list_says_what_kind_of_job_each_is() -> None:
    """`GET /v1/jobs` (JobSummary) carries each job's class, gang, array size, parents and whether it has a retry
    rule, as `GET /v1/jobs/{id}` (JobStatus) has them."""
    table = JobTable(0, class_name={0: "low", 100: "normal", 1000: "high"}.__getitem__)
    plain = _job("plain", 1)
    plain = replace(plain, tasks=tuple(replace(t, priority=100) for t in plain.tasks))
    kinds = _job("kinds", 3)
    kinds = replace(
        kinds,
        tasks=tuple(replace(t, priority=1000) for t in kinds.tasks),
        depends_on=("plain", "other"),
        retry=RetryRule(3, 1.0),
        gang=math.inf,
    )
    for job in (plain, kinds):
        table.job_arrived(job, 0, 0.0)
    table.jobs["kinds"].array = 3  # the service sets an array job's size
    table.job_waiting(kinds, 0.0)
    listed = {s.job_id: s for s in table.summaries()}
    assert listed["plain"].model_dump(include=KIND) == {
        "priority_class": "normal",
        "gang": False,
        "array": None,
        "depends_on": [],
        "retry": False,
    }
    assert listed["kinds"].model_dump(include=KIND) == {
        "priority_class": "high",
        "gang": True,
        "array": 3,
        "depends_on": ["plain", "other"],
        "retry": True,
    }
    assert listed["kinds"].state == "waiting"
    status = table.status("kinds")
    assert status is not None
    assert status.model_dump(include=KIND - {"retry"}) == listed["kinds"].model_dump(include=KIND - {"retry"})
    unnamed = JobTable(0)  # a table given no class names shows none
    unnamed.job_arrived(plain, 0, 0.0)
    assert unnamed.summaries()[0].priority_class is None


KIND = {"priority_class", "gang", "array", "depends_on", "retry"}
