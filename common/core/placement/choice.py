"""Choice: which of the feasible nodes gets the task: Random (default), Minimum-Constraints (ties at random or to the
lowest index), First-Fit, Scarcity or Rarity."""

from __future__ import annotations

import random
from typing import Protocol

from megha.common.core.constraints import NUM_CONSTRAINTS, select_bit
from megha.common.core.placement.rarity import fewest
from megha.common.core.placement.scarcity import ConstraintDemand
from megha.common.core.task import TaskSpec
from megha.common.core.view import PartitionView


class ChoicePolicy(Protocol):
    """Picks one node (partition-local index) out of a non-empty bitset of `task`'s feasible nodes."""

    name: str

    def choose(self, view: PartitionView, candidates: int, rng: random.Random, task: TaskSpec) -> int: ...


REJECTION_TRIES = 4


def uniform_bit(bits: int, rng: random.Random) -> int:
    """A uniformly random set bit of `bits`. Rejection sampling first (a few probes of random positions, cheap
    when most nodes are candidates), then an exact rank selection: uniform either way.

    It runs once per placement, so for a plain `random.Random` the draws of `rng.randrange(n)` are made here
    with the same `getrandbits` calls CPython's `Random._randbelow` makes (the same numbers from the same
    stream, `tests/test_placement_choice.py` checks it), without randrange's argument handling."""
    width = bits.bit_length()
    if type(rng) is not random.Random:
        for _ in range(REJECTION_TRIES):
            position = rng.randrange(width)
            if bits >> position & 1:
                return position
        return select_bit(bits, rng.randrange(bits.bit_count()))
    getrandbits = rng.getrandbits
    k = width.bit_length()
    for _ in range(REJECTION_TRIES):
        position = getrandbits(k)
        while position >= width:
            position = getrandbits(k)
        if bits >> position & 1:
            return position
    count = bits.bit_count()
    k = count.bit_length()
    rank = getrandbits(k)
    while rank >= count:
        rank = getrandbits(k)
    return select_bit(bits, rank)


class RandomChoice:
    """Uniform random choice among the feasible nodes (constraint-aware paper, section 4.3.1).

    Randomness also makes two GMs less likely to pick the same node from the same stale view."""

    name = "random"

    def choose(self, view: PartitionView, candidates: int, rng: random.Random, task: TaskSpec) -> int:
        return uniform_bit(candidates, rng)


class MinimumConstraintsChoice:
    """The feasible node with the fewest machine constraints, keeping versatile nodes free (section 4.3.2).

    Ties are broken uniformly at random, for the same reason as in RandomChoice."""

    name = "min-constraints"

    def choose(self, view: PartitionView, candidates: int, rng: random.Random, task: TaskSpec) -> int:
        return uniform_bit(view.fewest_constraints(candidates)[1], rng)


class LowestMinimumConstraintsChoice:
    """Minimum-Constraints as the constraint-aware paper's simulator does it: among the feasible nodes with the fewest
    machine constraints, the one with the lowest index in its partition (its GM's `schedule_task` keeps the first
    node of the fewest, scanning in index order).

    Deterministic: GMs that borrow from one partition with the same stale view pick the same node."""

    name = "min-constraints-first"

    def choose(self, view: PartitionView, candidates: int, rng: random.Random, task: TaskSpec) -> int:
        fewest = view.fewest_constraints(candidates)[1]
        return (fewest & -fewest).bit_length() - 1


class FirstFitChoice:
    """The feasible node with the lowest index in its partition: the first match of the fair paper's Algorithm 1.

    Deterministic: two GMs with the same stale view pick the same node, so it invites inconsistencies."""

    name = "first-fit"

    def choose(self, view: PartitionView, candidates: int, rng: random.Random, task: TaskSpec) -> int:
        return (candidates & -candidates).bit_length() - 1


class ScarcityChoice:
    """A feasible node without the hot constraints (`placement.scarcity`) the task does not need, where there is
    one: the task's nodes are narrowed to those without the hottest constraint, then to those without the next,
    each step kept only when some node is left; uniformly at random among what remains.

    A task that needs a constraint has it on every candidate, so narrowing by it leaves none and is skipped: the
    narrowing needs no more of the task than its candidates (the task only feeds the demand estimate).
    Minimum-Constraints spares every constraint alike and picks among the few nodes of the fewest, so GMs with one
    stale view are likelier to pick the same node; this spares only the constraints in short supply and leaves the
    pick as random as it can.

    The pressures are those of the scarcity LM order, learnt from the tasks this policy placed, against the share of
    the partition's own nodes with each constraint (a partition poor in a constraint protects it more)."""

    name = "scarcity"

    __slots__ = ("_demand", "_hot")

    def __init__(self) -> None:
        self._demand = ConstraintDemand()
        self._hot: dict[PartitionView, tuple[int, ...]] = {}  # per partition, its hot constraints, hottest first

    def choose(self, view: PartitionView, candidates: int, rng: random.Random, task: TaskSpec) -> int:
        if self._demand.count(task.constraints):
            self._hot.clear()
        hot = self._hot.get(view)
        if hot is None:
            supply = [view.constraint_bits[k].bit_count() / view.size for k in range(NUM_CONSTRAINTS)]
            hot = self._hot[view] = tuple(k for k, _ in self._demand.hot(supply))
        bits = view.constraint_bits
        for k in hot:
            spared = candidates & ~bits[k]
            if spared:
                candidates = spared
        return uniform_bit(candidates, rng)


class RarityChoice(ScarcityChoice):
    """The feasible nodes with the fewest constraints the task does not need (those the `rarity` LM order ranked the
    partition by), narrowed and picked among as by the scarcity choice: without the hot constraints the task does
    not need where possible, then uniformly at random.

    Minimum-Constraints with the scarcity choice's spare-the-hot narrowing inside the fewest: a node with a rare
    combination of constraints goes to a task that needs most of them."""

    name = "rarity"

    __slots__ = ()

    def choose(self, view: PartitionView, candidates: int, rng: random.Random, task: TaskSpec) -> int:
        return super().choose(view, fewest(view, candidates), rng, task)

    def choose_among(self, view: PartitionView, fewest: int, rng: random.Random, task: TaskSpec) -> int:
        """`choose` given the candidates' fewest-constraint nodes already (the placer's fused path)."""
        return ScarcityChoice.choose(self, view, fewest, rng, task)


CHOICE_POLICIES: dict[
    str,
    type[RandomChoice]
    | type[MinimumConstraintsChoice]
    | type[LowestMinimumConstraintsChoice]
    | type[FirstFitChoice]
    | type[ScarcityChoice],
] = {
    RandomChoice.name: RandomChoice,
    MinimumConstraintsChoice.name: MinimumConstraintsChoice,
    LowestMinimumConstraintsChoice.name: LowestMinimumConstraintsChoice,
    FirstFitChoice.name: FirstFitChoice,
    ScarcityChoice.name: ScarcityChoice,
    RarityChoice.name: RarityChoice,
}


def make_choice(name: str) -> ChoicePolicy:
    """A new choice policy called `name` (a `CHOICE_POLICIES` name; one per GM: `scarcity` learns from its tasks)."""
    try:
        return CHOICE_POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown matching approach {name!r}; choose one of {sorted(CHOICE_POLICIES)}") from None
