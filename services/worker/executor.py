"""Task execution on a worker node: one OS process per task, really burning CPU and holding memory, or a driver's run.

`TaskExecutor` runs each task as ``python -m megha.services.worker.burn`` in its own process group, so a kill
reaches the burning child processes too; a task with a `RunSpec` runs with the driver it names instead (exec,
container: drivers.py), under its duration limit, its output kept (tasklogs.py). What it shares with the simulated
mode (simulated.py), how a task ended and the bookkeeping of running tasks, is in execution.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from megha.services.worker.drivers import Driver, Limits, Run
from megha.services.worker.execution import Executor, Outcome, StartedTask

if TYPE_CHECKING:
    from megha.common.core.task import RunSpec
    from megha.services.worker.tasklogs import RunLog, TaskLogs

BURN_MODULE = "megha.services.worker.burn"


@dataclass
class _DriverRun:
    """A task run by a driver, its log, and what the reason of its end needs."""

    run: Run
    log: RunLog
    memory_mb: int


class TaskExecutor(Executor):
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

    async def _launch(self, task: StartedTask, cpu_millicores: int, memory_mb: int, duration: float) -> None:
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

    async def _launch_run(self, task: StartedTask, spec: RunSpec, limits: Limits) -> None:
        assert self._logs is not None
        run_log = self._logs.open(task.task_id, task.attempt)
        try:
            run = await self._drivers[spec.driver].start(task.task_id, task.attempt, spec, limits, run_log)
        except BaseException as exc:
            run_log.write("stderr", f"megha: could not start: {exc}\n".encode())
            self._logs.close(task.task_id, run_log)
            raise
        self._runs[task.task_id] = _DriverRun(run, run_log, limits.memory_mb)

    async def _run_outcome(self, task: StartedTask) -> Outcome:
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
        elif end.limit_exceeded:
            error = end.limit_exceeded
        elif timed_out:
            error = f"exceeded its duration limit of {task.duration:g} s"
        else:
            error = "" if code == 0 else _exit_reason(code, entry.log)
        return Outcome(
            exit_code=code if code != 0 or not error else -1,
            cpu_seconds=end.cpu_seconds,
            peak_rss_mb=end.peak_rss_mb,
            error=error,
            task_exit_code=task_exit_code(code, end.memory_exceeded, timed_out),
        )

    async def _outcome(self, task_id: str) -> Outcome:
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
        return Outcome(
            exit_code=exit_code,
            cpu_seconds=float(report.get("cpu_seconds", 0.0)),
            memory_mb_touched=int(report.get("memory_mb_touched", 0)),
            peak_rss_mb=float(report.get("peak_rss_mb", 0.0)),
            error=error,
            process_seconds=float(report["wall_seconds"]) if "wall_seconds" in report else None,
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


def task_exit_code(code: int, memory_exceeded: bool, timed_out: bool) -> int | None:
    """The exit code a driver's run reports for retry rules (docs/retry.md): its own (0-255), 128 + n when signal n
    killed it, 137 when its memory limit did (as Kubernetes reports an OOM kill); None when its duration limit
    stopped it (not an exit of the task's own)."""
    if memory_exceeded:
        return 137
    if timed_out:
        return None
    return 128 + -code if code < 0 else min(code, 255)
