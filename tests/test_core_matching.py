"""Constraint matching, choice policies and the partition search order of the GM core."""

from __future__ import annotations

import random

import pytest

from megha.common.core.constraints import constraint_ids, constraint_mask, select_bit
from megha.common.core.gm import GlobalMaster, Unschedulable
from megha.common.core.messages import LaunchBatch
from megha.common.core.placement.choice import (
    LowestMinimumConstraintsChoice,
    MinimumConstraintsChoice,
    RandomChoice,
    make_choice,
    uniform_bit,
)
from megha.common.core.placement.feasibility import feasible_nodes
from megha.common.core.placement.search import PartitionSearch
from megha.common.core.view import PartitionView

from corekit import CAP, cluster, job, task


def test_select_bit_finds_each_set_bit_in_order() -> None:
    bits = (1 << 3) | (1 << 70) | (1 << 130) | (1 << 399)
    assert [select_bit(bits, r) for r in range(4)] == [3, 70, 130, 399]


def test_select_bit_agrees_with_the_positions_at_every_rank_small_and_large() -> None:
    rng = random.Random(7)
    for width in (1, 9, 64, 400, 2_000):
        for density in (0.01, 0.2, 0.9):
            bits = sum(1 << i for i in range(width) if rng.random() < density) or 1 << (width - 1)
            positions = [i for i in range(width) if bits >> i & 1]
            assert [select_bit(bits, r) for r in range(len(positions))] == positions


def test_constraint_mask_round_trip_and_bounds() -> None:
    assert constraint_ids(constraint_mask([0, 7, 20])) == [0, 7, 20]
    with pytest.raises(ValueError, match="21"):
        constraint_mask([21])


def test_matching_is_the_and_of_constraint_bit_vectors_restricted_to_free_nodes() -> None:
    spec = cluster([[[[1, 2], [1], [2], [1, 2, 3], []]]])
    view = PartitionView(spec.partitions[0][0], 0)
    assert view.matching(constraint_mask([1, 2])) == 0b01001
    assert view.matching(0) == 0b11111
    view.set_free(0, (0, 0))
    assert feasible_nodes(view, task("a.0", [1, 2])) == 0b01000
    assert feasible_nodes(view, task("a.1", [3])) == 0b01000
    assert feasible_nodes(view, task("a.2", [4])) == 0


def test_fit_cache_follows_every_change_of_free_resources() -> None:
    spec = cluster([[[[], []]]])
    view = PartitionView(spec.partitions[0][0], 0)
    half = (CAP[0] // 2, CAP[1] // 2)
    assert view.fitting(half) == 0b11
    view.set_free(1, (CAP[0] // 2 - 1, CAP[1]))
    assert view.fitting(half) == 0b01
    view.set_free(1, CAP)
    assert view.fitting(half) == 0b11


def test_minimum_constraints_picks_the_least_versatile_suitable_node() -> None:
    spec = cluster([[[[1, 2, 3, 4], [1, 2], [1, 2, 5], [7]]]])
    view = PartitionView(spec.partitions[0][0], 0)
    t = task("a.0", [1, 2])
    candidates = feasible_nodes(view, t)
    rng = random.Random(0)
    assert {MinimumConstraintsChoice().choose(view, candidates, rng, t) for _ in range(50)} == {1}
    assert {RandomChoice().choose(view, candidates, rng, t) for _ in range(200)} == {0, 1, 2}


def test_minimum_constraints_first_breaks_ties_by_the_lowest_index_where_min_constraints_draws() -> None:
    spec = cluster([[[[1, 2, 3], [1, 2, 5], [1, 2], [1, 2, 4], [1, 2], [1, 2]]]])
    view = PartitionView(spec.partitions[0][0], 0)
    t = task("a.0", [1, 2])
    candidates = feasible_nodes(view, t) & ~(1 << 2)  # node 2, the first of the fewest, is busy
    rng = random.Random(0)
    assert {LowestMinimumConstraintsChoice().choose(view, candidates, rng, t) for _ in range(50)} == {4}
    assert {MinimumConstraintsChoice().choose(view, candidates, rng, t) for _ in range(200)} == {4, 5}
    assert make_choice("min-constraints-first").name == "min-constraints-first"


def test_unknown_matching_approach_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match="unknown matching approach 'best'"):
        make_choice("best")


def _views(num_lms: int, num_gms: int) -> list[list[PartitionView]]:
    spec = cluster([[[[]] for _ in range(num_gms)] for _ in range(num_lms)])
    return [[PartitionView(spec.partitions[lm][g], g) for g in range(num_gms)] for lm in range(num_lms)]


def test_internal_partitions_are_tried_round_robin_across_lms() -> None:
    search = PartitionSearch(1, _views(3, 2))
    orders = [[(v.lm, v.gm) for v in search.internal(task("t"))] for _ in range(4)]
    assert orders == [
        [(0, 1), (1, 1), (2, 1)],
        [(1, 1), (2, 1), (0, 1)],
        [(2, 1), (0, 1), (1, 1)],
        [(0, 1), (1, 1), (2, 1)],
    ]


def test_external_partitions_cover_every_other_gm_and_rotate_the_starting_lm() -> None:
    search = PartitionSearch(0, _views(3, 3))
    first = [(v.lm, v.gm) for v in search.external(task("t"))]
    second = [(v.lm, v.gm) for v in search.external(task("t"))]
    assert sorted(first) == sorted((lm, g) for lm in range(3) for g in (1, 2))
    assert sorted(second) == sorted(first)
    assert first[0][0] == 0 and second[0][0] == 1


def test_gm_prefers_internal_partitions_then_repartitions_from_external() -> None:
    # LM 0: GM 0's partition has one node with constraint 3; GM 1's partition has two.
    spec = cluster([[[[3]], [[3], [3]]]])
    gm = GlobalMaster(0, spec)
    out = gm.submit(job("j", task("j.0", [3]), task("j.1", [3]), task("j.2", [3])), 0.0)
    (send,) = out
    batch = send.msg
    assert isinstance(batch, LaunchBatch) and send.dest == "lm/0"
    assert (batch.placements[0].node, batch.placements[0].repartition) == (0, False)
    assert sorted((p.node, p.repartition) for p in batch.placements[1:]) == [(1, True), (2, True)]


def test_gm_batches_launches_per_lm() -> None:
    spec = cluster([[[[]] * 3], [[[]] * 3]])
    gm = GlobalMaster(0, spec)
    out = gm.submit(job("j", *(task(f"j.{i}") for i in range(6))), 0.0)
    assert sorted((s.dest, len(s.msg.placements)) for s in out) == [("lm/0", 3), ("lm/1", 3)]


def test_task_that_no_node_could_ever_run_is_rejected_with_the_reason() -> None:
    spec = cluster([[[[1]], [[2]]]])
    gm = GlobalMaster(0, spec)
    with pytest.raises(Unschedulable, match=r"task j\.1: no node satisfies placement constraints \[1, 2\]"):
        gm.submit(job("j", task("j.0", [1]), task("j.1", [1, 2])), 0.0)
    with pytest.raises(Unschedulable, match="has capacity for cpu_millicores=8000"):
        gm.submit(job("k", task("k.0", [2], request=(8000, 1))), 0.0)
    with pytest.raises(Unschedulable, match="must be positive"):
        gm.submit(job("m", task("m.0", request=(0, 1))), 0.0)
    assert not gm.queue and not gm.waiting


def test_uniform_bit_is_uniform_over_dense_and_sparse_bitsets() -> None:
    rng = random.Random(7)
    dense = ((1 << 400) - 1) & ~(1 << 5) & ~(1 << 300)  # rejection sampling succeeds almost always
    sparse = (1 << 3) | (1 << 70) | (1 << 130) | (1 << 399)  # mostly falls back to rank selection
    for bits in (dense, sparse):
        counts: dict[int, int] = {}
        draws = 40 * bits.bit_count()
        for _ in range(draws):
            pos = uniform_bit(bits, rng)
            assert bits >> pos & 1
            counts[pos] = counts.get(pos, 0) + 1
        assert set(counts) == {p for p in range(400) if bits >> p & 1}
        expected = draws / bits.bit_count()
        assert max(abs(c - expected) for c in counts.values()) < 0.75 * expected


class _SubclassedRandom(random.Random):
    """A Random subclass: `uniform_bit` then draws through `randrange`, as it did before its inlined fast path."""


def test_uniform_bit_draws_the_same_positions_as_randrange() -> None:
    """The inlined draws of the fast path (a plain `random.Random`) take the same numbers from the stream as
    `randrange`, so a replay places every task where it did before, at every width, dense and sparse."""
    bitsets = [1, 0b10, 0b101, (1 << 5) - 1, (1 << 3) | (1 << 70) | (1 << 130) | (1 << 399)]
    bitsets += [random.Random(n).getrandbits(n) | 1 << (n - 1) for n in (7, 64, 100, 400, 2000)]
    fast, reference = random.Random(11), _SubclassedRandom(11)
    for bits in bitsets:
        for _ in range(200):
            assert uniform_bit(bits, fast) == uniform_bit(bits, reference)
    assert fast.getstate() == reference.getstate()
