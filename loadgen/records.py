"""Per-task and per-job measurement records, filled while a replay runs and read by the report."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

NAN = math.nan


@dataclass(slots=True)
class TaskRecord:
    """Everything measured about one task. Times are seconds on the run's clock; NaN means "did not happen".

    Allocation time (Megha paper, section III) = started_at - arrival, split into
    framework queuing (attempt_at - arrival), processing ((decided_at - attempt_at) + (launched_at - lm_received_at)),
    communication ((lm_received_at - decided_at) + (worker_received_at - launched_at)) and
    worker queuing (started_at - worker_received_at).
    """

    task_id: str
    job_id: str
    gm: int
    user: str
    duration: float
    request: tuple[int, ...]
    arrival: float = NAN  # inserted into the GM's request queue
    attempt_at: float = NAN  # start of the scheduling attempt that succeeded
    decided_at: float = NAN  # GM sent the placement to the LM
    lm_received_at: float = NAN
    launched_at: float = NAN  # LM validated the placement and sent it to the worker
    worker_received_at: float = NAN
    started_at: float = NAN
    finished_at: float = NAN
    attempts: int = 0  # scheduling attempts at the GM (1 when placed at once)
    reschedules: int = 0  # times the task went to the back of the GM's queue because nothing fitted
    inconsistencies: int = 0  # placements the LM rejected because the GM's view was stale
    repartitioned: bool = False
    lm: int = -1
    node: int = -1  # LM-local physical node index
    completions: int = 0  # how many times the task finished (must end at exactly 1)
    failed_reason: str = ""
    preemption_attempts: int = 0  # preemption requests its GM sent to make room for it
    preemptions: int = 0  # times it was stopped to make room for another user's task (then ran again)
    lost_cpu_seconds: float = 0.0  # CPU-seconds of work thrown away by those preemptions
    retries: int = 0  # times it ran again because its worker was lost

    @property
    def allocation_time(self) -> float:
        return self.started_at - self.arrival

    @property
    def framework_queuing(self) -> float:
        return self.attempt_at - self.arrival

    @property
    def processing(self) -> float:
        return (self.decided_at - self.attempt_at) + (self.launched_at - self.lm_received_at)

    @property
    def communication(self) -> float:
        return (self.lm_received_at - self.decided_at) + (self.worker_received_at - self.launched_at)

    @property
    def worker_queuing(self) -> float:
        return self.started_at - self.worker_received_at


@dataclass(slots=True)
class JobRecord:
    """One job. JRT delay (constraint-aware paper, eq. 1) = actual JRT - ideal JRT, ideal = the longest task."""

    job_id: str
    gm: int
    submitted_at: float
    num_tasks: int
    ideal_jrt: float
    finished_tasks: int = 0
    finished_at: float = NAN
    rejected_reason: str = ""

    @property
    def jrt(self) -> float:
        return self.finished_at - self.submitted_at

    @property
    def jrt_delay(self) -> float:
        return self.jrt - self.ideal_jrt


# The steps of a task's lifecycle that both the replay's recorder (core events) and the services' load generator
# (task events from RabbitMQ) record: one definition of what each does to the records.


def record_finished(
    tasks: Mapping[str, TaskRecord], jobs: Mapping[str, JobRecord], task_ids: Iterable[str], at: float
) -> None:
    """Runs of these tasks finished at `at`: one completion each; a job finishes with its last task. (A batch at a
    time: the simulator's recorder calls it for every batch of finished tasks.)"""
    for task_id in task_ids:
        rec = tasks[task_id]
        rec.completions += 1
        rec.finished_at = at
        job = jobs[rec.job_id]
        job.finished_tasks += 1
        if job.finished_tasks == job.num_tasks:
            job.finished_at = at


def record_preempted(rec: TaskRecord, at: float) -> None:
    """The task's run was stopped at `at` for another user's task: the CPU-seconds it had run are lost."""
    rec.preemptions += 1
    if not math.isnan(rec.started_at):
        rec.lost_cpu_seconds += rec.request[0] / 1000 * max(0.0, at - rec.started_at)
