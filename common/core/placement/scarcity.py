"""The constraint-aware LM order (`scarcity`): each task goes first to the partition where it wastes the least scarce
capacity, keeping partitions rich in free scarce nodes for the tasks that need them.

A constraint's pressure is demand / supply: the share of the tasks the GM has tried to place that carry it (a task
that waits counts at every try, so unmet demand weighs more) over the share of the data centre's nodes that have
it, re-estimated every `RELEARN` tasks. The tasks that need constraint k alone then load k's nodes `pressure` times as
heavily as the average node is loaded. A constraint is *hot* when that is at least half (`HOT_PRESSURE`): tasks
that need it claim much of its nodes, so others should not take them. In the Sharma et al. statistics constraint 5
is carried by 18% of tasks and held by 11% of nodes (pressure 1.6) and constraint 6 by 27% and 28% (0.9); every
other constraint is below 0.5.

Node choice picks a node of the chosen partition uniformly among the task's feasible ones, so a placement in
partition p takes, on average, a share |A ∩ C_k| / |A| of a hot constraint k's nodes, where A is the task's
feasible free nodes in p and C_k the nodes with k. For a task that does not need k that share is waste. The
search yields the partitions where the task has room in ascending order of that waste, weighted by pressure;
ties (no hot constraint, or a task needing every hot one) keep the LM order of first-fit, which packs. Internal
partitions first, then external ones, as in the other orders. The `scarcity` node choice (`placement.choice`) uses
the same pressures to spare those nodes inside the partition (docs/lm-order.md).
"""

from __future__ import annotations

from collections.abc import Iterator

from megha.common.core.constraints import NUM_CONSTRAINTS
from megha.common.core.placement.search import PartitionSearch, by_cost
from megha.common.core.task import TaskSpec
from megha.common.core.view import PartitionView, constraints_of

#: Tasks between two estimates of the pressures (sorting 21 of them is too dear to do for every task).
RELEARN = 1024
#: Tasks seen before the first estimate.
FIRST_ESTIMATE = 64
#: A constraint is hot from this pressure on ...
HOT_PRESSURE = 0.5
#: ... and at most this many (the highest pressures) are.
MAX_HOT = 2


class ConstraintDemand:
    """How often the tasks counted (by the scarcity order: every try; by the scarcity node choice: every placement)
    carry each constraint, and when to re-estimate the pressures."""

    __slots__ = ("_counts", "_unfolded", "seen")

    def __init__(self) -> None:
        self._counts = [0] * NUM_CONSTRAINTS  # tasks seen that carry each constraint, up to the last fold
        # Constraint mask -> tasks seen with it since the last fold: a task costs one dict update, and the
        # per-constraint counts are added up only when an estimate reads them (`counts`).
        self._unfolded: dict[int, int] = {}
        self.seen = 0  # tasks seen

    def count(self, mask: int) -> bool:
        """Count one task's constraints; True when the pressures are due for an estimate (the FIRST_ESTIMATE-th
        task, then every RELEARN-th)."""
        unfolded = self._unfolded
        unfolded[mask] = unfolded.get(mask, 0) + 1
        self.seen += 1
        return self.seen == FIRST_ESTIMATE or self.seen % RELEARN == 0

    @property
    def counts(self) -> list[int]:
        """How many of the tasks seen carry each constraint."""
        counts = self._counts
        for mask, tasks in self._unfolded.items():
            for k in constraints_of(mask):
                counts[k] += tasks
        self._unfolded.clear()
        return counts

    def hot(self, supply: list[float]) -> tuple[tuple[int, float], ...]:
        """(constraint, pressure) of the hot constraints, hottest first, against nodes with the given `supply` (the
        share of the nodes with each constraint); none before FIRST_ESTIMATE tasks."""
        seen = self.seen
        if seen < FIRST_ESTIMATE:
            return ()
        counts = self.counts
        pressures = sorted(
            ((counts[k] / seen / share, k) for k, share in enumerate(supply) if 0 < share < 1), reverse=True
        )
        return tuple((k, p) for p, k in pressures[:MAX_HOT] if p >= HOT_PRESSURE)


class ScarcitySearch(PartitionSearch):
    """Partitions in ascending order of the pressure-weighted share of hot constraints the task does not need among
    its feasible free nodes; first-fit order among equals."""

    __slots__ = ("_demand", "_external", "_hot", "_internal", "_supply")

    def __init__(self, gm: int, views: list[list[PartitionView]]) -> None:
        super().__init__(gm, views)
        nodes = sum(v.size for row in views for v in row)
        # Share of the data centre's nodes with each constraint (static).
        self._supply = [
            sum(v.constraint_bits[k].bit_count() for row in views for v in row) / nodes for k in range(NUM_CONSTRAINTS)
        ]
        self._demand = ConstraintDemand()
        self._hot: tuple[tuple[int, float], ...] = ()  # (constraint, pressure) of the hot constraints
        self._internal = [row[gm] for row in views]  # this GM's partitions, in first-fit (LM) order
        self._external = [v for row in views for v in row if v.gm != gm]  # the others', in first-fit order

    @property
    def hot(self) -> tuple[tuple[int, float], ...]:
        """The hot constraints and their pressures, as last estimated (for reports and tests)."""
        return self._hot

    def internal(self, task: TaskSpec) -> Iterator[PartitionView]:
        if self._demand.count(task.constraints):
            self._hot = self._demand.hot(self._supply)
        return self._ranked(self._internal, task)

    def external(self, task: TaskSpec) -> Iterator[PartitionView]:
        return self._ranked(self._external, task)

    def _ranked(self, views: list[PartitionView], task: TaskSpec) -> Iterator[PartitionView]:
        """The views where `task` has room, least waste first, in the given (first-fit) order among equals. Lazily:
        a view that wastes nothing is yielded as soon as it is found (none can come before it)."""
        mask = task.constraints
        unneeded = [(k, p) for k, p in self._hot if not mask >> k & 1]
        if not unneeded:
            yield from views  # nothing to waste: first-fit (the placer skips the views without room)
            return
        yield from by_cost(views, task, lambda view, free: _waste(view, free, unneeded))


def _waste(view: PartitionView, free: int, unneeded: list[tuple[int, float]]) -> float:
    """The pressure-weighted share of the `free` nodes of `view` with a hot constraint the task does not need."""
    bits = view.constraint_bits
    waste = 0.0
    for k, pressure in unneeded:
        waste += pressure * (free & bits[k]).bit_count()
    return waste / free.bit_count()
