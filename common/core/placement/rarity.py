"""The rarity LM order (`rarity`): each task goes to the partition whose best node for it has the fewest machine
constraints the task does not need, keeping nodes with rare combinations of constraints for the tasks that need them.

Every feasible node of a task has the task's constraints, so a node's *extra* constraints are its constraint count
less the task's. A node with many constraints is rare (on the published 10,000-node reference cluster nodes have 2 to
17, most 8 to 11, and 3% have 14 or more), and it is often the only node of the data centre a task with many
constraints can run on; a task with fewer constraints that takes it while a plainer node would do leaves that task
waiting for a delta. The
scarcity order and node choice spare only the few constraints in short supply (5 and 6), and first-fit looks only in
the first partition with room, so a task that needs {5, 6, x} still takes a rare many-constraint node whenever that
is its only candidate in that partition.

The order yields, among the GM's internal partitions and then among the external ones, those where the task has room
in ascending order of the fewest extra constraints among its feasible free nodes there (the lowest level of the
partition's `count_levels` with a candidate); first-fit (LM) order among equals, and a partition whose best node has no
extra constraint is yielded as soon as it is found. The `rarity` node choice (`placement.choice`) then narrows to the
candidates of that level, spares the hot constraints as the scarcity choice does, and picks at random among the rest.
"""

from __future__ import annotations

from collections.abc import Iterator

from megha.common.core.placement.search import PartitionSearch
from megha.common.core.task import TaskSpec
from megha.common.core.view import PartitionView


class _Fewest:
    """The last answer of `fewest` (a pure function of a view's static levels and the candidates): the order
    finds the fewest-constraint candidates of the partition it yields, and the node choice asks for them again
    for the same candidates (one entry: a placement is one order and one choice, in turn)."""

    __slots__ = ("candidates", "nodes", "view")

    def __init__(self) -> None:
        self.view: PartitionView | None = None
        self.candidates = 0
        self.nodes = 0


_LAST = _Fewest()


def fewest(view: PartitionView, candidates: int) -> int:
    """The `candidates` (a non-empty bitset) with the fewest machine constraints."""
    last = _LAST
    if last.view is view and last.candidates == candidates:
        return last.nodes
    return view.fewest_constraints(candidates)[1]


class RaritySearch(PartitionSearch):
    """Partitions in ascending order of the fewest extra constraints of the task's feasible free nodes there;
    first-fit order among equals; internal partitions, then external ones."""

    __slots__ = ("_external", "_internal")

    def __init__(self, gm: int, views: list[list[PartitionView]]) -> None:
        super().__init__(gm, views)
        self._internal = [row[gm] for row in views]  # this GM's partitions, in first-fit (LM) order
        self._external = [v for row in views for v in row if v.gm != gm]  # the others', in first-fit order

    def internal(self, task: TaskSpec) -> Iterator[PartitionView]:
        return self._ranked(self._internal, task)

    def external(self, task: TaskSpec) -> Iterator[PartitionView]:
        return self._ranked(self._external, task)

    def first_internal(self, task: TaskSpec) -> tuple[PartitionView, int] | None:
        """The partition `internal` yields first and its feasible free nodes with the fewest constraints (what the
        `rarity` node choice narrows to first), or None when no internal partition has room: the placer's fused
        path for this order and that choice, in one pass without a generator."""
        return _first(self._internal, task)

    def first_external(self, task: TaskSpec) -> tuple[PartitionView, int] | None:
        """As `first_internal`, among the other GMs' partitions."""
        return _first(self._external, task)

    def _ranked(self, views: list[PartitionView], task: TaskSpec) -> Iterator[PartitionView]:
        """The views where `task` has room, fewest extra constraints first, in the given (first-fit) order among
        equals. Lazily: a view with a node of no extra constraint is yielded as soon as it is found; of the others
        the first is found with each view's levels looked at only below the best so far (a view needs fewer
        constraints to come first), and the rest are ranked only if the caller asks past it (the placer takes the
        first view; a reserved LM's is skipped by `ReservedSearch`)."""
        needed = task.constraints.bit_count()
        feasible = PartitionView.feasible
        best_count, best_at = 1 << 30, -1
        best_nodes = 0
        others: list[tuple[int, PartitionView, int]] = []  # (position, view, free) with room and extra constraints
        for i, view in enumerate(views):
            free = feasible(view, task)
            if not free:
                continue
            for count, nodes in view.count_levels:
                if count >= best_count:
                    others.append((i, view, free))  # no better than the best so far: ranked if asked
                    break
                nodes &= free
                if nodes:
                    if count == needed:  # no extra constraint: nothing comes before it
                        _remember(view, free, nodes)
                        yield view
                    else:
                        best_count, best_at, best_nodes = count, len(others), nodes
                        others.append((i, view, free))
                    break
        if best_at < 0:
            return
        _, view, free = others.pop(best_at)
        _remember(view, free, best_nodes)
        yield view
        ranked = sorted((view.fewest_constraints(free)[0], i, view) for i, view, free in others)
        for _, _, view in ranked:
            yield view


def _first(views: list[PartitionView], task: TaskSpec) -> tuple[PartitionView, int] | None:
    """The first of `views` in the rarity order and its fewest-constraint candidates for `task` (`_ranked`'s first
    yield, found by the same scan)."""
    needed = task.constraints.bit_count()
    feasible = PartitionView.feasible
    best_count = 1 << 30
    best_view = None
    best_nodes = 0
    for view in views:
        free = feasible(view, task)
        if not free:
            continue
        for count, nodes in view.count_levels:
            if count >= best_count:
                break
            nodes &= free
            if nodes:
                best_count, best_view, best_nodes = count, view, nodes
                break
        if best_count == needed:  # no extra constraint: nothing comes before it
            break
    if best_view is None:
        return None
    return best_view, best_nodes


def _remember(view: PartitionView, candidates: int, nodes: int) -> None:
    last = _LAST
    last.view, last.candidates, last.nodes = view, candidates, nodes
