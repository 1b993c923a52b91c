"""Waiting order: in what order the tasks that wait for a freed node (parked, and refused as inconsistent under
`--inconsistent wait-for-free`) get a node that frees up in the GM's view.

`shape` (the default): the parked shapes the node could run, in the queue order's service order (for FIFO, the
order each shape was first parked), each shape's tasks oldest first, then the refused tasks' shapes likewise. A
younger task of a shape parked early goes before an older task of a shape parked later.

`arrival` does as the constraint-aware paper's simulator (meghanat/megha-constraint-aware, its GM's `task_queue`):
one queue of the waiting tasks, a task that fits nowhere at its back (`schedule_job_batched_all`), a task an LM
refused at its front (`unschedule_task`), and a node that frees up goes to the first task in it that fits
(`receive_task_response`, `update_status`). So refused tasks come first, the newest refusal first, then the parked
tasks in the order they were parked, the first that fits the node taking it, then the next first-fitting one,
until the node fits nothing more. The tasks stay grouped by shape (the constraint index finds a node's shapes);
each task carries a stamp of when it joined (`StampedTasks`), and a freed node takes the head of smallest stamp
among the shapes it could run. It serves one queue, so it goes with the FIFO queue order only.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from megha.common.core.messages import Placement
from megha.common.core.parked import ParkedShapes, Shape
from megha.common.core.task import TaskSpec
from megha.common.core.view import covers

if TYPE_CHECKING:
    from megha.common.core.gm import GlobalMaster

Batches = dict[int, list[Placement]]


class WaitingOrder(Protocol):
    """How a GM keeps the tasks that wait for a freed node, and in what order a freed node serves them."""

    name: str
    #: Whether it serves the waiting tasks as one queue, ignoring the queue order's (so with FIFO only).
    one_queue: bool

    def parked_shapes(self) -> ParkedShapes:
        """The GM's parked shapes (tasks that fit nowhere in its view)."""

    def refused_shapes(self) -> ParkedShapes:
        """The shapes the tasks refused as inconsistent wait in (under a policy that holds them)."""

    def retry(self, gm: GlobalMaster, freed: list[tuple[int, int]], now: float, batches: Batches) -> None:
        """Nodes `freed` ((LM, node) pairs) have more free resources in `gm`'s view: retry the waiting tasks they
        could run, adding the placements to `batches`."""


class ShapeOrder:
    """Parked shapes in the queue order's service order, then the refused tasks' shapes; each shape's tasks oldest
    first. The default."""

    name = "shape"
    one_queue = False

    def parked_shapes(self) -> ParkedShapes:
        return ParkedShapes()

    def refused_shapes(self) -> ParkedShapes:
        return ParkedShapes()

    def retry(self, gm: GlobalMaster, freed: list[tuple[int, int]], now: float, batches: Batches) -> None:
        if gm.waiting:
            gm.retry_waiting(freed, now, batches, gm.parked)
        if gm.refused:
            gm.retry_waiting(freed, now, batches, gm.refused)


class StampedTasks(deque[TaskSpec]):
    """One shape's waiting tasks with, in step, the stamp each got from `clock` when it joined (`stamps`). A task
    put in front of the others gets a stamp no later than theirs."""

    def __init__(self, clock: Iterator[int], tasks: Iterable[TaskSpec] = (), stamps: Iterable[int] = ()) -> None:
        super().__init__(tasks)
        self.clock = clock
        self.stamps: deque[int] = deque(stamps)

    def append(self, task: TaskSpec) -> None:
        super().append(task)
        self.stamps.append(next(self.clock))

    def appendleft(self, task: TaskSpec) -> None:
        stamp = next(self.clock)
        super().appendleft(task)
        self.stamps.appendleft(min(stamp, self.stamps[0]) if self.stamps else stamp)

    def popleft(self) -> TaskSpec:
        self.stamps.popleft()
        return super().popleft()

    def without(self, drop: Callable[[TaskSpec], bool]) -> StampedTasks:
        """The tasks `drop` does not select, with their stamps."""
        kept = [(task, stamp) for task, stamp in zip(self, self.stamps, strict=True) if not drop(task)]
        return StampedTasks(self.clock, (task for task, _ in kept), (stamp for _, stamp in kept))


class StampedShapes(ParkedShapes):
    """Parked shapes whose tasks carry stamps from one clock: a task joins its shape at the back, or, `in_front`,
    at the front (the clock then counting down, so the newest is first)."""

    def __init__(self, clock: Iterator[int], in_front: bool = False) -> None:
        super().__init__()
        self.clock = clock
        self.in_front = in_front

    def add(self, shape: Shape, task: TaskSpec) -> None:
        held = self.tasks.get(shape)
        if held is None:
            self.park(shape, task)
        elif self.in_front:
            held.appendleft(task)
        else:
            held.append(task)

    def _new_tasks(self, task: TaskSpec) -> StampedTasks:
        tasks = StampedTasks(self.clock)
        tasks.append(task)
        return tasks

    def _without(self, parked: deque[TaskSpec], drop: Callable[[TaskSpec], bool]) -> deque[TaskSpec]:
        assert isinstance(parked, StampedTasks)
        return parked.without(drop)


class ArrivalOrder:
    """One queue, as the authors' simulator: refused tasks first (the newest first), then the parked tasks in the
    order they were parked; a freed node goes to the first that fits it, then the next, until it fits no more."""

    name = "arrival"
    one_queue = True

    def parked_shapes(self) -> StampedShapes:
        return StampedShapes(itertools.count())  # stamps 0, 1, ...: at the back, in the order parked

    def refused_shapes(self) -> StampedShapes:
        return StampedShapes(itertools.count(-1, -1), in_front=True)  # -1, -2, ...: before every parked task

    def retry(self, gm: GlobalMaster, freed: list[tuple[int, int]], now: float, batches: Batches) -> None:
        sources = [shapes for shapes in (gm.refused, gm.parked) if shapes]
        locate = gm.view.locate
        for lm, node in freed:
            if not sources:
                return
            view, i = locate[lm][node]
            free = view.free
            heads: list[tuple[int, int, Shape, ParkedShapes]] = []  # (head's stamp, tie-break, shape, its shapes)
            for shapes in sources:
                if not shapes.any_request_fits(free[i]):
                    continue
                for shape in shapes.runnable_on(view.masks[i]):
                    if covers(free[i], shape[1]) and (shape[3] is None or view.offering(shape[3]) >> i & 1):
                        heads.append((shapes.tasks[shape].stamps[0], len(heads), shape, shapes))  # type: ignore[attr-defined]
            heapq.heapify(heads)
            tie = len(heads)
            while heads:
                _, _, shape, shapes = heapq.heappop(heads)
                if not covers(free[i], shape[1]):
                    continue
                tasks = shapes.tasks[shape]
                if not gm.retry_head(tasks, lm, node, now, batches):
                    continue
                if tasks:
                    heapq.heappush(heads, (tasks.stamps[0], tie, shape, shapes))  # type: ignore[attr-defined]
                    tie += 1
                else:
                    shapes.unpark(shape)
                if not any(s.any_request_fits(free[i]) for s in sources):
                    break
            sources = [shapes for shapes in sources if shapes]
