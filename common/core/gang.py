"""The GM side of gang scheduling: a gang job placed as a unit in the GM's view, and its prepare/commit state
machine with the LMs (docs/gang.md). A gang's tasks never enter the GM's task queue; `GangScheduler` holds them."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from megha.common.core.messages import (
    Completion,
    GangAbort,
    GangCommit,
    GangCommitted,
    GangPrepare,
    GangPrepared,
    GangRetry,
    GangTimeout,
    Placement,
    Send,
    StopRequest,
    Wake,
    gm_address,
    lm_address,
)
from megha.common.core.placement.feasibility import driver_feasible_nodes
from megha.common.core.policies.reservation import GangReservation
from megha.common.core.retry import GangRetryDecision
from megha.common.core.task import JobSpec, TaskSpec

if TYPE_CHECKING:
    from megha.common.core.gm import GlobalMaster

GANG_REPLIES = (GangPrepared, GangCommitted, GangRetry, GangTimeout)
"""What `GangScheduler.handle` takes (the GM routes them here)."""

WAKE_SLACK_S = 0.25
"""A `GangRetry` wake this close to its gang's `not_before` ends the backoff: the services sleep on another clock
than the one they stamp `now` with, and may wake a few ms early (the gang would then wait for nothing)."""

# A gang's states (transitions in `GangScheduler`'s docstring).
WAITING = "waiting"
PREPARING = "preparing"
COMMITTING = "committing"
RUNNING = "running"
STOPPING = "stopping"


@dataclass(slots=True)
class Gang:
    """One gang job at its GM, with its current attempt at being placed."""

    job_id: str
    tasks: tuple[TaskSpec, ...]  # the current run's tasks (their attempts bumped each time the gang runs again)
    timeout: float  # how long it may wait to be placed, each time it waits (inf: for ever)
    state: str = WAITING
    wait: int = 0  # numbers the gang's waits, so a GangTimeout of an earlier wait is ignored
    deadline: float = math.inf  # when the current wait times out
    since: float = 0.0  # when the current wait began (a refused attempt does not restart it)
    not_before: float = 0.0  # after a refused attempt: not tried again before (jittered backoff)
    refusals: int = 0  # attempts refused in a row (the backoff grows with them)
    # The current attempt: its placements per LM, the LMs in ascending order, the prepare seq sent to each, the
    # LMs that prepared (one-phase: launched) and those whose commit was answered.
    parts: dict[int, list[Placement]] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)
    seqs: dict[int, int] = field(default_factory=dict)
    prepared: set[int] = field(default_factory=set)
    answered: set[int] = field(default_factory=set)
    started_at: float = 0.0  # when its first prepare went out
    live: set[str] = field(default_factory=set)  # tasks whose run may be out there (launched, not ended)
    why_stopped: str = ""  # STOPPING: why the gang runs again
    fail_reason: str = ""  # STOPPING: the gang fails instead of running again (a member lost too often)
    cancelled: bool = False
    reported: set[str] = field(default_factory=set)  # tasks whose end (cancelled) was reported already
    done: set[str] = field(default_factory=set)  # tasks that ran to their end (finished or failed): never run again
    # A gang with a retry rule (docs/retry.md) ends as a whole: a member that finished is held (not reported) until
    # every member of the attempt finished; a failed one stops the rest, and the gang runs again whole (`retry`) or
    # fails whole. `quiet`: the members stopped so are reported by the gang's end, not as preempted.
    held: dict[str, tuple[TaskSpec, Completion]] = field(default_factory=dict)
    retry: GangRetryDecision | None = None
    quiet: bool = False


class GangScheduler:
    """GM `gm`'s gangs. Each gang goes through

        WAITING --fits in the view--> PREPARING --all LMs prepared--> COMMITTING --all commits ok--> RUNNING
        (one LM: PREPARING --prepared and launched--> RUNNING)

    PREPARING sends one GangPrepare at a time, to the gang's LMs in ascending id order (the next only once the
    one before reserved its part), so two gangs competing for the same LMs meet at the lowest one, where the
    second is refused without holding anything elsewhere. A refusal aborts the LMs that prepared and sends the
    gang back to WAITING after a jittered exponential backoff. A member of a RUNNING (or COMMITTING) gang that
    is preempted or lost, or a commit an LM refuses, moves the gang to STOPPING: every other member is stopped,
    and once none runs the gang waits again, as a whole, as the next attempt of every task. In a gang with a retry
    rule, a member failing with a code the rule retries does the same, the gang waiting out the rule's backoff first
    and every member running again; a finished member's end is held until the whole attempt finished; a failure
    not retried fails every member (`_ruled_run_ended`)."""

    def __init__(
        self,
        gm: GlobalMaster,
        lease_s: float = 10.0,
        backoff_s: float = 0.05,
        max_backoff_s: float = 5.0,
        seed: int = 0,
        reserve_after: float | None = None,
    ) -> None:
        """`reserve_after`: seconds the oldest waiting gang waits before LMs are held for it (`GangReservation`;
        None: never)."""
        self.gm = gm
        self.lease_s = lease_s  # how long an LM holds a prepared part for its commit
        self.backoff_s = backoff_s  # first backoff after a refused attempt
        self.max_backoff_s = max_backoff_s
        self.rng = random.Random(seed * 7_919 + gm.gm_id)
        self.waiting: dict[str, Gang] = {}  # gangs waiting to be placed, oldest first
        self.members: dict[str, Gang] = {}  # task id -> its gang, while the gang is held here
        self.due = False  # a gang became ready to try (new, or its backoff ended): try it at the next drain
        self._by_seq: dict[tuple[int, int], Gang] = {}  # (LM, prepare seq) -> gang of the attempt in flight
        # LMs held for the gang that has waited longest, once it waited `reserve_after` (None: never held).
        self.reservation = None if reserve_after is None else GangReservation(gm, self.waiting, reserve_after)
        self.started = 0  # gangs whose every task was launched
        self.refused = 0  # attempts refused (a prepare or commit failed, or they took too long)

    # ----------------------------------------------------------------- inputs

    def too_big(self, job: JobSpec) -> str | None:
        """Why gang `job` could never run (its tasks together need more than the data centre has), or None."""
        total = self.gm.view.total_capacity()
        for k, cap in enumerate(total):
            need = sum(t.request[k] for t in job.tasks)
            if need > cap:
                return f"gang needs {need} {self.gm.resource_names[k]} in all; the data centre has {cap}"
        return None

    def submit(self, job: JobSpec, now: float) -> None:
        """Hold gang `job` (admitted by the GM) until it can be placed whole."""
        timeout = math.inf if job.gang is None else job.gang
        gang = Gang(job.job_id, job.tasks, timeout)
        for task in job.tasks:
            self.members[task.task_id] = gang
        self._wait(gang, now)

    def recover(
        self, job_id: str, timeout: float, running: Sequence[Placement], queued: Sequence[TaskSpec], now: float
    ) -> None:
        """After a GM restart: gang `job_id`'s unfinished tasks, those its LMs run (`running`, held in the GM's ledger
        already) and the others (`queued`). All running: the gang runs on, as a whole. None running: it waits. Some
        running and some not (the GM died between commits): what runs is stopped, and the gang waits again whole.
        In a gang with a retry rule, `running` also holds the members whose end the GM then replays
        (`Recovery.replayed`): a finished one is held again, as if the GM had not restarted."""
        tasks = (*(p.task for p in running), *queued)
        gang = Gang(job_id, tasks, timeout)
        for task in tasks:
            self.members[task.task_id] = gang
        if not running:
            self._wait(gang, now)
            return
        for p in running:
            gang.parts.setdefault(p.lm, []).append(p)
        gang.order = sorted(gang.parts)
        gang.answered = set(gang.parts)
        gang.live = {p.task.task_id for p in running}
        gang.state = RUNNING
        if queued:
            self._stop(gang, "its GM restarted before every part was launched", now)

    def handle(self, msg: object, now: float) -> None:
        if isinstance(msg, GangPrepared):
            self._on_prepared(msg, now)
        elif isinstance(msg, GangCommitted):
            self._on_committed(msg, now)
        elif isinstance(msg, GangRetry):
            gang = self.waiting.get(msg.gang)
            if gang is not None:
                self.due = True
                if gang.not_before - now < WAKE_SLACK_S:  # a service's timer may fire a hair before its time
                    gang.not_before = min(gang.not_before, now)
        elif isinstance(msg, GangTimeout):
            self._on_timeout(msg, now)
        else:
            raise TypeError(f"GM gangs cannot handle {type(msg).__name__}")

    def owns(self, lm: int, seq: int) -> bool:
        """Whether request `seq` to LM `lm` was a gang's prepare (or commit)."""
        return (lm, seq) in self._by_seq

    def call_failed(self, lm: int, seq: int, reason: str, now: float) -> None:
        """A gang's prepare or commit to LM `lm` got no answer. A two-phase prepare counts as refused (its lease,
        if the LM made one, expires); a one-phase prepare or a commit may have launched the part, so that part is
        stopped (if it runs) and the gang stops and runs again as a whole."""
        gang = self._by_seq.get((lm, seq))
        if gang is None:
            return
        if gang.state == PREPARING and len(gang.parts) > 1:
            self._send(lm, GangAbort(self.gm.gm_id, lm, seq, gang.job_id))
            self.gm.view.given_back(lm, seq, gang.parts[lm])
            gang.prepared.add(lm)  # aborted above with the others
            self._refused(gang, f"LM {lm}: {reason}", now)
            return
        if lm in gang.answered:
            return
        gang.answered.add(lm)
        placements = gang.parts[lm]
        self.gm.ledger.batch_answered(lm, seq)
        self.gm.view.given_back(lm, seq, placements)
        for p in placements:
            self.gm.policies.usage.released(p.task, lm)
            self.gm.observer.inconsistency(p, now)
        runs = [(p.task.task_id, p.task.attempt) for p in placements]
        self._send(lm, StopRequest(self.gm.gm_id, lm, runs))  # in case it launched them after all
        self._stop(gang, f"LM {lm}: {reason}", now)

    def cancel(self, task_ids: Collection[str], now: float) -> list[TaskSpec]:
        """Cancel the gangs these tasks belong to: a waiting gang is dropped (its tasks returned, to be reported
        cancelled); any other is marked, and the GM's own cancel path stops what runs."""
        dropped: list[TaskSpec] = []
        for gang in {id(g): g for t in task_ids if (g := self.members.get(t)) is not None}.values():
            gang.cancelled = True
            if gang.state == WAITING:  # (also while it waits out a retry rule's backoff)
                self._forget(gang)
                dropped.extend(gang.tasks)
                for task in gang.tasks:
                    self.gm.retry.ended(task)
        return dropped

    def run_ended(self, task: TaskSpec, item: Completion, now: float) -> bool:
        """A member's run ended (the GM's ledger matched it). True when the gang takes over reporting it: a
        preempted or lost member stops its gang, whose members that did not run to their end run again together,
        and every member stopped so is reported preempted; False lets the GM report it (finished, failed,
        cancelled). A member that ran to its end is never run again, even when the gang is stopping."""
        gang = self.members.get(task.task_id)
        if gang is None or gang.state == WAITING:
            return False  # (a stale run's report does not reach here: the ledger drops it)
        gang.live.discard(task.task_id)
        gm = self.gm
        ruled = bool(gm.retry.rules) and gang.job_id in gm.retry.rules
        ended_itself = not (item.preempted or item.lost)
        if task.task_id in gm.ledger.cancelling:
            if ruled and ended_itself:
                # It ended before the stop reached it: finished, it is held as usual (all finished: the gang
                # finished); else it ends cancelled with its gang, never retried.
                gm.ledger.cancelling.discard(task.task_id)
                if not item.error:
                    self._hold(gang, task, item, now)
                self._settle(gang, now)
                return True
            gang.reported.add(task.task_id)
            self._settle(gang, now)
            return False
        if ended_itself:
            if ruled:
                self._ruled_run_ended(gang, task, item, now)
                return True
            gang.done.add(task.task_id)
            self._settle(gang, now)
            return False  # finished or failed as any task does
        if item.lost:
            # Runs retried for failures under the job's retry rule do not count against MEGHA_MAX_ATTEMPTS.
            if task.attempt - gm.retry.failures.get(task.task_id, 0) >= gm.max_attempts:
                gang.fail_reason = f"{item.error} (attempt {task.attempt} of MEGHA_MAX_ATTEMPTS={gm.max_attempts})"
            else:
                gm.retries += 1
            if not gang.quiet:
                gm.observer.task_lost(task, item.error, now)
        elif not gang.quiet:
            gm.preempted += item.preempted
            gm.observer.task_preempted(task, now)
        if gang.state != STOPPING:
            self._stop(gang, f"task {task.task_id} {'lost' if item.lost else 'preempted'}", now)
        else:
            self._settle(gang, now)
        return True

    def _ruled_run_ended(self, gang: Gang, task: TaskSpec, item: Completion, now: float) -> None:
        """A member of a gang with a retry rule ended on its own. Finished: held until every member of the attempt
        finished, then all are reported finished. Failed with a code the rule retries (failures counted per gang):
        the rest are stopped and the gang runs again whole after the backoff, every member as its next attempt.
        Failed for good: it ends failed with its reason, and the rest are stopped and fail naming it. A member that
        ends while its gang is being stopped is stopped with it."""
        gm = self.gm
        if gang.state == STOPPING:
            if not gang.quiet:  # stopped for a preemption or a lost member: it runs again with the rest
                gm.observer.task_preempted(task, now)
            self._settle(gang, now)
            return
        if not item.error:
            self._hold(gang, task, item, now)
            self._settle(gang, now)
            return
        decision = gm.retry.gang_failed(gang.tasks, task, item.error, item.exit_code)
        gang.quiet = True
        if isinstance(decision, GangRetryDecision):
            gang.retry = decision
            self._stop(gang, f"task {task.task_id} failed: {decision.reason})", now)
            return
        gang.done.add(task.task_id)
        self._report_end(task, item, decision, now)
        gang.fail_reason = f"gang member {task.task_id} failed: {decision}"
        self._stop(gang, gang.fail_reason, now)

    def _hold(self, gang: Gang, task: TaskSpec, item: Completion, now: float) -> None:
        """Hold a finished member's end; once every member of the attempt finished, report them all finished."""
        gang.held[task.task_id] = (task, item)
        if len(gang.held) == len(gang.tasks):
            for held, run in gang.held.values():
                gang.done.add(held.task_id)
                self._report_end(held, run, "", now)
            gang.held = {}

    def _report_end(self, task: TaskSpec, item: Completion, error: str, now: float) -> None:
        """Report a gang member's run ended as it ended, finished (`error` "") or failed (as the GM does)."""
        gm = self.gm
        gm.retry.ended(task)
        at = item.finished_at if item.forwarded and item.finished_at is not None else now
        gm.observer.task_completed(task, error, at, item.forwarded)

    # ------------------------------------------------------------- placing

    def place(self, now: float) -> None:
        """Try each waiting gang (oldest first) whose backoff is over: placed whole in the view, its prepares go
        out; one that does not fit keeps waiting, and younger gangs may pass it."""
        self.due = False
        for gang in list(self.waiting.values()):
            if gang.not_before > now:
                continue
            parts = self._fit(gang.tasks)
            if parts is not None:
                del self.waiting[gang.job_id]
                for task in gang.tasks:
                    self.gm.observer.attempt(task, now)
                self._prepare(gang, parts, now)
        if self.reservation is not None:
            self.reservation.update(now)  # the gang placed: the rest of this pass may use its LMs

    def _fit(self, tasks: Sequence[TaskSpec]) -> dict[int, list[Placement]] | None:
        """Every task placed in the view (deducted), on one LM if any can take them all (its internal partition,
        then its external ones), else across LMs in the GM's LM order; None (nothing deducted) when they do not
        fit together. Across LMs is tried first: a gang that fits nowhere (the common case of a waiting gang
        retried) then costs one pass, not one per LM."""
        gm = self.gm
        view = gm.view
        num_lms = len(view.views)
        spanning = self._fit_with(tasks, gm.placer.match) if num_lms > 1 else None
        if num_lms > 1:
            if spanning is None:
                return None
            for p in spanning:
                self._undo(p, freed=False)
        reservation = self.reservation
        for k in range(num_lms):
            lm = (gm.gm_id + k) % num_lms
            if reservation is not None and reservation.holds(tasks[0], lm):
                continue
            placed = self._fit_with(tasks, lambda task, lm=lm: self._match_on(lm, task))  # type: ignore[misc]
            if placed is not None:
                return {lm: placed}
        if spanning is None:
            return None
        parts: dict[int, list[Placement]] = {}
        for p in spanning:  # the view is as it was when they fitted
            view.deduct(p.lm, p.node, p.task.request)
            parts.setdefault(p.lm, []).append(p)
        return parts

    def _fit_with(
        self, tasks: Iterable[TaskSpec], match: Callable[[TaskSpec], Placement | None]
    ) -> list[Placement] | None:
        view = self.gm.view
        placed: list[Placement] = []
        for task in tasks:
            p = match(task)
            if p is None:
                for q in placed:
                    self._undo(q, freed=False)  # as it was: nothing freed for parked tasks
                return None
            view.deduct(p.lm, p.node, task.request)
            placed.append(p)
        return placed

    def _match_on(self, lm: int, task: TaskSpec) -> Placement | None:
        """A node of LM `lm` for `task` in the view: this GM's partition first, then the others' (repartition)."""
        gm = self.gm
        row = gm.view.views[lm]
        own = row[gm.gm_id]
        choose = gm.placer.choice.choose
        for view in (own, *(v for v in row if v is not own)):
            candidates = driver_feasible_nodes(view, task)
            if candidates:
                node = view.start + choose(view, candidates, gm.placer.rng, task)
                return Placement(task, lm, node, view is not own, gm.gm_id)
        return None

    def _undo(self, p: Placement, freed: bool = True) -> None:
        """Give a deduction of the view back (a placement never sent); `freed`: parked tasks may use it now."""
        self.gm.view.undo(p.lm, p.node, p.task.request, freed)

    # ------------------------------------------------------ prepare/commit

    def _prepare(self, gang: Gang, parts: dict[int, list[Placement]], now: float) -> None:
        gm = self.gm
        gang.state = PREPARING
        gang.parts = parts
        gang.order = sorted(parts)
        gang.seqs, gang.prepared, gang.answered, gang.live = {}, set(), set(), set()
        gang.started_at = now
        placements = [p for lm in gang.order for p in parts[lm]]
        for p in placements:
            gm.policies.usage.placed(p.task, p.lm)
        gm.observer.decided(placements, now)
        self._send_prepare(gang, gang.order[0])

    def _send_prepare(self, gang: Gang, lm: int) -> None:
        gm = self.gm
        placements = gang.parts[lm]
        seq = gm.ledger.batch_sent(lm, placements)
        gm.view.sent(lm, seq, placements)
        gang.seqs[lm] = seq
        self._by_seq[(lm, seq)] = gang
        one_phase = len(gang.parts) == 1
        self._send(lm, GangPrepare(gm.gm_id, lm, seq, gang.job_id, placements, self.lease_s, one_phase))

    def _on_prepared(self, msg: GangPrepared, now: float) -> None:
        gm = self.gm
        gang = self._by_seq.get((msg.lm, msg.seq))
        # A one-phase gang may be STOPPING already: a task the LM launched ended (lost) before this answer came.
        fresh = gang is not None and gang.state in (PREPARING, STOPPING) and msg.lm not in gang.prepared
        if fresh:
            gm.view.answered(msg.lm, msg.seq, gang.parts[msg.lm])  # type: ignore[union-attr]
        gm.view.hold_states(msg.lm, msg.states, msg.delta.applied_through)
        gm.apply_delta(msg.delta)
        if not fresh:
            if msg.ok and gang is None:
                self._send(msg.lm, GangAbort(gm.gm_id, msg.lm, msg.seq, msg.gang))  # a late answer: let it go
            return
        assert gang is not None
        if gang.state == STOPPING:  # one phase: what launched is stopped now, and the gang settles
            gang.prepared.add(msg.lm)
            self._launched(gang, msg.lm, now)
            return
        if not msg.ok:
            gm.inconsistencies += 1
            self._refused(gang, f"LM {msg.lm}: {msg.reason}", now, refused_by=msg.lm)
            return
        gang.prepared.add(msg.lm)
        if len(gang.parts) == 1:
            gang.state = COMMITTING
            self._launched(gang, msg.lm, now)
            return
        cancelling = gm.ledger.cancelling
        if cancelling and any(t.task_id in cancelling for t in gang.tasks):
            self._refused(gang, "cancelled", now)
            return
        following = [lm for lm in gang.order if lm not in gang.prepared]
        if following:
            self._send_prepare(gang, following[0])
        elif now - gang.started_at > self.lease_s / 2:
            self._refused(gang, f"its prepares took {now - gang.started_at:.3f} s, over half the lease", now)
        else:
            gang.state = COMMITTING
            for lm in gang.order:
                self._send(lm, GangCommit(gm.gm_id, lm, gang.seqs[lm], gang.job_id))

    def _on_committed(self, msg: GangCommitted, now: float) -> None:
        gm = self.gm
        gm.view.hold_states(msg.lm, msg.states, msg.delta.applied_through)
        gm.apply_delta(msg.delta)
        gang = self._by_seq.get((msg.lm, msg.seq))
        if gang is None or gang.state not in (COMMITTING, STOPPING) or msg.lm in gang.answered:
            return
        if msg.ok:
            self._launched(gang, msg.lm, now)
            return
        gang.answered.add(msg.lm)
        gm.ledger.batch_answered(msg.lm, msg.seq)
        for p in gang.parts[msg.lm]:
            gm.policies.usage.released(p.task, msg.lm)
            gm.observer.inconsistency(p, now)
        self._stop(gang, f"LM {msg.lm} refused the commit: {msg.reason}", now)

    def _launched(self, gang: Gang, lm: int, now: float) -> None:
        """LM `lm` launched its part of the gang: its tasks run (and are stopped at once when the gang is being
        stopped or was cancelled)."""
        gm = self.gm
        ledger = gm.ledger
        gang.answered.add(lm)
        ledger.batch_answered(lm, gang.seqs[lm])
        runs: list[tuple[str, int]] = []
        for p in gang.parts[lm]:
            if p.repartition:
                gm.repartitions += 1
            if not ledger.accepted(gang.seqs[lm], p):
                continue  # its run ended already
            gang.live.add(p.task.task_id)
            if p.task.task_id in ledger.cancelling:
                gm.stop_if_cancelled(p)
            elif gang.state == STOPPING:
                runs.append((p.task.task_id, p.task.attempt))
        if runs:
            self._send(lm, StopRequest(gm.gm_id, lm, runs))
        if gang.state == COMMITTING and len(gang.answered) == len(gang.parts):
            gang.state = RUNNING
            gang.refusals = 0
            self.started += 1
            gm.observer.gang_started(gang.job_id, gm.gm_id, now)
            self._settle(gang, now)
        elif gang.state == STOPPING:
            self._settle(gang, now)

    def _refused(self, gang: Gang, reason: str, now: float, refused_by: int | None = None) -> None:
        """The attempt failed before anything launched: abort the LMs that prepared, take the placements back,
        and wait again (after a backoff), unless the gang was cancelled or timed out meanwhile."""
        gm = self.gm
        ledger = gm.ledger
        for lm in gang.order:
            placements = gang.parts[lm]
            seq = gang.seqs.get(lm)
            if seq is None:
                for p in placements:
                    self._undo(p)
            else:
                ledger.batch_answered(lm, seq)
                self._by_seq.pop((lm, seq), None)
                if lm in gang.prepared and lm != refused_by:
                    self._send(lm, GangAbort(gm.gm_id, lm, seq, gang.job_id))
            for p in placements:
                gm.policies.usage.released(p.task, lm)
                gm.observer.inconsistency(p, now)  # refused with its gang: it waits again
        self.refused += 1
        gang.refusals += 1
        gang.parts, gang.order, gang.seqs = {}, [], {}
        cancelling = ledger.cancelling
        if gang.cancelled or any(t.task_id in cancelling for t in gang.tasks):
            for task in gang.tasks:
                if task.task_id in cancelling:
                    gm.cancelled_run(task, now)
                else:
                    gm.cancelled += 1
                    gm.retry.ended(task)
                    gm.observer.task_cancelled(task, now)
            self._forget(gang)
            return
        if now >= gang.deadline:
            self._fail(gang, f"gang not placed within gang_timeout={gang.timeout:g}s ({reason})", now)
            return
        gm.observer.gang_retry(gang.job_id, reason, now)
        backoff = min(self.max_backoff_s, self.backoff_s * 2 ** (gang.refusals - 1)) * self.rng.uniform(0.5, 1.5)
        gang.state = WAITING
        gang.not_before = now + backoff
        self.waiting[gang.job_id] = gang
        gm.send_later(Wake(gang.not_before, gm_address(gm.gm_id), GangRetry(gang.job_id)))

    def _stop(self, gang: Gang, reason: str, now: float) -> None:
        """Something of the gang ran (or may run) while the rest cannot: stop every member that runs; once none
        does, the gang waits again as a whole (`_settle`)."""
        gm = self.gm
        gang.state = STOPPING
        gang.why_stopped = reason
        self.refused += 1
        stops: dict[int, list[tuple[str, int]]] = {}
        for lm in gang.order:
            for p in gang.parts[lm]:
                if p.task.task_id in gang.live and gm.ledger.running.get(p.task.task_id) is not None:
                    stops.setdefault(lm, []).append((p.task.task_id, p.task.attempt))
        for lm, runs in sorted(stops.items()):
            self._send(lm, StopRequest(gm.gm_id, lm, runs))
        self._settle(gang, now)

    def _settle(self, gang: Gang, now: float) -> None:
        """A gang none of whose members runs any more, and with no answer still due, ends (RUNNING: it ran) or
        waits again (STOPPING)."""
        if gang.live or len(gang.answered) < len(gang.parts):
            return
        gm = self.gm
        for lm, seq in gang.seqs.items():
            self._by_seq.pop((lm, seq), None)
        if gang.cancelled and gang.state in (RUNNING, STOPPING):
            # (RUNNING: only a gang with a retry rule leaves members unreported: held, or failed while cancelling)
            for task in gang.tasks:
                if task.task_id not in gang.reported and task.task_id not in gang.done:
                    gm.cancelled += 1
                    gm.retry.ended(task)
                    gm.observer.task_cancelled(task, now)
            self._forget(gang)
        elif gang.state == RUNNING:
            self._forget(gang)
        elif gang.state == STOPPING:
            if gang.fail_reason:
                self._fail(gang, gang.fail_reason, now)
            elif all(t.task_id in gang.done for t in gang.tasks):
                self._forget(gang)  # every member ran to its end before the stop reached it
            else:
                gm.observer.gang_retry(gang.job_id, gang.why_stopped, now)
                at = now
                if gang.retry is not None:  # a member failed: every member runs again, after the backoff
                    at = now + gang.retry.backoff
                    gm.failures_retried += 1
                    reason = f"{gang.retry.reason} at {at:.3f})"
                    for task in gang.tasks:
                        gm.observer.task_retry_scheduled(task, reason, at, now)
                elif gang.held and not gang.quiet:  # finished members of a ruled gang run again with the rest
                    for task, _ in gang.held.values():
                        gm.observer.task_preempted(task, now)
                for task_id in gang.done:
                    self.members.pop(task_id, None)
                rest = [t for t in gang.tasks if t.task_id not in gang.done]
                gang.tasks = tuple(replace(t, attempt=t.attempt + 1) for t in rest)
                gang.done = set()
                for task in gang.tasks:
                    self.members[task.task_id] = gang
                gang.parts, gang.order, gang.seqs, gang.answered = {}, [], {}, set()
                gang.reported, gang.held, gang.retry, gang.quiet = set(), {}, None, False
                self._wait(gang, now, at)

    def _wait(self, gang: Gang, now: float, not_before: float | None = None) -> None:
        """The gang waits to be placed (again), for at most its timeout; `not_before`: after a retry rule's backoff
        (a `GangRetry` wake then), its timeout counted from then."""
        gm = self.gm
        gang.state = WAITING
        gang.wait += 1
        start = now if not_before is None else max(now, not_before)
        gang.not_before = gang.since = start
        gang.deadline = start + gang.timeout
        self.waiting[gang.job_id] = gang
        if start > now:
            gm.send_later(Wake(start, gm_address(gm.gm_id), GangRetry(gang.job_id)))
        else:
            self.due = True
        if gang.timeout != math.inf:
            gm.send_later(Wake(gang.deadline, gm_address(gm.gm_id), GangTimeout(gang.job_id, gang.wait)))

    def _on_timeout(self, msg: GangTimeout, now: float) -> None:
        gang = self.waiting.get(msg.gang)
        if gang is not None and gang.wait == msg.wait:
            self._fail(gang, f"gang not placed within gang_timeout={gang.timeout:g}s", now)

    def _fail(self, gang: Gang, reason: str, now: float) -> None:
        for task in gang.tasks:
            if task.task_id not in gang.done:
                self.gm.retry.ended(task)
                self.gm.observer.task_failed(task, reason, now)
        self._forget(gang)

    def _forget(self, gang: Gang) -> None:
        self.waiting.pop(gang.job_id, None)
        for task in gang.tasks:
            if self.members.get(task.task_id) is gang:
                del self.members[task.task_id]

    def _send(self, lm: int, msg: object) -> None:
        self.gm.send_later(Send(lm_address(lm), msg))

    # --------------------------------------------------------------- queries

    def waiting_tasks(self) -> list[TaskSpec]:
        """The tasks of the gangs waiting to be placed."""
        return [t for gang in self.waiting.values() for t in gang.tasks]
