"""The data centre's static shape: LMs, the per-GM partitions of each LM's cluster, and each node's capacity,
machine constraints and task drivers."""

from __future__ import annotations

from dataclasses import dataclass, field

from megha.common.core.constraints import NUM_CONSTRAINTS
from megha.common.core.resources import DEFAULT_RESOURCE_NAMES, Resources
from megha.common.core.task import DRIVERS

BURN_ONLY: tuple[str, ...] = ("burn",)
"""The drivers of a node that says nothing else (every node of a simulation or a trace replay)."""


@dataclass(frozen=True, slots=True)
class PartitionSpec:
    """Partition `gm` of LM `lm`: the nodes the LM assigns to that GM (its internal partition there).

    Node i of the partition has `capacities[i]` (aligned to the data centre's resource names) and machine
    constraint_masks[i]` (bit k set when the node satisfies constraint k), and offers the task drivers
    `drivers[i]`; `drivers` is () when every node offers burn only.
    """

    lm: int
    gm: int
    capacities: tuple[Resources, ...]
    constraint_masks: tuple[int, ...]
    drivers: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        if len(self.capacities) != len(self.constraint_masks):
            raise ValueError(f"partition lm={self.lm} gm={self.gm}: capacities and constraint masks differ in length")
        if self.drivers:
            if len(self.drivers) != len(self.capacities):
                raise ValueError(f"partition lm={self.lm} gm={self.gm}: drivers and capacities differ in length")
            unknown = {d for offered in self.drivers for d in offered} - set(DRIVERS)
            if unknown or not all(self.drivers):
                raise ValueError(f"partition lm={self.lm} gm={self.gm}: every node needs drivers among {DRIVERS}")

    def node_drivers(self) -> tuple[tuple[str, ...], ...]:
        """The drivers of each node, in node order."""
        return self.drivers or (BURN_ONLY,) * self.size

    @property
    def size(self) -> int:
        return len(self.capacities)


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """L LMs x G GMs; `partitions[lm][gm]` is LM `lm`'s partition for GM `gm`.

    Within one LM, nodes are numbered 0..n-1 across its partitions in GM order; `partition_start(lm, gm)` gives
    the first node of a partition, so (lm, node) names a physical node everywhere in the core.
    """

    partitions: tuple[tuple[PartitionSpec, ...], ...]
    resource_names: tuple[str, ...] = DEFAULT_RESOURCE_NAMES
    _starts: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.partitions:
            raise ValueError("a cluster needs at least one LM")
        gms = len(self.partitions[0])
        if gms == 0:
            raise ValueError("a cluster needs at least one GM partition per LM")
        starts = []
        for lm, row in enumerate(self.partitions):
            if len(row) != gms:
                raise ValueError(f"LM {lm} has {len(row)} partitions; every LM needs exactly {gms} (one per GM)")
            offsets, total = [], 0
            for gm, part in enumerate(row):
                if (part.lm, part.gm) != (lm, gm):
                    raise ValueError(f"partition at [{lm}][{gm}] is labelled lm={part.lm} gm={part.gm}")
                for cap in part.capacities:
                    if len(cap) != len(self.resource_names):
                        raise ValueError(f"LM {lm} GM {gm}: capacity {cap} does not match {self.resource_names}")
                    if any(v <= 0 for v in cap):
                        raise ValueError(f"LM {lm} GM {gm}: capacity {cap} must be positive")
                for mask in part.constraint_masks:
                    if mask >> NUM_CONSTRAINTS:
                        raise ValueError(f"LM {lm} GM {gm}: machine constraint mask {mask:#x} uses ids >= 21")
                offsets.append(total)
                total += part.size
            starts.append(tuple(offsets))
        object.__setattr__(self, "_starts", tuple(starts))

    @property
    def num_lms(self) -> int:
        return len(self.partitions)

    @property
    def num_gms(self) -> int:
        return len(self.partitions[0])

    @property
    def num_nodes(self) -> int:
        return sum(p.size for row in self.partitions for p in row)

    def lm_size(self, lm: int) -> int:
        return sum(p.size for p in self.partitions[lm])

    def partition_start(self, lm: int, gm: int) -> int:
        return self._starts[lm][gm]

    def partition_of(self, lm: int, node: int) -> int:
        """The GM whose partition holds physical node `node` of LM `lm`."""
        starts = self._starts[lm]
        for gm in range(len(starts) - 1, -1, -1):
            if node >= starts[gm]:
                return gm
        raise IndexError(node)

    def lm_capacities(self, lm: int) -> list[Resources]:
        return [cap for p in self.partitions[lm] for cap in p.capacities]

    def lm_constraint_masks(self, lm: int) -> list[int]:
        return [m for p in self.partitions[lm] for m in p.constraint_masks]

    def total_capacity(self) -> Resources:
        totals = [0] * len(self.resource_names)
        for row in self.partitions:
            for part in row:
                for cap in part.capacities:
                    for i, v in enumerate(cap):
                        totals[i] += v
        return tuple(totals)
