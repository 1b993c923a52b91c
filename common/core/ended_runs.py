"""An LM's memory of the runs that ended on it recently: so that a launch a GM repeats after losing the answer,
when the run already ended, does not run again, and so that a restarting GM learns which of its runs ended."""

from __future__ import annotations

from collections import deque


class EndedRuns:
    """The last `kept` runs that ended (none when `kept` is 0): (task id, attempt), with their GM and error."""

    def __init__(self, kept: int) -> None:
        self.kept = kept
        self._runs: set[tuple[str, int]] = set()
        self._order: deque[tuple[str, int, int, str]] = deque()

    def __bool__(self) -> bool:
        """True when runs are remembered at all."""
        return self.kept > 0

    def __contains__(self, run: tuple[str, int]) -> bool:
        return run in self._runs

    def add(self, task_id: str, attempt: int, gm: int, error: str) -> None:
        """Remember that run `attempt` of `task_id`, placed by GM `gm`, ended (`error` "" when it finished)."""
        self._runs.add((task_id, attempt))
        order = self._order
        order.append((task_id, attempt, gm, error))
        if len(order) > self.kept:
            old_id, old_attempt, _, _ = order.popleft()
            self._runs.discard((old_id, old_attempt))

    def of_gm(self, gm: int) -> list[tuple[str, int, str]]:
        """GM `gm`'s runs remembered, oldest first: (task id, attempt, error)."""
        return [(t, a, e) for t, a, g, e in self._order if g == gm]
