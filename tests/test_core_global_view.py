"""A GM's global view keeps the newest state each LM reported of a node, whatever order the reports come in."""

from __future__ import annotations

from megha.common.core.global_view import GlobalView
from megha.common.core.messages import node_state

from corekit import cluster


def _view() -> GlobalView:
    return GlobalView(cluster([[[[], [], []], [[]]]], capacity=(10, 10)))  # LM 0: GM 0's nodes 0-2, GM 1's node 3


def _free(view: GlobalView, node: int) -> tuple[int, ...]:
    partition, i = view.locate[0][node]
    return partition.free[i]


def test_an_older_state_than_one_held_or_adopted_is_ignored_even_in_the_same_report() -> None:
    view = _view()
    view.hold_states(0, [node_state((1, (6, 6), 5)), node_state((1, (2, 2), 4))], 0)  # the older one comes second
    view.hold_states(0, [node_state((0, (3, 3), 2)), node_state((0, (4, 4), 3))], 0)  # the newer one comes second
    view.hold_states(0, [node_state((1, (1, 1), 3))], 0)  # older than the one held
    view.sync()
    assert (_free(view, 0), _free(view, 1)) == ((4, 4), (6, 6))
    assert view.take_freed() == []  # nothing grew: every node started idle
    view.hold_states(0, [node_state((0, (9, 9), 3)), node_state((1, (7, 7), 6))], 0)  # node 0's is the adopted one's
    assert view.has_unapplied_states
    view.sync()
    assert (_free(view, 0), _free(view, 1)) == ((4, 4), (7, 7))
    assert view.take_freed() == [(0, 1)]


def test_held_states_are_adopted_in_the_order_their_nodes_were_first_reported() -> None:
    view = _view()
    view.hold_states(0, [node_state((n, (0, 0), 1)) for n in range(4)], 0)
    view.sync()
    view.hold_states(0, [node_state((2, (5, 5), 2)), node_state((0, (5, 5), 3))], 0)
    view.hold_states(0, [node_state((3, (5, 5), 4)), node_state((2, (8, 8), 5))], 0)  # node 2 again: keeps its place
    view.sync()
    assert view.take_freed() == [(0, 2), (0, 0), (0, 3)]
    assert _free(view, 2) == (8, 8)
