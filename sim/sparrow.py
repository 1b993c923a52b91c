"""Sparrow on the simulator's event loop: S schedulers and one reservation-queueing worker pool per LM.

The scheduling logic is `megha.common.core.baselines.sparrow` (its docstring states the assumptions); this
module only wires it to the in-memory transport and offers the `SchedulerSystem` interface a replay drives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from megha.common.core.baselines.sparrow import (
    EligibleNodes,
    SparrowScheduler,
    SparrowWorkers,
    sparrow_scheduler_address,
    sparrow_worker_address,
)
from megha.common.core.cluster import ClusterSpec
from megha.common.core.messages import Output
from megha.common.core.observer import CoreObserver
from megha.embedded.system import EmbeddedConfig
from megha.embedded.wiring import SimulatedSystem, Submit


@dataclass(frozen=True, slots=True)
class SparrowConfig:
    """Sparrow's own parameters.

    `probe_ratio` d = 2 is the Sparrow paper's choice (d * m probes for a job of m tasks). `schedulers` = 10 as
    in the Sparrow paper's 110-machine deployment (10 schedulers, 100 workers) and as Megha's GM count in the
    Megha paper's cluster-size study. Processing costs no virtual time, so the number of schedulers changes
    which scheduler a job goes to (and the random streams), not how long anything takes.
    """

    schedulers: int = 10
    probe_ratio: float = 2.0

    def __post_init__(self) -> None:
        if self.schedulers < 1:
            raise ValueError(f"schedulers must be at least 1, got {self.schedulers}")
        if self.probe_ratio < 1:
            raise ValueError(f"probe_ratio must be at least 1, got {self.probe_ratio}")


class SparrowSystem(SimulatedSystem):
    """Sparrow schedulers and per-LM worker pools joined by an EventLoop; jobs are submitted to schedulers. A run
    ends when nothing more can happen: every reservation answered and every launched task finished.

    Of `config` it uses `hop_delay`, `seed` and `realtime`; `matching` and `delta_interval` are Megha's and play
    no part, and a fairness configuration is refused rather than silently ignored."""

    def __init__(
        self,
        cluster: ClusterSpec,
        config: EmbeddedConfig,
        observer: CoreObserver | None = None,
        sparrow: SparrowConfig | None = None,
    ) -> None:
        if config.fairness is not None:
            raise ValueError("the Sparrow baseline has no fairness policy (user queues, shares, preemption)")
        self.sparrow = sparrow or SparrowConfig()
        super().__init__(cluster, config, observer, self.sparrow.schedulers, "scheduler", sparrow_scheduler_address)
        eligible = EligibleNodes(cluster)
        self.schedulers = [
            SparrowScheduler(s, eligible, self.sparrow.probe_ratio, config.seed, self.observer)
            for s in range(self.sparrow.schedulers)
        ]
        self.workers = [SparrowWorkers(cluster, lm, self.observer) for lm in range(cluster.num_lms)]
        for scheduler in self.schedulers:
            self.loop.register(sparrow_scheduler_address(scheduler.scheduler_id), self._scheduler_handler(scheduler))
        for workers in self.workers:
            self.loop.register(sparrow_worker_address(workers.lm_id), workers.handle)

    def _scheduler_handler(self, scheduler: SparrowScheduler) -> Callable[[object, float], list[Output]]:
        def handle(msg: object, now: float) -> list[Output]:
            if isinstance(msg, Submit):
                return self.accept(scheduler.submit, msg.job, now)
            return scheduler.handle(msg, now)

        return handle

    def counters(self) -> dict[str, int]:
        """Reservations placed by probes, getTask requests, and getTasks answered with a no-op."""
        return {
            "probes": sum(s.probes for s in self.schedulers),
            "get_task_requests": sum(s.get_task_requests for s in self.schedulers),
            "noops": sum(s.noops for s in self.schedulers),
        }

    def stranded_tasks(self) -> list[str]:
        """Accepted tasks not finished when the run ended: unlaunched at a scheduler or still running (none in a
        healthy run)."""
        unlaunched = [t.task_id for s in self.schedulers for t in s.unlaunched_tasks()]
        return unlaunched + [t.task_id for w in self.workers for t in w.running_tasks()]

    def queued_reservations(self) -> int:
        """Reservations still waiting in worker queues (zero after a run)."""
        return sum(w.queued_reservations() for w in self.workers)
