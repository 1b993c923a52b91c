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
    WorkerPreempt,
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
        self._due: dict[str, float] = {}  # task id -> when it finishes
        self.running = 0
        self.dead: set[int] = set()  # crashed nodes: a launch that reaches one vanishes

    def handle(self, msg: object, now: float) -> list[Output]:
        if isinstance(msg, WorkerLaunch):
            return self._on_launch(msg, now)
        if isinstance(msg, FinishTick):
            return self._on_finish(msg, now)
        if isinstance(msg, WorkerPreempt):
            return self._on_preempt(msg, now)
        raise TypeError(f"worker cannot handle {type(msg).__name__}")

    def _on_launch(self, msg: WorkerLaunch, now: float) -> list[Output]:
        launches = msg.launches if not self.dead else [p for p in msg.launches if p.node not in self.dead]
        self.observer.worker_received(launches, now)
        self.observer.started(launches, now)
        out: list[Output] = []
        finishing = self._finishing
        due = self._due
        for p in launches:
            at = now + p.task.duration
            due[p.task.task_id] = at
            batch = finishing.get(at)
            if batch is None:
                finishing[at] = [FinishedTask(p.task.task_id, p.node, attempt=p.task.attempt)]
                out.append(Wake(at, worker_address(self.lm_id), FinishTick(at)))
            else:
                batch.append(FinishedTask(p.task.task_id, p.node, attempt=p.task.attempt))
        self.running += len(launches)
        return out

    def crash(self, nodes: set[int]) -> None:
        """The workers of `nodes` die: their tasks stop and are never reported (their LM finds out by itself), and
        launches that reach them vanish until `repair`."""
        self.dead |= nodes
        for at, batch in self._finishing.items():
            gone = [f for f in batch if f.node in nodes]
            if gone:
                self._finishing[at] = [f for f in batch if f.node not in nodes]
                for f in gone:
                    del self._due[f.task_id]
                self.running -= len(gone)

    def repair(self, nodes: set[int]) -> None:
        """The workers of `nodes` are back, running nothing."""
        self.dead -= nodes

    def _on_finish(self, tick: FinishTick, now: float) -> list[Output]:
        finished = self._finishing.pop(tick.at)
        if not finished:
            return []  # every task due now was preempted
        self.running -= len(finished)
        due = self._due
        for f in finished:
            del due[f.task_id]
        self.observer.finished([f.task_id for f in finished], now)
        return [Send(lm_address(self.lm_id), WorkerReport(self.lm_id, finished))]

    def _on_preempt(self, msg: WorkerPreempt, now: float) -> list[Output]:
        """Stop each task still running and report it preempted; one that already finished was reported so."""
        stopped: list[FinishedTask] = []
        for task_id in msg.task_ids:
            at = self._due.pop(task_id, None)
            if at is None:
                continue
            batch = self._finishing[at]
            for k, f in enumerate(batch):
                if f.task_id == task_id:
                    stopped.append(FinishedTask(task_id, f.node, preempted=True, attempt=f.attempt))
                    del batch[k]
                    break
        if not stopped:
            return []
        self.running -= len(stopped)
        self.observer.preempted([f.task_id for f in stopped], now)
        return [Send(lm_address(self.lm_id), WorkerReport(self.lm_id, stopped))]
