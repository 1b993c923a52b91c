"""Feasibility: the nodes of a partition that satisfy a task's placement constraints and have room for it."""

from __future__ import annotations

from collections.abc import Callable

from megha.common.core.task import TaskSpec
from megha.common.core.view import PartitionView

#: feasible_nodes(view, task): bitset of the partition's nodes that can run `task` now, according to the GM's view
#: (the method itself, so the hottest call of matching costs one call).
feasible_nodes: Callable[[PartitionView, TaskSpec], int] = PartitionView.feasible


def ever_feasible_nodes(view: PartitionView, task: TaskSpec) -> int:
    """Bitset of the partition's nodes that could run `task` when idle (constraints and capacity)."""
    return view.matching(task.constraints) & view.could_ever_fit(task.request)
