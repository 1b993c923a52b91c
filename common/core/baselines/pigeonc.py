"""PigeonC, the constraint-aware Pigeon (constraint-aware paper, section 4.2): distributors and masters, sans-I/O.

Pigeon (Wang et al., SoCC 2019) splits the data centre into groups of workers, each owned by one master.
Distributors receive jobs and hand their tasks to masters; a master places a task only on a worker of its own
group, and queues it when none of them is free. PigeonC changes Pigeon in two ways (section 4.2):

* a distributor picks each task's master by weighted random choice, the weight of master i being `count_i(C)`,
  the number of workers in i's group that satisfy the task's placement constraints (the sum of the constraint
  set occurrences `cs_X` over the machine constraint sets X containing the task's set);
* no workers are reserved for short jobs. Weighted fair queuing between short and long jobs stays: a master
  schedules one task of a long job for every `fqw` tasks of short jobs, and a long job's task whenever no
  waiting short job's task can use the free resources.

Where the paper leaves a choice open we follow the authors' PigeonC simulator (public Python code, with
`Distributor` and `Master` classes over bit vectors), unless a point says otherwise:

* Groups: the data centre's nodes, LM by LM in LM-local order, are split into `masters` contiguous groups whose
  sizes differ by at most one (equal when the node count divides evenly, as 10,000 nodes over 100 masters do).
* Weights (`GroupCatalogue`): by default the paper's `count_i(C)`, restricted to nodes whose capacity covers the
  request (in slot mode all nodes have the same capacity, so this is exactly `count_i(C)`). The authors'
  simulator instead tallies constraint sets in a way that miscounts (weighting "published"); that tally, not
  the paper's count, is what reproduces the published PigeonC figures. A master of weight zero is never picked;
  a task of weight zero everywhere is refused at submission (`Unschedulable`).
* A distributor sends each master one `TaskBatch` per job, holding that job's tasks it chose the master for.
* Short or long is a property of the job, as in Pigeon: a job is long when its mean task duration exceeds
  `short_cutoff` (90.5811 s in Pigeon's simulator, the Yahoo-trace cutoff of Hawk and Eagle; the syn_* traces'
  1 s tasks are then all short, as the paper says).
* A master places an arriving task at once on a free worker of its group that can run it (Random or
  Minimum-Constraints choice, section 4.3, the strategies of Megha's GM), without looking at its queues;
  otherwise the task waits in the short or the long queue. A waiting task never fits any free worker (freed
  resources are offered to the queues first), so an arriving task only takes resources no waiting task could use.
* When workers report finished tasks, the master frees their resources and offers each freed node in turn to the
  waiting tasks, as the authors' simulator offers each idle worker: while some waiting task fits the node, it
  takes the oldest waiting short task that fits, except that the oldest fitting long task goes first once `fqw`
  short tasks have been dequeued since the last long one, or when no short task fits. Only dequeues count
  towards `fqw` (the authors' simulator lets `fqw` + 1 short tasks through; we keep the paper's wording). Since
  no waiting task fitted any free node before, no other node needs a look.
* Each master's workers are one `SimulatedExecution` (addressed as the worker pool of LM id = master id), so a
  task's path is submit -> distributor -> master -> worker, and a waiting task starts one worker -> master ->
  worker round trip (two hops) after the task it waited for ended, as in the authors' simulator. (That simulator
  has no submit hop but ends a job when its last completion reaches the distributor, one hop after the task
  ended, so job delays line up: three hops for a job that never waited, one task plus five for one that did.)

Observer hooks: `job_arrived`/`job_rejected` at the distributor (gm = distributor index); `attempt` when the
master tries a task (on arrival, and again when it dequeues it), `rescheduled` when it queues one; `decided`,
`lm_received` and `launched` together when the master places a task (the master plays both the GM's deciding
role and the LM's launching role); the worker pool reports `worker_received`, `started` and `finished`. A
`Placement` has lm = the master's index and node = the node's index in the whole data centre (the order above),
so `GroupCatalogue.group_of(node)` names the owning master. The distributor -> master hop therefore counts as
framework queuing in the allocation-time components, and master -> worker as communication.
"""

from __future__ import annotations

import random
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import add, sub

import numpy as np

from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.gm import Unschedulable
from megha.common.core.messages import (
    Output,
    Placement,
    Send,
    WorkerLaunch,
    WorkerReport,
    lm_address,
    worker_address,
)
from megha.common.core.observer import CoreObserver
from megha.common.core.placement.choice import ChoicePolicy, RandomChoice
from megha.common.core.placement.filters import explain_on_arrays
from megha.common.core.resources import Resources
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.core.view import PartitionView, covers

PIGEON_SHORT_CUTOFF = 90.5811
"""Seconds of mean task duration above which a job is long (Pigeon's simulator, after Hawk and Eagle)."""

Shape = tuple[int, Resources]


def distributor_address(distributor: int) -> str:
    return f"distributor/{distributor}"


def master_address(master: int) -> str:
    """A master sits where an LM would: its worker pool (a `SimulatedExecution`) reports to this address."""
    return lm_address(master)


def split_groups(cluster: ClusterSpec, masters: int) -> list[PartitionSpec]:
    """The data centre's nodes (LM by LM, in LM-local order) as `masters` contiguous groups of sizes differing by
    at most one; group m is labelled lm=m, gm=0."""
    capacities = [cap for lm in range(cluster.num_lms) for cap in cluster.lm_capacities(lm)]
    masks = [mask for lm in range(cluster.num_lms) for mask in cluster.lm_constraint_masks(lm)]
    if not 1 <= masters <= len(capacities):
        raise ValueError(f"PigeonC needs 1..{len(capacities)} masters for {len(capacities)} nodes, got {masters}")
    size, extra = divmod(len(capacities), masters)
    groups, start = [], 0
    for m in range(masters):
        end = start + size + (m < extra)
        groups.append(PartitionSpec(m, 0, tuple(capacities[start:end]), tuple(masks[start:end])))
        start = end
    return groups


@dataclass(slots=True)
class TaskBatch:
    """Distributor -> master: tasks of one job for the master's group. `long` says the job is a long one."""

    distributor: int
    master: int
    long: bool
    tasks: list[TaskSpec]


WEIGHTINGS = ("satisfying", "published")


class GroupCatalogue:
    """What every distributor knows: the machine constraints and capacities of each master's group (the paper's
    constraint set occurrences CS_i), and from them the weights of the masters for a task's shape.

    `weighting` "satisfying" (the paper's `count_i(C)`): a master's weight is how many nodes of its group satisfy
    the constraints and have the capacity for the request. "published": the tally of the simulator behind the
    published PigeonC figures. It visits a group's workers in order; a worker whose machine constraint set is
    contained in sets already recorded adds one to each of those, otherwise its own set is recorded with a count
    of one; the weight is the sum of the counts of the recorded sets that contain the task's constraints. That
    counts a worker once per containing recorded set, and under a recorded superset of the task's constraints
    even when the worker itself lacks some of them, so rare constraints are spread over groups with few nodes
    that satisfy them. A master with no node that could ever run the task (constraints and capacity on the same
    node) has weight zero either way.
    """

    def __init__(
        self, groups: Sequence[PartitionSpec], resource_names: tuple[str, ...], weighting: str = "satisfying"
    ) -> None:
        if weighting not in WEIGHTINGS:
            raise ValueError(f"unknown PigeonC weighting {weighting!r}; choose one of {', '.join(WEIGHTINGS)}")
        self.resource_names = resource_names
        self.weighting = weighting
        self.firsts = list(accumulate((spec.size for spec in groups[:-1]), initial=0))
        self._starts = np.array(self.firsts, dtype=np.int64)
        self._masks = np.array([m for spec in groups for m in spec.constraint_masks], dtype=np.int64)
        self._capacities = np.array([c for spec in groups for c in spec.capacities], dtype=np.int64)
        tallies = [_published_tally(spec.constraint_masks) for spec in groups]
        self._tally_starts = np.array(list(accumulate((len(t) for t in tallies[:-1]), initial=0)), dtype=np.int64)
        self._tally_sets = np.array([m for t in tallies for m in t], dtype=np.int64)
        self._tally_counts = np.array([n for t in tallies for n in t.values()], dtype=np.int64)
        self._fits: dict[Resources, np.ndarray] = {}
        self._weights: dict[Shape, tuple[list[int], list[int]]] = {}
        self._reasons: dict[Shape, str | None] = {}

    def weights(self, shape: Shape) -> tuple[list[int], list[int]]:
        """(masters of non-zero weight, cumulative weights) for tasks of `shape`."""
        cached = self._weights.get(shape)
        if cached is None:
            mask, request = shape
            counts = np.add.reduceat(
                (self._fitting(request) & (self._masks & mask == mask)).astype(np.int64), self._starts
            )
            if self.weighting == "published":
                suitable = counts > 0
                counts = np.add.reduceat(
                    np.where(self._tally_sets & mask == mask, self._tally_counts, 0), self._tally_starts
                )
                counts[~suitable] = 0
            masters = np.flatnonzero(counts)
            cached = self._weights[shape] = (masters.tolist(), np.cumsum(counts[masters]).tolist())
        return cached

    def _fitting(self, request: Resources) -> np.ndarray:
        """Which nodes have the capacity for `request`."""
        fits = self._fits.get(request)
        if fits is None:
            fits = self._fits[request] = np.asarray((self._capacities >= np.array(request, dtype=np.int64)).all(axis=1))
        return fits

    def unschedulable_reason(self, task: TaskSpec) -> str | None:
        """Why no node of the data centre could ever run `task`, or None when some node could."""
        shape = (task.constraints, task.request)
        if shape not in self._reasons:
            self._reasons[shape] = explain_on_arrays(task, self.resource_names, self._masks, self._fitting)
        return self._reasons[shape]

    def group_of(self, node: int) -> int:
        """The master whose group holds data-centre node `node`."""
        return bisect_right(self.firsts, node) - 1


def _published_tally(masks: Sequence[int]) -> dict[int, int]:
    """The constraint-set tally of the published simulator's distributors (see `GroupCatalogue`)."""
    tally: dict[int, int] = {}
    for mask in masks:
        containing = [recorded for recorded in tally if mask & ~recorded == 0]
        for recorded in containing:
            tally[recorded] += 1
        if not containing:
            tally[mask] = 1
    return tally


class Distributor:
    """Distributor `distributor_id`: refuses jobs no node could run, classifies each job short or long, and sends
    every task to a master picked at random, weighted by the master's suitable nodes."""

    def __init__(
        self,
        distributor_id: int,
        catalogue: GroupCatalogue,
        short_cutoff: float = PIGEON_SHORT_CUTOFF,
        seed: int = 0,
        observer: CoreObserver | None = None,
    ) -> None:
        self.distributor_id = distributor_id
        self.catalogue = catalogue
        self.short_cutoff = short_cutoff
        self.observer = observer or CoreObserver()
        self.rng = random.Random(f"pigeonc-distributor:{seed}:{distributor_id}")
        self.long_tasks = 0

    def submit(self, job: JobSpec, now: float) -> list[Output]:
        """Spread `job`'s tasks over masters, or raise Unschedulable naming a task no worker could ever run."""
        catalogue = self.catalogue
        for task in job.tasks:
            reason = catalogue.unschedulable_reason(task)
            if reason is not None:
                self.observer.job_rejected(job, self.distributor_id, reason, now)
                raise Unschedulable(f"job {job.job_id}: task {task.task_id}: {reason}")
        self.observer.job_arrived(job, self.distributor_id, now)
        tasks = job.tasks
        long = bool(tasks) and sum(t.duration for t in tasks) / len(tasks) > self.short_cutoff
        if long:
            self.long_tasks += len(tasks)
        randrange = self.rng.randrange
        weights = catalogue.weights
        per_master: dict[int, list[TaskSpec]] = {}
        for task in tasks:
            masters, cumulative = weights((task.constraints, task.request))
            master = masters[bisect_right(cumulative, randrange(cumulative[-1]))]
            batch = per_master.get(master)
            if batch is None:
                per_master[master] = [task]
            else:
                batch.append(task)
        return [
            Send(master_address(m), TaskBatch(self.distributor_id, m, long, batch)) for m, batch in per_master.items()
        ]


class _WaitQueue:
    """Tasks of one class (short or long jobs) waiting at a master: FIFO per shape, and the shapes ordered by the
    arrival number of their oldest task, so the oldest task a node can run is found by a scan that stops at the
    first shape the node can take."""

    __slots__ = ("by_shape", "count", "order")

    def __init__(self) -> None:
        self.by_shape: dict[Shape, deque[tuple[int, TaskSpec]]] = {}
        self.order: list[tuple[int, Shape]] = []  # (arrival number of the shape's oldest task, shape), sorted
        self.count = 0

    def push(self, seq: int, task: TaskSpec) -> None:
        shape = (task.constraints, task.request)
        waiting = self.by_shape.get(shape)
        if waiting is None:
            self.by_shape[shape] = deque(((seq, task),))
            insort(self.order, (seq, shape))
        else:
            waiting.append((seq, task))
        self.count += 1

    def oldest_fitting(self, node_mask: int, free: Resources) -> Shape | None:
        """The shape of the oldest waiting task a node with machine constraints `node_mask` and `free` resources
        can run."""
        for _, shape in self.order:
            if shape[0] & ~node_mask == 0 and covers(free, shape[1]):
                return shape
        return None

    def pop(self, shape: Shape) -> TaskSpec:
        waiting = self.by_shape[shape]
        seq, task = waiting.popleft()
        order = self.order
        del order[bisect_left(order, (seq, shape))]
        if waiting:
            insort(order, (waiting[0][0], shape))
        else:
            del self.by_shape[shape]
        self.count -= 1
        return task

    def tasks(self) -> list[TaskSpec]:
        return [task for _, task in sorted(item for waiting in self.by_shape.values() for item in waiting)]


class Master:
    """Master `master_id`: the authoritative free resources of its group, placement of arriving tasks, and the
    short and long queues it fills freed resources from by weighted fair queuing."""

    def __init__(
        self,
        master_id: int,
        group: PartitionSpec,
        first: int,
        choice: ChoicePolicy | None = None,
        fqw: int = 20,
        seed: int = 0,
        observer: CoreObserver | None = None,
    ) -> None:
        if fqw < 1:
            raise ValueError(f"fair queue weight must be at least 1, got {fqw}")
        self.master_id = master_id
        self.view = PartitionView(group, first)
        self.choice = choice or RandomChoice()
        self.fqw = fqw
        self.observer = observer or CoreObserver()
        self.rng = random.Random(f"pigeonc-master:{seed}:{master_id}")
        self.short = _WaitQueue()
        self.long = _WaitQueue()
        self.running: dict[str, tuple[int, Resources]] = {}  # task id -> (group-local node, request)
        self._arrivals = 0
        self._short_streak = 0  # short tasks dequeued since the last long one
        self.queued = 0  # tasks that waited in a queue
        self.long_turns = 0  # long tasks dequeued while a short task could have used the resources

    def handle(self, msg: object, now: float) -> list[Output]:
        if isinstance(msg, TaskBatch):
            return self._on_tasks(msg, now)
        if isinstance(msg, WorkerReport):
            return self._on_report(msg, now)
        raise TypeError(f"PigeonC master cannot handle {type(msg).__name__}")

    def _on_tasks(self, msg: TaskBatch, now: float) -> list[Output]:
        view = self.view
        observer = self.observer
        queue = self.long if msg.long else self.short
        launches: list[Placement] = []
        for task in msg.tasks:
            self._arrivals += 1
            observer.attempt(task, now)
            candidates = view.matching(task.constraints) & view.fitting(task.request)
            if candidates:
                launches.append(self._place(task, candidates))
            else:
                queue.push(self._arrivals, task)
                self.queued += 1
                observer.rescheduled(task, now)
        return self._launch(launches, now)

    def _on_report(self, msg: WorkerReport, now: float) -> list[Output]:
        view = self.view
        running = self.running
        freed: dict[int, None] = {}
        for finished in msg.finished:
            i, request = running.pop(finished.task_id)
            view.set_free(i, tuple(map(add, view.free[i], request)))
            freed[i] = None
        launches: list[Placement] = []
        if self.short.count or self.long.count:
            for i in freed:
                self._offer(i, launches, now)
        return self._launch(launches, now)

    def _offer(self, i: int, launches: list[Placement], now: float) -> None:
        """Place waiting tasks on freed node `i` while one fits: short first, one long task per `fqw` short ones,
        and a long one whenever no short one fits. No other node needs a look: no waiting task fitted any free
        node before `i` was freed."""
        view = self.view
        node_mask = view.masks[i]
        short, long = self.short, self.long
        while short.count or long.count:
            free = view.free[i]
            if not all(free):
                return  # every request asks for some of each resource
            oldest_short = short.oldest_fitting(node_mask, free) if short.count else None
            oldest_long = long.oldest_fitting(node_mask, free) if long.count else None
            if oldest_long is not None and (oldest_short is None or self._short_streak >= self.fqw):
                if oldest_short is not None:
                    self.long_turns += 1
                self._short_streak = 0
                task = long.pop(oldest_long)
            elif oldest_short is not None:
                self._short_streak += 1
                task = short.pop(oldest_short)
            else:
                return
            self.observer.attempt(task, now)
            launches.append(self._place_on(task, i))

    def _place(self, task: TaskSpec, candidates: int) -> Placement:
        return self._place_on(task, self.choice.choose(self.view, candidates, self.rng, task))

    def _place_on(self, task: TaskSpec, i: int) -> Placement:
        view = self.view
        view.set_free(i, tuple(map(sub, view.free[i], task.request)))
        self.running[task.task_id] = (i, task.request)
        return Placement(task, self.master_id, view.start + i, False)

    def _launch(self, launches: list[Placement], now: float) -> list[Output]:
        if not launches:
            return []
        observer = self.observer
        observer.decided(launches, now)
        observer.lm_received(launches, now)
        observer.launched(launches, now)
        return [Send(worker_address(self.master_id), WorkerLaunch(self.master_id, launches))]

    def waiting_tasks(self) -> list[TaskSpec]:
        """Tasks still queued: short ones, then long ones, each in arrival order."""
        return [*self.short.tasks(), *self.long.tasks()]
