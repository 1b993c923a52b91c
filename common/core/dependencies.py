"""Job dependencies in the core: the gate that holds jobs waiting for their parents (`JobSpec.depends_on`) and lets
them into the queue, or fails them, as their parents end; and `JobEnds`, the observer that tells a driver when a
job ended and how (the simulator and the embedded mode route those ends to the GMs that wait on them).

The gate knows nothing of where a parent runs: a driver tells it "parent P ended with outcome O" (`parent_ended`),
from its own job table (the services) or from `JobEnds` (one process). A parent that finished frees its children
of it; one that failed or was cancelled fails them, each task's reason naming the parent. Telling the gate the same
end twice, or the end of a job nobody waits for, changes nothing, so drivers may re-check and resend freely.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from megha.common.core.observer import CoreObserver
from megha.common.core.task import JobSpec, TaskSpec

FINISHED = "finished"
FAILED = "failed"
CANCELLED = "cancelled"
FORGOTTEN = "forgotten"
OUTCOMES = (FINISHED, FAILED, CANCELLED, FORGOTTEN)
"""How a parent job can end: every task finished; one failed (or it was rejected); it was cancelled; or its GM no
longer knows it (it forgot the finished job, or lost it), so nobody can say."""

_WHY = {
    FAILED: "failed",
    CANCELLED: "was cancelled",
    FORGOTTEN: "is no longer known to its GM (forgotten or lost)",
}


@dataclass(frozen=True, slots=True)
class ParentEnded:
    """To a GM: job `job_id`, which some of its jobs may wait for, ended with `outcome` (one of OUTCOMES)."""

    job_id: str
    outcome: str


@dataclass(slots=True)
class _Waiting:
    job: JobSpec
    unmet: set[str]  # parents that have not ended yet


class DependencyGate:
    """The jobs of one GM waiting for their parents, and for each awaited parent the jobs that wait for it."""

    def __init__(self) -> None:
        self.jobs: dict[str, _Waiting] = {}  # waiting job id -> the job and its parents not yet ended
        self.children: dict[str, list[str]] = {}  # awaited parent id -> the waiting jobs that name it

    def __len__(self) -> int:
        return len(self.jobs)

    def cycle(self, job: JobSpec) -> list[str] | None:
        """The dependency cycle `job` would close, as the ids along it ("a" depends on "b" ... depends on "a"),
        or None. Only waiting jobs have unmet parents, so a cycle runs through `job` and waiting jobs only."""
        if job.job_id in job.depends_on:
            return [job.job_id, job.job_id]
        named_by = {p: job.job_id for p in job.depends_on if p in self.jobs}  # job reached -> its child on the way
        todo = list(named_by)
        while todo:
            child = todo.pop()
            for parent in self.jobs[child].unmet:
                if parent == job.job_id:
                    path = [child]
                    while path[-1] != job.job_id:
                        path.append(named_by[path[-1]])
                    return [*reversed(path), job.job_id]
                if parent in self.jobs and parent not in named_by:
                    named_by[parent] = child
                    todo.append(parent)
        return None

    def hold(self, job: JobSpec) -> None:
        """Park `job` until each of its parents ended (`parent_ended`)."""
        self.jobs[job.job_id] = _Waiting(job, set(job.depends_on))
        for parent in dict.fromkeys(job.depends_on):  # a parent named twice waits once
            self.children.setdefault(parent, []).append(job.job_id)

    def parent_ended(self, parent: str, outcome: str) -> tuple[list[JobSpec], list[tuple[JobSpec, str]]]:
        """Parent `parent` ended with `outcome`: the jobs whose last awaited parent it was (to queue), and the jobs
        that now fail without running, with the reason (to fail, every task)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"parent {parent}: outcome {outcome!r} is none of {OUTCOMES}")
        released: list[JobSpec] = []
        failed: list[tuple[JobSpec, str]] = []
        for child in self.children.pop(parent, ()):
            waiting = self.jobs.get(child)
            if waiting is None:
                continue  # failed through another parent, or cancelled, already
            if outcome != FINISHED:
                self.remove(child)
                failed.append((waiting.job, f"dependency: parent job {parent} {_WHY[outcome]}; this job did not run"))
                continue
            waiting.unmet.discard(parent)
            if not waiting.unmet:
                del self.jobs[child]
                released.append(waiting.job)
        return released, failed

    def remove(self, job_id: str) -> JobSpec | None:
        """Take a waiting job out (cancelled, or failed): its tasks, or None when it is not waiting."""
        waiting = self.jobs.pop(job_id, None)
        if waiting is None:
            return None
        for parent in waiting.unmet:
            siblings = self.children.get(parent)
            if siblings is not None:
                siblings.remove(job_id)
                if not siblings:
                    del self.children[parent]
        return waiting.job

    def jobs_of(self, task_ids: Iterable[str]) -> list[str]:
        """The waiting jobs that hold any of these tasks."""
        wanted = set(task_ids)
        named = {tid.rpartition(".")[0] for tid in wanted} & self.jobs.keys()  # task i of job J is "J.i"
        jobs = named if named else self.jobs.keys()  # else look at every waiting job's tasks
        return [job_id for job_id in jobs if any(t.task_id in wanted for t in self.jobs[job_id].job.tasks)]

    def awaited(self) -> list[str]:
        """The parents some waiting job still waits for (a driver re-checks them)."""
        return list(self.children)

    def tasks(self) -> list[TaskSpec]:
        """The tasks of every waiting job."""
        return [t for w in self.jobs.values() for t in w.job.tasks]


class JobEnds(CoreObserver):
    """Tells `on_end(job_id, outcome, now)` when each job the GM cores accepted ended: once every task finished,
    failed or was cancelled (a job rejected at submission ends `failed` at once). The outcome is `cancelled` when
    a task was cancelled, else `failed` when one failed, else `finished`. `ended` keeps every outcome, so a child
    submitted after its parent ended learns it (`outcome`)."""

    def __init__(self, on_end: Callable[[str, str, float], None]) -> None:
        self.on_end = on_end
        self.open: dict[str, list[int]] = {}  # job id -> [tasks not ended, worst outcome so far (OUTCOMES index)]
        self.ended: dict[str, str] = {}  # job id -> its outcome
        self._early: dict[str, int] = {}  # jobs whose tasks were dropped at submission, before they arrived

    def outcome(self, job_id: str) -> str | None:
        """How job `job_id` ended, or None while it runs (or was never submitted)."""
        return self.ended.get(job_id)

    def known(self, job_id: str) -> bool:
        """Whether a GM accepted (or rejected) job `job_id`."""
        return job_id in self.open or job_id in self.ended

    def job_arrived(self, job: JobSpec, gm: int, now: float) -> None:
        self.open[job.job_id] = [len(job.tasks), self._early.pop(job.job_id, 0)]
        if not job.tasks:
            self._end(job.job_id, now)

    def job_rejected(self, job: JobSpec, gm: int, reason: str, now: float) -> None:
        self.ended[job.job_id] = FAILED
        self.on_end(job.job_id, FAILED, now)

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool) -> None:
        self._task_ended(task.job_id, 1 if error else 0, now)

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None:
        if task.job_id not in self.open:  # dropped at submission: its job arrives without it
            self._early[task.job_id] = 1
            return
        self._task_ended(task.job_id, 1, now)

    def task_cancelled(self, task: TaskSpec, now: float) -> None:
        self._task_ended(task.job_id, 2, now)

    def _task_ended(self, job_id: str, outcome: int, now: float) -> None:
        entry = self.open.get(job_id)
        if entry is None:
            return
        entry[0] -= 1
        entry[1] = max(entry[1], outcome)
        if not entry[0]:
            self._end(job_id, now)

    def _end(self, job_id: str, now: float) -> None:
        outcome = OUTCOMES[self.open.pop(job_id)[1]]
        self.ended[job_id] = outcome
        self.on_end(job_id, outcome, now)
