"""Sparrow (Ousterhout et al., SOSP 2013) as sans-I/O cores: schedulers that batch-sample workers with a probe
ratio and bind tasks late, and worker pools that queue the schedulers' reservations.

How a job is scheduled:

1. A scheduler receives a job. It groups the job's tasks by shape (placement constraints, request); tasks of one
   shape are interchangeable, so each group is batch-sampled as Sparrow samples a whole job: for a group of k
   tasks it places ceil(d * k) reservations (d = probe ratio) on distinct workers drawn uniformly at random
   from the workers that satisfy the group's constraints and whose capacity could ever hold its request. With
   no constraints and one request per job (slot mode) that is exactly Sparrow's d * m probes per job; with
   constraints it is Sparrow's per-task constraint handling (probe only workers satisfying the task's
   constraints), batched over identical tasks. When fewer than ceil(d * k) workers are eligible, every
   eligible worker is probed once; when even fewer than k are eligible, k reservations are spread over them as
   evenly as possible (a worker then holds several reservations of the job), so every task has a reservation.
2. A probe places a reservation (job, group, request) at the tail of the worker's FIFO queue.
3. When a reservation is at the head of its worker's queue and the worker's free resources cover the group's
   request, the worker sets that request aside and sends getTask to the scheduler (late binding).
4. The scheduler answers with the job's next unlaunched task of that group, or, when the group has none left,
   of another group of the job with the same request whose constraints the worker satisfies (Sparrow shares
   information across tasks when constraints allow). When no such task is left it answers no-op and the
   worker returns the resources it set aside and serves its next reservation. A scheduler forgets a job once
   all its tasks are launched; getTask for a forgotten job gets a no-op.

Assumptions (stated because the papers leave them open, or because our setting differs):

* Timing. Every message is one hop of the transport (`EmbeddedConfig.hop_delay`, 0.5 ms by default), as in the
  Sparrow simulator the Megha paper used (constant network delay, queuing only at workers, no processing
  cost). So on an idle cluster a task starts three hops after the job reaches its scheduler (probe, getTask,
  task), against Megha's two (GM -> LM -> worker). The Megha paper set the task-launch hop to Megha's measured
  median launch transfer time; on our virtual clock Megha's launch hop is `hop_delay` too, so they agree.
* No proactive cancellation: surplus reservations are answered with no-ops when they reach the head of their
  queue (as in the Sparrow simulator), each holding its worker's resources for a getTask round trip.
* Resources instead of slots. A worker is a node with free resources. In slot mode a task requests the whole
  node, so a node runs one task at a time (one slot per worker). In scaled mode tasks share a node: several
  reservations may be in their getTask round trip on one node at once, as long as the resources set aside for
  them fit. The queue is FIFO: a head reservation whose request does not fit waits, blocking the ones behind it
  (Sparrow's worker queues are FIFO; we add no backfilling).
* Different requests within a job: tasks with different requests are in different groups, sampled separately;
  a getTask is only answered with a task of the reservation's request, so a worker always holds exactly the
  resources of the task it runs.
* Worker pools: the transport delivers per address, so all worker nodes of one LM share one endpoint
  (`sparrow_worker_address(lm)`), each node with its own queue and free resources, as `SimulatedExecution` does.
  Messages between a pool and a scheduler that leave at the same instant travel together; this changes no
  timing. Workers report no completions to schedulers: Sparrow's schedulers keep no worker state.
* Unschedulable tasks (no eligible worker) are refused at submission with the reason, like Megha's GM does.

Observer hooks, so that allocation time and its components mean the same as for Megha:
`job_arrived` when the scheduler gets the job; `attempt` for each task when the job's probes are sent;
`decided` when getTask binds the task to a worker; `lm_received`, `launched`, `worker_received` and `started`
when the bound task reaches its worker (it starts at once; the node's LM and LM-local index name the worker,
`repartition` is always False); `finished` when it ends. Hence framework queuing is zero, "processing"
(decided - attempt) is the probe hop, the reservation's wait in the worker queue and the getTask hop (with late
binding a task is not at any worker while its reservation waits), communication is the one hop of the task to
the worker, and worker queuing is zero.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from operator import add, ge, sub

import numpy as np

from megha.common.core.cluster import ClusterSpec
from megha.common.core.gm import Unschedulable
from megha.common.core.messages import FinishTick, Output, Placement, Send, Wake
from megha.common.core.observer import CoreObserver
from megha.common.core.placement.filters import explain_on_arrays
from megha.common.core.resources import Resources
from megha.common.core.task import JobSpec, TaskSpec

Node = tuple[int, int]  # (lm, LM-local node index)


def sparrow_scheduler_address(scheduler: int) -> str:
    return f"sparrow/{scheduler}"


def sparrow_worker_address(lm: int) -> str:
    return f"sparrow-worker/{lm}"


@dataclass(slots=True, eq=False)
class Reservation:
    """A placeholder for one task of group `group` of job `job_id`, queued at a worker. All reservations of a
    group are the same object."""

    scheduler: int
    job_id: str
    group: int
    constraints: int
    request: Resources


@dataclass(slots=True)
class Probe:
    """Scheduler -> worker pool of one LM: enqueue these reservations (Sparrow's enqueueTaskReservations)."""

    lm: int
    reservations: list[tuple[int, Reservation]]


@dataclass(slots=True)
class GetTask:
    """Worker pool -> scheduler: these nodes reached these reservations and have set their requests aside."""

    lm: int
    requests: list[tuple[int, Reservation]]


@dataclass(slots=True)
class TaskReply:
    """Scheduler -> worker pool: tasks bound to nodes, and no-ops for reservations with no task left."""

    lm: int
    launches: list[Placement]
    noops: list[tuple[int, Reservation]]


class EligibleNodes:
    """Static knowledge of the workers a scheduler may probe: for each task shape (constraints, request), the
    workers whose machine constraints include the task's and whose capacity covers its request.

    Machine constraints are too varied for classes of identical nodes to help (the reference cluster's 10,000
    nodes have over 8,000 distinct constraint masks), so a shape's eligible workers are found by one vectorised
    pass over per-node arrays and kept in a small cache that evicts the least recently used shape (jobs repeat
    common shapes; a cache of every shape would hold tens of thousands of node arrays).
    """

    def __init__(self, cluster: ClusterSpec, cache_size: int = 256) -> None:
        self.resource_names = cluster.resource_names
        self.masks: list[list[int]] = [cluster.lm_constraint_masks(lm) for lm in range(cluster.num_lms)]
        self.nodes: list[Node] = [(lm, node) for lm in range(cluster.num_lms) for node in range(len(self.masks[lm]))]
        self._masks = np.array([m for masks in self.masks for m in masks], dtype=np.int64)
        self._capacities = np.array(
            [cap for lm in range(cluster.num_lms) for cap in cluster.lm_capacities(lm)], dtype=np.int64
        ).reshape(len(self.nodes), len(self.resource_names))
        self._smallest = tuple(self._capacities.min(axis=0).tolist())
        self._fitting: dict[Resources, np.ndarray] = {}
        self._cache: dict[tuple[int, Resources | None], np.ndarray] = {}
        self._cache_size = cache_size

    def eligible(self, constraints: int, request: Resources) -> np.ndarray:
        """Indices into `nodes` of the workers that could ever run a task of this shape (empty when none)."""
        fits_all = all(map(ge, self._smallest, request))
        shape = (constraints, None if fits_all else request)  # only constraints matter when every node fits
        cache = self._cache
        found = cache.pop(shape, None)
        if found is None:
            ok = (self._masks & constraints) == constraints
            if not fits_all:
                ok &= self._fitting_nodes(request)
            found = np.flatnonzero(ok)
            if len(cache) >= self._cache_size:
                del cache[next(iter(cache))]
        cache[shape] = found
        return found

    def _fitting_nodes(self, request: Resources) -> np.ndarray:
        """Boolean array: the nodes whose capacity covers `request` (requests are few: cached, bounded)."""
        fitting = self._fitting.get(request)
        if fitting is None:
            if len(self._fitting) >= self._cache_size:
                self._fitting.clear()
            fitting = np.asarray((self._capacities >= np.array(request, dtype=np.int64)).all(axis=1))
            self._fitting[request] = fitting
        return fitting

    def unschedulable_reason(self, task: TaskSpec) -> str | None:
        """Why no worker could ever run `task`, or None when some worker could (the GM's feasibility filters)."""
        return explain_on_arrays(task, self.resource_names, self._masks, self._fitting_nodes)


class _Job:
    """A scheduler's state of one job: its unlaunched tasks per group, and the groups per request."""

    __slots__ = ("by_request", "groups", "unlaunched")

    def __init__(self, groups: list[list[TaskSpec]]) -> None:
        self.groups = [deque(tasks) for tasks in groups]
        self.unlaunched = sum(len(tasks) for tasks in groups)
        self.by_request: dict[Resources, list[int]] = {}
        for g, tasks in enumerate(groups):
            self.by_request.setdefault(tasks[0].request, []).append(g)

    def take(self, res: Reservation, node_mask: int) -> TaskSpec | None:
        """The next unlaunched task of the reservation's group, else of a same-request group whose constraints
        the node satisfies; None when there is none."""
        groups = self.groups
        tasks = groups[res.group]
        if not tasks:
            live = self.by_request[res.request] = [g for g in self.by_request[res.request] if groups[g]]
            for g in live:
                if not groups[g][0].constraints & ~node_mask:
                    tasks = groups[g]
                    break
            else:
                return None
        self.unlaunched -= 1
        return tasks.popleft()


class SparrowScheduler:
    """Sparrow scheduler `scheduler_id`: probes workers for each submitted job and binds tasks to the workers
    that ask for them."""

    def __init__(
        self,
        scheduler_id: int,
        eligible: EligibleNodes,
        probe_ratio: float = 2.0,
        seed: int = 0,
        observer: CoreObserver | None = None,
    ) -> None:
        if probe_ratio < 1:
            raise ValueError(f"probe ratio must be at least 1, got {probe_ratio}")
        self.scheduler_id = scheduler_id
        self.eligible_nodes = eligible
        self.probe_ratio = probe_ratio
        self.observer = observer or CoreObserver()
        self.rng = random.Random(seed * 1_000_003 + scheduler_id)
        self.jobs: dict[str, _Job] = {}
        self.probes = 0
        self.get_task_requests = 0
        self.noops = 0

    def submit(self, job: JobSpec, now: float) -> list[Output]:
        """Accept a job and probe workers for it, or raise Unschedulable naming the task no worker could run."""
        shapes: dict[tuple[int, Resources], list[TaskSpec]] = {}
        for task in job.tasks:
            shapes.setdefault((task.constraints, task.request), []).append(task)
        groups = list(shapes.values())
        for tasks in groups:  # a failing shape's first task is the job's first failing task
            reason = self.eligible_nodes.unschedulable_reason(tasks[0])
            if reason is not None:
                self.observer.job_rejected(job, self.scheduler_id, reason, now)
                raise Unschedulable(f"job {job.job_id}: task {tasks[0].task_id}: {reason}")
        self.observer.job_arrived(job, self.scheduler_id, now)
        if not groups:
            return []
        self.jobs[job.job_id] = _Job(groups)
        per_lm: dict[int, list[tuple[int, Reservation]]] = {}
        attempt = self.observer.attempt
        for g, tasks in enumerate(groups):
            constraints, request = tasks[0].constraints, tasks[0].request
            res = Reservation(self.scheduler_id, job.job_id, g, constraints, request)
            for lm, node in self._sample(self.eligible_nodes.eligible(constraints, request), len(tasks)):
                batch = per_lm.get(lm)
                if batch is None:
                    per_lm[lm] = [(node, res)]
                else:
                    batch.append((node, res))
            for task in tasks:
                attempt(task, now)
        out: list[Output] = []
        for lm, reservations in per_lm.items():
            self.probes += len(reservations)
            out.append(Send(sparrow_worker_address(lm), Probe(lm, reservations)))
        return out

    def _sample(self, eligible: np.ndarray, tasks: int) -> list[Node]:
        """ceil(d * tasks) distinct workers at random; all of them when fewer are eligible; at least `tasks`
        reservations, spread evenly, when fewer than `tasks` are eligible."""
        n = len(eligible)
        wanted = min(math.ceil(self.probe_ratio * tasks), max(tasks, n))
        picks = eligible[self.rng.sample(range(n), wanted % n if wanted > n else wanted)].tolist()
        if wanted > n:
            picks = eligible.tolist() * (wanted // n) + picks
        nodes = self.eligible_nodes.nodes
        return [nodes[i] for i in picks]

    def handle(self, msg: object, now: float) -> list[Output]:
        """Answer a worker pool's getTask requests with bound tasks or no-ops."""
        if not isinstance(msg, GetTask):
            raise TypeError(f"Sparrow scheduler cannot handle {type(msg).__name__}")
        jobs = self.jobs
        masks = self.eligible_nodes.masks[msg.lm]
        launches: list[Placement] = []
        noops: list[tuple[int, Reservation]] = []
        for node, res in msg.requests:
            job = jobs.get(res.job_id)
            task = None if job is None else job.take(res, masks[node])
            if task is None:
                noops.append((node, res))
                continue
            launches.append(Placement(task, msg.lm, node, False))
            if not jobs[res.job_id].unlaunched:
                del jobs[res.job_id]
        self.get_task_requests += len(msg.requests)
        self.noops += len(noops)
        if launches:
            self.observer.decided(launches, now)
        return [Send(sparrow_worker_address(msg.lm), TaskReply(msg.lm, launches, noops))]

    def unlaunched_tasks(self) -> list[TaskSpec]:
        return [t for job in self.jobs.values() for tasks in job.groups for t in tasks]


class SparrowWorkers:
    """The worker nodes of LM `lm_id`: a FIFO reservation queue and free resources per node. Runs bound tasks
    for their duration (simulated execution) and asks schedulers for tasks as reservations reach the head."""

    def __init__(self, cluster: ClusterSpec, lm_id: int, observer: CoreObserver | None = None) -> None:
        self.lm_id = lm_id
        self.observer = observer or CoreObserver()
        self.capacity: list[Resources] = cluster.lm_capacities(lm_id)
        self.free: list[Resources] = list(self.capacity)
        self.queues: list[deque[Reservation]] = [deque() for _ in self.capacity]
        self._finishing: dict[float, list[tuple[int, TaskSpec]]] = {}
        self.running = 0

    def handle(self, msg: object, now: float) -> list[Output]:
        if isinstance(msg, Probe):
            return self._on_probe(msg)
        if isinstance(msg, TaskReply):
            return self._on_reply(msg, now)
        if isinstance(msg, FinishTick):
            return self._on_finish(msg, now)
        raise TypeError(f"Sparrow worker cannot handle {type(msg).__name__}")

    def _on_probe(self, msg: Probe) -> list[Output]:
        queues = self.queues
        touched = []
        for node, res in msg.reservations:
            queue = queues[node]
            if not queue:
                touched.append(node)
            queue.append(res)
        return self._serve(touched)

    def _on_reply(self, msg: TaskReply, now: float) -> list[Output]:
        out: list[Output] = []
        launches = msg.launches
        if launches:
            observer = self.observer
            observer.lm_received(launches, now)
            observer.launched(launches, now)
            observer.worker_received(launches, now)
            observer.started(launches, now)
            finishing = self._finishing
            for p in launches:
                at = now + p.task.duration
                batch = finishing.get(at)
                if batch is None:
                    finishing[at] = [(p.node, p.task)]
                    out.append(Wake(at, sparrow_worker_address(self.lm_id), FinishTick(at)))
                else:
                    batch.append((p.node, p.task))
            self.running += len(launches)
        if msg.noops:
            free = self.free
            for node, res in msg.noops:
                free[node] = tuple(map(add, free[node], res.request))
            out.extend(self._serve([node for node, _ in msg.noops]))
        return out

    def _on_finish(self, tick: FinishTick, now: float) -> list[Output]:
        finished = self._finishing.pop(tick.at)
        free = self.free
        for node, task in finished:
            free[node] = tuple(map(add, free[node], task.request))
        self.running -= len(finished)
        self.observer.finished([task.task_id for _, task in finished], now)
        return self._serve([node for node, _ in finished])

    def _serve(self, nodes: list[int]) -> list[Output]:
        """For each node, set aside resources for the reservations at the head of its queue while they fit, and
        ask their schedulers for tasks (one message per scheduler)."""
        queues, free = self.queues, self.free
        asks: dict[int, list[tuple[int, Reservation]]] = {}
        for node in nodes:
            queue = queues[node]
            while queue and all(map(ge, free[node], queue[0].request)):
                res = queue.popleft()
                free[node] = tuple(map(sub, free[node], res.request))
                batch = asks.get(res.scheduler)
                if batch is None:
                    asks[res.scheduler] = [(node, res)]
                else:
                    batch.append((node, res))
        return [Send(sparrow_scheduler_address(s), GetTask(self.lm_id, requests)) for s, requests in asks.items()]

    def queued_reservations(self) -> int:
        return sum(len(q) for q in self.queues)

    def running_tasks(self) -> list[TaskSpec]:
        return [task for batch in self._finishing.values() for _, task in batch]

    def is_idle(self) -> bool:
        """No reservation queued, no task running, every node's resources back."""
        return not self.running and not self.queued_reservations() and self.free == self.capacity
