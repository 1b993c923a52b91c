"""Simulated execution: workers that hold a task's resources for its duration without burning CPU.

One instance stands for all worker nodes of one LM; it is what the embedded mode and the simulator run, and what
a worker agent runs in its clearly named simulated-execution mode.
"""

from __future__ import annotations

from collections.abc import Sequence

from megha.common.core.messages import (
    FinishedTask,
    FinishTick,
    Output,
    Placement,
    Send,
    Wake,
    WorkerLaunch,
    WorkerPreempt,
    WorkerReport,
    lm_address,
    worker_address,
)
from megha.common.core.observer import CoreObserver
from megha.common.core.queueable import NodeQueues
from megha.common.core.resources import Resources
from megha.common.core.retry import SimulatedFailures


class SimulatedExecution:
    """Starts each launched task at once and reports it finished `duration` seconds later (or, with `failures`,
    failed with an exit code then, for the runs they draw); queueable tasks wait in their node's queue and are
    evicted by guaranteed ones (`NodeQueues`, from the first queueable launch on)."""

    def __init__(
        self,
        lm_id: int,
        observer: CoreObserver | None = None,
        failures: SimulatedFailures | None = None,
        capacities: Sequence[Resources] = (),
    ) -> None:
        """`capacities[n]`: node n's capacity, which queueable tasks need (none otherwise)."""
        self.lm_id = lm_id
        self.observer = observer or CoreObserver()
        self.failures = failures
        self.capacities = capacities
        self._finishing: dict[float, list[FinishedTask]] = {}
        self._due: dict[str, tuple[float, Resources]] = {}  # task id -> when it finishes, its request
        self.running = 0
        self.dead: set[int] = set()  # crashed nodes: a launch that reaches one vanishes
        self.queues: NodeQueues | None = None  # the nodes' opportunistic queues, from the first queueable launch
        self._queued: dict[str, Placement] = {}  # queueable runs waiting in their node's queue

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
        if self.queues is None:
            for p in launches:
                if p.task.queueable:
                    return self._queue(launches, now)
            return self._start(launches, now)
        return self._queue(launches, now)

    def _start(self, launches: list[Placement], now: float) -> list[Output]:
        """Start these runs now: each finishes `duration` seconds later."""
        self.observer.started(launches, now)
        out: list[Output] = []
        finishing = self._finishing
        due = self._due
        failures = self.failures
        for p in launches:
            at = now + p.task.duration
            due[p.task.task_id] = (at, p.task.request)
            if failures is not None and (code := failures()) is not None:
                why = f"simulated failure: exit code {code}"
                end = FinishedTask.of(p, error=why, exit_code=code)
            else:  # FinishedTask.of(p), spelt out: this runs once per simulated task
                task = p.task
                end = FinishedTask(task.task_id, p.node, attempt=task.attempt, run_number=task.run_number)
            batch = finishing.get(at)
            if batch is None:
                finishing[at] = [end]
                out.append(Wake(at, worker_address(self.lm_id), FinishTick(at)))
            else:
                batch.append(end)
        self.running += len(launches)
        return out

    def _queue(self, launches: list[Placement], now: float) -> list[Output]:
        """Launches through the nodes' queues: guaranteed runs start (evicting queueable ones they need the room
        of, reported preempted), queueable ones start or wait."""
        queues = self.queues
        if queues is None:
            queues = self.queues = self._seeded_queues()
        queued = self._queued
        starting: list[Placement] = []
        evicted: list[FinishedTask] = []
        for p in launches:
            if p.task.task_id in self._due or p.task.task_id in queued:
                continue  # a repeated launch
            queued[p.task.task_id] = p
            moves = queues.launch(p.node, p.task.task_id, p.task.request, p.task.queueable)
            for task_id in moves.evicted:
                stopped = self._unschedule(task_id)
                if stopped is None:  # started in this same launch: it never ran
                    s = next(s for s in starting if s.task.task_id == task_id)
                    starting.remove(s)
                    stopped = FinishedTask.of(s, preempted=True)
                evicted.append(stopped)
            starting += [queued.pop(task_id) for task_id in moves.started]
        out = self._start(starting, now)
        if evicted:
            self.observer.preempted([f.task_id for f in evicted], now)
            out.append(Send(lm_address(self.lm_id), WorkerReport(self.lm_id, evicted)))
        return out

    def _seeded_queues(self) -> NodeQueues:
        """The nodes' queues, holding the guaranteed runs running now."""
        if not self.capacities:
            raise ValueError(f"worker {self.lm_id}: queueable tasks need the nodes' capacities (SimulatedExecution)")
        queues = NodeQueues(self.capacities.__getitem__)
        for batch in self._finishing.values():
            for f in batch:
                queues.launch(f.node, f.task_id, self._due[f.task_id][1], False)
        return queues

    def _unschedule(self, task_id: str) -> FinishedTask | None:
        """Take a running task off its finishing batch: its report as preempted, or None when it does not run."""
        entry = self._due.pop(task_id, None)
        if entry is None:
            return None
        batch = self._finishing[entry[0]]
        for k, f in enumerate(batch):
            if f.task_id == task_id:
                del batch[k]
                self.running -= 1
                return FinishedTask(task_id, f.node, preempted=True, attempt=f.attempt, run_number=f.run_number)
        raise AssertionError(f"task {task_id} is due but not finishing")

    def _next_from_queues(self, ended: list[str], now: float) -> list[Output]:
        """Runs `ended` left their nodes: start what waited there and fits now."""
        queues = self.queues
        assert queues is not None
        queued = self._queued
        starting = [queued.pop(started) for task_id in ended for started in queues.end(task_id)]
        return self._start(starting, now) if starting else []

    def crash(self, nodes: set[int]) -> None:
        """The workers of `nodes` die: their tasks stop and are never reported (their LM finds out by itself), and
        launches that reach them vanish until `repair`."""
        self.dead |= nodes
        if self.queues is not None:
            for task_id in self.queues.forget(nodes):
                del self._queued[task_id]
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
        # A run that failed is not finished: its GM decides (retried under its job's rule, or failed).
        self.observer.finished([f.task_id for f in finished if not f.error], now)
        out: list[Output] = [Send(lm_address(self.lm_id), WorkerReport(self.lm_id, finished))]
        if self.queues is not None:
            out += self._next_from_queues([f.task_id for f in finished], now)
        return out

    def _on_preempt(self, msg: WorkerPreempt, now: float) -> list[Output]:
        """Stop each task still running (or waiting in its node's queue) and report it preempted; one that already
        finished was reported so."""
        stopped: list[FinishedTask] = []
        waited: list[FinishedTask] = []
        for task_id in msg.task_ids:
            f = self._unschedule(task_id)
            if f is not None:
                stopped.append(f)
            elif task_id in self._queued:
                p = self._queued.pop(task_id)
                waited.append(FinishedTask.of(p, preempted=True))
        if not stopped and not waited:
            return []
        if stopped:
            self.observer.preempted([f.task_id for f in stopped], now)
        out: list[Output] = [Send(lm_address(self.lm_id), WorkerReport(self.lm_id, stopped + waited))]
        if self.queues is not None:
            out += self._next_from_queues([f.task_id for f in stopped + waited], now)
        return out
