"""The PigeonC baseline as a simulated system: distributors, masters and their worker pools on one event loop.

The published configuration (constraint-aware paper, section 5) is 10 distributors and 100 masters over 10,000
workers, with a fair queue weight of 20. Masters' groups are the data centre's nodes, LM by LM in LM-local order,
split into `masters` contiguous groups of (nearly) equal size (`split_groups`). The cluster's GM partitions play
no part: PigeonC has no partitions. Of the embedded configuration it uses the hop delay, the matching approach
(for arriving tasks), the seed and real-time mode; PigeonC has no delta updates and no per-user fair sharing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from megha.common.core.baselines.pigeonc import (
    PIGEON_SHORT_CUTOFF,
    WEIGHTINGS,
    Distributor,
    GroupCatalogue,
    Master,
    distributor_address,
    master_address,
    split_groups,
)
from megha.common.core.cluster import ClusterSpec
from megha.common.core.messages import Output, worker_address
from megha.common.core.observer import CoreObserver
from megha.common.core.placement.choice import make_choice
from megha.common.core.worker import SimulatedExecution
from megha.embedded.system import EmbeddedConfig
from megha.embedded.wiring import SimulatedSystem, Submit


@dataclass(frozen=True, slots=True)
class PigeonCConfig:
    """PigeonC's own parameters. A job is long when its mean task duration exceeds `short_cutoff` seconds; a
    master dequeues one long job's task per `fqw` short jobs' tasks. `weighting` is how distributors weigh
    masters: "satisfying" (the paper's count of suitable workers) or "published" (the constraint-set tally of
    the simulator behind the published figures; see `GroupCatalogue`)."""

    distributors: int = 10
    masters: int = 100
    fqw: int = 20
    short_cutoff: float = PIGEON_SHORT_CUTOFF
    weighting: str = "satisfying"

    def __post_init__(self) -> None:
        for name in ("distributors", "masters", "fqw"):
            if getattr(self, name) < 1:
                raise ValueError(f"PigeonC {name} must be at least 1, got {getattr(self, name)}")
        if self.short_cutoff < 0:
            raise ValueError(f"PigeonC short_cutoff must be >= 0, got {self.short_cutoff}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"PigeonC weighting must be one of {', '.join(WEIGHTINGS)}, got {self.weighting!r}")


class PigeonCSystem(SimulatedSystem):
    """D distributors, M masters and one simulated-execution worker pool per master, joined by an EventLoop; jobs
    are submitted to distributors. PigeonC has no periodic timers: a master is told of every finished task, so the
    loop runs dry only when no task waits."""

    def __init__(
        self,
        cluster: ClusterSpec,
        config: EmbeddedConfig,
        observer: CoreObserver | None = None,
        pigeonc: PigeonCConfig | None = None,
    ) -> None:
        self.pigeonc = pigeonc or PigeonCConfig()
        super().__init__(cluster, config, observer, self.pigeonc.distributors, "distributor", distributor_address)
        groups = split_groups(cluster, self.pigeonc.masters)
        self.catalogue = GroupCatalogue(groups, cluster.resource_names, self.pigeonc.weighting)
        self.distributors = [
            Distributor(d, self.catalogue, self.pigeonc.short_cutoff, config.seed, self.observer)
            for d in range(self.pigeonc.distributors)
        ]
        self.masters = [
            Master(m, group, first, make_choice(config.matching), self.pigeonc.fqw, config.seed, self.observer)
            for m, (group, first) in enumerate(zip(groups, self.catalogue.firsts, strict=True))
        ]
        self.workers = [SimulatedExecution(m, self.observer) for m in range(len(self.masters))]
        for distributor in self.distributors:
            self.loop.register(distributor_address(distributor.distributor_id), self._distributor_handler(distributor))
        for master in self.masters:
            self.loop.register(master_address(master.master_id), master.handle)
        for worker in self.workers:
            self.loop.register(worker_address(worker.lm_id), worker.handle)

    def _distributor_handler(self, distributor: Distributor) -> Callable[[object, float], list[Output]]:
        def handle(msg: object, now: float) -> list[Output]:
            if not isinstance(msg, Submit):
                raise TypeError(f"PigeonC distributor cannot handle {type(msg).__name__}")
            return self.accept(distributor.submit, msg.job, now)

        return handle

    def stranded_tasks(self) -> list[str]:
        """Task ids still queued at a master when the run ended (none in a healthy run)."""
        return [t.task_id for master in self.masters for t in master.waiting_tasks()]

    def counters(self) -> dict[str, int]:
        """Tasks that waited in a master's queue, tasks of long jobs, and long tasks dequeued ahead of a fitting
        short one by weighted fair queuing."""
        return {
            "queued_at_master": sum(m.queued for m in self.masters),
            "long_tasks": sum(d.long_tasks for d in self.distributors),
            "fqw_long_turns": sum(m.long_turns for m in self.masters),
        }
