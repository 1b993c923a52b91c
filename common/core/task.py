"""Jobs and tasks as the core sees them: resource requests, placement constraints, duration, user, driver."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from megha.common.core.resources import Resources

if TYPE_CHECKING:
    from megha.common.core.retry import RetryRule

DRIVERS = ("burn", "exec", "container")
"""The task drivers (Nomad's word): `burn` burns the requested CPU and memory (the default, what traces and the
simulator run); `exec` runs a command as an unprivileged user; `container` runs an image through the Docker
engine."""


MAX_PRIORITY = 10**18 - 1
"""The largest priority value a task may have: an LM reports its usage per value in its deltas, keyed by the
value's digits (at most 18), and refuses a task with a larger one."""


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What a task runs instead of burning (Nomad's driver and its config); a TaskSpec without one burns."""

    driver: str  # "exec" | "container"
    command: tuple[str, ...] = ()  # exec: argv (required); container: overrides the image's command
    image: str = ""  # container: required
    env: tuple[tuple[str, str], ...] = ()
    workdir: str = ""


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task. `constraints` is a mask of required placement-constraint ids; `request` is aligned to the data
    centre's resource names; `duration` is in seconds. `attempt` counts the task's executions: a task whose
    worker was lost runs again as attempt 2, 3, ... (at most MEGHA_MAX_ATTEMPTS), and a report from an older
    attempt (a stale copy) is ignored. `run_number` tells apart the launches of one attempt: a preempted task
    runs again as the same attempt with the next run number, and a GM that restarts queues its tasks again
    with run numbers its earlier term never used (`recovery.first_run_number`), so a copy of an earlier run's
    end names another run and is ignored. `run` is what the task runs when it does not burn (`driver`); for those
    drivers `duration` is a time limit when above 0 (0: no limit). A `queueable` task is opportunistic (Mercury's
    QUEUEABLE containers, docs/queueable.md): it may wait in a node's queue beyond the node's free resources, and
    guaranteed tasks evict it."""

    task_id: str
    job_id: str
    user: str
    duration: float
    request: Resources
    constraints: int
    attempt: int = 1
    run: RunSpec | None = None
    priority: int = 0  # the value of its job's priority class: higher first, may preempt lower (policies/priority)
    queueable: bool = False
    run_number: int = 1

    @property
    def driver(self) -> str:
        """The task's driver: `run.driver`, or "burn" without a `run`."""
        return self.run.driver if self.run is not None else "burn"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job: its tasks, submitted together to one GM. `submitted_at` is when the user submitted it. `depends_on`:
    the ids of the jobs that must all finish before it runs (it waits for them in the GM's `DependencyGate`).
    `retry`: which failed runs of its tasks run again, and after what backoff (None: none; common/core/retry.py).
    `gang` is None for a job whose tasks are placed independently; else every task starts or none does, and it is
    the gang timeout in seconds (how long the gang may wait to be placed; inf: for ever)."""

    job_id: str
    tasks: tuple[TaskSpec, ...]
    submitted_at: float
    depends_on: tuple[str, ...] = ()
    retry: RetryRule | None = None
    gang: float | None = None
