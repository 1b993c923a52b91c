"""What the services' routes answer besides jobs and core messages: health, state, queues, the dashboard's overview,
an LM's cluster, and the short answers of launch, stop and preempt calls.

The GM core's `view_snapshot()` keeps its keys; `GMState` validates it (with what the GM service adds), so a key the
core adds or drops fails the test that compares the two (tests/test_answers.py).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from megha.common.wire.fields import ConstraintIds, Count, Driver, Index, Name, Timestamp, User, WireModel
from megha.common.wire.jobs import JobState, TaskState

Fraction = Annotated[float, Field(ge=0, le=1)]


class PartitionUse(WireModel):
    """One partition (LM `lm`, owned by GM `gm`) as a GM's view has it: nodes and the fraction of its resources in
    use (the mean over resources)."""

    lm: Index
    gm: Index
    nodes: Count
    used_fraction: Fraction


class QueueUse(WireModel):
    """One user's queue at a GM: its share (None when fair scheduling is off) and consumption (the share of the
    data centre its running tasks hold, by the share policy's measure), and its tasks waiting and running here."""

    queue: User
    share: Fraction | None = None
    consumption: Annotated[float, Field(ge=0)] = 0.0
    pending: Count = 0
    running: Count = 0


class QueueState(WireModel):
    """One configured queue in GM `GET /v1/queues`, as this GM sees it: its user, share and the GM serving it
    (`own`: this GM), the resources its running tasks hold (`usage`, aligned to the resource names; exact at its own
    GM, as the LMs last reported elsewhere), its `consumption` under the share policy, whether it is below its
    share, and what its waiting tasks ask for (`demand`, known at its own GM only)."""

    user: User
    share: Fraction
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


class Health(WireModel):
    """Base of the answers of `GET /healthz`: the process serves HTTP (`status` is always "ok")."""

    status: Literal["ok"] = "ok"


class GMHealth(Health):
    """GM `GET /healthz`: whether the GM has its core and serves (`ready`), its term, and the GM it stands in for;
    `journal_failing`: why its journal's last write or sync failed (a full or read-only disk: every submission is
    refused with 503 meanwhile), until one succeeds again ("" when none failed)."""

    gm: Index
    ready: bool
    term: Count
    standing_in_for: list[Index]
    journal_failing: str = ""


class LMHealth(Health):
    """LM `GET /healthz`: whether the LM has its core (`ready`), and its incarnation (its life since a restart)."""

    lm: Index
    ready: bool
    incarnation: Count


class WorkerHealth(Health):
    """Worker agent `GET /healthz`: whether it is registered with its LM."""

    worker: Name
    registered: bool


class GMState(WireModel):
    """GM `GET /v1/state`: the GM core's `view_snapshot()` (its counters, the data centre's capacity and each
    partition as its view has it) with the job table's unfinished tasks and dropped jobs, and the LMs' URLs as
    this GM reaches them (`megha nodes` asks here without --lm)."""

    gm: Index
    queued: Count
    waiting: Count = Field(description="tasks parked as they fit nowhere in the GM's view, and waiting gangs' tasks")
    running: Count
    repartitions: Count
    inconsistencies: Count
    reschedules: Count
    preemption_attempts: Count
    preemptions: Count
    preempted: Count
    retries: Count
    failures_retried: Count = Field(0, description="failed runs run again under their job's retry rule")
    ignored_run_ends: Count = Field(
        0,
        description="reports of a run's end ignored: repeats, and copies of the end of a run that is not the task's "
        "current one (an earlier attempt or run, another LM's)",
    )
    cancelled: Count
    total_capacity: list[Count]
    partitions: list[PartitionUse]
    unfinished_tasks: Count
    finished_jobs_dropped: Count
    lm_urls: list[str]
    ignored_broker_messages: Count = Field(
        description="messages on this GM's queue not signed for it by the LM they name (docs/security.md)"
    )


class Heartbeat(WireModel):
    """A worker's last heartbeat as its LM saw it: how long ago, and the tasks it then ran."""

    age_seconds: Annotated[float, Field(ge=0)]
    running: Count


class GangLeaseHeld(WireModel):
    """A gang part an LM holds prepared under a lease, awaiting its GM's commit or abort (docs/gang.md)."""

    gm: Index
    gang: Name
    seq: Count = Field(description="the prepare's request number in the (GM, LM) sequence")
    tasks: Count
    expires_in: float = Field(description="seconds until the lease expires on the LM's clock")


class LMState(WireModel):
    """LM `GET /v1/state`: readiness, registered nodes and workers, the core's counters and every node's free
    resources and capacity (aligned to the resource names), each user's usage here (fair scheduling), the workers'
    heartbeats, the nodes taken out of service (by node number, why), the workers found lost, and the gang parts
    held prepared under leases (what `megha chaos` watches to kill a process between a gang's prepare and commit).
    """

    lm: Index
    ready: bool
    incarnation: Count
    registered_nodes: Count
    expected_nodes: Count
    workers: Count
    running: Count
    logical_nodes: Count
    inconsistencies: Count
    repartitions: Count
    preemptions: Count
    preemption_refusals: Count
    stopped: Count = Field(description="runs of cancelled jobs stopped at their GM's request")
    preempting: Count
    launched: Count
    failed_launches: Count
    free: list[list[Count]]
    capacity: list[list[Count]]
    idle: bool
    usage: dict[User, list[Count]]
    heartbeats: dict[Name, Heartbeat]
    down_nodes: dict[str, str]
    ignored_reports: Count = Field(description="unsigned or forged broker reports (docs/security.md)")
    lost_workers: dict[Name, Count]
    gang_leases: list[GangLeaseHeld] = Field(default_factory=list)


class WorkerState(WireModel):
    """Worker agent `GET /v1/state`: how it executes tasks and the ids of those it runs, oldest first, and of the
    queueable tasks waiting in its nodes' queues, node by node, oldest first (docs/queueable.md)."""

    worker: Name
    execution: Literal["real", "simulated"]
    running: list[Name]
    queued: list[Name] = []


class PartitionNodes(WireModel):
    """One partition of an LM (the nodes GM `gm` owns there): per node its capacity (aligned to the resource
    names), machine constraints and task drivers."""

    gm: Index
    capacities: list[list[Count]]
    constraints: list[ConstraintIds]
    drivers: list[list[Driver]]


class LMCluster(WireModel):
    """LM `GET /v1/cluster`: this LM's partitions, one per GM, and the LM's life (`incarnation`, as its health
    check says) they belong to."""

    lm: Index
    incarnation: Count = 0
    resource_names: list[Name]
    partitions: list[PartitionNodes]


class TasksAccepted(WireModel):
    """Worker agent `POST /v1/tasks` (202): the ids of the tasks it accepted (all of the launch, or an error)."""

    accepted: list[Name]


class StopResponse(WireModel):
    """LM `POST /v1/stop` and worker agent `POST /v1/preempt`: the runs stopped (each is reported as it ends);
    the others were not held there (ended already, or another attempt)."""

    stopped: list[Name]


class JournalCopied(WireModel):
    """GM `POST /v1/peers/{gm}/journal`: the lines of GM `gm`'s journal this GM keeps now."""

    gm: Index
    lines: Count
