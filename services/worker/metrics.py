"""What a worker agent reports on GET /metrics: whether it registered, its running tasks and its nodes' free
resources, read when Prometheus scrapes (docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from megha.common.core.resources import DEFAULT_RESOURCE_NAMES
from megha.services.metrics import Identity, registry_of

if TYPE_CHECKING:
    from megha.services.worker.agent import WorkerAgent


def worker_registry(agent: WorkerAgent) -> CollectorRegistry:
    """A worker agent's nodes and running tasks."""
    return registry_of(Identity("worker", agent.settings.worker_id), agent, partial(_worker_families, agent))


def _worker_families(agent: WorkerAgent, me: Identity) -> Iterator[Metric]:
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
