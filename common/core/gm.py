"""The Global Master core: queueing, placing in its possibly stale view, batching per LM, rescheduling of tasks
that fit nowhere and preemption requests (Megha paper, section IV-B), over four collaborators:

* `GlobalView` (view upkeep): every partition's free resources as the LMs last reported them;
* `Placer`: LM order, feasibility and node choice for one task, and why a task could never be placed;
* `RunLedger`: the requests awaiting an LM's answer and the runs the GM holds;
* `GmPolicies`: queue order, preemption, usage accounting, unplaceable and unsatisfiable tasks (plain defaults;
  fair scheduling and the papers' variants as plug-ins); `Preemptor` sends the preemption policy's requests and
  applies the LMs' answers;
* `RetryBook` (common/core/retry.py): jobs' retry rules and the tasks waiting out a backoff after a failed run.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import NoReturn

from megha.common.core.cluster import ClusterSpec
from megha.common.core.dependencies import DependencyGate
from megha.common.core.fairness.config import FairnessConfig
from megha.common.core.fairness.queues import ShareBook
from megha.common.core.gang import GANG_REPLIES, GangScheduler
from megha.common.core.global_view import GlobalView
from megha.common.core.ledger import RunLedger
from megha.common.core.messages import (
    Completions,
    Delta,
    LaunchBatch,
    LaunchResponse,
    Output,
    Placement,
    PreemptResponse,
    Send,
    StopRequest,
    Wake,
    gm_address,
    lm_address,
)
from megha.common.core.observer import CoreObserver
from megha.common.core.parked import ParkedShapes, Shape, shape_of
from megha.common.core.placement.choice import ChoicePolicy
from megha.common.core.placement.filters import malformed
from megha.common.core.placement.placer import Placer
from megha.common.core.policies import LM_ORDERS, UNPLACEABLE, GmPolicies, gm_policies
from megha.common.core.policies.unsatisfiable import Unsatisfiable
from megha.common.core.preemptor import Preemptor
from megha.common.core.queueable import OpportunisticPlacer
from megha.common.core.recovery import lost_runs
from megha.common.core.retry import Retry, RetryBook, RetryDue
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.core.view import covers


class Unschedulable(ValueError):
    """A submitted task that no worker in the data centre could ever run; the message names the reason and `field`
    the offending field of the submission ("tasks.3.driver")."""

    def __init__(self, message: str, field: str = "tasks") -> None:
        super().__init__(message)
        self.field = field


class GlobalMaster:
    """GM `gm_id`'s decision logic. Feed it submissions and LM messages with the current time; it returns the
    messages to send (a LaunchBatch per LM, preemption and stop requests)."""

    def __init__(
        self,
        gm_id: int,
        cluster: ClusterSpec,
        choice: ChoicePolicy | None = None,
        seed: int = 0,
        observer: CoreObserver | None = None,
        fairness: FairnessConfig | None = None,
        max_attempts: int = 3,
        policies: GmPolicies | None = None,
    ) -> None:
        """Policies come from `policies`, else from `fairness` and `choice` (`gm_policies`): with fairness, the GM
        serves its users' queues in the share policy's order and, when a task fits nowhere and its user is below
        its share, asks an LM to preempt tasks of users above theirs. A task whose worker is lost runs again, up
        to `max_attempts` executions in all."""
        if not 0 <= gm_id < cluster.num_gms:
            raise ValueError(f"GM id {gm_id} outside 0..{cluster.num_gms - 1}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.gm_id = gm_id
        self.max_attempts = max_attempts
        self.resource_names = cluster.resource_names
        self.observer = observer or CoreObserver()
        self.policies = policies or gm_policies(gm_id, cluster, fairness, choice)
        self.view = GlobalView(cluster)
        self.views = self.view.views
        rng = random.Random(seed * 1_000_003 + gm_id)
        search = LM_ORDERS[self.policies.lm_order](gm_id, self.view.views)
        self.placer = Placer(gm_id, self.view, self.policies.choice, rng, search)
        # Queueable tasks that fit nowhere in the view wait at a node's queue instead (docs/queueable.md).
        self.opportunistic = OpportunisticPlacer(gm_id, self.view, self.policies.choice, rng)
        self.ledger = RunLedger(gm_id, cluster.num_lms)
        self.running = self.ledger.running
        self.queue = self.policies.queue_order.new_queue()
        # The share book, for reports (metrics, dashboard); None without fair scheduling. The core never reads it.
        self.book = self.policies.usage if isinstance(self.policies.usage, ShareBook) else None
        # Tasks that fit nowhere in the view, parked by shape (constraints, request, user when the queue order
        # serves users else "", driver) in the order shapes first failed; a shape is retried only when a node it
        # could use frees up in the view (or for a preemption when a delta arrives). Under `requeue-back` only
        # tasks whose preemption requests were all refused are parked.
        self.parked = self.policies.waiting_order.parked_shapes()
        self.waiting = self.parked.tasks
        self.unplaceable = UNPLACEABLE[self.policies.unplaceable](self.parked)
        # Tasks refused as inconsistent that wait for a freed node (`--inconsistent wait-for-free`; else None). A
        # freed node serves them and the parked tasks in the waiting order's order (`policies/waiting_order.py`).
        self.refused = self.policies.inconsistent.waiting
        self.preemptor = Preemptor(self)
        self.dependencies = DependencyGate()  # jobs waiting for their parents (`depends_on`) to finish
        # Gang jobs: placed as a unit, prepared and committed at LMs; LMs held for a gang that waited too long.
        self.gangs = GangScheduler(self, seed=seed, reserve_after=self.policies.gang_reserve_after)
        self._sends_to_flush: list[Output] = []  # stop and preemption requests, sent with the next launch batches
        self.cancelled = 0
        self.dropped = 0  # tasks failed at submission because no node could ever run them (`drop`)
        self.repartitions = 0
        self.inconsistencies = 0
        self.reschedules = 0
        self.preemption_attempts = 0
        self.preemptions = 0  # tasks stopped to make room for this GM's tasks
        self.preempted = 0  # this GM's tasks stopped for others
        self.retries = 0  # tasks run again because their worker was lost
        self.ignored_run_ends = 0  # reports of a run's end ignored: repeats, copies of an earlier run's end
        self._lost_at: dict[int, list[tuple[str, int]]] = {}  # runs given up with their LM (`lm_lost`), to stop
        # Jobs' retry rules and the tasks waiting out a backoff after a failed run (empty without rules).
        self.retry = RetryBook(random.Random(f"retry/{seed}/{gm_id}"))
        self.failures_retried = 0  # failed runs run again under their job's retry rule

    # ----------------------------------------------------------------- inputs

    def admit(self, job: JobSpec, now: float) -> Sequence[Unsatisfiable]:
        """Raise Unschedulable naming the first task of `job` whose user this GM does not serve, whose request is
        malformed, or (unless the unsatisfiable policy drops them) that no worker could ever run; else return the
        tasks to drop (none unless the policy drops them)."""
        dropped: list[Unsatisfiable] = []
        for i, task in enumerate(job.tasks):
            queue_reason = self.policies.queue_order.admission_reason(task)
            found = (queue_reason, "user") if queue_reason is not None else self.placer.unschedulable(task)
            if found is not None:
                why = Unsatisfiable(i, task, *found)
                if (
                    queue_reason is not None
                    or malformed(task, self.resource_names) is not None
                    or not self.policies.unsatisfiable.drops(why)
                ):
                    self._reject(job, why, now)
                dropped.append(why)
        return dropped

    def _reject(self, job: JobSpec, why: Unsatisfiable, now: float) -> NoReturn:
        self.observer.job_rejected(job, self.gm_id, why.reason, now)
        message = f"job {job.job_id}: task {why.task.task_id}: {why.reason}"
        raise Unschedulable(message, f"tasks.{why.index}.{why.field}" if why.field else f"tasks.{why.index}")

    def submit(self, job: JobSpec, now: float) -> list[Output]:
        """Accept a job into the queue, or raise Unschedulable naming the task no worker could ever run. Tasks the
        unsatisfiable policy drops fail at once, with their reasons, and the job arrives without them. A job with
        parents (`depends_on`) waits for them instead (`parent_ended`); one that would close a dependency cycle
        is refused (Unschedulable naming `depends_on`)."""
        if job.depends_on and (cycle := self.dependencies.cycle(job)) is not None:
            self.observer.job_rejected(job, self.gm_id, f"dependency cycle {' -> '.join(cycle)}", now)
            raise Unschedulable(f"job {job.job_id}: dependency cycle {' -> '.join(cycle)}", "depends_on")
        dropped = self.admit(job, now)
        if job.gang is not None:
            reason = self.gangs.too_big(job) if not dropped else dropped[0].reason
            if reason is not None:
                self.observer.job_rejected(job, self.gm_id, reason, now)
                raise Unschedulable(f"job {job.job_id}: {reason}", "tasks")
        elif dropped:
            gone = {u.index for u in dropped}
            job = replace(job, tasks=tuple(t for i, t in enumerate(job.tasks) if i not in gone))
            for u in dropped:
                self.dropped += 1
                self.observer.task_failed(u.task, f"dropped at submission: {u.reason}", now)
        self.observer.job_arrived(job, self.gm_id, now)
        if job.retry is not None:
            self.retry.admit(job)
        if job.depends_on:
            self.wait_for_parents(job, now)
            return []
        self._ready(job, now)
        return self._drain(now)

    def _ready(self, job: JobSpec, now: float) -> None:
        """An accepted job may run: a gang waits to be placed whole, other jobs' tasks join the queue."""
        if job.gang is not None:
            self.gangs.submit(job, now)
        else:
            self.queue.extend(job.tasks)

    def wait_for_parents(self, job: JobSpec, now: float) -> None:
        """Hold an accepted job (a recovering GM: one it held before) until its parents finished."""
        self.dependencies.hold(job)
        self.observer.job_waiting(job, now)

    def parent_ended(self, parent: str, outcome: str, now: float) -> list[Output]:
        """Job `parent` ended with `outcome` (`dependencies.OUTCOMES`): queue the waiting jobs whose last parent it
        was, and fail, without running, those it fails (every task, the reason naming the parent)."""
        released, failed = self.dependencies.parent_ended(parent, outcome)
        for job, reason in failed:
            for task in job.tasks:
                self.observer.task_failed(task, reason, now)
        for job in released:
            self.observer.job_released(job, now)
            self._ready(job, now)
        return self._drain(now) if released else []

    def recover(
        self,
        states: Iterable[Delta],
        running: Iterable[Placement],
        queued: Iterable[TaskSpec],
        now: float,
        gangs: Mapping[str, float] | None = None,
        replayed: Iterable[Completions] = (),
    ) -> list[Output]:
        """A GM restarted after a crash: adopt each LM's full state (`states`, one per LM, whose `applied_through`
        this GM's batch numbering continues from), take `running` (the runs the LMs hold for this GM) as running,
        queue `queued` (its accepted tasks that are neither running nor ended), apply the ends `replayed`
        (`Recovery.replayed`: runs of `running` that ended, of jobs with a retry rule), and schedule. The tasks of
        the jobs in `gangs` (job id -> `JobSpec.gang`) are held as gangs again (`GangScheduler.recover`). Observers hear
        of the queued tasks (`requeued_at_recovery`): a run one had was lost while this GM was down."""
        for delta in states:
            self.ledger.continue_from(delta.lm, delta.applied_through)
            self.apply_delta(delta)
        usage = self.policies.usage
        running = list(running)
        queued = list(queued)
        if queued:
            self.observer.requeued_at_recovery(queued, now)
        for p in running:
            self.running[p.task.task_id] = p
            usage.placed(p.task, p.lm)
            if p.task.queueable:
                self.opportunistic.placed(p)
        if gangs:
            for job_id, timeout in gangs.items():
                mine = [p for p in running if p.task.job_id == job_id]
                waiting = [t for t in queued if t.job_id == job_id]
                if mine or waiting:
                    self.gangs.recover(job_id, timeout, mine, waiting, now)
            queued = [t for t in queued if t.job_id not in gangs]
        self.queue.extend(queued)
        for msg in replayed:
            self._on_completions(msg, now)
        return self._drain(now)

    def handle(self, msg: object, now: float) -> list[Output]:
        """Apply an LM message (launch response, delta, completions) or this GM's own `RetryDue` timer (a retried
        task's backoff is over: it goes to the front of its queue), and schedule what can now be placed."""
        if isinstance(msg, LaunchResponse):
            self._on_response(msg, now)
        elif isinstance(msg, Completions):
            self._on_completions(msg, now)
        elif isinstance(msg, Delta):
            self.apply_delta(msg)
            if self.waiting:
                self.preemptor.retry(now)
        elif isinstance(msg, PreemptResponse):
            self.preemptor.answered(msg, now)
        elif isinstance(msg, RetryDue):
            task = self.retry.due(msg)
            if task is not None:
                self.queue.extendleft([task])
        elif isinstance(msg, GANG_REPLIES):
            self.gangs.handle(msg, now)
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
        dropped = self.queue.remove_if(drop) + self.parked.remove_if(drop)
        if self.refused is not None:
            dropped += self.refused.remove_if(drop)
        for task in dropped:
            self.policies.usage.withdrawn(task)
            self.cancelled += 1
            self.observer.task_cancelled(task, now)
        if self.dependencies:
            for job_id in self.dependencies.jobs_of(wanted):  # waiting jobs: never run
                for task in self.dependencies.remove(job_id).tasks:  # type: ignore[union-attr]
                    self.cancelled += 1
                    self.observer.task_cancelled(task, now)
        if self.retry.rules:
            for task in dropped:
                self.retry.ended(task)
            for task in self.retry.withdraw(wanted):  # waiting out a backoff: cancelled at once
                self.retry.ended(task)
                self.cancelled += 1
                self.observer.task_cancelled(task, now)
        for task in self.gangs.cancel(wanted, now) if self.gangs.members else ():
            self.cancelled += 1
            self.observer.task_cancelled(task, now)
        ledger = self.ledger
        stops: dict[int, list[tuple[str, int]]] = {}
        for task_id in wanted:
            if ledger.may_run(task_id):
                ledger.cancelling.add(task_id)
                placement = self.running.get(task_id)
                if placement is not None:
                    stops.setdefault(placement.lm, []).append((task_id, placement.task.attempt))
        for lm, runs in sorted(stops.items()):
            self._sends_to_flush.append(Send(lm_address(lm), StopRequest(self.gm_id, lm, runs)))
        return self._drain(now)

    def cancelled_run(self, task: TaskSpec, now: float) -> None:
        """A cancelled task's run ended (stopped, or refused by its LM): it is cancelled, not run again."""
        self.ledger.cancelling.discard(task.task_id)
        self.cancelled += 1
        if self.retry.rules:
            self.retry.ended(task)
        self.observer.task_cancelled(task, now)

    def stop_if_cancelled(self, placement: Placement) -> None:
        """A run just found running belongs to a cancelled task: stop it."""
        if placement.task.task_id in self.ledger.cancelling:
            lm, task = placement.lm, placement.task
            self.send_later(Send(lm_address(lm), StopRequest(self.gm_id, lm, [(task.task_id, task.attempt)])))

    def call_failed(self, lm: int, seq: int, reason: str, now: float, reached: bool = True) -> list[Output]:
        """The LaunchBatch or PreemptRequest `seq` to LM `lm` got no answer (the LM is unreachable or refused the
        call itself). A batch's tasks are lost runs: the LM may have launched them before it went, so each runs
        again as its next attempt (or fails with `reason` after MEGHA_MAX_ATTEMPTS), as a lost worker's runs do;
        their requests go back into the view (if the LM did launch them, its next report of the node says so, and
        the end of such a run is ignored). An LM that was only stalled does not apply a call its GM gave up on
        (the GM closed it). A preemption request counts as
        refused (observer `preemption_refused`, as the LM reports its own refusals): the task asks the next LM or
        waits. A gang's prepare or commit: see `GangScheduler.call_failed`.

        `reached` False: the call never reached the LM (every attempt failed to connect: its process is down, its
        host refuses). Nothing of a batch can then be running, so its tasks go back to the front of their queue as
        they were, to be placed again (elsewhere while the LM is out of the view: `lm_unreachable`)."""
        if self.gangs.owns(lm, seq):
            self.gangs.call_failed(lm, seq, reason, now)
            return self._drain(now)
        placements = self.ledger.batch_answered(lm, seq)
        if placements is not None:
            self.view.given_back(lm, seq, placements)
            again: list[TaskSpec] = []
            for p in placements:
                if not self.ledger.refused(lm, seq, p.task.task_id):
                    continue  # its completion came first: it ended already, and its resources were released
                self.policies.usage.released(p.task, lm)
                if p.task.queueable:
                    self.opportunistic.ended(p)
                if p.task.task_id in self.ledger.cancelling:
                    self.cancelled_run(p.task, now)
                elif not reached:
                    self.observer.rescheduled(p.task, now)
                    again.append(p.task)
                else:
                    self._lost(p.task, reason, now, again)
            self.queue.extendleft(reversed(again))
            return self._drain(now)
        entry = self.ledger.preempting[lm].get(seq)
        if entry is not None:
            # No LM saw the request, so none reports its refusal (an LM that refuses reports `preemption_refused`):
            # this GM does, or observers would see the task decided again (next LM, or once unparked) while placing.
            self.observer.preemption_refused(entry[0], reason, now)
            refusal = PreemptResponse(self.gm_id, lm, seq, entry[0], None, [], reason, [], Delta(lm, self.gm_id, 0))
            return self.handle(refusal, now)
        return []

    def lm_unreachable(self, lm: int) -> None:
        """LM `lm` does not answer: place nothing there until `lm_reachable` (its nodes show nothing free in the
        view). Its runs are this GM's still; `lm_lost` gives them up."""
        self.view.take_out(lm)

    def lm_reachable(self, lm: int, now: float) -> list[Output]:
        """LM `lm` answers again: its nodes are back in the view, and the runs declared lost there (`lm_lost`), which
        may have run on meanwhile, are stopped."""
        self.view.take_in(lm)
        runs = self._lost_at.pop(lm, None)
        if runs:
            self.send_later(Send(lm_address(lm), StopRequest(self.gm_id, lm, runs)))
        return self._drain(now)

    def lm_lost(self, lm: int, reason: str, now: float) -> list[Output]:
        """LM `lm` has not answered for so long that its runs are given up: each runs again as its next attempt
        (or fails after its last, MEGHA_MAX_ATTEMPTS), as a lost worker's do; if the LM comes back, they are
        stopped there (`lm_reachable`) and their ends ignored."""
        lost = lost_runs(self.running, lm, self.gm_id, reason)
        if lost is None:
            return []
        self._lost_at.setdefault(lm, []).extend((c.task_id, c.attempt) for c in lost.items)
        return self.handle(lost, now)

    def unschedulable_reason(self, task: TaskSpec) -> str | None:
        """Why no node of the data centre could ever run `task`, or None when some node could."""
        found = self.placer.unschedulable(task)
        return None if found is None else found[0]

    # ------------------------------------------------------------ scheduling

    def _drain(self, now: float) -> list[Output]:
        """Retry parked tasks that a freed node could take, then try every queued task once; batch the
        placements per LM; hand what fits nowhere (after asking the preemption policy) to the unplaceable policy."""
        view = self.view
        queue = self.queue
        waiting = self.waiting
        gangs = self.gangs
        refused = self.refused
        if view.has_unapplied_states and (queue or waiting or gangs.waiting or refused):
            view.sync()
        if gangs.reservation is not None:
            gangs.reservation.update(now)  # LMs held for a gang that waited too long, or released
        if gangs.waiting and (gangs.due or view.freed_nodes):
            gangs.place(now)  # gangs first: each placed whole or not at all, before single tasks take the room
        batches: dict[int, list[Placement]] = {}
        if view.freed_nodes:
            freed = view.take_freed()
            if waiting or refused:
                self.policies.waiting_order.retry(self, freed, now, batches)
        observer = self.observer
        by_user = self.policies.queue_order.shapes_by_user
        blocked = self.unplaceable.blocked
        while queue:
            task = queue.popleft()
            shape = None  # the task's shape, needed only while some shape is blocked or when it fails
            if blocked:
                # shape_of(task, by_user), inline: this runs for every task
                shape = (
                    task.constraints,
                    task.request,
                    task.user if by_user else "",
                    None if task.run is None else task.run.driver,
                    task.priority,
                )
                parked = blocked.get(shape)
                if parked is not None:
                    if task.queueable and self._queue_opportunistically(task, now, batches):
                        continue
                    # The view cannot place this shape (it failed and no node it could use has freed since); held
                    # behind the older tasks of the same shape (parked, or at the back of the queue).
                    parked.append(task)
                    self.reschedules += 1
                    observer.rescheduled(task, now)
                    continue
            observer.attempt(task, now)
            if not self._place(task, batches):
                if shape is None:
                    shape = shape_of(task, by_user)
                if task.queueable:
                    if self._queue_opportunistically(task, now, batches):
                        continue
                elif shape not in self.preemptor.shapes and self.preemptor.ask(task, now):
                    continue
                self.unplaceable.hold(shape, task)
                self.reschedules += 1
                observer.rescheduled(task, now)
        self.unplaceable.end_pass(queue)
        return self._flush(batches, now)

    def retry_waiting(
        self, freed: list[tuple[int, int]], now: float, batches: dict[int, list[Placement]], parked_shapes: ParkedShapes
    ) -> None:
        """For each node whose free resources grew, retry (in the queue order's service order) the shapes of
        `parked_shapes` it could run, until the node cannot take any of their requests any more. A retried task is
        matched over the whole view, or, when the unplaceable policy says so, placed on that node only."""
        waiting = parked_shapes.tasks
        service_order = self.policies.queue_order.service_order
        for lm, node in freed:
            view, i = self.view.locate[lm][node]
            if not parked_shapes.any_request_fits(view.free[i]):
                continue
            emptied = []
            for shape in service_order(parked_shapes.runnable_on(view.masks[i]), waiting):
                if not covers(view.free[i], shape[1]) or (
                    shape[3] is not None and not view.offering(shape[3]) >> i & 1
                ):
                    continue
                parked = waiting[shape]
                placed = False
                while parked and self.retry_head(parked, lm, node, now, batches):
                    placed = True
                if not parked:
                    emptied.append(shape)
                if placed and not parked_shapes.any_request_fits(view.free[i]):
                    break
            for shape in emptied:
                parked_shapes.unpark(shape)
            if not waiting:
                return

    def retry_head(
        self, waiting: deque[TaskSpec], lm: int, node: int, now: float, batches: dict[int, list[Placement]]
    ) -> bool:
        """Retry the first task of `waiting` for node `node` of LM `lm`, which freed up: matched over the whole view,
        or, when the unplaceable policy says so, placed on that node only. True (and the task taken out of `waiting`)
        when it was placed."""
        self.observer.attempt(waiting[0], now)
        if not self._place(waiting[0], batches, (lm, node) if self.unplaceable.freed_node_only else None):
            return False
        waiting.popleft()
        return True

    def _place(self, task: TaskSpec, batches: dict[int, list[Placement]], on: tuple[int, int] | None = None) -> bool:
        """Match `task` (on node `on`, an (LM, node) pair, only, if given); on success deduct it from the view and
        add it to its LM's batch."""
        placement = self.placer.match(task) if on is None else self.placer.match_on(task, *on)
        if placement is None:
            return False
        self.view.deduct(placement.lm, placement.node, task.request)
        self.policies.usage.placed(task, placement.lm)
        if task.queueable:
            self.opportunistic.placed(placement)
        batch = batches.get(placement.lm)
        if batch is None:
            batches[placement.lm] = [placement]
        else:
            batch.append(placement)
        return True

    def _queue_opportunistically(self, task: TaskSpec, now: float, batches: dict[int, list[Placement]]) -> bool:
        """Send queueable `task`, which fits nowhere in the view, to wait at a node's queue (not deducted from the
        view); False when every feasible node's queue is at its bound."""
        placement = self.opportunistic.place(task, now)
        reservation = self.gangs.reservation
        if placement is None or (reservation is not None and reservation.holds(task, placement.lm)):
            return False
        self.policies.usage.placed(task, placement.lm)
        self.opportunistic.placed(placement)
        batches.setdefault(placement.lm, []).append(placement)
        return True

    def _flush(self, batches: dict[int, list[Placement]], now: float) -> list[Output]:
        """One LaunchBatch per LM, remembered until its response arrives (after any preemption requests)."""
        outputs, self._sends_to_flush = self._sends_to_flush, []
        for lm, placements in batches.items():
            seq = self.ledger.batch_sent(lm, placements)
            self.view.sent(lm, seq, placements)
            self.observer.decided(placements, now)
            outputs.append(Send(lm_address(lm), LaunchBatch(self.gm_id, lm, seq, placements)))
        return outputs

    def waiting_tasks(self) -> list[TaskSpec]:
        """Parked tasks, shape by shape, the tasks refused as inconsistent that wait for a freed node, then the
        tasks of waiting gangs."""
        refused = [] if self.refused is None else [t for held in self.refused.tasks.values() for t in held]
        return [t for parked in self.waiting.values() for t in parked] + refused + self.gangs.waiting_tasks()

    # ---------------------------------------------------------- LM answers

    def _on_response(self, resp: LaunchResponse, now: float) -> None:
        placements = self.ledger.batch_answered(resp.lm, resp.seq)
        if placements is None:
            return  # a duplicate response; the first one was applied
        self.view.answered(resp.lm, resp.seq, placements)
        self.view.hold_states(resp.lm, resp.states, resp.delta.applied_through)
        self.apply_delta(resp.delta)
        ledger = self.ledger
        accepted, cancelling = ledger.accepted, ledger.cancelling
        for p in resp.accepted:
            if accepted(resp.seq, p) and cancelling:
                self.stop_if_cancelled(p)
            if p.repartition:
                self.repartitions += 1
        retry: list[TaskSpec] = []
        for rejection in resp.rejected:
            refused = rejection.placement.task
            if not ledger.refused(resp.lm, resp.seq, refused.task_id):
                # Its completion came first: that run ended (an LM that was killed after launching it, whose
                # successor refused the batch sent again), and its resources were released then.
                continue
            self.policies.usage.released(refused, resp.lm)
            if refused.queueable:
                self.opportunistic.ended(rejection.placement)
                if rejection.inconsistency:
                    self.opportunistic.refused(rejection.placement, now)
            if rejection.inconsistency:
                self.inconsistencies += 1
                self.observer.inconsistency(rejection.placement, now)
            if refused.task_id in ledger.cancelling:
                self.cancelled_run(refused, now)
            elif rejection.inconsistency:
                if self.refused is None or not self.policies.inconsistent.hold(self.shape(refused), refused):
                    retry.append(refused)
            else:
                self.retry.ended(refused)
                self.observer.task_failed(refused, f"LM {resp.lm}: {rejection.reason}", now)
        self.queue.extendleft(reversed(retry))

    def _on_completions(self, msg: Completions, now: float) -> None:
        """Node states are absolute and versioned, so applying them is always safe; a completion that overtakes
        its own launch response is remembered so the task is not then counted as running. An end applies only to
        the run it names (attempt and run number): a copy of an earlier run's end is ignored, as a repeat is. A
        preempted task goes back to the front of its user's queue as its next run, and so does a lost one as its
        next attempt (or it fails once `max_attempts` were made)."""
        usage = self.policies.usage
        observer = self.observer
        ledger = self.ledger
        cancelling = ledger.cancelling
        retry_rules = self.retry.rules
        requeue: list[TaskSpec] = []
        gang_members = self.gangs.members
        for item in msg.items:
            placement = ledger.run_ended(msg.lm, item.task_id, item.attempt, item.run_number)
            if placement is None:
                self.ignored_run_ends += 1
                if item.forwarded:
                    observer.forwarded_end_repeated(msg.lm, item, now)
                continue
            usage.released(placement.task, msg.lm)
            if placement.task.queueable:
                self.opportunistic.ended(placement)
            if gang_members and item.task_id in gang_members and self.gangs.run_ended(placement.task, item, now):
                continue  # a gang member stopped: its gang runs again as a whole
            if cancelling and item.task_id in cancelling and (item.preempted or item.lost):
                self.cancelled_run(placement.task, now)  # stopped as asked (or its worker was lost meanwhile)
            elif item.preempted:
                self.preempted += 1
                task = placement.task
                observer.task_preempted(task, now)
                requeue.append(replace(task, run_number=task.run_number + 1))  # the same attempt, its next run
            elif not item.lost:
                at = item.finished_at if item.forwarded and item.finished_at is not None else now
                error = item.error
                if cancelling and item.task_id in cancelling:
                    # It ended before the stop reached it: as it ended, and, cancelled, never run again.
                    cancelling.discard(item.task_id)
                    if retry_rules:
                        self.retry.ended(placement.task)
                elif retry_rules:
                    ends_with = self._retry_or_end(placement.task, item.error, item.exit_code, now)
                    if ends_with is None:
                        continue  # run again after its backoff
                    error = ends_with
                observer.task_completed(placement.task, error, at, item.forwarded)
            else:
                self._lost(placement.task, item.error, now, requeue)
        if requeue:
            self.queue.extendleft(reversed(requeue))
        self.view.hold_states(msg.lm, [item.state for item in msg.items], msg.applied_through)

    def _lost(self, task: TaskSpec, reason: str, now: float, requeue: list[TaskSpec]) -> None:
        """A run of `task` was lost (`reason`: its worker or its LM went, or its launch got no answer): it runs again
        as its next attempt (added to `requeue`), or fails once MEGHA_MAX_ATTEMPTS attempts were made. Runs retried
        for failures under the job's retry rule do not count against MEGHA_MAX_ATTEMPTS."""
        if task.attempt - self.retry.failures.get(task.task_id, 0) < self.max_attempts:
            self.retries += 1
            self.observer.task_lost(task, reason, now)
            requeue.append(replace(task, attempt=task.attempt + 1))
        else:
            if self.retry.rules:
                self.retry.ended(task)
            self.observer.task_failed(
                task, f"{reason} (attempt {task.attempt} of MEGHA_MAX_ATTEMPTS={self.max_attempts})", now
            )

    def _retry_or_end(self, task: TaskSpec, error: str, exit_code: int | None, now: float) -> str | None:
        """A run of `task` (of a job that may have a retry rule) ended with `error` ("" when it finished): None when
        the rule runs it again after its backoff (a `Wake` to this GM brings its `RetryDue`), else the error its
        end reports (saying why it was not retried, with its exit code and failure count)."""
        decision = self.retry.failed(task, error, exit_code, now) if error else ""
        if isinstance(decision, Retry):
            self.failures_retried += 1
            self.observer.task_retry_scheduled(task, decision.reason, decision.at, now)
            due = RetryDue(task.task_id, decision.task.attempt)
            self._sends_to_flush.append(Wake(decision.at, gm_address(self.gm_id), due))
            return None
        self.retry.ended(task)
        return decision or error

    def apply_delta(self, delta: Delta) -> None:
        self.view.hold_states(delta.lm, delta.nodes, delta.applied_through)
        if delta.usage is not None:
            self.policies.usage.report(delta.lm, delta.usage)
        if delta.priority_usage is not None:
            self.policies.class_reports.report(delta.lm, delta.priority_usage)

    def shape(self, task: TaskSpec) -> Shape:
        """The shape `task` is parked by."""
        return shape_of(task, self.policies.queue_order.shapes_by_user)

    def send_later(self, out: Output) -> None:
        """Send `out` (a stop or preemption request) with the next launch batches."""
        self._sends_to_flush.append(out)

    # ---------------------------------------------------------------- queries

    def view_snapshot(self) -> dict[str, object]:
        """The GM's current view, for debugging (GET /v1/state)."""
        self.view.sync()
        return {
            "gm": self.gm_id,
            "queued": len(self.queue),
            "waiting": len(self.waiting_tasks()),
            "running": len(self.running),
            "repartitions": self.repartitions,
            "inconsistencies": self.inconsistencies,
            "reschedules": self.reschedules,
            "preemption_attempts": self.preemption_attempts,
            "preemptions": self.preemptions,
            "preempted": self.preempted,
            "retries": self.retries,
            "failures_retried": self.failures_retried,
            "ignored_run_ends": self.ignored_run_ends,
            "cancelled": self.cancelled,
            "total_capacity": self.view.total_capacity(),
            "partitions": self.view.partition_usage(),
        }
