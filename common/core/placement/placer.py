"""The GM's placer: one task through feasibility, LM order and node choice to a placement in its view, and the
reason a task could never be placed, read off the same feasibility filters."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from megha.common.core.global_view import GlobalView
from megha.common.core.messages import Placement
from megha.common.core.placement.choice import ChoicePolicy, RarityChoice
from megha.common.core.placement.feasibility import driver_feasible_nodes, ever_feasible_nodes, feasible_nodes
from megha.common.core.placement.filters import CAPACITY, CONSTRAINTS, DRIVER, Filter, explain, malformed
from megha.common.core.placement.rarity import RaritySearch
from megha.common.core.placement.search import PartitionSearch
from megha.common.core.task import TaskSpec
from megha.common.core.view import PartitionView


class Placer:
    """Places tasks for GM `gm` (constraint-aware paper, section 4.3; fair paper, Algorithm 1):

    1. LM order (`search`): its own (internal) partitions round-robin over LMs, then the others' (external) ones,
       where a placement is a repartition;
    2. feasibility: the partition's nodes that satisfy the constraints, have the free resources in the view and
       offer the driver;
    3. node choice (`choice`): Random or Minimum-Constraints among those.
    """

    def __init__(
        self, gm: int, view: GlobalView, choice: ChoicePolicy, rng: random.Random, search: PartitionSearch | None
    ) -> None:
        self.gm = gm
        self.view = view
        self.choice = choice
        self.rng = rng
        self.search = search or PartitionSearch(gm, view.views)
        # The default pipeline (rarity order, rarity choice) fused into one pass per task: the same placement as
        # the steps one by one (tests/test_lm_order.py), while `search` is that order (a reservation wraps it for a
        # while).
        self._fused: RaritySearch | None = None
        self._fused_choice: RarityChoice | None = None
        if isinstance(self.search, RaritySearch) and type(choice) is RarityChoice:
            self._fused, self._fused_choice = self.search, choice
        # Burn tasks skip the driver filter while every node offers burn (always, in a simulation).
        self._burn_everywhere = all(v.offering("burn") == v.all_bits for v in view.partitions())
        self._partitions = list(view.partitions())
        # (constraints, request, driver) -> why no node could ever run that shape (None: some node could).
        self._unschedulable: dict[tuple[int, tuple[int, ...], str], tuple[str, str] | None] = {}

    def match(self, task: TaskSpec) -> Placement | None:
        """The first feasible partition in LM order and the chosen node in it, or None when none has room."""
        if task.run is None and self._burn_everywhere:
            fused = self._fused
            if fused is not None and fused is self.search:
                return self._match_rarity(task, fused)
            feasible = feasible_nodes
        else:
            feasible = driver_feasible_nodes
        choose = self.choice.choose
        for view in self.search.internal(task):
            candidates = feasible(view, task)
            if candidates:
                return Placement(task, view.lm, view.start + choose(view, candidates, self.rng, task), False, self.gm)
        for view in self.search.external(task):
            candidates = feasible(view, task)
            if candidates:
                return Placement(task, view.lm, view.start + choose(view, candidates, self.rng, task), True, self.gm)
        return None

    def _match_rarity(self, task: TaskSpec, search: RaritySearch) -> Placement | None:
        """`match` for the rarity order and choice: the first partition and its fewest-constraint candidates in one
        scan, then the choice's narrowing among those."""
        found = search.first_internal(task)
        repartition = False
        if found is None:
            found = search.first_external(task)
            if found is None:
                return None
            repartition = True
        view, fewest = found
        assert self._fused_choice is not None  # set whenever `_fused` is
        node = self._fused_choice.choose_among(view, fewest, self.rng, task)
        return Placement(task, view.lm, view.start + node, repartition, self.gm)

    def match_on(self, task: TaskSpec, lm: int, node: int) -> Placement | None:
        """`task` on LM `lm`'s node `node` if it is feasible there in the view (no LM order, no node choice)."""
        feasible = feasible_nodes if task.run is None and self._burn_everywhere else driver_feasible_nodes
        view, i = self.view.locate[lm][node]
        if not feasible(view, task) >> i & 1:
            return None
        return Placement(task, lm, node, view.gm != self.gm, self.gm)

    def unschedulable(self, task: TaskSpec) -> tuple[str, str] | None:
        """(why no node of the data centre could ever run `task`, the task's field to blame), or None."""
        key = (task.constraints, task.request, task.driver)
        try:
            return self._unschedulable[key]
        except KeyError:
            pass
        views = self._partitions
        names = self.view.resource_names
        found: tuple[str, str] | None = None  # the filters fused, as matching runs them: some node passes all three
        if not any(ever_feasible_nodes(v, task) for v in views) or malformed(task, names) is not None:
            found = explain(task, names, lambda steps: any(_passing(v, task, steps) for v in views))
        self._unschedulable[key] = found
        return found


#: Each filter as a bitset of a partition's nodes, in the GM's view.
_NODES: dict[Filter, Callable[[PartitionView, TaskSpec], int]] = {
    CONSTRAINTS: lambda view, task: view.matching(task.constraints),
    CAPACITY: lambda view, task: view.could_ever_fit(task.request),
    DRIVER: lambda view, task: view.offering(task.driver),
}


def _passing(view: PartitionView, task: TaskSpec, steps: Sequence[Filter]) -> int:
    """The partition's nodes that pass every step in `steps` when idle."""
    bits = view.all_bits
    for step in steps:
        bits &= _NODES[step](view, task)
    return bits
