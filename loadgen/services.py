"""The request generator for the services: replays a trace against the GM services over REST in open loop,
collects task events from RabbitMQ, asks the GMs how each task was placed, and reports like `megha replay`.

    python -m megha.loadgen.services        # configured by MEGHA_* variables (LoadgenSettings)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from megha.client import DEFAULT_RETRY, NO_RETRY, AsyncClient, MeghaError, RetryPolicy
from megha.client.retry import Throttled
from megha.common.core.constraints import constraint_ids
from megha.common.core.resources import DEFAULT_RESOURCE_NAMES
from megha.common.core.task import JobSpec
from megha.common.lifecycle import StartupError
from megha.common.models import TaskEvent, TaskEvents
from megha.common.settings import LoadgenSettings, load_settings
from megha.common.transport.inmemory import fewer_gc_pauses
from megha.common.transport.rabbit import Broker, loadgen_queue
from megha.common.wire.fields import MAX_TASKS_PER_JOB
from megha.common.wire.jobs import MAX_TASK_SECONDS
from megha.loadgen.events import EventRecorder
from megha.loadgen.metrics import RunMetrics, compute_metrics
from megha.loadgen.progress import Progress
from megha.loadgen.records import JobRecord, TaskColumns
from megha.loadgen.trace import TraceError, TraceJob, demo_trace_path, resolve_trace
from megha.loadgen.workload import WorkloadConfig, build_workload, mark_gangs
from megha.services.logs import configure_logging

log = logging.getLogger("megha.loadgen")

SUBMITTING = RetryPolicy(attempts=120, base=0.05, cap=2.0, wait_when_throttled=True)
"""A submission names its job, so it is sent again after failures, alternating with the next GM (which takes the
job for its GM while it stands in for it): about two minutes of tries, the waits 1 s on average once at the cap. A
409 after a try that may have reached a GM is that try's job; a 429 (the user's unfinished tasks at
MEGHA_MAX_UNFINISHED_TASKS_PER_USER) waits the GM's Retry-After and asks again."""
DETAIL_CALLS = 32
"""How many GET /v1/jobs/{id} calls the generator has in flight at once after a replay."""


@dataclass
class ServicesRun:
    """What a replay against the services measured. Times in the records are seconds since the replay began."""

    tasks: TaskColumns
    jobs: dict[str, JobRecord]
    events: Mapping[str, list[TaskEvent]] = field(default_factory=dict)  # an EventLog
    metrics: RunMetrics | None = None
    wall_seconds: float = 0.0
    timed_out: list[str] = field(default_factory=list)
    details_gone: int = 0  # jobs whose GM had already forgotten them (MEGHA_FINISHED_TASKS_KEPT) when asked
    gangs: set[str] = field(default_factory=set)  # the jobs submitted as gangs (MEGHA_GANGS)


def submission(job: JobSpec) -> dict[str, object]:
    """The job's `JobSubmission`, as the JSON body (a gang's with `"gang": true` and its `gang_timeout`, if any)."""
    gang: dict[str, object] = {}
    if job.gang is not None:
        gang = {"gang": True} | ({"gang_timeout": job.gang} if math.isfinite(job.gang) else {})
    return gang | {
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


def check_submittable(jobs: Sequence[TraceJob], source: str) -> None:
    """Refuse, before any is submitted, a trace (`source` names where it came from) with a job the GMs would refuse
    whatever their state: more tasks than a submission takes, or a task longer than a submitted task lasts."""
    for k, job in enumerate(jobs, start=1):
        if len(job.durations) > MAX_TASKS_PER_JOB:
            raise TraceError(
                f"{source}: job {k} of the trace has {len(job.durations):,} tasks; a submission takes at most "
                f"{MAX_TASKS_PER_JOB:,} (split the job in the trace)"
            )
        if max(job.durations) > MAX_TASK_SECONDS:
            raise TraceError(
                f"{source}: job {k} of the trace has a task of {max(job.durations):g} s (after the time scale); a "
                f"submitted task lasts at most {MAX_TASK_SECONDS:,.0f} s"
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
    trace_jobs = resolve_trace(trace, settings.first_jobs, settings.time_scale)
    check_submittable(trace_jobs, f"MEGHA_TRACE {settings.trace}")
    workload = build_workload(
        trace_jobs,
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
    if settings.gangs:
        workload = mark_gangs(workload, settings.gangs, settings.seed)
    recorder = EventRecorder()
    for gm, job in workload:
        recorder.expect(gm, job)
    run = ServicesRun(recorder.tasks, recorder.jobs, recorder.events)
    run.gangs = {job.job_id for _, job in workload if job.gang is not None}
    say = progress.note if progress is not None else _silent
    token = settings.api_token.get_secret_value() if settings.auth != "off" else None
    await _check_gms(settings, token)
    own_broker = broker is None
    broker = broker or settings.broker()
    if own_broker:
        await broker.connect()
    queue = loadgen_queue(settings.run_id)
    start = time.time()
    all_done = asyncio.Event()

    async def on_events(body: bytes) -> None:
        for event in TaskEvents.model_validate_json(body).events:
            if recorder.record(event, event.at - start) and not recorder.open and submitted_all:
                all_done.set()

    submitted_all = False
    await broker.consume("events", "", on_events, queue=queue)
    say(f"replaying {len(workload)} jobs ({len(run.tasks)} tasks) against {len(settings.gm_urls)} GMs")
    http = AsyncClient(
        settings.gm_urls,
        token=token,
        ca=settings.tls_ca or None,
        timeout=30.0,
        retry=SUBMITTING,
        on_throttled=_held_back,
    )
    submits: list[asyncio.Task[None]] = []
    try:
        async with _showing(progress, recorder, submits, len(workload)):
            for gm, job in workload:
                delay = start + job.submitted_at - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                ring = http.at(*_ring(settings.gm_urls, gm))
                submits.append(asyncio.create_task(_submit(ring, job, recorder, start)))
            await asyncio.gather(*submits)
            submitted_all = True
            if not recorder.open:
                all_done.set()
            say(f"submitted; waiting for {recorder.open} tasks")
            try:
                await asyncio.wait_for(all_done.wait(), settings.timeout)
            except TimeoutError:
                run.timed_out = recorder.give_up(f"no completion within {settings.timeout} s of the last submit")
        run.wall_seconds = time.time() - start
        capacity = await _total_capacity(http, settings.gm_urls)
        asking = asyncio.Semaphore(DETAIL_CALLS)
        await asyncio.gather(
            *(
                _placement_details(http.at(*_ring(settings.gm_urls, r.gm), retry=DEFAULT_RETRY), asking, r, run, start)
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
        recorder.tasks,
        list(run.jobs.values()),
        capacity,
        DEFAULT_RESOURCE_NAMES,
        run.wall_seconds,
    )
    return run


def _held_back(wait: Throttled) -> None:
    """A GM answered a submission 429 (its user's unfinished tasks are at the bound): said now and then."""
    if wait.times == 1 or wait.times % 30 == 0:
        log.info("GM at %s holds a job back (%d times): %s", wait.url, wait.times, wait.reason)


def _silent(line: str) -> None:
    """No progress asked for: nothing to say."""


@contextlib.asynccontextmanager
async def _showing(
    progress: Progress | None, recorder: EventRecorder, submits: list[asyncio.Task[None]], jobs: int
) -> AsyncIterator[None]:
    """On a terminal, a bar of the tasks ended of the tasks accepted, moved four times a second. While jobs are
    still to be submitted their tasks count too, so that the time left covers the whole replay."""
    if progress is None or not progress.bar:
        yield
        return
    with progress.track("replaying", len(recorder.tasks), "tasks") as advance:

        async def show() -> None:
            while True:
                rejected = sum(j.num_tasks for j in recorder.jobs.values() if j.rejected_reason)
                advance(recorder.ended, f"{len(submits):,}/{jobs:,} jobs submitted", len(recorder.tasks) - rejected)
                await asyncio.sleep(0.25)

        showing = asyncio.create_task(show())
        try:
            yield
        finally:
            showing.cancel()


GM_ASKED_EVERY = 2.0
"""Seconds between two rounds of asking MEGHA_GM_URLS at start-up while no GM answers."""


async def _check_gms(settings: LoadgenSettings, token: str | None) -> None:
    """Before anything is submitted, wait until a GM of MEGHA_GM_URLS answers, saying at each round which it waits
    for (in a deployment the generator may start before the GMs, and a swarm has no start order); StartupError in
    one line when none has within MEGHA_GM_TIMEOUT seconds (each submission would otherwise be retried for minutes,
    the run ending in the same error)."""
    http = AsyncClient(settings.gm_urls, token=token, ca=settings.tls_ca or None, timeout=10.0)
    deadline = time.monotonic() + settings.gm_timeout
    try:
        while True:
            try:
                await _total_capacity(http, settings.gm_urls, NO_RETRY)
                return
            except StartupError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StartupError(f"{exc} (asked for {settings.gm_timeout:g} s: MEGHA_GM_TIMEOUT)") from None
                log.warning(
                    "waiting for a GM of MEGHA_GM_URLS to answer (giving up in %.0f s): %s",
                    left,
                    str(exc).removeprefix(NO_GM),
                )
            await asyncio.sleep(min(GM_ASKED_EVERY, left))
    finally:
        await http.aclose()


NO_GM = "no GM of MEGHA_GM_URLS answered GET /v1/state: "


async def _total_capacity(http: AsyncClient, urls: list[str], retry: RetryPolicy = DEFAULT_RETRY) -> tuple[int, ...]:
    """The data centre's capacity, from the first GM that answers; StartupError when none does."""
    failures = []
    for url in urls:
        try:
            return tuple((await http.at(url, retry=retry).state()).total_capacity)
        except MeghaError as exc:
            failures.append(str(exc))
    raise StartupError(NO_GM + "; ".join(failures))


def _ring(urls: list[str], gm: int) -> list[str]:
    """The GM a job is for, then the next GM of the ring: the one that stands in for it when it stays down."""
    return [urls[gm], urls[(gm + 1) % len(urls)]] if len(urls) > 1 else [urls[gm]]


async def _submit(gms: AsyncClient, job: JobSpec, recorder: EventRecorder, start: float) -> None:
    """POST the job to its GM (`gms`: it, then the next GM of the ring), retried as SUBMITTING says: the job id is
    ours, so a try that may have reached a GM is sent again, and a 409 then reads as that try's job. Only the job's
    own GM refuses it for good (a 4xx)."""
    record = recorder.jobs[job.job_id]
    record.submitted_at = time.time() - start
    try:
        await gms.submit(submission(job), gm=record.gm)
    except MeghaError as exc:
        log.warning("submitting %s failed: %s", job.job_id, exc)
        recorder.reject(job, str(exc))
        return
    recorder.accept(job)


async def _placement_details(
    gms: AsyncClient, asking: asyncio.Semaphore, job: JobRecord, run: ServicesRun, start: float
) -> None:
    """Fill in what only the GM knows: arrival, decision time, LM, node, attempts, inconsistencies (asking the next
    GM when the job's GM is away or does not know the job: it may have stood in for it)."""
    async with asking:
        try:
            status = await gms.status(job.job_id)
        except MeghaError as exc:
            if exc.status not in (404, None):
                raise RuntimeError(f"asking for job {job.job_id}: {exc}") from None
            run.details_gone += 1  # accepted, so it ended and was forgotten since (MEGHA_FINISHED_TASKS_KEPT)
            return
    tasks = run.tasks
    for t in status.tasks:
        if t.arrival is not None:
            tasks.set(t.task_id, arrival=t.arrival - start)
        if t.launched_at is not None:
            tasks.set(t.task_id, attempt_at=t.launched_at - start, decided_at=t.launched_at - start)
        tasks.set(
            t.task_id,
            lm=t.lm if t.lm is not None else -1,
            node=t.node if t.node is not None else -1,
            attempts=t.attempts,
            inconsistencies=t.inconsistencies,
            repartitioned=t.repartitioned,
        )


def main(command: str = "python -m megha.loadgen.services") -> int:
    """Replay the trace MEGHA_TRACE names through the services; `command` names the program in a settings error."""
    from megha.loadgen.report import format_table, write_outputs

    settings = load_settings(LoadgenSettings, command)
    configure_logging(settings.log_level, "loadgen", settings.log_format)
    out = Path(settings.out)
    made = [folder for folder in (out, *out.parents) if not folder.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)  # before the replay, not after it
    except OSError as exc:
        print(
            f"{command}: bad settings: MEGHA_OUT={settings.out}: cannot make the folder: {exc.strerror}",
            file=sys.stderr,
        )
        return 2
    try:
        run = asyncio.run(replay_services(settings, Progress()))
    except BaseException as exc:  # nothing was written: leave no empty folder behind
        for folder in made:
            with contextlib.suppress(OSError):  # a folder something else wrote in meanwhile is kept
                folder.rmdir()
        if isinstance(exc, TraceError):  # the file MEGHA_TRACE names, or what MEGHA_TIME_SCALE makes of it
            said = str(exc)  # it names the file already when it is about the file (`MEGHA_TRACE <path>: ...`)
            print(
                f"{command}: bad settings: {said if said.startswith('MEGHA_TRACE') else f'MEGHA_TRACE: {said}'}",
                file=sys.stderr,
            )
            return 2
        if not isinstance(exc, StartupError):
            raise
        print(f"{command}: error: {exc}", file=sys.stderr)  # the broker or every GM unreachable
        return 2
    assert run.metrics is not None
    title = f"Megha services replay of {settings.trace}"
    print(format_table(run.metrics, title))
    paths = write_outputs(
        run.metrics,
        run.tasks,
        list(run.jobs.values()),
        Path(settings.out),
        title,
        {"settings": settings.public()},
    )
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 1 if run.metrics.not_exactly_once or run.timed_out else 0


if __name__ == "__main__":
    sys.exit(main())
