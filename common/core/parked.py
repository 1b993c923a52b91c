"""A GM's parked tasks: tasks that fit nowhere in its view, grouped by shape, with an index from constraint ids to
shapes.

A shape is (constraints mask, request, user under fair scheduling else "", driver; None for burn, priority class
value). Tasks of one shape are interchangeable for matching, so the GM retries a shape, not a task, and only when a
node that shape could use frees up in its view. On a long, overloaded trace hundreds of shapes are parked at once
and nodes free up constantly; scanning every shape per freed node dominated the replay. The index gives each parked
shape one bit, and keeps per constraint id the bits of the shapes that need it: a freed node ORs the bitsets of the
constraints it lacks, and the shapes left are exactly those whose constraints it satisfies.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from megha.common.core.constraints import NUM_CONSTRAINTS, iter_bits
from megha.common.core.resources import Resources
from megha.common.core.task import TaskSpec
from megha.common.core.view import covers, missing_constraints

Shape = tuple[int, Resources, str, str | None, int]


def shape_of(task: TaskSpec, by_user: bool) -> Shape:
    """The shape of `task` (its user counts only when the queue order keeps shapes apart per user)."""
    return (
        task.constraints,
        task.request,
        task.user if by_user else "",
        None if task.run is None else task.run.driver,
        task.priority,
    )


class ParkedShapes:
    """Parked tasks by shape, oldest shape first (`tasks` keeps park order), plus the constraint index.

    Bits are handed out in park order and never reused until the index is renumbered (when at most half the bits
    handed out are still parked), so walking a bitset lowest bit first visits shapes oldest first, lazily: a freed
    node usually fills up after the first few shapes."""

    def __init__(self) -> None:
        self.tasks: dict[Shape, deque[TaskSpec]] = {}
        self._requests: dict[Resources, int] = {}  # request -> parked shapes with that request
        self._bit: dict[Shape, int] = {}
        self._shape_at: list[Shape | None] = []  # bit -> shape (None once unparked)
        self._live = 0  # bits of the parked shapes
        self._needs = [0] * NUM_CONSTRAINTS  # constraint id -> bits of the parked shapes that need it

    def __len__(self) -> int:
        return len(self.tasks)

    def park(self, shape: Shape, task: TaskSpec) -> None:
        """Park a new shape holding `task` (the caller appends further tasks to `tasks[shape]`)."""
        self.tasks[shape] = self._new_tasks(task)
        self._requests[shape[1]] = self._requests.get(shape[1], 0) + 1
        if len(self._shape_at) >= 64 and len(self._shape_at) >= 2 * len(self.tasks):
            self._renumber()
        else:
            self._index(shape)

    def add(self, shape: Shape, task: TaskSpec) -> None:
        """`task` joins the tasks of `shape`, behind them (parking the shape if none wait)."""
        held = self.tasks.get(shape)
        if held is None:
            self.park(shape, task)
        else:
            held.append(task)

    def unpark(self, shape: Shape) -> None:
        """Forget `shape` (its task deque must be empty or already taken over)."""
        del self.tasks[shape]
        count = self._requests[shape[1]] - 1
        if count:
            self._requests[shape[1]] = count
        else:
            del self._requests[shape[1]]
        bit = self._bit.pop(shape)
        self._shape_at[bit] = None
        keep = ~(1 << bit)
        self._live &= keep
        needs = self._needs
        for cid in iter_bits(shape[0]):
            needs[cid] &= keep

    def remove_if(self, drop: Callable[[TaskSpec], bool]) -> list[TaskSpec]:
        """Take out the parked tasks `drop` selects (a cancelled job's); a shape left empty is unparked. Returns
        them."""
        removed: list[TaskSpec] = []
        for shape, parked in list(self.tasks.items()):
            kept = self._without(parked, drop)
            if len(kept) == len(parked):
                continue
            removed += [t for t in parked if drop(t)]
            if kept:
                self.tasks[shape] = kept
            else:
                self.unpark(shape)
        return removed

    def any_request_fits(self, free: Resources) -> bool:
        """True when `free` covers the request of some parked shape."""
        return any(covers(free, request) for request in self._requests)

    def runnable_on(self, node_mask: int) -> Iterator[Shape]:
        """The parked shapes whose constraints a node with machine constraints `node_mask` satisfies, oldest
        first."""
        candidates = self._live
        needs = self._needs
        for cid in missing_constraints(node_mask):
            candidates &= ~needs[cid]
            if not candidates:
                return iter(())
        shape_at = self._shape_at
        return (shape_at[bit] for bit in iter_bits(candidates))  # type: ignore[misc]

    def _new_tasks(self, task: TaskSpec) -> deque[TaskSpec]:
        """The task deque of a shape parked with `task`."""
        return deque((task,))

    def _without(self, parked: deque[TaskSpec], drop: Callable[[TaskSpec], bool]) -> deque[TaskSpec]:
        """The tasks of `parked` that `drop` does not select, in order."""
        return deque(t for t in parked if not drop(t))

    def _index(self, shape: Shape) -> None:
        """Give `shape` the next bit."""
        bit = len(self._shape_at)
        self._shape_at.append(shape)
        self._bit[shape] = bit
        flag = 1 << bit
        self._live |= flag
        needs = self._needs
        for cid in iter_bits(shape[0]):
            needs[cid] |= flag

    def _renumber(self) -> None:
        """Give the parked shapes bits 0.. in park order again (amortised: it happens once per as many parks as
        there are parked shapes)."""
        self._shape_at = []
        self._bit.clear()
        self._live = 0
        self._needs = [0] * NUM_CONSTRAINTS
        for shape in self.tasks:
            self._index(shape)
