"""The interface every simulated scheduler offers a replay, and the registry that builds one by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.observer import CoreObserver
from megha.common.core.task import JobSpec
from megha.common.transport.inmemory import EventLoop
from megha.embedded.system import EmbeddedConfig, EmbeddedSystem

if TYPE_CHECKING:
    from megha.sim.pigeonc import PigeonCConfig


class SchedulerSystem(Protocol):
    """A whole scheduler (its masters, workers and transport) that a replay submits jobs to and runs.

    `entry_points` is how many front ends jobs can be submitted to (GMs for Megha, distributors for PigeonC,
    schedulers for Sparrow); the workload spreads jobs over them round-robin. `rejected` lists jobs refused at
    submission with the reason. `counters()` gives scheduler-specific counts for the report (repartitions,
    probes, ...).
    """

    loop: EventLoop
    rejected: list[tuple[JobSpec, str]]

    @property
    def entry_points(self) -> int: ...

    def submit(self, entry: int, job: JobSpec) -> None: ...

    def run(self, on_event: Callable[[float], None] | None = None) -> None: ...

    def stranded_tasks(self) -> list[str]: ...

    def counters(self) -> dict[str, int]: ...


SystemFactory = Callable[[ClusterSpec, EmbeddedConfig, CoreObserver], SchedulerSystem]


def centralized_cluster(cluster: ClusterSpec) -> ClusterSpec:
    """The same nodes under one LM with one partition: the centralized scheduler of the Megha paper's
    comparison (one GM sees and places everything; there is nothing to repartition)."""
    parts = [p for row in cluster.partitions for p in row]
    merged = PartitionSpec(
        0,
        0,
        tuple(cap for p in parts for cap in p.capacities),
        tuple(mask for p in parts for mask in p.constraint_masks),
        tuple(d for p in parts for d in p.node_drivers()) if any(p.drivers for p in parts) else (),
    )
    return ClusterSpec(((merged,),), cluster.resource_names)


def _megha(cluster: ClusterSpec, config: EmbeddedConfig, observer: CoreObserver) -> SchedulerSystem:
    return EmbeddedSystem(cluster, config, observer)


def _centralized(cluster: ClusterSpec, config: EmbeddedConfig, observer: CoreObserver) -> SchedulerSystem:
    return EmbeddedSystem(centralized_cluster(cluster), config, observer)


# The baselines are imported when one is built: a replay of Megha, the common case, does not compile their
# modules (about 50 KB of source, compiled again in every run where bytecode is not written).


def _pigeonc(
    cluster: ClusterSpec, config: EmbeddedConfig, observer: CoreObserver, pigeonc: PigeonCConfig | None = None
) -> SchedulerSystem:
    """PigeonC (`megha.sim.pigeonc.PigeonCSystem`), with its own parameters' defaults unless given."""
    from megha.sim.pigeonc import PigeonCSystem

    return PigeonCSystem(cluster, config, observer, pigeonc)


def _pigeonc_published(
    cluster: ClusterSpec, config: EmbeddedConfig, observer: CoreObserver, pigeonc: PigeonCConfig | None = None
) -> SchedulerSystem:
    """PigeonC with the distributors' worker count of the authors' simulator, which reproduces the published
    figures (see `megha.sim.pigeonc`)."""
    from megha.sim.pigeonc import PigeonCConfig

    return _pigeonc(cluster, config, observer, replace(pigeonc or PigeonCConfig(), weighting="published"))


def _sparrow(cluster: ClusterSpec, config: EmbeddedConfig, observer: CoreObserver) -> SchedulerSystem:
    """Sparrow (`megha.sim.sparrow.SparrowSystem`)."""
    from megha.sim.sparrow import SparrowSystem

    return SparrowSystem(cluster, config, observer)


SCHEDULERS: dict[str, SystemFactory] = {
    "megha": _megha,
    "centralized": _centralized,
    "pigeonc": _pigeonc,
    "pigeonc-published": _pigeonc_published,
    "sparrow": _sparrow,
}


PIGEONC_SCHEDULERS = ("pigeonc", "pigeonc-published")
"""The `SCHEDULERS` that are PigeonC, and so take a `PigeonCConfig` (its numbers of distributors and masters)."""


def build_system(
    name: str,
    cluster: ClusterSpec,
    config: EmbeddedConfig,
    observer: CoreObserver,
    pigeonc: PigeonCConfig | None = None,
) -> SchedulerSystem:
    """The scheduler called `name` on `cluster`; raises ValueError naming the known ones. `pigeonc` sets PigeonC's
    own parameters (its weighting is the scheduler's); for any other scheduler it must be None."""
    factory = SCHEDULERS.get(name)
    if factory is None:
        raise ValueError(f"unknown scheduler {name!r}; choose one of {', '.join(sorted(SCHEDULERS))}")
    if pigeonc is None:
        return factory(cluster, config, observer)
    if name == "pigeonc":
        return _pigeonc(cluster, config, observer, pigeonc)
    if name == "pigeonc-published":
        return _pigeonc_published(cluster, config, observer, pigeonc)
    raise ValueError(f"PigeonC's parameters are for --scheduler {' or '.join(PIGEONC_SCHEDULERS)}, not {name}")
