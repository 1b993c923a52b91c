"""The agent's own account of its nodes' free resources: each node's capacity less the requests of the runs it holds.

The LM holds the authoritative state of its cluster and never places beyond it. This account is the node's own
guard: a launch that would overcommit a node (a direct call, a faulty or stale LM) is refused, not run. Nodes are
numbered from 0, the agent's first, so that the account stays right if the LM numbers the agent's nodes anew.

It sits on the path of allocation time (every launch is checked against it), so the vector arithmetic is
`map` over `operator` functions: a third of the cost of `megha.common.core.resources`' generator-based helpers.
Requests are aligned to the capacity before they get here (the agent's API checks their length).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import add, le, sub

from megha.common.core.resources import Resources


class NodeLedger:
    """Free resources per node of one agent, every node of the same `capacity`."""

    def __init__(self, capacity: Resources) -> None:
        self.capacity = capacity
        self._used: dict[int, Resources] = {}  # only the nodes that held a run
        self._held: dict[str, tuple[int, Resources]] = {}  # by task id: its node and request

    def free(self, node: int) -> Resources:
        used = self._used.get(node)
        return self.capacity if used is None else tuple(map(sub, self.capacity, used))

    def could_hold(self, request: Resources) -> bool:
        """True when `request` fits an empty node."""
        return all(map(le, request, self.capacity))

    def overflow(self, runs: Sequence[tuple[int, Resources]]) -> tuple[int, Resources] | None:
        """The position of the first of `runs` (node, request) that does not fit its node once the runs before it
        are held too, and what that node then has free; None when they all fit together."""
        after: dict[int, Resources] = {}
        for k, (node, request) in enumerate(runs):
            free = after.get(node)
            if free is None:
                free = self.free(node)
            if not all(map(le, request, free)):
                return k, free
            after[node] = tuple(map(sub, free, request))
        return None

    def hold(self, task_id: str, node: int, request: Resources) -> None:
        """Count a run's request against its node until `release(task_id)`."""
        self._held[task_id] = (node, request)
        used = self._used.get(node)
        self._used[node] = request if used is None else tuple(map(add, used, request))

    def release(self, task_id: str) -> None:
        """Give back what a run held; nothing for a task not held."""
        held = self._held.pop(task_id, None)
        if held is None:
            return
        node, request = held
        self._used[node] = tuple(map(sub, self._used[node], request))
