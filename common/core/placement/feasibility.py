"""Feasibility: the nodes of a partition that satisfy a task's placement constraints, have room for it and offer
its driver.

Every node offers burn in a simulation, so the driver filter is a separate step that the GM applies only to a
task that needs it (`GlobalMaster._match`): a task of another driver, or any task once some node lacks burn."""

from __future__ import annotations

from collections.abc import Callable

from megha.common.core.task import TaskSpec
from megha.common.core.view import PartitionView

#: feasible_nodes(view, task): bitset of the partition's nodes that can run `task` now, according to the GM's view
#: (the method itself, so the hottest call of matching costs one call).
feasible_nodes: Callable[[PartitionView, TaskSpec], int] = PartitionView.feasible


def driver_feasible_nodes(view: PartitionView, task: TaskSpec) -> int:
    """`feasible_nodes` narrowed to the nodes that offer `task`'s driver (Nomad's driver checker)."""
    return view.feasible(task) & view.offering(task.driver)


def ever_feasible_nodes(view: PartitionView, task: TaskSpec) -> int:
    """Bitset of the partition's nodes that could run `task` when idle (constraints, capacity and driver)."""
    return view.matching(task.constraints) & view.could_ever_fit(task.request) & view.offering(task.driver)
