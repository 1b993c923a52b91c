"""Queue order (the Kubernetes scheduler framework's QueueSort extension point): which queued task a GM tries
next, and which parked shape gets a node that frees up. FIFO is the default; `UserTurnsOrder` serves users in turns;
`KeyedOrder` serves tasks by a key."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from megha.common.core.parked import Shape
from megha.common.core.task import TaskSpec


class TaskQueue(Protocol):
    """The queue a GM's scheduling loop takes tasks from: deque-like, in the order its policy serves them."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[TaskSpec]: ...

    def extend(self, tasks: Iterable[TaskSpec]) -> None:
        """Newly accepted tasks, at the back."""

    def extendleft(self, tasks: Iterable[TaskSpec]) -> None:
        """Tasks to retry first (refused as inconsistent, preempted, lost): as deque.extendleft, the last first."""

    def push_front(self, task: TaskSpec) -> None:
        """A parked task taken back to be tried next (already counted as waiting)."""

    def push_back(self, task: TaskSpec) -> None:
        """A task that fits nowhere now, to be tried again as a new request (already counted as waiting)."""

    def popleft(self) -> TaskSpec: ...

    def remove_if(self, drop: Callable[[TaskSpec], bool]) -> list[TaskSpec]:
        """Take out the tasks `drop` selects (a cancelled job's), keeping the others' order; returns them."""


class QueueOrder(Protocol):
    """A queue order policy."""

    name: str
    #: Whether parked shapes are kept apart per user (the order serves users, not only tasks).
    shapes_by_user: bool

    def new_queue(self) -> TaskQueue: ...

    def admission_reason(self, task: TaskSpec) -> str | None:
        """Why this GM holds no queue for `task` (None when it does)."""

    def service_order(self, shapes: Iterator[Shape], parked: Mapping[Shape, deque[TaskSpec]]) -> Iterable[Shape]:
        """Parked shapes a freed node could take (given oldest first) in the order they are served; `parked`
        holds each shape's tasks, oldest first."""


class FifoQueue(deque[TaskSpec]):
    """First in, first out."""

    def push_front(self, task: TaskSpec) -> None:
        self.appendleft(task)

    def push_back(self, task: TaskSpec) -> None:
        self.append(task)

    def remove_if(self, drop: Callable[[TaskSpec], bool]) -> list[TaskSpec]:
        removed = [t for t in self if drop(t)]
        if removed:
            kept = [t for t in self if not drop(t)]
            self.clear()
            self.extend(kept)
        return removed


class FifoOrder:
    """Tasks in the order they arrived; a parked shape waits its turn oldest first. The default."""

    name = "fifo"
    shapes_by_user = False

    def new_queue(self) -> FifoQueue:
        return FifoQueue()

    def admission_reason(self, task: TaskSpec) -> str | None:
        return None

    def service_order(self, shapes: Iterator[Shape], parked: Mapping[Shape, deque[TaskSpec]]) -> Iterable[Shape]:
        return shapes


class UserTurnsQueue:
    """A FIFO queue per user, the users served in turns: the next task is the oldest of the user whose turn it is,
    and that user goes to the back of the turns; tasks put back in front come before any user's."""

    def __init__(self) -> None:
        self._front: deque[TaskSpec] = deque()
        self._by_user: dict[str, deque[TaskSpec]] = {}  # only users with queued tasks
        self._turns: deque[str] = deque()  # those users, whose turn is next first
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[TaskSpec]:
        """The tasks in the order they would be served, were no more queued."""
        yield from self._front
        queues = [self._by_user[user] for user in self._turns]
        for turn in itertools.zip_longest(*queues):
            yield from (task for task in turn if task is not None)

    def extend(self, tasks: Iterable[TaskSpec]) -> None:
        for task in tasks:
            queue = self._by_user.get(task.user)
            if queue is None:
                queue = self._by_user[task.user] = deque()
                self._turns.append(task.user)
            queue.append(task)
            self._len += 1

    def extendleft(self, tasks: Iterable[TaskSpec]) -> None:
        for task in tasks:
            self.push_front(task)

    def push_front(self, task: TaskSpec) -> None:
        self._front.appendleft(task)
        self._len += 1

    def push_back(self, task: TaskSpec) -> None:
        self.extend((task,))

    def popleft(self) -> TaskSpec:
        if self._front:
            self._len -= 1
            return self._front.popleft()
        if not self._turns:
            raise IndexError("pop from an empty queue")
        user = self._turns.popleft()
        queue = self._by_user[user]
        task = queue.popleft()
        if queue:
            self._turns.append(user)
        else:
            del self._by_user[user]
        self._len -= 1
        return task

    def remove_if(self, drop: Callable[[TaskSpec], bool]) -> list[TaskSpec]:
        removed = [t for t in self._front if drop(t)]
        if removed:
            self._front = deque(t for t in self._front if not drop(t))
        for user in list(self._turns):
            queue = self._by_user[user]
            gone = [t for t in queue if drop(t)]
            if gone:
                removed += gone
                kept = deque(t for t in queue if not drop(t))
                if kept:
                    self._by_user[user] = kept
                else:
                    del self._by_user[user]
                    self._turns.remove(user)
        self._len -= len(removed)
        return removed


class UserTurnsOrder:
    """Users served in turns, each user's tasks in the order they arrived: one user's large job does not keep
    another's tasks queued behind it (without fair shares, `MEGHA_QUEUES`, which weigh users by share). A freed node
    goes to the parked shapes of the users in turn too, the first user moving on by one each time."""

    name = "users"
    shapes_by_user = True

    def __init__(self) -> None:
        self._turn = 0

    def new_queue(self) -> UserTurnsQueue:
        return UserTurnsQueue()

    def admission_reason(self, task: TaskSpec) -> str | None:
        return None

    def service_order(self, shapes: Iterator[Shape], parked: Mapping[Shape, deque[TaskSpec]]) -> Iterable[Shape]:
        by_user: dict[str, list[Shape]] = {}
        for shape in shapes:
            by_user.setdefault(shape[2], []).append(shape)
        if len(by_user) < 2:
            return next(iter(by_user.values()), [])
        groups = list(by_user.values())
        first = self._turn % len(groups)
        self._turn += 1
        groups = groups[first:] + groups[:first]
        return [shape for turn in itertools.zip_longest(*groups) for shape in turn if shape is not None]


class KeyedQueue:
    """Tasks served smallest key first, FIFO among equal keys; tasks put back in front come before any key."""

    def __init__(self, key: Callable[[TaskSpec], Any]) -> None:
        self._key = key
        self._heap: list[tuple[int, Any, int, TaskSpec]] = []  # (0 front / 1 keyed, key, arrival, task)
        self._arrivals = itertools.count()
        self._fronts = itertools.count(-1, -1)  # front entries: the newest first

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[TaskSpec]:
        return (entry[3] for entry in sorted(self._heap, key=lambda e: e[:3]))

    def extend(self, tasks: Iterable[TaskSpec]) -> None:
        for task in tasks:
            heapq.heappush(self._heap, (1, self._key(task), next(self._arrivals), task))

    def extendleft(self, tasks: Iterable[TaskSpec]) -> None:
        for task in tasks:
            self.push_front(task)

    def push_front(self, task: TaskSpec) -> None:
        heapq.heappush(self._heap, (0, 0, next(self._fronts), task))

    def push_back(self, task: TaskSpec) -> None:
        """As a new request: by its key, after the tasks of equal key queued so far."""
        self.extend((task,))

    def popleft(self) -> TaskSpec:
        if not self._heap:
            raise IndexError("pop from an empty queue")
        return heapq.heappop(self._heap)[3]

    def remove_if(self, drop: Callable[[TaskSpec], bool]) -> list[TaskSpec]:
        removed = [entry[3] for entry in self._heap if drop(entry[3])]
        if removed:
            self._heap = [entry for entry in self._heap if not drop(entry[3])]
            heapq.heapify(self._heap)
        return removed


class KeyedOrder:
    """Base of an order by a key of each task (smallest first): subclass it and define `key`."""

    name = "keyed"
    shapes_by_user = False

    def key(self, task: TaskSpec) -> Any:
        raise NotImplementedError

    def new_queue(self) -> KeyedQueue:
        return KeyedQueue(self.key)

    def admission_reason(self, task: TaskSpec) -> str | None:
        return None

    def service_order(self, shapes: Iterator[Shape], parked: Mapping[Shape, deque[TaskSpec]]) -> Iterable[Shape]:
        return sorted(shapes, key=lambda shape: self.key(parked[shape][0]))
