"""The waiting order (`common/core/policies/waiting_order.py`): which of the tasks waiting for a freed node gets one.
By shape (the default) or, as the authors' simulator's one queue, refused tasks first and then in the order the
tasks were queued."""

from __future__ import annotations

import pytest

from megha.common.core.fairness.config import FairnessConfig, QueueSpec
from megha.common.core.messages import LaunchBatch, LaunchResponse
from megha.common.core.observer import CoreObserver
from megha.common.core.policies import WAITING_ORDERS, gm_policies
from megha.common.core.policies.waiting_order import StampedShapes, StampedTasks
from megha.common.core.task import TaskSpec

from corekit import Net, cluster, job, task


class Started(CoreObserver):
    """The tasks a GM reports completed, in order."""

    def __init__(self) -> None:
        self.completed: list[str] = []

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool) -> None:
        self.completed.append(task.task_id)


def _shapes_parked_out_of_arrival_order(waiting_order: str | None) -> list[str]:
    """One node with constraint 1. a.0 runs; b.0 (constraint 1), c.0 (none) and d.0 (constraint 1) park in that
    order, so d.0 joins b.0's shape, which was parked before c.0's. When a.0 ends b.0 takes the node (first either
    way); when b.0 ends, the node goes to d.0 (its shape was parked first) or to c.0 (queued before d.0). Returns the
    order the tasks completed in."""
    spec = cluster([[[[1]]]])
    ends = Started()
    names = {} if waiting_order is None else {"waiting_order": waiting_order}
    net = Net.build(spec, observer=ends, policies=gm_policies(0, spec, **names))
    gm = net.gms[0]
    net.post(gm.submit(job("a", task("a.0")), 0.0))
    for name, constraints in (("b", [1]), ("c", []), ("d", [1])):
        net.post(gm.submit(job(name, task(f"{name}.0", constraints)), 0.1))
    assert [t.task_id for t in gm.waiting_tasks()] == ["b.0", "d.0", "c.0"]  # by shape
    net.run()
    assert not gm.waiting_tasks() and not gm.running
    return ends.completed


def test_by_shape_a_freed_node_goes_to_the_shape_parked_first() -> None:
    assert _shapes_parked_out_of_arrival_order(None) == ["a.0", "b.0", "d.0", "c.0"]


def test_the_default_waiting_order_is_by_shape() -> None:
    assert _shapes_parked_out_of_arrival_order("shape") == _shapes_parked_out_of_arrival_order(None)
    assert gm_policies(0, cluster([[[[]]]])).waiting_order.name == "shape"


def test_in_arrival_order_a_freed_node_goes_to_the_oldest_queued_task_that_fits() -> None:
    assert _shapes_parked_out_of_arrival_order("arrival") == ["a.0", "b.0", "c.0", "d.0"]


def _refused_after_a_parked_task(waiting_order: str | None) -> list[str]:
    """One LM of two nodes, refused tasks waiting for a freed node. a.0 runs on one node; r.0 is sent to the other,
    which is taken behind the GM's back; before the LM's refusal arrives p.0 parks (no node is free in the view),
    then r.0 is refused and waits. When a.0 ends its node goes to p.0 (parked tasks first) or to r.0 (a refused task
    goes to the front of the authors' queue); the other task waits for the next freed node. Returns the order the
    tasks completed in."""
    spec = cluster([[[[], []]]])
    ends = Started()
    names = {"inconsistent": "wait-for-free"}
    if waiting_order is not None:
        names["waiting_order"] = waiting_order
    net = Net.build(spec, observer=ends, policies=gm_policies(0, spec, **names))
    gm, lm = net.gms[0], net.lms[0]
    net.post(gm.submit(job("a", task("a.0")), 0.0))
    net.deliver()  # a.0's batch: it runs
    net.post(gm.submit(job("r", task("r.0")), 0.0))
    batch = net.take("lm/0", LaunchBatch)
    lm.free[batch.placements[0].node] = (0, 0)  # type: ignore[attr-defined]
    (answer,) = lm.handle(batch, 0.0)
    net.post(gm.submit(job("p", task("p.0")), 0.1))
    assert [t.task_id for t in gm.waiting_tasks()] == ["p.0"]
    assert isinstance(answer.msg, LaunchResponse)  # type: ignore[union-attr]
    net.post(gm.handle(answer.msg, 0.1))  # type: ignore[union-attr]
    assert gm.inconsistencies == 1 and [t.task_id for t in gm.waiting_tasks()] == ["p.0", "r.0"]
    net.run()
    return ends.completed


def test_by_shape_a_freed_node_goes_to_the_parked_tasks_before_the_refused_ones() -> None:
    assert _refused_after_a_parked_task(None) == ["a.0", "p.0", "r.0"]


def test_in_arrival_order_a_refused_task_goes_before_older_parked_ones() -> None:
    assert _refused_after_a_parked_task("arrival") == ["a.0", "r.0", "p.0"]


def test_refused_tasks_wait_newest_first_and_keep_their_stamps_when_one_is_cancelled() -> None:
    refused = WAITING_ORDERS["arrival"]().refused_shapes()
    assert isinstance(refused, StampedShapes)
    shape = (0, (1, 1), "", None, 0)
    for name in ("x.0", "y.0", "z.0"):
        refused.add(shape, task(name))
    held = refused.tasks[shape]
    assert isinstance(held, StampedTasks)
    assert [t.task_id for t in held] == ["z.0", "y.0", "x.0"] and list(held.stamps) == [-3, -2, -1]
    assert [t.task_id for t in refused.remove_if(lambda t: t.task_id == "y.0")] == ["y.0"]
    kept = refused.tasks[shape]
    assert [t.task_id for t in kept] == ["z.0", "x.0"] and list(kept.stamps) == [-3, -1]  # type: ignore[attr-defined]


def test_a_task_put_back_in_front_of_a_parked_shape_keeps_the_place_of_its_head() -> None:
    parked = WAITING_ORDERS["arrival"]().parked_shapes()
    shape = (0, (1, 1), "", None, 0)
    parked.add(shape, task("a.0"))
    parked.add(shape, task("b.0"))
    parked.tasks[shape].appendleft(task("c.0"))
    assert list(parked.tasks[shape].stamps) == [0, 0, 1]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "names",
    [
        {"queue_order": "priority"},
        {"priority_classes": True},
        {"fairness": FairnessConfig((QueueSpec("user-0", 1.0, 0),))},
    ],
)
def test_the_arrival_order_is_refused_beside_another_queue_order(names: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="waiting order 'arrival' serves one queue in arrival order"):
        gm_policies(0, cluster([[[[]]]]), waiting_order="arrival", **names)  # type: ignore[arg-type]


def test_an_unknown_waiting_order_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown waiting order 'lifo'.*arrival.*shape"):
        gm_policies(0, cluster([[[[]]]]), waiting_order="lifo")
