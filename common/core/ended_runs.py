"""An LM's memory of the runs that ended on it recently: so that a launch a GM repeats after losing the answer,
when the run already ended, does not run again, and so that a restarting GM learns which of its runs ended and
how (`megha.common.core.recovery`)."""

from __future__ import annotations

from collections import deque

from megha.common.core.messages import EndedRun


class EndedRuns:
    """The last `kept` runs that ended (none when `kept` is 0), each with the GM that placed it."""

    def __init__(self, kept: int) -> None:
        self.kept = kept
        self._runs: set[tuple[str, int, int]] = set()  # (task id, attempt, run number)
        self._order: deque[tuple[int, EndedRun]] = deque()

    def __bool__(self) -> bool:
        """True when runs are remembered at all."""
        return self.kept > 0

    def __contains__(self, run: tuple[str, int, int]) -> bool:
        """Whether run (task id, attempt, run number) ended here: the same attempt launched again under another run
        number (by a GM that restarted) is another run."""
        return run in self._runs

    def add(self, gm: int, run: EndedRun) -> None:
        """Remember that `run`, placed by GM `gm`, ended."""
        self._runs.add((run.task_id, run.attempt, run.run_number))
        order = self._order
        order.append((gm, run))
        if len(order) > self.kept:
            _, old = order.popleft()
            self._runs.discard((old.task_id, old.attempt, old.run_number))

    def of_gm(self, gm: int) -> list[EndedRun]:
        """GM `gm`'s runs remembered, oldest first."""
        return [run for g, run in self._order if g == gm]
