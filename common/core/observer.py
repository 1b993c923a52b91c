"""The core's measurement hook: what happened to each task and when. Drivers plug in a recorder; the core never
reads a clock, it reports the `now` it was given."""

from __future__ import annotations

from collections.abc import Sequence

from megha.common.core.messages import Placement
from megha.common.core.task import JobSpec, TaskSpec


class CoreObserver:
    """Receives task events from GM, LM and worker cores. The base class ignores them all."""

    def job_arrived(self, job: JobSpec, gm: int, now: float) -> None: ...

    def job_rejected(self, job: JobSpec, gm: int, reason: str, now: float) -> None: ...

    def attempt(self, task: TaskSpec, now: float) -> None: ...

    def rescheduled(self, task: TaskSpec, now: float) -> None: ...

    def decided(self, placements: Sequence[Placement], now: float) -> None: ...

    def inconsistency(self, placement: Placement, now: float) -> None: ...

    def lm_received(self, placements: Sequence[Placement], now: float) -> None: ...

    def launched(self, placements: Sequence[Placement], now: float) -> None: ...

    def worker_received(self, placements: Sequence[Placement], now: float) -> None: ...

    def started(self, placements: Sequence[Placement], now: float) -> None: ...

    def finished(self, task_ids: Sequence[str], now: float) -> None: ...

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None: ...

    def task_lost(self, task: TaskSpec, reason: str, now: float) -> None:
        """The worker running `task` was lost; the task runs again as its next attempt."""

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool) -> None:
        """A GM learnt that its task's run ended, finished (`error` "") or failed. `forwarded`: the LM had not
        placed that run (it restarted since), so no LM announced the end as a task event."""

    def task_preempted(self, task: TaskSpec, now: float) -> None:
        """A GM learnt that its task was stopped for another user's; it goes back into its queue."""

    def preempted(self, task_ids: Sequence[str], now: float) -> None:
        """Running tasks stopped on their worker to make room for another user's task (they run again later)."""

    def preemption_attempted(self, task: TaskSpec, lm: int, now: float) -> None:
        """A GM asked LM `lm` to preempt tasks so that `task` can run."""

    def task_cancelled(self, task: TaskSpec, now: float) -> None:
        """A GM's task was cancelled with its job: taken out of its queue, or its run stopped on its worker. It
        neither finished nor failed, and does not run again."""
