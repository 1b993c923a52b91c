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
        # Tasks whose latest placement or preemption request awaits its answer, with that request: task -> (LM,
        # seq). A task's run that ended before its answer came is no longer here (its next attempt may be).
        self.awaiting_response: dict[str, tuple[int, int]] = {}
        # Requests whose run ended before their answer came (a completion overtook it): (task, LM, seq). The run
        # is named by its request, not its attempt: a preempted task runs again under the same attempt number.
        self.finished_early: set[tuple[str, int, int]] = set()
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
            awaiting[p.task.task_id] = (lm, seq)
        return seq

    def preemption_sent(self, lm: int, task: TaskSpec, rest: list[int]) -> int:
        """Record a preemption request for `task` to LM `lm`; its sequence number."""
        seq = self.next_seq[lm] = self.next_seq[lm] + 1
        self.preempting[lm][seq] = (task, rest)
        self.awaiting_response[task.task_id] = (lm, seq)
        return seq

    def batch_answered(self, lm: int, seq: int) -> list[Placement] | None:
        """The placements of batch `seq`, now answered (None for a duplicate answer)."""
        placements = self.unanswered_batches[lm].pop(seq, None)
        if placements is not None:
            for p in placements:
                self._answered(p.task.task_id, lm, seq)
        return placements

    def preemption_answered(self, lm: int, seq: int) -> tuple[TaskSpec, list[int]] | None:
        """The task and further LMs of preemption request `seq`, now answered (None for a duplicate answer)."""
        entry = self.preempting[lm].pop(seq, None)
        if entry is not None:
            self._answered(entry[0].task_id, lm, seq)
        return entry

    def _answered(self, task_id: str, lm: int, seq: int) -> None:
        """Request `seq` to LM `lm` for `task_id` was answered: the task awaits no answer unless a later request
        of its own does."""
        if self.awaiting_response.get(task_id) == (lm, seq):
            del self.awaiting_response[task_id]

    def accepted(self, seq: int, placement: Placement) -> bool:
        """Its LM runs `placement`, sent in request `seq`: True when it is now running, False when its run
        already ended (then the task may run again meanwhile as a later request: that one is not touched)."""
        task_id = placement.task.task_id
        ended = (task_id, placement.lm, seq)
        if ended in self.finished_early:
            self.finished_early.discard(ended)
            return False
        self.running[task_id] = placement
        return True

    def refused(self, lm: int, seq: int, task_id: str) -> bool:
        """Request `seq` to LM `lm` for `task_id` got no run: True when the task's end is still to be reported
        (False when a completion overtook the answer and ended it already)."""
        ended = (task_id, lm, seq)
        if ended in self.finished_early:
            self.finished_early.discard(ended)
            return False
        return True

    def run_ended(self, lm: int, task_id: str, attempt: int, run_number: int) -> Placement | None:
        """LM `lm` reported the end of `task_id`'s run `run_number` of `attempt`: its placement, or None for a stale
        or repeated report (of a run that ended already, an earlier attempt or run, another LM's run). A run whose
        request is not answered yet is remembered as ended early, by its request."""
        placement = self.running.get(task_id)
        if placement is not None:
            task = placement.task
            if task.attempt != attempt or task.run_number != run_number or placement.lm != lm:
                return None  # a stale copy of an earlier run
            del self.running[task_id]
            return placement
        request = self.awaiting_response.get(task_id)
        if request is None or request[0] != lm:
            return None  # a repeat (the task ended already), or a stale copy of an earlier run
        placement = self._find_unanswered(lm, request[1], task_id)
        if placement is None or placement.task.attempt != attempt or placement.task.run_number != run_number:
            return None
        del self.awaiting_response[task_id]
        self.finished_early.add((task_id, lm, request[1]))
        return placement

    def _find_unanswered(self, lm: int, seq: int, task_id: str) -> Placement | None:
        """The placement of `task_id` in request `seq` to LM `lm`, whose answer has not arrived yet."""
        for p in self.unanswered_batches[lm].get(seq, ()):
            if p.task.task_id == task_id:
                return p
        entry = self.preempting[lm].get(seq)
        if entry is not None and entry[0].task_id == task_id:
            return Placement(entry[0], lm, -1, False, self.gm)
        return None

    def may_run(self, task_id: str) -> bool:
        """Whether a run of `task_id` may be out there: running, or its latest request awaits an answer and no
        completion ended it."""
        return task_id in self.running or task_id in self.awaiting_response
