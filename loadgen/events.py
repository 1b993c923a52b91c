"""The load generator's records of a replay against the services, from the task events they publish
(`EventRecorder`), and those events, each kept once as columns (`EventLog`): about 45 bytes an event, where the
parsed `TaskEvent` models cost about 1 KB each. Read as a mapping, an `EventLog` answers a task id with that task's
events, oldest first, as `TaskEvent`s (for the tests and for `megha chaos`'s suspects)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Mapping
from typing import get_args

from megha.common.core.lifecycle import TERMINAL, Event, State
from megha.common.core.retry import RetryRule
from megha.common.core.task import JobSpec
from megha.common.models import TaskEvent
from megha.loadgen.recorder import Records
from megha.loadgen.records import TaskColumns

KINDS: tuple[str, ...] = get_args(TaskEvent.model_fields["kind"].annotation)
"""The kinds of task event, numbered by their place."""
_KIND = {kind: number for number, kind in enumerate(KINDS)}
_NONE = -1  # no event


class EventLog(Mapping[str, list[TaskEvent]]):
    """Task events by their task's row in `tasks`; each task's events are chained newest to oldest."""

    def __init__(self, tasks: TaskColumns) -> None:
        self.tasks = tasks
        self.row = array("i")  # each event's task
        self.kind = bytearray()  # its kind, numbered as in KINDS
        self.attempt = array("i")
        self.lm = array("i")
        self.node = array("i")
        self.at = array("d")  # unix seconds, as published
        self.cpu_seconds = array("d")
        self.execution_delay = array("d")
        self.process_overhead = array("d")
        self.errors: dict[int, str] = {}  # event -> its error, for the events that have one
        self._earlier = array("i")  # each event's task's event before it (_NONE: its first)
        self._latest = array("i")  # each task's latest event, by row (_NONE: none yet)

    def add(self, row: int, event: TaskEvent) -> bool:
        """Keep `event` of the task in row `row`; False when the same (attempt, kind, time) is kept already (it
        was delivered again)."""
        latest = self._latest
        if row >= len(latest):
            latest.extend([_NONE] * (row + 1 - len(latest)))
        kind = _KIND[event.kind]
        e = latest[row]
        while e != _NONE:
            if self.kind[e] == kind and self.attempt[e] == event.attempt and self.at[e] == event.at:
                return False
            e = self._earlier[e]
        number = len(self.row)
        for column, value in (
            (self.row, row),
            (self.kind, kind),
            (self.attempt, event.attempt),
            (self.lm, event.lm),
            (self.node, event.node),
            (self.at, event.at),
            (self.cpu_seconds, event.cpu_seconds),
            (self.execution_delay, event.execution_delay),
            (self.process_overhead, event.process_overhead),
            (self._earlier, latest[row]),
        ):
            column.append(value)
        if event.error:
            self.errors[number] = event.error
        latest[row] = number
        return True

    def event(self, number: int) -> TaskEvent:
        """Event `number` as the `TaskEvent` it was received as."""
        c = self.tasks.columns
        row = self.row[number]
        return TaskEvent(
            kind=KINDS[self.kind[number]],  # type: ignore[arg-type]
            task_id=c["task_id"][row],
            job_id=c["job_id"][row],
            lm=self.lm[number],
            node=self.node[number],
            at=self.at[number],
            cpu_seconds=self.cpu_seconds[number],
            execution_delay=self.execution_delay[number],
            process_overhead=self.process_overhead[number],
            error=self.errors.get(number, ""),
            attempt=self.attempt[number],
        )

    def __getitem__(self, task_id: str) -> list[TaskEvent]:
        row = self.tasks.number.get(task_id, len(self._latest))
        e = self._latest[row] if row < len(self._latest) else _NONE
        if e == _NONE:
            raise KeyError(task_id)
        numbers = []
        while e != _NONE:
            numbers.append(e)
            e = self._earlier[e]
        return [self.event(n) for n in reversed(numbers)]

    def __iter__(self) -> Iterator[str]:
        task_ids = self.tasks.columns["task_id"]
        return (task_ids[row] for row, e in enumerate(self._latest) if e != _NONE)

    def __len__(self) -> int:
        return sum(e != _NONE for e in self._latest)


_EVENTS: dict[str, Event] = {
    "started": Event.STARTED,
    "finished": Event.FINISHED,
    "preempted": Event.PREEMPTED,
    "lost": Event.LOST,
    "failed": Event.FAILED,
    "cancelled": Event.CANCELLED,
}  # a task event's kind -> the lifecycle event it is


_NEWS_OF_AN_UNSEEN_RUN = frozenset({Event.LOST})
"""News of a run this recorder may never see start, that does not end its task: its LM reports the runs of a worker
agent that is gone lost, and the agent's outbox, with the start in it, went with it. A preemption or a failure is
reported by the agent that started the run, after its start: before it, they stay illegal."""


class EventRecorder(Records):
    """The load generator's records of a replay against the services, from the task events they publish (delivered
    at least once, in batches, from several publishers, so a start may arrive after its run's end). It sees no
    arrivals or decisions: its tasks start QUEUED, and the GMs fill in arrival and placement after the replay."""

    _first = State.QUEUED

    def __init__(self) -> None:
        super().__init__()
        self.events = EventLog(self.tasks)  # every task event received, once
        self.ended = 0  # tasks ended (finished, failed or cancelled)
        self.open = 0  # tasks of accepted jobs not yet ended
        self._accepted: set[str] = set()  # jobs a GM accepted
        self.failures_retried = 0  # failed runs their job's retry rule runs again (not ends)
        self._rules: dict[str, RetryRule] = {}  # the retry rules of the jobs that have one
        self._failures: dict[str, int] = {}  # task id -> its failed runs retried so far
        # Row -> the (attempt, run number) of the run last seen starting, when not (1, 1): a later run's start ends it.
        self._runs: dict[int, tuple[int, int]] = {}

    def expect(self, gm: int, job: JobSpec) -> None:
        super().expect(gm, job)
        if job.retry is not None:
            self._rules[job.job_id] = job.retry

    def _retried(self, event: TaskEvent) -> bool:
        """A `failed` run its job's retry rule runs again: the rule's decision, as its GM takes it (docs/retry.md)."""
        rule = self._rules.get(event.job_id)
        if rule is None or not rule.matches(event.exit_code):
            return False
        done = self._failures.get(event.task_id, 0)
        if done + 1 >= rule.max_attempts:
            return False
        self._failures[event.task_id] = done + 1
        return True

    def _advance(self, row: int, task_id: str, event: Event) -> bool:
        """As `Records._advance`, but a run lost while its task is QUEUED here is legal: this recorder sees no
        decisions, and the start of that run may never come (`_NEWS_OF_AN_UNSEEN_RUN`). The task stays QUEUED: it
        runs again."""
        if event in _NEWS_OF_AN_UNSEEN_RUN and self.states[row] == State.QUEUED:
            return False
        return super()._advance(row, task_id, event)

    def _later_run(self, row: int, event: TaskEvent) -> bool:
        """A run starts while the task runs here. A later run (attempt, then run number) than the one seen starting:
        that one ended unseen, its end lost with every service that could have told it (its worker, LM and GM killed
        together: its GM ran the task again), and is taken as lost. The same run again is counted illegal, as
        before; an earlier one is news of a run that is over (False)."""
        run, running = (event.attempt, event.run_number), self._runs.get(row, (1, 1))
        if run > running:
            self._advance(row, event.task_id, Event.LOST)
            self.tasks.columns["retries"][row] += 1
        return run >= running

    def accept(self, job: JobSpec) -> None:
        """A GM accepted the job: its tasks not yet ended (their ends may come before the answer) are awaited."""
        if job.job_id not in self._accepted:
            self._accepted.add(job.job_id)
            number, states = self.tasks.number, self.states
            self.open += sum(states[number[t.task_id]] not in TERMINAL for t in job.tasks)

    def reject(self, job: JobSpec, reason: str) -> None:
        """No GM accepted the job: each of its tasks failed at submission."""
        self.jobs[job.job_id].rejected_reason = reason
        for t in job.tasks:
            row = self.tasks.number[t.task_id]
            if self._advance(row, t.task_id, Event.FAILED):
                self.tasks.columns["failed_reason"][row] = f"rejected at submission: {reason}"

    def give_up(self, reason: str) -> list[str]:
        """The tasks of accepted jobs that have not ended, failed with `reason` (the replay stops waiting)."""
        c, states = self.tasks.columns, self.states
        left = [
            task_id
            for task_id, row in self.tasks.number.items()
            if states[row] not in TERMINAL and c["job_id"][row] in self._accepted
        ]
        for task_id in left:
            c["failed_reason"][self.tasks.number[task_id]] = reason
        return sorted(left)

    def record(self, event: TaskEvent, at: float) -> bool:
        """Record one task event (`at`: seconds since the replay began); True when it ended a task. A preempted
        task has not ended: it waits in its user's queue and runs again; nor has a lost one (it runs again as its
        next attempt, or its GM fails it)."""
        row = self.tasks.number.get(event.task_id)
        if row is None:
            return False  # another run's task on a shared broker
        if not self.events.add(row, event):
            return False  # delivered again (publishing is at least once)
        c, kind = self.tasks.columns, _EVENTS[event.kind]
        if kind is Event.FAILED and self._rules and self._retried(event):
            kind = Event.RETRIED  # not an end: the task runs again as its next attempt
        if kind is Event.FINISHED:
            ended = self._finished(row, event.task_id, at)
        elif kind is Event.FAILED or kind is Event.CANCELLED:
            ended = self._advance(row, event.task_id, kind)
            if ended:
                c["finished_at"][row] = at
                c["failed_reason"][row] = f"{event.kind}: {event.error}"
        else:
            if kind is Event.STARTED and self.states[row] == State.RUNNING and not self._later_run(row, event):
                return False  # the start of an earlier run, after a later one's: that run is over
            self._advance(row, event.task_id, kind)
            if kind is Event.STARTED:  # also when it arrives after its run's end: the start happened
                c["started_at"][row] = c["worker_received_at"][row] = at
                if (event.attempt, event.run_number) != (1, 1):
                    self._runs[row] = (event.attempt, event.run_number)
            elif kind is Event.LOST:
                c["retries"][row] += 1
            elif kind is Event.RETRIED:
                self.failures_retried += 1
                self._lose_run(row, at, math.inf)
            else:
                c["preemptions"][row] += 1
                self._lose_run(row, at, math.inf)
            return False
        if ended:
            self.ended += 1
            if c["job_id"][row] in self._accepted:
                self.open -= 1
        return ended
