"""The job API of a GM: submissions (`POST /v1/jobs`), a job's status and the list of jobs, and job ids.

Every model forbids unknown fields and validates strictly, so bad input fails at the edge with a 422 naming the
field ("tasks.3.cpu_millicores").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from megha.common.core.resources import CPU, MEMORY, Resources
from megha.common.core.task import RunSpec, TaskSpec
from megha.common.wire.fields import (
    JOB_SCOPE,
    MAX_TASKS_PER_JOB,
    Argv,
    ConstraintIds,
    Count,
    Driver,
    Env,
    Image,
    Index,
    JobId,
    Name,
    Seconds,
    Timestamp,
    User,
    UserName,
    WireModel,
    Workdir,
    check_run,
    field_error,
    mask_of,
)


class TaskRequest(WireModel):
    """One task of a submitted job. `user` defaults to the job's user. A duration of 0 is allowed: traces hold
    tasks that last 0 s.

    `driver` says what the task runs (Nomad's task drivers): `burn` (the default) burns `cpu_millicores` of CPU
    for `duration` CPU-seconds and holds `memory_mb`; `exec` runs `command` (argv) with `env` in `workdir` as an
    unprivileged user; `container` runs `image` (with `command` instead of the image's own, if given) through the
    Docker engine. For exec and container `duration` is optional: a time limit in seconds (0 or none: no limit);
    CPU and memory are enforced as limits. Exit code 0 is `finished`, any other `failed`."""

    duration: Seconds | None = None
    cpu_millicores: Annotated[int, Field(gt=0)]
    memory_mb: Annotated[int, Field(gt=0)]
    constraints: ConstraintIds = []
    user: UserName | None = None
    driver: Driver = "burn"
    command: Argv = []
    image: Image = ""
    env: Env = {}
    workdir: Workdir = ""

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


class JobSubmission(WireModel):
    """Body of GM `POST /v1/jobs`. Without `job_id` the GM names the job.

    With authentication on, every user a submission names (`user`, each task's `user`) must be the caller unless
    the caller is an operator, and a user who names none submits as itself. A job id a user chooses lives in that
    user's scope, made unique: the GM answers it as `<user>~<job_id>~<gm-made id>`, and the name finds the job while
    the GM holds it (docs/security.md, "Identities and privacy")."""

    tasks: Annotated[list[TaskRequest], Field(min_length=1, max_length=MAX_TASKS_PER_JOB)]
    user: UserName = "default"
    job_id: JobId | None = None

    def named_users(self) -> list[tuple[str, str]]:
        """(field, user) for every user this submission names explicitly: `user`, `tasks.i.user`."""
        named = [("user", self.user)] if "user" in self.model_fields_set else []
        return named + [(f"tasks.{i}.user", t.user) for i, t in enumerate(self.tasks) if t.user is not None]

    @property
    def owner(self) -> str:
        """The job's user, as the GM's job table lists it: its first task's."""
        return self.tasks[0].user or self.user

    def to_tasks(self, job_id: str, resource_names: Sequence[str]) -> tuple[TaskSpec, ...]:
        """The core's tasks of this job: task i is f"{job_id}.{i}"."""
        align = _aligner(resource_names)
        return tuple(
            TaskSpec(
                f"{job_id}.{i}",
                job_id,
                t.user or self.user,
                t.duration or 0.0,
                align(t.cpu_millicores, t.memory_mb),
                mask_of(t.constraints),
                run=t.run(),
            )
            for i, t in enumerate(self.tasks)
        )


class JobAccepted(WireModel):
    """Response of GM `POST /v1/jobs` (201): the job's id, its tasks' ids in submission order, the GM."""

    job_id: Name
    task_ids: list[Name]
    gm: Index


TaskState = Literal["queued", "launched", "running", "finished", "failed", "cancelled"]
JobState = Literal["queued", "running", "finished", "failed", "cancelled"]
"""A job is `cancelled` once cancelled (DELETE /v1/jobs/{id}); else `finished` when every task finished, `failed`
when every task ended and one failed, `running` while a task is placed, and `queued` before."""


class TaskStatus(WireModel):
    """One task in GM `GET /v1/jobs/{id}`. Times are unix seconds; `lm`/`node` are set once placed.

    `attempts` counts placements sent to an LM, `inconsistencies` those an LM rejected for a stale view,
    `preemptions` the times the task was stopped for another user's task (it then runs again), `retries` the
    times it ran again because its worker was lost (at most MEGHA_MAX_ATTEMPTS - 1).
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


class JobStatus(WireModel):
    """Response of GM `GET /v1/jobs/{id}`, and of `DELETE /v1/jobs/{id}` (202: queued tasks are cancelled at once,
    placed ones once their LM has stopped them)."""

    job_id: Name
    user: User
    gm: Index
    state: JobState = "queued"
    tasks: list[TaskStatus]


class JobSummary(WireModel):
    """One job in GM `GET /v1/jobs`: its state and how many of its tasks are in each task state."""

    job_id: Name
    user: User
    queue: User = Field(description="the user's queue (under fair scheduling each user has one, named after it)")
    gm: Index
    state: JobState
    submitted_at: Timestamp | None = None
    tasks: Count
    task_states: dict[TaskState, Count]


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

TaskChange = Literal["launched", "requeued", "preempted", "lost", "finished", "failed", "cancelled"]
"""`launched`: placed on an LM; `requeued`: the LM rejected the placement (an inconsistency), back in the queue;
`preempted`, `lost`: its run stopped, it runs again; `finished`, `failed`, `cancelled`: the task ended."""


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
