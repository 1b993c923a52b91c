"""What an LM counts and reports on GET /metrics: its `LMMeter`, an observer of its core that counts what the core
decides (also read by GET /v1/state), and its registry (`lm_registry`), which reads its nodes and free resources
per partition from its service and core when Prometheus scrapes (docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from megha.common.core.messages import Placement, Rejection
from megha.common.core.observer import CoreObserver
from megha.common.core.task import TaskSpec
from megha.services.metrics import FAIR_SHARE, Identity, registry_of

if TYPE_CHECKING:
    from megha.services.lm.service import LMService


class LMMeter(CoreObserver):
    """What an LM core decides, counted from its observer events for /metrics and GET /v1/state: tasks launched
    (and of those, by repartition), placements rejected (inconsistencies, malformed requests), preemptions
    granted and refused, runs stopped for cancelled jobs."""

    def __init__(self) -> None:
        self.launches = 0
        self.repartitions = 0
        self.inconsistencies = 0
        self.malformed = 0
        self.preemptions = 0
        self.preemption_refusals = 0
        self.stops = 0

    def launched(self, placements: Sequence[Placement], now: float) -> None:
        self.launches += len(placements)
        self.repartitions += sum(p.repartition for p in placements)

    def rejected(self, rejections: Sequence[Rejection], now: float) -> None:
        inconsistencies = sum(r.inconsistency for r in rejections)
        self.inconsistencies += inconsistencies
        self.malformed += len(rejections) - inconsistencies

    def preempting(self, task_ids: Sequence[str], now: float) -> None:
        self.preemptions += len(task_ids)

    def preemption_refused(self, task: TaskSpec, reason: str, now: float) -> None:
        self.preemption_refusals += 1

    def stopping(self, task_ids: Sequence[str], now: float) -> None:
        self.stops += len(task_ids)


def lm_registry(service: LMService) -> CollectorRegistry:
    """An LM's nodes, free resources per partition and the events it decides (validation, repartition,
    preemption), read from its service and core."""
    return registry_of(Identity("lm", service.settings.lm_id), service, partial(_lm_families, service))


def _lm_families(service: LMService, me: Identity) -> Iterator[Metric]:
    yield me.single("megha_lm_registered_nodes", "Nodes registered by worker agents.", service.registered_nodes)
    yield me.single(
        "megha_lm_incarnation", "This LM's incarnation (its start time in milliseconds).", service.incarnation
    )
    core = service.core
    if core is None:
        return
    nodes = me.gauge("megha_lm_nodes", "Nodes of this LM by state.", ["state"])
    nodes.add(len(core.capacity) - len(core.down), "in_service")
    nodes.add(len(core.down), "out_of_service")
    yield nodes.family
    free = me.gauge(
        "megha_lm_free_resources",
        "Free resources of the nodes of each partition (out-of-service nodes count none).",
        ["resource", "partition"],
    )
    capacity = me.gauge(
        "megha_lm_capacity_resources", "Capacity of the nodes of each partition.", ["resource", "partition"]
    )
    width = len(core.resource_names)
    free_sum = [[0] * width for _ in range(core.num_gms)]
    capacity_sum = [[0] * width for _ in range(core.num_gms)]
    for owner, node_free, node_capacity in zip(core.owner, core.free, core.capacity):
        for k in range(width):
            free_sum[owner][k] += node_free[k]
            capacity_sum[owner][k] += node_capacity[k]
    for gm in range(core.num_gms):
        for k, name in enumerate(core.resource_names):
            free.add(free_sum[gm][k], name, str(gm))
            capacity.add(capacity_sum[gm][k], name, str(gm))
    yield free.family
    yield capacity.family
    yield me.single("megha_lm_running_tasks", "Tasks running on this LM's nodes.", len(core.running))
    yield me.single(
        "megha_lm_logical_nodes",
        "Logical nodes carved out by repartitions and still held.",
        len(core.logical_nodes),
    )
    decided = service.meter  # counted from the core's observer events
    yield from me.counters(
        (
            (
                "megha_inconsistencies_total",
                "Placements this LM rejected because the GM's view was stale (no resources, or node out of service).",
                decided.inconsistencies,
            ),
            (
                "megha_lm_malformed_placements_total",
                "Placements this LM rejected as malformed (no such node, constraints unmet, already running, "
                "wrong repartition flag).",
                decided.malformed,
            ),
            ("megha_repartitions_total", "Repartitions this LM carried out.", decided.repartitions),
            (
                "megha_lm_launched_tasks_total",
                "Tasks this LM validated and launched on a worker.",
                decided.launches,
            ),
            (
                "megha_lm_preemption_refusals_total",
                "Preemption requests this LM refused (no victim passed verification).",
                decided.preemption_refusals,
            ),
            (
                "megha_lm_stopped_tasks_total",
                "Runs this LM stopped at their GM's request (their job was cancelled).",
                decided.stops,
            ),
            (
                "megha_lm_failed_launches_total",
                "Launch calls to worker agents that failed.",
                service.failed_launches,
            ),
        )
    )
    preemptions = me.counter("megha_preemptions_total", "Tasks this LM stopped for another task.", ["reason"])
    preemptions.add(decided.preemptions, FAIR_SHARE)
    yield preemptions.family
