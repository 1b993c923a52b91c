"""The GM service's job table: what GET /v1/jobs/{id} reports, filled from the GM core's observer events (the ids
of the jobs a GM names itself are made by `job_ids.JobIds`).

A long-running GM must not grow without bound: once every task of a job has finished or failed, the job counts
as finished, and the oldest finished jobs are forgotten while more than `finished_tasks_kept` finished tasks are
held (MEGHA_FINISHED_TASKS_KEPT). Jobs with a task still queued or running are always kept.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from megha.common.core.lifecycle import NO_OP, TERMINAL, Event, IllegalTransition, State, next_state
from megha.common.core.messages import Completion, Placement
from megha.common.core.observer import CoreObserver
from megha.common.core.retry import RetryRule
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.models import JobState, JobStatus, JobSummary, TaskStatus
from megha.common.models import RetryRule as RetryRuleModel
from megha.services.logs import ids

log = logging.getLogger("megha.gm")

ENDED = ("finished", "failed", "cancelled")
"""The `TaskStatus.state` of a task that ended."""

_WIRE: dict[int, str] = {
    State.QUEUED: "queued",
    State.PLACING: "launched",  # a GM hears of no start: placed is launched until the run ends
    State.RUNNING: "launched",
    State.COMPLETED: "finished",
    State.FAILED: "failed",
    State.CANCELLED: "cancelled",
}  # a lifecycle state -> the `TaskStatus.state` that shows it
_FROM_WIRE: dict[str, int] = {"queued": State.QUEUED, "launched": State.PLACING} | {_WIRE[s]: s for s in TERMINAL}
_ENDS: dict[str, Event] = {"finished": Event.FINISHED, "failed": Event.FAILED, "cancelled": Event.CANCELLED}


class UnannouncedEnd(NamedTuple):
    """A task's end no LM announced as a task event (this GM failed or cancelled it, or a rebuilt LM forwarded it),
    for the service to publish (`JobTable.ended_here`)."""

    task_id: str
    job_id: str
    attempt: int
    kind: str
    reason: str
    lm: int
    node: int
    at: float

    @classmethod
    def of(cls, task: TaskSpec, kind: str, reason: str, rec: _Task, at: float) -> UnannouncedEnd:
        return cls(task.task_id, task.job_id, task.attempt, kind, reason, rec.lm or 0, rec.node or 0, at)


@dataclass(slots=True)
class _Task:
    job_id: str
    life: int = State.QUEUED  # its lifecycle `State`; `state` shows it as the API does
    arrival: float | None = None
    launched_at: float | None = None
    started_at: float | None = None  # of its last run that ran to its end, as the worker measured it
    finished_at: float | None = None
    lm: int | None = None
    node: int | None = None
    attempts: int = 0
    inconsistencies: int = 0
    repartitioned: bool = False
    preemptions: int = 0
    retries: int = 0
    failed_reason: str | None = None
    attempt: int = 1  # the attempt of the run placed last (TaskSpec.attempt)
    run_number: int | None = None  # and its run number (None: not known, an end restored from the journal)
    earlier: list[tuple[int, int, int]] | None = None  # (attempt, LM, node) of runs lost or preempted since
    failures_retried: int = 0  # failed runs run again under the job's retry rule
    queueable: bool = False  # TaskSpec.queueable

    @property
    def state(self) -> str:
        return _WIRE[self.life]

    @state.setter
    def state(self, state: str) -> None:
        self.life = _FROM_WIRE[state]

    @property
    def ended(self) -> bool:
        return self.life in TERMINAL


@dataclass(slots=True)
class _Job:
    user: str
    task_ids: list[str] = field(default_factory=list)
    open: int = 0  # tasks neither finished nor failed nor cancelled
    cancelled: bool = False  # DELETE /v1/jobs/{id} asked for it
    submitted_at: float | None = None
    depends_on: tuple[str, ...] = ()  # the jobs it waits for (`JobSpec.depends_on`)
    waiting: bool = False  # held until its parents finished (the core's dependency gate)
    array: int | None = None  # its array size, for an array job (the service sets it)
    retry: RetryRule | None = None  # the job's retry rule (JobSpec.retry)
    priority: int = 0  # its tasks' priority class value
    gang: float | None = None  # JobSpec.gang: None for a job that is no gang, else its timeout (inf: none)


class JobTable(CoreObserver):
    """Per-task state at this GM: queued -> launched -> finished (or failed, with the reason, or cancelled), each task
    moved along the task lifecycle (`common/core/lifecycle.py`): a task ends once, later news of it changes
    nothing, and an event the lifecycle does not allow is logged as an error, counted (`illegal`) and ignored. The
    service's GM core reports to it and to the GM's metrics (`GMMeter`) alike, through `observe`."""

    def __init__(
        self,
        gm: int,
        finished_tasks_kept: int = 1_000_000,
        on_end: Callable[[str, str, str], None] | None = None,
        on_retry: Callable[[TaskSpec, int], None] | None = None,
        class_name: Callable[[int], str] | None = None,
    ) -> None:
        """`on_end(task_id, state, reason)` is told of every task that ends, `on_retry(task, failures retried)` of
        every failed run its job's retry rule runs again (the service journals both); `class_name(priority)` names
        a job's priority class in its status (None: no classes shown)."""
        self.gm = gm
        self.class_name = class_name
        self.on_end = on_end
        self.on_retry = on_retry
        self.finished_tasks_kept = finished_tasks_kept
        self.jobs: dict[str, _Job] = {}
        self.tasks: dict[str, _Task] = {}
        self.dropped_jobs = 0  # finished jobs forgotten to keep the table bounded
        self._open_tasks = 0
        self.open_by_user: dict[str, int] = {}  # tasks neither finished nor failed nor cancelled, per user
        self._finished_jobs: deque[str] = deque()  # oldest first
        self._finished_tasks = 0
        # Ends of tasks no LM announced (this GM failed them, or a rebuilt LM forwarded their end), for the
        # service to publish as task events.
        self.ended_here: list[UnannouncedEnd] = []
        self.illegal = 0  # events the lifecycle did not allow (each logged as an error)
        self.on_job_end: Callable[[str, str], None] | None = None  # told (job id, state) as each job ends

    def job_arrived(self, job: JobSpec, gm: int, now: float) -> None:
        """A task's arrival is when its job's request reached the GM (the service stamps that as
        `submitted_at`), so allocation time includes reading and validating the submission."""
        self.jobs[job.job_id] = _Job(
            job.tasks[0].user,
            [t.task_id for t in job.tasks],
            len(job.tasks),
            submitted_at=job.submitted_at,
            depends_on=job.depends_on,
            retry=job.retry,
            priority=job.tasks[0].priority,
            gang=job.gang,
        )
        self._open_tasks += len(job.tasks)
        user = job.tasks[0].user
        self.open_by_user[user] = self.open_by_user.get(user, 0) + len(job.tasks)
        for t in job.tasks:
            self.tasks[t.task_id] = _Task(job.job_id, arrival=job.submitted_at, queueable=t.queueable)

    def job_waiting(self, job: JobSpec, now: float) -> None:
        self.jobs[job.job_id].waiting = True

    def job_released(self, job: JobSpec, now: float) -> None:
        held = self.jobs.get(job.job_id)
        if held is not None:
            held.waiting = False

    def attempt(self, task: TaskSpec, now: float) -> None:
        self.tasks[task.task_id].attempts += 1

    def decided(self, placements: Sequence[Placement], now: float) -> None:
        """Called for every batch of decisions (thousands of tasks a second under load): a repartition is logged
        per task at DEBUG only, and counted per LM in one INFO line per batch that has any."""
        repartitions: dict[int, list[Placement]] = {}
        for p in placements:
            if p.repartition:
                repartitions.setdefault(p.lm, []).append(p)
            rec = self.tasks[p.task.task_id]
            if p.node < 0 and rec.life == State.PLACING:  # a preemption request one LM refused, to the next LM
                self._advance(p.task.task_id, rec, Event.REFUSED)
            if not self._advance(p.task.task_id, rec, Event.DECIDED):
                continue
            rec.launched_at, rec.lm, rec.node, rec.repartitioned, rec.attempt, rec.run_number = (
                now,
                p.lm,
                p.node if p.node >= 0 else None,  # a preemption request leaves the node to the LM
                p.repartition,
                p.task.attempt,
                p.task.run_number,
            )
        for lm, moved in repartitions.items():
            log.info(
                "%d of %d tasks placed on LM %d by repartition (nodes of other GMs' partitions)",
                len(moved),
                len(placements),
                lm,
                extra=ids(gm=self.gm, lm=lm),
            )
            if log.isEnabledFor(logging.DEBUG):
                for p in moved:
                    log.debug(
                        "task %s of job %s: repartition onto LM %d node %d",
                        p.task.task_id,
                        p.task.job_id,
                        p.lm,
                        p.node,
                        extra=self._ids(p.task, p.lm, p.node),
                    )

    def rescheduled(self, task: TaskSpec, now: float) -> None:
        """Nothing fitted the task: it waits. A placed one waits again because its preemption request was refused
        (this table does not observe `preemption_refused`, which the LM, or the GM core itself when its call to a
        crashed LM failed, reports: the refusal is inferred here, and from a decision for the next LM)."""
        rec = self.tasks.get(task.task_id)
        if rec is not None and rec.life == State.PLACING:
            self._advance(task.task_id, rec, Event.REFUSED)

    def inconsistency(self, placement: Placement, now: float) -> None:
        task = placement.task
        rec = self.tasks[task.task_id]
        rec.inconsistencies += 1
        if not self._advance(task.task_id, rec, Event.REFUSED):
            return
        log.info(
            "task %s of job %s: LM %d rejected node %d (an inconsistency: this GM's view was stale); queued again",
            task.task_id,
            task.job_id,
            placement.lm,
            placement.node,
            extra=self._ids(task, placement.lm, placement.node),
        )

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None:
        rec = self.tasks.get(task.task_id)
        if rec is None:
            return  # its job ended and was forgotten: this is news of an already-ended task
        if self._advance(task.task_id, rec, Event.FAILED):
            rec.failed_reason = reason
            log.warning(
                "task %s of job %s failed (attempt %d): %s",
                task.task_id,
                task.job_id,
                task.attempt,
                reason,
                extra=self._ids(task, rec.lm, rec.node),
            )
            self.ended_here.append(UnannouncedEnd.of(task, "failed", reason, rec, now))
            self._ended(task.task_id, rec)

    def task_lost(self, task: TaskSpec, reason: str, now: float) -> None:
        """Its worker was lost: back in the queue, to run again as its next attempt."""
        rec = self.tasks.get(task.task_id)
        if rec is not None and self._advance(task.task_id, rec, Event.LOST):
            log.warning(
                "task %s of job %s lost on LM %s node %s (%s): it runs again as attempt %d",
                task.task_id,
                task.job_id,
                rec.lm,
                rec.node,
                reason,
                task.attempt + 1,
                extra=self._ids(task, rec.lm, rec.node),
            )
            rec.retries += 1
            _ran(rec, task.attempt)

    def task_retry_scheduled(self, task: TaskSpec, reason: str, at: float, now: float) -> None:
        """Its run failed and the job's retry rule runs it again (as its next attempt) at `at`: queued, not ended."""
        rec = self.tasks.get(task.task_id)
        if rec is not None and self._advance(task.task_id, rec, Event.RETRIED):
            log.info(
                "task %s of job %s: run %d failed, retried as attempt %d: %s",
                task.task_id,
                task.job_id,
                task.attempt,
                task.attempt + 1,
                reason,
                extra=self._ids(task, rec.lm, rec.node),
            )
            rec.failures_retried += 1
            _ran(rec, task.attempt)
            if self.on_retry is not None:
                self.on_retry(task, rec.failures_retried)

    def placed_by_preemption(self, placement: Placement) -> None:
        """The LM chose the node for a task it made room for by preemption."""
        rec = self.tasks.get(placement.task.task_id)
        if rec is not None:
            rec.node, rec.repartitioned = placement.node, placement.repartition

    def task_preempted(self, task: TaskSpec, now: float) -> None:
        """Stopped for another user's task: back in its queue, to run again."""
        rec = self.tasks.get(task.task_id)
        if rec is not None and self._advance(task.task_id, rec, Event.PREEMPTED):
            rec.preemptions += 1
            _ran(rec, task.attempt)

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool = False) -> None:
        rec = self.tasks.get(task.task_id)
        if rec is not None and self._advance(task.task_id, rec, Event.FAILED if error else Event.FINISHED):
            if forwarded:
                self.ended_here.append(UnannouncedEnd.of(task, rec.state, error, rec, now))
            rec.finished_at, rec.failed_reason = now, error or None
            self._ended(task.task_id, rec)

    def forwarded_end_repeated(self, lm: int, item: Completion, now: float) -> None:
        """A rebuilt LM forwarded again the end of the run this task ended with (same attempt and run number, same
        LM, the same outcome): the LM that placed it may have died after telling this GM and before announcing the
        end, so it is announced again, at the time its worker measured (the same event as the LM's, if the LM did
        announce it). The end of an earlier run of the same attempt (launched again by this GM after a restart, and
        ended since) is not: announced, it would end the task a second time."""
        rec = self.tasks.get(item.task_id)
        if rec is None or item.preempted or item.lost or rec.attempt != item.attempt or rec.lm != lm:
            return
        if rec.run_number is not None and rec.run_number != item.run_number:
            return
        kind = "failed" if item.error else "finished"
        if rec.state != kind or (item.error or None) != rec.failed_reason:
            return
        at = item.finished_at if item.finished_at is not None else rec.finished_at if rec.finished_at else now
        self.ended_here.append(
            UnannouncedEnd(item.task_id, rec.job_id, item.attempt, kind, item.error, lm, rec.node or 0, at)
        )

    def runs_started(self, items: Iterable[Completion]) -> None:
        """Record when the runs an LM reports finished or failed had started on their workers: a GM hears of no
        start as it happens, the worker's measurement comes with the end. Runs preempted or lost are not recorded
        (the task runs again), nor a report of an earlier run than the one placed last."""
        for item in items:
            if item.started_at is None or item.preempted or item.lost:
                continue
            rec = self.tasks.get(item.task_id)
            if rec is not None and item.attempt == rec.attempt:
                rec.started_at = item.started_at

    def task_cancelled(self, task: TaskSpec, now: float) -> None:
        """Its job was cancelled: dropped from the queue, or its run stopped. It does not run again."""
        rec = self.tasks.get(task.task_id)
        if rec is not None and self._advance(task.task_id, rec, Event.CANCELLED):
            self.ended_here.append(UnannouncedEnd.of(task, "cancelled", "job cancelled", rec, now))
            rec.failed_reason, rec.finished_at = "job cancelled", now
            self._ended(task.task_id, rec)

    def restore_end(self, task_id: str, state: str, reason: str, at: float | None) -> None:
        """Replay a task end a restarted GM learnt from its journal or an LM (it was announced then, so nothing is
        published again); `at` is its finish time as first recorded."""
        rec = self.tasks.get(task_id)
        if rec is not None and self._advance(task_id, rec, _ENDS[state]):
            rec.failed_reason, rec.finished_at = reason or None, at
            self._ended(task_id, rec)

    def _advance(self, task_id: str, rec: _Task, event: Event) -> bool:
        """Move a task along `event`: False for a no-op, and for an event the lifecycle does not allow (logged as
        an error and counted, the task left as it was)."""
        try:
            after = next_state(task_id, rec.life, event)
        except IllegalTransition as exc:
            self.illegal += 1
            log.error("%s: ignored", exc, extra=ids(gm=self.gm, task=task_id))
            return False
        if after == NO_OP:
            return False
        rec.life = after
        return True

    def _ids(self, task: TaskSpec, lm: int | None, node: int | None) -> dict[str, object]:
        return ids(
            job=task.job_id, task=task.task_id, attempt=task.attempt, gm=self.gm, lm=lm, node=node, user=task.user
        )

    def _ended(self, task_id: str, rec: _Task) -> None:
        """A task finished or failed; a job whose last task ended joins the finished jobs, and the oldest of those
        are forgotten while more than `finished_tasks_kept` finished tasks are held."""
        if self.on_end is not None:
            self.on_end(task_id, rec.state, rec.failed_reason or "")
        job_id = rec.job_id
        self._open_tasks -= 1
        job = self.jobs[job_id]
        job.open -= 1
        left = self.open_by_user[job.user] - 1
        if left:
            self.open_by_user[job.user] = left
        else:
            del self.open_by_user[job.user]
        if job.open:
            return
        if self.on_job_end is not None:
            self.on_job_end(job_id, self.job_state(job))
        self._finished_jobs.append(job_id)
        self._finished_tasks += len(job.task_ids)
        while self._finished_tasks > self.finished_tasks_kept and self._finished_jobs:
            old = self.jobs.pop(self._finished_jobs.popleft())
            for tid in old.task_ids:
                del self.tasks[tid]
            self._finished_tasks -= len(old.task_ids)
            self.dropped_jobs += 1

    def job_state(self, job: _Job) -> JobState:
        if job.cancelled:
            return "cancelled"
        states = [self.tasks[tid].state for tid in job.task_ids]
        if not job.open:
            return "failed" if "failed" in states else "finished"
        if job.waiting:
            return "waiting"
        return "running" if any(s not in ("queued", *ENDED) for s in states) else "queued"

    def summaries(self, user: str | None = None, state: str | None = None) -> list[JobSummary]:
        """Every job held (oldest first) of `user` and in `state`, when given."""
        out: list[JobSummary] = []
        for job_id, job in self.jobs.items():
            if user is not None and job.user != user:
                continue
            job_state = self.job_state(job)
            if state is not None and job_state != state:
                continue
            counts: dict[str, int] = {}
            for tid in job.task_ids:
                task_state = self.tasks[tid].state
                counts[task_state] = counts.get(task_state, 0) + 1
            out.append(
                JobSummary(
                    job_id=job_id,
                    user=job.user,
                    queue=job.user,
                    gm=self.gm,
                    state=job_state,
                    submitted_at=job.submitted_at,
                    tasks=len(job.task_ids),
                    task_states=counts,  # type: ignore[arg-type]
                    priority_class=None if self.class_name is None else self.class_name(job.priority),
                    gang=job.gang is not None,
                    array=job.array,
                    depends_on=list(job.depends_on),
                    retry=job.retry is not None,
                )
            )
        return out

    def status(self, job_id: str) -> JobStatus | None:
        job = self.jobs.get(job_id)
        if job is None:
            return None
        return JobStatus(
            job_id=job_id,
            user=job.user,
            gm=self.gm,
            state=self.job_state(job),
            depends_on=list(job.depends_on),
            array=job.array,
            retry=None if job.retry is None else RetryRuleModel.from_core(job.retry),
            priority_class=None if self.class_name is None else self.class_name(job.priority),
            gang=job.gang is not None,
            gang_timeout=job.gang if job.gang is not None and job.gang != math.inf else None,
            tasks=[
                TaskStatus(
                    task_id=tid,
                    state=r.state,
                    arrival=r.arrival,
                    launched_at=r.launched_at,  # type: ignore[arg-type]
                    started_at=r.started_at,
                    finished_at=r.finished_at,
                    lm=r.lm,
                    node=r.node,
                    attempts=r.attempts,
                    inconsistencies=r.inconsistencies,
                    repartitioned=r.repartitioned,
                    preemptions=r.preemptions,
                    retries=r.retries,
                    failed_reason=r.failed_reason,
                    failures_retried=r.failures_retried,
                    queueable=r.queueable,
                )
                for tid in job.task_ids
                for r in (self.tasks[tid],)
            ],
        )

    def where_ran(self, task_id: str, attempt: int | None) -> tuple[int, int] | None:
        """The (LM, node) of `attempt` of a task (its last placed run when None), for reading what that run
        printed; None when the task is not held, has not been placed on a node, or has no such run."""
        rec = self.tasks.get(task_id)
        if rec is None:
            return None
        if attempt is None or attempt == rec.attempt:
            return (rec.lm, rec.node) if rec.lm is not None and rec.node is not None else None
        for earlier, lm, node in reversed(rec.earlier or ()):
            if earlier == attempt:
                return lm, node
        return None

    def attempts_run(self, task_id: str) -> list[int]:
        """The attempts of a task placed on a node so far, oldest first."""
        rec = self.tasks.get(task_id)
        if rec is None:
            return []
        runs = {a for a, _, _ in rec.earlier or ()}
        if rec.lm is not None and rec.node is not None:
            runs.add(rec.attempt)
        return sorted(runs)

    def unfinished(self) -> int:
        """Tasks neither finished nor failed."""
        return self._open_tasks


def _ran(rec: _Task, attempt: int) -> None:
    """Remember where a run that is over without ending its task (lost, preempted) ran: its output stays there."""
    if rec.lm is not None and rec.node is not None:
        if rec.earlier is None:
            rec.earlier = []
        rec.earlier.append((attempt, rec.lm, rec.node))
