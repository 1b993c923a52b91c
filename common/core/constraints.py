"""Placement constraints as bit masks: ids 0-20 packed into Python ints, and bitset helpers."""

from __future__ import annotations

from collections.abc import Iterable

NUM_CONSTRAINTS = 21
ALL_CONSTRAINTS_MASK = (1 << NUM_CONSTRAINTS) - 1


def constraint_mask(ids: Iterable[int]) -> int:
    """Pack constraint ids into a mask (bit k set when constraint k is present)."""
    mask = 0
    for cid in ids:
        if not 0 <= cid < NUM_CONSTRAINTS:
            raise ValueError(f"constraint id {cid} is outside 0..{NUM_CONSTRAINTS - 1}")
        mask |= 1 << cid
    return mask


def constraint_ids(mask: int) -> list[int]:
    """Unpack a constraint mask into a sorted list of ids."""
    return [cid for cid in range(NUM_CONSTRAINTS) if mask >> cid & 1]


def iter_bits(bits: int) -> Iterable[int]:
    """Positions of the set bits of `bits`, lowest first."""
    while bits:
        low = bits & -bits
        yield low.bit_length() - 1
        bits ^= low


#: Up to this rank `select_bit` clears the lower set bits one by one: fewer big-int operations than halving a
#: partition-wide bitset (node choices often leave a handful of candidates: a rank of 0 to 2 is common).
SMALL_RANK = 8


def select_bit(bits: int, rank: int) -> int:
    """Position of the `rank`-th (0-based) set bit of `bits`: the lower set bits cleared one by one for a small
    rank, else by binary search over bit counts."""
    if rank < SMALL_RANK:
        for _ in range(rank):
            bits &= bits - 1
        return (bits & -bits).bit_length() - 1
    offset = 0
    width = bits.bit_length()
    while width > 8:
        half = width >> 1
        low = bits & ((1 << half) - 1)
        count = low.bit_count()
        if rank < count:
            bits = low
            width = half
        else:
            rank -= count
            bits >>= half
            offset += half
            width -= half
    for _ in range(rank):
        bits &= bits - 1
    return offset + (bits & -bits).bit_length() - 1
