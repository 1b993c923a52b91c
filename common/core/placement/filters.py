"""Feasibility filters: the named steps a node must pass to run a task, and "why unschedulable" read off them.

As in Nomad's feasibility checkers (`scheduler/feasible.go`), each filter has a name and says in words what a
node lacks when it drops it, so the reason a task fits nowhere comes from the same steps that match it, not from
a second list of checks. A scheduler supplies `passes(filters)`: whether any node of its data centre passes all
of the given filters (bitsets in the GM's view, boolean arrays in the baselines); `explain` asks it step by step.

The matching hot path (`PartitionView.feasible`) fuses the constraint and free-resource steps into two cached
bitsets; the filters here are the same steps, one at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from megha.common.core.constraints import constraint_ids
from megha.common.core.resources import Resources, describe
from megha.common.core.task import TaskSpec

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, slots=True)
class Filter:
    """One feasibility step. `field`: the field of a submitted task to blame when no node passes it ("" for the
    request); `drops` and `keeps`: what a node lacks and has, in words, for the task and resource names."""

    name: str
    field: str
    drops: Callable[[TaskSpec, Sequence[str]], str]
    keeps: Callable[[TaskSpec, Sequence[str]], str]


CONSTRAINTS = Filter(
    "constraints",
    "constraints",
    lambda t, _: f"satisfies placement constraints {constraint_ids(t.constraints)}",
    lambda t, _: f"satisfying placement constraints {constraint_ids(t.constraints)}",
)
"""The node has every machine constraint the task asks for (bit-vector AND)."""

CAPACITY = Filter(
    "capacity",
    "",
    lambda t, names: f"has capacity for {describe(t.request, names)}",
    lambda t, names: f"with capacity for {describe(t.request, names)}",
)
"""The node's capacity covers the task's request (whatever runs on it now)."""

DRIVER = Filter(
    "driver",
    "driver",
    lambda t, _: f"offers driver {t.driver!r}",
    lambda t, _: f"offering driver {t.driver!r}",
)
"""The node's agent offers the task's driver (every simulated node offers burn)."""

FILTERS: tuple[Filter, ...] = (CONSTRAINTS, CAPACITY, DRIVER)
"""The steps in the order "why unschedulable" names them."""


def malformed(task: TaskSpec, names: Sequence[str]) -> str | None:
    """Why `task`'s request is not one any node could be asked for (wrong length, non-positive amounts), or None."""
    if len(task.request) != len(names):
        return f"request has {len(task.request)} amounts; expected {len(names)}"
    if any(v <= 0 for v in task.request):
        return f"request {describe(task.request, names)} must be positive"
    return None


def explain(
    task: TaskSpec,
    names: Sequence[str],
    passes: Callable[[Sequence[Filter]], bool],
    filters: Sequence[Filter] = FILTERS,
) -> tuple[str, str] | None:
    """(why no node could ever run `task`, the task's field to blame), or None when some node passes every filter.

    The reason is the first filter no node passes on its own ("no node offers driver 'gpu'"); failing that, the
    first filter at which the nodes passing all the earlier ones run out, named with what those nodes have ("no
    node satisfying placement constraints [0, 1] has capacity for cpu_millicores=8000")."""
    bad = malformed(task, names)
    if bad is not None:
        return bad, ""
    if passes(filters):
        return None
    for step in filters:
        if not passes((step,)):
            return f"no node {step.drops(task, names)}", step.field
    # Every filter alone keeps some node but all together keep none, so some prefix of two or more runs out.
    k = next(k for k in range(2, len(filters) + 1) if not passes(filters[:k]))
    kept = " ".join(f.keeps(task, names) for f in filters[: k - 1])
    return f"no node {kept} {filters[k - 1].drops(task, names)}", filters[k - 1].field


def explain_on_arrays(
    task: TaskSpec, names: Sequence[str], masks: np.ndarray, fitting: Callable[[Resources], np.ndarray]
) -> str | None:
    """`explain` over a data centre given as arrays (the baselines): each node's constraint mask, and `fitting`,
    the nodes whose capacity covers a request. Every node offers burn, the only driver the baselines run."""
    import numpy as np  # the baselines' arrays: not imported by a GM or LM, which never call this

    nodes: dict[Filter, Callable[[], np.ndarray]] = {
        CONSTRAINTS: lambda: (masks & task.constraints) == task.constraints,
        CAPACITY: lambda: fitting(task.request),
        DRIVER: lambda: np.full(len(masks), task.driver == "burn"),
    }

    def passes(steps: Sequence[Filter]) -> bool:
        return bool(np.logical_and.reduce([nodes[step]() for step in steps]).any())

    found = explain(task, names, passes)
    return None if found is None else found[0]
