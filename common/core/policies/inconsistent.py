"""A task an LM refused as inconsistent (the GM's view of the node was stale): what its GM does with it next.

`retry` (the default): the task goes back to the front of its queue and is matched again in the same scheduling
pass, on the view just refreshed with the node states the LM's answer carried. `wait-for-free` does as the authors'
trace-driven simulator (meghanat/megha-constraint-aware, the GM's `unschedule_task`): the task waits in the GM's
queue until a node it could use frees up in the view, by a completion or a delta, and is matched then; unlike a
parked task that fits nowhere, it does not hold back newer tasks of its shape.
"""

from __future__ import annotations

from typing import Protocol

from megha.common.core.parked import ParkedShapes, Shape
from megha.common.core.task import TaskSpec


class InconsistentPolicy(Protocol):
    """What a GM does with a task refused as inconsistent."""

    name: str

    @property
    def waiting(self) -> ParkedShapes | None:
        """The refused tasks waiting for a freed node, by shape (None when the policy retries at once)."""

    def hold(self, shape: Shape, task: TaskSpec) -> bool:
        """Take `task` (refused as inconsistent) to wait; False when the GM should retry it at once."""


class RetryAtOnce:
    """Retried at once, first in its queue, on the states the LM's answer carried. The default."""

    name = "retry"
    waiting: ParkedShapes | None = None

    def __init__(self, waiting: ParkedShapes | None = None) -> None:
        """`waiting` is not used: no task waits."""

    def hold(self, shape: Shape, task: TaskSpec) -> bool:
        return False


class WaitForFree:
    """Waits until a node its shape could use frees up in the GM's view (the authors' simulator)."""

    name = "wait-for-free"

    def __init__(self, waiting: ParkedShapes | None = None) -> None:
        """The refused tasks wait in `waiting` (the GM's waiting order's; by default plain shapes)."""
        self.waiting: ParkedShapes = ParkedShapes() if waiting is None else waiting

    def hold(self, shape: Shape, task: TaskSpec) -> bool:
        self.waiting.add(shape, task)
        return True
