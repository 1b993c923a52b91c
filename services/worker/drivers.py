"""What a task driver is (Nomad's term): a way to run a task's `RunSpec` instead of burning, and to stop it.

`burn` is no driver object: `TaskExecutor` runs it as always. The others are `exec` (exec_driver.py: a command as
an unprivileged process, its CPU and memory enforced by cgroups v2 or rlimits) and `container`
(container_driver.py: an image through the Docker engine). A driver starts a `Run` that writes the task's output
to its `RunLog` (tasklogs.py); `TaskExecutor` waits for the run, applies the duration limit, stops it on a
preemption, and turns its `Exit` into the task's result and reason (executor.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, NamedTuple

if TYPE_CHECKING:
    from megha.common.core.task import RunSpec
    from megha.services.worker.tasklogs import RunLog


class Limits(NamedTuple):
    """What a run may use: the task's request."""

    cpu_millicores: int
    memory_mb: int


class Exit(NamedTuple):
    """How a run ended. `exit_code` is the process's or the container's; negative: killed by that signal.
    `memory_exceeded`: its memory limit stopped it (`memory_how` says how, when that is worth saying);
    `limit_exceeded`: another limit of the driver's stopped it, saying which (the run's failure reason)."""

    exit_code: int
    cpu_seconds: float = 0.0
    peak_rss_mb: float = 0.0
    memory_exceeded: bool = False
    memory_how: str = ""
    limit_exceeded: str = ""


class DriverUnavailable(Exception):
    """A driver this agent cannot offer safely here, and leaves out of the drivers it offers (one line saying why);
    the agent still starts. Unlike a `StartupError`, which stops the agent."""


class Run(ABC):
    """One task's execution by a driver."""

    @abstractmethod
    async def wait(self) -> Exit:
        """Wait for the run to end (its output all written to its log) and clean up after it."""

    @abstractmethod
    def terminate(self) -> None:
        """Ask the run to stop (SIGTERM to every process of it); returns at once."""

    @abstractmethod
    def kill(self) -> None:
        """Stop the run now (SIGKILL); returns at once."""


class Driver(ABC):
    name: ClassVar[str]

    @abstractmethod
    async def prepare(self) -> str:
        """Check at start-up that this driver can run tasks here (idempotent); raises `StartupError` saying why
        not, or `DriverUnavailable` when the agent should start without it. Returns a line for the log saying how
        it runs them."""

    @abstractmethod
    async def start(self, task_id: str, attempt: int, spec: RunSpec, limits: Limits, log: RunLog) -> Run:
        """Start a run; raises (an `OSError`, a `ValueError`) when it cannot, saying why."""
