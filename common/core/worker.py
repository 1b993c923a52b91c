"""Simulated execution: workers that hold a task's resources for its duration without burning CPU.

One instance stands for all worker nodes of one LM; it is what the embedded mode and the simulator run, and what
a worker agent runs in its clearly named simulated-execution mode.
"""

from __future__ import annotations

from megha.common.core.messages import (
    FinishedTask,
    FinishTick,
    Output,
    Send,
    Wake,
    WorkerLaunch,
    WorkerReport,
    lm_address,
    worker_address,
)
from megha.common.core.observer import CoreObserver


class SimulatedExecution:
    """Starts each launched task at once and reports it finished `duration` seconds later."""

    def __init__(self, lm_id: int, observer: CoreObserver | None = None) -> None:
        self.lm_id = lm_id
        self.observer = observer or CoreObserver()
        self._finishing: dict[float, list[FinishedTask]] = {}
        self.running = 0

    def handle(self, msg: object, now: float) -> list[Output]:
        if isinstance(msg, WorkerLaunch):
            return self._on_launch(msg, now)
        if isinstance(msg, FinishTick):
            return self._on_finish(msg, now)
        raise TypeError(f"worker cannot handle {type(msg).__name__}")

    def _on_launch(self, msg: WorkerLaunch, now: float) -> list[Output]:
        self.observer.worker_received(msg.launches, now)
        self.observer.started(msg.launches, now)
        out: list[Output] = []
        finishing = self._finishing
        for p in msg.launches:
            at = now + p.task.duration
            batch = finishing.get(at)
            if batch is None:
                finishing[at] = [FinishedTask(p.task.task_id, p.node)]
                out.append(Wake(at, worker_address(self.lm_id), FinishTick(at)))
            else:
                batch.append(FinishedTask(p.task.task_id, p.node))
        self.running += len(msg.launches)
        return out

    def _on_finish(self, tick: FinishTick, now: float) -> list[Output]:
        finished = self._finishing.pop(tick.at)
        self.running -= len(finished)
        self.observer.finished([f.task_id for f in finished], now)
        return [Send(lm_address(self.lm_id), WorkerReport(self.lm_id, finished))]
