"""Simulated-execution mode, for scale tests: `SimulatedExecutor` waits each task's duration, burns nothing and
reports 0 CPU-seconds and 0 MB, behind the same interface as `TaskExecutor`."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from megha.services.worker.execution import Executor, Outcome, StartedTask


class SimulatedExecutor(Executor):
    """Waits each task's duration, burns nothing, reports 0 CPU-seconds and 0 MB.

    A task is a loop timer resolving a future (True when the duration has passed, False when it was killed), not
    a sleeping asyncio task: starting a batch of tasks is on the path of allocation time, and this costs one
    asyncio task and one `asyncio.wait` fewer per task."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timers: dict[str, tuple[asyncio.Future[bool], asyncio.TimerHandle]] = {}

    async def _launch(self, task: StartedTask, cpu_millicores: int, memory_mb: int, duration: float) -> None:
        loop = asyncio.get_running_loop()
        ended = loop.create_future()
        self._timers[task.task_id] = (ended, loop.call_later(duration, _resolve, ended, True))

    async def _outcome(self, task_id: str) -> Outcome:
        ended, timer = self._timers[task_id]
        try:
            ran_out = await ended
        finally:
            timer.cancel()  # a no-op once it has fired
            del self._timers[task_id]
        if not ran_out:
            return Outcome(exit_code=-signal.SIGTERM, error="simulated task cancelled")
        return Outcome(exit_code=0)

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
