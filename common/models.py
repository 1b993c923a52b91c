"""Wire contracts: every REST body and every RabbitMQ message of the services, as pydantic v2 models.

The services and the tests import these models; the core stays pydantic-free and exchanges the dataclasses of
`megha.common.core.messages`. Each core mirror (`...Model`) converts losslessly with `from_core(obj)` and
`to_core()`, so core -> model -> JSON -> model -> core gives back an equal object. On the wire:

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
(`LaunchBatchModel` -> `LaunchResponseModel`), LM -> worker (`WorkerLaunchModel`). Broker messages: LM -> GM
`DeltaModel` and `CompletionsModel`, worker -> LM `WorkerReportModel`, each in a `BrokerMessage` envelope, and
worker -> load generator `TaskEvent`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

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
    Rejection,
    WorkerLaunch,
    WorkerReport,
)
from megha.common.core.resources import CPU, MEMORY, Resources
from megha.common.core.task import TaskSpec

MAX_BODY_BYTES = 4 * 1024 * 1024
"""Largest request body a service accepts (413 above it). A maximal `JobSubmission` (10,000 tasks, every
constraint, 64-character users) is about 2.3 MB of compact JSON, 3.5 MB indented."""

MAX_TASKS_PER_JOB = 10_000
MAX_NODES_PER_WORKER = 100_000
"""An agent in simulated-execution mode may stand for many nodes; this bounds one registration."""


def _unique(ids: list[int]) -> list[int]:
    if len(set(ids)) != len(ids):
        duplicates = sorted(i for i, n in Counter(ids).items() if n > 1)
        raise ValueError(f"duplicate constraint ids {duplicates}")
    return ids


# Field types shared by the models. Integers and strings are strict through `WireModel.model_config`.
Index = Annotated[int, Field(ge=0)]
"""A GM, LM or node number, a sequence number or a version."""
Count = Annotated[int, Field(ge=0)]
Name = Annotated[str, Field(min_length=1, max_length=256)]
"""A task, job or worker id as the services generate them."""
User = Annotated[str, Field(min_length=1, max_length=64)]
JobId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
"""A job id a client may choose; task ids are f"{job_id}.{i}"."""
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Timestamp = Annotated[float, Field(allow_inf_nan=False)]
ConstraintId = Annotated[int, Field(ge=0, le=NUM_CONSTRAINTS - 1)]
ConstraintIds = Annotated[list[ConstraintId], Field(max_length=NUM_CONSTRAINTS), AfterValidator(_unique)]
Amounts = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
"""A resource vector aligned to the data centre's resource names."""
ResourceName = Annotated[str, Field(min_length=1, max_length=64)]


class WireModel(BaseModel):
    """Base of every wire model: unknown fields are errors and types are strict."""

    model_config = ConfigDict(extra="forbid", strict=True)


# --- Submission API (load generator / users -> GM) -----------------------------------------------------------


class TaskRequest(WireModel):
    """One task of a submitted job. `user` defaults to the job's user."""

    duration: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    cpu_millicores: Annotated[int, Field(gt=0)]
    memory_mb: Annotated[int, Field(gt=0)]
    constraints: ConstraintIds = []
    user: User | None = None

    def request(self, resource_names: Sequence[str]) -> Resources:
        """The request aligned to `resource_names`: 0 for resources the API cannot ask for (say, GPUs)."""
        missing = [n for n in (CPU, MEMORY) if n not in resource_names]
        if missing:
            raise ValueError(f"resource names {list(resource_names)} lack {missing}")
        amounts = {CPU: self.cpu_millicores, MEMORY: self.memory_mb}
        return tuple(amounts.get(n, 0) for n in resource_names)


class JobSubmission(WireModel):
    """Body of GM `POST /v1/jobs`. Without `job_id` the GM names the job."""

    tasks: Annotated[list[TaskRequest], Field(min_length=1, max_length=MAX_TASKS_PER_JOB)]
    user: User = "default"
    job_id: JobId | None = None

    def to_tasks(self, job_id: str, resource_names: Sequence[str]) -> tuple[TaskSpec, ...]:
        """The core's tasks of this job: task i is f"{job_id}.{i}"."""
        return tuple(
            TaskSpec(
                f"{job_id}.{i}",
                job_id,
                t.user or self.user,
                t.duration,
                t.request(resource_names),
                constraint_mask(t.constraints),
            )
            for i, t in enumerate(self.tasks)
        )


class JobAccepted(WireModel):
    """Response of GM `POST /v1/jobs` (201): the job's id, its tasks' ids in submission order, the GM."""

    job_id: Name
    task_ids: list[Name]
    gm: Index


TaskState = Literal["queued", "launched", "running", "finished", "failed"]


class TaskStatus(WireModel):
    """One task in GM `GET /v1/jobs/{id}`. Times are unix seconds; `lm`/`node` are set once placed.

    `attempts` counts placements sent to an LM, `inconsistencies` those an LM rejected for a stale view.
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
    failed_reason: str | None = None


class JobStatus(WireModel):
    """Response of GM `GET /v1/jobs/{id}`."""

    job_id: Name
    user: User
    gm: Index
    tasks: list[TaskStatus]


# --- Core mirrors (GM <-> LM <-> worker) ---------------------------------------------------------------------


class TaskSpecModel(WireModel):
    """Mirror of `TaskSpec`."""

    task_id: Name
    job_id: Name
    user: Name
    duration: Seconds
    request: Amounts
    constraints: ConstraintIds

    @classmethod
    def from_core(cls, obj: TaskSpec) -> Self:
        return cls(
            task_id=obj.task_id,
            job_id=obj.job_id,
            user=obj.user,
            duration=obj.duration,
            request=list(obj.request),
            constraints=list(iter_bits(obj.constraints)),
        )

    def to_core(self) -> TaskSpec:
        return TaskSpec(
            self.task_id, self.job_id, self.user, self.duration, tuple(self.request), constraint_mask(self.constraints)
        )


class PlacementModel(WireModel):
    """Mirror of `Placement`."""

    task: TaskSpecModel
    lm: Index
    node: Index
    repartition: bool

    @classmethod
    def from_core(cls, obj: Placement) -> Self:
        return cls(task=TaskSpecModel.from_core(obj.task), lm=obj.lm, node=obj.node, repartition=obj.repartition)

    def to_core(self) -> Placement:
        return Placement(self.task.to_core(), self.lm, self.node, self.repartition)


class LaunchBatchModel(WireModel):
    """Mirror of `LaunchBatch` (GM -> LM launch request)."""

    gm: Index
    lm: Index
    seq: Index
    placements: list[PlacementModel]

    @classmethod
    def from_core(cls, obj: LaunchBatch) -> Self:
        return cls(gm=obj.gm, lm=obj.lm, seq=obj.seq, placements=[PlacementModel.from_core(p) for p in obj.placements])

    def to_core(self) -> LaunchBatch:
        return LaunchBatch(self.gm, self.lm, self.seq, [p.to_core() for p in self.placements])


class RejectionModel(WireModel):
    """Mirror of `Rejection`."""

    placement: PlacementModel
    reason: str
    inconsistency: bool

    @classmethod
    def from_core(cls, obj: Rejection) -> Self:
        return cls(
            placement=PlacementModel.from_core(obj.placement), reason=obj.reason, inconsistency=obj.inconsistency
        )

    def to_core(self) -> Rejection:
        return Rejection(self.placement.to_core(), self.reason, self.inconsistency)


class NodeStateModel(WireModel):
    """Mirror of `NodeState`."""

    node: Index
    free: Amounts
    version: Index

    @classmethod
    def from_core(cls, obj: NodeState) -> Self:
        return cls(node=obj.node, free=list(obj.free), version=obj.version)

    def to_core(self) -> NodeState:
        return NodeState(self.node, tuple(self.free), self.version)


class DeltaModel(WireModel):
    """Mirror of `Delta` (LM -> GM, broker)."""

    lm: Index
    gm: Index
    applied_through: Index
    nodes: list[NodeStateModel] = []

    @classmethod
    def from_core(cls, obj: Delta) -> Self:
        return cls(
            lm=obj.lm,
            gm=obj.gm,
            applied_through=obj.applied_through,
            nodes=[NodeStateModel.from_core(n) for n in obj.nodes],
        )

    def to_core(self) -> Delta:
        return Delta(self.lm, self.gm, self.applied_through, [n.to_core() for n in self.nodes])


class LaunchResponseModel(WireModel):
    """Mirror of `LaunchResponse` (LM -> GM, the response to a `LaunchBatchModel`)."""

    gm: Index
    lm: Index
    seq: Index
    accepted: list[PlacementModel]
    rejected: list[RejectionModel]
    states: list[NodeStateModel]
    delta: DeltaModel

    @classmethod
    def from_core(cls, obj: LaunchResponse) -> Self:
        return cls(
            gm=obj.gm,
            lm=obj.lm,
            seq=obj.seq,
            accepted=[PlacementModel.from_core(p) for p in obj.accepted],
            rejected=[RejectionModel.from_core(r) for r in obj.rejected],
            states=[NodeStateModel.from_core(s) for s in obj.states],
            delta=DeltaModel.from_core(obj.delta),
        )

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


class CompletionModel(WireModel):
    """Mirror of `Completion`."""

    task_id: Name
    state: NodeStateModel
    error: str = ""

    @classmethod
    def from_core(cls, obj: Completion) -> Self:
        return cls(task_id=obj.task_id, state=NodeStateModel.from_core(obj.state), error=obj.error)

    def to_core(self) -> Completion:
        return Completion(self.task_id, self.state.to_core(), self.error)


class CompletionsModel(WireModel):
    """Mirror of `Completions` (LM -> GM, broker)."""

    lm: Index
    gm: Index
    applied_through: Index
    items: list[CompletionModel]

    @classmethod
    def from_core(cls, obj: Completions) -> Self:
        return cls(
            lm=obj.lm,
            gm=obj.gm,
            applied_through=obj.applied_through,
            items=[CompletionModel.from_core(c) for c in obj.items],
        )

    def to_core(self) -> Completions:
        return Completions(self.lm, self.gm, self.applied_through, [c.to_core() for c in self.items])


class WorkerLaunchModel(WireModel):
    """Mirror of `WorkerLaunch` (LM -> worker agent)."""

    lm: Index
    launches: list[PlacementModel]

    @classmethod
    def from_core(cls, obj: WorkerLaunch) -> Self:
        return cls(lm=obj.lm, launches=[PlacementModel.from_core(p) for p in obj.launches])

    def to_core(self) -> WorkerLaunch:
        return WorkerLaunch(self.lm, [p.to_core() for p in self.launches])


class FinishedTaskModel(WireModel):
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

    @classmethod
    def from_core(cls, obj: FinishedTask) -> Self:
        return cls(task_id=obj.task_id, node=obj.node, preempted=obj.preempted, error=obj.error)

    def to_core(self) -> FinishedTask:
        return FinishedTask(self.task_id, self.node, self.preempted, self.error)


class WorkerReportModel(WireModel):
    """Mirror of `WorkerReport` (worker -> LM, broker)."""

    lm: Index
    finished: list[FinishedTaskModel]

    @classmethod
    def from_core(cls, obj: WorkerReport) -> Self:
        return cls(lm=obj.lm, finished=[FinishedTaskModel.from_core(f) for f in obj.finished])

    def to_core(self) -> WorkerReport:
        return WorkerReport(self.lm, [f.to_core() for f in self.finished])


class WorkerHeartbeat(WireModel):
    """Worker -> LM, every MEGHA_HEARTBEAT_INTERVAL seconds: the agent is alive and runs `running` tasks."""

    worker_id: Name
    lm: Index
    at: Timestamp
    running: Count


class BrokerMessage(WireModel):
    """Envelope of every message on the GM and LM queues of the broker: exactly one field is set.

    A GM's queue carries `delta` and `completions` from LMs; an LM's queue carries `worker_report` and
    `heartbeat` from workers.
    """

    delta: DeltaModel | None = None
    completions: CompletionsModel | None = None
    worker_report: WorkerReportModel | None = None
    heartbeat: WorkerHeartbeat | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        set_fields = [name for name in type(self).model_fields if getattr(self, name) is not None]
        if len(set_fields) != 1:
            raise ValueError(f"a broker message carries exactly one of {list(type(self).model_fields)}")
        return self


CoreMirror = (
    TaskSpecModel
    | PlacementModel
    | LaunchBatchModel
    | RejectionModel
    | NodeStateModel
    | DeltaModel
    | LaunchResponseModel
    | CompletionModel
    | CompletionsModel
    | WorkerLaunchModel
    | FinishedTaskModel
    | WorkerReportModel
)

CORE_MIRRORS: dict[type, type[CoreMirror]] = {
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
}
"""Each core message type and its wire model."""


def to_wire(obj: object) -> CoreMirror:
    """The wire model of a core message, whatever its type."""
    try:
        model = CORE_MIRRORS[type(obj)]
    except KeyError:
        raise TypeError(f"no wire model for {type(obj).__name__}") from None
    return model.from_core(obj)  # type: ignore[arg-type]


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
    """Body of LM `POST /v1/workers`: an agent reachable at `url` offers `nodes`."""

    worker_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")]
    url: Annotated[str, Field(pattern=r"^https?://[^\s/]+(/\S*)?$", max_length=2048)]
    nodes: Annotated[list[WorkerNode], Field(min_length=1, max_length=MAX_NODES_PER_WORKER)]


class WorkerRegistered(WireModel):
    """Response of LM `POST /v1/workers`: the agent's nodes are the LM's nodes first_node .. first_node+nodes-1,
    in registration order."""

    worker_id: Name
    lm: Index
    first_node: Index
    nodes: Annotated[int, Field(gt=0)]


# --- Task events (worker -> broker -> load generator) --------------------------------------------------------


class TaskEvent(WireModel):
    """A task started, finished, was preempted or failed, at unix time `at`; measurements as in
    `FinishedTaskModel`. The load generator computes allocation time and job response time from these."""

    kind: Literal["started", "finished", "preempted", "failed"]
    task_id: Name
    job_id: Name
    lm: Index
    node: Index
    at: Timestamp
    cpu_seconds: Seconds = 0.0
    execution_delay: Seconds = 0.0
    error: str = ""


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
