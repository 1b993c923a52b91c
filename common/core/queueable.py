"""Queueable (opportunistic) tasks: the per-node queue a worker runs, the LM's admission of queueable placements and
the GM's opportunistic placement (Mercury, section 3: QUEUEABLE containers; docs/queueable.md).

A queueable task may be sent to a node beyond the node's free resources. There it waits in the node's FIFO queue
until it fits beside what runs, and a guaranteed (non-queueable) task that does not fit beside the running
queueable ones evicts the newest of them, so a guaranteed task never waits for a queueable one. Evicted runs are
reported preempted, and their GM queues them again.

* `NodeQueues` (worker side, sans-I/O): per node, the guaranteed runs, the running queueable runs in start order
  and the FIFO of waiting ones; every launch and end returns which runs start and which are evicted. The simulated
  worker (`common/core/worker.py`) and the real worker agent (`services/worker/agent.py`) both run it.
* `QueueAdmission` (LM side): a queueable placement is checked against the node's constraints, driver and
  capacity but not its free resources, is not deducted from the free resources GMs see, and at most
  `per_node` queueable runs are held per node ("queue full" is an inconsistency: the GM tries elsewhere).
* `OpportunisticPlacer` (GM side): a queueable task that fits nowhere in the view goes to a feasible node
  (constraints, driver, capacity) holding the fewest of this GM's queueable runs, under the bound.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from operator import add, le, sub
from typing import TypeVar

from megha.common.core.global_view import GlobalView
from megha.common.core.messages import Placement, Rejection
from megha.common.core.placement.choice import ChoicePolicy
from megha.common.core.placement.feasibility import ever_feasible_nodes
from megha.common.core.resources import Resources, describe
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.core.view import PartitionView

QUEUEABLE_PER_NODE = 4
"""Default bound on the queueable runs (waiting or running) an LM holds per node (MEGHA_QUEUEABLE_PER_NODE)."""

QUEUE_FULL = "queue full"
"""How an LM's rejection of a queueable placement on a node whose queue is full begins."""

REFUSED_HOLD_SECONDS = 1.0
"""How long a GM avoids, for queueable tasks, a node whose LM refused one (queue full, or down)."""


# ------------------------------------------------------------------------------------------------ worker side


@dataclass(slots=True)
class Moves:
    """What a launch or an end changes on a node: the runs that start now (the launched run itself when it starts
    at once, then queued ones in FIFO order) and the running queueable runs to stop (newest first)."""

    started: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Node:
    """One node: the guaranteed runs, the running queueable runs (start order) and the waiting ones (arrival
    order), each with its request; `held` is what the guaranteed and running queueable runs hold together."""

    capacity: Resources
    held: Resources
    guaranteed: dict[str, Resources] = field(default_factory=dict)
    running: dict[str, Resources] = field(default_factory=dict)
    waiting: dict[str, Resources] = field(default_factory=dict)


class NodeQueues:
    """The opportunistic queues of a worker's nodes (sans-I/O). Invariants, after every call:

    1. a guaranteed run starts when launched (it never waits, whatever queueable runs hold);
    2. guaranteed plus running queueable runs fit the node's capacity, unless the guaranteed ones alone exceed it
       (the LM never places so; then no queueable run runs there);
    3. waiting runs start in arrival order (FIFO per node), and the head of a node's queue does not fit beside
       what runs (nothing that could run waits);
    4. a guaranteed launch evicts running queueable runs newest first, only as many as it needs."""

    def __init__(self, capacity: Callable[[int], Resources]) -> None:
        """`capacity(node)`: the node's capacity (aligned to the request vectors)."""
        self._capacity = capacity
        self._nodes: dict[int, _Node] = {}
        self._where: dict[str, int] = {}  # run -> its node

    def launch(self, node: int, run: str, request: Resources, queueable: bool) -> Moves:
        """A run arrives on `node`: a guaranteed one starts (evicting running queueable runs it needs the room
        of); a queueable one starts if nothing waits before it and it fits, else waits. Launching a run that is
        already here is a no-op."""
        if run in self._where:
            return Moves()
        state = self._nodes.get(node)
        if state is None:
            capacity = self._capacity(node)
            state = self._nodes[node] = _Node(capacity, (0,) * len(capacity))
        self._where[run] = node
        moves = Moves()
        if queueable:
            state.waiting[run] = request
        else:
            state.guaranteed[run] = request
            state.held = tuple(map(add, state.held, request))
            moves.started.append(run)
            running = state.running
            while running and not all(map(le, state.held, state.capacity)):
                newest = next(reversed(running))
                state.held = tuple(map(sub, state.held, running.pop(newest)))
                del self._where[newest]
                moves.evicted.append(newest)
        self._fill(state, moves.started)
        return moves

    def end(self, run: str) -> list[str]:
        """A run ended here (finished, stopped or evicted), or a waiting one was taken out: the queued runs that
        start now, in FIFO order. Unknown runs are ignored."""
        node = self._where.pop(run, None)
        if node is None:
            return []
        state = self._nodes[node]
        request = state.guaranteed.pop(run, None)
        if request is None:
            request = state.running.pop(run, None)
        if request is None:
            del state.waiting[run]
        else:
            state.held = tuple(map(sub, state.held, request))
        started: list[str] = []
        self._fill(state, started)
        if not (state.guaranteed or state.running or state.waiting):
            del self._nodes[node]
        return started

    def forget(self, nodes: Iterable[int]) -> list[str]:
        """The workers of `nodes` died: drop everything of theirs; returns the waiting runs dropped."""
        dropped: list[str] = []
        for node in nodes:
            state = self._nodes.pop(node, None)
            if state is None:
                continue
            dropped += state.waiting
            for run in (*state.guaranteed, *state.running, *state.waiting):
                del self._where[run]
        return dropped

    def waiting(self, node: int) -> list[str]:
        """The runs waiting on `node`, oldest first."""
        state = self._nodes.get(node)
        return list(state.waiting) if state is not None else []

    def all_waiting(self) -> list[str]:
        """The runs waiting on every node, node by node, oldest first."""
        return [run for node in sorted(self._nodes) for run in self._nodes[node].waiting]

    def running_queueable(self, node: int) -> list[str]:
        """The queueable runs running on `node`, oldest first."""
        state = self._nodes.get(node)
        return list(state.running) if state is not None else []

    def is_waiting(self, run: str) -> bool:
        node = self._where.get(run)
        return node is not None and run in self._nodes[node].waiting

    @staticmethod
    def _fill(state: _Node, started: list[str]) -> None:
        """Start waiting runs from the head of the queue while the head fits beside what runs."""
        waiting = state.waiting
        while waiting:
            head = next(iter(waiting))
            request = waiting[head]
            held = tuple(map(add, state.held, request))
            if not all(map(le, held, state.capacity)):
                return
            del waiting[head]
            state.running[head] = request
            state.held = held
            started.append(head)


# ---------------------------------------------------------------------------------------------------- LM side


class QueueAdmission:
    """An LM's queueable runs per node and per GM, and the check of a queueable placement (`admit`). The bound is
    per GM, so that a GM, which counts its own runs, knows when a node's queue is full for it."""

    def __init__(self, per_node: int = QUEUEABLE_PER_NODE) -> None:
        if per_node < 1:
            raise ValueError(f"MEGHA_QUEUEABLE_PER_NODE must be at least 1, got {per_node}")
        self.per_node = per_node
        self.held: dict[int, int] = {}  # node -> queueable runs held there (waiting or running)
        self.held_for: dict[tuple[int, int], int] = {}  # (node, GM) -> those the GM placed

    def admit(self, p: Placement, gm: int, capacity: Resources, names: Sequence[str]) -> Rejection | None:
        """None when GM `gm`'s queueable placement `p` (constraints and driver already checked) may go to its node:
        its request fits the node's capacity and the node holds fewer than `per_node` queueable runs of `gm`."""
        if not all(map(le, p.task.request, capacity)):
            return Rejection(
                p,
                f"node {p.node} has capacity {describe(capacity, names)}; task needs {describe(p.task.request, names)}",
                inconsistency=False,
            )
        if self.held_for.get((p.node, gm), 0) >= self.per_node:
            return Rejection(
                p,
                f"{QUEUE_FULL}: node {p.node} holds {self.per_node} queueable tasks of GM {gm} "
                "(MEGHA_QUEUEABLE_PER_NODE)",
                inconsistency=True,
            )
        return None

    def promotes(self, node: int) -> bool:
        """Whether a queueable placement that fits `node`'s free resources runs there as a guaranteed task: only when
        the node holds no queueable runs (it would evict those it came after, so it joins their queue instead)."""
        return node not in self.held

    def hold(self, node: int, gm: int) -> None:
        self.held[node] = self.held.get(node, 0) + 1
        self.held_for[node, gm] = self.held_for.get((node, gm), 0) + 1

    def release(self, node: int, gm: int) -> None:
        _count_down(self.held, node)
        _count_down(self.held_for, (node, gm))


_Key = TypeVar("_Key")


def _count_down(table: dict[_Key, int], key: _Key) -> None:
    """One fewer of `key` in the counts `table`; a key whose count reaches 0 leaves it."""
    count = table[key] - 1
    if count:
        table[key] = count
    else:
        del table[key]


# ---------------------------------------------------------------------------------------------------- GM side


class OpportunisticPlacer:
    """GM `gm`'s placement of queueable tasks that fit nowhere in its view.

    The GM counts its own queueable runs per node (placed, by either path, and not ended); LMs report nothing of
    their queues. A task goes to a feasible node (constraints, capacity, driver) without any of them, chosen by the
    GM's choice policy, own partitions first; failing that, to the feasible node with the fewest, under the bound.
    A node whose LM refused one (queue full with other GMs' runs, or down) is avoided for REFUSED_HOLD_SECONDS."""

    def __init__(
        self,
        gm: int,
        view: GlobalView,
        choice: ChoicePolicy,
        rng: random.Random,
        per_node: int = QUEUEABLE_PER_NODE,
    ) -> None:
        self.gm = gm
        self.view = view
        self.choice = choice
        self.rng = rng
        self.per_node = per_node
        self.counts: dict[tuple[int, int], int] = {}  # (LM, node) -> this GM's queueable runs there
        self._open: set[tuple[int, int]] = set()  # the nodes with some of them, under the bound
        self._avoid_until: dict[tuple[int, int], float] = {}  # (LM, node) -> until when it is avoided
        self._next_expiry = math.inf
        self._busy: dict[PartitionView, int] = {}  # per partition, the nodes with a count or avoided (bitset)
        own = [row[gm] for row in view.views]
        self._order = own + [v for row in view.views for v in row if v.gm != gm]
        # (constraints, request, driver) -> the partitions, in order, with nodes that could ever run it, and those.
        self._feasible: dict[tuple[int, Resources, str], list[tuple[PartitionView, int]]] = {}

    def place(self, task: TaskSpec, now: float) -> Placement | None:
        """Where queueable `task` waits, or None when every feasible node is at the bound or avoided. The caller
        counts the placement (`placed`)."""
        if now >= self._next_expiry:
            self._expire(now)
        busy = self._busy
        feasible = self._feasible_partitions(task)
        for view, ever in feasible:
            idle = ever & ~busy.get(view, 0)
            if idle:
                i = self.choice.choose(view, idle, self.rng, task)
                return Placement(task, view.lm, view.start + i, view.gm != self.gm, self.gm)
        best: tuple[int, int, int, PartitionView] | None = None
        locate, counts, avoided = self.view.locate, self.counts, self._avoid_until
        for key in self._open:
            count = counts[key]
            if key in avoided or (best is not None and count >= best[0]):
                continue
            view, i = locate[key[0]][key[1]]
            if any(v is view and ever >> i & 1 for v, ever in feasible):
                best = (count, key[0], key[1], view)
                if count == 1:
                    break
        if best is None:
            return None
        _, lm, node, view = best
        return Placement(task, lm, node, view.gm != self.gm, self.gm)

    def _feasible_partitions(self, task: TaskSpec) -> list[tuple[PartitionView, int]]:
        key = (task.constraints, task.request, task.driver)
        found = self._feasible.get(key)
        if found is None:
            if len(self._feasible) >= 1024:
                self._feasible.clear()
            found = [(v, bits) for v in self._order if (bits := ever_feasible_nodes(v, task))]
            self._feasible[key] = found
        return found

    def placed(self, p: Placement) -> None:
        """A queueable placement of this GM went out (either path)."""
        key = (p.lm, p.node)
        count = self.counts.get(key, 0) + 1
        self.counts[key] = count
        if count == 1:
            self._mark(key, True)
        self._sort(key, count)

    def ended(self, p: Placement) -> None:
        """A queueable run of this GM ended (finished, failed, preempted, lost) or was refused."""
        key = (p.lm, p.node)
        count = self.counts.get(key, 0) - 1
        self._sort(key, count)
        if count > 0:
            self.counts[key] = count
            return
        self.counts.pop(key, None)
        if key not in self._avoid_until:
            self._mark(key, False)

    def refused(self, p: Placement, now: float) -> None:
        """An LM refused queueable placement `p` for its node's state (queue full, node down): avoid the node."""
        key = (p.lm, p.node)
        until = now + REFUSED_HOLD_SECONDS
        self._avoid_until[key] = until
        self._next_expiry = min(self._next_expiry, until)
        self._mark(key, True)

    def _sort(self, key: tuple[int, int], count: int) -> None:
        if 0 < count < self.per_node:
            self._open.add(key)
        else:
            self._open.discard(key)

    def _expire(self, now: float) -> None:
        for key, until in list(self._avoid_until.items()):
            if until <= now:
                del self._avoid_until[key]
                if key not in self.counts:
                    self._mark(key, False)
        self._next_expiry = min(self._avoid_until.values(), default=math.inf)

    def _mark(self, key: tuple[int, int], busy: bool) -> None:
        view, i = self.view.locate[key[0]][key[1]]
        bits = self._busy.get(view, 0)
        self._busy[view] = bits | 1 << i if busy else bits & ~(1 << i)


# ----------------------------------------------------------------------------------------------- workloads


def is_marked_queueable(task_id: str, fraction: float, seed: int) -> bool:
    """Whether `mark_queueable` makes task `task_id` queueable: a hash of the seed and the id below `fraction`, so
    the choice needs nothing but the id (an experiment tells the two kinds apart afterwards)."""
    return zlib.crc32(f"{seed}/{task_id}".encode()) < fraction * 2**32


def mark_queueable(job: JobSpec, fraction: float, seed: int) -> JobSpec:
    """`job` with about `fraction` of its tasks queueable (`megha replay --queueable`)."""
    marked = (replace(t, queueable=True) if is_marked_queueable(t.task_id, fraction, seed) else t for t in job.tasks)
    return replace(job, tasks=tuple(marked))
