"""The wire models of the core's messages (GM <-> LM <-> worker agent), each derived from its core type.

Each mirror (`...Model`) converts losslessly with `from_core(obj)` and `to_core()`, so core -> model -> JSON ->
model -> core gives back an equal object; `core_json(obj)` writes the same JSON straight from the core object (the
services' send path: building the pydantic models of a 50-placement batch would cost about 0.6 ms per hop). The
receiver validates the JSON into the model as always. A mirror's body holds only what its core type cannot say
(`megha.common.wire.mirror`).

Routes: GM -> LM `POST /v1/launch` (`LaunchBatchModel` -> `LaunchResponseModel`), `POST /v1/preempt`
(`PreemptRequestModel` -> `PreemptResponseModel`) and `POST /v1/stop` (`StopRequestModel`); LM -> worker agent
`POST /v1/tasks` (`WorkerLaunchModel`) and `POST /v1/preempt` (`WorkerPreemptModel`). Broker messages:
`DeltaModel`, `CompletionsModel` and `WorkerReportModel` (in a `BrokerMessage` envelope), and `TaskEvent`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, Self

from pydantic import Field, model_validator
from pydantic_core import to_json

from megha.common.core import messages
from megha.common.core.task import RunSpec, TaskSpec
from megha.common.limits import MAX_WAIT_SECONDS
from megha.common.wire.fields import (
    MAX_BODY_BYTES,
    Amounts,
    Argv,
    ConstraintIds,
    Env,
    Image,
    Name,
    User,
    WireModel,
    Workdir,
    check_run,
    ids_of,
    mask_of,
)
from megha.common.wire.mirror import CORE_MIRRORS, Codec, CoreMirror

__all__ = ["CORE_MIRRORS", "CoreMirror"]  # re-exported: the registry the mirrors below fill


class RunSpecModel(CoreMirror, core=RunSpec):
    """Mirror of `RunSpec`: what an exec or container task runs, checked as in `TaskRequest`."""

    driver: Literal["exec", "container"]
    command: Argv = []
    image: Image = ""
    env: Annotated[Env, Codec(dict, lambda env: tuple(env.items()))] = {}
    workdir: Workdir = ""

    @model_validator(mode="after")
    def _driver_fields(self) -> Self:
        check_run(self.driver, self.command, self.image, self.env, self.workdir)
        return self


class TaskSpecModel(CoreMirror, core=TaskSpec):
    """Mirror of `TaskSpec`."""

    constraints: Annotated[ConstraintIds, Codec(ids_of, mask_of)]


class PlacementModel(CoreMirror, core=messages.Placement):
    """Mirror of `Placement`."""


def split_json(
    envelope: dict[str, Any], placements: Sequence[messages.Placement], limit: int, field: str = "placements"
) -> list[tuple[list[messages.Placement], bytes]]:
    """The JSON of `envelope` with a last field `field` holding `placements`, as bodies of at most `limit` bytes
    each: [(a body's placements, the body)], in order, packed greedily. Each body is exactly what `to_json` writes
    for its placements, so sizes are measured, not estimated. A placement too big on its own goes alone in its
    body (its receiver refuses that body with 413, and no other placement with it). All in one body when they
    fit: the common case costs one encoding, as `core_json` does."""
    plain = PlacementModel.plain
    whole = to_json({**envelope, field: [plain(p) for p in placements]})
    if len(whole) <= limit:
        return [(list(placements), whole)]
    empty = to_json({**envelope, field: []})
    head, tail = empty[: -len(b"]}")], b"]}"
    parts: list[tuple[list[messages.Placement], bytes]] = []
    chunk: list[messages.Placement] = []
    pieces: list[bytes] = []
    size = len(head) + len(tail)
    for p in placements:
        piece = to_json(plain(p))
        if chunk and size + 1 + len(piece) > limit:
            parts.append((chunk, head + b",".join(pieces) + tail))
            chunk, pieces, size = [], [], len(head) + len(tail)
        size += len(piece) + (1 if chunk else 0)
        chunk.append(p)
        pieces.append(piece)
    parts.append((chunk, head + b",".join(pieces) + tail))
    return parts


class LaunchBatchModel(CoreMirror, core=messages.LaunchBatch):
    """Mirror of `LaunchBatch` (GM -> LM launch request)."""

    @classmethod
    def core_json_parts(
        cls, obj: messages.LaunchBatch, limit: int = MAX_BODY_BYTES
    ) -> list[tuple[list[messages.Placement], bytes]]:
        """`core_json(obj)` split into bodies of at most `limit` bytes, each a batch of some of its placements
        with the same `seq` (`split_json`)."""
        return split_json({"gm": obj.gm, "lm": obj.lm, "seq": obj.seq}, obj.placements, limit)


class RejectionModel(CoreMirror, core=messages.Rejection):
    """Mirror of `Rejection`."""


class NodeStateModel(CoreMirror, core=messages.NodeState):
    """Mirror of `NodeState`."""


def _priority_usage_wire(usage: dict[int, tuple[int, ...]] | None) -> dict[str, list[int]] | None:
    return None if usage is None else {str(p): list(v) for p, v in usage.items()}


def _priority_usage_core(usage: dict[str, list[int]] | None) -> dict[int, tuple[int, ...]] | None:
    return None if usage is None else {int(p): tuple(v) for p, v in usage.items()}


PriorityValue = Annotated[str, Field(pattern=r"^[0-9]{1,18}$")]
"""A priority value as a JSON object key (JSON keys are strings)."""


class DeltaModel(CoreMirror, core=messages.Delta):
    """Mirror of `Delta` (LM -> GM, broker)."""

    usage: dict[User, Amounts] | None = None
    priority_usage: Annotated[
        dict[PriorityValue, Amounts] | None, Codec(_priority_usage_wire, _priority_usage_core)
    ] = None


class LaunchResponseModel(CoreMirror, core=messages.LaunchResponse):
    """Mirror of `LaunchResponse` (LM -> GM, the response to a `LaunchBatchModel`)."""


class CompletionModel(CoreMirror, core=messages.Completion):
    """Mirror of `Completion`."""


class CompletionsModel(CoreMirror, core=messages.Completions):
    """Mirror of `Completions` (LM -> GM, broker)."""


class WorkerLaunchModel(CoreMirror, core=messages.WorkerLaunch):
    """Mirror of `WorkerLaunch` (LM -> worker agent)."""

    @classmethod
    def core_json_parts(
        cls, obj: messages.WorkerLaunch, limit: int = MAX_BODY_BYTES
    ) -> list[tuple[list[messages.Placement], bytes]]:
        """`core_json(obj)` split into bodies of at most `limit` bytes, each a launch of some of its tasks
        (`split_json`)."""
        return split_json({"lm": obj.lm}, obj.launches, limit, field="launches")


class FinishedTaskModel(CoreMirror, core=messages.FinishedTask, exclude=("lost",)):
    """Mirror of `FinishedTask` (worker -> LM, in a `WorkerReportModel`): a worker never says a task was lost (its
    LM does), and `gm` is -1 when the worker does not know the run's GM."""

    gm: Annotated[int, Field(ge=-1)] = -1


class WorkerReportModel(CoreMirror, core=messages.WorkerReport):
    """Mirror of `WorkerReport` (worker -> LM, broker)."""


class VictimModel(CoreMirror, core=messages.Victim):
    """Mirror of `Victim`."""


class PreemptRequestModel(CoreMirror, core=messages.PreemptRequest):
    """Mirror of `PreemptRequest` (GM -> LM)."""


class PreemptResponseModel(CoreMirror, core=messages.PreemptResponse):
    """Mirror of `PreemptResponse` (LM -> GM, the response to a `PreemptRequestModel`)."""


class WorkerPreemptModel(CoreMirror, core=messages.WorkerPreempt):
    """Mirror of `WorkerPreempt` (LM -> worker agent)."""


class StopRunModel(WireModel):
    """One run to stop: a task and its attempt."""

    task_id: Name
    attempt: Annotated[int, Field(ge=1)] = 1


def _runs_plain(runs: list[tuple[str, int]]) -> list[dict[str, Any]]:
    return [{"task_id": t, "attempt": a} for t, a in runs]


def _runs_core(runs: list[StopRunModel]) -> list[tuple[str, int]]:
    return [(r.task_id, r.attempt) for r in runs]


class StopRequestModel(CoreMirror, core=messages.StopRequest):
    """Mirror of `StopRequest` (GM -> LM, `POST /v1/stop`): stop these runs of the GM's cancelled jobs."""

    runs: Annotated[list[StopRunModel], Field(max_length=100_000), Codec(_runs_plain, _runs_core)]


class GangPrepareModel(CoreMirror, core=messages.GangPrepare):
    """Mirror of `GangPrepare` (GM -> LM, `POST /v1/gangs/prepare`): validate a gang's placements all-or-nothing,
    then reserve them under a lease (or, with `commit`, launch them); `lease_s` > 0 unless `commit`, and at most a
    day (a lease of 9e18 s held the gang's resources for ever)."""

    lease_s: Annotated[float, Field(ge=0, le=MAX_WAIT_SECONDS, allow_inf_nan=False)]


class GangPreparedModel(CoreMirror, core=messages.GangPrepared):
    """Mirror of `GangPrepared` (LM -> GM, the response to a `GangPrepareModel`)."""


class GangCommitModel(CoreMirror, core=messages.GangCommit):
    """Mirror of `GangCommit` (GM -> LM, `POST /v1/gangs/commit`)."""


class GangCommittedModel(CoreMirror, core=messages.GangCommitted):
    """Mirror of `GangCommitted` (LM -> GM, the response to a `GangCommitModel`)."""


class GangAbortModel(CoreMirror, core=messages.GangAbort):
    """Mirror of `GangAbort` (GM -> LM, `POST /v1/gangs/abort`)."""


class GangAborted(WireModel):
    """Response of LM `POST /v1/gangs/abort`: the abort was applied (the reservation, if the LM held one, is free)."""

    gang: Name


class TaskEvent(CoreMirror, core=messages.RunEvent):
    """Mirror of `RunEvent`: a task's `attempt` started, finished, was preempted, was lost with its worker (it runs
    again), failed or was cancelled, at unix time `at`. The load generator computes allocation time and job
    response time from these.

    Who publishes: the agent `started`; the LM `finished`, `preempted`, `failed` and `lost` once it has checked
    the report against the run it placed (a stale copy's report never becomes an event); the GM `failed` for a
    task it gives up on (an LM that never answered, MEGHA_MAX_ATTEMPTS reached). Delivery is at least once: a
    consumer keeps the first event of each (task_id, attempt, kind). A `failed` run with an `exit_code` ends its task
    unless the job's retry rule matches it (docs/retry.md): then the task runs again as its next attempt."""

    kind: Literal["started", "finished", "preempted", "lost", "failed", "cancelled"]


class TaskEvents(WireModel):
    """What travels on the events exchange: task events batched by the service that observed them."""

    events: Annotated[list[TaskEvent], Field(min_length=1)]

    @classmethod
    def core_json(cls, events: Sequence[messages.RunEvent]) -> bytes:
        """The JSON of the batch of `events`, without building the models (as `CoreMirror.core_json`)."""
        plain = TaskEvent.plain
        return to_json({"events": [plain(e) for e in events]})


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
