"""Usage accounting: what a GM tells its fairness policy about its tasks' demand and consumption as they move
through its queue and the LMs. A no-op by default; fair scheduling's `ShareBook` keeps the books."""

from __future__ import annotations

from typing import Protocol

from megha.common.core.resources import Resources
from megha.common.core.task import TaskSpec


class UsageAccounting(Protocol):
    """The events a GM reports to its usage accounting."""

    def pending(self, task: TaskSpec) -> None:
        """`task` waits to be placed again (after a refused preemption request)."""

    def withdrawn(self, task: TaskSpec) -> None:
        """A task waiting to be placed was cancelled."""

    def placed(self, task: TaskSpec, lm: int) -> None:
        """A placement (or preemption request) for `task` went to LM `lm`: it counts against its user."""

    def released(self, task: TaskSpec, lm: int) -> None:
        """`task`'s run at LM `lm` ended, or its placement was refused: it no longer counts."""

    def report(self, lm: int, usage: dict[str, Resources]) -> None:
        """LM `lm`'s piggybacked usage per user."""


class NoAccounting:
    """Keeps no books. The default."""

    def pending(self, task: TaskSpec) -> None: ...

    def withdrawn(self, task: TaskSpec) -> None: ...

    def placed(self, task: TaskSpec, lm: int) -> None: ...

    def released(self, task: TaskSpec, lm: int) -> None: ...

    def report(self, lm: int, usage: dict[str, Resources]) -> None: ...
