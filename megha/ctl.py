"""`megha job|queues|nodes|top`: operate a running deployment through its GMs' and LMs' REST routes.

Tables for people (rich), `--json` for scripts: the API's JSON as the services sent it (commands that ask several
services wrap each answer, unchanged, with the URL it came from). docs/cli.md lists the commands.

Exit status: 0 done; 1 a GM or LM refused the request (its `ErrorBody` in one line); 2 bad usage or a bad job file;
3 a GM or LM could not be reached (its URL and the reason in one line).
"""

from __future__ import annotations

import functools
import json
import os
import ssl
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args
from urllib.parse import quote

import click
import httpx
import yaml
from pydantic import ValidationError
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from megha.common.core.resources import CPU, DEFAULT_RESOURCE_NAMES, MEMORY
from megha.common.models import MAX_TASKS_PER_JOB, ErrorBody, JobState, JobSubmission, validation_error_body

DEFAULT_GM_URL = "http://127.0.0.1:8000"
"""Where docker-compose.yml publishes its first GM (gm-0) on this host."""
JOB_STATES: tuple[str, ...] = get_args(JobState)
PAGE = 1000
"""The most jobs one `GET /v1/jobs` answers."""
REFUSED, USAGE, UNREACHABLE = 1, 2, 3
RESOURCE_LABELS = {CPU: "CPU m", MEMORY: "memory MB"}


# ------------------------------------------------------------------------------------------------ errors, HTTP


class CtlError(click.ClickException):
    """One line on stderr, `megha: <message>`, and the exit status `exit_code`."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file: Any = None) -> None:
        click.echo(f"megha: {self.message}", err=True)


class Refused(CtlError):
    """A service answered with an error status."""

    def __init__(self, service: Service, response: httpx.Response) -> None:
        hint = " (give your API token with --token or $MEGHA_API_TOKEN)" if response.status_code == 401 else ""
        super().__init__(f"{service} answered {response.status_code}: {_reason(response)}{hint}", REFUSED)


class Unreachable(CtlError):
    """No answer from a service; `maybe_sent` is False when no connection was made (safe to send elsewhere)."""

    def __init__(self, service: Service, exc: httpx.TransportError) -> None:
        super().__init__(f"{service} cannot be reached: {str(exc) or type(exc).__name__}", UNREACHABLE)
        self.maybe_sent = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)


def _reason(response: httpx.Response) -> str:
    """An `ErrorBody` in one line: the error, then each field whose message adds to it."""
    try:
        body = ErrorBody.model_validate_json(response.content)
    except ValueError:
        return " ".join(response.text.split())[:200] or response.reason_phrase
    return "; ".join([body.error, *(f"{d.field}: {d.message}" for d in body.detail if d.message != body.error)])


@dataclass(frozen=True)
class Service:
    kind: str  # "GM" or "LM"
    url: str

    def __str__(self) -> str:
        return f"{self.kind} at {self.url}"


class Api:
    """One keep-alive HTTP client for every call of a command (thread-safe: `megha top` calls in parallel)."""

    def __init__(self, timeout: float, token: str | None = None, ca: str | None = None) -> None:
        """`ca`: a PEM bundle of the certificate authorities that verify https:// services (None: the system's)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        verify = ssl.create_default_context(cafile=ca) if ca else True
        self.http = httpx.Client(timeout=timeout, headers=headers, verify=verify)

    def call(self, service: Service, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self.http.request(method, service.url + path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(service, exc) from None
        except httpx.InvalidURL as exc:
            raise CtlError(f"{service.url}: {exc}", USAGE) from None

    def get(self, service: Service, path: str, **params: object) -> Any:
        """The JSON of a 200 answer; Refused for any other."""
        response = self.call(service, "GET", path, params=params)
        if response.status_code != 200:
            raise Refused(service, response)
        return body(service, response)


def body(service: Service, response: httpx.Response) -> Any:
    """A successful answer's JSON; CtlError (REFUSED) when it is not JSON (not a Megha service at that URL?)."""
    try:
        return response.json()
    except ValueError:
        text = " ".join(response.text.split())[:100]
        raise CtlError(f"{service} answered {response.status_code} with no JSON: {text!r}", REFUSED) from None


def _urls(given: Sequence[str], variables: Sequence[str], default: str | None) -> list[str]:
    """URLs from the option (repeatable, or comma-separated), else from the first variable set, else `default`."""
    texts = list(given) or next(([os.environ[v]] for v in variables if os.environ.get(v, "").strip()), [])
    urls = [u.strip().rstrip("/") for text in texts for u in text.split(",") if u.strip()] or (
        [default] if default else []
    )
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise CtlError(f"{url!r} is not an http:// or https:// URL", USAGE)
    return list(dict.fromkeys(urls))


@dataclass
class Ctl:
    """What every command gets: the GMs and LMs to ask, the client, and how to print."""

    gms: list[Service]
    lms: list[Service]
    api: Api
    as_json: bool
    console: Console = field(default_factory=lambda: Console(markup=False, highlight=False, soft_wrap=True))

    def emit(self, data: object) -> None:
        click.echo(json.dumps(data, indent=2))

    def print(self, *renderables: object) -> None:
        self.console.print(*renderables)


def _token_file() -> str | None:
    """The token in the file MEGHA_API_TOKEN_FILE names (a Docker secret, say), if it names one."""
    path = os.environ.get("MEGHA_API_TOKEN_FILE")
    if not path:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError as exc:
        raise CtlError(f"MEGHA_API_TOKEN_FILE: cannot read {path}: {exc.strerror}", USAGE) from None


def _options(lms: bool = False) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The options every command shares (`--gm`, `--json`, `--timeout`; `--lm` when `lms`), passed as a `Ctl`."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(command)
        def run(
            gm: tuple[str, ...],
            lm: tuple[str, ...] = (),
            as_json: bool = False,
            timeout: float = 10.0,
            token: str | None = None,
            ca: str | None = None,
            **kw: Any,
        ) -> None:
            ctl = Ctl(
                [Service("GM", u) for u in _urls(gm, ("MEGHA_GM_URL", "MEGHA_GM_URLS"), DEFAULT_GM_URL)],
                [Service("LM", u) for u in _urls(lm, ("MEGHA_LM_URLS",), None)],
                Api(timeout, token or _token_file(), ca),
                as_json,
            )
            try:
                command(ctl, **kw)
            finally:
                ctl.api.http.close()

        decorators = [
            click.option(
                "--gm",
                multiple=True,
                metavar="URL",
                help=f"a GM's URL; repeat it or separate with commas for several (default: $MEGHA_GM_URL, else "
                f"$MEGHA_GM_URLS, else {DEFAULT_GM_URL})",
            ),
            click.option("--json", "as_json", is_flag=True, help="print the API's JSON instead of a table"),
            click.option(
                "--token",
                envvar="MEGHA_API_TOKEN",
                metavar="TOKEN",
                help="your API token (default: $MEGHA_API_TOKEN, else the file $MEGHA_API_TOKEN_FILE names); "
                "none is sent without one (a deployment with MEGHA_AUTH=off)",
            ),
            click.option(
                "--ca",
                envvar="MEGHA_TLS_CA",
                metavar="FILE",
                type=click.Path(exists=True, dir_okay=False),
                help="PEM bundle of the certificate authorities that verify https:// GMs and LMs (default: "
                "$MEGHA_TLS_CA, else the system's)",
            ),
            click.option(
                "--timeout",
                type=click.FloatRange(min=0, min_open=True),
                default=10.0,
                show_default=True,
                help="seconds to wait for each answer",
            ),
        ]
        if lms:
            decorators.append(
                click.option(
                    "--lm",
                    multiple=True,
                    metavar="URL",
                    help="an LM's URL; repeat it or separate with commas (default: $MEGHA_LM_URLS)",
                )
            )
        for decorator in decorators:
            run = decorator(run)
        return run

    return decorate


def _each(
    services: Sequence[Service], ask: Callable[[Service], Any]
) -> tuple[list[tuple[Service, Any]], list[CtlError]]:
    """`ask` every service: the answers of those that answered, and the errors of those that did not (the first
    error is raised when none answered)."""
    answers, errors = [], []
    for service in services:
        try:
            answers.append((service, ask(service)))
        except Unreachable as exc:
            errors.append(exc)
    if errors and not answers:
        raise errors[0]
    return answers, errors


# ------------------------------------------------------------------------------------------------ formatting


def _table(title: str | None, *columns: str, numeric: Iterable[str] = ()) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold")
    right = set(numeric)
    for column in columns:
        numbers = column in right
        table.add_column(
            column, justify="right" if numbers else "left", overflow="fold", min_width=len(column) * numbers
        )
    return table


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    fmt = "%H:%M:%S" if time.strftime("%Y-%m-%d", time.localtime(t)) == time.strftime("%Y-%m-%d") else "%m-%d %H:%M"
    return time.strftime(fmt, time.localtime(t))


def _seconds(start: float | None, end: float | None) -> str:
    return "-" if start is None or end is None else f"{end - start:.3f}"


def _counts(states: dict[str, int]) -> str:
    return ", ".join(f"{n} {state}" for state, n in states.items() if n) or "-"


def _amounts(free: Sequence[int], capacity: Sequence[int]) -> list[str]:
    return [f"{f:,}/{c:,}" for f, c in zip(free, capacity)]


def _label(resource: str) -> str:
    return RESOURCE_LABELS.get(resource, resource)


def _used(free: Sequence[int], capacity: Sequence[int]) -> str:
    """The largest used fraction over the resources, in percent."""
    fractions = [1 - f / c for f, c in zip(free, capacity) if c]
    return f"{100 * max(fractions):.0f}%" if fractions else "-"


def _total(vectors: Iterable[Sequence[int]], width: int) -> list[int]:
    total = [0] * width
    for vector in vectors:
        for k, amount in enumerate(vector):
            total[k] += amount
    return total


# ------------------------------------------------------------------------------------------------ commands


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="megha", prog_name="megha", message="%(prog)s %(version)s")
def cli() -> None:
    """Operate a running Megha deployment through its GMs' and LMs' REST APIs.

    Exit status: 0 done; 1 a GM or LM refused the request; 2 bad usage or a bad job file; 3 a GM or LM could not
    be reached.
    """


@cli.group(short_help="submit, show, list and cancel jobs")
def job() -> None:
    """Submit, show, list and cancel jobs."""


def _load_job(path: str) -> dict[str, Any]:
    """A job file's mapping (YAML, or JSON for a .json file); CtlError (USAGE) naming the problem."""
    try:
        with click.open_file(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise CtlError(f"{path}: {exc.strerror or exc}", USAGE) from None
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise CtlError(
            f"{path}: not valid {'JSON' if path.endswith('.json') else 'YAML'}: {exc}".replace("\n", " "), USAGE
        ) from None
    if not isinstance(data, dict):
        raise CtlError(f"{path}: a job file holds a mapping with 'tasks' (see examples/job.yaml)", USAGE)
    return data


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
@click.option("--duration", type=click.FloatRange(min=0), help="seconds each task runs, without a job file")
@click.option("--cpu-millicores", type=click.IntRange(min=1), help="each task's CPU, without a job file (default 1000)")
@click.option("--memory-mb", type=click.IntRange(min=1), help="each task's memory, without a job file (default 1024)")
@click.option("--constraints", help="placement constraint ids of each task, like 0,3 (without a job file)")
@_options()
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
        data, source = _load_job(job_file), job_file
    else:
        if duration is None:
            raise CtlError("give a job file, or --duration (with --tasks, --cpu-millicores, ...)", USAGE)
        task = {"duration": duration, "cpu_millicores": cpu_millicores or 1000, "memory_mb": memory_mb or 1024}
        if constraints:
            task["constraints"] = _constraint_ids(constraints)
        data, source = {"tasks": [task] * (tasks or 1)}, "the job"
    data.update({k: v for k, v in (("user", user), ("job_id", job_id)) if v is not None})
    try:
        submission = JobSubmission.model_validate(data)
    except ValidationError as exc:
        errors = validation_error_body(exc).detail
        raise CtlError(f"{source}: " + "; ".join(f"{e.field}: {e.message}" for e in errors), USAGE) from None
    # Only what the job names: a user's token submits as that user when the job names none (the GM refuses another).
    gm, accepted = _post(ctl, submission.model_dump(mode="json", exclude_unset=True, exclude_none=True))
    if ctl.as_json:
        ctl.emit(accepted)
    else:
        count = len(accepted["task_ids"])
        ctl.print(f"job {accepted['job_id']}: {count} tasks accepted by GM {accepted['gm']} ({gm.url})")


def _post(ctl: Ctl, submission: dict[str, Any]) -> tuple[Service, dict[str, Any]]:
    """Submit to the first GM that takes the job: the next is tried only when one surely did not (no connection,
    422: say, the user's queue is served by another GM, or 503: the GM changes hands)."""
    first: CtlError | None = None
    for gm in ctl.gms:
        try:
            response = ctl.api.call(gm, "POST", "/v1/jobs", json=submission)
        except Unreachable as exc:
            if exc.maybe_sent:
                raise  # the GM may have accepted it: sending it elsewhere could run it twice
            first = first or exc
            continue
        if response.status_code == 201:
            return gm, body(gm, response)
        if response.status_code not in (422, 503):
            raise Refused(gm, response)
        first = first or Refused(gm, response)
    assert first is not None
    raise first


def _find(ctl: Ctl, method: str, job_id: str) -> tuple[Service, httpx.Response]:
    """The first GM whose answer about `job_id` is not 404 (GMs tried in order)."""
    missing: list[Refused] = []
    unreachable: list[Unreachable] = []
    for gm in ctl.gms:
        try:
            response = ctl.api.call(gm, method, f"/v1/jobs/{quote(job_id, safe='')}")
        except Unreachable as exc:
            unreachable.append(exc)
            continue
        if response.status_code != 404:
            return gm, response
        missing.append(Refused(gm, response))
    if unreachable:
        raise unreachable[0]  # the job may be at the GM that did not answer
    if len(missing) > 1:
        raise CtlError("; ".join(r.message for r in missing), REFUSED)
    raise missing[0]


def _show_job(ctl: Ctl, status: dict[str, Any], gm: Service) -> None:
    tasks = status["tasks"]
    states = Counter(t["state"] for t in tasks)
    where = f"GM {status['gm']} ({gm.url})"
    ctl.print(f"job {status['job_id']}  user {status['user']}  {where}  {status['state']}: {_counts(states)}")
    table = _table(
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
    for t in tasks:
        table.add_row(
            t["task_id"],
            t["state"],
            "-" if t["lm"] is None else str(t["lm"]),
            "-" if t["node"] is None else str(t["node"]),
            str(t["attempts"]),
            _seconds(t["arrival"], t["launched_at"]),
            _seconds(t["started_at"], t["finished_at"]),
            t["failed_reason"] or "",
        )
    ctl.print(table)


@job.command(short_help="show a job and each of its tasks")
@click.argument("job_id")
@_options()
def status(ctl: Ctl, job_id: str) -> None:
    """Show a job and each of its tasks (GM GET /v1/jobs/ID; each GM in turn until one holds it)."""
    gm, response = _find(ctl, "GET", job_id)
    if response.status_code != 200:
        raise Refused(gm, response)
    if ctl.as_json:
        ctl.emit(body(gm, response))
    else:
        _show_job(ctl, body(gm, response), gm)


@job.command(short_help="cancel a job")
@click.argument("job_id")
@_options()
def cancel(ctl: Ctl, job_id: str) -> None:
    """Cancel a job (GM DELETE /v1/jobs/ID): its queued tasks end at once, its placed ones once their LM stopped
    them. A job that already ended is refused (exit status 1)."""
    gm, response = _find(ctl, "DELETE", job_id)
    if response.status_code != 202:
        raise Refused(gm, response)
    status = body(gm, response)
    if ctl.as_json:
        ctl.emit(status)
        return
    stopping = sum(t["state"] in ("launched", "running") for t in status["tasks"])
    states = _counts(Counter(t["state"] for t in status["tasks"]))
    line = f"job {status['job_id']} cancelled at GM {status['gm']} ({gm.url}): {states}"
    ctl.print(line + (f"; {stopping} placed tasks end cancelled once their LM stops them" if stopping else ""))


@job.command(short_help="print what a job's tasks wrote to stdout or stderr")
@click.argument("job_id")
@click.option("--task", "task_id", help="only this task: its id, or its number in the job (default: every task)")
@click.option("--stream", type=click.Choice(["stdout", "stderr"]), default="stdout", show_default=True)
@click.option("--attempt", type=click.IntRange(min=1), help="which attempt of the task (default: its latest)")
@_options()
def logs(ctl: Ctl, job_id: str, task_id: str | None, stream: str, attempt: int | None) -> None:
    """Print what a job's tasks wrote (GM GET /v1/jobs/ID/tasks/TASK/logs): the output the agent that ran each
    kept, bounded and rotated (the newest part). Without --task every task's, each headed by its id; a task with
    no output (not run yet, or a burn task) says why. Exec and container tasks keep output; burn tasks do not."""
    gm, response = _find(ctl, "GET", job_id)
    if response.status_code != 200:
        raise Refused(gm, response)
    status = body(gm, response)
    tasks, full_id = status["tasks"], status["job_id"]  # the job's id: `job_id` in the caller's scope, maybe
    if task_id is not None:
        prefix, _, index = task_id.rpartition(".")  # `<the job's id or name>.<i>`, or `<i>`
        mine = prefix in (job_id, full_id) or full_id.startswith(f"{prefix}~")  # a name, maybe with its scope
        named = (task_id, f"{full_id}.{task_id}", f"{full_id}.{index}" if mine else task_id)
        chosen = [t for t in tasks if t["task_id"] in named]
        if not chosen:
            raise CtlError(f"job {job_id} has no task {task_id} (its tasks: {tasks[0]['task_id']} ..)", REFUSED)
        tasks = chosen
    params = {"stream": stream} | ({"attempt": attempt} if attempt is not None else {})
    found: list[dict[str, Any]] = []
    failures: list[CtlError] = []
    for t in tasks:
        path = f"/v1/jobs/{quote(full_id, safe='')}/tasks/{quote(t['task_id'], safe='')}/logs"
        answer = ctl.api.call(gm, "GET", path, params=params)
        entry: dict[str, Any] = {"task_id": t["task_id"], "state": t["state"]}
        if answer.status_code == 200:
            entry["text"] = answer.text
        elif answer.status_code == 404 and task_id is None:
            entry["error"] = _reason(answer)  # a task that has not run, or keeps no output: the others still print
        else:
            failures.append(Refused(gm, answer))
            entry["error"] = failures[-1].message
        found.append(entry)
    if ctl.as_json:
        ctl.emit(found)
    elif task_id is not None and "text" in found[0]:
        click.echo(found[0]["text"], nl=False)
    else:
        for entry in found:
            click.echo(f"==> {entry['task_id']} ({entry['state']}) {stream} <==")
            text = entry.get("text")
            if text is None:
                click.echo(f"(no output: {entry['error']})")
            elif text:
                click.echo(text, nl=not text.endswith("\n"))
    if failures:
        raise failures[0]


def _jobs(ctl: Ctl, gm: Service, params: dict[str, object], offset: int, count: int | None) -> dict[str, Any]:
    """GM `gm`'s job list from `offset`: `count` jobs (None: all), a page of at most PAGE at a time."""
    listing = ctl.api.get(gm, "/v1/jobs", **params, offset=offset, limit=min(PAGE, count or PAGE))
    jobs = listing["jobs"]
    while listing["next_offset"] is not None and (count is None or len(jobs) < count):
        left = PAGE if count is None else min(PAGE, count - len(jobs))
        listing = ctl.api.get(gm, "/v1/jobs", **params, offset=listing["next_offset"], limit=left)
        jobs += listing["jobs"]
    return {"jobs": jobs, "total": listing["total"]}


@job.command("list", short_help="list jobs: filters by user, queue, state; pages")
@click.option("--user", help="only this user's jobs")
@click.option("--queue", help="only this queue's jobs (a queue is named after its user)")
@click.option("--state", type=click.Choice(JOB_STATES), help="only jobs in this state")
@click.option("--limit", type=click.IntRange(1, PAGE), default=100, show_default=True, help="jobs to show")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True, help="jobs to skip first")
@click.option("--all", "everything", is_flag=True, help="every job that matches (no --limit, --offset)")
@_options()
def list_jobs(
    ctl: Ctl, user: str | None, queue: str | None, state: str | None, limit: int, offset: int, everything: bool
) -> None:
    """List jobs, oldest first (GM GET /v1/jobs); with several GMs, every GM's, merged by submission time."""
    params = {k: v for k, v in (("user", user), ("queue", queue), ("state", state)) if v is not None}
    start, count = (0, None) if everything else (offset, limit)
    if len(ctl.gms) == 1:
        listing = _jobs(ctl, ctl.gms[0], params, start, count)
        page, total = listing["jobs"], listing["total"]
        errors: list[CtlError] = []
    else:  # each GM's first offset + limit jobs, merged; the page is the slice of the merge
        answers, errors = _each(ctl.gms, lambda gm: _jobs(ctl, gm, params, 0, None if count is None else start + count))
        merged = sorted(
            (j for _, listing in answers for j in listing["jobs"]), key=lambda j: (j["submitted_at"] or 0, j["gm"])
        )
        page = merged[start:] if count is None else merged[start : start + count]
        total = sum(listing["total"] for _, listing in answers)
    after = start + len(page)
    listed = {
        "jobs": page,
        "total": total,
        "offset": start,
        "limit": len(page) if count is None else count,
        "next_offset": after if after < total else None,
    }
    if ctl.as_json:
        ctl.emit(listed)
    else:
        table = _table(
            None, "job", "user", "queue", "GM", "state", "tasks", "task states", "submitted", numeric=("GM", "tasks")
        )
        for j in page:
            table.add_row(
                j["job_id"],
                j["user"],
                j["queue"],
                str(j["gm"]),
                j["state"],
                str(j["tasks"]),
                _counts(j["task_states"]),
                _when(j["submitted_at"]),
            )
        ctl.print(table)
        shown = f"jobs {start + 1}-{after} of {total}" if page else f"no jobs from offset {start} of {total}"
        ctl.print(shown + (f"; next page: --offset {after}" if after < total else ""))
    if errors:
        raise errors[0]


def _gm_queues(ctl: Ctl, gm: Service) -> dict[str, Any]:
    """A GM's queues and its tasks per queue (`GET /v1/queues`: a user's own queue only), and its state (`GET
    /v1/state`: None for a user, which may not read it)."""
    queues = ctl.api.get(gm, "/v1/queues")
    state = ctl.api.call(gm, "GET", "/v1/state")
    if state.status_code not in (200, 403):
        raise Refused(gm, state)
    return {
        "url": gm.url,
        "queues": queues,
        "state": body(gm, state) if state.status_code == 200 else None,
        "tasks": queues["tasks"],
    }


@cli.command(short_help="each user queue: share, usage, pending and running tasks")
@_options()
def queues(ctl: Ctl) -> None:
    """Each user queue: share, usage, pending and running tasks (GM GET /v1/queues, /v1/state).

    Under fair scheduling, a queue's usage is that of the GM serving it (exact there); its pending and running
    tasks add up every GM's. Without it, each GM has one queue, `default`. A user sees its own queue only."""
    answers, errors = _each(ctl.gms, lambda gm: _gm_queues(ctl, gm))
    if ctl.as_json:
        ctl.emit([answer for _, answer in answers])
    else:
        _show_queues(ctl, answers)
    if errors:
        raise errors[0]


def _show_queues(ctl: Ctl, answers: list[tuple[Service, dict[str, Any]]]) -> None:
    tasks: dict[tuple[int | None, str], Counter[str]] = {}  # (GM or None under fair scheduling, queue) -> counts
    views: dict[str, dict[str, Any]] = {}  # queue -> the view of the GM serving it, else of the first GM
    for _, answer in answers:
        fair = answer["queues"]["fair_scheduling"]
        for queue, counts in answer["tasks"].items():
            tasks.setdefault((None if fair else answer["queues"]["gm"], queue), Counter()).update(counts)
        for q in answer["queues"]["queues"]:
            if q["own"] or q["user"] not in views:
                views[q["user"]] = q
    used = [_label(name) for name in DEFAULT_RESOURCE_NAMES]
    counted = ("share", *used, "consumption", "pending", "running")
    table = _table("user queues (CPU, memory: used now)", "queue", "GM", *counted, "below share", numeric=counted)
    for queue in views:
        tasks.setdefault((None, queue), Counter())
    for (gm, queue), counts in sorted(tasks.items(), key=lambda item: (item[0][0] or 0, item[0][1])):
        q = views.get(queue)
        if gm is not None or q is None:  # no fair scheduling: each GM's one queue
            table.add_row(
                queue, str(gm), "-", *("-" for _ in used), "-", str(counts["pending"]), str(counts["running"]), "-"
            )
            continue
        table.add_row(
            queue,
            str(q["gm"]),
            f"{100 * q['share']:g}%",
            *(f"{amount:,}" for amount in q["usage"]),
            f"{q['consumption']:g}",
            str(counts["pending"]),
            str(counts["running"]),
            "yes" if q["below_share"] else "no",
        )
    ctl.print(table)
    for gm, answer in answers:
        s = answer["state"]
        if s is None:
            continue  # a user's token: the GM's state is the operators'
        policy = answer["queues"]["policy"] or "off"
        now = f"{s['queued']} queued, {s['waiting']} waiting, {s['running']} running"
        ctl.print(f"GM {s['gm']} ({gm.url}): fair scheduling {policy}; tasks {now}")


def _lm_nodes(ctl: Ctl, lm: Service) -> dict[str, Any]:
    state = ctl.api.get(lm, "/v1/state")
    response = ctl.api.call(lm, "GET", "/v1/cluster")
    return {"url": lm.url, "state": state, "cluster": body(lm, response) if response.status_code == 200 else None}


def _partitions(answer: dict[str, Any]) -> list[tuple[int, range]]:
    """(GM, its nodes' numbers) for each partition of an LM: the LM numbers its nodes across partitions in GM order."""
    found, start = [], 0
    for part in answer["cluster"]["partitions"]:
        found.append((part["gm"], range(start, start + len(part["capacities"]))))
        start += len(part["capacities"])
    return found


def _lms_from_gm(ctl: Ctl) -> None:
    """Without --lm or $MEGHA_LM_URLS, the LM URLs the first GM that answers uses (GM GET /v1/state)."""
    if ctl.lms:
        return
    for gm in ctl.gms:
        try:
            urls = ctl.api.get(gm, "/v1/state").get("lm_urls") or []
        except CtlError:
            continue
        ctl.lms = [Service("LM", u) for u in urls]
        return


@cli.command(short_help="each LM partition: nodes in and out of service, free resources")
@_options(lms=True)
def nodes(ctl: Ctl) -> None:
    """Each LM's partitions: nodes in and out of service, free of capacity, used (LM GET /v1/state, /v1/cluster).

    The LMs come from --lm or $MEGHA_LM_URLS, else from the first GM (the URLs it reaches them at, which may not be
    reachable from here: in containers, give --lm)."""
    _lms_from_gm(ctl)
    if not ctl.lms:
        raise CtlError("give the LMs' URLs with --lm URL (or MEGHA_LM_URLS=URL,URL)", USAGE)
    answers, errors = _each(ctl.lms, lambda lm: _lm_nodes(ctl, lm))
    if ctl.as_json:
        ctl.emit([answer for _, answer in answers])
    else:
        names = next((a["cluster"]["resource_names"] for _, a in answers if a["cluster"]), DEFAULT_RESOURCE_NAMES)
        table = _table(
            "nodes per LM partition (resources: free/capacity)",
            "LM",
            "partition",
            "nodes",
            "in service",
            "out",
            *(_label(n) for n in names),
            "used",
            numeric=("LM", "partition", "nodes", "in service", "out", "used"),
        )
        for _, answer in answers:
            state = answer["state"]
            if answer["cluster"] is None:
                table.add_row(
                    str(state["lm"]),
                    "-",
                    f"{state['registered_nodes']}/{state['expected_nodes']} registered",
                    "-",
                    "-",
                    *("-" for _ in names),
                    "not ready",
                )
                continue
            down = {int(n) for n in state["down_nodes"]}
            for gm, numbers in _partitions(answer):
                free = _total((state["free"][n] for n in numbers), len(names))
                capacity = _total((state["capacity"][n] for n in numbers), len(names))
                out = len(down.intersection(numbers))
                table.add_row(
                    str(state["lm"]),
                    f"GM {gm}",
                    str(len(numbers)),
                    str(len(numbers) - out),
                    str(out),
                    *_amounts(free, capacity),
                    _used(free, capacity),
                )
        ctl.print(table)
        for lm, answer in answers:
            state = answer["state"]
            held = f"tasks running {state['running']}, logical nodes {state['logical_nodes']}"
            ctl.print(f"LM {state['lm']} ({lm.url}): worker agents {state['workers']}, {held}")
            for node, why in state["down_nodes"].items():
                ctl.print(f"  node {node} out of service: {why}")
    if errors:
        raise errors[0]


# ------------------------------------------------------------------------------------------------ top


@dataclass
class Frame:
    """One refresh of `megha top`: each service's answer, or why it gave none."""

    gms: list[tuple[Service, dict[str, Any] | CtlError]]
    lms: list[tuple[Service, dict[str, Any] | CtlError]]

    @property
    def errors(self) -> list[CtlError]:
        return [a for _, a in (*self.gms, *self.lms) if isinstance(a, CtlError)]

    def as_json(self) -> dict[str, list[dict[str, Any]]]:
        def one(service: Service, answer: dict[str, Any] | CtlError) -> dict[str, Any]:
            return {"url": service.url, **(answer if isinstance(answer, dict) else {"error": answer.message})}

        return {"gms": [one(*a) for a in self.gms], "lms": [one(*a) for a in self.lms]}


def _gm_top(ctl: Ctl, gm: Service) -> dict[str, Any]:
    jobs = {s: ctl.api.get(gm, "/v1/jobs", state=s, limit=1)["total"] for s in JOB_STATES}
    return {"state": ctl.api.get(gm, "/v1/state"), "jobs": jobs}


def _guarded(
    ask: Callable[[Service], dict[str, Any]],
) -> Callable[[Service], tuple[Service, dict[str, Any] | CtlError]]:
    def run(service: Service) -> tuple[Service, dict[str, Any] | CtlError]:
        try:
            return service, ask(service)
        except CtlError as exc:
            return service, exc

    return run


def _fetch(ctl: Ctl, pool: ThreadPoolExecutor) -> Frame:
    gms = pool.map(_guarded(lambda gm: _gm_top(ctl, gm)), ctl.gms)
    lms = pool.map(_guarded(lambda lm: ctl.api.get(lm, "/v1/state")), ctl.lms)
    return Frame(list(gms), list(lms))


def _render(frame: Frame, interval: float) -> Group:
    gms = _table(
        "GMs (tasks)",
        "GM",
        "queued",
        "waiting",
        "running",
        "unfinished",
        numeric=("queued", "waiting", "running", "unfinished"),
    )
    jobs = _table("jobs by state", "GM", *JOB_STATES, numeric=JOB_STATES)
    totals: Counter[str] = Counter()
    for _, answer in frame.gms:
        if isinstance(answer, CtlError):
            continue
        s = answer["state"]
        gms.add_row(str(s["gm"]), str(s["queued"]), str(s["waiting"]), str(s["running"]), str(s["unfinished_tasks"]))
        jobs.add_row(str(s["gm"]), *(str(answer["jobs"][state]) for state in JOB_STATES))
        totals.update(answer["jobs"])
    if len(frame.gms) > 1:
        jobs.add_row("all", *(str(totals[state]) for state in JOB_STATES), style="bold")
    amounts = [_label(name) for name in DEFAULT_RESOURCE_NAMES]
    counted = ("nodes", "out of service", "running", *amounts, "used")
    lms = _table("LMs (resources: free/capacity)", "LM", *counted, numeric=counted)
    for _, answer in frame.lms:
        if isinstance(answer, CtlError):
            continue
        free = _total(answer["free"], len(amounts))
        capacity = _total(answer["capacity"], len(amounts))
        lms.add_row(
            str(answer["lm"]),
            str(answer["registered_nodes"]),
            str(len(answer["down_nodes"])),
            str(answer["running"]),
            *_amounts(free, capacity),
            _used(free, capacity),
        )
    parts: list[Any] = [
        Text(f"megha top  {time.strftime('%H:%M:%S')}  every {interval:g} s  (Ctrl-C quits)", style="bold"),
        gms,
        jobs,
    ]
    parts.append(lms if frame.lms else Text("LMs: give --lm URL or MEGHA_LM_URLS to see their nodes", style="dim"))
    parts += [Text(error.message, style="red") for error in frame.errors]
    return Group(*parts)


@cli.command(short_help="a live view of GMs, LMs and jobs")
@click.option(
    "--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True, help="seconds between refreshes"
)
@click.option("--iterations", type=click.IntRange(min=0), default=0, help="refreshes before exiting (0: until Ctrl-C)")
@_options(lms=True)
def top(ctl: Ctl, interval: float, iterations: int) -> None:
    """A live view: each GM's queued, waiting and running tasks and its jobs by state; each LM's free and used
    resources. Ctrl-C quits (exit status 0). With --json, one JSON object per refresh."""
    _lms_from_gm(ctl)
    pool = ThreadPoolExecutor(max_workers=max(4, len(ctl.gms) + len(ctl.lms)))
    live = Live(console=ctl.console, auto_refresh=False) if ctl.console.is_terminal and not ctl.as_json else None
    frame = None
    try:
        with live or nullcontext():
            done = 0
            while True:
                frame = _fetch(ctl, pool)
                if ctl.as_json:
                    click.echo(json.dumps(frame.as_json()))
                elif live is not None:
                    live.update(_render(frame, interval), refresh=True)
                else:  # not a terminal: one frame after another
                    ctl.print(_render(frame, interval))
                done += 1
                if done == iterations:
                    break
                time.sleep(interval)
    except KeyboardInterrupt:
        return
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    if frame is not None and frame.errors:
        raise frame.errors[0]
