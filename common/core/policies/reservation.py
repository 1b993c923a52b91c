"""Reservation for a starving gang (docs/gang.md, "Starvation: reservation"): once the oldest gang waiting at a GM has
waited `after` seconds, the GM holds LMs for it. It places no other task of the same or a lower priority on them
(its own partitions there or by repartition) until the gang is placed, cancelled or timed out, so that what ends on
them stays free until the gang fits, while other work goes on elsewhere. This is Volcano's elect and reserve (one
target job, nodes locked for it as they free up) and the reservation Slurm's backfill makes for its top job, at LM
grain and without run-time estimates. Only this GM's placements are held back: the other GMs place as before."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from operator import sub
from typing import TYPE_CHECKING

from megha.common.core.constraints import iter_bits
from megha.common.core.placement.feasibility import driver_feasible_nodes
from megha.common.core.placement.search import PartitionSearch
from megha.common.core.resources import Resources
from megha.common.core.task import TaskSpec
from megha.common.core.view import PartitionView, covers

if TYPE_CHECKING:
    from megha.common.core.gang import Gang
    from megha.common.core.gm import GlobalMaster


class GangReservation:
    """GM `gm`'s reservation: at most one gang at a time has LMs held for it."""

    def __init__(self, gm: GlobalMaster, waiting: dict[str, Gang], after: float) -> None:
        self.gm = gm
        self.waiting = waiting  # the GM's waiting gangs (`GangScheduler.waiting`)
        self.after = after  # seconds a gang waits before LMs are held for it
        self.gang: Gang | None = None  # the gang LMs are held for (with none held when it could not fit on any)
        self.lms: frozenset[int] = frozenset()  # the LMs held
        self.priority = 0  # the gang's priority: tasks of a higher one are not held back
        self._search: PartitionSearch | None = None  # the placer's LM order, put back when the LMs are released
        self.made = 0  # reservations made (LMs held for a gang)

    def update(self, now: float) -> None:
        """Release the LMs once their gang no longer waits (placed, cancelled, timed out); then, when none are held,
        hold LMs for the gang that has waited longest if that is `after` seconds or more."""
        gang = self.gang
        if gang is not None:
            if self.waiting.get(gang.job_id) is gang:
                return
            self._release()
        if not self.waiting:
            return
        oldest = min(self.waiting.values(), key=_since)
        if now - oldest.since >= self.after:
            self._hold(oldest)

    def holds(self, task: TaskSpec, lm: int) -> bool:
        """Whether LM `lm` is held against `task` (another job's task of the same or a lower priority)."""
        return (
            lm in self.lms
            and task.priority <= self.priority
            and self.gang is not None
            and task.job_id != self.gang.job_id
        )

    def _hold(self, gang: Gang) -> None:
        self.gang = gang
        self.priority = max(t.priority for t in gang.tasks)
        self.lms = self._choose(gang.tasks)
        if self.lms:
            self.made += 1
            placer = self.gm.placer
            self._search = placer.search
            placer.search = ReservedSearch(self._search, self)  # type: ignore[assignment]

    def _release(self) -> None:
        """Put the placer's LM order back, and offer what is free on the held LMs to the tasks waiting for room."""
        view = self.gm.view
        if self._search is not None:
            self.gm.placer.search = self._search
            self._search = None
            for lm in self.lms:
                for part in view.views[lm]:
                    view.freed_nodes.extend((lm, part.start + i) for i, free in enumerate(part.free) if any(free))
        self.gang, self.lms = None, frozenset()

    def _choose(self, tasks: Sequence[TaskSpec]) -> frozenset[int]:
        """The fewest LMs, those with the most nodes free for the gang's largest task first, whose partitions of this
        GM (the ones the other GMs use last) could hold every task of the gang once idle; failing that, whose whole
        capacity could; failing that, none."""
        gm = self.gm
        views = gm.view.views
        largest = max(tasks, key=lambda t: t.request)
        free = [sum(driver_feasible_nodes(v, largest).bit_count() for v in row) for row in views]
        ranked = sorted(range(len(views)), key=lambda lm: (-free[lm], lm))
        for own_only in (True, False):
            chosen: list[int] = []
            for lm in ranked:
                chosen.append(lm)
                scope = [views[k][gm.gm_id] for k in chosen] if own_only else [v for k in chosen for v in views[k]]
                if fits_idle(tasks, scope):
                    return frozenset(chosen)
        return frozenset()


def _since(gang: Gang) -> float:
    return gang.since


def fits_idle(tasks: Sequence[TaskSpec], views: Sequence[PartitionView]) -> bool:
    """Whether every task fits at once on the nodes of `views` were they idle (first fit, largest task first: a
    `True` is certain, a `False` may miss a packing)."""
    left: dict[tuple[int, int], Resources] = {}  # (partition, node) -> capacity not yet given to a task
    for task in sorted(tasks, key=lambda t: t.request, reverse=True):
        for k, view in enumerate(views):
            nodes = view.matching(task.constraints) & view.could_ever_fit(task.request) & view.offering(task.driver)
            for i in iter_bits(nodes):
                room = left.get((k, i), view.capacity[i])
                if covers(room, task.request):
                    left[(k, i)] = tuple(map(sub, room, task.request))
                    break
            else:
                continue
            break
        else:
            return False
    return True


class ReservedSearch:
    """The placer's LM order while LMs are held: `inner`'s partitions without those of the held LMs, for the tasks
    the reservation holds them against."""

    __slots__ = ("inner", "reservation")

    def __init__(self, inner: PartitionSearch, reservation: GangReservation) -> None:
        self.inner = inner
        self.reservation = reservation

    def internal(self, task: TaskSpec) -> Iterator[PartitionView]:
        return self._without_held(self.inner.internal(task), task)

    def external(self, task: TaskSpec) -> Iterator[PartitionView]:
        return self._without_held(self.inner.external(task), task)

    def _without_held(self, views: Iterator[PartitionView], task: TaskSpec) -> Iterator[PartitionView]:
        holds = self.reservation.holds
        for view in views:
            if not holds(task, view.lm):
                yield view
