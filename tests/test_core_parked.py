"""The GM's parked-shape index: a freed node finds exactly the parked shapes it could run, oldest first."""

from __future__ import annotations

import random

from megha.common.core.constraints import ALL_CONSTRAINTS_MASK
from megha.common.core.parked import ParkedShapes, Shape
from megha.common.core.task import TaskSpec


def task(n: int, mask: int) -> TaskSpec:
    return TaskSpec(task_id=f"t{n}", job_id="j", user="", duration=1.0, request=(1, 1), constraints=mask)


def brute_force(order: list[Shape], node_mask: int) -> list[Shape]:
    return [shape for shape in order if shape[0] & ~node_mask == 0]


def test_runnable_shapes_are_those_whose_constraints_the_node_has_oldest_first() -> None:
    parked = ParkedShapes()
    shapes: list[Shape] = [(0b101, (1, 1), ""), (0b1, (2, 1), ""), (0b10, (1, 1), ""), (0, (1, 1), "")]
    for n, shape in enumerate(shapes):
        parked.park(shape, task(n, shape[0]))
    assert list(parked.runnable_on(0b101)) == [shapes[0], shapes[1], shapes[3]]
    assert list(parked.runnable_on(0)) == [shapes[3]]
    assert list(parked.runnable_on(ALL_CONSTRAINTS_MASK)) == shapes
    parked.unpark(shapes[0])
    assert list(parked.runnable_on(0b101)) == [shapes[1], shapes[3]]
    assert parked.any_request_fits((2, 1)) and not parked.any_request_fits((0, 5))
    parked.unpark(shapes[1])
    assert not parked.any_request_fits((1, 0))  # no parked shape asks for less than (1, 1) now


def test_index_matches_a_brute_force_scan_through_many_parks_and_renumberings() -> None:
    rand = random.Random(7)
    parked = ParkedShapes()
    order: list[Shape] = []  # park order, as the GM's `waiting` dict keeps it
    for step in range(3000):
        if order and rand.random() < 0.45:
            shape = order.pop(rand.randrange(len(order)))
            parked.unpark(shape)
        else:
            mask = rand.getrandbits(21) & rand.getrandbits(21) & rand.getrandbits(21)  # a few constraints each
            shape = (mask, (rand.randint(1, 3), 1), "")
            if shape in parked.tasks:
                continue
            parked.park(shape, task(step, mask))
            order.append(shape)
        node_mask = rand.getrandbits(21) | rand.getrandbits(21)
        assert list(parked.runnable_on(node_mask)) == brute_force(order, node_mask)
        assert list(parked.tasks) == order
    assert len(parked) == len(order)
