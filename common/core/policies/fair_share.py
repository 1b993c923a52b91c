"""Fair scheduling as GM policies (Megha paper, section IV-B5 and Algorithm 2): user queues served in the share
policy's order, preemption of users above their share for a user below it, and the share book as the GM's usage
accounting. All three share one `ShareBook`."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping

from megha.common.core.fairness.queues import ShareBook, UserQueues
from megha.common.core.messages import Victim
from megha.common.core.parked import Shape
from megha.common.core.policies.preemption import PreemptionPlan
from megha.common.core.resources import Resources
from megha.common.core.task import TaskSpec


class FairQueueOrder:
    """The GM's own users' queues; the share policy picks which user goes next, among the non-empty queues in
    round-robin order. Parked shapes are kept per user, and a freed node goes to users in the same order."""

    name = "fair"
    shapes_by_user = True

    def __init__(self, book: ShareBook) -> None:
        self.book = book
        self._queues = UserQueues(book)

    def new_queue(self) -> UserQueues:
        self._queues = UserQueues(self.book)
        return self._queues

    def admission_reason(self, task: TaskSpec) -> str | None:
        book = self.book
        if task.user in book.own:
            return None
        owner = next((q.gm for q in book.config.queues if q.user == task.user), None)
        if owner is None:
            return f"user {task.user!r} has no queue (configured users: {', '.join(sorted(book.shares))})"
        return f"user {task.user!r}'s queue is served by GM {owner}, not GM {book.gm}"

    def service_order(self, shapes: Iterator[Shape], parked: Mapping[Shape, deque[TaskSpec]]) -> Iterable[Shape]:
        rank = {user: k for k, user in enumerate(self.book.order_users(self._queues.rotation()))}
        return sorted(shapes, key=lambda shape: rank[shape[2]])


class FairSharePreemption:
    """Algorithm 2: a task that fits nowhere, of a user below its share, asks an LM holding tasks of the users most
    over their shares to preempt some of them (the LM verifies the request against its own state).

    Whether a user is below its share, and whether a (user, request) finds victims, change only when a request
    goes out (its task then counts against its user); during one `retry` pass they are remembered, so hundreds of
    parked shapes cost a few share checks."""

    name = "fair-share"

    def __init__(self, book: ShareBook) -> None:
        self.book = book
        self._no_victims: set[tuple[str, Resources]] | None = None  # during `retry`: (user, request) found none

    def plan(self, task: TaskSpec, lms: list[int] | None) -> PreemptionPlan | None:
        book = self.book
        if not book.below_share(task.user):
            return None
        memo = self._no_victims
        if memo is not None and (task.user, task.request) in memo:
            return None
        victims = book.violators(task.user, task.request)
        candidates = (book.lms_holding(victims) if lms is None else lms) if victims else []
        if not candidates:
            if memo is not None:
                memo.add((task.user, task.request))
            return None
        lm = candidates[0]
        return PreemptionPlan(lm, candidates[1:], [Victim(u, book.usage_elsewhere(u, lm)) for u in victims], book.total)

    def retry(
        self, parked: Mapping[Shape, deque[TaskSpec]], asking: set[Shape], attempt: Callable[[Shape], bool]
    ) -> None:
        book = self.book
        if not any(book.below_share(user) for user in book.shares):
            return
        below: dict[str, bool] = {}
        self._no_victims = set()
        try:
            for shape in list(parked):
                user = shape[2]
                if shape in asking:
                    continue
                is_below = below.get(user)
                if is_below is None:
                    is_below = below[user] = book.below_share(user)
                if is_below and attempt(shape):
                    below.clear()
                    self._no_victims.clear()
        finally:
            self._no_victims = None
