"""What a worker agent reports on GET /metrics: whether it registered, its running tasks and its nodes' free
resources, read when Prometheus scrapes (docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from megha.common.core.resources import DEFAULT_RESOURCE_NAMES
from megha.services.metrics import Identity, ServiceCollector, registry_of

if TYPE_CHECKING:
    from megha.common.transport.rabbit import Broker
    from megha.services.worker.agent import WorkerAgent


class WorkerCollector(ServiceCollector):
    """A worker agent's nodes and running tasks."""

    def __init__(self, agent: WorkerAgent) -> None:
        self.agent = agent

    def identity(self) -> Identity:
        return Identity("worker", self.agent.settings.worker_id)

    def broker(self) -> Broker | None:
        return self.agent.broker

    def families(self, me: Identity) -> Iterator[Metric]:
        agent = self.agent
        registered = agent.registered
        yield me.single(
            "megha_worker_registered",
            "1 once this agent has registered its nodes with its LM.",
            1 if registered is not None else 0,
        )
        yield me.single(
            "megha_worker_running_tasks",
            "Tasks started on this agent and not yet ended.",
            len(agent.executor.running()),
        )
        if registered is None:
            return
        free = me.gauge("megha_worker_free_resources", "Free resources of this agent's nodes.", ["resource"])
        total = [sum(column) for column in zip(*(agent.ledger.free(n) for n in range(registered.nodes)))]
        for name, amount in zip(DEFAULT_RESOURCE_NAMES, total):
            free.add(amount, name)
        yield free.family


def worker_registry(agent: WorkerAgent) -> CollectorRegistry:
    return registry_of(WorkerCollector(agent))
