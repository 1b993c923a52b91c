"""An LM's node table: the authoritative capacity, free resources and version of every node of its cluster, their
constraints, drivers and owning GM, the nodes out of service, and per GM the nodes changed since its last delta."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from megha.common.core.cluster import PartitionSpec
from megha.common.core.messages import NodeState, node_state
from megha.common.core.resources import Resources

DELTA_STATES = ("latest", "freed-wins")
"""What a delta reports of a node that changed more than once since the GM's last one (`megha replay --delta-states`):
`latest`, its current state; `freed-wins`, the constraint-aware paper's simulator (meghanat/megha-constraint-aware,
`megha3.0/src/megha_sim/local_master/lm_constraints.py` and the GM's `update_status`): there the LM lists the nodes
taken and the nodes freed since the last update, the GM applies every taken one and then every freed one, so a node
freed at any time since is reported free, even if it was taken again after. A node's most free state since the
last delta stands for that."""

VERSION_BITS = 20
"""Node versions of incarnation i start at i << VERSION_BITS: with millisecond incarnations, a later one starts
above an earlier one unless that one changed nodes more than a billion times a second on average."""


class NodeTable:
    """Nodes numbered LM-locally, partition after partition (`partitions[g]` is GM g's). Every change of a node's
    free resources bumps its version, so GMs can order the states they hear of."""

    def __init__(self, partitions: Sequence[PartitionSpec], incarnation: int, delta_states: str = "latest") -> None:
        if delta_states not in DELTA_STATES:
            raise ValueError(f"unknown delta states {delta_states!r}; choose one of {list(DELTA_STATES)}")
        num_gms = len(partitions)
        self.capacity: list[Resources] = [cap for p in partitions for cap in p.capacities]
        self.free: list[Resources] = list(self.capacity)
        self.masks: list[int] = [m for p in partitions for m in p.constraint_masks]
        self.drivers: list[tuple[str, ...]] = [d for p in partitions for d in p.node_drivers()]
        self.burn_everywhere = all("burn" in d for d in self.drivers)  # burn tasks need no driver check
        self.owner: list[int] = [p.gm for p in partitions for _ in range(p.size)]
        self._clock = incarnation << VERSION_BITS
        self.version: list[int] = [self._clock] * len(self.capacity)
        # Each node's current state as reported, built once per change and shared by every message that reports
        # it (each change reaches every other GM: one state object instead of one per GM).
        self.state_of: list[NodeState] = [node_state((n, free, self._clock)) for n, free in enumerate(self.free)]
        # Nodes out of service (their worker went silent): node -> why. They show no free resources to every GM.
        self.down: dict[int, str] = {}
        # Per GM, the nodes changed since its last delta.
        self.dirty: list[set[int]] = [set() for _ in range(num_gms)]
        # For each GM, the dirty sets of all the others: a GM's own change is not reported back to it.
        self._others_dirty: list[list[set[int]]] = [
            [d for g, d in enumerate(self.dirty) if g != gm] for gm in range(num_gms)
        ]
        # With `freed-wins`, per GM, the most free state of each of its dirty nodes since its last delta.
        self._most_free: list[dict[int, Resources]] | None = (
            [{} for _ in range(num_gms)] if delta_states == "freed-wins" else None
        )

    def __len__(self) -> int:
        return len(self.capacity)

    def set_free(self, n: int, free: Resources, except_gm: int) -> None:
        """Change node n's free resources; every GM but `except_gm` (whose own action it was) learns it by delta."""
        self.free[n] = free
        self._clock += 1
        self.version[n] = self._clock
        self.state_of[n] = node_state((n, free, self._clock))
        for dirty in self._others_dirty[except_gm]:
            dirty.add(n)
        if self._most_free is not None:
            self._note_free(n, free, (g for g in range(len(self.dirty)) if g != except_gm))

    def set_free_for_all(self, n: int, free: Resources) -> None:
        """Change node n's free resources, to be reported to every GM."""
        self.free[n] = free
        self._clock += 1
        self.version[n] = self._clock
        self.state_of[n] = node_state((n, free, self._clock))
        for dirty in self.dirty:
            dirty.add(n)
        if self._most_free is not None:
            self._note_free(n, free, range(len(self.dirty)))

    def _note_free(self, n: int, free: Resources, gms: Iterable[int]) -> None:
        """Remember, for each of `gms`, node n's most free state since its last delta (`freed-wins`)."""
        assert self._most_free is not None
        for g in gms:
            seen = self._most_free[g].get(n)
            self._most_free[g][n] = free if seen is None else tuple(map(max, seen, free))

    def state(self, n: int) -> NodeState:
        return self.state_of[n]

    def states(self, nodes: Iterable[int]) -> list[NodeState]:
        """The states of `nodes` (each a node of this table), in their order."""
        return list(map(self.state_of.__getitem__, nodes))

    def take_changes(self, gm: int) -> list[NodeState]:
        """The states of the nodes changed for `gm` since the last call; clears them."""
        dirty = self.dirty[gm]
        nodes = list(map(self.state_of.__getitem__, dirty))
        dirty.clear()
        if self._most_free is not None:
            most_free = self._most_free[gm]
            nodes = [node_state((s[0], most_free.get(s[0], s[1]), s[2])) for s in nodes]
            most_free.clear()
        return nodes

    def all_states(self) -> list[NodeState]:
        return list(self.state_of)

    def report_everything(self) -> None:
        """Mark every node changed for every GM (a rebuilt LM's first deltas)."""
        for dirty in self.dirty:
            dirty.update(range(len(self.capacity)))
