"""Messages the core exchanges between GMs, LMs and workers, and the outputs a core step returns.

These are the in-process (sans-I/O) forms; the services convert them to and from the pydantic wire models.
Node states travel as (free resources, version): an LM bumps a node's version on every change, so a GM can
tell a fresh report from a stale one whatever order messages arrive in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from megha.common.core.resources import Resources
from megha.common.core.task import TaskSpec


def gm_address(gm: int) -> str:
    return f"gm/{gm}"


def lm_address(lm: int) -> str:
    return f"lm/{lm}"


def worker_address(lm: int) -> str:
    return f"worker/{lm}"


@dataclass(slots=True)
class Send:
    """Deliver `msg` to `dest` over the transport (one network hop)."""

    dest: str
    msg: object


@dataclass(slots=True)
class Wake:
    """Deliver `msg` back to `dest` (the sender itself) at time `at`, with no network hop: a timer."""

    at: float
    dest: str
    msg: object


Output = Send | Wake


class NodeState(NamedTuple):
    """An LM's authoritative free resources of one physical node, and the node's version when read."""

    node: int
    free: Resources
    version: int


# Builds a NodeState from a (node, free, version) tuple without NamedTuple's Python-level __new__: LMs create
# one per node change per GM, the hottest allocation of a simulation.
node_state: Callable[[tuple[int, Resources, int]], NodeState] = partial(tuple.__new__, NodeState)


@dataclass(slots=True)
class Placement:
    """A GM's decision: run `task` on physical node `node` of LM `lm`.

    `repartition` is True when the node lies in another GM's partition: the LM then carves exactly the task's
    request out of that node into a logical node of the requesting GM's partition. `gm` is the GM that placed the
    task (its completion goes there); the worker keeps it so that an LM rebuilt after a crash knows it too.
    """

    task: TaskSpec
    lm: int
    node: int
    repartition: bool
    gm: int = 0


@dataclass(slots=True)
class LaunchBatch:
    """GM -> LM: placements for one LM, sent together. `seq` increases per (GM, LM) pair."""

    gm: int
    lm: int
    seq: int
    placements: list[Placement]


@dataclass(slots=True)
class Rejection:
    """A placement the LM refused. `inconsistency` is True when the cause is a stale GM view (the node lacks the
    free resources), False for a malformed request."""

    placement: Placement
    reason: str
    inconsistency: bool


@dataclass(slots=True)
class Delta:
    """LM -> GM: the nodes whose state changed since the last delta sent to that GM.

    `applied_through` is the highest LaunchBatch seq from that GM the LM had applied when it built the delta;
    the GM re-applies its own later, still unanswered placements on top of these states.
    """

    lm: int
    gm: int
    applied_through: int
    nodes: list[NodeState] = field(default_factory=list)
    usage: dict[str, Resources] | None = None  # with fair scheduling: resources each user holds on this LM
    priority_usage: dict[int, Resources] | None = None  # with priority classes: resources held per task priority


@dataclass(slots=True)
class LaunchResponse:
    """LM -> GM: the outcome of one LaunchBatch: the current state of every node it touched, and the GM's
    pending delta piggybacked."""

    gm: int
    lm: int
    seq: int
    accepted: list[Placement]
    rejected: list[Rejection]
    states: list[NodeState]
    delta: Delta


@dataclass(slots=True)
class WorkerLaunch:
    """LM -> worker: start these tasks on these physical nodes."""

    lm: int
    launches: list[Placement]


@dataclass(slots=True)
class FinishedTask:
    """A task (its `attempt`) that ended on a worker; `error` says why it failed ("" when it ran to completion).

    A real worker also reports what it measured of the run (the last four fields); the LM core keeps none of it
    and passes only the error on to the GM, while the LM service publishes the measurements in task events."""

    task_id: str
    node: int
    preempted: bool = False
    error: str = ""
    attempt: int = 1
    lost: bool = False  # set by the LM itself when the task's worker is lost (never by a worker)
    gm: int = -1  # the GM that placed the run, as the worker knows it (-1: not said)
    run_number: int = 1  # the run of `attempt` (TaskSpec.run_number)
    cpu_seconds: float = 0.0  # CPU time the run burnt
    execution_delay: float = 0.0  # burn runs: wall time minus duration (fair paper VI-F); else 0
    # burn runs: the part of execution_delay outside the task's own process clock (its interpreter starting, its
    # exit and reaping); the rest is the process running past its duration (short of CPU). Else 0
    process_overhead: float = 0.0
    started_at: float | None = None  # unix seconds; None when the run never started
    finished_at: float | None = None  # unix seconds
    # The run's exit code for retry rules (common/core/retry.py): exec and container runs only, 128 + n when a
    # signal n killed it, 137 when its memory limit did; None for burn, a duration limit or a run never started.
    exit_code: int | None = None

    @classmethod
    def of(cls, placement: Placement, **fields: Any) -> FinishedTask:
        """The end of the run `placement` launched (its task, node, attempt and run number), with `fields`."""
        task = placement.task
        return cls(task.task_id, placement.node, attempt=task.attempt, run_number=task.run_number, **fields)


@dataclass(slots=True)
class WorkerReport:
    """Worker -> LM: tasks that finished."""

    lm: int
    finished: list[FinishedTask]


@dataclass(slots=True)
class Completion:
    """One finished task of a GM, with its node's state right after the task's resources were returned, and why
    it failed ("" when it ran to completion). `preempted` tasks did not finish: the GM queues them again. `lost`
    tasks did not finish either: their worker was lost (`error` says how), and the GM runs them again as their
    next attempt, or fails them once MEGHA_MAX_ATTEMPTS attempts were made."""

    task_id: str
    state: NodeState
    error: str = ""
    preempted: bool = False
    lost: bool = False
    attempt: int = 1
    forwarded: bool = False  # the LM did not place this run (it restarted since): the GM checks the attempt
    # When the run ended, as its worker measured it (unix seconds; set on forwarded ends, None when not known):
    # the end the GM then announces carries it, so it is the same event as one an earlier LM incarnation
    # published before it crashed (a consumer tells a repeat by task, attempt, kind and time).
    finished_at: float | None = None
    exit_code: int | None = None  # as in FinishedTask: what a job's retry rule matches
    started_at: float | None = None  # when the run started on its worker, as it measured it (None: not known)
    run_number: int = 1  # the run of `attempt` that ended (TaskSpec.run_number): the GM applies the end to it only


@dataclass(frozen=True, slots=True)
class EndedRun:
    """LM -> a restarting GM (`recovery.LMReport`): run `attempt` of `task_id` ended on `node`, finished (`error`
    "") or failed, with the exit code a job's retry rule matches (None: it has none). `run_number` names which
    launch of the attempt it was: a GM that restarted launches the attempt again under a new one."""

    task_id: str
    attempt: int
    node: int
    error: str = ""
    exit_code: int | None = None
    run_number: int = 1


@dataclass(slots=True)
class Completions:
    """LM -> GM: the GM's own tasks that finished. Resources they free reach the GM here, not in deltas
    (constraint-aware paper, section 4.4). `applied_through` as in Delta."""

    lm: int
    gm: int
    applied_through: int
    items: list[Completion]


@dataclass(slots=True)
class Victim:
    """A user whose tasks a GM asks an LM to preempt, with the GM's view of that user's usage everywhere but on
    that LM (the LM adds its own exact part to verify the user is still over its share)."""

    user: str
    usage_elsewhere: Resources


@dataclass(slots=True)
class PreemptRequest:
    """GM -> LM: make room for `task` (whose user is below its share) by preempting tasks of `victims`, tried in
    order (largest share violation first), and launch it. `seq` shares the (GM, LM) LaunchBatch numbering;
    `total` is the data centre's capacity, which shares are fractions of (an LM knows only its own cluster)."""

    gm: int
    lm: int
    seq: int
    task: TaskSpec
    victims: list[Victim]
    total: Resources


@dataclass(slots=True)
class PreemptResponse:
    """LM -> GM: `placement` where the task now runs and the tasks `preempted` for it, or None and `reason`
    when the LM could not verify any victim; with the state of the node it touched and the GM's delta."""

    gm: int
    lm: int
    seq: int
    task: TaskSpec
    placement: Placement | None
    preempted: list[str]
    reason: str
    states: list[NodeState]
    delta: Delta


@dataclass(slots=True)
class StopRequest:
    """GM -> LM: stop these runs (task id, attempt) of the GM's own tasks, whose job was cancelled. Each is
    reported back as preempted (its resources returned); the GM, knowing it cancelled them, does not queue them
    again. A run the LM does not hold (ended already, or another GM's) is left alone."""

    gm: int
    lm: int
    runs: list[tuple[str, int]]


@dataclass(slots=True)
class WorkerPreempt:
    """LM -> worker: stop these tasks (report each as preempted, or as finished if it already ended)."""

    lm: int
    task_ids: list[str]


@dataclass(slots=True)
class RunEvent:
    """What happened to one run (`attempt`) of a task at time `at`: it `started`, `finished`, was `preempted`,
    was `lost` with its worker, `failed` or was `cancelled`. The services publish these on the events exchange
    (the load generator measures from them); none of the cores reads them."""

    kind: str
    task_id: str
    job_id: str
    lm: int
    node: int
    at: float
    cpu_seconds: float = 0.0  # as in FinishedTask
    execution_delay: float = 0.0  # as in FinishedTask
    process_overhead: float = 0.0  # as in FinishedTask
    error: str = ""  # why it failed ("" otherwise)
    attempt: int = 1
    exit_code: int | None = None  # a failed run's exit code, as in FinishedTask: its job's retry rule may run it again
    run_number: int = 1  # which launch of the attempt (TaskSpec.run_number): a later run's start ends an earlier one


@dataclass(slots=True)
class DeltaTick:
    """Timer message: time for an LM's periodic delta updates."""


@dataclass(slots=True)
class FinishTick:
    """Timer message: tasks on a worker reach the end of their duration."""

    at: float


@dataclass(slots=True)
class GangPrepare:
    """GM -> LM: validate every placement of gang `gang` (its job id) all-or-nothing and reserve their resources
    under a lease of `lease_s` seconds (an uncommitted lease expires and frees them); with `commit` (the whole
    gang is on this LM), launch them at once instead. `seq` shares the (GM, LM) LaunchBatch numbering."""

    gm: int
    lm: int
    seq: int
    gang: str
    placements: list[Placement]
    lease_s: float
    commit: bool = False


@dataclass(slots=True)
class GangPrepared:
    """LM -> GM: prepare `seq` of gang `gang` reserved (or, with `commit`, launched) every placement (`ok`), or
    none, `reason` saying why; with the states of the nodes it touched and the GM's delta."""

    gm: int
    lm: int
    seq: int
    gang: str
    ok: bool
    reason: str
    states: list[NodeState]
    delta: Delta


@dataclass(slots=True)
class GangCommit:
    """GM -> LM: launch the placements reserved by prepare `seq` of gang `gang` (refused once its lease expired)."""

    gm: int
    lm: int
    seq: int
    gang: str


@dataclass(slots=True)
class GangCommitted:
    """LM -> GM: the gang's reserved placements of prepare `seq` were launched (`ok`), or not: `reason`."""

    gm: int
    lm: int
    seq: int
    gang: str
    ok: bool
    reason: str
    states: list[NodeState]
    delta: Delta


@dataclass(slots=True)
class GangAbort:
    """GM -> LM: release the resources reserved by prepare `seq` of gang `gang` (nothing when none are held)."""

    gm: int
    lm: int
    seq: int
    gang: str


@dataclass(slots=True)
class LeaseExpiry:
    """Timer message: an LM's lease for prepare `seq` of GM `gm`'s gang `gang` runs out."""

    gm: int
    seq: int
    gang: str


@dataclass(slots=True)
class GangRetry:
    """Timer message: a GM's gang `gang` whose prepare was refused may be tried again (after its backoff)."""

    gang: str


@dataclass(slots=True)
class GangTimeout:
    """Timer message: a GM's gang `gang` reaches its `gang_timeout` (wait number `wait`); still unplaced, it fails."""

    gang: str
    wait: int
