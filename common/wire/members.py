"""Membership and recovery: an agent's registration with its LM, and what a (re)starting GM learns from LMs.

Routes: LM `POST /v1/workers` (`WorkerRegistration` -> `WorkerRegistered`), LM `GET /v1/gms/{gm}/state` and
`POST /v1/gms/{gm}/claim` (`GMClaim` -> `GMRecovery`), GM `POST /v1/peers/{gm}/journal` and `/release`
(`JournalLines`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import AfterValidator, Field

from megha.common.core import messages
from megha.common.core.resources import Resources
from megha.common.core.task import DRIVERS
from megha.common.wire.core import DeltaModel, PlacementModel
from megha.common.wire.fields import (
    MAX_NODES_PER_WORKER,
    ConstraintIds,
    Count,
    Driver,
    Index,
    Name,
    ResourceName,
    WireModel,
    distinct,
)
from megha.common.wire.mirror import CoreMirror


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
    it had (`first_node`) and reports the tasks it runs (`running`), from which the LM rebuilds its state. An agent
    that restarted itself claims the node numbers it kept in a file (`kept_first_node`,
    `megha.services.worker.node_claim`): given again when free, not a sign that the LM restarted.
    `drivers` are the task drivers the agent offers on every one of its nodes (MEGHA_DRIVERS; absent: burn only)."""

    worker_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")]
    url: Annotated[str, Field(pattern=r"^https?://[^\s/]+(/\S*)?$", max_length=2048)]
    nodes: Annotated[list[WorkerNode], Field(min_length=1, max_length=MAX_NODES_PER_WORKER)]
    first_node: Index | None = None
    kept_first_node: Index | None = None
    running: list[PlacementModel] = []
    drivers: Annotated[list[Driver], Field(min_length=1, max_length=len(DRIVERS)), AfterValidator(distinct)] = ["burn"]


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


class EndedRun(CoreMirror, core=messages.EndedRun):
    """Mirror of `EndedRun`: a run an LM saw end, remembered for a GM that restarts."""


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
