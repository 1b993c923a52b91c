"""What both executors of a worker agent share: how a task's execution ended (`ExecutionResult`) and the
bookkeeping of running tasks (`Executor`: duplicates, results, the `on_finished` callback, kill and shutdown).

An executor reports every task that ends exactly once, as an `ExecutionResult`: to the `on_finished` callback (if
given) and to `wait()`. A task ends by finishing, by `kill()` (preemption: ``preempted=True``) or by its process
failing (``error`` says how). Timestamps are wall-clock (`time.time()`) because they are compared across the
processes of one host; durations are measured on the monotonic clock.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megha.common.core.task import RunSpec

log = logging.getLogger(__name__)

DEFAULT_KILL_GRACE_SECONDS = 2.0
DEFAULT_KEEP_RESULTS = 1024


@dataclass(frozen=True)
class ExecutionResult:
    """How one task's execution ended; ``execution_delay`` is the paper's (section VI-F): wall minus duration (0
    for a driver's run, whose duration is only a limit)."""

    task_id: str
    started_at: float
    finished_at: float
    cpu_seconds: float
    wall_seconds: float
    execution_delay: float
    memory_mb_touched: int
    peak_rss_mb: float
    exit_code: int
    preempted: bool
    error: str
    # The exit code a job's retry rule matches (docs/retry.md): a driver's run only (exec, container), 128 + n for
    # a signal n, 137 for a memory-limit kill; None for burn, a duration limit, a run that never started.
    task_exit_code: int | None = None
    # Of execution_delay, the seconds outside the task's own process clock: starting its interpreter, its exit and
    # reaping (burn runs that reported; else 0). The rest is the process running past its duration.
    process_overhead: float = 0.0

    @property
    def succeeded(self) -> bool:
        return not self.preempted and not self.error

    @classmethod
    def failed_to_start(cls, task_id: str, error: str) -> ExecutionResult:
        """The result of a task whose process could not even be started."""
        now = time.time()
        return cls(task_id, now, now, 0.0, 0.0, 0.0, 0, 0.0, -1, False, f"could not start: {error}")


OnFinished = Callable[[ExecutionResult], Awaitable[None]]


@dataclass(frozen=True)
class Outcome:
    """What a finished run reports before the executor adds times and the task's identity."""

    exit_code: int
    cpu_seconds: float = 0.0
    memory_mb_touched: int = 0
    peak_rss_mb: float = 0.0
    error: str = ""
    task_exit_code: int | None = None  # as in ExecutionResult
    process_seconds: float | None = None  # a burn process's wall time by its own clock, as it reported it


@dataclass
class StartedTask:
    """A task an executor started and that has not ended yet: what its result is made of, and its watcher."""

    task_id: str
    duration: float
    started_at: float
    started_monotonic: float
    run: RunSpec | None = None
    attempt: int = 1
    watcher: asyncio.Task[ExecutionResult] | None = None
    killed: bool = False


class Executor(ABC):
    """Bookkeeping shared by both executors: duplicates, results, the callback, kill and shutdown."""

    def __init__(
        self,
        on_finished: OnFinished | None = None,
        *,
        kill_grace: float = DEFAULT_KILL_GRACE_SECONDS,
        keep_results: int = DEFAULT_KEEP_RESULTS,
    ) -> None:
        """`kill_grace`: seconds between SIGTERM and SIGKILL. `keep_results`: how many finished results not yet
        collected by `wait()` are kept (oldest dropped first); the callback sees every result regardless."""
        self._on_finished = on_finished
        self._kill_grace = kill_grace
        self._keep_results = keep_results
        self._tasks: dict[str, StartedTask] = {}
        self._results: OrderedDict[str, ExecutionResult] = OrderedDict()
        self._watchers: set[asyncio.Task[ExecutionResult]] = set()
        self._closed = False

    @property
    def drivers(self) -> tuple[str, ...]:
        """The task drivers this executor runs."""
        return ("burn",)

    async def start(
        self,
        task_id: str,
        cpu_millicores: int,
        memory_mb: int,
        duration: float,
        run: RunSpec | None = None,
        attempt: int = 1,
    ) -> None:
        """Launch a task (attempt `attempt`), burning, or running `run` with its driver; raises ValueError for a
        task id already running, for negative/non-finite requests or for a driver not offered here."""
        if self._closed:
            raise RuntimeError("executor is shut down")
        if task_id in self._tasks:
            raise ValueError(f"task {task_id!r} is already running")
        for name, value in (("cpu_millicores", cpu_millicores), ("memory_mb", memory_mb), ("duration", duration)):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r} for task {task_id!r}")
        if run is not None and run.driver not in self.drivers:
            raise ValueError(f"driver {run.driver!r} is not offered here (only {', '.join(self.drivers)})")
        task = StartedTask(task_id, duration, time.time(), time.monotonic(), run, attempt)
        self._tasks[task_id] = task
        try:
            await self._launch(task, int(cpu_millicores), int(memory_mb), float(duration))
        except BaseException:
            del self._tasks[task_id]
            raise
        self._results.pop(task_id, None)
        task.watcher = asyncio.create_task(self._watch(task), name=f"megha-task-{task_id}")
        self._watchers.add(task.watcher)
        task.watcher.add_done_callback(self._watchers.discard)
        if self._closed:  # shut down while this task was being launched
            await self.kill(task_id)

    async def wait(self, task_id: str) -> ExecutionResult:
        """The result of a running task once it ends, or of an ended one not yet collected; KeyError otherwise."""
        task = self._tasks.get(task_id)
        if task is not None and task.watcher is not None:
            result = await asyncio.shield(task.watcher)
            if self._results.get(task_id) is result:
                del self._results[task_id]
            return result
        return self._results.pop(task_id)

    async def kill(self, task_id: str) -> bool:
        """Preempt a running task: SIGTERM, SIGKILL after the grace period; False if it is not running.

        Returns once the task has ended and been reported (with ``preempted=True``).
        """
        task = self._tasks.get(task_id)
        if task is None or task.watcher is None:
            return False
        task.killed = True
        self._terminate(task_id)
        try:
            await asyncio.wait_for(asyncio.shield(task.watcher), self._kill_grace)
        except TimeoutError:
            self._force_kill(task_id)
            await asyncio.shield(task.watcher)
        return True

    def running(self) -> list[str]:
        """Ids of the tasks started and not yet ended, oldest first."""
        return list(self._tasks)

    async def shutdown(self) -> None:
        """Refuse new tasks, kill every running one (each is still reported, as preempted) and return once every
        task's process is gone and its `on_finished` callback has returned."""
        self._closed = True
        await asyncio.gather(*(self.kill(task_id) for task_id in list(self._tasks)))
        await asyncio.gather(*self._watchers, return_exceptions=True)

    async def _watch(self, task: StartedTask) -> ExecutionResult:
        try:
            outcome = await self._outcome(task.task_id)
        except Exception as exc:
            log.exception("task %s: lost track of its execution", task.task_id)
            outcome = Outcome(exit_code=-1, error=f"executor failed: {exc!r}")
        wall = time.monotonic() - task.started_monotonic
        preempted = task.killed and outcome.exit_code != 0
        own = outcome.process_seconds
        overhead = max(0.0, wall - own) if task.run is None and own is not None else 0.0
        result = ExecutionResult(
            task_id=task.task_id,
            started_at=task.started_at,
            finished_at=task.started_at + wall,
            cpu_seconds=outcome.cpu_seconds,
            wall_seconds=wall,
            execution_delay=wall - task.duration if task.run is None else 0.0,
            memory_mb_touched=outcome.memory_mb_touched,
            peak_rss_mb=outcome.peak_rss_mb,
            exit_code=outcome.exit_code,
            preempted=preempted,
            error="" if preempted else outcome.error,
            task_exit_code=None if preempted else outcome.task_exit_code,
            process_overhead=overhead,
        )
        del self._tasks[task.task_id]
        self._results[task.task_id] = result
        while len(self._results) > self._keep_results:
            self._results.popitem(last=False)
        if self._on_finished is not None:
            try:
                await self._on_finished(result)
            except Exception:
                log.exception("task %s: on_finished callback failed", task.task_id)
        return result

    @abstractmethod
    async def _launch(self, task: StartedTask, cpu_millicores: int, memory_mb: int, duration: float) -> None:
        """Begin executing the task."""

    @abstractmethod
    async def _outcome(self, task_id: str) -> Outcome:
        """Wait for the task's execution to end and say how it ended."""

    @abstractmethod
    def _terminate(self, task_id: str) -> None:
        """Ask the task's execution to stop (SIGTERM)."""

    @abstractmethod
    def _force_kill(self, task_id: str) -> None:
        """Stop the task's execution now (SIGKILL)."""
