"""Prometheus metrics of the GM, LM and worker-agent services (GET /metrics): one registry per app, whose collectors
read the service's own counters and state when Prometheus scrapes, so the scheduling core's paths stay untouched.

Every sample carries the identity of the service it describes as a label: `gm="0"`, `lm="1"` or
`worker="worker-0-0"` (a GM standing in for another also reports the identity it holds, under that identity's
`gm`). docs/metrics.md lists every metric, its labels and where it comes from.
"""

from __future__ import annotations

import platform
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from megha.common.core.lifecycle import State
from megha.common.core.messages import Placement, Rejection
from megha.common.core.observer import CoreObserver
from megha.common.core.resources import DEFAULT_RESOURCE_NAMES
from megha.common.core.task import TaskSpec

if TYPE_CHECKING:
    from megha.common.core.fairness.config import FairnessConfig
    from megha.common.core.gm import GlobalMaster
    from megha.common.transport.rabbit import Broker
    from megha.services.gm.jobs import JobTable
    from megha.services.gm.service import GMService
    from megha.services.lm.service import LMService
    from megha.services.worker.agent import WorkerAgent

ALLOCATION_TIME_BUCKETS: tuple[float, ...] = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0),
    *(1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0),
)
"""Upper bounds (seconds) of the allocation-time histogram: from 1 ms (an idle data centre) to a day (a trace's
tasks may queue for hours under load)."""

NO_QUEUE = "default"
"""The `queue` label of a GM's one FIFO queue when fair scheduling is off."""

OTHER_QUEUE = "other"
"""The `queue` label, without MEGHA_METRICS_USER_LABELS, of a user with no configured queue (none in practice: a GM
admits only the users of its queues)."""

FAIR_SHARE = "fair_share"
"""The `reason` of a preemption made for a user below its share (Algorithm 2), today the only reason."""


class TaskMeter:
    """What a GM counts for /metrics beside its core's counters: scheduling attempts and the allocation-time
    histogram. Plain counts, cheap to update; the collector turns them into metrics."""

    __slots__ = ("attempts", "buckets", "count", "sum")

    def __init__(self) -> None:
        self.attempts = 0
        self.buckets = [0] * (len(ALLOCATION_TIME_BUCKETS) + 1)  # not cumulative; the last one is +Inf
        self.count = 0
        self.sum = 0.0

    def decided(self, arrival: float | None, attempts: int, now: float) -> None:
        """A placement decision for a task that arrived at `arrival`. A task recovered after a restart is decided
        without a scheduling attempt (`attempts` 0): that run was decided before, and is not observed again."""
        if arrival is None or not attempts:
            return
        seconds = now - arrival
        self.buckets[bisect_left(ALLOCATION_TIME_BUCKETS, seconds)] += 1
        self.count += 1
        self.sum += seconds


class GMMeter(CoreObserver):
    """A GM core's observer that fills its `TaskMeter` (`allocation`) beside the job table, the GM's one record of
    its tasks: `observe(table, meter)` hands the core's events to the table first, and the meter reads each task's
    arrival, scheduling attempts and lifecycle state there. A decision counts when the table took it (the task had
    not ended, and the task lifecycle allows it)."""

    def __init__(self, jobs: JobTable) -> None:
        self.allocation = TaskMeter()
        self.jobs = jobs

    def attempt(self, task: TaskSpec, now: float) -> None:
        self.allocation.attempts += 1

    def decided(self, placements: Sequence[Placement], now: float) -> None:
        allocation, tasks = self.allocation, self.jobs.tasks
        for p in placements:
            rec = tasks.get(p.task.task_id)
            if rec is not None and rec.life == State.PLACING and rec.launched_at == now:
                allocation.decided(rec.arrival, rec.attempts, now)


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


class _Family:
    """A metric family whose every sample carries the service's identity label first."""

    def __init__(self, family: Metric, identity: str) -> None:
        self.family = family
        self.identity = identity

    def add(self, value: float, *labels: str) -> None:
        self.family.add_metric([self.identity, *labels], value)


class _Identity:
    """Builds the families of one service identity (`key`="gm", "lm" or "worker"; `value` its id)."""

    def __init__(self, key: str, value: object) -> None:
        self.key = key
        self.value = str(value)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> _Family:
        return _Family(GaugeMetricFamily(name, doc, labels=[self.key, *labels]), self.value)

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> _Family:
        return _Family(CounterMetricFamily(name, doc, labels=[self.key, *labels]), self.value)

    def single(self, name: str, doc: str, value: float) -> Metric:
        """An unlabelled gauge of one value."""
        family = self.gauge(name, doc)
        family.add(value)
        return family.family

    def counters(self, specs: Iterable[tuple[str, str, float]]) -> Iterator[Metric]:
        """One unlabelled counter per (name, doc, value)."""
        for name, doc, value in specs:
            family = self.counter(name, doc)
            family.add(value)
            yield family.family


def _build_info(identity: _Identity) -> Metric:
    try:
        megha = version("megha")
    except PackageNotFoundError:
        megha = "unknown"
    info = identity.gauge(
        "megha_build_info", "Always 1; the labels say which Megha and Python run.", ["version", "python"]
    )
    info.add(1, megha, platform.python_version())
    return info.family


def _service(identity: _Identity, broker: Broker | None) -> Iterator[Metric]:
    """What every service reports: which Megha it runs, and its broker connection's counters."""
    yield _build_info(identity)
    yield from _broker(identity, broker)


def _broker(identity: _Identity, broker: Broker | None) -> Iterator[Metric]:
    if broker is None:
        return
    yield from identity.counters(
        (
            ("megha_broker_published_total", "Messages published and confirmed by RabbitMQ.", broker.published),
            (
                "megha_broker_publish_failures_total",
                "Publishes RabbitMQ did not confirm (they are sent again from the outbox).",
                broker.publish_failures,
            ),
            (
                "megha_broker_requeued_total",
                "Delivered messages whose handler failed and were requeued.",
                broker.requeued,
            ),
            (
                "megha_broker_dead_lettered_total",
                "Delivered messages given up after the delivery limit and dead-lettered.",
                broker.dead_lettered,
            ),
        )
    )


# ------------------------------------------------------------------------------------------------------------ GM


class GMCollector(Collector):
    """A GM's queues, task counts, allocation times and fair-scheduling view, read from its core and job table.
    `stand_in` answers the service this GM runs for the previous GM while it stands in for it (or None)."""

    def __init__(self, service: GMService, stand_in: Callable[[], GMService | None]) -> None:
        self.service = service
        self.stand_in = stand_in

    def collect(self) -> Iterator[Metric]:
        own = _Identity("gm", self.service.settings.gm_id)
        yield from _service(own, self.service.broker)
        services = [self.service]
        if (other := self.stand_in()) is not None:
            services.append(other)
        families: dict[str, Metric] = {}
        for service in services:
            for family in _gm_families(service):
                if family.name in families:
                    families[family.name].samples.extend(family.samples)
                else:
                    families[family.name] = family
        yield from families.values()


def tasks_per_queue(core: GlobalMaster) -> dict[str, tuple[int, int]]:
    """(pending, running) tasks of a GM core per queue: under fair scheduling each of its own queues (named after
    their users) and any other queue it holds tasks of; without, its one queue `default`. Pending tasks are queued,
    or parked because they fit nowhere in its view; running ones are placed and not yet ended."""
    book = core.book
    queues = [q.user for q in book.config.queues_of(core.gm_id)] if book is not None else [NO_QUEUE]

    def queue_of(user: str) -> str:
        return user if book is not None else NO_QUEUE

    pending: Counter[str] = Counter({q: 0 for q in queues})
    pending.update(queue_of(t.user) for t in core.queue)
    pending.update(queue_of(t.user) for parked in core.waiting.values() for t in parked)
    running: Counter[str] = Counter({q: 0 for q in queues})
    running.update(queue_of(p.task.user) for p in core.running.values())
    return {queue: (pending[queue], running[queue]) for queue in dict.fromkeys([*pending, *running])}


def queue_labels(config: FairnessConfig | None, user_labels: bool) -> Callable[[str], str]:
    """The `queue` label of a queue named after a user: the user itself with MEGHA_METRICS_USER_LABELS, else `#i`,
    the queue's place (from 1) in MEGHA_QUEUES, so that GET /metrics, which needs no login, names nobody."""
    if config is None or user_labels:
        return str
    numbers = {q.user: f"#{i}" for i, q in enumerate(config.queues, 1)}
    return lambda user: numbers.get(user, OTHER_QUEUE)


def _gm_families(service: GMService) -> Iterator[Metric]:
    core = service.core
    if core is None:
        return
    me = _Identity("gm", service.settings.gm_id)
    book = core.book
    label = queue_labels(book.config if book is not None else None, service.settings.metrics_user_labels)
    pending_family = me.gauge(
        "megha_gm_pending_tasks",
        "Tasks waiting at this GM per user queue: queued, or parked because they fit nowhere in its view.",
        ["queue"],
    )
    running_family = me.gauge("megha_gm_running_tasks", "Tasks of this GM placed and not yet ended.", ["queue"])
    labelled: dict[str, tuple[int, int]] = {}
    for queue, (pending, running) in tasks_per_queue(core).items():
        before = labelled.get(label(queue), (0, 0))
        labelled[label(queue)] = (before[0] + pending, before[1] + running)
    for queue, (pending, running) in labelled.items():
        pending_family.add(pending, queue)
        running_family.add(running, queue)
    yield pending_family.family
    yield running_family.family
    yield me.single(
        "megha_gm_unfinished_tasks", "Accepted tasks of this GM neither finished nor failed.", service.jobs.unfinished()
    )
    yield me.single(
        "megha_gm_serving", "1 while this GM identity serves; 0 while it changes hands.", 1 if service.serving else 0
    )
    yield me.single("megha_gm_term", "The term this GM identity was last claimed with at the LMs.", service.term)

    meter = service.meter.allocation
    histogram = HistogramMetricFamily(
        "megha_allocation_time_seconds",
        "Time from a task's arrival at the GM to each placement decision for it.",
        labels=["gm"],
    )
    cumulative, bounds = 0, []
    for bound, n in zip((*ALLOCATION_TIME_BUCKETS, float("inf")), meter.buckets):
        cumulative += n
        bounds.append((_le(bound), cumulative))
    histogram.add_metric([me.value], bounds, meter.sum)
    yield histogram
    yield from me.counters(
        (
            ("megha_task_attempts_total", "Scheduling attempts of this GM's tasks.", meter.attempts),
            (
                "megha_task_reschedules_total",
                "Times a task of this GM went back to wait because nothing fitted it.",
                core.reschedules,
            ),
            ("megha_task_retries_total", "Tasks of this GM run again because their worker was lost.", core.retries),
            (
                "megha_gm_repartitions_total",
                "Placements this GM decided on another GM's partition (repartition requests).",
                core.repartitions,
            ),
            (
                "megha_gm_inconsistencies_total",
                "Placements of this GM an LM rejected because the GM's view was stale.",
                core.inconsistencies,
            ),
            (
                "megha_gm_preemption_attempts_total",
                "Preemption requests this GM sent to LMs.",
                core.preemption_attempts,
            ),
            (
                "megha_gm_preempted_tasks_total",
                "Tasks of this GM stopped to make room for another user's task.",
                core.preempted,
            ),
            (
                "megha_gm_finished_jobs_dropped_total",
                "Finished jobs forgotten to keep the job table bounded (MEGHA_FINISHED_TASKS_KEPT).",
                service.jobs.dropped_jobs,
            ),
        )
    )
    preemptions = me.counter(
        "megha_gm_preemptions_total", "Tasks of other users stopped to make room for this GM's tasks.", ["reason"]
    )
    preemptions.add(core.preemptions, FAIR_SHARE)
    yield preemptions.family

    if book is None:
        return
    share = me.gauge("megha_queue_share", "A queue's configured share of the data centre (0..1).", ["queue"])
    usage = me.gauge(
        "megha_queue_usage",
        "A queue's consumption under the share policy, comparable to its share (exact for this GM's own queues, "
        "as last reported by the LMs for the others).",
        ["queue"],
    )
    resource_usage = me.gauge(
        "megha_queue_resource_usage",
        "Resources a queue's running tasks hold, in this GM's view.",
        ["queue", "resource"],
    )
    for q in book.config.queues:
        share.add(q.share, label(q.user))
        usage.add(book.consumption(q.user), label(q.user))
        for name, amount in zip(core.resource_names, book.usage(q.user)):
            resource_usage.add(amount, label(q.user), name)
    yield share.family
    yield usage.family
    yield resource_usage.family


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


# ------------------------------------------------------------------------------------------------------------ LM


class LMCollector(Collector):
    """An LM's nodes, free resources per partition and the events it decides (validation, repartition,
    preemption), read from its service and core."""

    def __init__(self, service: LMService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        service = self.service
        me = _Identity("lm", service.settings.lm_id)
        yield from _service(me, service.broker)
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
                    "Placements this LM rejected because the GM's view was stale (no resources, or node out of "
                    "service).",
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


# -------------------------------------------------------------------------------------------------------- worker


class WorkerCollector(Collector):
    """A worker agent's nodes and running tasks."""

    def __init__(self, agent: WorkerAgent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Metric]:
        agent = self.agent
        me = _Identity("worker", agent.settings.worker_id)
        yield from _service(me, agent.broker)
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


# ------------------------------------------------------------------------------------------------------- wiring


def gm_registry(service: GMService, stand_in: Callable[[], GMService | None] = lambda: None) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(GMCollector(service, stand_in))
    return registry


def lm_registry(service: LMService) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(LMCollector(service))
    return registry


def worker_registry(agent: WorkerAgent) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(WorkerCollector(agent))
    return registry


def mount_metrics(app: FastAPI, registry: CollectorRegistry) -> None:
    """GET /metrics: `registry` in Prometheus's text exposition format, unauthenticated like /healthz, and left
    out of the OpenAPI schema (it is not JSON)."""

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_PLAIN_0_0_4)
