"""The Local Master core: authoritative free resources of every node of one cluster, validation of every GM
placement (the plan applier), repartition into logical nodes, and per-GM delta updates."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from operator import add, ge, sub

from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.constraints import constraint_ids
from megha.common.core.ended_runs import EndedRuns
from megha.common.core.fairness.config import FairnessConfig
from megha.common.core.fairness.policy import make_share_policy
from megha.common.core.fairness.verify import LocalShares, NoLocalShares, VictimPlan
from megha.common.core.leases import GANG_MESSAGES, GangLeases
from megha.common.core.messages import (
    Completion,
    Completions,
    Delta,
    DeltaTick,
    EndedRun,
    FinishedTask,
    LaunchBatch,
    LaunchResponse,
    Output,
    Placement,
    PreemptRequest,
    PreemptResponse,
    Rejection,
    Send,
    StopRequest,
    Wake,
    WorkerLaunch,
    WorkerPreempt,
    WorkerReport,
    gm_address,
    lm_address,
    worker_address,
)
from megha.common.core.node_table import NodeTable
from megha.common.core.observer import CoreObserver
from megha.common.core.policies.answer_states import Always, AnswerStates
from megha.common.core.policies.priority_verify import ClassVictims, LocalClasses, NoLocalClasses
from megha.common.core.queueable import QUEUEABLE_PER_NODE, QueueAdmission
from megha.common.core.resources import DEFAULT_RESOURCE_NAMES, Resources, describe


def _same_run(alloc: Allocation, item: FinishedTask) -> bool:
    """True when a worker's report is about the run the LM placed (same node, attempt and run number), not a stale
    copy."""
    task = alloc.placement.task
    return alloc.placement.node == item.node and task.attempt == item.attempt and task.run_number == item.run_number


@dataclass(slots=True)
class LogicalNode:
    """Resources carved out of physical node `node` into GM `gm`'s partition by a repartition, for one task."""

    logical_id: int
    node: int
    gm: int
    resources: Resources
    task_id: str


@dataclass(slots=True)
class Allocation:
    """A running task: where it runs, which GM placed it, and its logical node when repartitioned."""

    placement: Placement
    gm: int
    logical_id: int | None


class LocalMaster:
    """LM `lm_id`'s decision logic. Feed it LaunchBatches, worker reports and DeltaTicks with the current time;
    it returns responses, worker launches, completions and deltas to send."""

    def __init__(
        self,
        lm_id: int,
        partitions: Sequence[PartitionSpec],
        resource_names: tuple[str, ...] = DEFAULT_RESOURCE_NAMES,
        observer: CoreObserver | None = None,
        delta_interval: float = 1.0,
        fairness: FairnessConfig | None = None,
        incarnation: int = 0,
        ended_runs_kept: int = 0,
        priority_classes: bool = False,
        queueable_per_node: int = QUEUEABLE_PER_NODE,
        answer_states: AnswerStates | None = None,
        delta_states: str = "latest",
        delta_offset: float = 0.0,
    ) -> None:
        """`partitions[g]` is this LM's partition for GM g (a row of a ClusterSpec). With `fairness`, the LM
        tracks usage per user, reports it in deltas and verifies preemption requests.

        `incarnation` numbers this LM's lives (the services use its start time in milliseconds): node versions
        start at `incarnation << 20`, above any version an earlier incarnation reached, so every GM takes the
        rebuilt LM's node states as newer than what it held; and a later incarnation reports every node to every
        GM in its first deltas (`start`).

        `ended_runs_kept` > 0 makes the LM remember that many runs after they ended, so that a launch a GM
        retries because it lost the answer, after the run already ended, is not run again, and so that a GM that
        restarts learns which of its runs ended (`ended_runs`); the services keep them, the simulator (which
        loses no answer and restarts no GM) keeps none.

        With `priority_classes` the LM tracks usage per task priority, reports it in deltas and, for a preemption
        request, first looks for victims of classes strictly below the waiting task's (`policies/priority_verify`).
        Queueable runs (docs/queueable.md) are held apart from the free resources (`queues`), at most
        `queueable_per_node` per node. `answer_states` says whether an answer to a launch batch carries node
        states (`policies/answer_states.py`; default: always); `delta_states` what a delta reports of a node that
        changed more than once since the last (`node_table.DELTA_STATES`; default: its latest state). Deltas go
        out at `delta_offset` + k x `delta_interval` (0 <= offset < interval; default 0: on the multiples of the
        interval)."""
        if [(p.lm, p.gm) for p in partitions] != [(lm_id, g) for g in range(len(partitions))] or not partitions:
            raise ValueError(f"LM {lm_id} needs its partitions for GMs 0..n-1, labelled with its id")
        if delta_interval <= 0:
            raise ValueError(f"delta_interval must be positive, got {delta_interval}")
        if not 0 <= delta_offset < delta_interval:
            raise ValueError(f"delta_offset must be at least 0 and less than delta_interval, got {delta_offset}")
        self.lm_id = lm_id
        self.num_gms = len(partitions)
        self.resource_names = resource_names
        self.observer = observer or CoreObserver()
        self.delta_interval = delta_interval
        self.delta_offset = delta_offset
        self.incarnation = incarnation
        self.nodes = NodeTable(partitions, incarnation, delta_states)
        # The node table's columns, read on every launch.
        nodes = self.nodes
        self.capacity, self.free, self.masks, self.drivers = nodes.capacity, nodes.free, nodes.masks, nodes.drivers
        self.owner, self.version, self.down = nodes.owner, nodes.version, nodes.down
        self.running: dict[str, Allocation] = {}
        self.logical_nodes: dict[int, LogicalNode] = {}
        self._next_logical = 0
        self._applied_through = [0] * self.num_gms
        self._tick_armed = False
        self.inconsistencies = 0
        self.repartitions = 0
        self.launched = 0
        # Usage per user and preemption verification under fair scheduling; without, a no-op that refuses.
        self.shares: LocalShares | NoLocalShares = (
            NoLocalShares(lm_id)
            if fairness is None
            else LocalShares(fairness, len(resource_names), make_share_policy(fairness.policy))
        )
        # Usage per priority and priority preemption victims with priority classes; without, a no-op.
        self.classes: LocalClasses | NoLocalClasses = (
            LocalClasses(len(resource_names)) if priority_classes else NoLocalClasses()
        )
        # Tasks preempted but not yet confirmed stopped by their worker: task id -> allocation.
        self.preempting: dict[str, Allocation] = {}
        self.preemptions = 0
        self.preemption_refusals = 0
        self.stopped = 0  # runs stopped at their GM's request (job cancelled)
        self.ended = EndedRuns(ended_runs_kept)  # the last `ended_runs_kept` runs that ended here
        self.gangs = GangLeases(self)  # gangs' all-or-nothing prepares and the leases of prepared ones
        self.queues = QueueAdmission(queueable_per_node)  # queueable runs per node, held beside the free resources
        self.answer_states = answer_states or Always()

    @classmethod
    def in_cluster(
        cls,
        cluster: ClusterSpec,
        lm_id: int,
        observer: CoreObserver | None = None,
        delta_interval: float = 1.0,
        fairness: FairnessConfig | None = None,
        priority_classes: bool = False,
    ) -> LocalMaster:
        """LM `lm_id` of `cluster`."""
        if not 0 <= lm_id < cluster.num_lms:
            raise ValueError(f"LM id {lm_id} outside 0..{cluster.num_lms - 1}")
        return cls(
            lm_id,
            cluster.partitions[lm_id],
            cluster.resource_names,
            observer,
            delta_interval,
            fairness,
            priority_classes=priority_classes,
        )

    def handle(self, msg: object, now: float) -> list[Output]:
        if isinstance(msg, LaunchBatch):
            return self._on_launch(msg, now)
        if isinstance(msg, WorkerReport):
            return self._on_report(msg, now)
        if isinstance(msg, DeltaTick):
            return self._on_tick(now)
        if isinstance(msg, PreemptRequest):
            return self._on_preempt(msg, now)
        if isinstance(msg, StopRequest):
            return self._on_stop(msg, now)
        if isinstance(msg, GANG_MESSAGES):
            return self.gangs.handle(msg, now)
        raise TypeError(f"LM cannot handle {type(msg).__name__}")

    def start(self, now: float) -> list[Output]:
        """A first incarnation has nothing to report yet (its first change arms the periodic delta timer); a
        later one reports every node to every GM, whose views still hold the crashed incarnation's states."""
        out: list[Output] = []
        if self.incarnation:
            self.nodes.report_everything()
            self._arm_tick(now, out)
        return out

    def adopt(self, placements: Iterable[Placement]) -> None:
        """Take as running the tasks an LM rebuilt after a crash learns from its workers (each `Placement` says
        which GM placed it), so that their resources are held and their completions go to that GM."""
        for p in placements:
            if 0 <= p.node < len(self.capacity) and 0 <= p.gm < self.num_gms and p.task.task_id not in self.running:
                self._allocate(p, p.gm, promote=False)  # a queueable run its agent holds stays one

    def _arm_tick(self, now: float, out: list[Output]) -> None:
        """Deltas go out at the next `delta_offset` + k x `delta_interval` after a change; while nothing changes
        the timer stays off (a simulation of a quiet data centre costs nothing)."""
        if not self._tick_armed and any(self.nodes.dirty):
            self._tick_armed = True
            interval, offset = self.delta_interval, self.delta_offset
            out.append(
                Wake(
                    (math.floor((now - offset) / interval) + 1) * interval + offset, lm_address(self.lm_id), DeltaTick()
                )
            )

    # --------------------------------------------------------------- launches

    def _on_launch(self, batch: LaunchBatch, now: float) -> list[Output]:
        if not 0 <= batch.gm < self.num_gms:
            raise ValueError(f"launch batch from unknown GM {batch.gm}")
        self.observer.lm_received(batch.placements, now)
        accepted: list[Placement] = []
        started: list[Placement] = []
        rejected: list[Rejection] = []
        touched: dict[int, None] = {}
        ended = self.ended if self.ended else None  # runs remembered after they ended (none by default)
        for p in batch.placements:
            touched[p.node] = None
            current = self.running.get(p.task.task_id)
            if current is not None and current.placement.node == p.node and current.gm == batch.gm:
                accepted.append(p)  # a repeated request: launch is idempotent per task
                continue
            if ended is not None and (p.task.task_id, p.task.attempt, p.task.run_number) in ended:
                accepted.append(p)  # a repeat of a run that already ended here (its answer was lost): not again
                continue
            rejection = self._validate(p, batch.gm, current)
            if rejection is None:
                accepted.append(p)
                started.append(self._allocate(p, batch.gm))
            else:
                rejected.append(rejection)
        self._applied_through[batch.gm] = max(self._applied_through[batch.gm], batch.seq)
        if rejected:
            self.observer.rejected(rejected, now)
        if self.answer_states.carries(bool(rejected)):
            states = self.nodes.states(n for n in touched if 0 <= n < len(self.free))
            delta = self._take_delta(batch.gm)
        else:
            states, delta = [], Delta(self.lm_id, batch.gm, self._applied_through[batch.gm])  # pending stays pending
        response = LaunchResponse(batch.gm, self.lm_id, batch.seq, accepted, rejected, states, delta)
        out: list[Output] = [Send(gm_address(batch.gm), response)]
        if started:
            self.launched += len(started)
            self.observer.launched(started, now)
            out.append(Send(worker_address(self.lm_id), WorkerLaunch(self.lm_id, started)))
        self._arm_tick(now, out)
        return out

    def _validate(self, p: Placement, gm: int, current: Allocation | None) -> Rejection | None:
        """None when the placement can run now; otherwise why not. Only a lack of free resources is an
        inconsistency (the GM's view was stale); anything else is a malformed request."""
        n = p.node
        if p.lm != self.lm_id or not 0 <= n < len(self.capacity):
            return Rejection(p, f"LM {self.lm_id} has no node {n}", inconsistency=False)
        if current is not None:
            return Rejection(
                p,
                f"task {p.task.task_id} is already running on node {current.placement.node}",
                inconsistency=False,
            )
        if p.task.constraints & ~self.masks[n]:
            missing = constraint_ids(p.task.constraints & ~self.masks[n])
            return Rejection(p, f"node {n} lacks placement constraints {missing}", inconsistency=False)
        if (p.task.run is not None or not self.nodes.burn_everywhere) and p.task.driver not in self.drivers[n]:
            return Rejection(p, f"node {n} does not offer driver {p.task.driver!r}", inconsistency=False)
        if p.repartition != (self.owner[n] != gm):
            return Rejection(
                p,
                f"node {n} is in GM {self.owner[n]}'s partition; repartition flag is wrong",
                inconsistency=False,
            )
        if n in self.down:
            self.inconsistencies += 1  # the GM's view predates the node going down: it places the task again
            return Rejection(p, f"node {n} is out of service: {self.down[n]}", inconsistency=True)
        free = self.free[n]
        if all(map(ge, free, p.task.request)) and (not p.task.queueable or self.queues.promotes(n)):
            return None
        if p.task.queueable:  # it may wait in the node's queue (docs/queueable.md)
            rejection = self.queues.admit(p, gm, self.capacity[n], self.resource_names)
            # Queue full: the GM's view keeps its deduction of the task (if it made one) until the node's next
            # version, which the end of a queueable run there brings (`_release`).
            self.inconsistencies += rejection is not None and rejection.inconsistency
            return rejection
        self.inconsistencies += 1
        return Rejection(
            p,
            f"node {n} has {describe(free, self.resource_names)} free; task needs "
            f"{describe(p.task.request, self.resource_names)}",
            inconsistency=True,
        )

    def _allocate(self, p: Placement, gm: int, promote: bool = True) -> Placement:
        """Hold the resources of accepted placement `p` and return it as its worker runs it."""
        n = p.node
        if p.task.queueable:
            if promote and self.queues.promotes(n) and all(map(ge, self.free[n], p.task.request)):
                # Promoted: it runs as a guaranteed task (see `QueueAdmission.promotes`).
                p = replace(p, task=replace(p.task, queueable=False))
            else:
                # Held beside the free resources; the new version makes the GM's view drop its deduction of it.
                self.queues.hold(n, gm)
                self.nodes.set_free(n, self.free[n], except_gm=gm)
                self.running[p.task.task_id] = Allocation(p, gm, None)
                return p
        self.nodes.set_free(n, tuple(map(sub, self.free[n], p.task.request)), except_gm=gm)
        logical_id = None
        if p.repartition:
            logical_id = self._next_logical
            self._next_logical += 1
            self.logical_nodes[logical_id] = LogicalNode(logical_id, n, gm, p.task.request, p.task.task_id)
            self.repartitions += 1
        self.running[p.task.task_id] = Allocation(p, gm, logical_id)
        self.shares.started(p.task, n)
        self.classes.started(p.task, n)
        return p

    # ------------------------------------------------------------ completions

    def _release(self, alloc: Allocation) -> None:
        """Return a task's resources to its node (and its logical node, if any)."""
        n = alloc.placement.node
        if alloc.placement.task.queueable:
            self.queues.release(n, alloc.gm)
            self.nodes.set_free(n, self.free[n], except_gm=alloc.gm)  # a new version: the node's queue moved
            return
        self.nodes.set_free(n, tuple(map(add, self.free[n], alloc.placement.task.request)), except_gm=alloc.gm)
        if alloc.logical_id is not None:
            del self.logical_nodes[alloc.logical_id]
        self.shares.ended(alloc.placement.task, n)
        self.classes.ended(alloc.placement.task, n)

    def _on_report(self, report: WorkerReport, now: float) -> list[Output]:
        by_gm: dict[int, list[Completion]] = {}
        running, preempting = self.running, self.preempting
        ended = self.ended if self.ended else None  # runs remembered after they ended (none by default)
        state_of = self.nodes.state_of
        for item in report.finished:
            alloc = running.get(item.task_id)
            if alloc is not None and _same_run(alloc, item):
                del running[item.task_id]
                self._release(alloc)
            else:
                # A task this LM preempted: its resources went to the preempting task already; the worker's
                # report says whether it was stopped (the GM queues it again) or had already finished.
                held = preempting.get(item.task_id)
                if held is not None and _same_run(held, item):
                    del preempting[item.task_id]
                    alloc = held
                elif alloc is None and held is None and 0 <= item.gm < self.num_gms and 0 <= item.node < len(self.free):
                    # A run this LM does not know: placed by an earlier incarnation and ended while it was down,
                    # or a repeat. Its GM, which knows the run, decides (a repeat or a stale copy is ignored).
                    n = item.node
                    state = self.nodes.state(n)
                    run = (item.task_id, item.attempt, item.run_number)
                    if ended is not None and not (item.preempted or item.lost) and run not in ended:
                        # Remembered too, so a GM that claims this LM before the forwarded end reaches it learns
                        # that the run ended (and does not launch it again).
                        end = EndedRun(item.task_id, item.attempt, n, item.error, item.exit_code, item.run_number)
                        ended.add(item.gm, end)
                    forwarded = Completion(
                        item.task_id,
                        state,
                        item.error,
                        item.preempted,
                        False,
                        item.attempt,
                        True,
                        item.finished_at,
                        item.exit_code,
                        item.started_at,
                        item.run_number,
                    )
                    by_gm.setdefault(item.gm, []).append(forwarded)
                    continue
                else:
                    continue  # a stale copy's report: each run frees its resources once
            n = alloc.placement.node
            if ended is not None and not (item.preempted or item.lost):
                ended.add(
                    alloc.gm, EndedRun(item.task_id, item.attempt, n, item.error, item.exit_code, item.run_number)
                )
            completion = Completion(
                item.task_id,
                state_of[n],
                item.error,
                item.preempted,
                item.lost,
                item.attempt,
                exit_code=item.exit_code,
                started_at=item.started_at,
                run_number=item.run_number,
            )
            by_gm.setdefault(alloc.gm, []).append(completion)
        out: list[Output] = [
            Send(gm_address(gm), Completions(self.lm_id, gm, self._applied_through[gm], items))
            for gm, items in by_gm.items()
        ]
        self._arm_tick(now, out)
        return out

    def ended_runs(self, gm: int) -> list[EndedRun]:
        """GM `gm`'s runs that ended here recently, oldest first."""
        return self.ended.of_gm(gm)

    # ------------------------------------------------------- node failures

    def take_down(self, nodes: Sequence[int], reason: str, now: float) -> list[Output]:
        """Nodes whose worker is gone: every task on them is reported lost with `reason` (to its GM, which runs it
        again as its next attempt), and they show no free resources to any GM until `bring_up`."""
        nodes = [n for n in dict.fromkeys(nodes) if 0 <= n < len(self.capacity) and n not in self.down]
        lost = self.tasks_on(nodes)
        report = [FinishedTask.of(p, error=reason, lost=True) for p in lost]
        out = self._on_report(WorkerReport(self.lm_id, report), now) if lost else []
        zero = (0,) * len(self.resource_names)
        for n in nodes:
            self.down[n] = reason
            self.nodes.set_free_for_all(n, zero)
        # The completions carry each node's state after it went down, so no GM places the lost tasks back on it.
        for o in out:
            if isinstance(o.msg, Completions):
                for c in o.msg.items:
                    n = c.state.node
                    c.state = self.nodes.state(n)
        self._arm_tick(now, out)
        return out

    def tasks_on(self, nodes: Iterable[int]) -> list[Placement]:
        """The placements of the tasks running (or being preempted) on `nodes`."""
        wanted = set(nodes)
        return [
            alloc.placement
            for table in (self.running, self.preempting)
            for alloc in table.values()
            if alloc.placement.node in wanted
        ]

    def bring_up(self, nodes: Sequence[int], now: float) -> list[Output]:
        """Nodes back in service, all free (nothing ran on them while they were down)."""
        out: list[Output] = []
        for n in nodes:
            if self.down.pop(n, None) is not None:
                self.nodes.set_free_for_all(n, self.capacity[n])
        self._arm_tick(now, out)
        return out

    # ------------------------------------------------------------ preemption

    def _on_preempt(self, req: PreemptRequest, now: float) -> list[Output]:
        """Find victims in this LM's exact state: tasks of classes strictly below the waiting task's (priority
        classes), else the GM's named users verified over their share (fair scheduling); when some work, stop them
        on a node that then fits the waiting task, and launch the task there."""
        if not 0 <= req.gm < self.num_gms:
            raise ValueError(f"preemption request from unknown GM {req.gm}")
        self._applied_through[req.gm] = max(self._applied_through[req.gm], req.seq)
        out: list[Output] = []
        plan: ClassVictims | VictimPlan | str
        if req.task.task_id in self.running or req.task.task_id in self.preempting:
            plan = f"task {req.task.task_id} is already running"
        else:
            plan = self.classes.plan(req.task, self.free, self.masks, self.drivers)
            if isinstance(plan, str):
                by_share = self.shares.plan(req.task, req.victims, self.free, self.masks, req.total, self.drivers)
                plan = by_share if not isinstance(by_share, str) or not plan else f"{plan}; {by_share}"
        if isinstance(plan, str):
            self.preemption_refusals += 1
            self.observer.preemption_refused(req.task, plan, now)
            resp = PreemptResponse(req.gm, self.lm_id, req.seq, req.task, None, [], plan, [], self._take_delta(req.gm))
            return [Send(gm_address(req.gm), resp)]
        n = plan.node
        for task_id in plan.task_ids:
            alloc = self.running.pop(task_id)
            self._release(alloc)
            self.preempting[task_id] = alloc
        self.preemptions += len(plan.task_ids)
        if plan.task_ids:
            self.observer.preempting(plan.task_ids, now)
        p = Placement(req.task, self.lm_id, n, self.owner[n] != req.gm, req.gm)
        self.observer.lm_received([p], now)
        p = self._allocate(p, req.gm)
        self.launched += 1
        self.observer.launched([p], now)
        state = self.nodes.state(n)
        out.append(
            Send(
                gm_address(req.gm),
                PreemptResponse(
                    req.gm, self.lm_id, req.seq, req.task, p, list(plan.task_ids), "", [state], self._take_delta(req.gm)
                ),
            )
        )
        if plan.task_ids:
            out.append(Send(worker_address(self.lm_id), WorkerPreempt(self.lm_id, list(plan.task_ids))))
        out.append(Send(worker_address(self.lm_id), WorkerLaunch(self.lm_id, [p])))
        self._arm_tick(now, out)
        return out

    def _on_stop(self, req: StopRequest, now: float) -> list[Output]:
        """Stop the GM's runs it names (their job was cancelled): each frees its resources now and is stopped on
        its worker, whose report goes back to the GM as preempted. Runs this LM does not hold for that GM (ended
        already, another attempt, another GM's) are left alone."""
        stopped: list[str] = []
        for task_id, attempt in req.runs:
            alloc = self.running.get(task_id)
            if alloc is None or alloc.gm != req.gm or alloc.placement.task.attempt != attempt:
                continue
            del self.running[task_id]
            self._release(alloc)
            self.preempting[task_id] = alloc
            stopped.append(task_id)
        self.stopped += len(stopped)
        if stopped:
            self.observer.stopping(stopped, now)
        out: list[Output] = [Send(worker_address(self.lm_id), WorkerPreempt(self.lm_id, stopped))] if stopped else []
        self._arm_tick(now, out)
        return out

    # ----------------------------------------------------------------- deltas

    def _take_delta(self, gm: int) -> Delta:
        """What changed for `gm` since its last delta; clears its pending changes."""
        return Delta(
            self.lm_id,
            gm,
            self._applied_through[gm],
            self.nodes.take_changes(gm),
            self.shares.snapshot(),
            self.classes.snapshot(),
        )

    def _on_tick(self, now: float) -> list[Output]:
        self._tick_armed = False
        return [Send(gm_address(gm), self._take_delta(gm)) for gm in range(self.num_gms) if self.nodes.dirty[gm]]

    def full_state(self, gm: int) -> Delta:
        """Every node's state, for a GM that (re)starts or asks for it (GET /v1/state)."""
        return Delta(
            self.lm_id,
            gm,
            self._applied_through[gm],
            self.nodes.all_states(),
            self.shares.snapshot(),
            self.classes.snapshot(),
        )

    def is_idle(self) -> bool:
        """True when nothing runs and every node's free resources equal its capacity."""
        return (
            not self.running
            and not self.preempting
            and not self.logical_nodes
            and not self.down
            and self.free == self.capacity
        )
