"""Benchmark: the load generator's memory per task, in process, without services or a broker.

It builds a synthetic workload of N one-second tasks (jobs of 50 tasks, as `syn:50:<jobs>`), then, under
`tracemalloc`, registers every job with the services' recorder (`EventRecorder`) and feeds it each task's events
as the services publish them: a batch of `started` events, then a batch of `finished` ones, each batch parsed from
its JSON body as the load generator's consumer does, a tenth of the batches delivered twice (publishing is at
least once). It reports the bytes the recorder still holds per task once every task ended, and the peak. The
workload itself (the `JobSpec`s the replay submits) is built before tracing starts and is not counted.

For comparison it does the same for the embedded replay's recorder (`Recorder`), fed the core's events of each task
(arrival, attempt, decision, LM and worker receipt, launch, start, finish).

    python bench/loadgen_memory.py                  # N = 100,000
    python bench/loadgen_memory.py --tasks 600000
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import subprocess
import sys
import time
import tracemalloc

from megha.common.core.messages import Placement
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.models import TaskEvents
from megha.loadgen.events import EventRecorder
from megha.loadgen.recorder import Recorder

JOB_TASKS = 50
BATCH = 100  # task events per message on the events exchange


def workload(tasks: int) -> list[JobSpec]:
    jobs = []
    for j in range(tasks // JOB_TASKS):
        job_id = f"b1c2d3-job-{j}"
        specs = tuple(
            TaskSpec(f"{job_id}.{i}", job_id, "user-0", 1.0, (1000, 1024), 1 << (i % 21)) for i in range(JOB_TASKS)
        )
        jobs.append(JobSpec(job_id, specs, float(j)))
    return jobs


def bodies(jobs: list[JobSpec], kind: str, at: float) -> list[bytes]:
    """The task events of every task as the JSON bodies the services publish, BATCH to a body."""
    events = [
        {"kind": kind, "task_id": t.task_id, "job_id": job.job_id, "lm": 0, "node": i, "at": at + i * 1e-3}
        for job in jobs
        for i, t in enumerate(job.tasks)
    ]
    return [json.dumps({"events": events[k : k + BATCH]}).encode() for k in range(0, len(events), BATCH)]


def services(jobs: list[JobSpec]) -> tuple[int, int]:
    """(bytes held, peak bytes) of the services' recorder after every task started and finished."""
    messages = [*bodies(jobs, "started", 1.0e9), *bodies(jobs, "finished", 1.0e9 + 1.5)]
    gc.collect()
    tracemalloc.start()
    recorder = EventRecorder()
    for job in jobs:
        recorder.expect(0, job)
    for n, body in enumerate(messages):
        for _ in range(2 if n % 10 == 0 else 1):
            for event in TaskEvents.model_validate_json(body).events:
                recorder.record(event, event.at - 1.0e9)
    gc.collect()
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert sum(r.completions == 1 for r in recorder.tasks.values()) == sum(len(j.tasks) for j in jobs)
    return held, peak


def embedded(jobs: list[JobSpec]) -> tuple[int, int]:
    """(bytes held, peak bytes) of the embedded replay's recorder after every task ran through the core's events."""
    gc.collect()
    tracemalloc.start()
    recorder = Recorder()
    for job in jobs:
        recorder.expect(0, job)
    for job in jobs:
        now = job.submitted_at
        recorder.job_arrived(job, 0, now)
        placements = [Placement(t, 0, i % 400, False) for i, t in enumerate(job.tasks)]
        for t in job.tasks:
            recorder.attempt(t, now)
        for step, event in enumerate(
            (recorder.decided, recorder.lm_received, recorder.launched, recorder.worker_received, recorder.started)
        ):
            event(placements, now + step * 1e-3)
        recorder.finished([t.task_id for t in job.tasks], now + 1.0)
    gc.collect()
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return held, peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=100_000, help="N, tasks fed through each recorder")
    args = parser.parse_args()
    jobs = workload(args.tasks)
    tasks = len(jobs) * JOB_TASKS
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"{time.strftime('%Y-%m-%d')}, commit {commit}, {platform.machine()}, Python {platform.python_version()}")
    print(f"{tasks:,} tasks in {len(jobs):,} jobs")
    print()
    print("| recorder | bytes per task held | peak bytes per task |")
    print("| --- | --- | --- |")
    for name, measure in (("load generator (EventRecorder)", services), ("embedded replay (Recorder)", embedded)):
        held, peak = measure(jobs)
        print(f"| {name} | {held / tasks:,.0f} | {peak / tasks:,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
