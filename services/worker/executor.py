"""Task execution on a worker node: one OS process per task (really burning CPU and holding memory), or simulated.

`TaskExecutor` runs each task as ``python -m megha.services.worker.burn`` in its own process group, so a kill
reaches the burning child processes too; a task with a `RunSpec` runs with the driver it names instead (exec,
container: drivers.py), under its duration limit, its output kept (tasklogs.py). `SimulatedExecutor` has the same
interface but only waits for the duration and reports no CPU: the "simulated-execution mode" for scale tests.

Both report every task that ends exactly once, as an `ExecutionResult`: to the `on_finished` callback (if given)
and to `wait()`. A task ends by finishing, by `kill()` (preemption: ``preempted=True``) or by its process
failing (``error`` says how). Timestamps are wall-clock (`time.time()`) because they are compared across the
processes of one host; durations are measured on the monotonic clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import sys
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from megha.services.worker.drivers import Driver, Limits, Run

if TYPE_CHECKING:
    from megha.common.core.task import RunSpec
    from megha.services.worker.tasklogs import RunLog, TaskLogs

log = logging.getLogger(__name__)

BURN_MODULE = "megha.services.worker.burn"
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
class _Outcome:
    """What a finished run reports before the executor adds times and the task's identity."""

    exit_code: int
    cpu_seconds: float = 0.0
    memory_mb_touched: int = 0
    peak_rss_mb: float = 0.0
    error: str = ""


@dataclass
class _Task:
    task_id: str
    duration: float
    started_at: float
    started_monotonic: float
    run: RunSpec | None = None
    attempt: int = 1
    watcher: asyncio.Task[ExecutionResult] | None = None
    killed: bool = False


class _Executor(ABC):
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
        self._tasks: dict[str, _Task] = {}
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
        task = _Task(task_id, duration, time.time(), time.monotonic(), run, attempt)
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

    async def _watch(self, task: _Task) -> ExecutionResult:
        try:
            outcome = await self._outcome(task.task_id)
        except Exception as exc:
            log.exception("task %s: lost track of its execution", task.task_id)
            outcome = _Outcome(exit_code=-1, error=f"executor failed: {exc!r}")
        wall = time.monotonic() - task.started_monotonic
        preempted = task.killed and outcome.exit_code != 0
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
    async def _launch(self, task: _Task, cpu_millicores: int, memory_mb: int, duration: float) -> None:
        """Begin executing the task."""

    @abstractmethod
    async def _outcome(self, task_id: str) -> _Outcome:
        """Wait for the task's execution to end and say how it ended."""

    @abstractmethod
    def _terminate(self, task_id: str) -> None:
        """Ask the task's execution to stop (SIGTERM)."""

    @abstractmethod
    def _force_kill(self, task_id: str) -> None:
        """Stop the task's execution now (SIGKILL)."""


@dataclass
class _DriverRun:
    """A task run by a driver, its log, and what the reason of its end needs."""

    run: Run
    log: RunLog
    memory_mb: int


class TaskExecutor(_Executor):
    """Runs each task as a real `burn` process (its own process group) that consumes the CPU and memory asked for,
    or, for a task with a `RunSpec`, with one of `drivers` (by name), its output kept in `logs`."""

    def __init__(
        self, *args: Any, drivers: Mapping[str, Driver] | None = None, logs: TaskLogs | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        if drivers and logs is None:
            raise ValueError("drivers need logs to keep their tasks' output")
        self._processes: dict[str, asyncio.subprocess.Process] = {}
        self._drivers = dict(drivers or {})
        self._logs = logs
        self._runs: dict[str, _DriverRun] = {}

    @property
    def drivers(self) -> tuple[str, ...]:
        return ("burn", *self._drivers)

    def withdraw(self, name: str) -> None:
        """Stop offering driver `name` (its `prepare` found it cannot run tasks safely here)."""
        self._drivers.pop(name, None)

    def pid(self, task_id: str) -> int | None:
        """The pid (and process-group id) of a running task's burn process, None if it is not running."""
        process = self._processes.get(task_id)
        return None if process is None else process.pid

    async def _launch(self, task: _Task, cpu_millicores: int, memory_mb: int, duration: float) -> None:
        if task.run is not None:
            await self._launch_run(task, task.run, Limits(cpu_millicores, memory_mb))
            return
        # A process group of its own: kill() signals the group, so the burning children go too.
        self._processes[task.task_id] = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            BURN_MODULE,
            "--cpu-millicores",
            str(cpu_millicores),
            "--memory-mb",
            str(memory_mb),
            "--duration",
            repr(duration),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )

    async def _launch_run(self, task: _Task, spec: RunSpec, limits: Limits) -> None:
        assert self._logs is not None
        run_log = self._logs.open(task.task_id, task.attempt)
        try:
            run = await self._drivers[spec.driver].start(task.task_id, task.attempt, spec, limits, run_log)
        except BaseException as exc:
            run_log.write("stderr", f"megha: could not start: {exc}\n".encode())
            self._logs.close(task.task_id, run_log)
            raise
        self._runs[task.task_id] = _DriverRun(run, run_log, limits.memory_mb)

    async def _run_outcome(self, task: _Task) -> _Outcome:
        """Wait for a driver's run, stopping it at its duration limit; how it ended, with the reason."""
        entry = self._runs[task.task_id]
        run, timed_out = entry.run, False
        ending = asyncio.ensure_future(run.wait())
        try:
            if task.duration > 0:
                await asyncio.wait([ending], timeout=task.duration)
                if not ending.done() and not task.killed:
                    timed_out = True
                    run.terminate()
                    await asyncio.wait([ending], timeout=self._kill_grace)
                    if not ending.done():
                        run.kill()
            end = await ending
        finally:
            del self._runs[task.task_id]
            assert self._logs is not None
            self._logs.close(task.task_id, entry.log)
        code = end.exit_code
        if end.memory_exceeded:
            how = f" ({end.memory_how})" if end.memory_how else ""
            error = f"exceeded its memory limit of {entry.memory_mb} MB{how}"
            if code > 0:
                error += f": {_exit_reason(code, entry.log)}"
        elif timed_out:
            error = f"exceeded its duration limit of {task.duration:g} s"
        else:
            error = "" if code == 0 else _exit_reason(code, entry.log)
        return _Outcome(
            exit_code=code if code != 0 or not error else -1,
            cpu_seconds=end.cpu_seconds,
            peak_rss_mb=end.peak_rss_mb,
            error=error,
        )

    async def _outcome(self, task_id: str) -> _Outcome:
        if task_id in self._runs:
            return await self._run_outcome(self._tasks[task_id])
        process = self._processes[task_id]
        try:
            stdout, stderr = await process.communicate()
        finally:
            if process.returncode != 0:
                # The burn process stops its children itself; this catches any left behind by a crash.
                self._signal_group(process, signal.SIGKILL)
            del self._processes[task_id]
        exit_code = process.returncode
        assert exit_code is not None
        report = _parse_report(stdout)
        if exit_code == 0 and report is None:
            error = f"burn process exited 0 without a report; stderr: {_tail(stderr)}"
        elif exit_code < 0:
            error = f"burn process killed by signal {-exit_code}"
        elif exit_code != 0:
            error = f"burn process exited with code {exit_code}; stderr: {_tail(stderr)}"
        else:
            error = ""
        report = report or {}
        return _Outcome(
            exit_code=exit_code,
            cpu_seconds=float(report.get("cpu_seconds", 0.0)),
            memory_mb_touched=int(report.get("memory_mb_touched", 0)),
            peak_rss_mb=float(report.get("peak_rss_mb", 0.0)),
            error=error,
        )

    def _terminate(self, task_id: str) -> None:
        if task_id in self._runs:
            self._runs[task_id].run.terminate()
        self._signal_group(self._processes.get(task_id), signal.SIGTERM)

    def _force_kill(self, task_id: str) -> None:
        if task_id in self._runs:
            self._runs[task_id].run.kill()
        self._signal_group(self._processes.get(task_id), signal.SIGKILL)

    @staticmethod
    def _signal_group(process: asyncio.subprocess.Process | None, signum: int) -> None:
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signum)


class SimulatedExecutor(_Executor):
    """Simulated-execution mode: waits each task's duration, burns nothing, reports 0 CPU-seconds and 0 MB.

    A task is a loop timer resolving a future (True when the duration has passed, False when it was killed), not
    a sleeping asyncio task: starting a batch of tasks is on the path of allocation time, and this costs one
    asyncio task and one `asyncio.wait` fewer per task."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timers: dict[str, tuple[asyncio.Future[bool], asyncio.TimerHandle]] = {}

    async def _launch(self, task: _Task, cpu_millicores: int, memory_mb: int, duration: float) -> None:
        loop = asyncio.get_running_loop()
        ended = loop.create_future()
        self._timers[task.task_id] = (ended, loop.call_later(duration, _resolve, ended, True))

    async def _outcome(self, task_id: str) -> _Outcome:
        ended, timer = self._timers[task_id]
        try:
            ran_out = await ended
        finally:
            timer.cancel()  # a no-op once it has fired
            del self._timers[task_id]
        if not ran_out:
            return _Outcome(exit_code=-signal.SIGTERM, error="simulated task cancelled")
        return _Outcome(exit_code=0)

    def _terminate(self, task_id: str) -> None:
        entry = self._timers.get(task_id)
        if entry is not None:
            entry[1].cancel()
            _resolve(entry[0], False)

    def _force_kill(self, task_id: str) -> None:
        self._terminate(task_id)


def _resolve(ended: asyncio.Future[bool], ran_out: bool) -> None:
    if not ended.done():
        ended.set_result(ran_out)


def _parse_report(stdout: bytes) -> dict[str, float] | None:
    """The burn process's JSON report: its last non-empty stdout line, None if there is none or it is not JSON."""
    lines = stdout.decode(errors="replace").strip().splitlines()
    if not lines:
        return None
    try:
        report = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
    return report if isinstance(report, dict) else None


def _exit_reason(code: int, run_log: RunLog) -> str:
    """Why a driver's run failed: its exit code (or the signal that killed it) and the end of its stderr."""
    if code < 0:
        try:
            name = f" ({signal.Signals(-code).name})"
        except ValueError:
            name = ""
        reason = f"killed by signal {-code}{name}"
    else:
        reason = f"exit code {code}"
    tail = run_log.stderr_tail()
    return f"{reason}: {tail}" if tail else reason


def _tail(stderr: bytes, limit: int = 500) -> str:
    text = stderr.decode(errors="replace").strip()
    return text[-limit:] if text else "(empty)"
