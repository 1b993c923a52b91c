"""Share policies: how much of the data centre a user holds, and in what order a GM serves its queues.

* `share` (Megha paper, Algorithm 2): a user's consumption is its mean fraction of the data centre's resources;
  a GM serves its queues round-robin.
* `drf` (Dominant Resource Fairness, Ghodsi et al.): consumption is the dominant share (the largest fraction of
  any one resource); a GM serves first the queue with the lowest dominant share relative to its share.
* `demand` (Tromino's demand-aware policy): consumption as in DRF; a GM serves first the queue with the largest
  dominant demand share (DDS: the largest fraction of any one resource that its pending tasks ask for).
* `demand-drf` (Tromino's demand-DRF-aware policy): consumption as in DRF; a GM serves first the queue with the
  largest demand-DRF factor, which we take to be DDS - DS / share (demand not yet matched by allocation, with a
  queue's dominant share weighed against its own share). Tromino does not give the formula; this is ours.

A GM applies the same order when a freed node could take parked tasks of several of its users. In every
policy a user is *below* its share when consumption < share and *violates* it by consumption - share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from megha.common.core.resources import Resources


@dataclass(slots=True)
class QueueStanding:
    """What a policy needs to know of one of a GM's queues when it picks the next one to serve."""

    user: str
    share: float
    usage: Resources
    demand: Resources


def fractions(amounts: Resources, total: Resources) -> list[float]:
    return [a / t for a, t in zip(amounts, total, strict=True)]


class SharePolicy:
    """Base policy: round-robin service; subclasses define consumption and may order queues."""

    name = ""

    def consumption(self, usage: Resources, total: Resources) -> float:
        raise NotImplementedError

    def keys(self, queues: Sequence[QueueStanding], total: Resources) -> list[float]:
        """Priority of each queue, lower first; the base policy gives all the same (round-robin order wins)."""
        return [0.0] * len(queues)

    def pick(self, queues: Sequence[QueueStanding], total: Resources) -> int:
        """Index in `queues` (non-empty, in round-robin order from the next queue due) of the queue to serve."""
        keys = self.keys(queues, total)
        return keys.index(min(keys))

    def rank(self, queues: Sequence[QueueStanding], total: Resources) -> list[int]:
        """Indices of `queues` in the order to serve them (stable: ties keep round-robin order)."""
        keys = self.keys(queues, total)
        return sorted(range(len(queues)), key=keys.__getitem__)


class ResourceShare(SharePolicy):
    name = "share"

    def consumption(self, usage: Resources, total: Resources) -> float:
        return sum(fractions(usage, total)) / len(total)


class DominantResourceFairness(SharePolicy):
    name = "drf"

    def consumption(self, usage: Resources, total: Resources) -> float:
        return max(fractions(usage, total))

    def keys(self, queues: Sequence[QueueStanding], total: Resources) -> list[float]:
        return [self.consumption(q.usage, total) / q.share for q in queues]


class DemandAware(DominantResourceFairness):
    name = "demand"

    def keys(self, queues: Sequence[QueueStanding], total: Resources) -> list[float]:
        return [-max(fractions(q.demand, total)) for q in queues]


class DemandDRFAware(DominantResourceFairness):
    name = "demand-drf"

    def keys(self, queues: Sequence[QueueStanding], total: Resources) -> list[float]:
        return [self.consumption(q.usage, total) / q.share - max(fractions(q.demand, total)) for q in queues]


SHARE_POLICIES: dict[str, type[SharePolicy]] = {
    p.name: p for p in (ResourceShare, DominantResourceFairness, DemandAware, DemandDRFAware)
}


def make_share_policy(name: str) -> SharePolicy:
    try:
        return SHARE_POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown share policy {name!r}; choose one of {', '.join(sorted(SHARE_POLICIES))}") from None
