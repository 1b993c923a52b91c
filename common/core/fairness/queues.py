"""A GM's side of fair scheduling: its user queues served in the policy's order, and its book of every user's
consumption (its own queues' exactly, the others' as the LMs last reported them)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence

from megha.common.core.fairness.config import FairnessConfig
from megha.common.core.fairness.policy import QueueStanding, SharePolicy
from megha.common.core.resources import Resources
from megha.common.core.task import TaskSpec


def _add(into: list[int], amounts: Resources, sign: int = 1) -> None:
    for k, v in enumerate(amounts):
        into[k] += sign * v


class ShareBook:
    """Consumption and pending demand per user, as GM `gm` knows them.

    Its own queues' usage counts every task from the moment the GM sends its placement (or preemption request)
    until the task ends, is rejected or is preempted: exact, because only this GM places them. Demand is what
    the user's tasks not yet placed (queued or parked) ask for. Other users'
    usage is the sum of the per-LM figures the LMs piggyback on their deltas: eventually consistent.
    """

    def __init__(self, config: FairnessConfig, gm: int, num_lms: int, total: Resources, policy: SharePolicy) -> None:
        self.config = config
        self.gm = gm
        self.total = total
        self.policy = policy
        self.shares = config.shares()
        self.own = {q.user for q in config.queues_of(gm)}
        self._usage: dict[str, list[int]] = {u: [0] * len(total) for u in self.own}
        self._usage_at: list[dict[str, list[int]]] = [{u: [0] * len(total) for u in self.own} for _ in range(num_lms)]
        self.demand: dict[str, list[int]] = {u: [0] * len(total) for u in self.own}
        self.reported: list[dict[str, Resources]] = [{} for _ in range(num_lms)]
        self._consumption: dict[str, float] | None = None  # cache, dropped on every usage change

    # ----------------------------------------------------------- own queues

    def pending(self, task: TaskSpec) -> None:
        """`task` waits to be placed (queued, or parked after a failed attempt): it counts in its user's demand
        until `placed`."""
        _add(self.demand[task.user], task.request)

    def withdrawn(self, task: TaskSpec) -> None:
        """A task waiting to be placed was cancelled: it no longer counts in its user's demand."""
        _add(self.demand[task.user], task.request, -1)

    def placed(self, task: TaskSpec, lm: int) -> None:
        self._consumption = None
        _add(self._usage[task.user], task.request)
        _add(self.demand[task.user], task.request, -1)
        _add(self._usage_at[lm][task.user], task.request)

    def released(self, task: TaskSpec, lm: int) -> None:
        self._consumption = None
        _add(self._usage[task.user], task.request, -1)
        _add(self._usage_at[lm][task.user], task.request, -1)

    # ------------------------------------------------------------ LM reports

    def report(self, lm: int, usage: dict[str, Resources]) -> None:
        if usage != self.reported[lm]:
            self._consumption = None
            self.reported[lm] = usage

    # --------------------------------------------------------------- queries

    def usage(self, user: str) -> Resources:
        if user in self.own:
            return tuple(self._usage[user])
        totals = [0] * len(self.total)
        for per_lm in self.reported:
            amounts = per_lm.get(user)
            if amounts is not None:
                _add(totals, amounts)
        return tuple(totals)

    def usage_elsewhere(self, user: str, lm: int) -> Resources:
        """This GM's view of `user`'s usage on every LM but `lm` (which knows its own part exactly)."""
        if user in self.own:
            return tuple(a - b for a, b in zip(self._usage[user], self._usage_at[lm][user], strict=True))
        totals = [0] * len(self.total)
        for other, per_lm in enumerate(self.reported):
            amounts = per_lm.get(user)
            if other != lm and amounts is not None:
                _add(totals, amounts)
        return tuple(totals)

    def consumption(self, user: str) -> float:
        cached = self._consumption
        if cached is None:
            cached = self._consumption = {u: self.policy.consumption(self.usage(u), self.total) for u in self.shares}
        return cached[user]

    def below_share(self, user: str) -> bool:
        return self.consumption(user) < self.shares[user]

    def violators(self, exclude: str, request: Resources) -> list[str]:
        """Users other than `exclude` above their share by at least `request` (an LM never takes a victim below
        its share, so a smaller excess cannot make room), largest violation first (Algorithm 2's
        get_next_user)."""
        over = []
        for user, share in self.shares.items():
            if user != exclude:
                violation = self.consumption(user) - share
                if violation > 0:
                    left = tuple(max(0, a - b) for a, b in zip(self.usage(user), request, strict=True))
                    if self.policy.consumption(left, self.total) >= share:
                        over.append((-violation, user))
        return [user for _, user in sorted(over)]

    def standings(self, users: Iterable[str]) -> list[QueueStanding]:
        return [QueueStanding(u, self.shares[u], self.usage(u), tuple(self.demand[u])) for u in users]

    def order_users(self, users: Sequence[str]) -> list[str]:
        """`users` (own queues, in round-robin order) in the order the policy serves them now."""
        if len(users) < 2:
            return list(users)
        return [users[i] for i in self.policy.rank(self.standings(users), self.total)]

    def lms_holding(self, users: Iterable[str]) -> list[int]:
        """LMs that last reported usage by any of `users`, most of it first."""
        wanted = set(users)
        held = []
        for lm, per_lm in enumerate(self.reported):
            amount = sum(sum(v) for u, v in per_lm.items() if u in wanted)
            if amount > 0:
                held.append((-amount, lm))
        return [lm for _, lm in sorted(held)]


class UserQueues:
    """A GM's user queues behind the deque operations its scheduling loop uses (popleft, extend, extendleft):
    tasks of one user keep their order; which user goes next is the share policy's pick among the non-empty
    queues, offered in round-robin order."""

    def __init__(self, book: ShareBook) -> None:
        self.book = book
        self._order = [q.user for q in book.config.queues_of(book.gm)]
        self._queues: dict[str, deque[TaskSpec]] = {u: deque() for u in self._order}
        self._next = 0
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[TaskSpec]:
        for user in self._order:
            yield from self._queues[user]

    def extend(self, tasks: Iterable[TaskSpec]) -> None:
        for task in tasks:
            self._queues[task.user].append(task)
            self.book.pending(task)
            self._len += 1

    def extendleft(self, tasks: Iterable[TaskSpec]) -> None:
        """As deque.extendleft: each task goes to the front of its user's queue, so the last one ends up first."""
        for task in tasks:
            self._queues[task.user].appendleft(task)
            self.book.pending(task)
            self._len += 1

    def popleft(self) -> TaskSpec:
        n = len(self._order)
        candidates = [
            self._order[(self._next + k) % n] for k in range(n) if self._queues[self._order[(self._next + k) % n]]
        ]
        if not candidates:
            raise IndexError("pop from empty user queues")
        book = self.book
        if len(candidates) == 1:
            user = candidates[0]
        else:
            user = candidates[book.policy.pick(book.standings(candidates), book.total)]
        self._next = (self._order.index(user) + 1) % n
        self._len -= 1
        return self._queues[user].popleft()

    def remove_if(self, drop: Callable[[TaskSpec], bool]) -> list[TaskSpec]:
        """Take out the queued tasks `drop` selects (a cancelled job's), keeping the others' order; returns them."""
        removed: list[TaskSpec] = []
        for user, queue in self._queues.items():
            kept = deque(t for t in queue if not drop(t))
            if len(kept) != len(queue):
                removed += [t for t in queue if drop(t)]
                self._queues[user] = kept
        self._len -= len(removed)
        return removed

    def push_front(self, task: TaskSpec) -> None:
        """Put a parked task (already counted in its user's demand) back at the front of its queue."""
        self._queues[task.user].appendleft(task)
        self._len += 1

    def push_back(self, task: TaskSpec) -> None:
        """Put a task that fits nowhere now (already counted in its user's demand) at the back of its queue
        (Algorithm 2: "reinsert request in user's task queue")."""
        self._queues[task.user].append(task)
        self._len += 1

    def rotation(self) -> list[str]:
        """Own users in round-robin order from the next one due; advances the rotation."""
        n = len(self._order)
        users = [self._order[(self._next + k) % n] for k in range(n)]
        self._next = (self._next + 1) % n
        return users
