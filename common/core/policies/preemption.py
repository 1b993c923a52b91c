"""Preemption (the Kubernetes scheduler framework's PostFilter extension point): what a GM may do for a task
that fits nowhere in its view. None by default; fair share preemption is in `fair_share`."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from megha.common.core.messages import Victim
from megha.common.core.parked import Shape
from megha.common.core.resources import Resources
from megha.common.core.task import TaskSpec


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    """Ask LM `lm` to stop tasks of `victims` (most over their share first) so that the task can run there; if it
    refuses, ask each LM of `rest` in turn. `total`: the data centre's resources, for the LM's share checks."""

    lm: int
    rest: list[int]
    victims: list[Victim]
    total: Resources


class PreemptionPolicy(Protocol):
    """A preemption policy."""

    name: str

    def plan(self, task: TaskSpec, lms: list[int] | None) -> PreemptionPlan | None:
        """A preemption request for `task` (to one of `lms`, or any LM when None), or None when it may not
        preempt."""

    def retry(
        self, parked: Mapping[Shape, deque[TaskSpec]], asking: set[Shape], attempt: Callable[[Shape], bool]
    ) -> None:
        """On news from an LM, let parked shapes (not those `asking` already) try to preempt again: `attempt(shape)`
        tries with the shape's oldest task and says whether a request went out."""


class NoPreemption:
    """A task that fits nowhere waits for room. The default."""

    name = "none"

    def plan(self, task: TaskSpec, lms: list[int] | None) -> PreemptionPlan | None:
        return None

    def retry(
        self, parked: Mapping[Shape, deque[TaskSpec]], asking: set[Shape], attempt: Callable[[Shape], bool]
    ) -> None:
        return None
