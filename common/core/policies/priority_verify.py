"""An LM's side of priority classes: its exact usage per priority value (reported to every GM in deltas) and the
choice and verification of priority preemption victims (docs/priority.md).

A GM's priority preemption request names no victims: the LM, which alone knows exactly what runs on its nodes,
picks them among its running tasks of classes strictly below the waiting task's, so every victim is running and
strictly lower by construction; when no node the task could use frees enough that way, it refuses (and the
request may still be served by fair share's verification, `fairness/verify.py`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from megha.common.core.constraints import constraint_ids
from megha.common.core.resources import Resources
from megha.common.core.task import TaskSpec


@dataclass(frozen=True, slots=True)
class ClassVictims:
    """Run the task on `node` after preempting `task_ids` (lowest class first, newest first within a class)."""

    node: int
    task_ids: tuple[str, ...]


class LocalClasses:
    """Usage per priority value of one LM's cluster, and its running tasks by node."""

    def __init__(self, width: int) -> None:
        """`width`: how many resource types a request has."""
        self.width = width
        self._usage: dict[int, list[int]] = {}
        self._tasks: dict[int, dict[str, TaskSpec]] = {}  # node -> task id -> task, in launch order (newest last)

    def started(self, task: TaskSpec, node: int) -> None:
        usage = self._usage.get(task.priority)
        if usage is None:
            usage = self._usage[task.priority] = [0] * self.width
        for k, v in enumerate(task.request):
            usage[k] += v
        self._tasks.setdefault(node, {})[task.task_id] = task

    def ended(self, task: TaskSpec, node: int) -> None:
        usage = self._usage[task.priority]
        for k, v in enumerate(task.request):
            usage[k] -= v
        on_node = self._tasks[node]
        del on_node[task.task_id]
        if not on_node:
            del self._tasks[node]

    def snapshot(self) -> dict[int, Resources]:
        """Usage of every priority value held here (what the LM reports to GMs)."""
        return {p: tuple(v) for p, v in self._usage.items() if any(v)}

    def plan(
        self, task: TaskSpec, free: Sequence[Resources], masks: Sequence[int], drivers: Sequence[Collection[str]] = ()
    ) -> ClassVictims | str:
        """The node (satisfying `task`'s constraints and offering its driver) where preempting running tasks of
        classes strictly below `task.priority`, lowest class first and newest first within a class, frees room for
        it with the lowest highest-victim class, then the fewest victims; otherwise why there is none."""
        best: tuple[int, int, int] | None = None
        chosen: tuple[str, ...] = ()
        for node, on_node in self._tasks.items():
            if task.constraints & ~masks[node] or (drivers and task.driver not in drivers[node]):
                continue
            lower = [t for t in on_node.values() if t.priority < task.priority]
            if not lower:
                continue
            order = sorted(range(len(lower)), key=lambda k: (lower[k].priority, -k))
            room = list(free[node])
            victims: list[TaskSpec] = []
            for k in order:
                if all(r >= q for r, q in zip(room, task.request, strict=True)):
                    break
                victims.append(lower[k])
                room = [r + v for r, v in zip(room, lower[k].request, strict=True)]
            if not all(r >= q for r, q in zip(room, task.request, strict=True)):
                continue
            score = (victims[-1].priority if victims else -1, len(victims), node)  # no victim needed if it fits
            if best is None or score < best:
                best, chosen = score, tuple(v.task_id for v in victims)
        if best is None:
            return (
                f"no node satisfying placement constraints {constraint_ids(task.constraints)} frees enough by "
                f"preempting tasks of classes below priority {task.priority}"
            )
        return ClassVictims(best[2], chosen)


class NoLocalClasses:
    """An LM without priority classes: it keeps no usage per class and finds no priority victims. The default."""

    def started(self, task: TaskSpec, node: int) -> None: ...

    def ended(self, task: TaskSpec, node: int) -> None: ...

    def snapshot(self) -> None:
        return None

    def plan(self, task: TaskSpec, *state: object) -> str:
        """No victims, whatever the LM's state (`LocalClasses.plan`'s other arguments); no reason to add to fair
        share's."""
        return ""
