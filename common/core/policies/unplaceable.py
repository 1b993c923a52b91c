"""Unplaceable tasks (the fair paper's rescheduling operation, section IV-B5): what a GM does with a task that fits
nowhere in its view, neither internally nor by repartition, when the preemption policy has no plan for it.

`park` (the default) parks the task with its shape until a node that shape could use frees up in the view; newer
tasks of the shape wait behind it without being matched. `requeue-back` does as the paper says: the task goes to
the back of its queue, and "when the request reaches the front of the queue, the GM treats it like a new request",
in the GM's next scheduling pass (so one pass tries each task once, and a pass always ends). Within one pass the
view only shrinks, so a later task of a shape that failed in the pass goes to the back unmatched, as a task of a
parked shape joins it: the outcome of matching it, without its cost.

`park-freed-node` parks as `park` does, but a freed node goes to the first parked task it fits, on that node,
without the node choice: as the constraint-aware paper's simulator hands a freed node to the first queued task it
fits (its GM's `receive_task_response` and `update_status`), so Minimum-Constraints and Random differ only for
tasks placed on arrival.

Under any of them a task whose preemption requests every LM refused (fair scheduling) is parked: it is retried
when a node it could use frees up and, for a preemption, when a delta arrives, so a refusal never starts its own
retry (with a retry in the pass the refusal starts, a GM whose view cannot tell why the LMs refuse, such as victims
on nodes without the task's constraints, would ask again at once, forever).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableSequence
from typing import Protocol

from megha.common.core.parked import ParkedShapes, Shape
from megha.common.core.policies.queue_order import TaskQueue
from megha.common.core.task import TaskSpec


class UnplaceablePolicy(Protocol):
    """Holds the tasks a GM could not place until they are tried again."""

    name: str
    freed_node_only: bool  # a parked task retried for a freed node goes to that node, not through the placer

    @property
    def blocked(self) -> Mapping[Shape, MutableSequence[TaskSpec]]:
        """Shapes known to fit nowhere in the view now: the GM appends a queued task of one to its sequence
        unmatched."""

    def hold(self, shape: Shape, task: TaskSpec) -> None:
        """`task` (of `shape`, not blocked) fits nowhere in the view in this scheduling pass."""

    def end_pass(self, queue: TaskQueue) -> None:
        """The GM's scheduling pass is over: tasks held for the next pass go to the back of `queue`."""


class ParkByShape:
    """A task that fits nowhere is parked with its shape (`ParkedShapes`); the GM retries a shape when a node it
    could use frees up in its view. The default."""

    name = "park"
    freed_node_only = False

    def __init__(self, parked: ParkedShapes) -> None:
        self.parked = parked
        self.blocked = parked.tasks  # each parked shape's tasks, oldest first

    def hold(self, shape: Shape, task: TaskSpec) -> None:
        self.parked.park(shape, task)

    def end_pass(self, queue: TaskQueue) -> None:
        return None


class ParkForFreedNode(ParkByShape):
    """Parked as by `ParkByShape`; a node that frees up goes to the first parked task (in the queue order's service
    order) it fits, on that very node: the authors' simulator."""

    name = "park-freed-node"
    freed_node_only = True


class RequeueBack:
    """A task that fits nowhere goes to the back of its queue (its user's, under fair scheduling) at the end of the
    scheduling pass and is tried again as a new request in the next one (any message to the GM starts one)."""

    name = "requeue-back"
    freed_node_only = False

    def __init__(self, parked: ParkedShapes) -> None:
        self._next_pass: list[TaskSpec] = []  # held in this pass, in the order they failed
        self.blocked: dict[Shape, MutableSequence[TaskSpec]] = {}  # the shapes that failed in this pass

    def hold(self, shape: Shape, task: TaskSpec) -> None:
        self._next_pass.append(task)
        self.blocked[shape] = self._next_pass  # a later task of the shape joins the back in its turn

    def end_pass(self, queue: TaskQueue) -> None:
        if self._next_pass:
            for task in self._next_pass:
                queue.push_back(task)
            self._next_pass = []
            self.blocked.clear()
