"""The LM service's state: registered workers, the LM core once the cluster is complete, and the core's outputs
turned into HTTP calls (to worker agents), broker messages (to GMs) and timers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from urllib.parse import quote

from pydantic_core import to_json

from megha.common.core.cluster import BURN_ONLY, PartitionSpec
from megha.common.core.constraints import constraint_mask
from megha.common.core.fencing import GMTerms
from megha.common.core.liveness import Heard, WorkerLiveness
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import (
    Completions,
    Delta,
    DeltaTick,
    FinishedTask,
    LaunchBatch,
    LaunchResponse,
    Output,
    Placement,
    PreemptRequest,
    PreemptResponse,
    Send,
    StopRequest,
    WorkerLaunch,
    WorkerPreempt,
    WorkerReport,
)
from megha.common.core.recovery import lm_report
from megha.common.core.resources import DEFAULT_RESOURCE_NAMES, Resources
from megha.common.models import (
    BrokerMessage,
    DeltaModel,
    FinishedTaskModel,
    PlacementModel,
    WorkerHeartbeat,
    WorkerLaunchModel,
    WorkerPreemptModel,
    WorkerRegistered,
    WorkerRegistration,
    WorkerReportModel,
)
from megha.common.settings import LMSettings
from megha.common.transport.rabbit import (
    Broker,
    TryLater,
    gm_key,
    report_key,
    report_sender,
    report_signed_by,
    run_background,
)
from megha.services.http import CallError, Reply, ServiceClient, ids, spawn
from megha.services.metrics import LMMeter

log = logging.getLogger("megha.lm")

HELD_SETTLE = 3.0
"""Seconds a rebuilt LM waits, beyond one delta interval, before it tells GMs which runs it holds: reports that
waited in its queue while it was down come back within a second or two of its being ready."""


ENDED_KEPT = 200_000
"""Ended runs an LM remembers (about 150 bytes each): a launch retried after its run ended is not run again, and
a GM that restarts learns which of its runs ended."""

IGNORED_LOG_EVERY = 60.0
"""Seconds between two log lines about ignored broker reports claiming the same sender (a flood of forged reports
costs one line a minute per claimed sender, with the count of those not logged)."""
IGNORED_SENDERS_KEPT = 1024
"""Claimed senders whose last log line an LM remembers; reports claiming any further one share one line."""


class NotReady(TryLater):
    """The LM is still waiting for worker agents to register its nodes (a broker message that needs the cluster
    is requeued until it is complete)."""


class RegistrationError(ValueError):
    """A worker registration the LM cannot accept; the message names why."""


class LMService:
    def __init__(self, settings: LMSettings, broker: Broker | None = None) -> None:
        self.settings = settings
        self.broker = broker
        self.resource_names = DEFAULT_RESOURCE_NAMES
        # Node -> capacity, constraint mask and agent URL, filled as agents register (None: not yet).
        self._capacities: list[Resources | None] = [None] * settings.expected_nodes
        self._masks: list[int] = [0] * settings.expected_nodes
        self._drivers: list[tuple[str, ...]] = [BURN_ONLY] * settings.expected_nodes
        self._node_worker: list[str] = [""] * settings.expected_nodes
        # This LM's life: agents register again when it changes, and node versions start above the last one's.
        self.incarnation = time.time_ns() // 1_000_000
        self._adopting: list[Placement] = []  # tasks agents reported running, for the core once it is built
        self._rebuilt = False  # agents of an earlier incarnation of this LM registered: it comes back from a crash
        self._workers: dict[str, WorkerRegistered] = {}
        self.core: LocalMaster | None = None
        self.meter = LMMeter()  # what the core decides, from its observer events (GET /metrics, /v1/state)
        self.partitions_spec: tuple[PartitionSpec, ...] = ()
        self._lock = asyncio.Lock()
        self._calls = ServiceClient(settings.http_timeout, authorization=settings.credentials())
        self._tasks: set[asyncio.Task[None]] = set()
        self.failed_launches = 0
        self._heartbeats: dict[str, WorkerHeartbeat] = {}
        self._agent_nodes: dict[str, tuple[str, range]] = {}  # worker id -> (URL, its nodes)
        self.liveness = WorkerLiveness(settings.worker_timeout)  # decisions in the core; monotonic times
        self.terms = GMTerms(settings.num_gms)  # who holds each GM identity: older holders are fenced
        # Broker reports (docs/security.md, "Broker reports"): the secret each agent's signing key is derived from
        # (None with MEGHA_AUTH=off: nothing is checked), the keys of registered agents, and the reports ignored.
        self._report_secret = settings.report_secret() if settings.auth == "on" else None
        self._report_keys: dict[str, bytes] = {}
        self.ignored_reports = 0
        self._ignored_logged: dict[str, tuple[float, int]] = {}  # claimed sender -> (last logged, ignored since)

    # --------------------------------------------------------- registration

    @property
    def registered_nodes(self) -> int:
        return sum(c is not None for c in self._capacities)

    async def register(self, reg: WorkerRegistration) -> WorkerRegistered:
        """Give an agent its node numbers (those it claims, if it had them from an earlier incarnation of this LM,
        else the first free run); the cluster is complete, and the core built, once every expected node is."""
        known = self._workers.get(reg.worker_id)
        if known is not None:
            # The agent restarted (this LM did not): it keeps its nodes, and what this LM ran there is lost. It may
            # come back at another address (a new container or VM): calls go to the one it gives now.
            self.liveness.joined(reg.worker_id, time.monotonic())
            nodes = self._agent_nodes[reg.worker_id][1]
            self._agent_nodes[reg.worker_id] = (reg.url, nodes)
            for n in nodes:
                self._node_worker[n] = reg.url
            if nodes and tuple(reg.drivers) != self._drivers[nodes[0]]:
                log.warning(
                    "%s registered again offering drivers %s; its nodes keep %s until this LM restarts",
                    reg.worker_id,
                    reg.drivers,
                    list(self._drivers[nodes[0]]),
                    extra=ids(worker=reg.worker_id, lm=self.settings.lm_id),
                )
            await self._lose_missing(reg)
            return known
        if self.core is not None:
            raise RegistrationError(
                f"LM {self.settings.lm_id} is complete with {self.settings.expected_nodes} nodes; "
                f"{reg.worker_id} is not one of its agents"
            )
        try:
            caps = [n.resources(self.resource_names) for n in reg.nodes]
        except ValueError as exc:
            raise RegistrationError(str(exc)) from None
        first = self._place(reg.worker_id, len(caps), reg.first_node)
        self._rebuilt = self._rebuilt or reg.first_node is not None  # an agent of an earlier incarnation
        nodes = range(first, first + len(caps))
        for n, cap, node in zip(nodes, caps, reg.nodes):
            self._capacities[n] = cap
            self._masks[n] = constraint_mask(node.constraints)
            self._drivers[n] = tuple(reg.drivers)
            self._node_worker[n] = reg.url
        if self._report_secret is not None:
            self._report_keys[reg.worker_id] = report_key(self._report_secret, reg.worker_id)
        registered = WorkerRegistered(
            worker_id=reg.worker_id,
            lm=self.settings.lm_id,
            first_node=first,
            nodes=len(caps),
            incarnation=self.incarnation,
            report_key=self._report_keys[reg.worker_id].hex() if self._report_secret is not None else None,
        )
        self._workers[reg.worker_id] = registered
        self._agent_nodes[reg.worker_id] = (reg.url, nodes)
        self.liveness.joined(reg.worker_id, time.monotonic())
        self._adopting.extend(p.to_core() for p in reg.running if p.node in nodes and p.lm == self.settings.lm_id)
        log.info(
            "registered %s (nodes %d..%d%s, %d tasks running); %d/%d nodes",
            reg.worker_id,
            first,
            nodes.stop - 1,
            ", as claimed" if reg.first_node == first else "",
            len(reg.running),
            self.registered_nodes,
            self.settings.expected_nodes,
        )
        if self.registered_nodes == self.settings.expected_nodes:
            self._build_core()
        return registered

    def _place(self, worker_id: str, count: int, claim: int | None) -> int:
        """The first node of `count` free node numbers: the claimed ones when free, else the first free run."""
        free = self._capacities
        if claim is not None and claim + count <= len(free) and all(c is None for c in free[claim : claim + count]):
            return claim
        for first in range(len(free) - count + 1):
            if all(c is None for c in free[first : first + count]):
                if claim is not None:
                    log.warning(
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

    def _build_core(self) -> None:
        """Split the nodes, in node order, into one contiguous partition per GM; take as running what the agents
        reported running (an LM rebuilt after a crash), and tell every GM every node's state."""
        caps: list[Resources] = [c for c in self._capacities if c is not None]
        n, g, lm = len(caps), self.settings.num_gms, self.settings.lm_id
        bounds = [k * n // g for k in range(g + 1)]
        parts = tuple(
            PartitionSpec(
                lm,
                gm,
                tuple(caps[bounds[gm] : bounds[gm + 1]]),
                tuple(self._masks[bounds[gm] : bounds[gm + 1]]),
                tuple(self._drivers[bounds[gm] : bounds[gm + 1]]),
            )
            for gm in range(g)
        )
        self.partitions_spec = parts
        self.core = LocalMaster(
            lm,
            parts,
            self.resource_names,
            observer=self.meter,
            delta_interval=self.settings.delta_interval,
            fairness=self.settings.fairness(),
            incarnation=self.incarnation,
            ended_runs_kept=ENDED_KEPT,
        )
        self.core.adopt(self._adopting)
        log.info(
            "cluster complete (incarnation %d): %d nodes in %d partitions of sizes %s; %d running tasks adopted",
            self.incarnation,
            n,
            g,
            [bounds[k + 1] - bounds[k] for k in range(g)],
            len(self.core.running),
        )
        self._adopting = []
        self._dispatch(self.core.start(time.time()))
        if self.broker is not None and self._rebuilt:
            self._spawn(self._announce_rebuilt())

    async def _announce_rebuilt(self) -> None:
        """Tell every GM this LM was rebuilt, once the reports that waited for it had time to be applied; each GM
        then asks which of its runs this LM holds or saw end, and runs again those neither (an agent restarted
        without them, or went, during this LM's outage). A report that still arrives later for such a run is for
        an attempt its GM no longer knows, and is ignored."""
        await asyncio.sleep(HELD_SETTLE + self.settings.delta_interval)
        for gm in range(self.settings.num_gms):
            body = to_json({"lm_rebuilt": {"lm": self.settings.lm_id, "gm": gm, "incarnation": self.incarnation}})
            await self._publish(gm, body)

    async def _lose_missing(self, reg: WorkerRegistration) -> None:
        """An agent registered again without some tasks this LM placed on it (it restarted): those are lost."""
        if self.core is None:
            return
        _, nodes = self._agent_nodes[reg.worker_id]
        reported = {(p.task.task_id, p.task.attempt) for p in reg.running}
        missing = [p for p in self.core.tasks_on(nodes) if (p.task.task_id, p.task.attempt) not in reported]
        if missing:
            await self._lose_unlaunched(missing, f"worker agent {reg.worker_id} restarted", reg.worker_id)

    async def task_logs(self, node: int, task_id: str, query: str) -> Reply:
        """The answer of the agent holding `node` to `GET /v1/tasks/{task_id}/logs?{query}` (the output a task's
        run left there); KeyError when no agent registered `node`, CallError when the agent cannot be reached."""
        url = self._node_worker[node] if 0 <= node < len(self._node_worker) else ""
        if not url:
            raise KeyError(node)
        return await self._calls.get(f"{url}/v1/tasks/{quote(task_id, safe='')}/logs{'?' + query if query else ''}")

    def partitions(self) -> tuple[PartitionSpec, ...]:
        if self.core is None:
            raise NotReady(f"{self.registered_nodes}/{self.settings.expected_nodes} nodes registered")
        return self.partitions_spec

    # -------------------------------------------------------------- launches

    async def launch(self, batch: LaunchBatch, term: int = 0) -> LaunchResponse:
        """Validate and place a GM's batch; raises Superseded when `term` is older than the GM's current holder's
        (checked under the lock that claims take too, so no claim slips between the check and the placement).
        This runs for every task at thousands a second: a batch is logged at INFO only when the LM rejected some
        of it (rare), and its repartitions (common under load, and logged by the GM) at DEBUG."""
        core = self.core
        if core is None:
            raise NotReady(f"{self.registered_nodes}/{self.settings.expected_nodes} nodes registered")
        async with self._lock:
            self.terms.check(batch.gm, term)
            repartitions = self.meter.repartitions
            outputs = core.handle(batch, time.time())
            repartitions = self.meter.repartitions - repartitions
        response = next(o.msg for o in outputs if isinstance(o, Send) and isinstance(o.msg, LaunchResponse))
        if response.rejected or (repartitions and log.isEnabledFor(logging.DEBUG)):
            self._log_validation(response, repartitions)
        self._dispatch([o for o in outputs if o.msg is not response])
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
        if self.core is None:
            raise NotReady(f"{self.registered_nodes}/{self.settings.expected_nodes} nodes registered")
        async with self._lock:
            self.terms.check(req.gm, term)
            outputs = self.core.handle(req, time.time())
            stops = [o.msg for o in outputs if isinstance(o.msg, WorkerPreempt)]
            by_url: dict[str, list[str]] = {}
            for stop in stops:
                for task_id in stop.task_ids:
                    node = self.core.preempting[task_id].placement.node
                    by_url.setdefault(self._node_worker[node], []).append(task_id)
        response = next(o.msg for o in outputs if isinstance(o, Send) and isinstance(o.msg, PreemptResponse))
        t = req.task
        about = ids(job=t.job_id, task=t.task_id, attempt=t.attempt, gm=req.gm, lm=req.lm, user=t.user)
        if response.placement is not None:
            log.info(
                "GM %d: %s (user %s) on node %d after preempting %s",
                req.gm,
                t.task_id,
                t.user,
                response.placement.node,
                response.preempted,
                extra=about | {"node": response.placement.node},
            )
        else:
            log.info("GM %d: refused to preempt for %s: %s", req.gm, t.task_id, response.reason, extra=about)
        rest = [o for o in outputs if o.msg is not response and not isinstance(o.msg, WorkerPreempt)]
        if by_url:
            self._spawn(self._stop_then_dispatch(by_url, rest))
        else:
            self._dispatch(rest)
        return response

    async def stop(self, req: StopRequest, term: int = 0) -> list[str]:
        """Stop runs of a GM's cancelled jobs on their agents (each is reported to the GM as it ends); returns the
        runs stopped. Raises Superseded as `launch` does."""
        if self.core is None:
            raise NotReady(f"{self.registered_nodes}/{self.settings.expected_nodes} nodes registered")
        async with self._lock:
            self.terms.check(req.gm, term)
            outputs = self.core.handle(req, time.time())
            by_url: dict[str, list[str]] = {}
            stopped: list[str] = []
            for out in outputs:
                if isinstance(out.msg, WorkerPreempt):
                    for task_id in out.msg.task_ids:
                        node = self.core.preempting[task_id].placement.node
                        by_url.setdefault(self._node_worker[node], []).append(task_id)
                        stopped.append(task_id)
        if stopped:
            log.info(
                "GM %d: stopping %d runs of cancelled jobs: %s",
                req.gm,
                len(stopped),
                stopped[:20],
                extra=ids(task=stopped, gm=req.gm, lm=req.lm),
            )
        rest = [o for o in outputs if not isinstance(o.msg, WorkerPreempt)]
        self._spawn(self._stop_then_dispatch(by_url, rest))
        return stopped

    async def _stop_then_dispatch(self, by_url: dict[str, list[str]], outputs: list[Output]) -> None:
        """Stop the victims on their agents (each reports them preempted), then launch the waiting task: on a real
        node the victims' CPU and memory are free before the new task takes them."""
        lm = self.settings.lm_id

        async def stop(url: str, task_ids: list[str]) -> None:
            body = WorkerPreemptModel.core_json(WorkerPreempt(lm, task_ids))
            try:
                r = await self._calls.post(f"{url}/v1/preempt", body)
                if r.status != 200:
                    log.warning("agent %s answered %d to a preemption: %s", url, r.status, r.text[:300])
            except CallError as exc:
                log.warning("agent %s unreachable for a preemption of %s: %s", url, task_ids, exc)

        await asyncio.gather(*(stop(url, ids) for url, ids in by_url.items()))
        self._dispatch(outputs)

    async def on_broker_message(self, body: bytes, headers: Mapping[str, object] | None = None) -> None:
        """Apply a worker agent's heartbeat or report. With MEGHA_AUTH=on only what its agent signed counts: an
        unsigned or forged message, a heartbeat of another agent, and the items of a report about nodes its signer
        does not hold are ignored and logged (`_ignore`), never requeued."""
        sender = None
        if self._report_secret is not None:
            sender = self._signer(body, headers or {})
            if sender is None:
                return
        msg = BrokerMessage.model_validate_json(body)
        if msg.heartbeat is not None:
            beat = msg.heartbeat
            if sender is not None and beat.worker_id != sender:
                self._ignore(sender, f"it is a heartbeat of {beat.worker_id!r}")
                return
            self._heartbeats[beat.worker_id] = beat
            if beat.worker_id in self._agent_nodes:
                heard = self.liveness.heard(beat.worker_id, beat.running, time.monotonic())
                if heard is Heard.BRING_BACK:
                    await self._bring_back(beat.worker_id)
                elif heard is Heard.STOP_LOST:
                    # Alive after all (cut off, not dead): its tasks were reported lost, so they must not run on;
                    # its nodes come back once it runs nothing.
                    self._spawn(self._stop_lost(beat.worker_id))
        if msg.worker_report is not None:
            if self.core is None:
                raise NotReady("report before the cluster is complete")
            report: WorkerReportModel | None = msg.worker_report
            if sender is not None:
                report = self._of_own_nodes(sender, msg.worker_report)
            if report is not None:
                measured = {item.task_id: item for item in report.finished}
                await self._apply_report(report.to_core(), measured)

    def _key_of(self, worker_id: str) -> bytes:
        """The key agent `worker_id` signs its reports with (derived afresh for an agent not registered here)."""
        key = self._report_keys.get(worker_id)
        if key is None:
            assert self._report_secret is not None
            key = report_key(self._report_secret, worker_id)
        return key

    def _signer(self, body: bytes, headers: Mapping[str, object]) -> str | None:
        """The agent that signed this broker message for this LM; None (and the message ignored) when it is
        unsigned or its signature is not that agent's. An agent not (yet) registered here may sign too: its
        reports wait until the cluster is complete, and then count only for nodes it holds."""
        claimed = report_sender(headers)
        if claimed is None:
            self._ignore("", "it is not signed", body)
            return None
        if not report_signed_by(self._key_of(claimed), self.settings.lm_id, claimed, body, headers):
            self._ignore(claimed, "its signature is not that agent's for this LM", body)
            return None
        return claimed

    def _of_own_nodes(self, sender: str, report: WorkerReportModel) -> WorkerReportModel | None:
        """The items of `sender`'s report about nodes it registered (None if there is none); the others are
        ignored: an agent reports only the runs on its own nodes."""
        nodes = self._agent_nodes[sender][1] if sender in self._agent_nodes else range(0)
        foreign = [item for item in report.finished if item.node not in nodes]
        if not foreign:
            return report
        self._ignore(
            sender,
            f"it reports runs on nodes {sorted({item.node for item in foreign})[:20]}, which that agent does not "
            f"hold (tasks {[item.task_id for item in foreign[:20]]})",
        )
        own = [item for item in report.finished if item.node in nodes]
        return report.model_copy(update={"finished": own}) if own else None

    def _ignore(self, claimed: str, what: str, body: bytes = b"") -> None:
        """Count a broker message (or part of one) this LM ignores, and log it: at once for a sender not logged in
        the last IGNORED_LOG_EVERY seconds, else with the next line about it (a flood is not a flood of lines).
        `claimed` is the agent the message says it comes from ("" when it names none)."""
        self.ignored_reports += 1
        now = time.monotonic()
        sender = claimed if claimed in self._ignored_logged or len(self._ignored_logged) < IGNORED_SENDERS_KEPT else "*"
        last, unlogged = self._ignored_logged.get(sender, (-IGNORED_LOG_EVERY, 0))
        if now - last < IGNORED_LOG_EVERY:
            self._ignored_logged[sender] = (last, unlogged + 1)
            return
        self._ignored_logged[sender] = (now, 0)
        log.warning(
            "ignored a broker message from worker agent %s%s: %s%s",
            repr(claimed[:128]) if claimed else "(none named)",
            _what_it_names(body),
            what,
            f"; {unlogged} more ignored since the last such line" if unlogged else "",
            extra=ids(lm=self.settings.lm_id, worker=claimed[:128] or None),
        )

    async def _apply_report(self, report: WorkerReport, measured: dict[str, FinishedTaskModel]) -> None:
        """Apply a worker's report (or the LM's own, of lost tasks) and publish a task event for each run it
        ends: only runs the LM placed count, so a stale copy's report never reaches the event stream."""
        assert self.core is not None
        core = self.core
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
                    extra=_placement_ids(p) | ids(worker=self._worker_of(p.node)),
                )
        self._dispatch(outputs)
        await self._publish_events(outputs, placed, measured)

    def recovery_state(self, gm: int) -> dict[str, object]:
        """What GM `gm` needs when it (re)starts: every node's state, its runs here, and its runs that ended
        here recently (the `GMRecovery` body)."""
        if self.core is None:
            raise NotReady(f"{self.registered_nodes}/{self.settings.expected_nodes} nodes registered")
        report = lm_report(self.core, gm)  # runs being preempted count as held: their worker's report is to come
        return {
            "lm": self.settings.lm_id,
            "incarnation": self.incarnation,
            "delta": DeltaModel.plain(report.delta),
            "running": [PlacementModel.plain(p) for p in report.running],
            "ended": [{"task_id": t, "attempt": a, "error": e} for t, a, e in report.ended],
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

    async def _publish_events(
        self, outputs: list[Output], placed: dict[str, Placement], measured: dict[str, FinishedTaskModel]
    ) -> None:
        if self.broker is None:
            return
        now = time.time()
        events = []
        for out in outputs:
            if not isinstance(out.msg, Completions):
                continue
            for c in out.msg.items:
                p = placed.get(c.task_id)
                if p is None:  # a forwarded end of a run this LM did not place: its GM checks it and publishes it
                    continue
                m = measured.get(c.task_id)
                kind = "preempted" if c.preempted else "lost" if c.lost else "failed" if c.error else "finished"
                events.append(
                    {
                        "kind": kind,
                        "task_id": c.task_id,
                        "job_id": p.task.job_id,
                        "lm": p.lm,
                        "node": p.node,
                        "at": m.finished_at if m is not None and m.finished_at is not None else now,
                        "cpu_seconds": m.cpu_seconds if m is not None else 0.0,
                        "execution_delay": m.execution_delay if m is not None else 0.0,
                        "error": c.error,
                        "attempt": p.task.attempt,
                    }
                )
        if events:
            await self.broker.publish("events", "", to_json({"events": events}))

    def _dispatch(self, outputs: list[Output]) -> None:
        for out in outputs:
            if isinstance(out, Send):
                if isinstance(out.msg, WorkerLaunch):
                    self._send_to_workers(out.msg)
                elif isinstance(out.msg, Completions | Delta):
                    self._spawn(self._publish(out.msg.gm, BrokerMessage.core_json(out.msg)))
                else:
                    raise TypeError(f"LM cannot send {type(out.msg).__name__}")
            else:
                self._spawn(self._timer(out.at))

    async def _timer(self, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.time()))
        assert self.core is not None
        async with self._lock:
            outputs = self.core.handle(DeltaTick(), time.time())
        self._dispatch(outputs)

    async def _publish(self, gm: int, body: bytes) -> None:
        assert self.broker is not None, "the LM needs a broker to reach GMs"
        await self.broker.publish("gm", gm_key(gm), body)

    def _send_to_workers(self, launch: WorkerLaunch) -> None:
        """One POST per agent, concurrently, split into several when its body would pass the agent's body limit
        (a task's command may be 64K characters): each part is launched, or reported lost, on its own, so one
        user's big tasks never fail another's. An agent that cannot be reached gets its tasks reported failed,
        never lost."""
        by_url: dict[str, list[Placement]] = {}
        for p in launch.launches:
            by_url.setdefault(self._node_worker[p.node], []).append(p)
        for url, placements in by_url.items():
            parts = WorkerLaunchModel.core_json_parts(WorkerLaunch(launch.lm, placements))
            if len(parts) > 1:
                log.info(
                    "launch of %d tasks on %s sent in %d parts (%s bytes), each under the body limit",
                    len(placements),
                    url,
                    len(parts),
                    "+".join(str(len(body)) for _, body in parts),
                    extra=ids(lm=launch.lm, worker=self._worker_of(placements[0].node)),
                )
            for part, body in parts:
                self._spawn(self._post_to_worker(url, WorkerLaunch(launch.lm, part), body))

    async def _post_to_worker(self, url: str, launch: WorkerLaunch, body: bytes) -> None:
        """POST `launch` (whose JSON is `body`) to the agent at `url`, retried; its tasks are reported lost when
        the agent refuses it or stays unreachable."""
        placements = launch.launches
        reason = f"worker agent {url} unreachable"
        refused = False
        for attempt in range(3):
            try:
                r = await self._calls.post(f"{url}/v1/tasks", body)
            except CallError as exc:
                failure = str(exc)
            else:
                if 200 <= r.status < 300:
                    return
                failure = f"answered {r.status}: {r.text[:500]}"
                reason = f"worker agent {url} refused the launch: {failure}"
                refused = True
                if r.status == 422:  # nothing of it could ever run there: sending it again cannot help
                    break
            log.warning(
                "launch of %d tasks on %s failed (attempt %d of 3): %s; tasks %s",
                len(placements),
                url,
                attempt + 1,
                failure,
                [p.task.task_id for p in placements[:20]],
                extra=_batch_ids(placements) | ids(lm=launch.lm, worker=self._worker_of(placements[0].node)),
            )
            await asyncio.sleep(0.2 * (attempt + 1))
        await self._lose_unlaunched(placements, reason, self._worker_of(placements[0].node))
        if not refused:  # the agent may have started them after all (a call that timed out): they must not run on
            self._spawn(self._stop_on(url, [p.task.task_id for p in placements]))

    async def _lose_unlaunched(self, placements: list[Placement], reason: str, worker: str | None) -> None:
        """Free the resources of tasks no agent (`worker`) could take and report them lost: their GM places them
        again as their next attempt (never silently dropped)."""
        self.failed_launches += len(placements)
        log.error(
            "%d tasks could not be launched on worker agent %s (their GMs place them again): %s; tasks %s",
            len(placements),
            worker,
            reason,
            [p.task.task_id for p in placements[:20]],
            extra=_batch_ids(placements) | ids(lm=self.settings.lm_id, worker=worker),
        )
        report = WorkerReport(
            self.settings.lm_id,
            [FinishedTask(p.task.task_id, p.node, error=reason, attempt=p.task.attempt, lost=True) for p in placements],
        )
        await self._apply_report(report, {})

    # ------------------------------------------------------ worker failures

    async def watch_workers(self) -> None:
        """Check the agents' heartbeats every few seconds (runs until cancelled; a failed check is logged)."""
        every = min(self.settings.worker_timeout / 4, 5.0)
        await asyncio.sleep(every)
        await run_background("checking worker agents", self.check_workers, every)

    async def check_workers(self) -> None:
        """Take out of service the nodes of every agent silent for more than MEGHA_WORKER_TIMEOUT seconds whose
        health check fails too, and report their tasks failed (an agent that answers is kept: its heartbeats
        are only late)."""
        if self.core is None:
            return
        for worker_id, silent in self.liveness.suspects(time.monotonic()):
            url = self._agent_nodes[worker_id][0]
            try:
                alive = (await self._calls.get(f"{url}/healthz")).status == 200
            except CallError:
                alive = False
            if alive:
                log.warning("no heartbeat from %s for %.0f s, but it answers at %s: keeping it", worker_id, silent, url)
                self.liveness.answered(worker_id, time.monotonic())
                continue
            await self._take_down(worker_id, f"worker agent {worker_id} at {url} silent for {silent:.0f} s")

    async def _take_down(self, worker_id: str, reason: str) -> None:
        assert self.core is not None
        _, nodes = self._agent_nodes[worker_id]
        async with self._lock:
            lost = [p for p in self.core.tasks_on(nodes) if p.node not in self.core.down]
            outputs = self.core.take_down(list(nodes), reason, time.time())
        self.liveness.taken_down(worker_id, [p.task.task_id for p in lost])
        log.error(
            "%s: worker agent %s taken out of service with its nodes %d..%d; %d tasks lost (their GMs run them "
            "again): %s",
            reason,
            worker_id,
            nodes.start,
            nodes.stop - 1,
            len(lost),
            [p.task.task_id for p in lost[:20]],
            extra=_batch_ids(lost) | ids(lm=self.settings.lm_id, worker=worker_id, node=list(nodes)),
        )
        self._dispatch(outputs)
        await self._publish_events(outputs, {p.task.task_id: p for p in lost}, {})

    async def _stop_on(self, url: str, task_ids: list[str]) -> None:
        """Ask an agent to stop runs this LM reported lost (best effort: a stale run's result is ignored anyway,
        but it holds its node's resources at the agent until it ends)."""
        body = WorkerPreemptModel.core_json(WorkerPreempt(self.settings.lm_id, task_ids))
        try:
            r = await self._calls.post(f"{url}/v1/preempt", body, resend=False)
            if r.status != 200:
                log.warning("agent %s answered %d when asked to stop lost tasks: %s", url, r.status, r.text[:300])
        except CallError as exc:
            log.warning("agent %s unreachable to stop lost tasks: %s", url, exc)

    async def _stop_lost(self, worker_id: str) -> None:
        """Ask an agent that was found silent and is heard from again to stop the tasks reported failed then."""
        url = self._agent_nodes[worker_id][0]
        task_ids = self.liveness.lost.get(worker_id, [])
        log.warning(
            "worker agent %s is back with tasks running; stopping the %d it lost: %s",
            worker_id,
            len(task_ids),
            task_ids[:20],
            extra=ids(lm=self.settings.lm_id, worker=worker_id, task=task_ids),
        )
        await self._stop_on(url, task_ids)
        self.liveness.asked_to_stop(worker_id)  # the next heartbeat still showing tasks asks again

    async def _bring_back(self, worker_id: str) -> None:
        assert self.core is not None
        _, nodes = self._agent_nodes[worker_id]
        async with self._lock:
            outputs = self.core.bring_up(list(nodes), time.time())
        self.liveness.brought_back(worker_id)
        log.info(
            "worker agent %s is back with nothing running: its nodes %d..%d are in service",
            worker_id,
            nodes.start,
            nodes.stop - 1,
            extra=ids(lm=self.settings.lm_id, worker=worker_id, node=list(nodes)),
        )
        self._dispatch(outputs)

    def _worker_of(self, node: int) -> str | None:
        """The id of the agent that holds `node` (None if none registered it); for log lines, off the hot path."""
        for worker_id, (_, nodes) in self._agent_nodes.items():
            if node in nodes:
                return worker_id
        return None

    def _spawn(self, coro) -> None:  # type: ignore[no-untyped-def]
        spawn(self._tasks, coro)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self._calls.aclose()

    def state(self) -> dict[str, object]:
        core = self.core
        return {
            "lm": self.settings.lm_id,
            "ready": core is not None,
            "incarnation": self.incarnation,
            "registered_nodes": self.registered_nodes,
            "expected_nodes": self.settings.expected_nodes,
            "workers": len(self._workers),
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
            "usage": {u: list(v) for u, v in core.shares.snapshot().items()} if core and core.shares else {},
            "heartbeats": {
                w: {"age_seconds": round(time.time() - h.at, 3), "running": h.running}
                for w, h in self._heartbeats.items()
            },
            "down_nodes": {str(n): why for n, why in core.down.items()} if core else {},
            "ignored_reports": self.ignored_reports,  # unsigned or forged broker reports (docs/security.md)
            "lost_workers": {w: len(ids) for w, ids in self.liveness.lost.items()},
        }


def _what_it_names(body: bytes) -> str:
    """For a log line about an ignored broker message: the worker, nodes and tasks its body names, if it parses."""
    if not body:
        return ""
    try:
        msg = BrokerMessage.model_validate_json(body)
    except ValueError:
        return f" ({len(body)} bytes that are no broker message)"
    if msg.heartbeat is not None:
        return f" (a heartbeat of {msg.heartbeat.worker_id})"
    if msg.worker_report is not None:
        items = msg.worker_report.finished
        return f" (a report of tasks {[i.task_id for i in items[:20]]} on nodes {sorted({i.node for i in items})[:20]})"
    return " (a message that is no worker's)"


def _placement_ids(p: Placement) -> dict[str, object]:
    """The log ids of one run: its job, task, attempt, GM, LM and node."""
    t = p.task
    return ids(job=t.job_id, task=t.task_id, attempt=t.attempt, gm=p.gm, lm=p.lm, node=p.node, user=t.user)


def _batch_ids(placements: list[Placement]) -> dict[str, object]:
    """The log ids of several runs: lists of their jobs, tasks, GMs and nodes."""
    return ids(
        job=sorted({p.task.job_id for p in placements}),
        task=[p.task.task_id for p in placements],
        gm=sorted({p.gm for p in placements}),
        node=sorted({p.node for p in placements}),
    )
