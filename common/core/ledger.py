"""A GM's run ledger: the requests it sent each LM and has no answer to yet, and the runs it holds for its tasks
(running, ended before their launch was answered, being cancelled)."""

from __future__ import annotations

from megha.common.core.messages import Placement
from megha.common.core.task import TaskSpec


class RunLedger:
    """Numbers each request to an LM (launch batches and preemption requests share one sequence per LM, which
    the LM's `applied_through` reports on) and keeps what it needs to apply the answer."""

    def __init__(self, gm: int, num_lms: int) -> None:
        self.gm = gm
        # The last sequence number used per LM.
        self.next_seq = [0] * num_lms
        # Launch batches sent and not answered yet, per LM: seq -> its placements.
        self.unanswered_batches: list[dict[int, list[Placement]]] = [{} for _ in range(num_lms)]
        # Preemption requests awaiting their answer, per LM: seq -> (task, LMs still to ask if this one refuses).
        self.preempting: list[dict[int, tuple[TaskSpec, list[int]]]] = [{} for _ in range(num_lms)]
        # Tasks whose placement or preemption request awaits its answer.
        self.awaiting_response: set[str] = set()
        # Of those, the tasks whose run already ended (its completion overtook the answer).
        self.finished_early: set[str] = set()
        # Runs an LM accepted and that have not ended: task -> its placement.
        self.running: dict[str, Placement] = {}
        # Cancelled tasks whose run may still be out there (placed, running or being stopped): their end is
        # reported as cancelled, and they never run again.
        self.cancelling: set[str] = set()

    def continue_from(self, lm: int, applied_through: int) -> None:
        """After a restart: LM `lm` has applied this GM's requests up to `applied_through`; number on from there."""
        self.next_seq[lm] = max(self.next_seq[lm], applied_through)

    def batch_sent(self, lm: int, placements: list[Placement]) -> int:
        """Record a launch batch to LM `lm`; its sequence number."""
        seq = self.next_seq[lm] = self.next_seq[lm] + 1
        self.unanswered_batches[lm][seq] = placements
        awaiting = self.awaiting_response
        for p in placements:
            awaiting.add(p.task.task_id)
        return seq

    def preemption_sent(self, lm: int, task: TaskSpec, rest: list[int]) -> int:
        """Record a preemption request for `task` to LM `lm`; its sequence number."""
        seq = self.next_seq[lm] = self.next_seq[lm] + 1
        self.preempting[lm][seq] = (task, rest)
        self.awaiting_response.add(task.task_id)
        return seq

    def batch_answered(self, lm: int, seq: int) -> list[Placement] | None:
        """The placements of batch `seq`, now answered (None for a duplicate answer)."""
        placements = self.unanswered_batches[lm].pop(seq, None)
        if placements is not None:
            awaiting = self.awaiting_response
            for p in placements:
                awaiting.discard(p.task.task_id)
        return placements

    def preemption_answered(self, lm: int, seq: int) -> tuple[TaskSpec, list[int]] | None:
        """The task and further LMs of preemption request `seq`, now answered (None for a duplicate answer)."""
        entry = self.preempting[lm].pop(seq, None)
        if entry is not None:
            self.awaiting_response.discard(entry[0].task_id)
        return entry

    def accepted(self, placement: Placement) -> bool:
        """Its LM runs `placement`: True when it is now running, False when its run already ended."""
        task_id = placement.task.task_id
        if task_id in self.finished_early:
            self.finished_early.discard(task_id)
            return False
        self.running[task_id] = placement
        return True

    def refused(self, task_id: str) -> bool:
        """A request for `task_id` got no run: True when the task's end is still to be reported (False when a
        completion overtook the answer and ended it already)."""
        if task_id in self.finished_early:
            self.finished_early.discard(task_id)
            return False
        return True

    def run_ended(self, lm: int, task_id: str, attempt: int) -> Placement | None:
        """An LM reported the end of `task_id`'s run `attempt`: its placement, or None for a stale or repeated
        report. A run whose launch is not answered yet is remembered as ended early."""
        placement = self.running.get(task_id)
        if placement is not None:
            if placement.task.attempt != attempt:
                return None  # a stale copy of an earlier attempt
            del self.running[task_id]
            return placement
        if task_id not in self.awaiting_response:
            return None  # a repeat: the task ended already
        placement = self._find_unanswered(lm, task_id)
        if placement is None or placement.task.attempt != attempt:
            return None
        self.finished_early.add(task_id)
        return placement

    def _find_unanswered(self, lm: int, task_id: str) -> Placement | None:
        """The placement of a task whose launch (or preemption) response has not arrived yet."""
        for placements in self.unanswered_batches[lm].values():
            for p in placements:
                if p.task.task_id == task_id:
                    return p
        for task, _ in self.preempting[lm].values():
            if task.task_id == task_id:
                return Placement(task, lm, -1, False, self.gm)
        return None

    def may_run(self, task_id: str) -> bool:
        """Whether a run of `task_id` may be out there: running, or its request awaits an answer and no completion
        ended it."""
        return task_id in self.running or (task_id in self.awaiting_response and task_id not in self.finished_early)
