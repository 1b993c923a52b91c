"""The GM service's job table: what GET /v1/jobs/{id} reports, filled from the GM core's observer events."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from megha.common.core.messages import Placement
from megha.common.core.observer import CoreObserver
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.models import JobStatus, TaskStatus


@dataclass(slots=True)
class _Task:
    state: str = "queued"
    arrival: float | None = None
    launched_at: float | None = None
    finished_at: float | None = None
    lm: int | None = None
    node: int | None = None
    attempts: int = 0
    inconsistencies: int = 0
    repartitioned: bool = False
    preemptions: int = 0
    failed_reason: str | None = None


@dataclass(slots=True)
class _Job:
    user: str
    task_ids: list[str] = field(default_factory=list)


class JobTable(CoreObserver):
    """Per-task state at this GM: queued -> launched -> finished (or failed, with the reason)."""

    def __init__(self, gm: int) -> None:
        self.gm = gm
        self.jobs: dict[str, _Job] = {}
        self.tasks: dict[str, _Task] = {}

    def job_arrived(self, job: JobSpec, gm: int, now: float) -> None:
        """A task's arrival is when its job's request reached the GM (the service stamps that as
        `submitted_at`), so allocation time includes reading and validating the submission."""
        self.jobs[job.job_id] = _Job(job.tasks[0].user, [t.task_id for t in job.tasks])
        for t in job.tasks:
            self.tasks[t.task_id] = _Task(arrival=job.submitted_at)

    def attempt(self, task: TaskSpec, now: float) -> None:
        self.tasks[task.task_id].attempts += 1

    def decided(self, placements: Sequence[Placement], now: float) -> None:
        for p in placements:
            rec = self.tasks[p.task.task_id]
            rec.state, rec.launched_at, rec.lm, rec.node, rec.repartitioned = (
                "launched",
                now,
                p.lm,
                p.node if p.node >= 0 else None,  # a preemption request leaves the node to the LM
                p.repartition,
            )

    def inconsistency(self, placement: Placement, now: float) -> None:
        rec = self.tasks[placement.task.task_id]
        rec.inconsistencies += 1
        rec.state = "queued"

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None:
        rec = self.tasks[task.task_id]
        rec.state, rec.failed_reason = "failed", reason

    def placed_by_preemption(self, placement: Placement) -> None:
        """The LM chose the node for a task it made room for by preemption."""
        rec = self.tasks.get(placement.task.task_id)
        if rec is not None:
            rec.node, rec.repartitioned = placement.node, placement.repartition

    def preempted(self, task_id: str) -> None:
        """Stopped for another user's task: back in its queue, to run again."""
        rec = self.tasks.get(task_id)
        if rec is not None and rec.state == "launched":
            rec.state = "queued"
            rec.preemptions += 1

    def completed(self, task_id: str, now: float, error: str = "") -> None:
        rec = self.tasks.get(task_id)
        if rec is not None and rec.state != "finished":
            rec.finished_at = now
            rec.state = "failed" if error else "finished"
            rec.failed_reason = error or None

    def status(self, job_id: str) -> JobStatus | None:
        job = self.jobs.get(job_id)
        if job is None:
            return None
        return JobStatus(
            job_id=job_id,
            user=job.user,
            gm=self.gm,
            tasks=[
                TaskStatus(
                    task_id=tid,
                    state=r.state,
                    arrival=r.arrival,
                    launched_at=r.launched_at,  # type: ignore[arg-type]
                    finished_at=r.finished_at,
                    lm=r.lm,
                    node=r.node,
                    attempts=r.attempts,
                    inconsistencies=r.inconsistencies,
                    repartitioned=r.repartitioned,
                    preemptions=r.preemptions,
                    failed_reason=r.failed_reason,
                )
                for tid in job.task_ids
                for r in (self.tasks[tid],)
            ],
        )

    def unfinished(self) -> int:
        return sum(1 for r in self.tasks.values() if r.state not in ("finished", "failed"))
