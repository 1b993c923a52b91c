"""The recorders: what a replay measured of each task and job, reduced from the events the cores report through
the task lifecycle (`common/core/lifecycle.py`). `Recorder` observes the cores of a replay in one process;
`EventRecorder` (loadgen/events.py) reads the task events the services publish. Both fill the same columns
(`TaskColumns`, through `Records`), so a duplicate completion changes no record, and an event the lifecycle does
not allow is counted and logged."""

from __future__ import annotations

import functools
import inspect
import logging
import math
import time
from collections.abc import Callable, Sequence

from megha.common.core.lifecycle import ILLEGAL, STEPS, Event, IllegalTransition, State, next_state
from megha.common.core.messages import Placement
from megha.common.core.observer import CoreObserver
from megha.common.core.task import JobSpec, TaskSpec
from megha.loadgen.records import JobRecord, TaskColumns

log = logging.getLogger("megha.loadgen")
_WIDTH = len(Event)


ILLEGAL_EXAMPLES = 3
"""Illegal transitions the records keep word for word (the report names them); the rest are counted."""


class RecordedTasks(TaskColumns):
    """The task columns of a run's records, with the events the task lifecycle did not allow among those that
    filled them: `compute_metrics` reports them (a replay never hides a violation)."""

    def __init__(self) -> None:
        super().__init__()
        self.illegal_transitions = 0
        self.illegal_examples: list[str] = []  # the first `ILLEGAL_EXAMPLES`, as logged


class Records:
    """Task and job records, and each task's lifecycle state."""

    def __init__(self) -> None:
        self.tasks = RecordedTasks()
        self.jobs: dict[str, JobRecord] = {}
        self.states = bytearray()  # each task's lifecycle `State`, by row
        self.gang_jobs: set[str] = set()  # gang jobs (a finished run of theirs may be thrown away with its gang)

    def expect(self, gm: int, job: JobSpec) -> None:
        """Register a job before it is submitted to GM `gm` (so rejected jobs are reported too)."""
        self.jobs[job.job_id] = JobRecord(
            job.job_id, gm, job.submitted_at, len(job.tasks), max((t.duration for t in job.tasks), default=0.0)
        )
        self.tasks.add_job(job.job_id, gm, job.tasks)
        self.states.extend(bytes([self._first]) * len(job.tasks))
        if job.gang is not None:
            self.gang_jobs.add(job.job_id)

    _first = State.NEW  # the state of a task registered by `expect`

    @property
    def illegal(self) -> int:
        """Events the lifecycle did not allow (logged and reported; the record keeps what they measured)."""
        return self.tasks.illegal_transitions

    def _advance(self, row: int, task_id: str, event: Event) -> bool:
        """Move a task along `event`; False for a no-op, and for an illegal event (counted and logged)."""
        states = self.states
        after = STEPS[states[row] * _WIDTH + event]
        if after >= 0:
            states[row] = after
            return True
        if after == ILLEGAL:
            tasks = self.tasks
            tasks.illegal_transitions += 1
            try:
                next_state(task_id, states[row], event)
            except IllegalTransition as exc:
                log.warning("%s (recorded as reported)", exc)
                if len(tasks.illegal_examples) < ILLEGAL_EXAMPLES:
                    tasks.illegal_examples.append(str(exc))
        return False

    def _finished(self, row: int, task_id: str, at: float) -> bool:
        """A run of the task finished at `at`: counted as a completion (evidence of exactly once), and recorded as
        the task's end unless it had ended; a job finishes with its last task."""
        c = self.tasks.columns
        c["completions"][row] += 1
        states = self.states
        after = STEPS[states[row] * _WIDTH + Event.FINISHED]  # `_advance`, inline on the hot path
        if after >= 0:
            states[row] = after
        elif not self._advance(row, task_id, Event.FINISHED):
            return False
        c["finished_at"][row] = at
        self.jobs[c["job_id"][row]].task_finished(at)
        return True

    def _unfinish(self, row: int) -> None:
        """A gang member's finished run was thrown away with its gang's failed attempt (a retry rule runs the whole
        gang again, or fails it whole; docs/gang.md): no completion, and the task has not ended."""
        c = self.tasks.columns
        c["completions"][row] -= 1
        c["finished_at"][row] = math.nan
        self.jobs[c["job_id"][row]].finished_tasks -= 1
        self.states[row] = State.RUNNING

    def _lose_run(self, row: int, at: float, ran_at_most: float) -> None:
        """The run that started at started_at was thrown away at `at`: its CPU request for as long as it ran (at
        most `ran_at_most` seconds) is lost."""
        c = self.tasks.columns
        started = c["started_at"][row]
        if not math.isnan(started):
            c["lost_cpu_seconds"][row] += c["request"][row][0] / 1000 * min(ran_at_most, max(0.0, at - started))


class Recorder(Records, CoreObserver):
    """Collects what happened to every task, from the events the GM, LM and worker cores report."""

    def __init__(self) -> None:
        super().__init__()
        self.finished_count = 0
        self.failed_count = 0  # failure reports (a task is reported once; with retries and restarts, perhaps more)
        self.failures_retried = 0  # failed runs run again under their job's retry rule (not ends)
        # Runs cut short by preemption: (task id, started_at, preempted_at), for per-user usage over time.
        self.preempted_runs: list[tuple[str, float, float]] = []
        # Row -> when the GM's scheduling attempt of the task started, from the attempt until the decision that
        # ends it (then it becomes `attempt_at`) or until the task is held unplaced (`rescheduled`).
        self._attempts_in_progress: dict[int, float] = {}

    def job_arrived(self, job: JobSpec, gm: int, now: float) -> None:
        number, arrival = self.tasks.number, self.tasks.columns["arrival"]
        states, step, arrived = self.states, _WIDTH, Event.ARRIVED
        for t in job.tasks:
            row = number[t.task_id]
            arrival[row] = now
            after = STEPS[states[row] * step + arrived]  # `_advance`, inline on the hot path
            if after >= 0:
                states[row] = after
            else:
                self._advance(row, t.task_id, arrived)
        record = self.jobs[job.job_id]
        if record.dropped_tasks and job.tasks:  # it runs without them (`JobRecord`)
            record.ideal_jrt = max(t.duration for t in job.tasks)

    def job_released(self, job: JobSpec, now: float) -> None:
        """Its parents finished: its tasks' allocation time and its JRT count from here, not from the wait for its
        parents (which is their run time, not the scheduler's delay)."""
        arrival, number = self.tasks.columns["arrival"], self.tasks.number
        for t in job.tasks:
            arrival[number[t.task_id]] = now
        self.jobs[job.job_id].submitted_at = now

    def job_rejected(self, job: JobSpec, gm: int, reason: str, now: float) -> None:
        self.jobs[job.job_id].rejected_reason = reason
        for t in job.tasks:
            self._failed(t.task_id, f"rejected at submission: {reason}")
        self.failed_count += len(job.tasks)

    def attempt(self, task: TaskSpec, now: float) -> None:
        row = self.tasks.number[task.task_id]
        self.tasks.columns["attempts"][row] += 1
        self._attempts_in_progress[row] = now

    def rescheduled(self, task: TaskSpec, now: float) -> None:
        row = self.tasks.number[task.task_id]
        self.tasks.columns["reschedules"][row] += 1
        self._attempts_in_progress.pop(row, None)  # that attempt placed nothing

    def decided(self, placements: Sequence[Placement], now: float) -> None:
        """A placement's stamps replace the previous placement's, so that every stamp of a task is of one placement,
        its last. Its `attempt_at` is the start of the attempt this decision ends; a decision the GM reported no
        attempt for (a queueable task of a parked shape sent to a node's queue, a preemption request to the next LM
        after a refusal) is an attempt of its own, started as it was decided."""
        number, c, in_progress = self.tasks.number, self.tasks.columns, self._attempts_in_progress
        decided_at, lm, node, repartitioned = c["decided_at"], c["lm"], c["node"], c["repartitioned"]
        attempt_at, states, step = c["attempt_at"], self.states, _WIDTH
        for p in placements:
            row = number[p.task.task_id]
            started = in_progress.pop(row, None)
            if started is None:
                started = now
                c["attempts"][row] += 1
            attempt_at[row] = started
            decided_at[row], lm[row], node[row], repartitioned[row] = now, p.lm, p.node, p.repartition
            after = STEPS[states[row] * step + Event.DECIDED]  # `_advance`, inline on the hot path
            if after >= 0:
                states[row] = after
            else:
                self._advance(row, p.task.task_id, Event.DECIDED)

    def inconsistency(self, placement: Placement, now: float) -> None:
        row = self.tasks.number[placement.task.task_id]
        self.tasks.columns["inconsistencies"][row] += 1
        self._advance(row, placement.task.task_id, Event.REFUSED)

    def preemption_refused(self, task: TaskSpec, reason: str, now: float) -> None:
        self._advance(self.tasks.number[task.task_id], task.task_id, Event.REFUSED)

    def lm_received(self, placements: Sequence[Placement], now: float) -> None:
        self._stamp("lm_received_at", placements, now)

    def launched(self, placements: Sequence[Placement], now: float) -> None:
        number, c = self.tasks.number, self.tasks.columns
        launched_at, node, repartitioned = c["launched_at"], c["node"], c["repartitioned"]
        for p in placements:
            row = number[p.task.task_id]
            launched_at[row] = now
            node[row] = p.node  # the LM's word: a preemption request names no node until the LM picks one
            repartitioned[row] = p.repartition  # ... nor whose partition the node is in

    def worker_received(self, placements: Sequence[Placement], now: float) -> None:
        self._stamp("worker_received_at", placements, now)

    def started(self, placements: Sequence[Placement], now: float) -> None:
        number, started_at = self.tasks.number, self.tasks.columns["started_at"]
        states, step = self.states, _WIDTH
        for p in placements:
            row = number[p.task.task_id]
            started_at[row] = now
            after = STEPS[states[row] * step + Event.STARTED]  # `_advance`, inline on the hot path
            if after >= 0:
                states[row] = after
            else:
                self._advance(row, p.task.task_id, Event.STARTED)

    def finished(self, task_ids: Sequence[str], now: float) -> None:
        number = self.tasks.number
        for task_id in task_ids:
            self._finished(number[task_id], task_id, now)
        self.finished_count += len(task_ids)

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None:
        row = self.tasks.number[task.task_id]
        state = self.states[row]
        if state == State.NEW:  # dropped at submission: its job arrives without it
            record = self.jobs[task.job_id]
            record.dropped_tasks += 1
            if record.dropped_tasks == record.num_tasks:
                record.rejected_reason = reason  # it never runs
        elif state == State.COMPLETED and task.job_id in self.gang_jobs:
            self._unfinish(row)  # a gang failed whole: its finished members fail with it
        self._failed(task.task_id, reason)
        self.failed_count += 1

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool) -> None:
        """A run that failed ends its task (one that finished is recorded from its worker's report)."""
        if error:
            self._failed(task.task_id, error)
            self.failed_count += 1

    def task_retry_scheduled(self, task: TaskSpec, reason: str, at: float, now: float) -> None:
        """A failed run its job's retry rule runs again: not an end; the run's work is lost. A gang member whose
        run its worker stopped already (for this retry of its gang: `preempted` came first) is queued already."""
        row = self.tasks.number[task.task_id]
        if self.states[row] == State.COMPLETED:
            self._unfinish(row)  # a gang member's finished run: the gang runs again whole
        self.failures_retried += 1
        if self.states[row] == State.QUEUED:
            return
        self._lose_run(row, now, math.inf)
        self._advance(row, task.task_id, Event.RETRIED)

    def task_preempted(self, task: TaskSpec, now: float) -> None:
        """Its GM stopped the task's run and queues it again. The worker's `preempted` tells this of a run it stopped;
        what it cannot tell is a gang member that finished and was held under its job's retry rule, run again with
        the rest of its gang (stopped for a lost or preempted member): its finish is thrown away here."""
        row = self.tasks.number[task.task_id]
        if self.states[row] == State.COMPLETED:
            self._unfinish(row)
            self._lose_run(row, now, math.inf)
            self._advance(row, task.task_id, Event.PREEMPTED)

    def task_lost(self, task: TaskSpec, reason: str, now: float) -> None:
        """Its worker crashed: the work the run had done is thrown away (its CPU request for as long as it ran,
        at most its duration; the loss is noticed later than the crash, so this may count a little too much)."""
        row = self.tasks.number[task.task_id]
        self.tasks.columns["retries"][row] += 1
        self._lose_run(row, now, task.duration)
        self._advance(row, task.task_id, Event.LOST)

    def requeued_at_recovery(self, tasks: Sequence[TaskSpec], now: float) -> None:
        """A restarted GM queued these tasks again: one that was placed or running here lost that run while its GM
        was down (its work is lost, as a lost worker's: at most its duration), and waits for its next run."""
        number, states = self.tasks.number, self.states
        for task in tasks:
            row = number[task.task_id]
            if states[row] == State.PLACING or states[row] == State.RUNNING:
                self._lose_run(row, now, task.duration)
                self._advance(row, task.task_id, Event.LOST)

    def preemption_attempted(self, task: TaskSpec, lm: int, now: float) -> None:
        self.tasks.columns["preemption_attempts"][self.tasks.number[task.task_id]] += 1

    def preempted(self, task_ids: Sequence[str], now: float) -> None:
        """A worker stopped these runs. One of a task back in its queue is a run its LM already reported lost (a
        launch that reached its node after the node's repair, stopped when the LM took the node out of service:
        embedded/injector.py): news of a run that ended, not a preemption, whose work was counted lost then."""
        number, c, states = self.tasks.number, self.tasks.columns, self.states
        for task_id in task_ids:
            row = number[task_id]
            if states[row] == State.QUEUED:
                continue
            c["preemptions"][row] += 1
            self._lose_run(row, now, math.inf)
            self.preempted_runs.append((task_id, c["started_at"][row], now))
            self._advance(row, task_id, Event.PREEMPTED)

    def mark_stranded(self, task_ids: Sequence[str], reason: str) -> None:
        """Tasks the run ended without placing: reported failed with `reason`, never silently dropped."""
        for task_id in task_ids:
            self._failed(task_id, reason)

    def _failed(self, task_id: str, reason: str) -> None:
        row = self.tasks.number[task_id]
        self._advance(row, task_id, Event.FAILED)
        self.tasks.columns["failed_reason"][row] = reason

    def _stamp(self, column: str, placements: Sequence[Placement], now: float) -> None:
        number, times = self.tasks.number, self.tasks.columns[column]
        for p in placements:
            times[number[p.task.task_id]] = now


class WallClockRecorder(Recorder):
    """A recorder for a run on the wall clock (`--realtime`): every event is stamped with the wall time it was reported
    at, in seconds since `start()`, not with the time it was due (which it lags when the machine cannot keep up)."""

    def __init__(self) -> None:
        super().__init__()
        self.origin = time.perf_counter()

    def start(self) -> None:
        """Time 0 of the records: call it as the run starts."""
        self.origin = time.perf_counter()


def _on_the_wall_clock(event: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(event)
    def stamped(self: WallClockRecorder, *args: object) -> None:
        event(self, *args[:-1], time.perf_counter() - self.origin)

    return stamped


for _name, _event in vars(Recorder).items():  # every event whose last parameter is the time it happened
    if inspect.isfunction(_event) and list(inspect.signature(_event).parameters)[-1] == "now":
        setattr(WallClockRecorder, _name, _on_the_wall_clock(_event))
del _name, _event
