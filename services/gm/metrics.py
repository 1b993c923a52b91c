"""What a GM counts and reports on GET /metrics: its `GMMeter` (scheduling attempts, the allocation-time
histogram) beside the job table, and its registry (`gm_registry`), which reads its queues, task counts and
fair-scheduling view from its core and job table when Prometheus scrapes (docs/metrics.md)."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric

from megha.common.core.lifecycle import State
from megha.common.core.messages import Placement
from megha.common.core.observer import CoreObserver
from megha.common.core.task import TaskSpec
from megha.services.metrics import FAIR_SHARE, Identity, registry_of

if TYPE_CHECKING:
    from megha.common.core.fairness.config import FairnessConfig
    from megha.common.core.gm import GlobalMaster
    from megha.services.gm.jobs import JobTable
    from megha.services.gm.service import GMService

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


def gm_registry(service: GMService, stand_in: Callable[[], GMService | None] = lambda: None) -> CollectorRegistry:
    """A GM's queues, task counts, allocation times and fair-scheduling view, read from its core and job table.
    `stand_in` answers the service this GM runs for the previous GM while it stands in for it (or None), whose
    families join this GM's under that GM's identity."""

    def families(me: Identity) -> Iterator[Metric]:
        services = [service]
        if (other := stand_in()) is not None:
            services.append(other)
        merged: dict[str, Metric] = {}
        for held in services:
            for family in _gm_families(held):
                if family.name in merged:
                    merged[family.name].samples.extend(family.samples)
                else:
                    merged[family.name] = family
        yield from merged.values()

    return registry_of(Identity("gm", service.settings.gm_id), service, families)


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
    me = Identity("gm", service.settings.gm_id)
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
    yield me.single(
        "megha_gm_unreachable_lms",
        "LMs this GM cannot reach: out of its view until they answer their health check again.",
        len(service.dispatch.watch.down),
    )
    journal = service.journal
    yield me.single(
        "megha_gm_journal_failing",
        "1 while the last write or sync of this GM's journal failed (a full or read-only disk: submissions refused).",
        1 if journal is not None and journal.failing else 0,
    )
    yield me.single(
        "megha_gm_lms_with_other_layout",
        "LMs that restarted with another layout than this GM places by: out of its view until they run as before.",
        len(service.dispatch.watch.other_layout),
    )

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
                "megha_task_failures_retried_total",
                "Failed runs of this GM's tasks run again under their job's retry rule.",
                core.failures_retried,
            ),
            (
                "megha_gm_ignored_run_ends_total",
                "Reports of a run's end this GM ignored: repeats and copies of an earlier run's end.",
                core.ignored_run_ends,
            ),
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
            (
                "megha_gm_ignored_broker_messages_total",
                "Messages on this GM's queue ignored as not signed for it by the LM they name (docs/security.md).",
                service.lm_reports.ignored.count,
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
