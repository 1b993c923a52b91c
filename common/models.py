"""Wire contracts: every REST body and every RabbitMQ message of the services, as pydantic v2 models.

The services and the tests import these models; the core stays pydantic-free and exchanges the dataclasses of
`megha.common.core.messages`. Each core mirror (`...Model`) converts losslessly with `from_core(obj)` and
`to_core()`, so core -> model -> JSON -> model -> core gives back an equal object; `core_json(obj)` writes the
same JSON straight from the core object (the services' send path). On the wire:

* resources travel as lists of ints aligned to the data centre's resource names (`ClusterSpec.resource_names`);
* placement constraints travel as lists of ids 0..20 without duplicates (`from_core` writes them sorted); the
  core packs them into a bit mask;
* times are floats in seconds (unix seconds in the services, simulated seconds under the simulator).

Every model forbids unknown fields and validates strictly (a JSON string "5" is not an int; a JSON int is a
fine float; NaN and infinities are refused), so bad input fails at the edge with a 422 naming the field:
`validation_error_body` turns a `pydantic.ValidationError` into an `ErrorBody` with paths like
"tasks.3.cpu_millicores".

Routes (all versioned): GM `POST /v1/jobs` (`JobSubmission` -> `JobAccepted`), GM `GET /v1/jobs/{id}`
(`JobStatus`), LM `POST /v1/workers` (`WorkerRegistration` -> `WorkerRegistered`), GM -> LM launch
(`LaunchBatchModel` -> `LaunchResponseModel`), LM -> worker (`WorkerLaunchModel`); preemption mirrors
(`PreemptRequestModel`, `PreemptResponseModel`, `WorkerPreemptModel`) have no route yet. Broker messages: LM -> GM
`DeltaModel` and `CompletionsModel`, worker -> LM `WorkerReportModel`, each in a `BrokerMessage` envelope, and
worker -> load generator `TaskEvent`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, to_json

from megha.common.auth import USER_NAME
from megha.common.core.constraints import NUM_CONSTRAINTS, constraint_mask, iter_bits
from megha.common.core.messages import (
    Completion,
    Completions,
    Delta,
    FinishedTask,
    LaunchBatch,
    LaunchResponse,
    NodeState,
    Placement,
    PreemptRequest,
    PreemptResponse,
    Rejection,
    StopRequest,
    Victim,
    WorkerLaunch,
    WorkerPreempt,
    WorkerReport,
)
from megha.common.core.resources import CPU, MEMORY, Resources
from megha.common.core.task import DRIVERS, RunSpec, TaskSpec

MAX_BODY_BYTES = 4 * 1024 * 1024
"""Largest request body a service accepts (413 above it). A maximal `JobSubmission` of burn tasks (10,000 tasks,
every constraint, 64-character users) is about 2.3 MB of compact JSON, 3.5 MB indented."""

MAX_TASKS_PER_JOB = 10_000
MAX_NODES_PER_WORKER = 100_000
"""An agent in simulated-execution mode may stand for many nodes; this bounds one registration."""


def _unique(ids: list[int]) -> list[int]:
    if len(set(ids)) != len(ids):
        duplicates = sorted(i for i, n in Counter(ids).items() if n > 1)
        raise ValueError(f"duplicate constraint ids {duplicates}")
    return ids


def _distinct(drivers: list[str]) -> list[str]:
    if len(set(drivers)) != len(drivers):
        raise ValueError(f"drivers {drivers} name one twice")
    return drivers


def _ids(mask: int) -> list[int]:
    return list(iter_bits(mask)) if mask else []


def _mask(ids: list[int]) -> int:
    return constraint_mask(ids) if ids else 0


# Field types shared by the models. Integers and strings are strict through `WireModel.model_config`.
Index = Annotated[int, Field(ge=0)]
"""A GM, LM or node number, a sequence number or a version."""
Count = Annotated[int, Field(ge=0)]
Name = Annotated[str, Field(min_length=1, max_length=256)]
"""A task, job or worker id as the services generate them."""
User = Annotated[str, Field(min_length=1, max_length=64)]
UserName = Annotated[str, Field(pattern=USER_NAME.pattern)]
"""A user a submission names: 1-64 letters, digits or _ . @ - (as API tokens' users are); user names go into job
ids (`scoped_job_id`), which travel in URLs and as task ids."""
JOB_SCOPE = "~"
"""Between the user and the name of a job id a user chose, `<user>~<name>`, and before the GM-made id that makes it
unique, `<user>~<name>~<gm-made id>` (none of them holds it)."""
JobId = Annotated[str, Field(pattern=r"^([A-Za-z0-9_.@-]{1,64}~)?[A-Za-z0-9_.-]{1,64}$")]
"""A job id a client may choose: a name of 1-64 letters, digits or _ . -, or the name in a user's scope,
`<user>~<name>` (`scoped_job_id`); the GM makes the job's id unique, `<user>~<name>~<gm-made id>`. Task ids are
f"{job_id}.{i}"."""
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Timestamp = Annotated[float, Field(allow_inf_nan=False)]
ConstraintId = Annotated[int, Field(ge=0, le=NUM_CONSTRAINTS - 1)]
ConstraintIds = Annotated[list[ConstraintId], Field(max_length=NUM_CONSTRAINTS), AfterValidator(_unique)]
Amounts = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
"""A resource vector aligned to the data centre's resource names."""
ResourceName = Annotated[str, Field(min_length=1, max_length=64)]
Driver = Literal["burn", "exec", "container"]
"""A task driver (`megha.common.core.task.DRIVERS`)."""

MAX_ARGS = 256
MAX_ARG_CHARS = 16_384
MAX_ENV = 128
MAX_RUN_CHARS = 65_536
"""Most characters of one task's command, environment and working directory together: one such task stays far
under MAX_BODY_BYTES in a launch body (a batch of many is split: `split_json`)."""
Arg = Annotated[str, Field(max_length=MAX_ARG_CHARS, pattern=r"^[^\x00]*$")]
"""One argument or environment value: any text without NUL (which an exec cannot pass)."""
Argv = Annotated[list[Arg], Field(max_length=MAX_ARGS)]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
Env = Annotated[dict[EnvName, Arg], Field(max_length=MAX_ENV)]
Image = Annotated[
    str,
    Field(
        max_length=255,
        pattern=r"^(|([a-zA-Z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*"
        r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?)$",
    ),
]
"""A Docker image reference (`name[:tag][@digest]`, an optional registry host first), or "" for none."""
Workdir = Annotated[str, Field(max_length=4096, pattern=r"^(|/[^\x00]*)$")]
"""An absolute path, or "" for the driver's default."""


def _field_error(field: str, value: object, message: str) -> ValidationError:
    """A validation error at `field` of the model being validated (a model validator cannot name one otherwise;
    pydantic prefixes the path of the model, say "tasks.3")."""
    error = PydanticCustomError("driver_mismatch", message)
    return ValidationError.from_exception_data("driver", [InitErrorDetails(type=error, loc=(field,), input=value)])


def _check_run(driver: str, command: list[str], image: str, env: dict[str, str], workdir: str) -> None:
    """Raise a ValidationError naming the field that does not go with `driver`."""
    if driver == "burn":
        for field, value in (("command", command), ("image", image), ("env", env), ("workdir", workdir)):
            if value:
                raise _field_error(field, value, f"{field} is for the exec and container drivers, not burn")
        return
    if driver == "exec":
        if not command:
            raise _field_error("command", command, "the exec driver needs a command (argv, at least the program)")
        if not command[0]:
            raise _field_error("command", command, "the program (command[0]) is empty")
        if image:
            raise _field_error("image", image, "image is for the container driver, not exec")
    elif not image:
        raise _field_error("image", image, "the container driver needs an image")
    argv_size = sum(map(len, command))
    env_size = sum(len(k) + len(v) for k, v in env.items())
    if argv_size + env_size + len(workdir) > MAX_RUN_CHARS:
        field, value = ("env", env) if env_size > argv_size else ("command", command)
        message = (
            f"command, env and workdir hold {argv_size + env_size + len(workdir)} characters; at most {MAX_RUN_CHARS}"
        )
        raise _field_error(field, value, message)


class WireModel(BaseModel):
    """Base of every wire model: unknown fields are errors and types are strict."""

    model_config = ConfigDict(extra="forbid", strict=True)


# --- Submission API (load generator / users -> GM) -----------------------------------------------------------


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
            raise _field_error("duration", None, "the burn driver needs a duration (CPU-seconds to burn)")
        _check_run(self.driver, self.command, self.image, self.env, self.workdir)
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
                _mask(t.constraints),
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


class PartitionUse(WireModel):
    """One partition (LM `lm`, owned by GM `gm`) as a GM's view has it: nodes and the fraction of its resources in
    use (the mean over resources)."""

    lm: Index
    gm: Index
    nodes: Count
    used_fraction: Annotated[float, Field(ge=0, le=1)]


class QueueUse(WireModel):
    """One user's queue at a GM: its share (None when fair scheduling is off) and consumption (the share of the
    data centre its running tasks hold, by the share policy's measure), and its tasks waiting and running here."""

    queue: User
    share: Annotated[float, Field(ge=0, le=1)] | None = None
    consumption: Annotated[float, Field(ge=0)] = 0.0
    pending: Count = 0
    running: Count = 0


class QueueState(WireModel):
    """One configured queue in GM `GET /v1/queues`, as this GM sees it: its user, share and the GM serving it
    (`own`: this GM), the resources its running tasks hold (`usage`, aligned to the resource names; exact at its own
    GM, as the LMs last reported elsewhere), its `consumption` under the share policy, whether it is below its
    share, and what its waiting tasks ask for (`demand`, known at its own GM only)."""

    user: User
    share: Annotated[float, Field(ge=0, le=1)]
    gm: Index
    own: bool
    usage: list[Count]
    consumption: Annotated[float, Field(ge=0)]
    below_share: bool
    demand: list[Count] | None = None


class QueueTasks(WireModel):
    """A queue's tasks at a GM: waiting (queued, or parked because they fit nowhere in its view) and placed."""

    pending: Count = 0
    running: Count = 0


class QueueList(WireModel):
    """Response of GM `GET /v1/queues`. `queues`: every configured queue (fair scheduling; empty without it);
    `tasks`: this GM's pending and running tasks per queue (and those of the GM it stands in for), `default` being
    a GM's one queue without fair scheduling. A user sees its own queue only; an operator every one."""

    gm: Index
    fair_scheduling: bool
    policy: str | None = None
    queues: list[QueueState]
    tasks: dict[User, QueueTasks]


class Histogram(WireModel):
    """Counts per bucket: `counts[i]` observations at most `bounds[i]` seconds and above the bound before; the last
    count is above every bound."""

    bounds: list[float]
    counts: list[Count]
    count: Count
    sum: Annotated[float, Field(ge=0)]


class Overview(WireModel):
    """Response of GM `GET /v1/overview`, what the dashboard (`GET /dashboard`) shows: this GM's view of every
    partition, its queues, its jobs and tasks per state, and its allocation times."""

    gm: Index
    at: Timestamp
    partitions: list[PartitionUse]
    queues: list[QueueUse]
    jobs: dict[JobState, Count]
    tasks: dict[TaskState, Count]
    allocation_time: Histogram


# --- Core mirrors (GM <-> LM <-> worker) ---------------------------------------------------------------------
#
# Each mirror's `plain(obj)` is the JSON-ready form of a core object (dicts, lists, str, int, float, bool). The
# services send `core_json(obj)`, which serialises that form directly: building the pydantic models of a
# 50-placement batch would cost about 0.6 ms per hop. The receiver validates the JSON into the model as always.


class CoreMirror(WireModel):
    """Base of the mirror of one core message type: `from_core(obj)` and `to_core()` convert losslessly."""

    @classmethod
    def plain(cls, obj: Any) -> dict[str, Any]:
        """The JSON-ready form of the core object `obj`: what `from_core(obj).model_dump()` gives."""
        raise NotImplementedError

    @classmethod
    def from_core(cls, obj: Any) -> Self:
        return cls.model_validate(cls.plain(obj))

    @classmethod
    def core_json(cls, obj: Any) -> bytes:
        """The JSON of `from_core(obj)`, without building (or validating) the models: the services' send path."""
        return to_json(cls.plain(obj))

    def to_core(self) -> Any:
        raise NotImplementedError


class RunSpecModel(CoreMirror):
    """Mirror of `RunSpec`: what an exec or container task runs, checked as in `TaskRequest`."""

    driver: Literal["exec", "container"]
    command: Argv = []
    image: Image = ""
    env: Env = {}
    workdir: Workdir = ""

    @model_validator(mode="after")
    def _driver_fields(self) -> Self:
        _check_run(self.driver, self.command, self.image, self.env, self.workdir)
        return self

    @classmethod
    def plain(cls, obj: RunSpec) -> dict[str, Any]:
        return {
            "driver": obj.driver,
            "command": list(obj.command),
            "image": obj.image,
            "env": dict(obj.env),
            "workdir": obj.workdir,
        }

    def to_core(self) -> RunSpec:
        return RunSpec(self.driver, tuple(self.command), self.image, tuple(self.env.items()), self.workdir)


class TaskSpecModel(CoreMirror):
    """Mirror of `TaskSpec`."""

    task_id: Name
    job_id: Name
    user: Name
    duration: Seconds
    request: Amounts
    constraints: ConstraintIds
    attempt: Annotated[int, Field(ge=1)] = 1
    run: RunSpecModel | None = None

    @classmethod
    def plain(cls, obj: TaskSpec) -> dict[str, Any]:
        return {
            "task_id": obj.task_id,
            "job_id": obj.job_id,
            "user": obj.user,
            "duration": obj.duration,
            "request": list(obj.request),
            "constraints": _ids(obj.constraints),
            "attempt": obj.attempt,
            "run": None if obj.run is None else RunSpecModel.plain(obj.run),
        }

    def to_core(self) -> TaskSpec:
        return TaskSpec(
            self.task_id,
            self.job_id,
            self.user,
            self.duration,
            tuple(self.request),
            _mask(self.constraints),
            self.attempt,
            None if self.run is None else self.run.to_core(),
        )


class PlacementModel(CoreMirror):
    """Mirror of `Placement`."""

    task: TaskSpecModel
    lm: Index
    node: Index
    repartition: bool
    gm: Index = 0

    @classmethod
    def plain(cls, obj: Placement) -> dict[str, Any]:
        return {
            "task": TaskSpecModel.plain(obj.task),
            "lm": obj.lm,
            "node": obj.node,
            "repartition": obj.repartition,
            "gm": obj.gm,
        }

    def to_core(self) -> Placement:
        return Placement(self.task.to_core(), self.lm, self.node, self.repartition, self.gm)


def split_json(
    envelope: dict[str, Any], placements: Sequence[Placement], limit: int, field: str = "placements"
) -> list[tuple[list[Placement], bytes]]:
    """The JSON of `envelope` with a last field `field` holding `placements`, as bodies of at most `limit` bytes
    each: [(a body's placements, the body)], in order, packed greedily. Each body is exactly what `to_json` writes
    for its placements, so sizes are measured, not estimated. A placement too big on its own goes alone in its
    body (its receiver refuses that body with 413, and no other placement with it). All in one body when they
    fit: the common case costs one encoding, as `core_json` does."""
    whole = to_json({**envelope, field: [PlacementModel.plain(p) for p in placements]})
    if len(whole) <= limit:
        return [(list(placements), whole)]
    empty = to_json({**envelope, field: []})
    head, tail = empty[: -len(b"]}")], b"]}"
    parts: list[tuple[list[Placement], bytes]] = []
    chunk: list[Placement] = []
    pieces: list[bytes] = []
    size = len(head) + len(tail)
    for p in placements:
        piece = to_json(PlacementModel.plain(p))
        if chunk and size + 1 + len(piece) > limit:
            parts.append((chunk, head + b",".join(pieces) + tail))
            chunk, pieces, size = [], [], len(head) + len(tail)
        size += len(piece) + (1 if chunk else 0)
        chunk.append(p)
        pieces.append(piece)
    parts.append((chunk, head + b",".join(pieces) + tail))
    return parts


class LaunchBatchModel(CoreMirror):
    """Mirror of `LaunchBatch` (GM -> LM launch request)."""

    gm: Index
    lm: Index
    seq: Index
    placements: list[PlacementModel]

    @classmethod
    def plain(cls, obj: LaunchBatch) -> dict[str, Any]:
        return {
            "gm": obj.gm,
            "lm": obj.lm,
            "seq": obj.seq,
            "placements": [PlacementModel.plain(p) for p in obj.placements],
        }

    @classmethod
    def core_json_parts(cls, obj: LaunchBatch, limit: int = MAX_BODY_BYTES) -> list[tuple[list[Placement], bytes]]:
        """`core_json(obj)` split into bodies of at most `limit` bytes, each a batch of some of its placements
        with the same `seq` (`split_json`)."""
        return split_json({"gm": obj.gm, "lm": obj.lm, "seq": obj.seq}, obj.placements, limit)

    def to_core(self) -> LaunchBatch:
        return LaunchBatch(self.gm, self.lm, self.seq, [p.to_core() for p in self.placements])


class RejectionModel(CoreMirror):
    """Mirror of `Rejection`."""

    placement: PlacementModel
    reason: str
    inconsistency: bool

    @classmethod
    def plain(cls, obj: Rejection) -> dict[str, Any]:
        return {
            "placement": PlacementModel.plain(obj.placement),
            "reason": obj.reason,
            "inconsistency": obj.inconsistency,
        }

    def to_core(self) -> Rejection:
        return Rejection(self.placement.to_core(), self.reason, self.inconsistency)


class NodeStateModel(CoreMirror):
    """Mirror of `NodeState`."""

    node: Index
    free: Amounts
    version: Index

    @classmethod
    def plain(cls, obj: NodeState) -> dict[str, Any]:
        return {"node": obj.node, "free": list(obj.free), "version": obj.version}

    def to_core(self) -> NodeState:
        return NodeState(self.node, tuple(self.free), self.version)


class DeltaModel(CoreMirror):
    """Mirror of `Delta` (LM -> GM, broker)."""

    lm: Index
    gm: Index
    applied_through: Index
    nodes: list[NodeStateModel] = []
    usage: dict[User, Amounts] | None = None  # fair scheduling: what each user holds on this LM

    @classmethod
    def plain(cls, obj: Delta) -> dict[str, Any]:
        return {
            "lm": obj.lm,
            "gm": obj.gm,
            "applied_through": obj.applied_through,
            "nodes": [NodeStateModel.plain(n) for n in obj.nodes],
            "usage": None if obj.usage is None else {u: list(v) for u, v in obj.usage.items()},
        }

    def to_core(self) -> Delta:
        usage = None if self.usage is None else {u: tuple(v) for u, v in self.usage.items()}
        return Delta(self.lm, self.gm, self.applied_through, [n.to_core() for n in self.nodes], usage)


class LaunchResponseModel(CoreMirror):
    """Mirror of `LaunchResponse` (LM -> GM, the response to a `LaunchBatchModel`)."""

    gm: Index
    lm: Index
    seq: Index
    accepted: list[PlacementModel]
    rejected: list[RejectionModel]
    states: list[NodeStateModel]
    delta: DeltaModel

    @classmethod
    def plain(cls, obj: LaunchResponse) -> dict[str, Any]:
        return {
            "gm": obj.gm,
            "lm": obj.lm,
            "seq": obj.seq,
            "accepted": [PlacementModel.plain(p) for p in obj.accepted],
            "rejected": [RejectionModel.plain(r) for r in obj.rejected],
            "states": [NodeStateModel.plain(s) for s in obj.states],
            "delta": DeltaModel.plain(obj.delta),
        }

    def to_core(self) -> LaunchResponse:
        return LaunchResponse(
            self.gm,
            self.lm,
            self.seq,
            [p.to_core() for p in self.accepted],
            [r.to_core() for r in self.rejected],
            [s.to_core() for s in self.states],
            self.delta.to_core(),
        )


class CompletionModel(CoreMirror):
    """Mirror of `Completion`."""

    task_id: Name
    state: NodeStateModel
    error: str = ""
    preempted: bool = False
    lost: bool = False
    attempt: Annotated[int, Field(ge=1)] = 1
    forwarded: bool = False

    @classmethod
    def plain(cls, obj: Completion) -> dict[str, Any]:
        return {
            "task_id": obj.task_id,
            "state": NodeStateModel.plain(obj.state),
            "error": obj.error,
            "preempted": obj.preempted,
            "lost": obj.lost,
            "attempt": obj.attempt,
            "forwarded": obj.forwarded,
        }

    def to_core(self) -> Completion:
        return Completion(
            self.task_id, self.state.to_core(), self.error, self.preempted, self.lost, self.attempt, self.forwarded
        )


class CompletionsModel(CoreMirror):
    """Mirror of `Completions` (LM -> GM, broker)."""

    lm: Index
    gm: Index
    applied_through: Index
    items: list[CompletionModel]

    @classmethod
    def plain(cls, obj: Completions) -> dict[str, Any]:
        return {
            "lm": obj.lm,
            "gm": obj.gm,
            "applied_through": obj.applied_through,
            "items": [CompletionModel.plain(c) for c in obj.items],
        }

    def to_core(self) -> Completions:
        return Completions(self.lm, self.gm, self.applied_through, [c.to_core() for c in self.items])


class WorkerLaunchModel(CoreMirror):
    """Mirror of `WorkerLaunch` (LM -> worker agent)."""

    lm: Index
    launches: list[PlacementModel]

    @classmethod
    def plain(cls, obj: WorkerLaunch) -> dict[str, Any]:
        return {"lm": obj.lm, "launches": [PlacementModel.plain(p) for p in obj.launches]}

    @classmethod
    def core_json_parts(cls, obj: WorkerLaunch, limit: int = MAX_BODY_BYTES) -> list[tuple[list[Placement], bytes]]:
        """`core_json(obj)` split into bodies of at most `limit` bytes, each a launch of some of its tasks
        (`split_json`)."""
        return split_json({"lm": obj.lm}, obj.launches, limit, field="launches")

    def to_core(self) -> WorkerLaunch:
        return WorkerLaunch(self.lm, [p.to_core() for p in self.launches])


class FinishedTaskModel(CoreMirror):
    """Mirror of `FinishedTask`, plus what a real worker measured: CPU seconds burnt, the delay from receiving
    the launch to starting the task, start and finish times, and an error ("" when the task succeeded).

    The core keeps only the error (the LM passes it on to the GM in the completion); `to_core` drops the
    measurements and `from_core` leaves them at their defaults.
    """

    task_id: Name
    node: Index
    preempted: bool = False
    cpu_seconds: Seconds = 0.0
    execution_delay: Seconds = 0.0
    started_at: Timestamp | None = None
    finished_at: Timestamp | None = None
    error: str = ""
    attempt: Annotated[int, Field(ge=1)] = 1
    gm: Annotated[int, Field(ge=-1)] = -1

    @classmethod
    def plain(cls, obj: FinishedTask) -> dict[str, Any]:
        return {
            "task_id": obj.task_id,
            "node": obj.node,
            "preempted": obj.preempted,
            "cpu_seconds": 0.0,
            "execution_delay": 0.0,
            "started_at": None,
            "finished_at": None,
            "error": obj.error,
            "attempt": obj.attempt,
            "gm": obj.gm,
        }

    def to_core(self) -> FinishedTask:
        return FinishedTask(self.task_id, self.node, self.preempted, self.error, self.attempt, gm=self.gm)


class WorkerReportModel(CoreMirror):
    """Mirror of `WorkerReport` (worker -> LM, broker)."""

    lm: Index
    finished: list[FinishedTaskModel]

    @classmethod
    def plain(cls, obj: WorkerReport) -> dict[str, Any]:
        return {"lm": obj.lm, "finished": [FinishedTaskModel.plain(f) for f in obj.finished]}

    def to_core(self) -> WorkerReport:
        return WorkerReport(self.lm, [f.to_core() for f in self.finished])


class VictimModel(CoreMirror):
    """Mirror of `Victim`."""

    user: Name
    usage_elsewhere: Amounts

    @classmethod
    def plain(cls, obj: Victim) -> dict[str, Any]:
        return {"user": obj.user, "usage_elsewhere": list(obj.usage_elsewhere)}

    def to_core(self) -> Victim:
        return Victim(self.user, tuple(self.usage_elsewhere))


class PreemptRequestModel(CoreMirror):
    """Mirror of `PreemptRequest` (GM -> LM)."""

    gm: Index
    lm: Index
    seq: Index
    task: TaskSpecModel
    victims: list[VictimModel]
    total: Amounts

    @classmethod
    def plain(cls, obj: PreemptRequest) -> dict[str, Any]:
        return {
            "gm": obj.gm,
            "lm": obj.lm,
            "seq": obj.seq,
            "task": TaskSpecModel.plain(obj.task),
            "victims": [VictimModel.plain(v) for v in obj.victims],
            "total": list(obj.total),
        }

    def to_core(self) -> PreemptRequest:
        return PreemptRequest(
            self.gm,
            self.lm,
            self.seq,
            self.task.to_core(),
            [v.to_core() for v in self.victims],
            tuple(self.total),
        )


class PreemptResponseModel(CoreMirror):
    """Mirror of `PreemptResponse` (LM -> GM, the response to a `PreemptRequestModel`)."""

    gm: Index
    lm: Index
    seq: Index
    task: TaskSpecModel
    placement: PlacementModel | None
    preempted: list[Name]
    reason: str
    states: list[NodeStateModel]
    delta: DeltaModel

    @classmethod
    def plain(cls, obj: PreemptResponse) -> dict[str, Any]:
        return {
            "gm": obj.gm,
            "lm": obj.lm,
            "seq": obj.seq,
            "task": TaskSpecModel.plain(obj.task),
            "placement": None if obj.placement is None else PlacementModel.plain(obj.placement),
            "preempted": list(obj.preempted),
            "reason": obj.reason,
            "states": [NodeStateModel.plain(s) for s in obj.states],
            "delta": DeltaModel.plain(obj.delta),
        }

    def to_core(self) -> PreemptResponse:
        return PreemptResponse(
            self.gm,
            self.lm,
            self.seq,
            self.task.to_core(),
            None if self.placement is None else self.placement.to_core(),
            list(self.preempted),
            self.reason,
            [s.to_core() for s in self.states],
            self.delta.to_core(),
        )


class WorkerPreemptModel(CoreMirror):
    """Mirror of `WorkerPreempt` (LM -> worker agent)."""

    lm: Index
    task_ids: list[Name]

    @classmethod
    def plain(cls, obj: WorkerPreempt) -> dict[str, Any]:
        return {"lm": obj.lm, "task_ids": list(obj.task_ids)}

    def to_core(self) -> WorkerPreempt:
        return WorkerPreempt(self.lm, list(self.task_ids))


class StopRunModel(WireModel):
    task_id: Name
    attempt: Annotated[int, Field(ge=1)] = 1


class StopRequestModel(CoreMirror):
    """Mirror of `StopRequest` (GM -> LM, `POST /v1/stop`): stop these runs of the GM's cancelled jobs."""

    gm: Index
    lm: Index
    runs: list[StopRunModel] = Field(max_length=100_000)

    @classmethod
    def plain(cls, obj: StopRequest) -> dict[str, Any]:
        return {"gm": obj.gm, "lm": obj.lm, "runs": [{"task_id": t, "attempt": a} for t, a in obj.runs]}

    def to_core(self) -> StopRequest:
        return StopRequest(self.gm, self.lm, [(r.task_id, r.attempt) for r in self.runs])


class StopResponse(WireModel):
    """Response of LM `POST /v1/stop`: the runs it stopped (each is reported to the GM as it ends); the others it
    did not hold for that GM (ended already, or another attempt)."""

    stopped: list[Name]


class WorkerHeartbeat(WireModel):
    """Worker -> LM, every MEGHA_HEARTBEAT_INTERVAL seconds: the agent is alive and runs `running` tasks."""

    worker_id: Name
    lm: Index
    at: Timestamp
    running: Count


class LMRebuilt(WireModel):
    """LM -> GM, from an LM rebuilt after a crash once its agents registered again and the reports that waited
    for it had time to arrive. The GM then asks it (`GET /v1/gms/{gm}/state`, holding its own lock, so no launch
    answer slips in between) which of its runs it holds or saw end: a run the GM believes is on that LM and that
    is neither was lost with its worker while no LM watched it (`megha.common.core.recovery.runs_lost`), and the
    GM runs it again."""

    lm: Index
    gm: Index
    incarnation: Count


class BrokerMessage(WireModel):
    """Envelope of every message on the GM and LM queues of the broker: exactly one field is set.

    A GM's queue carries `delta`, `completions` and `lm_rebuilt` from LMs; an LM's queue carries `worker_report`
    and `heartbeat` from workers, each signed by its agent in the message's headers (docs/topology.md).
    """

    delta: DeltaModel | None = None
    completions: CompletionsModel | None = None
    lm_rebuilt: LMRebuilt | None = None
    worker_report: WorkerReportModel | None = None
    heartbeat: WorkerHeartbeat | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        set_fields = [name for name in type(self).model_fields if getattr(self, name) is not None]
        if len(set_fields) != 1:
            raise ValueError(f"a broker message carries exactly one of {list(type(self).model_fields)}")
        return self

    @classmethod
    def core_json(cls, msg: Delta | Completions | WorkerReport) -> bytes:
        """The JSON of the envelope carrying the core message `msg`, built as `CoreMirror.core_json` does."""
        field, model = _ENVELOPE_FIELDS[type(msg)]
        return to_json({field: model.plain(msg)})


_ENVELOPE_FIELDS: dict[type, tuple[str, type[CoreMirror]]] = {
    Delta: ("delta", DeltaModel),
    Completions: ("completions", CompletionsModel),
    WorkerReport: ("worker_report", WorkerReportModel),
}

CORE_MIRRORS: dict[type, type[CoreMirror]] = {
    RunSpec: RunSpecModel,
    TaskSpec: TaskSpecModel,
    Placement: PlacementModel,
    LaunchBatch: LaunchBatchModel,
    Rejection: RejectionModel,
    NodeState: NodeStateModel,
    Delta: DeltaModel,
    LaunchResponse: LaunchResponseModel,
    Completion: CompletionModel,
    Completions: CompletionsModel,
    WorkerLaunch: WorkerLaunchModel,
    FinishedTask: FinishedTaskModel,
    WorkerReport: WorkerReportModel,
    Victim: VictimModel,
    PreemptRequest: PreemptRequestModel,
    PreemptResponse: PreemptResponseModel,
    WorkerPreempt: WorkerPreemptModel,
    StopRequest: StopRequestModel,
}
"""Each core message type and its wire model."""


def _mirror(obj: object) -> type[CoreMirror]:
    try:
        return CORE_MIRRORS[type(obj)]
    except KeyError:
        raise TypeError(f"no wire model for {type(obj).__name__}") from None


def to_wire(obj: object) -> CoreMirror:
    """The wire model of a core message, whatever its type."""
    return _mirror(obj).from_core(obj)


def core_json(obj: object) -> bytes:
    """The JSON of `to_wire(obj)`, whatever the core message's type, without building the models."""
    return _mirror(obj).core_json(obj)


# --- Worker registration (worker agent -> LM) ----------------------------------------------------------------


class WorkerNode(WireModel):
    """One node an agent offers: its capacity by resource name, and the machine constraints it satisfies."""

    capacity: Annotated[dict[ResourceName, Annotated[int, Field(gt=0)]], Field(min_length=1)]
    constraints: ConstraintIds = []

    def resources(self, resource_names: Sequence[str]) -> Resources:
        """The capacity aligned to `resource_names`; every name must be given, and no other."""
        if set(self.capacity) != set(resource_names):
            raise ValueError(f"capacity names {sorted(self.capacity)} differ from {sorted(resource_names)}")
        return tuple(self.capacity[n] for n in resource_names)


class WorkerRegistration(WireModel):
    """Body of LM `POST /v1/workers`: an agent reachable at `url` offers `nodes`.

    An agent registers again whenever its LM is a new incarnation (it restarted): it then claims the node numbers
    it had (`first_node`) and reports the tasks it runs (`running`), from which the LM rebuilds its state.
    `drivers` are the task drivers the agent offers on every one of its nodes (MEGHA_DRIVERS; absent: burn only)."""

    worker_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")]
    url: Annotated[str, Field(pattern=r"^https?://[^\s/]+(/\S*)?$", max_length=2048)]
    nodes: Annotated[list[WorkerNode], Field(min_length=1, max_length=MAX_NODES_PER_WORKER)]
    first_node: Index | None = None
    running: list[PlacementModel] = []
    drivers: Annotated[list[Driver], Field(min_length=1, max_length=len(DRIVERS)), AfterValidator(_distinct)] = ["burn"]


class WorkerRegistered(WireModel):
    """Response of LM `POST /v1/workers`: the agent's nodes are the LM's nodes first_node .. first_node+nodes-1,
    in registration order (or as claimed); `incarnation` names the LM's life the agent registered with.
    `report_key` (hex, None with MEGHA_AUTH=off) is the key the agent signs its broker reports to this LM with
    (`megha.common.transport.rabbit.report_headers`); the LM derives it from its report secret and the worker id,
    so it is the same after the LM restarts, and only this agent learns it."""

    worker_id: Name
    lm: Index
    first_node: Index
    nodes: Annotated[int, Field(gt=0)]
    incarnation: Count = 0
    report_key: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", repr=False)


class EndedRun(WireModel):
    """A run an LM saw end (finished, or failed with `error`), remembered for a GM that restarts."""

    task_id: Name
    attempt: Annotated[int, Field(ge=1)] = 1
    error: str = ""


class GMRecovery(WireModel):
    """Response of LM `GET /v1/gms/{gm}/state` and `POST /v1/gms/{gm}/claim`: what a (re)starting GM needs from
    this LM: every node's state (a delta with all nodes), the runs it holds for that GM, the runs of that GM it saw
    end recently, and the highest term it has seen for that GM (`megha.common.core.fencing`)."""

    lm: Index
    incarnation: Count
    delta: DeltaModel
    running: list[PlacementModel]
    ended: list[EndedRun]
    term: Count = 0


class GMClaim(WireModel):
    """Body of LM `POST /v1/gms/{gm}/claim`: the GM itself, or the peer standing in for it (`by`), takes GM `gm`
    over with `term`, which must exceed every term the LM has seen for it (409 otherwise, naming the current one).
    From then the LM refuses launches and preemptions of that GM carrying a lower `?term=`."""

    term: Annotated[int, Field(ge=1)]
    by: Index


class JournalLines(WireModel):
    """A GM's journal lines copied to the peer that stands in for it (GM `POST /v1/peers/{gm}/journal`), or the
    copy that peer hands back (`POST /v1/peers/{gm}/release`). `reset`: the lines are the whole journal."""

    reset: bool = False
    lines: list[str] = Field(default_factory=list)


# --- Task events (worker -> broker -> load generator) --------------------------------------------------------


class TaskEvent(WireModel):
    """A task's `attempt` started, finished, was preempted, was lost with its worker (it runs again) or failed,
    at unix time `at`; measurements as in `FinishedTaskModel`. The load generator computes allocation time and
    job response time from these.

    Who publishes: the agent `started`; the LM `finished`, `preempted`, `failed` and `lost` once it has checked
    the report against the run it placed (a stale copy's report never becomes an event); the GM `failed` for a
    task it gives up on (an LM that never answered, MEGHA_MAX_ATTEMPTS reached). Delivery is at least once: a
    consumer keeps the first event of each (task_id, attempt, kind)."""

    kind: Literal["started", "finished", "preempted", "lost", "failed", "cancelled"]
    task_id: Name
    job_id: Name
    lm: Index
    node: Index
    at: Timestamp
    cpu_seconds: Seconds = 0.0
    execution_delay: Seconds = 0.0
    error: str = ""
    attempt: Annotated[int, Field(ge=1)] = 1


class TaskEvents(WireModel):
    """What travels on the events exchange: task events batched by the agent that observed them."""

    events: Annotated[list[TaskEvent], Field(min_length=1)]


# --- Errors --------------------------------------------------------------------------------------------------


ROOT_FIELD = "(body)"
"""The field name of an error about the body as a whole (say, malformed JSON)."""


class FieldError(WireModel):
    """One invalid field: its dotted path ("tasks.3.cpu_millicores", "(body)" for the body as a whole)."""

    field: str
    message: str


class ErrorBody(WireModel):
    """Body of every 4xx response."""

    error: str
    detail: list[FieldError] = []


def validation_error_body(exc: ValidationError) -> ErrorBody:
    """The 422 body for a validation failure, naming each offending field by its dotted path."""
    return ErrorBody(
        error=f"invalid {exc.title}",
        detail=[
            FieldError(field=".".join(str(part) for part in e["loc"]) or ROOT_FIELD, message=e["msg"])
            for e in exc.errors()
        ],
    )
