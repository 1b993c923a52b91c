"""The order a GM searches partitions (LM order): its internal partitions first, then external ones.

`round-robin` (the fair paper, the default) starts each task at the next LM, and visits external partitions
round-robin across LMs too (to spread repartitions evenly), the other GMs' partitions of one LM in a rotating
order. `first-fit` (the authors' simulator) visits LMs, and the other GMs' partitions of each, in id order for
every task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from megha.common.core.task import TaskSpec
from megha.common.core.view import PartitionView


class PartitionSearch:
    """Yields the partitions one task should try, advancing the round-robin pointers once per task. The task is
    given so that an order may depend on it (`placement.scarcity`); round-robin and first-fit ignore it."""

    __slots__ = ("_external_next", "_internal_next", "_views", "gm", "num_gms", "num_lms")

    def __init__(self, gm: int, views: list[list[PartitionView]]) -> None:
        self.gm = gm
        self._views = views
        self.num_lms = len(views)
        self.num_gms = len(views[0])
        self._internal_next = 0
        self._external_next = 0

    def internal(self, task: TaskSpec) -> Iterator[PartitionView]:
        start = self._internal_next
        self._internal_next = (start + 1) % self.num_lms
        for k in range(self.num_lms):
            yield self._views[(start + k) % self.num_lms][self.gm]

    def external(self, task: TaskSpec) -> Iterator[PartitionView]:
        start = self._external_next
        self._external_next = (start + 1) % (self.num_lms * max(self.num_gms - 1, 1))
        gm_offset, lm_start = divmod(start, self.num_lms)
        for k in range(self.num_lms):
            row = self._views[(lm_start + k) % self.num_lms]
            for j in range(self.num_gms - 1):
                other = (self.gm + 1 + (gm_offset + j) % (self.num_gms - 1)) % self.num_gms
                yield row[other]


class FirstFitSearch(PartitionSearch):
    """LMs in id order for every task: internal partitions of LM 0, 1, ...; then LM 0's external partitions in GM
    order, LM 1's, ..."""

    __slots__ = ()

    def internal(self, task: TaskSpec) -> Iterator[PartitionView]:
        for row in self._views:
            yield row[self.gm]

    def external(self, task: TaskSpec) -> Iterator[PartitionView]:
        for row in self._views:
            for g, view in enumerate(row):
                if g != self.gm:
                    yield view


def by_cost(
    views: Sequence[PartitionView], task: TaskSpec, cost: Callable[[PartitionView, int], float]
) -> Iterator[PartitionView]:
    """The views where `task` has room (feasible free nodes in the view), lowest `cost(view, those nodes)` first, in
    the given order among equals (the constraint-aware orders rank first-fit order so). Lazily: a view of cost 0
    is yielded as soon as it is found (none can come before it)."""
    costly = []
    feasible = PartitionView.feasible
    for i, view in enumerate(views):
        free = feasible(view, task)
        if free:
            price = cost(view, free)
            if price:
                costly.append((price, i, view))
            else:
                yield view
    costly.sort(key=_cost_then_position)
    for _, _, view in costly:
        yield view


def _cost_then_position(entry: tuple[float, int, PartitionView]) -> tuple[float, int]:
    return entry[0], entry[1]
