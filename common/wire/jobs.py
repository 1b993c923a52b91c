"""The job API of a GM: submissions (`POST /v1/jobs`), a job's status and the list of jobs, and job ids.

Every model forbids unknown fields and validates strictly, so bad input fails at the edge with a 422 naming the
field ("tasks.3.cpu_millicores").
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Annotated, Literal, Self

from pydantic import Field, ValidationError, model_validator

from megha.common.core.resources import CPU, MEMORY, Resources
from megha.common.core.retry import MAX_ATTEMPTS, MAX_BACKOFF_S
from megha.common.core.retry import RetryRule as CoreRetryRule
from megha.common.core.task import JobSpec, RunSpec, TaskSpec
from megha.common.wire.fields import (
    ARRAY_INDEX,
    JOB_SCOPE,
    MAX_ARRAY_RUN_CHARS,
    MAX_DEPENDENCIES,
    MAX_ENV,
    MAX_TASKS_PER_JOB,
    Argv,
    ConstraintIds,
    Count,
    Driver,
    Env,
    Image,
    Index,
    JobId,
    JobRef,
    Name,
    Request,
    Timestamp,
    User,
    UserName,
    WireModel,
    Workdir,
    check_run,
    field_error,
    mask_of,
)

MAX_TASK_SECONDS = 365 * 24 * 3600.0
"""The longest `duration` a task may ask for: a year (31,536,000 s). A burn task holds its node for its duration
and an exec or container task's limit bounds how long it may hold one; a longer one (1e300, say) would hold a node
for ever. Within this bound, a run's end time stays exact to well under a millisecond."""
TaskSeconds = Annotated[float, Field(ge=0, le=MAX_TASK_SECONDS, allow_inf_nan=False)]


class TaskRequest(WireModel):
    """One task of a submitted job. `user` defaults to the job's user. A duration of 0 is allowed: traces hold
    tasks that last 0 s.

    `driver` says what the task runs (Nomad's task drivers): `burn` (the default) burns `cpu_millicores` of CPU
    for `duration` CPU-seconds and holds `memory_mb`; `exec` runs `command` (argv) with `env` in `workdir` as an
    unprivileged user; `container` runs `image` (with `command` instead of the image's own, if given) through the
    Docker engine. For exec and container `duration` is optional: a time limit in seconds (0 or none: no limit);
    CPU and memory are enforced as limits. Exit code 0 is `finished`, any other `failed`.

    `queueable` (a bool, default false) makes the task opportunistic (Mercury's QUEUEABLE containers,
    docs/queueable.md): it may wait in a node's queue beyond the node's free resources, runs when they free, and is
    evicted (then runs again) when a guaranteed task needs its room; it never delays a guaranteed task."""

    duration: TaskSeconds | None = None
    cpu_millicores: Request
    memory_mb: Request
    constraints: ConstraintIds = []
    user: UserName | None = None
    driver: Driver = "burn"
    command: Argv = []
    image: Image = ""
    env: Env = {}
    workdir: Workdir = ""
    queueable: bool = False

    @model_validator(mode="after")
    def _driver_fields(self) -> Self:
        if self.driver == "burn" and self.duration is None:
            raise field_error("duration", None, "the burn driver needs a duration (CPU-seconds to burn)")
        check_run(self.driver, self.command, self.image, self.env, self.workdir)
        return self

    def run(self) -> RunSpec | None:
        """What the task runs instead of burning (None for burn)."""
        if self.driver == "burn":
            return None
        return RunSpec(self.driver, tuple(self.command), self.image, tuple(self.env.items()), self.workdir)

    def request(self, resource_names: Sequence[str]) -> Resources:
        """The request aligned to `resource_names`: 0 for resources the API cannot ask for (say, GPUs)."""
        return _aligner(resource_names)(self.cpu_millicores, self.memory_mb)


GangTimeoutSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A gang's `gang_timeout`: seconds, above 0."""


def _aligner(resource_names: Sequence[str]) -> Callable[[int, int], Resources]:
    """A function from (CPU, memory) to a request aligned to `resource_names`; ValueError if either is missing."""
    missing = [n for n in (CPU, MEMORY) if n not in resource_names]
    if missing:
        raise ValueError(f"resource names {list(resource_names)} lack {missing}")
    if tuple(resource_names) == (CPU, MEMORY):
        return lambda cpu, memory: (cpu, memory)
    names = tuple(resource_names)
    return lambda cpu, memory: tuple({CPU: cpu, MEMORY: memory}.get(n, 0) for n in names)


def scoped_job_id(user: str, job_id: str) -> str:
    """The id of job `job_id` in `user`'s scope: `<user>~<job_id>`, unchanged when `job_id` is scoped already."""
    return job_id if JOB_SCOPE in job_id else f"{user}{JOB_SCOPE}{job_id}"


_GM_MADE = re.compile(r"^g(\d{1,4})-[0-9a-z]{1,9}-\d+$")


def made_by(job_id: str) -> int | None:
    """The GM that named job `job_id` (`g<gm>-...`, or a user's `<user>~<name>~g<gm>-...`); None for an id an
    operator chose."""
    found = _GM_MADE.match(job_id.rpartition(JOB_SCOPE)[2])
    return None if found is None else int(found[1])


def job_scope(job_id: str) -> str | None:
    """The user whose scope job id `job_id` is in (None for a GM-made id or an operator's unscoped one)."""
    user, scope, _ = job_id.partition(JOB_SCOPE)
    return user if scope else None


ExitCode = Annotated[int, Field(ge=1, le=255)]
"""A non-zero process exit code."""


class RetryRule(WireModel):
    """A job's retry policy (`JobSubmission.retry`; docs/retry.md): a task's run that fails with an exit code the
    rule names runs again, as the task's next attempt, after a jittered exponential backoff.

    `max_attempts`: how many runs of a task may fail, 1-100 (1: never retried; 3: at most 2 retries). Preempted runs
    and runs whose worker was lost do not count (MEGHA_MAX_ATTEMPTS bounds those). `backoff_s`: seconds before the
    first retry, 0-3600; the k-th retry waits `backoff_s * 2**(k-1)` (at most 3600 s), times a random factor in
    [0.5, 1.5). `on_exit_codes`: the exit codes retried (1-255); empty (the default) retries any non-zero exit code.
    Only exec and container tasks have exit codes: a signal n reports 128 + n, a memory-limit kill 137; a burn task,
    a run over its duration limit and one that could not start have none and are never retried."""

    max_attempts: Annotated[int, Field(ge=1, le=MAX_ATTEMPTS)]
    backoff_s: Annotated[float, Field(ge=0, le=MAX_BACKOFF_S, allow_inf_nan=False)] = 1.0
    on_exit_codes: Annotated[list[ExitCode], Field(max_length=255)] = []

    def to_core(self) -> CoreRetryRule:
        return CoreRetryRule(self.max_attempts, self.backoff_s, frozenset(self.on_exit_codes))

    @classmethod
    def from_core(cls, rule: CoreRetryRule) -> RetryRule:
        return cls(max_attempts=rule.max_attempts, backoff_s=rule.backoff_s, on_exit_codes=sorted(rule.on_exit_codes))


PriorityClassName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
"""A priority class a job names: one of the GMs' MEGHA_PRIORITY_CLASSES (1-64 letters, digits or _ . -)."""


class JobSubmission(WireModel):
    """Body of GM `POST /v1/jobs`. Without `job_id` the GM names the job.

    `priority_class` names one of the GM's MEGHA_PRIORITY_CLASSES (default `low:0,normal:100,high:1000`; None: the
    default class, `normal`); an unknown one is refused with 422 naming `priority_class`. A higher class is served
    first and, under contention, preempts running tasks of lower classes whatever the users' shares; fair share
    orders users within a class (docs/priority.md).

    With authentication on, every user a submission names (`user`, each task's `user`) must be the caller unless
    the caller is an operator, and a user who names none submits as itself. A job id a user chooses lives in that
    user's scope, made unique: the GM answers it as `<user>~<job_id>~<gm-made id>`, and the name finds the job while
    the GM holds it (docs/security.md, "Identities and privacy").

    `gang`: every task of the job starts, or none does (docs/gang.md): the GM places the tasks as one unit, on one
    LM when they fit there, else across LMs by prepare/commit; a gang that does not fit waits whole, and a
    preempted or lost task stops the rest and the gang runs again as a whole, and with a `retry` rule a failed
    task does too (every task runs again, failures counted per gang). `gang_timeout`: how long (seconds,
    > 0) a gang may wait to be placed before it fails with a reason; absent, it waits for ever. Only with `gang`."""

    tasks: Annotated[list[TaskRequest], Field(min_length=1, max_length=MAX_TASKS_PER_JOB)]
    user: UserName = "default"
    job_id: JobId | None = None
    depends_on: Annotated[
        list[JobRef],
        Field(
            max_length=MAX_DEPENDENCIES,
            description="jobs that must all finish before this one runs (their ids, or names in the caller's scope), "
            "wherever in the federation they were submitted: the job is `waiting` until then, and fails without "
            "running if one of them fails or is cancelled (docs/dependencies.md)",
        ),
    ] = []
    array: (
        Annotated[
            int,
            Field(
                ge=1,
                le=MAX_TASKS_PER_JOB,
                description="a job array: the one task template in `tasks` runs as this many tasks, task i with "
                "MEGHA_ARRAY_INDEX=i in its environment (exec and container drivers)",
            ),
        ]
        | None
    ) = None
    retry: RetryRule | None = None
    """Run failed tasks again by exit code, after a backoff (`RetryRule`); None: a failed run fails its task."""
    priority_class: PriorityClassName | None = None
    gang: bool = False
    gang_timeout: GangTimeoutSeconds | None = None

    @model_validator(mode="after")
    def _dependencies_and_array(self) -> Self:
        if self.array is not None and len(self.tasks) != 1:
            raise field_error("array", self.array, f"an array job has exactly one task template, not {len(self.tasks)}")
        if self.array is not None and self.tasks[0].driver != "burn":
            template = self.tasks[0]
            env = template.env | {ARRAY_INDEX: str(self.array - 1)}
            if len(env) > MAX_ENV:
                raise field_error("array", self.array, f"the template's env leaves no room for {ARRAY_INDEX}")
            try:
                check_run(template.driver, template.command, template.image, env, template.workdir)
            except ValidationError:
                raise field_error("array", self.array, f"the template's run leaves no room for {ARRAY_INDEX}") from None
            run_chars = sum(map(len, template.command)) + len(template.image) + len(template.workdir)
            run_chars += sum(len(k) + len(v) for k, v in env.items())
            if self.array * run_chars > MAX_ARRAY_RUN_CHARS:
                raise field_error(
                    "array",
                    self.array,
                    f"{self.array} runs of a template of {run_chars:,} characters (command, env, image, workdir) are "
                    f"over {MAX_ARRAY_RUN_CHARS:,} in all: a small request must not hold every service's memory",
                )
        seen: set[str] = set()
        for i, parent in enumerate(self.depends_on):
            if parent in seen:
                raise field_error(f"depends_on.{i}", parent, f"job {parent} is named twice")
            if self.job_id is not None and parent in (self.job_id, scoped_job_id(self.user, self.job_id)):
                raise field_error(f"depends_on.{i}", parent, "a job cannot depend on itself")
            seen.add(parent)
        return self

    @model_validator(mode="after")
    def _gang_fields(self) -> Self:
        if self.gang_timeout is not None and not self.gang:
            raise field_error("gang_timeout", self.gang_timeout, "gang_timeout is only for a gang job (gang: true)")
        if self.gang and (queued := next((i for i, t in enumerate(self.tasks) if t.queueable), None)) is not None:
            raise field_error(
                f"tasks.{queued}.queueable",
                True,
                "a gang's tasks are not queueable: a queued member would leave its gang part-started",
            )
        return self

    @property
    def core_gang(self) -> float | None:
        """`JobSpec.gang`: None for a job that is no gang, else its timeout (inf: none)."""
        return None if not self.gang else (math.inf if self.gang_timeout is None else self.gang_timeout)

    def named_users(self) -> list[tuple[str, str]]:
        """(field, user) for every user this submission names explicitly: `user`, `tasks.i.user`."""
        named = [("user", self.user)] if "user" in self.model_fields_set else []
        return named + [(f"tasks.{i}.user", t.user) for i, t in enumerate(self.tasks) if t.user is not None]

    @property
    def owner(self) -> str:
        """The job's user, as the GM's job table lists it: its first task's."""
        return self.tasks[0].user or self.user

    def to_job(self, job_id: str, resource_names: Sequence[str], submitted_at: float, priority: int = 0) -> JobSpec:
        """The core's job of this submission, named `job_id`, submitted at `submitted_at`; `priority` is the value of
        its class."""
        return JobSpec(
            job_id,
            self.to_tasks(job_id, resource_names, priority),
            submitted_at,
            tuple(self.depends_on),
            retry=None if self.retry is None else self.retry.to_core(),
            gang=self.core_gang,
        )

    def to_tasks(self, job_id: str, resource_names: Sequence[str], priority: int = 0) -> tuple[TaskSpec, ...]:
        """The core's tasks of this job: task i is f"{job_id}.{i}" (an array's task i runs with
        MEGHA_ARRAY_INDEX=i); `priority` is the value of its class."""
        align = _aligner(resource_names)
        if self.array is not None:
            return array_tasks(job_id, self.tasks[0], self.user, self.array, align, priority)
        return tuple(
            TaskSpec(
                f"{job_id}.{i}",
                job_id,
                t.user or self.user,
                t.duration or 0.0,
                align(t.cpu_millicores, t.memory_mb),
                mask_of(t.constraints),
                run=t.run(),
                priority=priority,
                queueable=t.queueable,
            )
            for i, t in enumerate(self.tasks)
        )


def array_tasks(
    job_id: str, template: TaskRequest, user: str, n: int, align: Callable[[int, int], Resources], priority: int = 0
) -> tuple[TaskSpec, ...]:
    """The `n` tasks of an array job from its one task template: task i sees MEGHA_ARRAY_INDEX=i (exec and
    container drivers: burn tasks have no environment)."""
    request = align(template.cpu_millicores, template.memory_mb)
    mask = mask_of(template.constraints)
    run = template.run()
    return tuple(
        TaskSpec(
            f"{job_id}.{i}",
            job_id,
            template.user or user,
            template.duration or 0.0,
            request,
            mask,
            run=None if run is None else replace(run, env=(*run.env, (ARRAY_INDEX, str(i)))),
            priority=priority,
        )
        for i in range(n)
    )


class JobAccepted(WireModel):
    """Response of GM `POST /v1/jobs` (201): the job's id, its tasks' ids in submission order, the GM."""

    job_id: Name
    task_ids: list[Name]
    gm: Index


TaskState = Literal["queued", "launched", "running", "finished", "failed", "cancelled"]
JobState = Literal["queued", "running", "finished", "failed", "cancelled", "waiting"]
"""A job is `cancelled` once cancelled (DELETE /v1/jobs/{id}); else `finished` when every task finished, `failed`
when every task ended and one failed, `running` while a task is placed, `waiting` while a job it depends on has not
finished (`depends_on`), and `queued` before."""


class TaskStatus(WireModel):
    """One task in GM `GET /v1/jobs/{id}`. Times are unix seconds; `lm`/`node` are set once placed.

    `attempts` counts placements sent to an LM, `inconsistencies` those an LM rejected for a stale view,
    `preemptions` the times the task was stopped for another user's task (it then runs again), `retries` the
    times it ran again because its worker was lost (at most MEGHA_MAX_ATTEMPTS - 1), `failures_retried` the times
    it ran again because a run failed and its job's retry rule matched (at most `retry.max_attempts` - 1).
    `queueable`: submitted as queueable (its evictions by guaranteed tasks count among its `preemptions`).
    `started_at`: when the task's last run that finished or failed started on its worker, as the worker measured it
    (a GM hears of a start with the run's end: null while the task runs, and after a GM restart).
    """

    task_id: Name
    state: TaskState
    arrival: Timestamp | None = None
    launched_at: Timestamp | None = None
    started_at: Timestamp | None = None
    finished_at: Timestamp | None = None
    lm: Index | None = None
    node: Index | None = None
    attempts: Count = 0
    inconsistencies: Count = 0
    repartitioned: bool = False
    preemptions: Count = 0
    retries: Count = 0
    failed_reason: str | None = None
    failures_retried: Count = 0
    queueable: bool = False


class JobStatus(WireModel):
    """Response of GM `GET /v1/jobs/{id}`, and of `DELETE /v1/jobs/{id}` (202: queued tasks are cancelled at once,
    placed ones once their LM has stopped them). `priority_class`: the job's class (the default one when it named
    none)."""

    job_id: Name
    user: User
    gm: Index
    state: JobState = "queued"
    depends_on: list[Name] = Field(default=[], description="the jobs this one waits for, by their ids")
    array: Count | None = Field(default=None, description="the array size, for an array job")
    retry: RetryRule | None = None
    priority_class: Name | None = None
    gang: bool = False
    gang_timeout: GangTimeoutSeconds | None = None
    tasks: list[TaskStatus]


class JobSummary(WireModel):
    """One job in GM `GET /v1/jobs`: its state, how many of its tasks are in each task state, and what kind of job it
    is (its class, gang, array, parents, retry rule: `GET /v1/jobs/{id}` shows each in full)."""

    job_id: Name
    user: User
    queue: User = Field(description="the user's queue (under fair scheduling each user has one, named after it)")
    gm: Index
    state: JobState
    submitted_at: Timestamp | None = None
    tasks: Count
    task_states: dict[TaskState, Count]
    priority_class: Name | None = Field(
        default=None, description="the job's priority class (the default one when it named none)"
    )
    gang: bool = Field(default=False, description="every task of the job starts, or none does")
    array: Count | None = Field(default=None, description="the array size, for an array job")
    depends_on: list[Name] = Field(default=[], description="the jobs this one waits for, by their ids")
    retry: bool = Field(default=False, description="the job has a retry rule (GET /v1/jobs/{id} shows it)")


class JobList(WireModel):
    """Response of GM `GET /v1/jobs`: a page of the jobs this GM holds (oldest first), with the number that
    matched the filters and the offset of the next page (None on the last one)."""

    jobs: list[JobSummary]
    total: Count
    offset: Count
    limit: Count
    next_offset: Count | None = None


# --- The job event stream (GM `GET /v1/jobs/{id}/events`, server-sent events) -----------------------------------
#
# Each event is a `event: <name>` line and a `data: <JSON>` line: `state` (a `JobStatus`: the job as it is when the
# stream opens), then `task` (a `TaskTransition`) for each change the GM sees, then `end` (a `JobEnd`), after which
# the GM closes the stream. `error` (an `ErrorBody`) ends a stream early: the reader fell behind, or the GM is
# recovering its jobs; opening the stream again starts from the job's state.

JOB_EVENT_NAMES = ("state", "task", "end", "error")
"""The `event:` names of the stream, in the order a job's stream uses them."""

TaskChange = Literal["launched", "requeued", "preempted", "lost", "finished", "failed", "cancelled", "retrying"]
"""`launched`: placed on an LM; `requeued`: the LM rejected the placement (an inconsistency), back in the queue;
`preempted`, `lost`: its run stopped, it runs again; `finished`, `failed`, `cancelled`: the task ended;
`retrying`: its run failed and the job's retry rule runs it again after a backoff (`reason` says when)."""


class TaskTransition(WireModel):
    """A `task` event of the job event stream: what happened to a task's `attempt` at unix time `at`, where (LM,
    node; a node is None while the LM chooses it), and why (`reason`, for `failed`, `lost` and `cancelled`)."""

    kind: TaskChange
    task_id: Name
    attempt: Annotated[int, Field(ge=1)] = 1
    at: Timestamp
    lm: Index | None = None
    node: Index | None = None
    reason: str = ""


class JobEnd(WireModel):
    """The `end` event of the job event stream: every task of the job ended; its `state` is the job's outcome."""

    job_id: Name
    state: JobState
    at: Timestamp
