"""`megha job submit|status|list|cancel|logs|watch`: a deployment's jobs, through megha.client's typed answers."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, get_args

import click
from pydantic import ValidationError

from megha.client import Client, JobFileError, MeghaError, read_job_file, submission
from megha.common.core.policies.priority import DEFAULT_CLASS
from megha.common.models import (
    MAX_TASKS_PER_JOB,
    JobEnd,
    JobList,
    JobState,
    JobStatus,
    JobSummary,
    TaskTransition,
    validation_error_body,
)
from megha.common.printable import printable
from megha.ctl.common import REFUSED, UNFINISHED, USAGE, Ctl, CtlError, counts, dump, options, seconds, table, when
from megha.options import Bounded

JOB_STATES: tuple[str, ...] = get_args(JobState)
PAGE = 1000
"""The most jobs one `GET /v1/jobs` answers."""


@click.group(short_help="submit, show, list, cancel and watch jobs")
def job() -> None:
    """Submit, show, list, cancel and watch jobs."""


def _constraint_ids(text: str) -> list[int]:
    try:
        return [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise CtlError(f"--constraints {text!r}: give constraint ids 0..20 separated by commas", USAGE) from None


@job.command(short_help="submit a job file, or N identical tasks")
@click.argument("job_file", required=False, metavar="[JOB_FILE]")
@click.option("--user", help="the job's user (overrides the file's)")
@click.option("--job-id", help="name the job (overrides the file's; default: the GM names it)")
@click.option(
    "--tasks", type=click.IntRange(1, MAX_TASKS_PER_JOB), help="identical tasks, without a job file (default 1)"
)
@click.option("--duration", type=Bounded(float, ge=0), help="seconds each task runs, without a job file")
@click.option("--cpu-millicores", type=click.IntRange(min=1), help="each task's CPU, without a job file (default 1000)")
@click.option("--memory-mb", type=click.IntRange(min=1), help="each task's memory, without a job file (default 1024)")
@click.option("--constraints", help="placement constraint ids of each task, like 0,3 (without a job file)")
@options()
def submit(
    ctl: Ctl,
    job_file: str | None,
    user: str | None,
    job_id: str | None,
    tasks: int | None,
    duration: float | None,
    cpu_millicores: int | None,
    memory_mb: int | None,
    constraints: str | None,
) -> None:
    """Submit a job: JOB_FILE (YAML or JSON, the body of POST /v1/jobs; - reads stdin; see examples/job.yaml), or
    --duration and the other flags for N identical tasks."""
    flags: dict[str, Any] = {
        "--tasks": tasks,
        "--duration": duration,
        "--cpu-millicores": cpu_millicores,
        "--memory-mb": memory_mb,
        "--constraints": constraints,
    }
    if job_file is not None:
        given = [name for name, value in flags.items() if value is not None]
        if given:
            raise CtlError(f"give a job file or {', '.join(given)}, not both", USAGE)
        try:
            data, source = read_job_file(job_file), job_file
        except JobFileError as exc:
            raise CtlError(str(exc), USAGE) from None
    else:
        if duration is None:
            raise CtlError("give a job file, or --duration (with --tasks, --cpu-millicores, ...)", USAGE)
        task = {"duration": duration, "cpu_millicores": cpu_millicores or 1000, "memory_mb": memory_mb or 1024}
        if constraints:
            task["constraints"] = _constraint_ids(constraints)
        data, source = {"tasks": [task] * (tasks or 1)}, "the job"
    data.update({k: v for k, v in (("user", user), ("job_id", job_id)) if v is not None})
    try:
        job = submission(data)
    except ValidationError as exc:
        errors = validation_error_body(exc).detail
        raise CtlError(f"{source}: " + "; ".join(f"{e.field}: {e.message}" for e in errors), USAGE) from None
    # Only what the job names: a user's token submits as that user when the job names none (the GM refuses another).
    accepted = ctl.client.submit(job)
    if ctl.as_json:
        ctl.emit(dump(accepted))
    else:
        ctl.print(f"job {accepted.job_id}: {len(accepted.task_ids)} tasks accepted by GM {accepted.gm}")


def _show_job(ctl: Ctl, status: JobStatus, holder: Client) -> None:
    states = Counter(t.state for t in status.tasks)
    where = f"GM {status.gm} ({holder.urls[0]})"
    priority = "" if status.priority_class is None else f"  class {status.priority_class}"
    ctl.print(f"job {status.job_id}  user {status.user}  {where}{priority}  {status.state}: {counts(states)}")
    if status.depends_on:
        ctl.print(f"depends on: {', '.join(status.depends_on)}")
    if status.array is not None:
        ctl.print(f"array of {status.array} tasks (MEGHA_ARRAY_INDEX 0..{status.array - 1})")
    if status.retry is not None:
        rule, retried = status.retry, sum(t.failures_retried for t in status.tasks)
        codes = ",".join(map(str, rule.on_exit_codes)) or "any non-zero"
        ctl.print(
            f"retry: at most {rule.max_attempts} failed runs per task, backoff {rule.backoff_s:g} s, exit codes "
            f"{codes}; {retried} failed runs retried"
        )
    if status.gang:
        timeout = "none" if status.gang_timeout is None else f"{status.gang_timeout:g} s"
        ctl.print(f"gang: all tasks start or none; gang_timeout {timeout}")
    shown = table(
        None,
        "task",
        "state",
        "LM",
        "node",
        "attempts",
        "alloc s",
        "ran s",
        "reason",
        numeric=("LM", "node", "attempts", "alloc s", "ran s"),
    )
    for t in status.tasks:
        shown.add_row(
            f"{t.task_id} (queueable)" if t.queueable else t.task_id,
            t.state,
            "-" if t.lm is None else str(t.lm),
            "-" if t.node is None else str(t.node),
            str(t.attempts),
            seconds(t.arrival, t.launched_at),
            seconds(t.started_at, t.finished_at),
            printable(t.failed_reason or ""),  # a task's stderr tail: no escape sequence reaches the terminal
        )
    ctl.print(shown)


@job.command(short_help="show a job and each of its tasks")
@click.argument("job_id")
@options()
def status(ctl: Ctl, job_id: str) -> None:
    """Show a job and each of its tasks (GM GET /v1/jobs/ID; each GM in turn until one holds it)."""
    holder, found = ctl.client.locate(job_id)
    if ctl.as_json:
        ctl.emit(dump(found))
    else:
        _show_job(ctl, found, holder)


@job.command(short_help="cancel a job")
@click.argument("job_id")
@options()
def cancel(ctl: Ctl, job_id: str) -> None:
    """Cancel a job (GM DELETE /v1/jobs/ID): its queued tasks end at once, its placed ones once their LM stopped
    them. A job that already ended is refused (exit status 1)."""
    cancelled = ctl.client.cancel(job_id)
    if ctl.as_json:
        ctl.emit(dump(cancelled))
        return
    stopping = sum(t.state in ("launched", "running") for t in cancelled.tasks)
    states = counts(Counter(t.state for t in cancelled.tasks))
    line = f"job {cancelled.job_id} cancelled at GM {cancelled.gm}: {states}"
    ctl.print(line + (f"; {stopping} placed tasks end cancelled once their LM stops them" if stopping else ""))


@job.command(short_help="print what a job's tasks wrote to stdout or stderr")
@click.argument("job_id")
@click.option("--task", "task_id", help="only this task: its id, or its number in the job (default: every task)")
@click.option("--stream", type=click.Choice(["stdout", "stderr"]), default="stdout", show_default=True)
@click.option("--attempt", type=click.IntRange(min=1), help="which attempt of the task (default: its latest)")
@options()
def logs(ctl: Ctl, job_id: str, task_id: str | None, stream: str, attempt: int | None) -> None:
    """Print what a job's tasks wrote (GM GET /v1/jobs/ID/tasks/TASK/logs): the output the agent that ran each
    kept, bounded and rotated (the newest part). Without --task every task's, each headed by its id; a task with
    no output (not run yet, or a burn task) says why. Exec and container tasks keep output; burn tasks do not."""
    holder, found = ctl.client.locate(job_id)
    tasks, full_id = found.tasks, found.job_id  # the job's id: `job_id` in the caller's scope, maybe
    if task_id is not None:
        prefix, _, index = task_id.rpartition(".")  # `<the job's id or name>.<i>`, or `<i>`
        mine = prefix in (job_id, full_id) or full_id.startswith(f"{prefix}~")  # a name, maybe with its scope
        named = (task_id, f"{full_id}.{task_id}", f"{full_id}.{index}" if mine else task_id)
        tasks = [t for t in tasks if t.task_id in named]
        if not tasks:
            raise CtlError(f"job {job_id} has no task {task_id} (its tasks: {found.tasks[0].task_id} ..)", REFUSED)
    found_logs: list[dict[str, Any]] = []
    failures: list[CtlError] = []
    for t in tasks:
        entry: dict[str, Any] = {"task_id": t.task_id, "state": t.state}
        try:
            entry["text"] = holder.logs(full_id, t.task_id, stream, attempt)
        except MeghaError as exc:
            if exc.status != 404 or task_id is not None:
                failures.append(ctl.failure(exc))
            entry["error"] = exc.reason  # a task that has not run, or keeps no output: the others still print
        found_logs.append(entry)
    if ctl.as_json:
        ctl.emit(found_logs)
    elif task_id is not None and "text" in found_logs[0]:
        click.echo(found_logs[0]["text"], nl=False)
    else:
        for entry in found_logs:
            click.echo(f"==> {entry['task_id']} ({entry['state']}) {stream} <==")
            text = entry.get("text")
            if text is None:
                click.echo(f"(no output: {entry['error']})")
            elif text:
                click.echo(text, nl=not text.endswith("\n"))
    if failures:
        raise failures[0]


def _jobs(gm: Client, filters: dict[str, Any], offset: int, count: int | None) -> JobList:
    """A GM's job list from `offset`: `count` jobs (None: all), a page of at most PAGE at a time."""
    listing = gm.list(**filters, offset=offset, limit=min(PAGE, count or PAGE))
    jobs = list(listing.jobs)
    while listing.next_offset is not None and (count is None or len(jobs) < count):
        left = PAGE if count is None else min(PAGE, count - len(jobs))
        listing = gm.list(**filters, offset=listing.next_offset, limit=left)
        jobs += listing.jobs
    return JobList(jobs=jobs, total=listing.total, offset=offset, limit=len(jobs))


def kind(j: JobSummary) -> str:
    """What kind of job a list row is, compactly: its class when not the default one, `gang`, `array of N`,
    `after N jobs` (its parents), `retry`; `-` for a plain job."""
    parts = [j.priority_class] if j.priority_class not in (None, DEFAULT_CLASS) else []
    parts += ["gang"] if j.gang else []
    parts += [] if j.array is None else [f"array of {j.array}"]
    parents = len(j.depends_on)
    parts += [f"after {parents} job{'s' * (parents != 1)}"] if parents else []
    parts += ["retry"] if j.retry else []
    return ", ".join(parts) or "-"


@job.command("list", short_help="list jobs: filters by user, queue, state; pages")
@click.option("--user", help="only this user's jobs")
@click.option("--queue", help="only this queue's jobs (a queue is named after its user)")
@click.option("--state", type=click.Choice(JOB_STATES), help="only jobs in this state")
@click.option("--limit", type=click.IntRange(1, PAGE), default=100, show_default=True, help="jobs to show")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True, help="jobs to skip first")
@click.option("--all", "everything", is_flag=True, help="every job that matches (no --limit, --offset)")
@options()
def list_jobs(
    ctl: Ctl, user: str | None, queue: str | None, state: str | None, limit: int, offset: int, everything: bool
) -> None:
    """List jobs, oldest first (GM GET /v1/jobs); with several GMs, every GM's, merged by submission time."""
    filters = {"user": user, "queue": queue, "state": state}
    start, count = (0, None) if everything else (offset, limit)
    if len(ctl.gms) == 1:
        one = _jobs(ctl.client, filters, start, count)
        page: list[JobSummary] = one.jobs
        matched = one.total
        errors: list[CtlError] = []
    else:  # each GM's first offset + limit jobs, merged; the page is the slice of the merge
        upto = None if count is None else start + count
        answers, errors = ctl.each(ctl.gms, lambda gm: _jobs(gm, filters, 0, upto))
        merged = sorted((j for _, listing in answers for j in listing.jobs), key=lambda j: (j.submitted_at or 0, j.gm))
        page = merged[start:] if count is None else merged[start : start + count]
        matched = sum(listing.total for _, listing in answers)
    after = start + len(page)
    listed = JobList(
        jobs=page,
        total=matched,
        offset=start,
        limit=len(page) if count is None else count,
        next_offset=after if after < matched else None,
    )
    if ctl.as_json:
        ctl.emit(dump(listed))
    else:
        columns = ("job", "user", "queue", "GM", "state", "kind", "tasks", "task states", "submitted")
        shown = table(None, *columns, numeric=("GM", "tasks"))
        for j in page:
            states = counts(dict(j.task_states))
            shown.add_row(
                j.job_id, j.user, j.queue, str(j.gm), j.state, kind(j), str(j.tasks), states, when(j.submitted_at)
            )
        ctl.print(shown)
        summary = f"jobs {start + 1}-{after} of {matched}" if page else f"no jobs from offset {start} of {matched}"
        ctl.print(summary + (f"; next page: --offset {after}" if after < matched else ""))
    if errors:
        raise errors[0]


def _event_line(event: JobStatus | TaskTransition | JobEnd) -> str:
    if isinstance(event, JobStatus):
        return f"job {event.job_id} (user {event.user}, GM {event.gm}) {event.state}: " + counts(
            Counter(t.state for t in event.tasks)
        )
    if isinstance(event, JobEnd):
        return f"{when(event.at)}  job {event.job_id} ended {event.state}"
    where = "" if event.lm is None else f"  LM {event.lm}" + ("" if event.node is None else f" node {event.node}")
    why = f"  ({printable(event.reason)})" if event.reason else ""
    return f"{when(event.at)}  task {event.task_id} {event.kind}{where}  attempt {event.attempt}{why}"


@job.command(short_help="print a job's events as they come; exit with its outcome")
@click.argument("job_id")
@options()
def watch(ctl: Ctl, job_id: str) -> None:
    """Print a job's events as they happen (GM GET /v1/jobs/ID/events): its state, each task launched, requeued,
    preempted, lost, finished, failed or cancelled, then its end. Exit status 0 when every task finished, 4 when
    the job ended otherwise (a task failed, or it was cancelled). With --json, one JSON object a line."""
    names = {JobStatus: "state", TaskTransition: "task", JobEnd: "end"}
    outcome: JobEnd | None = None
    for event in ctl.client.events(job_id):
        if ctl.as_json:
            click.echo(json.dumps({"event": names[type(event)], "data": dump(event)}))
        else:
            ctl.print(_event_line(event))
        if isinstance(event, JobEnd):
            outcome = event
    if outcome is not None and outcome.state != "finished":
        raise click.exceptions.Exit(UNFINISHED)
