"""Jobs and tasks as the core sees them: resource requests, placement constraints, duration, user, driver."""

from __future__ import annotations

from dataclasses import dataclass

from megha.common.core.resources import Resources

DRIVERS = ("burn", "exec", "container")
"""The task drivers (Nomad's word): `burn` burns the requested CPU and memory (the default, what traces and the
simulator run); `exec` runs a command as an unprivileged user; `container` runs an image through the Docker
engine."""


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
    attempt (a stale copy) is ignored. `run` is what the task runs when it does not burn (`driver`); for those
    drivers `duration` is a time limit when above 0 (0: no limit)."""

    task_id: str
    job_id: str
    user: str
    duration: float
    request: Resources
    constraints: int
    attempt: int = 1
    run: RunSpec | None = None

    @property
    def driver(self) -> str:
        """The task's driver: `run.driver`, or "burn" without a `run`."""
        return self.run.driver if self.run is not None else "burn"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job: its tasks, submitted together to one GM. `submitted_at` is when the user submitted it."""

    job_id: str
    tasks: tuple[TaskSpec, ...]
    submitted_at: float
