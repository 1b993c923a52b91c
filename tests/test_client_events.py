"""The GM's job event fan-out (services/gm/events_route.py) fed as the GM core feeds it, after the job table: each
reader gets the job's state, each task change once (a repeated completion is not told again), then the job's
end; a reader that falls behind is dropped with an `error` event while the others go on."""

from __future__ import annotations

import pytest

from megha.common.core.messages import Placement
from megha.common.core.observer import CoreObserver, observe
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.models import ErrorBody, JobEnd, JobStatus, TaskTransition
from megha.services.gm import events_route
from megha.services.gm.events_route import JobEvents, Reader
from megha.services.gm.jobs import JobTable


def job(job_id: str, tasks: int) -> JobSpec:
    specs = tuple(TaskSpec(f"{job_id}.{i}", job_id, "alice", 1.0, (100, 64), 0) for i in range(tasks))
    return JobSpec(job_id, specs, submitted_at=1.0)


def fed(table: JobTable, tasks: int = 2) -> tuple[JobEvents, JobSpec, CoreObserver]:
    """The fan-out of `table`'s job `j` of `tasks` tasks, and the observer a GM core would report to."""
    events = JobEvents(lambda: table)
    spec = job("j", tasks)
    observer = observe(table, events)
    observer.job_arrived(spec, 0, 1.0)
    return events, spec, observer


def read(reader: Reader) -> list[tuple[str, object]]:
    """The events queued for `reader`, parsed."""
    models = {"state": JobStatus, "task": TaskTransition, "end": JobEnd, "error": ErrorBody}
    out = []
    while reader.frames:
        name, data = reader.frames.popleft().decode().removesuffix("\n\n").split("\n")
        kind = name.removeprefix("event: ")
        out.append((kind, models[kind].model_validate_json(data.removeprefix("data: "))))
    return out


def test_a_reader_gets_the_state_each_change_once_then_the_end() -> None:
    events, spec, observer = fed(JobTable(0))
    reader = events.open("j", 1.5)
    first, second = spec.tasks
    observer.decided([Placement(first, 0, 3, False), Placement(second, 0, 4, False)], 2.0)
    observer.task_completed(first, "", 3.0, False)
    observer.task_completed(first, "", 3.5, False)  # a repeated completion: told once
    observer.task_completed(second, "oom", 4.0, False)
    got = read(reader)
    assert [name for name, _ in got] == ["state", "task", "task", "task", "task", "end"]
    assert got[0][1].state == "queued"  # type: ignore[attr-defined]
    changes = [(c.kind, c.task_id, c.node) for _, c in got[1:5]]  # type: ignore[attr-defined]
    assert changes == [("launched", "j.0", 3), ("launched", "j.1", 4), ("finished", "j.0", 3), ("failed", "j.1", 4)]
    assert got[4][1].reason == "oom"  # type: ignore[attr-defined]
    assert got[5][1] == JobEnd(job_id="j", state="failed", at=4.0)
    assert reader.closed and events._jobs == {}  # nobody is told of this job any more


def test_a_job_that_ended_already_gives_its_state_and_end() -> None:
    table = JobTable(0)
    events, spec, observer = fed(table, 1)
    table.jobs["j"].cancelled = True  # as GMService.cancel marks it
    observer.task_cancelled(spec.tasks[0], 2.0)
    got = read(reader := events.open("j", 3.0))
    assert [name for name, _ in got] == ["state", "end"] and reader.closed
    assert got[1][1] == JobEnd(job_id="j", state="cancelled", at=3.0)


def test_a_reader_that_falls_behind_is_dropped_with_an_error_and_the_others_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(events_route, "BACKLOG", 4)

    events, spec, observer = fed(JobTable(0), 6)
    slow, quick = events.open("j", 1.0), events.open("j", 1.0)
    for i, task in enumerate(spec.tasks):
        observer.decided([Placement(task, 0, i, False)], 2.0)
        read(quick)
    got = read(slow)
    assert [name for name, _ in got] == ["error"] and slow.closed
    assert "fell 4 events behind" in got[0][1].error  # type: ignore[attr-defined]
    told = []
    for task in spec.tasks:
        observer.task_completed(task, "", 3.0, False)
        told += [name for name, _ in read(quick)]
    assert told == ["task"] * 6 + ["end"]
    assert read(slow) == []


def test_the_gm_recovering_ends_every_stream() -> None:
    events = fed(JobTable(0))[0]
    reader = events.open("j", 1.0)
    events.end_all("GM 0 recovers its jobs; open the stream again")
    assert [name for name, _ in read(reader)] == ["state", "error"] and reader.closed


def test_a_job_the_table_forgets_as_it_ends_still_ends_its_streams_with_its_outcome() -> None:
    events, spec, observer = fed(JobTable(0, finished_tasks_kept=0))  # each job is forgotten as it ends
    reader = events.open("j", 1.0)
    first, second = spec.tasks
    observer.task_completed(first, "exit 1", 2.0, False)
    observer.task_completed(second, "", 3.0, False)  # the last to end finished; one before it failed
    got = read(reader)
    assert [name for name, _ in got] == ["state", "task", "task", "end"]
    assert got[-1][1] == JobEnd(job_id="j", state="failed", at=3.0) and reader.closed
