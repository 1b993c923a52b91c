"""The LM service: the LM core once the cluster is complete and the lock its every step takes, and the calls a GM or
an agent makes on it (registration, launch, preemption, stop, broker reports, a GM's claim and recovery state).

What an LM does besides lives in modules of their own: who its agents and nodes are (`membership`), which broker
reports it believes (`reports`), how it sends what its core decides (`dispatch`), and its watch over silent agents
(`liveness`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from urllib.parse import quote

from pydantic_core import to_json

from megha.common.core.cluster import PartitionSpec
from megha.common.core.fencing import GMTerms
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import (
    FinishedTask,
    GangAbort,
    GangCommit,
    GangCommitted,
    GangPrepare,
    GangPrepared,
    LaunchBatch,
    LaunchResponse,
    Placement,
    PreemptRequest,
    PreemptResponse,
    Send,
    StopRequest,
    WorkerPreempt,
    WorkerReport,
)
from megha.common.core.recovery import lm_report
from megha.common.core.resources import DEFAULT_RESOURCE_NAMES
from megha.common.models import (
    BrokerMessage,
    DeltaModel,
    EndedRun,
    PlacementModel,
    WorkerRegistered,
    WorkerRegistration,
    WorkerReportModel,
)
from megha.common.settings import LMSettings
from megha.common.transport.rabbit import Broker, TryLater, lm_key
from megha.services.client import Reply, ServiceClient
from megha.services.lm.dispatch import LMDispatch, batch_ids
from megha.services.lm.liveness import AgentWatch
from megha.services.lm.membership import Membership, RegistrationError
from megha.services.lm.metrics import LMMeter
from megha.services.lm.reports import ReportGate
from megha.services.logs import ids, log_preemption

log = logging.getLogger("megha.lm")

HELD_SETTLE = 3.0
"""Seconds a rebuilt LM waits, beyond one delta interval, before it tells GMs which runs it holds: reports that
waited in its queue while it was down come back within a second or two of its being ready."""


SAME_ID_CHECK = 2.0
"""Seconds an LM gives the first address of an agent that registers again from another one to answer as that agent
(it is then a second agent with the same id, and refused); short, so the registration call is answered in time."""

BACKLOG_WAIT = 10.0
"""Seconds at most a started LM answers GMs' claims with 503 while the reports that waited in its queue are applied
(a run that ended while it was down is then known to it as ended, not launched again by a GM that claims it);
after that it answers with what it has (the broker may be down, or its queue never empty)."""

BACKLOG_POLL = 0.05
"""Seconds between two looks at the LM's queue while its backlog is applied."""


ENDED_KEPT = 200_000
"""Ended runs an LM remembers (about 150 bytes each): a launch retried after its run ended is not run again, and
a GM that restarts learns which of its runs ended."""


class NotReady(TryLater):
    """The LM is still waiting for worker agents to register its nodes (a broker message that needs the cluster
    is requeued until it is complete; a route answers 503)."""


class LMService:
    def __init__(self, settings: LMSettings, broker: Broker | None = None) -> None:
        self.settings = settings
        self.resource_names = DEFAULT_RESOURCE_NAMES
        # This LM's life: agents register again when it changes, and node versions start above the last one's.
        self.incarnation = time.time_ns() // 1_000_000
        self.members = Membership(settings, self.resource_names, self.incarnation)
        self.reports = ReportGate(settings, self.members)
        self.core: LocalMaster | None = None
        self.meter = LMMeter()  # what the core decides, from its observer events (GET /metrics, /v1/state)
        self.partitions_spec: tuple[PartitionSpec, ...] = ()
        self._lock = asyncio.Lock()
        self.calls = ServiceClient(settings.http_timeout, authorization=settings.credentials())
        self.dispatch = LMDispatch(settings, broker, self.calls, self.members, self._lose_unlaunched, self._tick)
        self.watch = AgentWatch(self)
        self.failed_launches = 0
        self.terms = GMTerms(settings.num_gms)  # who holds each GM identity: older holders are fenced
        self.backlog_read = asyncio.Event()  # the reports that waited for this LM were applied (`_read_backlog`)

    @property
    def broker(self) -> Broker | None:
        """The broker the LM publishes to and consumes from (None: none, in tests)."""
        return self.dispatch.broker

    @broker.setter
    def broker(self, broker: Broker | None) -> None:
        self.dispatch.broker = broker

    @property
    def registered_nodes(self) -> int:
        return self.members.registered_nodes

    def ready_core(self) -> LocalMaster:
        """The LM core; NotReady until every expected node registered."""
        if self.core is None:
            raise NotReady(f"{self.registered_nodes}/{self.settings.expected_nodes} nodes registered")
        return self.core

    # --------------------------------------------------------- registration

    async def register(self, reg: WorkerRegistration) -> WorkerRegistered:
        """Give an agent its node numbers (`Membership`); the cluster is complete, and the core built, once every
        expected node is. An agent that registers again keeps its nodes, and what this LM ran there and it no
        longer runs is lost."""
        held = self.members.agent_nodes.get(reg.worker_id)
        if (
            held is not None
            and held[0] != reg.url
            and await self.watch.answers_at(held[0], reg.worker_id, SAME_ID_CHECK)
        ):
            raise RegistrationError(
                f"{reg.worker_id} is registered already by an agent that answers at {held[0]} (this one is at "
                f"{reg.url}): each agent needs a MEGHA_WORKER_ID of its own",
                "worker_id",
            )
        known = self.members.rejoined(reg)
        if known is not None:
            await self._lose_missing(reg)
            return known
        if self.core is not None:
            raise RegistrationError(
                f"LM {self.settings.lm_id} is complete with {self.settings.expected_nodes} nodes; "
                f"{reg.worker_id} is not one of its agents"
            )
        registered = self.members.admit(reg, self.reports.key_for(reg.worker_id))
        if self.members.complete:
            self._build_core()
        return registered

    def _build_core(self) -> None:
        """Build the core over the partitions of the registered nodes; take as running what the agents reported
        running (an LM rebuilt after a crash), and tell every GM every node's state."""
        parts = self.members.partitions()
        self.partitions_spec = parts
        self.core = LocalMaster(
            self.settings.lm_id,
            parts,
            self.resource_names,
            observer=self.meter,
            delta_interval=self.settings.delta_interval,
            fairness=self.settings.fairness(),
            incarnation=self.incarnation,
            ended_runs_kept=ENDED_KEPT,
            priority_classes=True,  # the tasks carry their class values (MEGHA_PRIORITY_CLASSES at the GMs)
            queueable_per_node=self.settings.queueable_per_node,
        )
        self.core.adopt(self.members.adopting)
        log.info(
            "cluster complete (incarnation %d): %d nodes in %d partitions of sizes %s; %d running tasks adopted",
            self.incarnation,
            sum(len(p.capacities) for p in parts),
            len(parts),
            [len(p.capacities) for p in parts],
            len(self.core.running),
        )
        self.members.adopting = []
        self.dispatch.send(self.core.start(time.time()))
        if self.broker is None:
            self.backlog_read.set()
        else:
            self.dispatch.spawn(self._read_backlog())
            if self.members.rebuilt:
                self.dispatch.spawn(self._announce_rebuilt())

    async def _read_backlog(self) -> None:
        """Wait until no report waits in this LM's queue or is being applied (for at most BACKLOG_WAIT): the reports
        that came while the LM was down, given back until its cluster was complete. Until then a GM's claim gets
        503 and asks again, so that a run that ended meanwhile, unknown to this incarnation, is in the ended runs
        the claim answers with, and its GM does not launch it again."""
        assert self.broker is not None
        deadline = time.monotonic() + BACKLOG_WAIT
        waiting: int | str = "?"
        try:
            while time.monotonic() < deadline:
                try:
                    waiting = await self.broker.backlog("lm", lm_key(self.settings.lm_id))
                except Exception as exc:  # the broker is away: look again until the deadline
                    waiting = f"? ({type(exc).__name__})"
                if waiting == 0:
                    return
                await asyncio.sleep(BACKLOG_POLL)
            log.warning(
                "%s reports still wait for LM %d %g s after its cluster was complete; GMs' claims are answered now",
                waiting,
                self.settings.lm_id,
                BACKLOG_WAIT,
            )
        finally:
            self.backlog_read.set()

    async def _announce_rebuilt(self) -> None:
        """Tell every GM this LM was rebuilt, once the reports that waited for it had time to be applied; each GM
        then asks which of its runs this LM holds or saw end, and runs again those neither (an agent restarted
        without them, or went, during this LM's outage). A report that still arrives later for such a run is for
        an attempt its GM no longer knows, and is ignored."""
        await asyncio.sleep(HELD_SETTLE + self.settings.delta_interval)
        for gm in range(self.settings.num_gms):
            body = to_json({"lm_rebuilt": {"lm": self.settings.lm_id, "gm": gm, "incarnation": self.incarnation}})
            await self.dispatch.publish(gm, body)

    async def _lose_missing(self, reg: WorkerRegistration) -> None:
        """An agent registered again without some tasks this LM placed on it (it restarted): those are lost."""
        if self.core is None:
            return
        _, nodes = self.members.agent_nodes[reg.worker_id]
        reported = {(p.task.task_id, p.task.attempt) for p in reg.running}
        missing = [p for p in self.core.tasks_on(nodes) if (p.task.task_id, p.task.attempt) not in reported]
        if missing:
            await self._lose_unlaunched(missing, f"worker agent {reg.worker_id} restarted", reg.worker_id)

    async def task_logs(self, node: int, task_id: str, query: str) -> Reply:
        """The answer of the agent holding `node` to `GET /v1/tasks/{task_id}/logs?{query}` (the output a task's
        run left there); KeyError when no agent registered `node`, CallError when the agent cannot be reached."""
        url = self.members.url_of(node)
        return await self.calls.get(f"{url}/v1/tasks/{quote(task_id, safe='')}/logs{'?' + query if query else ''}")

    def partitions(self) -> tuple[PartitionSpec, ...]:
        self.ready_core()
        return self.partitions_spec

    # -------------------------------------------------------------- launches

    async def launch(self, batch: LaunchBatch, term: int = 0) -> LaunchResponse:
        """Validate and place a GM's batch; raises Superseded when `term` is older than the GM's current holder's
        (checked under the lock that claims take too, so no claim slips between the check and the placement).
        This runs for every task at thousands a second: a batch is logged at INFO only when the LM rejected some
        of it (rare), and its repartitions (common under load, and logged by the GM) at DEBUG."""
        core = self.ready_core()
        async with self._lock:
            self.terms.check(batch.gm, term)
            repartitions = self.meter.repartitions
            outputs = core.handle(batch, time.time())
            repartitions = self.meter.repartitions - repartitions
        response = next(o.msg for o in outputs if isinstance(o, Send) and isinstance(o.msg, LaunchResponse))
        if response.rejected or (repartitions and log.isEnabledFor(logging.DEBUG)):
            self._log_validation(response, repartitions)
        self.dispatch.send([o for o in outputs if o.msg is not response])
        await asyncio.sleep(0)  # the worker launches go out before the GM is answered
        return response

    def _log_validation(self, response: LaunchResponse, repartitions: int) -> None:
        """The outcome of a launch batch the LM rejected some of, or repartitioned for (at DEBUG)."""
        rejected = [r.placement for r in response.rejected]
        inconsistencies = sum(r.inconsistency for r in response.rejected)
        log.log(
            logging.INFO if rejected else logging.DEBUG,
            "launch batch %d of GM %d: %d placed (%d by repartition), %d rejected (%d inconsistencies): %s",
            response.seq,
            response.gm,
            len(response.accepted),
            repartitions,
            len(rejected),
            inconsistencies,
            [p.task.task_id for p in rejected[:20]],
            extra=ids(
                job=sorted({p.task.job_id for p in rejected}) or None,
                task=[p.task.task_id for p in rejected] or None,
                gm=response.gm,
                lm=response.lm,
                node=sorted({p.node for p in rejected}) or None,
            ),
        )
        if log.isEnabledFor(logging.DEBUG):
            for r in response.rejected:
                p = r.placement
                log.debug(
                    "rejected task %s of job %s on node %d: %s",
                    p.task.task_id,
                    p.task.job_id,
                    p.node,
                    r.reason,
                    extra=_placement_ids(p),
                )
            for p in response.accepted:
                if p.repartition:
                    log.debug(
                        "task %s of job %s on node %d by repartition",
                        p.task.task_id,
                        p.task.job_id,
                        p.node,
                        extra=_placement_ids(p),
                    )

    async def preempt(self, req: PreemptRequest, term: int = 0) -> PreemptResponse:
        """Verify and carry out a GM's preemption request; the victims' agents stop them before the waiting task
        is sent to its agent. Raises Superseded as `launch` does."""
        core = self.ready_core()
        async with self._lock:
            self.terms.check(req.gm, term)
            outputs = core.handle(req, time.time())
            stops = [o.msg for o in outputs if isinstance(o.msg, WorkerPreempt)]
            by_url: dict[str, list[str]] = {}
            for stop in stops:
                for task_id in stop.task_ids:
                    node = core.preempting[task_id].placement.node
                    by_url.setdefault(self.members.node_worker[node], []).append(task_id)
        response = next(o.msg for o in outputs if isinstance(o, Send) and isinstance(o.msg, PreemptResponse))
        log_preemption(log, req, response)
        rest = [o for o in outputs if o.msg is not response and not isinstance(o.msg, WorkerPreempt)]
        if by_url:
            self.dispatch.spawn(self.dispatch.stop_then_send(by_url, rest))
        else:
            self.dispatch.send(rest)
        return response

    async def stop(self, req: StopRequest, term: int = 0) -> list[str]:
        """Stop runs of a GM's cancelled jobs on their agents (each is reported to the GM as it ends); returns the
        runs stopped. Raises Superseded as `launch` does."""
        core = self.ready_core()
        async with self._lock:
            self.terms.check(req.gm, term)
            outputs = core.handle(req, time.time())
            by_url: dict[str, list[str]] = {}
            stopped: list[str] = []
            for out in outputs:
                if isinstance(out.msg, WorkerPreempt):
                    for task_id in out.msg.task_ids:
                        node = core.preempting[task_id].placement.node
                        by_url.setdefault(self.members.node_worker[node], []).append(task_id)
                        stopped.append(task_id)
        if stopped:
            log.info(
                "GM %d asked to stop %d runs (of cancelled jobs, or of a gang that runs again whole): %s",
                req.gm,
                len(stopped),
                stopped[:20],
                extra=ids(task=stopped, gm=req.gm, lm=req.lm),
            )
        rest = [o for o in outputs if not isinstance(o.msg, WorkerPreempt)]
        self.dispatch.spawn(self.dispatch.stop_then_send(by_url, rest))
        return stopped

    async def on_broker_message(self, body: bytes, headers: Mapping[str, object] | None = None) -> None:
        """Apply a worker agent's heartbeat or report. With MEGHA_AUTH=on only what its agent signed counts: an
        unsigned or forged message, a heartbeat of another agent, and the items of a report about nodes its signer
        does not hold are ignored and logged (`ReportGate`), never requeued."""
        sender = None
        if self.reports.secret is not None:
            sender = self.reports.signer(body, headers or {})
            if sender is None:
                return
        msg = BrokerMessage.model_validate_json(body)
        if msg.heartbeat is not None:
            beat = msg.heartbeat
            if sender is not None and beat.worker_id != sender:
                self.reports.ignore(sender, f"it is a heartbeat of {beat.worker_id!r}")
                return
            self.members.heartbeats[beat.worker_id] = beat
            if beat.worker_id in self.members.agent_nodes:
                await self.watch.heard(beat.worker_id, beat.running)
        if msg.worker_report is not None:
            if self.core is None:
                raise NotReady("report before the cluster is complete")
            report: WorkerReportModel | None = msg.worker_report
            if sender is not None:
                report = self.reports.of_own_nodes(sender, msg.worker_report)
            if report is not None:
                await self._apply_report(report.to_core())

    async def _apply_report(self, report: WorkerReport) -> None:
        """Apply a worker's report (or the LM's own, of lost tasks) and publish a task event for each run it
        ends: only runs the LM placed count, so a stale copy's report never reaches the event stream."""
        core = self.ready_core()
        async with self._lock:
            placed = {
                item.task_id: alloc.placement
                for item in report.finished
                if (alloc := core.running.get(item.task_id) or core.preempting.get(item.task_id)) is not None
            }
            outputs = core.handle(report, time.time())
        for item in report.finished:
            if item.error and not item.lost and not item.preempted and (p := placed.get(item.task_id)) is not None:
                log.warning(
                    "task %s of job %s failed on node %d: %s",
                    item.task_id,
                    p.task.job_id,
                    p.node,
                    item.error,
                    extra=_placement_ids(p) | ids(worker=self.members.worker_of(p.node)),
                )
        await self.dispatch.send_confirmed(outputs)  # the report is acked once its GMs' completions are safe
        await self.dispatch.publish_events(outputs, placed, {item.task_id: item for item in report.finished})

    def recovery_state(self, gm: int) -> dict[str, object]:
        """What GM `gm` needs when it (re)starts: every node's state, its runs here, and its runs that ended
        here recently (the `GMRecovery` body)."""
        core = self.ready_core()
        if not self.backlog_read.is_set():
            raise NotReady("the reports that waited for this LM are being applied")
        report = lm_report(core, gm)  # runs being preempted count as held: their worker's report is to come
        return {
            "lm": self.settings.lm_id,
            "incarnation": self.incarnation,
            "delta": DeltaModel.plain(report.delta),
            "running": [PlacementModel.plain(p) for p in report.running],
            "ended": [EndedRun.plain(run) for run in report.ended],
            "term": self.terms.terms[gm],
        }

    async def claim(self, gm: int, term: int, by: int) -> dict[str, object]:
        """GM `gm` taken over with `term` by GM `by` (itself, or the peer standing in for it): its older terms are
        fenced from now on. Returns the `GMRecovery` state of that moment; raises Superseded (or NotReady)."""
        async with self._lock:
            state = self.recovery_state(gm)
            self.terms.claim(gm, term)
        state["term"] = term
        who = "itself" if by == gm else f"GM {by}, standing in for it"
        log.info("GM %d claimed with term %d by %s; calls with older terms are refused", gm, term, who)
        return state

    async def _lose_unlaunched(
        self, placements: list[Placement], reason: str, worker: str | None, unreachable: bool = False
    ) -> None:
        """Free the resources of tasks no agent (`worker`) could take and report them lost: their GM places them
        again as their next attempt (never silently dropped). An agent that could not be reached (`unreachable`)
        and fails its health check too is taken out of service with its nodes at once, as a silent one is after
        MEGHA_WORKER_TIMEOUT: its GMs then place nothing more there until it is heard again, rather than spending
        the tasks' attempts on it."""
        self.failed_launches += len(placements)
        known = worker is not None and worker in self.members.agent_nodes and self.core is not None
        down = unreachable and known and not await self.watch.answers(worker)  # type: ignore[arg-type]
        log.error(
            "%d tasks could not be launched on worker agent %s (%s): %s; tasks %s",
            len(placements),
            worker,
            "which does not answer: out of service until it is heard" if down else "their GMs place them again",
            reason,
            [p.task.task_id for p in placements[:20]],
            extra=batch_ids(placements) | ids(lm=self.settings.lm_id, worker=worker),
        )
        if down:
            await self.watch.take_down(worker, f"worker agent {worker} unreachable")  # type: ignore[arg-type]
            return
        report = WorkerReport(
            self.settings.lm_id,
            [FinishedTask.of(p, error=reason, lost=True) for p in placements],
        )
        await self._apply_report(report)

    async def _tick(self, msg: object) -> None:
        """A core timer fired: its delta timer (DeltaTick), or a gang's lease ran out (LeaseExpiry)."""
        core = self.ready_core()
        async with self._lock:
            outputs = core.handle(msg, time.time())
        self.dispatch.send(outputs)

    async def gang(
        self, msg: GangPrepare | GangCommit | GangAbort, term: int = 0
    ) -> GangPrepared | GangCommitted | None:
        """A GM's gang prepare, commit or abort (docs/gang.md): the core's answer to it (None for an abort); what
        it launches goes to the agents. Raises Superseded as `launch` does."""
        core = self.ready_core()
        async with self._lock:
            self.terms.check(msg.gm, term)
            outputs = core.handle(msg, time.time())
        answer = next((o.msg for o in outputs if isinstance(o.msg, GangPrepared | GangCommitted)), None)
        self.dispatch.send([o for o in outputs if o.msg is not answer])
        await asyncio.sleep(0)  # the worker launches go out before the GM is answered
        return answer

    async def close(self) -> None:
        for task in list(self.dispatch.tasks):
            task.cancel()
        await self.calls.aclose()

    def state(self) -> dict[str, object]:
        core = self.core
        return {
            "lm": self.settings.lm_id,
            "ready": core is not None,
            "incarnation": self.incarnation,
            "registered_nodes": self.registered_nodes,
            "expected_nodes": self.settings.expected_nodes,
            "workers": len(self.members.workers),
            "running": len(core.running) if core else 0,
            "logical_nodes": len(core.logical_nodes) if core else 0,
            "inconsistencies": self.meter.inconsistencies,
            "repartitions": self.meter.repartitions,
            "preemptions": self.meter.preemptions,
            "preemption_refusals": self.meter.preemption_refusals,
            "stopped": self.meter.stops,  # runs of cancelled jobs stopped at their GM's request
            "preempting": len(core.preempting) if core else 0,
            "launched": self.meter.launches,
            "failed_launches": self.failed_launches,
            "free": [list(f) for f in core.free] if core else [],
            "capacity": [list(c) for c in core.capacity] if core else [],
            "idle": core.is_idle() if core else True,
            "usage": {u: list(v) for u, v in (core.shares.snapshot() or {}).items()} if core else {},
            "heartbeats": {
                w: {"age_seconds": round(time.time() - h.at, 3), "running": h.running}
                for w, h in self.members.heartbeats.items()
            },
            "down_nodes": {str(n): why for n, why in core.down.items()} if core else {},
            "ignored_reports": self.reports.ignored.count,  # unsigned or forged broker reports (docs/security.md)
            "lost_workers": {w: len(ids) for w, ids in self.members.liveness.lost.items()},
            "gang_leases": [  # gang parts prepared here, awaiting their commit (docs/gang.md)
                {
                    "gm": gm,
                    "gang": gang,
                    "seq": lease.seq,
                    "tasks": len(lease.placements),
                    "expires_in": round(lease.expires_at - time.time(), 3),
                }
                for (gm, gang), lease in core.gangs.held.items()
            ]
            if core
            else [],
        }


def _placement_ids(p: Placement) -> dict[str, object]:
    """The log ids of one run: its job, task, attempt, GM, LM and node."""
    t = p.task
    return ids(job=t.job_id, task=t.task_id, attempt=t.attempt, gm=p.gm, lm=p.lm, node=p.node, user=t.user)
