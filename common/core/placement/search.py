"""The order a GM searches partitions: its internal partitions round-robin across LMs, then external ones.

External partitions are also visited round-robin across LMs (to spread repartitions evenly); within one LM the
other GMs' partitions are visited in a rotating order too.
"""

from __future__ import annotations

from collections.abc import Iterator

from megha.common.core.view import PartitionView


class PartitionSearch:
    """Yields the partitions one task should try, advancing the round-robin pointers once per task."""

    __slots__ = ("_external_next", "_internal_next", "_views", "gm", "num_gms", "num_lms")

    def __init__(self, gm: int, views: list[list[PartitionView]]) -> None:
        self.gm = gm
        self._views = views
        self.num_lms = len(views)
        self.num_gms = len(views[0])
        self._internal_next = 0
        self._external_next = 0

    def internal(self) -> Iterator[PartitionView]:
        start = self._internal_next
        self._internal_next = (start + 1) % self.num_lms
        for k in range(self.num_lms):
            yield self._views[(start + k) % self.num_lms][self.gm]

    def external(self) -> Iterator[PartitionView]:
        start = self._external_next
        self._external_next = (start + 1) % (self.num_lms * max(self.num_gms - 1, 1))
        gm_offset, lm_start = divmod(start, self.num_lms)
        for k in range(self.num_lms):
            row = self._views[(lm_start + k) % self.num_lms]
            for j in range(self.num_gms - 1):
                other = (self.gm + 1 + (gm_offset + j) % (self.num_gms - 1)) % self.num_gms
                yield row[other]
