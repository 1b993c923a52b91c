"""The core's measurement hook: what happened to each task and when. Drivers plug in observers (the recorder of a
replay, a service's job table and metrics), several at once through `observe`; the core never reads a clock, it
reports the `now` it was given."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from megha.common.core.messages import Completion, Placement, Rejection
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

    def requeued_at_recovery(self, tasks: Sequence[TaskSpec], now: float) -> None:
        """A GM restarted after a crash and queued these accepted tasks, which no LM runs and which did not end: a
        run one of them had (placed, or running) was lost while the GM was down (its worker crashed, say, and its
        LM restarted without it), so it runs again. The restarted GM cannot tell which had one."""

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool) -> None:
        """A GM learnt that its task's run ended, finished (`error` "") or failed. `forwarded`: the LM had not
        placed that run (it restarted since), so no LM announced the end as a task event; `now` is then when the
        run ended as its worker measured it, when the LM forwarded that."""

    def forwarded_end_repeated(self, lm: int, item: Completion, now: float) -> None:
        """A GM ignored a run's end that LM `lm` forwarded (it had not placed the run: it restarted since) because it
        had applied that end already, or it is a copy of an earlier run's: the LM may have died after telling the
        GM and before announcing the end as a task event, so an observer that announces ends may announce it (again)
        if it is the end of the task's last run."""

    def task_preempted(self, task: TaskSpec, now: float) -> None:
        """A GM learnt that its task was stopped for another user's; it goes back into its queue."""

    def preempted(self, task_ids: Sequence[str], now: float) -> None:
        """Running tasks stopped on their worker to make room for another user's task (they run again later)."""

    def preemption_attempted(self, task: TaskSpec, lm: int, now: float) -> None:
        """A GM asked LM `lm` to preempt tasks so that `task` can run."""

    def task_cancelled(self, task: TaskSpec, now: float) -> None:
        """A GM's task was cancelled with its job: taken out of its queue, or its run stopped on its worker. It
        neither finished nor failed, and does not run again."""

    # The LM's decisions, beside `lm_received` and `launched`:

    def rejected(self, rejections: Sequence[Rejection], now: float) -> None:
        """An LM refused placements of a launch batch: inconsistencies (the GM's view was stale) and malformed
        requests (`Rejection.inconsistency` says which)."""

    def preempting(self, task_ids: Sequence[str], now: float) -> None:
        """An LM granted a preemption request: it stops these running tasks (their worker reports `preempted`)."""

    def preemption_refused(self, task: TaskSpec, reason: str, now: float) -> None:
        """An LM refused to preempt for `task`: no victim passed its verification. Reported by the GM instead when
        its request got no answer (`GlobalMaster.call_failed`: the LM was down), which counts as a refusal."""

    def stopping(self, task_ids: Sequence[str], now: float) -> None:
        """An LM stops these runs at their GM's request (their job was cancelled)."""

    def job_waiting(self, job: JobSpec, now: float) -> None:
        """A GM accepted `job` (after `job_arrived`) and holds it until its parents (`depends_on`) finished."""

    def job_released(self, job: JobSpec, now: float) -> None:
        """Every parent of waiting `job` finished: its tasks join the GM's queue."""

    def task_retry_scheduled(self, task: TaskSpec, reason: str, at: float, now: float) -> None:
        """A GM's task's run failed (`reason` says how, with its exit code and failure count) and its job's retry
        rule runs it again as its next attempt once its backoff ends at `at`: not an end of the task."""

    # Gangs (docs/gang.md):

    def gang_refused(self, gang: str, lm: int, reason: str, now: float) -> None:
        """LM `lm` refused a prepare of gang `gang` (its job id): one of its placements failed validation."""

    def gang_started(self, job_id: str, gm: int, now: float) -> None:
        """Every task of gang `job_id` was launched (the GM learnt the last LM's launch)."""

    def gang_retry(self, job_id: str, reason: str, now: float) -> None:
        """Gang `job_id` was not placed as a whole (`reason`): nothing of it runs; it waits and is tried again."""


EVENTS: tuple[str, ...] = tuple(name for name in vars(CoreObserver) if not name.startswith("_"))
"""Every event a core reports."""


class Observers(CoreObserver):
    """Several observers in a core's one observer slot: each event goes to every observer that records it, in the
    order given. An event one observer records is bound straight to it, and one nobody records stays a no-op."""

    def __init__(self, *observers: CoreObserver) -> None:
        self.observers = observers
        for name in EVENTS:
            handlers = [getattr(o, name) for o in observers if records(o, name)]
            if len(handlers) == 1:
                setattr(self, name, handlers[0])
            elif handlers:
                setattr(self, name, _each(handlers))


def records(observer: CoreObserver, event: str) -> bool:
    """Whether `observer` does something on `event` (overrides the no-op, on its class or on itself)."""
    return getattr(getattr(observer, event), "__func__", None) is not getattr(CoreObserver, event)


def observe(*observers: CoreObserver) -> CoreObserver:
    """One observer for a core's slot: a single observer as it is (a simulation pays nothing for the fan-out), the
    no-op base for none, `Observers` for more."""
    if len(observers) == 1:
        return observers[0]
    return Observers(*observers) if observers else CoreObserver()


def _each(handlers: Sequence[Callable[..., None]]) -> Callable[..., None]:
    def event(*args: object) -> None:
        for handler in handlers:
            handler(*args)

    return event
