"""The request generator for the services: replays a trace against the GM services over REST in open loop,
collects task events from RabbitMQ, asks the GMs how each task was placed, and reports like `megha replay`.

    python -m megha.loadgen.services        # configured by MEGHA_* variables (LoadgenSettings)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from pydantic_core import to_json

from megha.common.core.constraints import constraint_ids
from megha.common.core.resources import DEFAULT_RESOURCE_NAMES
from megha.common.core.task import JobSpec
from megha.common.models import JobStatus, TaskEvent, TaskEvents
from megha.common.settings import LoadgenSettings, load_settings
from megha.common.transport.inmemory import fewer_gc_pauses
from megha.common.transport.rabbit import Broker, loadgen_queue
from megha.loadgen.metrics import RunMetrics, compute_metrics
from megha.loadgen.progress import Progress
from megha.loadgen.records import JobRecord, TaskRecord, record_finished, record_preempted
from megha.loadgen.trace import demo_trace_path, resolve_trace
from megha.loadgen.workload import WorkloadConfig, build_workload
from megha.services.http import CallError, ServiceClient, configure_logging, use_tls_ca

log = logging.getLogger("megha.loadgen")

THROTTLED_PAUSE = 2.0
"""Seconds before a job a GM answered 429 (its user's unfinished tasks at MEGHA_MAX_UNFINISHED_TASKS_PER_USER) is
submitted again (the GM's Retry-After)."""
SUBMIT_RETRY_SECONDS = 120.0
"""How long a submission whose GM is unreachable (or answers 5xx) is retried: a GM that restarts gets it."""
DETAIL_CALLS = 32
"""How many GET /v1/jobs/{id} calls the generator has in flight at once after a replay."""


@dataclass
class ServicesRun:
    """What a replay against the services measured. Times in the records are seconds since the replay began."""

    tasks: dict[str, TaskRecord]
    jobs: dict[str, JobRecord]
    events: dict[str, list[TaskEvent]] = field(default_factory=dict)
    metrics: RunMetrics | None = None
    wall_seconds: float = 0.0
    timed_out: list[str] = field(default_factory=list)
    details_gone: int = 0  # jobs whose GM had already forgotten them (MEGHA_FINISHED_TASKS_KEPT) when asked


def apply_event(run: ServicesRun, rec: TaskRecord, event: TaskEvent, at: float) -> bool:
    """Record one task event (`at`: seconds since the replay began); True when the task has ended. A preempted
    task has not: it waits in its user's queue and runs again; nor has a lost one (it runs again as its next
    attempt, or its GM fails it)."""
    if event.kind == "started":
        rec.started_at = rec.worker_received_at = at
        return False
    if event.kind == "lost":
        rec.retries += 1
        return False
    if event.kind == "preempted":
        record_preempted(rec, at)
        return False
    rec.finished_at = at
    if event.kind == "finished":
        record_finished(run.tasks, run.jobs, (rec.task_id,), at)
    elif not rec.failed_reason:  # the first reason given is the cause; later ones are its echoes
        rec.failed_reason = f"{event.kind}: {event.error}"
    return True


def submission_body(job: JobSpec) -> bytes:
    """The JSON of the job's `JobSubmission`, made before the replay starts so that submitting costs little."""
    return to_json(
        {
            "job_id": job.job_id,
            "user": job.tasks[0].user,
            "tasks": [
                {
                    "duration": t.duration,
                    "cpu_millicores": t.request[0],
                    "memory_mb": t.request[1],
                    "constraints": constraint_ids(t.constraints),
                }
                for t in job.tasks
            ],
        }
    )


async def replay_services(
    settings: LoadgenSettings, progress: Progress | None = None, broker: Broker | None = None
) -> ServicesRun:
    """Submit every job of the trace at its (scaled) arrival time and wait until every accepted task ended;
    `progress` says what runs and, on a terminal, shows a bar of the tasks ended. The generator collects young
    objects rarely meanwhile: a collection pause would delay submissions and events."""
    with fewer_gc_pauses():
        return await _replay(settings, progress, broker)


async def _replay(settings: LoadgenSettings, progress: Progress | None, broker: Broker | None) -> ServicesRun:
    trace = str(demo_trace_path()) if settings.trace == "demo" else settings.trace
    workload = build_workload(
        resolve_trace(trace, settings.first_jobs, settings.time_scale),
        WorkloadConfig(
            settings.mode,
            settings.seed,
            len(settings.gm_urls),
            (settings.node_cpu_millicores, settings.node_memory_mb),
            cpu_scale=settings.cpu_scale,
            mem_scale=settings.mem_scale,
            job_prefix=f"{uuid.uuid4().hex[:6]}-",
            queues=fairness.queues if (fairness := settings.fairness()) is not None else (),
        ),
    )
    bodies = {job.job_id: submission_body(job) for _, job in workload}
    run = ServicesRun({}, {})
    for gm, job in workload:
        run.jobs[job.job_id] = JobRecord(job.job_id, gm, math.nan, len(job.tasks), max(t.duration for t in job.tasks))
        for t in job.tasks:
            run.tasks[t.task_id] = TaskRecord(t.task_id, job.job_id, gm, t.user, t.duration, t.request)
    say = progress.note if progress is not None else _silent
    own_broker = broker is None
    broker = broker or settings.broker()
    if own_broker:
        await broker.connect()
    queue = loadgen_queue(settings.run_id)
    start = time.time()
    pending: set[str] = set()  # accepted tasks not yet ended
    ended: set[str] = set()  # tasks whose end event arrived (possibly before their job's 201)
    all_done = asyncio.Event()

    async def on_events(body: bytes) -> None:
        for event in TaskEvents.model_validate_json(body).events:
            on_event(event)

    seen: set[tuple[str, int, str, float]] = set()

    def on_event(event: TaskEvent) -> None:
        rec = run.tasks.get(event.task_id)
        if rec is None:
            return  # another run's task on a shared broker
        key = (event.task_id, event.attempt, event.kind, event.at)
        if key in seen:
            return  # delivered again (publishing is at least once)
        seen.add(key)
        run.events.setdefault(event.task_id, []).append(event)
        if apply_event(run, rec, event, event.at - start):
            ended.add(event.task_id)
            pending.discard(event.task_id)
            if not pending and submitted_all:
                all_done.set()

    submitted_all = False
    await broker.consume("events", "", on_events, queue=queue)
    say(f"replaying {len(workload)} jobs ({len(run.tasks)} tasks) against {len(settings.gm_urls)} GMs")
    use_tls_ca(settings.tls_ca)  # the GMs' certificates are verified with MEGHA_TLS_CA
    http = ServiceClient(timeout=30.0, authorization=settings.credentials())
    submits: list[asyncio.Task[None]] = []
    try:
        async with _showing(progress, run, ended, submits, len(workload)):
            for gm, job in workload:
                delay = start + job.submitted_at - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                urls, body = _ring(settings.gm_urls, gm), bodies.pop(job.job_id)
                submits.append(asyncio.create_task(_submit(http, urls, job, body, run, pending, ended, start)))
            await asyncio.gather(*submits)
            submitted_all = True
            if not pending:
                all_done.set()
            say(f"submitted; waiting for {len(pending)} tasks")
            try:
                await asyncio.wait_for(all_done.wait(), settings.timeout)
            except TimeoutError:
                run.timed_out = sorted(pending)
                for task_id in pending:
                    run.tasks[task_id].failed_reason = f"no completion within {settings.timeout} s of the last submit"
        run.wall_seconds = time.time() - start
        capacity = await _total_capacity(http, settings.gm_urls)
        asking = asyncio.Semaphore(DETAIL_CALLS)
        await asyncio.gather(
            *(
                _placement_details(http, asking, _ring(settings.gm_urls, r.gm), r, run, start)
                for r in run.jobs.values()
                if not r.rejected_reason
            )
        )
        if run.details_gone:
            say(
                f"{run.details_gone} finished jobs were gone from their GM when asked for placement details (a GM "
                "keeps MEGHA_FINISHED_TASKS_KEPT finished tasks); their allocation times are unknown"
            )
    finally:  # also when interrupted (Ctrl-C cancels the replay): the broker connection closes cleanly
        await http.aclose()
        with contextlib.suppress(Exception):
            await broker.delete_queue(queue)
        if own_broker:
            await broker.close(flush_timeout=1.0)
    run.metrics = compute_metrics(
        list(run.tasks.values()),
        list(run.jobs.values()),
        capacity,
        DEFAULT_RESOURCE_NAMES,
        run.wall_seconds,
    )
    return run


def _silent(line: str) -> None:
    """No progress asked for: nothing to say."""


@contextlib.asynccontextmanager
async def _showing(
    progress: Progress | None, run: ServicesRun, ended: set[str], submits: list[asyncio.Task[None]], jobs: int
) -> AsyncIterator[None]:
    """On a terminal, a bar of the tasks ended of the tasks accepted, moved four times a second. While jobs are
    still to be submitted their tasks count too, so that the time left covers the whole replay."""
    if progress is None or not progress.bar:
        yield
        return
    with progress.track("replaying", len(run.tasks), "tasks") as advance:

        async def show() -> None:
            while True:
                rejected = sum(j.num_tasks for j in run.jobs.values() if j.rejected_reason)
                advance(len(ended), f"{len(submits):,}/{jobs:,} jobs submitted", len(run.tasks) - rejected)
                await asyncio.sleep(0.25)

        showing = asyncio.create_task(show())
        try:
            yield
        finally:
            showing.cancel()


async def _total_capacity(http: ServiceClient, urls: list[str]) -> tuple[int, ...]:
    """The data centre's capacity, from the first GM that answers."""
    failures = []
    for url in urls:
        try:
            r = await http.get(f"{url}/v1/state")
        except CallError as exc:
            failures.append(str(exc))
            continue
        if r.status == 200:
            return tuple(json.loads(r.body)["total_capacity"])
        failures.append(f"{url}: {r.status}")
    raise RuntimeError(f"no GM answered GET /v1/state: {'; '.join(failures)}")


def _ring(urls: list[str], gm: int) -> list[str]:
    """The GM a job is for, then the next GM of the ring: the one that stands in for it when it stays down."""
    return [urls[gm], urls[(gm + 1) % len(urls)]] if len(urls) > 1 else [urls[gm]]


async def _submit(
    http: ServiceClient,
    urls: list[str],
    job: JobSpec,
    body: bytes,
    run: ServicesRun,
    pending: set[str],
    ended: set[str],
    start: float,
) -> None:
    """POST the job to its GM. The job id is ours, so a submission that failed in transit (or met a GM
    restarting) is retried for up to SUBMIT_RETRY_SECONDS, alternating with the next GM, which takes the job
    for the GM (`?gm=`) once it stands in for it; a 409 on a retry means an earlier attempt was accepted. Only the
    job's own GM refuses it for good (a 4xx)."""
    record = run.jobs[job.job_id]
    record.submitted_at = time.time() - start
    deadline = time.monotonic() + SUBMIT_RETRY_SECONDS
    attempt = throttled = 0
    while True:
        url = urls[(attempt - throttled) % len(urls)] if attempt else urls[0]
        attempt += 1
        try:
            r = await http.post(f"{url}/v1/jobs?gm={record.gm}", body)
        except CallError as exc:
            reason = str(exc)
        else:
            if r.status == 201 or (r.status == 409 and attempt > 1):
                pending.update(t.task_id for t in job.tasks if t.task_id not in ended)
                return
            reason = f"{r.status}: {r.text}"
            if r.status == 429:  # the user's unfinished tasks are at the GM's bound: wait for some to end
                throttled += 1  # asked again of the same GM, for as long as it keeps answering so
                deadline = time.monotonic() + SUBMIT_RETRY_SECONDS
                if throttled == 1 or throttled % 30 == 0:
                    log.info("GM at %s holds %s back (%d times): %s", url, job.job_id, throttled, r.text[:300])
                await asyncio.sleep(THROTTLED_PAUSE)
                continue
            if r.status < 500 and url == urls[0]:
                break
        if time.monotonic() > deadline:
            break
        if attempt == 1 or attempt % 10 == 0:
            log.warning("submitting %s to %s failed (attempt %d): %s", job.job_id, url, attempt, reason)
        await asyncio.sleep(min(0.05 * 2 ** min(attempt - 1, 6), 2.0))
    record.rejected_reason = reason
    for t in job.tasks:
        run.tasks[t.task_id].failed_reason = f"rejected at submission: {reason}"


async def _placement_details(
    http: ServiceClient, asking: asyncio.Semaphore, urls: list[str], job: JobRecord, run: ServicesRun, start: float
) -> None:
    """Fill in what only the GM knows: arrival, decision time, LM, node, attempts, inconsistencies (asking the next
    GM when the job's GM is away or does not know the job: it may have stood in for it)."""
    async with asking:
        for url in urls:
            try:
                r = await http.get(f"{url}/v1/jobs/{job.job_id}")
            except CallError:
                continue
            if r.status == 200:
                break
            if r.status != 404:
                raise RuntimeError(f"GM at {url} answered {r.status} for job {job.job_id}: {r.text[:300]}")
        else:  # accepted, so it ended and was forgotten since (MEGHA_FINISHED_TASKS_KEPT), or its GM is away
            run.details_gone += 1
            return
    for t in JobStatus.model_validate_json(r.body).tasks:
        rec = run.tasks[t.task_id]
        if t.arrival is not None:
            rec.arrival = t.arrival - start
        if t.launched_at is not None:
            rec.attempt_at = rec.decided_at = t.launched_at - start
        rec.lm = t.lm if t.lm is not None else -1
        rec.node = t.node if t.node is not None else -1
        rec.attempts, rec.inconsistencies, rec.repartitioned = t.attempts, t.inconsistencies, t.repartitioned


def main() -> int:
    from megha.loadgen.report import format_table, write_outputs

    settings = load_settings(LoadgenSettings, "python -m megha.loadgen.services")
    configure_logging(settings.log_level, "loadgen", settings.log_format)
    run = asyncio.run(replay_services(settings, Progress()))
    assert run.metrics is not None
    title = f"Megha services replay of {settings.trace}"
    print(format_table(run.metrics, title))
    paths = write_outputs(
        run.metrics,
        list(run.tasks.values()),
        list(run.jobs.values()),
        Path(settings.out),
        title,
        {"settings": settings.public()},
    )
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 1 if run.metrics.not_exactly_once or run.timed_out else 0


if __name__ == "__main__":
    sys.exit(main())
