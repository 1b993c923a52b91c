"""Jobs and tasks as the core sees them: resource requests, placement constraints, duration, user."""

from __future__ import annotations

from dataclasses import dataclass

from megha.common.core.resources import Resources


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task. `constraints` is a mask of required placement-constraint ids; `request` is aligned to the data
    centre's resource names; `duration` is in seconds. `attempt` counts the task's executions: a task whose
    worker was lost runs again as attempt 2, 3, ... (at most MEGHA_MAX_ATTEMPTS), and a report from an older
    attempt (a stale copy) is ignored."""

    task_id: str
    job_id: str
    user: str
    duration: float
    request: Resources
    constraints: int
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job: its tasks, submitted together to one GM. `submitted_at` is when the user submitted it."""

    job_id: str
    tasks: tuple[TaskSpec, ...]
    submitted_at: float
