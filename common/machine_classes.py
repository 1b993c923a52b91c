"""Machine constraints of a generated data centre: how its nodes are given the 21 machine constraints, from the
Sharma et al. fraction of machines satisfying each (`ConstraintStats.machine_fraction`).

* `per-node` (the default, as the reference cluster was drawn): every node satisfies constraint k with probability
  `fraction[k]`, independently of every other node, so constrained nodes are spread evenly over the LMs.
* `per-lm`: each LM (a cluster of the federation) is of one machine class, as a real cluster is built of one
  batch of hardware and software: the LM draws, per constraint k, the share `p[k]` of its nodes that satisfy it
  from Beta(c * fraction[k], c * (1 - fraction[k])), and its nodes then satisfy k with probability `p[k]`.
  Across the data centre a node still satisfies k with probability `fraction[k]`, but constrained nodes are
  concentrated in some LMs. Sharma et al.'s statistics give only the data centre's fractions, not per cluster,
  so the spread between LMs is ours: c = `CLASS_CONCENTRATION` = 1 makes half the variance of a node's
  constraint lie between LMs (intra-LM correlation 1 / (1 + c)); most LMs then have nearly all or nearly none of
  their nodes with a rare constraint.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

CLASS_CONCENTRATION = 1.0
"""c of `per-lm`: how closely an LM's class follows the data centre's fractions (large: as `per-node`)."""

#: masks(fractions, nodes, rng): the machine constraint masks of one LM's `nodes` nodes.
MachineDraw = Callable[[Sequence[float], int, random.Random], list[int]]


def per_node(fractions: Sequence[float], nodes: int, rng: random.Random) -> list[int]:
    """Each node satisfies constraint k with probability `fractions[k]`."""
    return _draw(fractions, nodes, rng)


def per_lm(fractions: Sequence[float], nodes: int, rng: random.Random) -> list[int]:
    """The LM draws its machine class (a probability per constraint, around `fractions`); its nodes draw from it."""
    c = CLASS_CONCENTRATION
    shares = [f if f in (0.0, 1.0) else rng.betavariate(c * f, c * (1.0 - f)) for f in fractions]
    return _draw(shares, nodes, rng)


def _draw(probabilities: Sequence[float], nodes: int, rng: random.Random) -> list[int]:
    rand = rng.random
    bit_probabilities = [(1 << k, p) for k, p in enumerate(probabilities)]
    masks = []
    for _ in range(nodes):
        mask = 0
        for bit, p in bit_probabilities:
            if rand() < p:
                mask |= bit
        masks.append(mask)
    return masks


MACHINE_DRAWS: dict[str, MachineDraw] = {"per-node": per_node, "per-lm": per_lm}
"""How a generated data centre's nodes get their machine constraints, by name (`megha replay --machine-constraints`)."""
