"""Generated workloads for the experiments, written as `.tr` files: Poisson arrivals of synthetic jobs at a target
load, and a trace's own jobs re-timed to a target load."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from megha.loadgen.trace import TraceJob


@dataclass(frozen=True, slots=True)
class PoissonLoad:
    """Jobs of `tasks_per_job` tasks of `duration` s arriving as a Poisson process that keeps `load` of the
    workers busy on average, for `seconds`."""

    load: float = 0.8
    tasks_per_job: int = 100
    seconds: float = 30.0
    duration: float = 1.0

    def write(self, path: Path, workers: int, seed: int) -> int:
        """Write the trace for `workers` as a `.tr` file; returns the number of jobs."""
        rate = self.load * workers / (self.tasks_per_job * self.duration)
        rand = random.Random(f"poisson:{seed}")
        jobs = []
        at = rand.expovariate(rate)
        while at <= self.seconds:
            jobs.append(TraceJob(at, (self.duration,) * self.tasks_per_job))
            at += rand.expovariate(rate)
        write_trace(path, jobs)
        return len(jobs)


def retime(jobs: Sequence[TraceJob], workers: int, load: float, seed: int) -> list[TraceJob]:
    """The same jobs (tasks and durations, in order) arriving as a Poisson process whose rate offers `load` of
    `workers` on average: rate = load x workers / (mean task-seconds per job)."""
    work = sum(sum(job.durations) for job in jobs)
    if not jobs or work <= 0:
        return list(jobs)
    rate = load * workers * len(jobs) / work
    rand = random.Random(f"retime:{seed}")
    at = 0.0
    retimed = []
    for job in jobs:
        retimed.append(TraceJob(at, job.durations))
        at += rand.expovariate(rate)
    return retimed


def write_trace(path: Path, jobs: Sequence[TraceJob]) -> None:
    """`arrival num_tasks mean_duration d1 ... dn`, one job a line (the `.tr` format)."""
    lines = [
        f"{job.arrival:.6f} {len(job.durations)} {sum(job.durations) / len(job.durations):.6f} "
        + " ".join(f"{d:.6f}" for d in job.durations)
        + "\n"
        for job in jobs
        if job.durations
    ]
    path.write_text("".join(lines))
