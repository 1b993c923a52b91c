"""The Global Master core: a possibly stale view of every partition, matching, repartition requests, batching
per LM, and rescheduling of tasks that fit nowhere (Megha paper, section IV-B)."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import replace
from operator import add, gt, sub

from megha.common.core.cluster import ClusterSpec
from megha.common.core.constraints import constraint_ids
from megha.common.core.fairness.config import FairnessConfig
from megha.common.core.fairness.policy import make_share_policy
from megha.common.core.fairness.queues import ShareBook, UserQueues
from megha.common.core.messages import (
    Completions,
    Delta,
    LaunchBatch,
    LaunchResponse,
    NodeState,
    Output,
    Placement,
    PreemptRequest,
    PreemptResponse,
    Send,
    StopRequest,
    Victim,
    lm_address,
)
from megha.common.core.observer import CoreObserver
from megha.common.core.parked import ParkedShapes, Shape, shape_of
from megha.common.core.placement.choice import ChoicePolicy, RandomChoice
from megha.common.core.placement.feasibility import driver_feasible_nodes, ever_feasible_nodes, feasible_nodes
from megha.common.core.placement.search import PartitionSearch
from megha.common.core.resources import Resources, describe
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.core.view import PartitionView, covers


class Unschedulable(ValueError):
    """A submitted task that no worker in the data centre could ever run; the message names the reason and `field`
    the offending field of the submission ("tasks.3.driver")."""

    def __init__(self, message: str, field: str = "tasks") -> None:
        super().__init__(message)
        self.field = field


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
        fairness: FairnessConfig | None = None,
        max_attempts: int = 3,
    ) -> None:
        """With `fairness`, the GM serves its users' queues in the share policy's order and, when a task fits
        nowhere and its user is below its share, asks an LM to preempt tasks of users above theirs. A task whose
        worker is lost runs again, up to `max_attempts` executions in all."""
        if not 0 <= gm_id < cluster.num_gms:
            raise ValueError(f"GM id {gm_id} outside 0..{cluster.num_gms - 1}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.gm_id = gm_id
        self.max_attempts = max_attempts
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
        # Burn tasks skip the driver filter while every node offers burn (always, in a simulation).
        self._burn_everywhere = all(v.offering("burn") == v.all_bits for row in self.views for v in row)
        self.book: ShareBook | None = None
        self.queue: deque[TaskSpec] | UserQueues = deque()
        if fairness is not None:
            fairness.check_gms(cluster.num_gms)
            policy = make_share_policy(fairness.policy)
            self.book = ShareBook(fairness, gm_id, cluster.num_lms, cluster.total_capacity(), policy)
            self.queue = UserQueues(self.book)
        # Tasks that fit nowhere in the view, parked by shape (constraints, request, user under fair scheduling,
        # else "", driver) in the order shapes first failed; a shape is retried only when a node it could use frees
        # up in the view (or, under fair scheduling, for a preemption when a delta arrives).
        self.parked = ParkedShapes()
        self.waiting = self.parked.tasks
        self._next_seq = [0] * cluster.num_lms
        # Launch batches sent and not answered yet, per LM: seq -> its placements.
        self._unanswered_batches: list[dict[int, list[Placement]]] = [{} for _ in range(cluster.num_lms)]
        # The requests those batches put on each node, per LM: node -> [(seq, request)] (read-your-writes).
        self._unanswered_requests: list[dict[int, list[tuple[int, Resources]]]] = [{} for _ in range(cluster.num_lms)]
        self.running: dict[str, Placement] = {}
        self._awaiting_response: set[str] = set()
        self._finished_early: set[str] = set()
        self._schedulable: dict[tuple[int, Resources, str], tuple[str, str] | None] = {}
        # (LM, node) whose free resources grew in the view since the last drain: parked tasks may fit there.
        self._freed_nodes: list[tuple[int, int]] = []
        # Newest LM-reported state per node not yet in the view: node -> (free, version, applied_through).
        self._unapplied_states: list[dict[int, tuple[Resources, int, int]]] = [{} for _ in range(cluster.num_lms)]
        self._has_unapplied_states = False
        # Preemption requests awaiting their answer, per LM: seq -> (task, LMs still to ask if this one refuses).
        self._preempting: list[dict[int, tuple[TaskSpec, list[int]]]] = [{} for _ in range(cluster.num_lms)]
        self._preempt_shapes: set[Shape] = set()
        self._sends_to_flush: list[Output] = []  # stop and preemption requests, sent with the next launch batches
        # Cancelled tasks whose run may still be out there (placed, running or being stopped): their end is
        # reported as cancelled, and they never run again.
        self._cancelling: set[str] = set()
        self.cancelled = 0
        self.repartitions = 0
        self.inconsistencies = 0
        self.reschedules = 0
        self.preemption_attempts = 0
        self.preemptions = 0  # tasks stopped to make room for this GM's tasks
        self.preempted = 0  # this GM's tasks stopped for others
        self.retries = 0  # tasks run again because their worker was lost

    # ----------------------------------------------------------------- inputs

    def admit(self, job: JobSpec, now: float) -> None:
        """Raise Unschedulable naming the first task of `job` no worker could ever run (or whose user this GM does
        not serve); return when the whole job can be queued."""
        for i, task in enumerate(job.tasks):
            queue_reason = self._queue_reason(task)
            found = (queue_reason, "user") if queue_reason is not None else self._unschedulable(task)
            if found is not None:
                reason, field = found
                self.observer.job_rejected(job, self.gm_id, reason, now)
                message = f"job {job.job_id}: task {task.task_id}: {reason}"
                raise Unschedulable(message, f"tasks.{i}.{field}" if field else f"tasks.{i}")

    def submit(self, job: JobSpec, now: float) -> list[Output]:
        """Accept a job into the queue, or raise Unschedulable naming the task no worker could ever run."""
        self.admit(job, now)
        self.observer.job_arrived(job, self.gm_id, now)
        self.queue.extend(job.tasks)
        return self._drain(now)

    def recover(
        self, states: Iterable[Delta], running: Iterable[Placement], queued: Iterable[TaskSpec], now: float
    ) -> list[Output]:
        """A GM restarted after a crash: adopt each LM's full state (`states`, one per LM, whose `applied_through`
        this GM's batch numbering continues from), take `running` (the runs the LMs hold for this GM) as running,
        queue `queued` (its accepted tasks that are neither running nor ended), and schedule."""
        for delta in states:
            self._next_seq[delta.lm] = max(self._next_seq[delta.lm], delta.applied_through)
            self._apply_delta(delta)
        for p in running:
            self.running[p.task.task_id] = p
            if self.book is not None:
                self.book.placed(p.task, p.lm)
        self.queue.extend(queued)
        return self._drain(now)

    def handle(self, msg: object, now: float) -> list[Output]:
        """Apply an LM message (launch response, delta, completions) and schedule what can now be placed."""
        if isinstance(msg, LaunchResponse):
            self._on_response(msg, now)
        elif isinstance(msg, Completions):
            self._on_completions(msg, now)
        elif isinstance(msg, Delta):
            self._apply_delta(msg)
            if self.book is not None and self.waiting:
                self._retry_preemptions(now)
        elif isinstance(msg, PreemptResponse):
            self._on_preempt_response(msg, now)
        else:
            raise TypeError(f"GM cannot handle {type(msg).__name__}")
        return self._drain(now)

    def cancel(self, task_ids: Collection[str], now: float) -> list[Output]:
        """Cancel these tasks of this GM (a job's): queued and parked ones are dropped now (observer
        `task_cancelled`); a running one is stopped at its LM (StopRequest) and reported cancelled when its LM
        reports the stop; one whose placement or preemption request awaits its answer is stopped once the answer
        says it runs. Tasks that already ended, or that this GM does not hold, are left alone."""
        wanted = set(task_ids)
        drop = lambda t: t.task_id in wanted  # noqa: E731
        dropped = self.queue.remove_if(drop) if isinstance(self.queue, UserQueues) else self._remove_queued(drop)
        dropped += self.parked.remove_if(drop)
        for task in dropped:
            if self.book is not None:
                self.book.withdrawn(task)
            self.cancelled += 1
            self.observer.task_cancelled(task, now)
        stops: dict[int, list[tuple[str, int]]] = {}
        for task_id in wanted:
            placement = self.running.get(task_id)
            if placement is not None:
                stops.setdefault(placement.lm, []).append((task_id, placement.task.attempt))
                self._cancelling.add(task_id)
            elif task_id in self._awaiting_response and task_id not in self._finished_early:
                self._cancelling.add(task_id)  # an early completion already ended it: nothing to cancel
        for lm, runs in sorted(stops.items()):
            self._sends_to_flush.append(Send(lm_address(lm), StopRequest(self.gm_id, lm, runs)))
        return self._drain(now)

    def _remove_queued(self, drop: Callable[[TaskSpec], bool]) -> list[TaskSpec]:
        queue = self.queue
        removed = [t for t in queue if drop(t)]
        if removed:
            self.queue = deque(t for t in queue if not drop(t))
        return removed

    def _cancelled_run(self, task: TaskSpec, now: float) -> None:
        """A cancelled task's run ended (stopped, or refused by its LM): it is cancelled, not run again."""
        self._cancelling.discard(task.task_id)
        self.cancelled += 1
        self.observer.task_cancelled(task, now)

    def call_failed(self, lm: int, seq: int, reason: str, now: float) -> list[Output]:
        """The LaunchBatch or PreemptRequest `seq` to LM `lm` got no answer (the LM is unreachable or refused the
        call itself). A batch's tasks are reported failed with `reason` (the LM may have launched them, so
        placing them elsewhere could run them twice) and forgotten, and their requests go back into the view
        (if the LM did launch them, its next report of the node says so). A preemption request counts as
        refused: the task asks the next LM or waits."""
        placements = self._unanswered_batches[lm].pop(seq, None)
        if placements is not None:
            unanswered = self._unanswered_requests[lm]
            self._sync_view()
            for p in placements:
                view, i = self._locate[lm][p.node]
                view.set_free(i, tuple(map(min, view.capacity[i], map(add, view.free[i], p.task.request))))
                self._freed_nodes.append((lm, p.node))
                entries = unanswered.get(p.node, [])
                if (seq, p.task.request) in entries:
                    entries.remove((seq, p.task.request))
                if not entries:
                    unanswered.pop(p.node, None)
                self._awaiting_response.discard(p.task.task_id)
                if p.task.task_id in self._finished_early:
                    self._finished_early.discard(p.task.task_id)
                    continue  # its completion came first: it ended already, and its resources were released
                if self.book is not None:
                    self.book.released(p.task, lm)
                if p.task.task_id in self._cancelling:
                    self._cancelled_run(p.task, now)
                else:
                    self.observer.task_failed(p.task, reason, now)
            return self._drain(now)
        if seq in self._preempting[lm]:
            task = self._preempting[lm][seq][0]
            refusal = PreemptResponse(self.gm_id, lm, seq, task, None, [], reason, [], Delta(lm, self.gm_id, 0))
            return self.handle(refusal, now)
        return []

    # ------------------------------------------------------------- admission

    def _queue_reason(self, task: TaskSpec) -> str | None:
        """Under fair scheduling, why this GM holds no queue for the task's user (None when it does)."""
        book = self.book
        if book is None or task.user in book.own:
            return None
        owner = next((q.gm for q in book.config.queues if q.user == task.user), None)
        if owner is None:
            return f"user {task.user!r} has no queue (configured users: {', '.join(sorted(book.shares))})"
        return f"user {task.user!r}'s queue is served by GM {owner}, not GM {self.gm_id}"

    def unschedulable_reason(self, task: TaskSpec) -> str | None:
        """Why no node of the data centre could ever run `task`, or None when some node could."""
        found = self._unschedulable(task)
        return None if found is None else found[0]

    def _unschedulable(self, task: TaskSpec) -> tuple[str, str] | None:
        """(why no node could ever run `task`, the task's field to blame: "driver", "constraints" or "" for the
        request), or None when some node could."""
        driver = task.driver
        key = (task.constraints, task.request, driver)
        if key in self._schedulable:
            return self._schedulable[key]
        found: tuple[str, str] | None
        views = [v for row in self.views for v in row]
        constrained = f"satisfying placement constraints {constraint_ids(task.constraints)} "
        if len(task.request) != len(self.resource_names):
            found = (f"request has {len(task.request)} amounts; expected {len(self.resource_names)}", "")
        elif any(v <= 0 for v in task.request):
            found = (f"request {describe(task.request, self.resource_names)} must be positive", "")
        elif any(ever_feasible_nodes(v, task) for v in views):
            found = None
        elif not any(v.offering(driver) for v in views):
            found = (f"no node offers driver {driver!r}", "driver")
        elif not any(v.matching(task.constraints) for v in views):
            found = (f"no node satisfies placement constraints {constraint_ids(task.constraints)}", "constraints")
        elif not any(v.matching(task.constraints) & v.could_ever_fit(task.request) for v in views):
            found = (f"no node {constrained}has capacity for {describe(task.request, self.resource_names)}", "")
        else:
            found = (
                f"no node {constrained}with capacity for {describe(task.request, self.resource_names)} offers "
                f"driver {driver!r}",
                "driver",
            )
        self._schedulable[key] = found
        return found

    # -------------------------------------------------------------- matching

    def _match(self, task: TaskSpec) -> Placement | None:
        """Internal partitions first (round-robin over LMs), then external ones (a repartition)."""
        feasible = feasible_nodes if task.run is None and self._burn_everywhere else driver_feasible_nodes
        for view in self._search.internal():
            candidates = feasible(view, task)
            if candidates:
                node = view.start + self.choice.choose(view, candidates, self.rng)
                return Placement(task, view.lm, node, False, self.gm_id)
        for view in self._search.external():
            candidates = feasible(view, task)
            if candidates:
                node = view.start + self.choice.choose(view, candidates, self.rng)
                return Placement(task, view.lm, node, True, self.gm_id)
        return None

    def _drain(self, now: float) -> list[Output]:
        """Retry parked tasks that a freed node could take, then try every queued task once; batch the
        placements per LM; park what fits nowhere."""
        if self._has_unapplied_states and (self.queue or self.waiting):
            self._sync_view()
        batches: dict[int, list[Placement]] = {}
        if self._freed_nodes:
            freed, self._freed_nodes = self._freed_nodes, []
            if self.waiting:
                self._retry_waiting(freed, now, batches)
        observer = self.observer
        waiting = self.waiting
        book = self.book
        while self.queue:
            task = self.queue.popleft()
            # shape_of(task, book is not None), inline: this runs for every task
            shape = (
                task.constraints,
                task.request,
                task.user if book is not None else "",
                None if task.run is None else task.run.driver,
            )
            parked = waiting.get(shape)
            if parked is not None:
                # The view cannot place this shape (it failed and no node it could use has freed since);
                # queue behind the older tasks of the same shape.
                parked.append(task)
                self.reschedules += 1
                observer.rescheduled(task, now)
                continue
            observer.attempt(task, now)
            if not self._place(task, batches):
                if book is not None and shape not in self._preempt_shapes and self._preempt(task, now):
                    continue
                self.parked.park(shape, task)
                self.reschedules += 1
                observer.rescheduled(task, now)
        return self._flush(batches, now)

    def _retry_waiting(self, freed: list[tuple[int, int]], now: float, batches: dict[int, list[Placement]]) -> None:
        """For each node whose free resources grew, retry (oldest shape first) the parked shapes it could run,
        until the node cannot take any parked request any more."""
        parked_shapes = self.parked
        waiting = self.waiting
        for lm, node in freed:
            view, i = self._locate[lm][node]
            if not parked_shapes.any_request_fits(view.free[i]):
                continue
            emptied = []
            for shape in self._in_service_order(parked_shapes.runnable_on(view.masks[i])):
                if not covers(view.free[i], shape[1]) or (
                    shape[3] is not None and not view.offering(shape[3]) >> i & 1
                ):
                    continue
                parked = waiting[shape]
                placed = False
                while parked:
                    self.observer.attempt(parked[0], now)
                    if not self._place(parked[0], batches):
                        break
                    parked.popleft()
                    placed = True
                if not parked:
                    emptied.append(shape)
                if placed and not parked_shapes.any_request_fits(view.free[i]):
                    break
            for shape in emptied:
                parked_shapes.unpark(shape)
            if not waiting:
                return

    def _in_service_order(self, shapes: Iterator[Shape]) -> Iterable[Shape]:
        """Parked shapes (given oldest first) in the order they are served: under fair scheduling grouped by user
        in the share policy's order (who gets a freed node under contention is the policy's decision)."""
        if self.book is None:
            return shapes
        order = self.book.order_users(self.queue.rotation())  # type: ignore[union-attr]
        rank = {user: k for k, user in enumerate(order)}
        return sorted(shapes, key=lambda shape: rank[shape[2]])

    def _place(self, task: TaskSpec, batches: dict[int, list[Placement]]) -> bool:
        """Match `task`; on success deduct it from the view and add it to its LM's batch."""
        placement = self._match(task)
        if placement is None:
            return False
        view, i = self._locate[placement.lm][placement.node]
        view.set_free(i, tuple(map(sub, view.free[i], task.request)))
        if self.book is not None:
            self.book.placed(task, placement.lm)
        batch = batches.get(placement.lm)
        if batch is None:
            batches[placement.lm] = [placement]
        else:
            batch.append(placement)
        return True

    def _flush(self, batches: dict[int, list[Placement]], now: float) -> list[Output]:
        """One LaunchBatch per LM, remembered until its response arrives (after any preemption requests)."""
        outputs, self._sends_to_flush = self._sends_to_flush, []
        for lm, placements in batches.items():
            seq = self._next_seq[lm] = self._next_seq[lm] + 1
            self._unanswered_batches[lm][seq] = placements
            unanswered = self._unanswered_requests[lm]
            for p in placements:
                unanswered.setdefault(p.node, []).append((seq, p.task.request))
                self._awaiting_response.add(p.task.task_id)
            self.observer.decided(placements, now)
            outputs.append(Send(lm_address(lm), LaunchBatch(self.gm_id, lm, seq, placements)))
        return outputs

    def waiting_tasks(self) -> list[TaskSpec]:
        """Parked tasks, shape by shape."""
        return [t for parked in self.waiting.values() for t in parked]

    # ------------------------------------------------------------ view upkeep

    def _on_response(self, resp: LaunchResponse, now: float) -> None:
        placements = self._unanswered_batches[resp.lm].pop(resp.seq, None)
        if placements is None:
            return  # a duplicate response; the first one was applied
        unanswered = self._unanswered_requests[resp.lm]
        for p in placements:
            entries = unanswered[p.node]
            entries.remove((resp.seq, p.task.request))
            if not entries:
                del unanswered[p.node]
        self._apply_states(resp.lm, resp.states, resp.delta.applied_through)
        self._apply_delta(resp.delta)
        awaiting = self._awaiting_response
        for p in placements:
            awaiting.discard(p.task.task_id)
        cancelling = self._cancelling
        for p in resp.accepted:
            if p.task.task_id in self._finished_early:
                self._finished_early.discard(p.task.task_id)
            else:
                self.running[p.task.task_id] = p
                if cancelling and p.task.task_id in cancelling:
                    self._sends_to_flush.append(
                        Send(lm_address(p.lm), StopRequest(self.gm_id, p.lm, [(p.task.task_id, p.task.attempt)]))
                    )
            if p.repartition:
                self.repartitions += 1
        retry: list[TaskSpec] = []
        for rejection in resp.rejected:
            if self.book is not None:
                self.book.released(rejection.placement.task, resp.lm)
            refused = rejection.placement.task
            if rejection.inconsistency:
                self.inconsistencies += 1
                self.observer.inconsistency(rejection.placement, now)
            if cancelling and refused.task_id in cancelling:
                self._cancelled_run(refused, now)
            elif rejection.inconsistency:
                retry.append(refused)
            else:
                self.observer.task_failed(refused, f"LM {resp.lm}: {rejection.reason}", now)
        self.queue.extendleft(reversed(retry))

    def _on_completions(self, msg: Completions, now: float) -> None:
        """Node states are absolute and versioned, so applying them is always safe; a completion that overtakes
        its own launch response is remembered so the task is not then counted as running. A preempted task
        goes back to the front of its user's queue, and so does a lost one as its next attempt (or it fails once
        `max_attempts` were made)."""
        book = self.book
        observer = self.observer
        running = self.running
        cancelling = self._cancelling
        requeue: list[TaskSpec] = []
        for item in msg.items:
            placement = running.get(item.task_id)
            if placement is not None:
                if placement.task.attempt != item.attempt:
                    continue  # a stale copy of an earlier attempt
                del running[item.task_id]
            elif item.task_id in self._awaiting_response:
                placement = self._find_unanswered(msg.lm, item.task_id)
                if placement is None or placement.task.attempt != item.attempt:
                    continue
                self._finished_early.add(item.task_id)
            else:
                continue  # a repeat: the task ended already
            if book is not None:
                book.released(placement.task, msg.lm)
            if cancelling and item.task_id in cancelling and (item.preempted or item.lost):
                self._cancelled_run(placement.task, now)  # stopped as asked (or its worker was lost meanwhile)
            elif item.preempted:
                self.preempted += 1
                observer.task_preempted(placement.task, now)
                requeue.append(placement.task)
            elif not item.lost:
                cancelling.discard(item.task_id)  # it ended before the stop reached it: as it ended
                observer.task_completed(placement.task, item.error, now, item.forwarded)
            else:
                task = placement.task
                if task.attempt < self.max_attempts:
                    self.retries += 1
                    observer.task_lost(task, item.error, now)
                    requeue.append(replace(task, attempt=task.attempt + 1))
                else:
                    reason = f"{item.error} (attempt {task.attempt} of MEGHA_MAX_ATTEMPTS={self.max_attempts})"
                    observer.task_failed(task, reason, now)
        if requeue:
            self.queue.extendleft(reversed(requeue))
        self._apply_states(msg.lm, [item.state for item in msg.items], msg.applied_through)

    def _find_unanswered(self, lm: int, task_id: str) -> Placement | None:
        """The placement of a task whose launch response has not arrived yet."""
        for placements in self._unanswered_batches[lm].values():
            for p in placements:
                if p.task.task_id == task_id:
                    return p
        for task, _ in self._preempting[lm].values():
            if task.task_id == task_id:
                return Placement(task, lm, -1, False, self.gm_id)
        return None

    # ------------------------------------------------------------ preemption

    def _preempt(self, task: TaskSpec, now: float, lms: list[int] | None = None) -> bool:
        """Algorithm 2: when `task` fits nowhere and its user is below its share, ask an LM holding tasks of the
        users most over their shares to preempt some and launch `task`. False when fairness allows none."""
        book = self.book
        assert book is not None
        if not book.below_share(task.user):
            return False
        victims = book.violators(task.user, task.request)
        if not victims:
            return False
        candidates = book.lms_holding(victims) if lms is None else lms
        if not candidates:
            return False
        lm, rest = candidates[0], candidates[1:]
        seq = self._next_seq[lm] = self._next_seq[lm] + 1
        self._preempting[lm][seq] = (task, rest)
        self._preempt_shapes.add(shape_of(task, fair=True))
        self._awaiting_response.add(task.task_id)
        book.placed(task, lm)  # counted against its user's share while the request is out
        self.preemption_attempts += 1
        self.observer.preemption_attempted(task, lm, now)
        self.observer.decided([Placement(task, lm, -1, False, self.gm_id)], now)
        victims_msg = [Victim(user, book.usage_elsewhere(user, lm)) for user in victims]
        self._sends_to_flush.append(
            Send(lm_address(lm), PreemptRequest(self.gm_id, lm, seq, task, victims_msg, book.total))
        )
        return True

    def _on_preempt_response(self, resp: PreemptResponse, now: float) -> None:
        entry = self._preempting[resp.lm].pop(resp.seq, None)
        if entry is None:
            return  # a duplicate response
        task, rest = entry
        shape = shape_of(task, fair=True)
        self._preempt_shapes.discard(shape)
        self._awaiting_response.discard(task.task_id)
        self._apply_states(resp.lm, resp.states, resp.delta.applied_through)
        self._apply_delta(resp.delta)
        book = self.book
        assert book is not None
        if resp.placement is not None:
            self.preemptions += len(resp.preempted)
            if resp.placement.repartition:
                self.repartitions += 1
            if task.task_id in self._finished_early:
                self._finished_early.discard(task.task_id)
            else:
                self.running[task.task_id] = resp.placement
                if task.task_id in self._cancelling:
                    lm = resp.placement.lm
                    self._sends_to_flush.append(
                        Send(lm_address(lm), StopRequest(self.gm_id, lm, [(task.task_id, task.attempt)]))
                    )
            parked = self.waiting.get(shape)
            if parked:  # the next task of this shape may preempt in turn
                head = parked.popleft()
                if not parked:
                    self.parked.unpark(shape)
                self.queue.push_front(head)  # type: ignore[union-attr]
            return
        book.released(task, resp.lm)
        if task.task_id in self._cancelling:
            self._cancelled_run(task, now)
            return
        book.pending(task)
        if rest and self._preempt(task, now, rest):
            return
        parked = self.waiting.get(shape)
        if parked is None:
            self.parked.park(shape, task)
        else:
            parked.appendleft(task)
        self.reschedules += 1
        self.observer.rescheduled(task, now)

    def _retry_preemptions(self, now: float) -> None:
        """On news from an LM, let the oldest parked task of each shape whose user is below its share try a
        preemption again (shares change as tasks start and end everywhere).

        Whether a user is below its share, and whether a (user, request) finds victims, change only when a
        preemption request goes out (its task then counts against its user); until then they are remembered,
        so hundreds of parked shapes cost a few share checks."""
        book = self.book
        assert book is not None
        below: dict[str, bool] = {}
        if not any(book.below_share(user) for user in book.shares):
            return
        no_victims: set[tuple[str, Resources]] = set()
        for shape, parked in list(self.waiting.items()):
            _, request, user, _ = shape
            if shape in self._preempt_shapes:
                continue
            is_below = below.get(user)
            if is_below is None:
                is_below = below[user] = book.below_share(user)
            if not is_below:
                continue
            task = parked[0]
            self.observer.attempt(task, now)
            if (user, request) in no_victims:
                continue
            if self._preempt(task, now):
                parked.popleft()
                if not parked:
                    self.parked.unpark(shape)
                below.clear()
                no_victims.clear()
            else:
                no_victims.add((user, request))

    def _apply_delta(self, delta: Delta) -> None:
        self._apply_states(delta.lm, delta.nodes, delta.applied_through)
        if delta.usage is not None and self.book is not None:
            self.book.report(delta.lm, delta.usage)

    def _apply_states(self, lm: int, states: list[NodeState], applied_through: int) -> None:
        """Keep the newest reported state of each node; they reach the view when it is next needed
        (`_sync_view`), so a node that changed many times in between costs one update."""
        known = self._known_version[lm]
        unapplied = self._unapplied_states[lm]
        held_get = unapplied.get
        for node, free, version in states:
            if version > known[node]:
                held = held_get(node)
                if held is None or version > held[1]:
                    unapplied[node] = (free, version, applied_through)
                    self._has_unapplied_states = True

    def _sync_view(self) -> None:
        """Adopt the held LM states, re-applying this GM's own placements on a node that the LM had not
        processed when it read the state (read-your-writes); note which nodes gained free resources."""
        self._has_unapplied_states = False
        freed = self._freed_nodes
        for lm, unapplied in enumerate(self._unapplied_states):
            if not unapplied:
                continue
            known = self._known_version[lm]
            locate = self._locate[lm]
            unanswered = self._unanswered_requests[lm]
            for node, (free, version, applied_through) in unapplied.items():
                known[node] = version
                if unanswered and node in unanswered:
                    for seq, request in unanswered[node]:
                        if seq > applied_through:
                            free = tuple(map(sub, free, request))
                view, i = locate[node]
                old = view.free[i]
                if free != old:
                    if any(map(gt, free, old)):
                        freed.append((lm, node))
                    view.set_free(i, free)
            unapplied.clear()

    # ---------------------------------------------------------------- queries

    def view_snapshot(self) -> dict[str, object]:
        """The GM's current view, for debugging (GET /v1/state)."""
        self._sync_view()
        return {
            "gm": self.gm_id,
            "queued": len(self.queue),
            "waiting": sum(len(parked) for parked in self.waiting.values()),
            "running": len(self.running),
            "repartitions": self.repartitions,
            "inconsistencies": self.inconsistencies,
            "reschedules": self.reschedules,
            "preemption_attempts": self.preemption_attempts,
            "preemptions": self.preemptions,
            "preempted": self.preempted,
            "retries": self.retries,
            "cancelled": self.cancelled,
            "total_capacity": [
                sum(c[k] for row in self.views for v in row for c in v.capacity)
                for k in range(len(self.resource_names))
            ],
            "partitions": [
                {"lm": v.lm, "gm": v.gm, "nodes": v.size, "used_fraction": round(v.used_fraction(), 4)}
                for row in self.views
                for v in row
            ],
        }
