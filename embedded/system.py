"""Wires GM, LM and simulated-worker cores to the in-memory transport and runs them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from megha.common.core.cluster import ClusterSpec
from megha.common.core.fairness.config import FairnessConfig
from megha.common.core.gm import GlobalMaster, Unschedulable
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import DeltaTick, Output, gm_address, lm_address, worker_address
from megha.common.core.observer import CoreObserver
from megha.common.core.placement.choice import make_choice
from megha.common.core.task import JobSpec
from megha.common.core.worker import SimulatedExecution
from megha.common.transport.inmemory import EventLoop
from megha.embedded.faults import FaultInjector, WorkerFaults

LOADGEN = "loadgen"
QUIET_TICKS_BEFORE_STOP = 3


@dataclass(frozen=True, slots=True)
class EmbeddedConfig:
    """How the embedded system runs. `hop_delay` is the one-way network delay per message, in seconds;
    `fairness` turns on user queues, shares and preemption."""

    matching: str = "random"
    hop_delay: float = 0.0005
    delta_interval: float = 1.0
    seed: int = 0
    realtime: bool = False
    fairness: FairnessConfig | None = None
    worker_faults: WorkerFaults | None = None
    max_attempts: int = 3


@dataclass(slots=True)
class _Submit:
    job: JobSpec


class EmbeddedSystem:
    """G GMs, L LMs and one simulated-execution worker pool per LM, joined by an EventLoop."""

    def __init__(self, cluster: ClusterSpec, config: EmbeddedConfig, observer: CoreObserver | None = None) -> None:
        self.cluster = cluster
        self.config = config
        self.observer = observer or CoreObserver()
        self.loop = EventLoop(config.hop_delay, config.realtime)
        self.loop.background(DeltaTick)
        self.gms = [
            GlobalMaster(
                g,
                cluster,
                make_choice(config.matching),
                config.seed,
                self.observer,
                config.fairness,
                config.max_attempts,
            )
            for g in range(cluster.num_gms)
        ]
        self.lms = [
            LocalMaster.in_cluster(cluster, lm, self.observer, config.delta_interval, config.fairness)
            for lm in range(cluster.num_lms)
        ]
        self.workers = [SimulatedExecution(lm, self.observer) for lm in range(cluster.num_lms)]
        self.rejected: list[tuple[JobSpec, str]] = []
        for gm in self.gms:
            self.loop.register(gm_address(gm.gm_id), self._gm_handler(gm))
        for lm in self.lms:
            self.loop.register(lm_address(lm.lm_id), lm.handle)
        for worker in self.workers:
            self.loop.register(worker_address(worker.lm_id), worker.handle)
        self._quiet_ticks = 0
        self.faults = FaultInjector(self, config.worker_faults) if config.worker_faults is not None else None

    def _gm_handler(self, gm: GlobalMaster) -> Callable[[object, float], list[Output]]:
        def handle(msg: object, now: float) -> list[Output]:
            self._quiet_ticks = 0
            if isinstance(msg, _Submit):
                try:
                    return gm.submit(msg.job, now)
                except Unschedulable as exc:
                    self.rejected.append((msg.job, str(exc)))
                    return []
            return gm.handle(msg, now)

        return handle

    def submit(self, gm: int, job: JobSpec) -> None:
        """The load generator submits `job` to GM `gm` at its submission time; it arrives one hop later."""
        if not 0 <= gm < len(self.gms):
            raise ValueError(f"no GM {gm}; this system has {len(self.gms)}")
        self.loop.post(job.submitted_at + self.config.hop_delay, gm_address(gm), _Submit(job))

    def run(self, on_event: Callable[[float], None] | None = None) -> None:
        """Run until every accepted task has finished (or nothing more can happen)."""
        for lm in self.lms:
            self.loop.dispatch(lm.start(self.loop.now))
        if self.faults is not None:
            self.faults.start(self.loop.now)
        self.loop.run(self._keep_going, on_event)

    def _keep_going(self) -> bool:
        """Only periodic deltas remain: keep ticking a few times while some GM still holds tasks, so deltas can
        reveal free resources its view missed; then stop."""
        if not any(gm.queue or gm.waiting for gm in self.gms):
            return False
        self._quiet_ticks += 1
        return self._quiet_ticks <= QUIET_TICKS_BEFORE_STOP * len(self.lms)

    @property
    def entry_points(self) -> int:
        """Jobs are submitted to GMs."""
        return len(self.gms)

    def counters(self) -> dict[str, int]:
        """Repartitions, inconsistencies and reschedules summed over GMs (the LM-side counts agree)."""
        return {
            "repartitions": sum(gm.repartitions for gm in self.gms),
            "inconsistencies": sum(gm.inconsistencies for gm in self.gms),
            "reschedules": sum(gm.reschedules for gm in self.gms),
            "preemption_attempts": sum(gm.preemption_attempts for gm in self.gms),
            "preemptions": sum(lm.preemptions for lm in self.lms),
            **(
                {"worker_crashes": self.faults.crashes, "retries": sum(gm.retries for gm in self.gms)}
                if self.faults is not None
                else {}
            ),
        }

    def stranded_tasks(self) -> list[str]:
        """Task ids still held by a GM when the run ended (none in a healthy run)."""
        return [t.task_id for gm in self.gms for t in (*gm.queue, *gm.waiting_tasks())]
