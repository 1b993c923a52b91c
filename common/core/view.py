"""A GM's possibly stale view of one LM partition: static constraint and driver bit-vectors plus free resources
per node.

Bitsets are Python ints, bit i = node i of the partition. Two caches keep matching to a few big-int ANDs:
  * `matching(mask)`: nodes satisfying every constraint in a task's mask (static, so cached forever);
  * `fitting(request)`: nodes whose free resources cover a request, kept current on every change for the
    request shapes seen recently (one shape in slot mode).
"""

from __future__ import annotations

from functools import cache, lru_cache
from operator import ge

from megha.common.core.cluster import PartitionSpec
from megha.common.core.constraints import ALL_CONSTRAINTS_MASK, NUM_CONSTRAINTS, iter_bits
from megha.common.core.resources import Resources
from megha.common.core.task import TaskSpec

MAX_FIT_SHAPES = 64


@cache
def missing_constraints(mask: int) -> tuple[int, ...]:
    """The constraint ids a node with machine constraints `mask` lacks (memoised: nodes share few masks, and a GM
    asks for every node that frees up while tasks wait)."""
    return tuple(iter_bits(ALL_CONSTRAINTS_MASK & ~mask))


@cache
def constraints_of(mask: int) -> tuple[int, ...]:
    """The constraint ids in `mask` (memoised: every GM's view of every partition looks up the masks of the tasks it
    matches, thousands of distinct masks in a replay, each once per view)."""
    return tuple(iter_bits(mask))


def covers(free: Resources, request: Resources) -> bool:
    """True when `free` has at least `request` of every resource."""
    return all(map(ge, free, request))


def covering(amounts: list[Resources], request: Resources) -> int:
    """Bitset of the nodes whose `amounts` (free resources or capacity) cover `request`."""
    bits = 0
    for i, amount in enumerate(amounts):
        if covers(amount, request):
            bits |= 1 << i
    return bits


@lru_cache(maxsize=4096)
def partition_bits(
    spec: PartitionSpec,
) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...], tuple[tuple[str, int], ...]]:
    """A partition's static bit-vectors: the nodes satisfying each constraint id, (n, the nodes with n machine
    constraints) for each n some node has (n ascending, the Minimum-Constraints choice's order) and the nodes
    offering each task driver.
    Built once per partition: every GM's view of it shares them (memoised, as a few GMs view the same specs)."""
    bits = [0] * NUM_CONSTRAINTS
    by_count: dict[int, int] = {}
    for i, mask in enumerate(spec.constraint_masks):
        for k in iter_bits(mask):
            bits[k] |= 1 << i
        n = mask.bit_count()
        by_count[n] = by_count.get(n, 0) | 1 << i
    drivers: dict[str, int] = {}
    for i, offered in enumerate(spec.node_drivers()):
        for driver in offered:
            drivers[driver] = drivers.get(driver, 0) | 1 << i
    return tuple(bits), tuple((n, by_count[n]) for n in sorted(by_count)), tuple(drivers.items())


class PartitionView:
    """The GM's copy of partition `gm` of LM `lm`; node i is the LM's physical node `start + i`."""

    __slots__ = (
        "_cap_fit",
        "_match",
        "all_bits",
        "capacity",
        "constraint_bits",
        "count_levels",
        "driver_bits",
        "fit_cache",
        "free",
        "gm",
        "lm",
        "masks",
        "size",
        "start",
    )

    def __init__(self, spec: PartitionSpec, start: int) -> None:
        self.lm = spec.lm
        self.gm = spec.gm
        self.start = start
        self.size = spec.size
        self.capacity: list[Resources] = list(spec.capacities)
        self.free: list[Resources] = list(spec.capacities)
        self.masks: list[int] = list(spec.constraint_masks)
        self.all_bits = (1 << self.size) - 1
        self.constraint_bits, self.count_levels, drivers = partition_bits(spec)
        self.driver_bits: dict[str, int] = dict(drivers)  # driver -> the nodes offering it
        self._match: dict[int, int] = {}
        # request -> the nodes whose free resources cover it, kept current by `set_free` (and `GlobalView.sync`)
        self.fit_cache: dict[Resources, int] = {}
        self._cap_fit: dict[Resources, int] = {}

    def fewest_constraints(self, candidates: int) -> tuple[int, int]:
        """(the fewest machine constraints any of `candidates` has, those candidates): Minimum-Constraints' nodes,
        and the rarity order's measure of a partition."""
        for count, nodes in self.count_levels:
            nodes &= candidates
            if nodes:
                return count, nodes
        raise ValueError("no candidates to choose from")

    def matching(self, mask: int) -> int:
        """Nodes whose machine constraints include every constraint in `mask` (bitwise AND of bit-vectors)."""
        bits = self._match.get(mask)
        if bits is None:
            bits = self.all_bits
            for k in constraints_of(mask):
                bits &= self.constraint_bits[k]
            self._match[mask] = bits
        return bits

    def offering(self, driver: str) -> int:
        """Nodes whose agent offers the task driver `driver`."""
        return self.driver_bits.get(driver, 0)

    def fitting(self, request: Resources) -> int:
        """Nodes whose free resources (in this view) cover `request`."""
        bits = self.fit_cache.get(request)
        if bits is None:
            if len(self.fit_cache) >= MAX_FIT_SHAPES:
                del self.fit_cache[next(iter(self.fit_cache))]
            bits = self.fit_cache[request] = covering(self.free, request)
        return bits

    def feasible(self, task: TaskSpec) -> int:
        """Nodes that satisfy `task`'s constraints and (in this view) have room for its request: the two cached
        bitsets ANDed, read straight from the caches on the hot path."""
        match = self._match.get(task.constraints)
        if match is None:
            match = self.matching(task.constraints)
        if not match:
            return 0
        fit = self.fit_cache.get(task.request)
        if fit is None:
            fit = self.fitting(task.request)
        return match & fit

    def could_ever_fit(self, request: Resources) -> int:
        """Nodes whose capacity covers `request`, whatever is running."""
        bits = self._cap_fit.get(request)
        if bits is None:
            bits = self._cap_fit[request] = covering(self.capacity, request)
        return bits

    def set_free(self, i: int, free: Resources) -> None:
        """Record node i's free resources and keep the fit caches current (`GlobalView.sync` inlines this)."""
        self.free[i] = free
        fit = self.fit_cache
        if fit:
            bit = 1 << i
            for request, bits in fit.items():
                fit[request] = bits | bit if all(map(ge, free, request)) else bits & ~bit

    def used_fraction(self) -> float:
        """Share of the partition's first resource in use, in this view (for reports and debugging)."""
        cap = sum(c[0] for c in self.capacity)
        return 1.0 - sum(f[0] for f in self.free) / cap if cap else 0.0
