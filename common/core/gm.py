"""The Global Master core: a possibly stale view of every partition, matching, repartition requests, batching
per LM, and rescheduling of tasks that fit nowhere (Megha paper, section IV-B)."""

from __future__ import annotations

import random
from collections import deque

from megha.common.core.cluster import ClusterSpec
from megha.common.core.constraints import constraint_ids
from megha.common.core.messages import (
    Completions,
    Delta,
    LaunchBatch,
    LaunchResponse,
    NodeState,
    Output,
    Placement,
    Send,
    lm_address,
)
from megha.common.core.observer import CoreObserver
from megha.common.core.placement.choice import ChoicePolicy, RandomChoice
from megha.common.core.placement.feasibility import ever_feasible_nodes, feasible_nodes
from megha.common.core.placement.search import PartitionSearch
from megha.common.core.resources import Resources, describe
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.core.view import PartitionView


class Unschedulable(ValueError):
    """A submitted task that no worker in the data centre could ever run; the message names the reason."""


class GlobalMaster:
    """GM `gm_id`'s decision logic. Feed it submissions and LM messages with the current time; it returns the
    messages to send (LaunchBatch per LM)."""

    def __init__(
        self,
        gm_id: int,
        cluster: ClusterSpec,
        choice: ChoicePolicy | None = None,
        seed: int = 0,
        observer: CoreObserver | None = None,
    ) -> None:
        if not 0 <= gm_id < cluster.num_gms:
            raise ValueError(f"GM id {gm_id} outside 0..{cluster.num_gms - 1}")
        self.gm_id = gm_id
        self.resource_names = cluster.resource_names
        self.choice = choice or RandomChoice()
        self.observer = observer or CoreObserver()
        self.rng = random.Random(seed * 1_000_003 + gm_id)
        self.views: list[list[PartitionView]] = [
            [PartitionView(cluster.partitions[lm][g], cluster.partition_start(lm, g)) for g in range(cluster.num_gms)]
            for lm in range(cluster.num_lms)
        ]
        self._locate: list[list[tuple[PartitionView, int]]] = [
            [(view, i) for view in row for i in range(view.size)] for row in self.views
        ]
        self._known_version: list[list[int]] = [[0] * len(nodes) for nodes in self._locate]
        self._search = PartitionSearch(gm_id, self.views)
        self.queue: deque[TaskSpec] = deque()
        self.waiting: deque[TaskSpec] = deque()
        self._next_seq = [0] * cluster.num_lms
        self._outstanding: list[dict[int, list[Placement]]] = [{} for _ in range(cluster.num_lms)]
        self._inflight: list[dict[int, list[tuple[int, Resources]]]] = [{} for _ in range(cluster.num_lms)]
        self.running: dict[str, Placement] = {}
        self._schedulable: dict[tuple[int, Resources], str | None] = {}
        self._view_grew = False
        self.repartitions = 0
        self.inconsistencies = 0
        self.reschedules = 0

    # ----------------------------------------------------------------- inputs

    def submit(self, job: JobSpec, now: float) -> list[Output]:
        """Accept a job into the queue, or raise Unschedulable naming the task no worker could ever run."""
        for task in job.tasks:
            reason = self.unschedulable_reason(task)
            if reason is not None:
                self.observer.job_rejected(job, self.gm_id, reason, now)
                raise Unschedulable(f"job {job.job_id}: task {task.task_id}: {reason}")
        self.observer.job_arrived(job, self.gm_id, now)
        self.queue.extend(job.tasks)
        return self._drain(now)

    def handle(self, msg: object, now: float) -> list[Output]:
        """Apply an LM message (launch response, delta, completions) and schedule what can now be placed."""
        if isinstance(msg, LaunchResponse):
            self._on_response(msg, now)
        elif isinstance(msg, Completions):
            self._on_completions(msg)
        elif isinstance(msg, Delta):
            self._apply_delta(msg)
        else:
            raise TypeError(f"GM cannot handle {type(msg).__name__}")
        if self._view_grew:
            self._view_grew = False
            self.queue.extend(self.waiting)
            self.waiting.clear()
        return self._drain(now)

    # ------------------------------------------------------------- admission

    def unschedulable_reason(self, task: TaskSpec) -> str | None:
        """Why no node of the data centre could ever run `task`, or None when some node could."""
        key = (task.constraints, task.request)
        if key in self._schedulable:
            return self._schedulable[key]
        reason: str | None
        if len(task.request) != len(self.resource_names):
            reason = f"request has {len(task.request)} amounts; expected {len(self.resource_names)}"
        elif any(v <= 0 for v in task.request):
            reason = f"request {describe(task.request, self.resource_names)} must be positive"
        elif any(ever_feasible_nodes(v, task) for row in self.views for v in row):
            reason = None
        elif not any(v.matching(task.constraints) for row in self.views for v in row):
            reason = f"no node satisfies placement constraints {constraint_ids(task.constraints)}"
        else:
            reason = (
                f"no node satisfying placement constraints {constraint_ids(task.constraints)} has capacity "
                f"for {describe(task.request, self.resource_names)}"
            )
        self._schedulable[key] = reason
        return reason

    # -------------------------------------------------------------- matching

    def _match(self, task: TaskSpec) -> Placement | None:
        """Internal partitions first (round-robin over LMs), then external ones (a repartition)."""
        for view in self._search.internal():
            candidates = feasible_nodes(view, task)
            if candidates:
                return Placement(task, view.lm, view.start + self.choice.choose(view, candidates, self.rng), False)
        for view in self._search.external():
            candidates = feasible_nodes(view, task)
            if candidates:
                return Placement(task, view.lm, view.start + self.choice.choose(view, candidates, self.rng), True)
        return None

    def _drain(self, now: float) -> list[Output]:
        """Try every queued task once; batch the placements per LM; park what fits nowhere."""
        if not self.queue:
            return []
        batches: dict[int, list[Placement]] = {}
        failed: set[tuple[int, Resources]] = set()
        observer = self.observer
        while self.queue:
            task = self.queue.popleft()
            observer.attempt(task, now)
            shape = (task.constraints, task.request)
            placement = None if shape in failed else self._match(task)
            if placement is None:
                failed.add(shape)
                self.waiting.append(task)
                self.reschedules += 1
                observer.rescheduled(task, now)
                continue
            view, i = self._locate[placement.lm][placement.node]
            free = view.free[i]
            view.set_free(i, tuple(f - r for f, r in zip(free, task.request)))
            batch = batches.get(placement.lm)
            if batch is None:
                batches[placement.lm] = [placement]
            else:
                batch.append(placement)
        outputs: list[Output] = []
        for lm, placements in batches.items():
            seq = self._next_seq[lm] = self._next_seq[lm] + 1
            self._outstanding[lm][seq] = placements
            inflight = self._inflight[lm]
            for p in placements:
                inflight.setdefault(p.node, []).append((seq, p.task.request))
            observer.decided(placements, now)
            outputs.append(Send(lm_address(lm), LaunchBatch(self.gm_id, lm, seq, placements)))
        return outputs

    # ------------------------------------------------------------ view upkeep

    def _on_response(self, resp: LaunchResponse, now: float) -> None:
        placements = self._outstanding[resp.lm].pop(resp.seq, None)
        if placements is None:
            return  # a duplicate response; the first one was applied
        inflight = self._inflight[resp.lm]
        for p in placements:
            entries = inflight[p.node]
            entries.remove((resp.seq, p.task.request))
            if not entries:
                del inflight[p.node]
        self._apply_states(resp.lm, resp.states, resp.delta.applied_through)
        self._apply_delta(resp.delta)
        for p in resp.accepted:
            self.running[p.task.task_id] = p
            if p.repartition:
                self.repartitions += 1
        retry: list[TaskSpec] = []
        for rejection in resp.rejected:
            if not rejection.inconsistency:
                self.observer.task_failed(rejection.placement.task, f"LM {resp.lm}: {rejection.reason}", now)
                continue
            self.inconsistencies += 1
            self.observer.inconsistency(rejection.placement, now)
            retry.append(rejection.placement.task)
        self.queue.extendleft(reversed(retry))

    def _on_completions(self, msg: Completions) -> None:
        states = []
        for item in msg.items:
            if self.running.pop(item.task_id, None) is not None:  # each completion is applied exactly once
                states.append(item.state)
        self._apply_states(msg.lm, states, msg.applied_through)

    def _apply_delta(self, delta: Delta) -> None:
        self._apply_states(delta.lm, delta.nodes, delta.applied_through)

    def _apply_states(self, lm: int, states: list[NodeState], applied_through: int) -> None:
        """Adopt LM-reported node states unless a newer one was already seen; re-apply this GM's own later
        placements on a node that the LM had not processed when it read the state (read-your-writes)."""
        known = self._known_version[lm]
        locate = self._locate[lm]
        inflight = self._inflight[lm]
        grew = False
        for state in states:
            node = state.node
            if state.version <= known[node]:
                continue
            known[node] = state.version
            free = state.free
            if inflight:
                for seq, request in inflight.get(node, ()):
                    if seq > applied_through:
                        free = tuple(f - r for f, r in zip(free, request))
            view, i = locate[node]
            old = view.free[i]
            if free != old:
                if not grew:
                    for f, o in zip(free, old):
                        if f > o:
                            grew = True
                            break
                view.set_free(i, free)
        if grew:
            self._view_grew = True

    # ---------------------------------------------------------------- queries

    def view_snapshot(self) -> dict[str, object]:
        """The GM's current view, for debugging (GET /v1/state)."""
        return {
            "gm": self.gm_id,
            "queued": len(self.queue),
            "waiting": len(self.waiting),
            "running": len(self.running),
            "repartitions": self.repartitions,
            "inconsistencies": self.inconsistencies,
            "reschedules": self.reschedules,
            "partitions": [
                {"lm": v.lm, "gm": v.gm, "nodes": v.size, "used_fraction": round(v.used_fraction(), 4)}
                for row in self.views
                for v in row
            ],
        }
