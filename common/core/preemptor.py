"""The GM's preemption round trips (fair paper, section IV-B4): asking an LM to stop tasks of users above their
share so that a waiting task fits there, and what the GM does with the LM's answer. Whether to ask, and which
victims to name, is the preemption policy's (`policies/`); the LM verifies the request against its exact state."""

from __future__ import annotations

from typing import TYPE_CHECKING

from megha.common.core.messages import Placement, PreemptRequest, PreemptResponse, Send, lm_address
from megha.common.core.parked import Shape
from megha.common.core.task import TaskSpec

if TYPE_CHECKING:
    from megha.common.core.gm import GlobalMaster


class Preemptor:
    """GM `gm`'s preemption requests: sent with its next launch batches, answered by their LM (a placement, or a
    refusal after which the task asks the next LM the policy names, or waits parked)."""

    def __init__(self, gm: GlobalMaster) -> None:
        self.gm = gm
        self.shapes: set[Shape] = set()  # shapes whose oldest task has a preemption request out

    def ask(self, task: TaskSpec, now: float, lms: list[int] | None = None) -> bool:
        """Ask the preemption policy for a request that would make room for `task` (on one of `lms`, or any LM),
        and send it. False when the policy has none."""
        gm = self.gm
        plan = gm.policies.preemption.plan(task, lms)
        if plan is None:
            return False
        lm = plan.lm
        seq = gm.ledger.preemption_sent(lm, task, plan.rest)
        self.shapes.add(gm.shape(task))
        gm.policies.usage.placed(task, lm)  # counted against its user while the request is out
        gm.preemption_attempts += 1
        gm.observer.preemption_attempted(task, lm, now)
        gm.observer.decided([Placement(task, lm, -1, False, gm.gm_id)], now)
        gm.send_later(Send(lm_address(lm), PreemptRequest(gm.gm_id, lm, seq, task, plan.victims, plan.total)))
        return True

    def retry(self, now: float) -> None:
        """A delta arrived: the policy may retry parked shapes with no request out."""
        self.gm.policies.preemption.retry(self.gm.waiting, self.shapes, lambda shape: self._retry(shape, now))

    def _retry(self, shape: Shape, now: float) -> bool:
        """A parked shape's oldest task tries a preemption again; True when a request went out."""
        gm = self.gm
        parked = gm.waiting[shape]
        gm.observer.attempt(parked[0], now)
        if not self.ask(parked[0], now):
            return False
        parked.popleft()
        if not parked:
            gm.parked.unpark(shape)
        return True

    def answered(self, resp: PreemptResponse, now: float) -> None:
        """The LM's answer: the task runs (the next task of its shape may preempt in turn), or the request was
        refused and the task asks the next LM or waits parked."""
        gm = self.gm
        entry = gm.ledger.preemption_answered(resp.lm, resp.seq)
        if entry is None:
            return  # a duplicate response
        task, rest = entry
        shape = gm.shape(task)
        self.shapes.discard(shape)
        gm.view.hold_states(resp.lm, resp.states, resp.delta.applied_through)
        gm.apply_delta(resp.delta)
        if resp.placement is not None:
            gm.preemptions += len(resp.preempted)
            if resp.placement.repartition:
                gm.repartitions += 1
            if gm.ledger.accepted(resp.seq, resp.placement):
                gm.stop_if_cancelled(resp.placement)
            parked = gm.waiting.get(shape)
            if parked:  # the next task of this shape may preempt in turn
                head = parked.popleft()
                if not parked:
                    gm.parked.unpark(shape)
                gm.queue.push_front(head)
            return
        usage = gm.policies.usage
        usage.released(task, resp.lm)
        if task.task_id in gm.ledger.cancelling:
            gm.cancelled_run(task, now)
            return
        usage.pending(task)
        if rest and self.ask(task, now, rest):
            return
        parked = gm.waiting.get(shape)  # parked under either unplaceable policy (see policies/unplaceable.py)
        if parked is None:
            gm.parked.park(shape, task)
        else:
            parked.appendleft(task)
        gm.reschedules += 1
        gm.observer.rescheduled(task, now)
