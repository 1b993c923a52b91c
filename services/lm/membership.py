"""An LM's membership: the worker agents registered with it and their nodes (capacity, machine constraints,
drivers, URL), the partitions the cluster splits into once every expected node registered, the runs agents of an
earlier incarnation brought back, and the agents' heartbeats and liveness."""

from __future__ import annotations

import logging
import time

from megha.common.core.cluster import BURN_ONLY, PartitionSpec
from megha.common.core.constraints import constraint_mask
from megha.common.core.liveness import WorkerLiveness
from megha.common.core.messages import Placement
from megha.common.core.resources import Resources
from megha.common.models import WorkerHeartbeat, WorkerRegistered, WorkerRegistration
from megha.common.settings import LMSettings
from megha.services.logs import ids

log = logging.getLogger("megha.lm")


class RegistrationError(ValueError):
    """A worker registration the LM cannot accept; the message names why, and `field` the registration's field."""

    def __init__(self, message: str, field: str = "nodes") -> None:
        super().__init__(message)
        self.field = field


class Membership:
    """Who an LM's agents are and which nodes each holds; what the LM core is built over."""

    def __init__(self, settings: LMSettings, resource_names: tuple[str, ...], incarnation: int) -> None:
        self.settings = settings
        self.resource_names = resource_names
        self.incarnation = incarnation
        # Node -> capacity, constraint mask, drivers and agent URL, filled as agents register (None: not yet).
        self.capacities: list[Resources | None] = [None] * settings.expected_nodes
        self.masks: list[int] = [0] * settings.expected_nodes
        self.drivers: list[tuple[str, ...]] = [BURN_ONLY] * settings.expected_nodes
        self.node_worker: list[str] = [""] * settings.expected_nodes
        self.workers: dict[str, WorkerRegistered] = {}  # worker id -> what it was told at registration
        self.agent_nodes: dict[str, tuple[str, range]] = {}  # worker id -> (URL, its nodes)
        self.adopting: list[Placement] = []  # tasks agents reported running, for the core once it is built
        self.rebuilt = False  # agents of an earlier incarnation of this LM registered: it comes back from a crash
        self.heartbeats: dict[str, WorkerHeartbeat] = {}  # the latest of each agent
        self.liveness = WorkerLiveness(settings.worker_timeout)  # decisions in the core; monotonic times

    @property
    def registered_nodes(self) -> int:
        return sum(c is not None for c in self.capacities)

    @property
    def complete(self) -> bool:
        """Every expected node registered: the LM core can be built."""
        return self.registered_nodes == self.settings.expected_nodes

    def rejoined(self, reg: WorkerRegistration) -> WorkerRegistered | None:
        """An agent registered before registers again (it restarted; this LM did not): it keeps its nodes, and may
        come back at another address (a new container or VM), where calls go from now on. None for a new agent."""
        known = self.workers.get(reg.worker_id)
        if known is None:
            return None
        caps = self._capacities(reg)  # nodes it cannot read are refused before anything of it changes
        self.liveness.joined(reg.worker_id, time.monotonic())
        nodes = self.agent_nodes[reg.worker_id][1]
        self.agent_nodes[reg.worker_id] = (reg.url, nodes)
        for n in nodes:
            self.node_worker[n] = reg.url
        if caps != [self.capacities[n] for n in nodes] or [constraint_mask(n.constraints) for n in reg.nodes] != [
            self.masks[n] for n in nodes
        ]:
            log.warning(
                "%s registered again with other nodes (%d, capacities %s); its nodes %d..%d keep what it first "
                "registered until this LM restarts",
                reg.worker_id,
                len(caps),
                sorted(set(caps))[:3],
                nodes.start,
                nodes.stop - 1,
                extra=ids(worker=reg.worker_id, lm=self.settings.lm_id),
            )
        if nodes and tuple(reg.drivers) != self.drivers[nodes[0]]:
            log.warning(
                "%s registered again offering drivers %s; its nodes keep %s until this LM restarts",
                reg.worker_id,
                reg.drivers,
                list(self.drivers[nodes[0]]),
                extra=ids(worker=reg.worker_id, lm=self.settings.lm_id),
            )
        return known

    def admit(self, reg: WorkerRegistration, report_key: bytes | None) -> WorkerRegistered:
        """Give a new agent its node numbers (those it claims, if it had them from an earlier incarnation of this
        LM, else the first free run). `report_key`: the key it signs its broker reports with (None: unsigned)."""
        caps = self._capacities(reg)
        # An agent that lived through this LM's restart claims its numbers (`first_node`); one restarted itself claims
        # those it kept (`kept_first_node`), which says nothing of whether this LM restarted.
        live = reg.first_node is not None
        claim = reg.first_node if live else reg.kept_first_node
        first = self._place(reg.worker_id, len(caps), claim, live)
        self.rebuilt = self.rebuilt or live  # an agent of an earlier incarnation
        nodes = range(first, first + len(caps))
        for n, cap, node in zip(nodes, caps, reg.nodes):
            self.capacities[n] = cap
            self.masks[n] = constraint_mask(node.constraints)
            self.drivers[n] = tuple(reg.drivers)
            self.node_worker[n] = reg.url
        registered = WorkerRegistered(
            worker_id=reg.worker_id,
            lm=self.settings.lm_id,
            first_node=first,
            nodes=len(caps),
            incarnation=self.incarnation,
            report_key=report_key.hex() if report_key is not None else None,
        )
        self.workers[reg.worker_id] = registered
        self.agent_nodes[reg.worker_id] = (reg.url, nodes)
        self.liveness.joined(reg.worker_id, time.monotonic())
        self.adopting.extend(p.to_core() for p in reg.running if p.node in nodes and p.lm == self.settings.lm_id)
        log.info(
            "registered %s (nodes %d..%d%s, %d tasks running); %d/%d nodes",
            reg.worker_id,
            first,
            nodes.stop - 1,
            ", as claimed" if claim == first else "",
            len(reg.running),
            self.registered_nodes,
            self.settings.expected_nodes,
        )
        return registered

    def _capacities(self, reg: WorkerRegistration) -> list[Resources]:
        """The capacity of each node `reg` offers; RegistrationError when one does not name every resource."""
        try:
            return [n.resources(self.resource_names) for n in reg.nodes]
        except ValueError as exc:
            raise RegistrationError(str(exc)) from None

    def _place(self, worker_id: str, count: int, claim: int | None, live: bool = True) -> int:
        """The first node of `count` free node numbers: the claimed ones when free, else the first free run.
        `live`: the claim is of an agent that lived through this LM's restart (its runs hold those numbers); a kept
        claim that cannot be met is logged at INFO (a new deployment, say, with fewer nodes per LM)."""
        free = self.capacities
        if claim is not None and claim + count <= len(free) and all(c is None for c in free[claim : claim + count]):
            return claim
        for first in range(len(free) - count + 1):
            if all(c is None for c in free[first : first + count]):
                if claim is not None:
                    log.log(
                        logging.WARNING if live else logging.INFO,
                        "%s claims nodes %d..%d, which are taken; it gets %d..",
                        worker_id,
                        claim,
                        claim + count - 1,
                        first,
                    )
                return first
        raise RegistrationError(
            f"LM {self.settings.lm_id} expects {self.settings.expected_nodes} nodes and has {self.registered_nodes}; "
            f"{count} more do not fit"
        )

    def partitions(self) -> tuple[PartitionSpec, ...]:
        """The registered nodes split, in node order, into one contiguous partition per GM."""
        caps: list[Resources] = [c for c in self.capacities if c is not None]
        n, g, lm = len(caps), self.settings.num_gms, self.settings.lm_id
        bounds = [k * n // g for k in range(g + 1)]
        return tuple(
            PartitionSpec(
                lm,
                gm,
                tuple(caps[bounds[gm] : bounds[gm + 1]]),
                tuple(self.masks[bounds[gm] : bounds[gm + 1]]),
                tuple(self.drivers[bounds[gm] : bounds[gm + 1]]),
            )
            for gm in range(g)
        )

    def url_of(self, node: int) -> str:
        """The URL of the agent holding `node`; KeyError when no agent registered it."""
        url = self.node_worker[node] if 0 <= node < len(self.node_worker) else ""
        if not url:
            raise KeyError(node)
        return url

    def worker_of(self, node: int) -> str | None:
        """The id of the agent that holds `node` (None if none registered it); for log lines, off the hot path."""
        for worker_id, (_, nodes) in self.agent_nodes.items():
            if node in nodes:
                return worker_id
        return None
