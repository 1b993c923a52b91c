"""The recorder: a core observer that fills one TaskRecord per task and one JobRecord per job."""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Sequence

from megha.common.core.messages import Placement
from megha.common.core.observer import CoreObserver
from megha.common.core.task import JobSpec, TaskSpec
from megha.loadgen.records import JobRecord, TaskRecord, record_finished, record_preempted


class Recorder(CoreObserver):
    """Collects what happened to every task, from the events the GM, LM and worker cores report."""

    def __init__(self) -> None:
        self.tasks: dict[str, TaskRecord] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.finished_count = 0
        self.failed_count = 0  # failure reports (a task is reported once; with retries and restarts, perhaps more)
        # Runs cut short by preemption: (task id, started_at, preempted_at), for per-user usage over time.
        self.preempted_runs: list[tuple[str, float, float]] = []

    def expect(self, gm: int, job: JobSpec) -> None:
        """Register a job before it is submitted (so rejected jobs are reported too)."""
        self.jobs[job.job_id] = JobRecord(
            job.job_id, gm, job.submitted_at, len(job.tasks), max((t.duration for t in job.tasks), default=0.0)
        )
        for t in job.tasks:
            self.tasks[t.task_id] = TaskRecord(t.task_id, job.job_id, gm, t.user, t.duration, t.request)

    def job_arrived(self, job: JobSpec, gm: int, now: float) -> None:
        tasks = self.tasks
        for t in job.tasks:
            tasks[t.task_id].arrival = now

    def job_rejected(self, job: JobSpec, gm: int, reason: str, now: float) -> None:
        self.jobs[job.job_id].rejected_reason = reason
        for t in job.tasks:
            self.tasks[t.task_id].failed_reason = f"rejected at submission: {reason}"
        self.failed_count += len(job.tasks)

    def attempt(self, task: TaskSpec, now: float) -> None:
        rec = self.tasks[task.task_id]
        rec.attempts += 1
        rec.attempt_at = now

    def rescheduled(self, task: TaskSpec, now: float) -> None:
        self.tasks[task.task_id].reschedules += 1

    def decided(self, placements: Sequence[Placement], now: float) -> None:
        tasks = self.tasks
        for p in placements:
            rec = tasks[p.task.task_id]
            rec.decided_at = now
            rec.lm = p.lm
            rec.node = p.node
            rec.repartitioned = p.repartition

    def inconsistency(self, placement: Placement, now: float) -> None:
        self.tasks[placement.task.task_id].inconsistencies += 1

    def lm_received(self, placements: Sequence[Placement], now: float) -> None:
        tasks = self.tasks
        for p in placements:
            tasks[p.task.task_id].lm_received_at = now

    def launched(self, placements: Sequence[Placement], now: float) -> None:
        tasks = self.tasks
        for p in placements:
            rec = tasks[p.task.task_id]
            rec.launched_at = now
            rec.node = p.node  # the LM's word: a preemption request names no node until the LM picks one
            rec.repartitioned = p.repartition  # ... nor whose partition the node is in

    def worker_received(self, placements: Sequence[Placement], now: float) -> None:
        tasks = self.tasks
        for p in placements:
            tasks[p.task.task_id].worker_received_at = now

    def started(self, placements: Sequence[Placement], now: float) -> None:
        tasks = self.tasks
        for p in placements:
            tasks[p.task.task_id].started_at = now

    def finished(self, task_ids: Sequence[str], now: float) -> None:
        record_finished(self.tasks, self.jobs, task_ids, now)
        self.finished_count += len(task_ids)

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None:
        self.tasks[task.task_id].failed_reason = reason
        self.failed_count += 1

    def task_lost(self, task: TaskSpec, reason: str, now: float) -> None:
        """Its worker crashed: the work the run had done is thrown away (its CPU request for as long as it ran,
        at most its duration; the loss is noticed later than the crash, so this may count a little too much)."""
        rec = self.tasks[task.task_id]
        rec.retries += 1
        if rec.started_at == rec.started_at:  # not NaN
            ran = min(task.duration, max(0.0, now - rec.started_at))
            rec.lost_cpu_seconds += ran * rec.request[0] / 1000

    def preemption_attempted(self, task: TaskSpec, lm: int, now: float) -> None:
        self.tasks[task.task_id].preemption_attempts += 1

    def preempted(self, task_ids: Sequence[str], now: float) -> None:
        tasks = self.tasks
        for task_id in task_ids:
            rec = tasks[task_id]
            record_preempted(rec, now)
            self.preempted_runs.append((task_id, rec.started_at, now))

    def mark_stranded(self, task_ids: Sequence[str], reason: str) -> None:
        """Tasks the run ended without placing: reported failed with `reason`, never silently dropped."""
        for task_id in task_ids:
            self.tasks[task_id].failed_reason = reason


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
