"""Priority classes at the GM: named class values (`MEGHA_PRIORITY_CLASSES`), the queue order that serves higher
classes first, and the preemption policy that asks an LM to stop strictly-lower-class tasks for a task that fits
nowhere (docs/priority.md).

Each task carries its class's value as `TaskSpec.priority` (0 without classes). Three plug-ins, composed with the
GM's other policies in `gm_policies` rather than replacing them:

* `PriorityOrder` (QueueSort): one queue of the base order per class, the highest class served first; within a
  class the base order decides (FIFO, or fair share among users under fair scheduling);
* `ClassBook` (the GM's class reports): each LM's usage per priority value, piggybacked on its deltas (eventually
  consistent, as fair scheduling's usage is);
* `PriorityPreemption` (PostFilter): a task that fits nowhere asks the LM whose reported lower-class usage could
  make room, lowest classes first; the LM chooses and verifies the victims from its exact state
  (`priority_verify.LocalClasses`). `PreemptionChain` tries it before the base policy (fair share).

Why preemptions cannot loop: a priority preemption stops only tasks of a strictly lower class than its preemptor,
and fair-share preemption never stops a task of a higher class than its preemptor and, within a class, moves
resources only from users over their share to a user under it without taking the victim below its share
(`fairness/verify.py`). So a victim can never preempt its preemptor back (tests/test_core_priority.py proves it by
hypothesis over random clusters and requests).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from megha.common.core.parked import Shape
from megha.common.core.policies.preemption import PreemptionPlan, PreemptionPolicy
from megha.common.core.policies.queue_order import FifoOrder, QueueOrder, TaskQueue
from megha.common.core.resources import Resources
from megha.common.core.task import MAX_PRIORITY, TaskSpec

DEFAULT_PRIORITY_CLASSES = "low:0,normal:100,high:1000"
"""The classes a service offers unless MEGHA_PRIORITY_CLASSES says otherwise."""

DEFAULT_CLASS = "normal"
"""The class of a job that names none, when the configured classes include it (else the lowest class)."""


@dataclass(frozen=True, slots=True)
class PriorityClasses:
    """Named priority classes (name -> value, higher value served first) and the class of a job naming none."""

    values: tuple[tuple[str, int], ...]
    default: str

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("priority classes need at least one class")
        names = [name for name, _ in self.values]
        if len(set(names)) != len(names):
            raise ValueError(f"priority class names must differ: {names}")
        if self.default not in names:
            raise ValueError(f"default priority class {self.default!r} is not one of {names}")
        for name, value in self.values:
            if not 0 <= value <= MAX_PRIORITY:
                raise ValueError(f"priority class {name!r}: value must be 0..{MAX_PRIORITY}, got {value}")

    def value(self, name: str | None) -> int:
        """The value of class `name` (None: the default class); KeyError naming the known classes."""
        table = dict(self.values)
        chosen = self.default if name is None else name
        if chosen not in table:
            raise KeyError(f"unknown priority class {chosen!r}; choose one of {sorted(table, key=table.__getitem__)}")
        return table[chosen]

    def name_of(self, value: int) -> str:
        """The name of the class of value `value` (its value as text when no class has it)."""
        return next((name for name, v in self.values if v == value), str(value))

    def above_default(self, name: str) -> bool:
        """Whether class `name` is served before the default class (and may preempt it)."""
        return self.value(name) > self.value(None)


def parse_class_users(text: str, classes: PriorityClasses) -> dict[str, frozenset[str]]:
    """Who may name each class above the default one, from 'class:user+user,...' (e.g. 'high:alice+bob'); a class
    not listed is for operators only. ValueError naming the item for an unknown class or one not above the
    default (every user may name those)."""
    users: dict[str, frozenset[str]] = {}
    for k, item in enumerate(x.strip() for x in text.split(",") if x.strip()):
        name, sep, listed = item.partition(":")
        name = name.strip()
        names = frozenset(u.strip() for u in listed.split("+") if u.strip())
        if not sep or not names:
            raise ValueError(f"priority class users {k}: {item!r} is not class:user+user")
        known = dict(classes.values)
        if name not in known:
            raise ValueError(f"priority class users {k}: unknown class {name!r}; the classes are {sorted(known)}")
        if not classes.above_default(name):
            raise ValueError(
                f"priority class users {k}: class {name!r} is not above the default class {classes.default!r}: "
                "every user may name it"
            )
        users[name] = users.get(name, frozenset()) | names
    return users


def parse_priority_classes(text: str) -> PriorityClasses:
    """Classes from 'name:value,...', e.g. 'low:0,normal:100,high:1000'; the default class is `normal` when
    listed, else the lowest class."""
    values = []
    for k, item in enumerate(x.strip() for x in text.split(",") if x.strip()):
        name, sep, value_text = item.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"priority class {k}: {item!r} is not name:value")
        try:
            value = int(value_text)
        except ValueError as exc:
            raise ValueError(f"priority class {k}: {item!r}: value must be an integer") from exc
        values.append((name.strip(), value))
    if not values:
        raise ValueError("priority classes need at least one class, e.g. 'low:0,normal:100,high:1000'")
    names = [name for name, _ in values]
    default = DEFAULT_CLASS if DEFAULT_CLASS in names else min(values, key=lambda nv: nv[1])[0]
    return PriorityClasses(tuple(values), default)


# ------------------------------------------------------------------ queue order


class ClassQueues:
    """A queue per priority value, each of the base order's kind; the highest class with a task goes first."""

    def __init__(self, new_queue: Callable[[], TaskQueue]) -> None:
        self._new_queue = new_queue
        self._by_class: dict[int, TaskQueue] = {}
        self._order: list[int] = []  # negated priorities, ascending: the highest class first
        self._len = 0

    def _queue(self, priority: int) -> TaskQueue:
        queue = self._by_class.get(priority)
        if queue is None:
            queue = self._by_class[priority] = self._new_queue()
            bisect.insort(self._order, -priority)
        return queue

    def _by_priority(self, tasks: Iterable[TaskSpec]) -> dict[int, list[TaskSpec]]:
        groups: dict[int, list[TaskSpec]] = {}
        for task in tasks:
            groups.setdefault(task.priority, []).append(task)
        return groups

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[TaskSpec]:
        for negated in self._order:
            yield from self._by_class[-negated]

    def extend(self, tasks: Iterable[TaskSpec]) -> None:
        for priority, group in self._by_priority(tasks).items():
            self._queue(priority).extend(group)
            self._len += len(group)

    def extendleft(self, tasks: Iterable[TaskSpec]) -> None:
        for priority, group in self._by_priority(tasks).items():
            self._queue(priority).extendleft(group)
            self._len += len(group)

    def push_front(self, task: TaskSpec) -> None:
        self._queue(task.priority).push_front(task)
        self._len += 1

    def push_back(self, task: TaskSpec) -> None:
        self._queue(task.priority).push_back(task)
        self._len += 1

    def popleft(self) -> TaskSpec:
        for negated in self._order:
            queue = self._by_class[-negated]
            if queue:
                self._len -= 1
                return queue.popleft()
        raise IndexError("pop from empty priority queues")

    def remove_if(self, drop: Callable[[TaskSpec], bool]) -> list[TaskSpec]:
        removed = [task for queue in self._by_class.values() for task in queue.remove_if(drop)]
        self._len -= len(removed)
        return removed


class PriorityOrder:
    """Higher priority classes first; within a class, the `base` order (FIFO by default, fair share under fair
    scheduling). A freed node goes to the parked shapes of the highest class first, in the base order within a
    class."""

    def __init__(self, base: QueueOrder | None = None) -> None:
        self.base: QueueOrder = base if base is not None else FifoOrder()
        self.name = "priority" if self.base.name == FifoOrder.name else f"priority+{self.base.name}"
        self.shapes_by_user = self.base.shapes_by_user

    def new_queue(self) -> ClassQueues:
        return ClassQueues(self.base.new_queue)

    def admission_reason(self, task: TaskSpec) -> str | None:
        return self.base.admission_reason(task)

    def service_order(self, shapes: Iterator[Shape], parked: Mapping[Shape, deque[TaskSpec]]) -> Iterable[Shape]:
        return sorted(self.base.service_order(shapes, parked), key=lambda shape: -shape[4])


# ----------------------------------------------------------------- class reports


class ClassReports(Protocol):
    """What a GM does with an LM's usage per priority value (piggybacked on its deltas)."""

    def report(self, lm: int, usage: dict[int, Resources]) -> None: ...


class NoClassReports:
    """Ignores them. The default (an LM without priority classes sends none)."""

    def report(self, lm: int, usage: dict[int, Resources]) -> None: ...


class ClassBook:
    """Each LM's last reported usage per priority value: where tasks of lower classes run."""

    def __init__(self, num_lms: int, total: Resources) -> None:
        self.total = total
        self.reported: list[dict[int, Resources]] = [{} for _ in range(num_lms)]
        self.lowest = 0  # the lowest priority any LM reports running (meaningful while `any_running`)
        self.any_running = False

    def report(self, lm: int, usage: dict[int, Resources]) -> None:
        if usage != self.reported[lm]:
            self.reported[lm] = usage
            held = [p for per_lm in self.reported for p, amounts in per_lm.items() if any(amounts)]
            self.any_running = bool(held)
            self.lowest = min(held, default=0)

    def lms_below(self, priority: int, request: Resources) -> list[int]:
        """LMs whose reported usage by classes below `priority` adds up to at least `request` (else no preemption
        there could make room), the one with the lowest such class first, then the one with the most of it."""
        found = []
        for lm, per_lm in enumerate(self.reported):
            lower = [(p, amounts) for p, amounts in per_lm.items() if p < priority and any(amounts)]
            if not lower:
                continue
            held = [sum(column) for column in zip(*(amounts for _, amounts in lower), strict=True)]
            if all(h >= r for h, r in zip(held, request, strict=True)):
                found.append((min(p for p, _ in lower), -sum(held), lm))
        return [lm for _, _, lm in sorted(found)]


# -------------------------------------------------------------------- preemption


class PriorityPreemption:
    """A task that fits nowhere asks an LM holding tasks of strictly lower classes (lowest first) to preempt some
    of them, whatever the users' shares; the LM picks and verifies the victims (lowest classes first, fewest
    victims) and refuses when none of its running tasks of lower classes make room on a node the task can use."""

    name = "priority"

    def __init__(self, book: ClassBook) -> None:
        self.book = book
        self._no_room: set[tuple[int, Resources]] | None = None  # during `retry`: (priority, request) found none

    def plan(self, task: TaskSpec, lms: list[int] | None) -> PreemptionPlan | None:
        book = self.book
        if not book.any_running or task.priority <= book.lowest:
            return None
        memo = self._no_room
        if memo is not None and (task.priority, task.request) in memo:
            return None
        candidates = book.lms_below(task.priority, task.request) if lms is None else lms
        if not candidates:
            if memo is not None:
                memo.add((task.priority, task.request))
            return None
        return PreemptionPlan(candidates[0], candidates[1:], [], book.total)

    def retry(
        self, parked: Mapping[Shape, deque[TaskSpec]], asking: set[Shape], attempt: Callable[[Shape], bool]
    ) -> None:
        book = self.book
        if not book.any_running:
            return
        self._no_room = set()
        try:
            for shape in list(parked):
                if shape[4] > book.lowest and shape not in asking and attempt(shape):
                    self._no_room.clear()
        finally:
            self._no_room = None


class PreemptionChain:
    """Preemption policies tried in turn: the first with a plan for a task picks the LM (and the LMs to ask after
    it); the later ones add the victims they would name at that LM, so that the one request carries them all (an LM
    looks for lower-class victims first, then verifies the named users, `LocalMaster._on_preempt`). On news from an
    LM each retries the parked shapes in turn (a shape with a request out is skipped by the later ones)."""

    def __init__(self, policies: Sequence[PreemptionPolicy]) -> None:
        self.policies = tuple(policies)
        self.name = "+".join(p.name for p in self.policies)

    def plan(self, task: TaskSpec, lms: list[int] | None) -> PreemptionPlan | None:
        found: PreemptionPlan | None = None
        later: tuple[PreemptionPolicy, ...] = ()
        for k, policy in enumerate(self.policies):
            found = policy.plan(task, lms)
            if found is not None:
                later = self.policies[k + 1 :]
                break
        if found is None:
            return None
        victims = list(found.victims)
        for policy in later:
            there = policy.plan(task, [found.lm])
            if there is not None:
                victims += there.victims
        return found if len(victims) == len(found.victims) else replace(found, victims=victims)

    def retry(
        self, parked: Mapping[Shape, deque[TaskSpec]], asking: set[Shape], attempt: Callable[[Shape], bool]
    ) -> None:
        for policy in self.policies:
            if parked:
                policy.retry(parked, asking, attempt)
