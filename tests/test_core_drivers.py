"""Task drivers in the core: a task goes only to a node that offers its driver (GM feasibility, LM validation,
parked shapes, preemption), and a task no node could run is refused naming its driver field."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.gm import GlobalMaster, Unschedulable
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import LaunchBatch, LaunchResponse, Placement
from megha.common.core.observer import CoreObserver
from megha.common.core.task import RunSpec, TaskSpec

from corekit import CAP, Net, job, task

EXEC = RunSpec("exec", ("true",))
CONTAINER = RunSpec("container", image="megha:latest")


def cluster(*drivers: Sequence[str], gms: int = 1) -> ClusterSpec:
    """One LM whose nodes (split evenly over `gms` GMs) offer `drivers[i]`; no constraints, capacity CAP."""
    n = len(drivers)
    bounds = [k * n // gms for k in range(gms + 1)]
    row = tuple(
        PartitionSpec(
            0,
            gm,
            (CAP,) * (bounds[gm + 1] - bounds[gm]),
            (0,) * (bounds[gm + 1] - bounds[gm]),
            tuple(tuple(d) for d in drivers[bounds[gm] : bounds[gm + 1]]),
        )
        for gm in range(gms)
    )
    return ClusterSpec((row,))


def small(task_id: str, run: RunSpec | None = None, constraints: Sequence[int] = ()) -> TaskSpec:
    return replace(task(task_id, constraints, request=(100, 100)), run=run)


class Decisions(CoreObserver):
    def __init__(self) -> None:
        self.nodes: dict[str, list[int]] = {}

    def decided(self, placements: Sequence[Placement], now: float) -> None:
        for p in placements:
            self.nodes.setdefault(p.task.task_id, []).append(p.node)


def _placed(outputs: list) -> dict[str, int]:  # type: ignore[type-arg]
    return {p.task.task_id: p.node for out in outputs for p in out.msg.placements}


def test_tasks_go_only_to_nodes_offering_their_driver() -> None:
    spec = cluster(["burn"], ["burn", "exec"], ["burn"], ["container", "burn"], gms=2)
    gm = GlobalMaster(0, spec)
    tasks = [small(f"j.{i}", (None, EXEC, CONTAINER)[i % 3]) for i in range(60)]
    placed = _placed(gm.submit(job("j", *tasks), 0.0))
    assert len(placed) == 60
    assert {placed[t.task_id] for t in tasks if t.driver == "exec"} == {1}
    assert {placed[t.task_id] for t in tasks if t.driver == "container"} == {3}
    assert {placed[t.task_id] for t in tasks if t.driver == "burn"} == {0, 1}  # its internal partition first


def test_a_node_without_burn_gets_no_burn_task() -> None:
    spec = cluster(["exec"], ["burn"])
    gm = GlobalMaster(0, spec)
    placed = _placed(gm.submit(job("j", *(small(f"j.{i}", EXEC if i % 2 else None) for i in range(20))), 0.0))
    assert {node for tid, node in placed.items() if int(tid.split(".")[1]) % 2} == {0}
    assert {node for tid, node in placed.items() if not int(tid.split(".")[1]) % 2} == {1}


def test_a_task_whose_driver_no_node_offers_is_refused_naming_the_field() -> None:
    spec = cluster(["burn"], ["burn", "exec"])
    gm = GlobalMaster(0, spec)
    with pytest.raises(Unschedulable, match=r"task j\.1: no node offers driver 'container'") as refused:
        gm.submit(job("j", small("j.0", EXEC), small("j.1", CONTAINER)), 0.0)
    assert refused.value.field == "tasks.1.driver"
    with pytest.raises(Unschedulable, match="no node satisfies placement constraints") as refused:
        gm.submit(job("k", small("k.0", EXEC, constraints=[4])), 0.0)
    assert refused.value.field == "tasks.0.constraints"
    assert not gm.queue and not gm.waiting


def test_a_driver_offered_only_where_the_constraints_are_not_is_the_drivers_fault() -> None:
    row = (PartitionSpec(0, 0, (CAP, CAP), (1 << 4, 0), (("burn",), ("burn", "exec"))),)
    gm = GlobalMaster(0, ClusterSpec((row,)))
    with pytest.raises(Unschedulable, match=r"satisfying placement constraints \[4\] .* offers driver 'exec'") as no:
        gm.submit(job("j", small("j.0", EXEC, constraints=[4])), 0.0)
    assert no.value.field == "tasks.0.driver"
    assert _placed(gm.submit(job("k", small("k.0", constraints=[4])), 0.0)) == {"k.0": 0}


def test_a_parked_task_of_one_driver_does_not_hold_up_another_drivers_task_of_the_same_shape() -> None:
    # Whole-node tasks: the exec node runs one exec task at a time; the second waits for it, not for the burn node.
    spec = cluster(["burn", "exec"], ["burn"])
    observer = Decisions()
    net = Net.build(spec, observer=observer)
    first, second = replace(task("j.0"), run=EXEC), replace(task("j.1"), run=EXEC)
    burn = task("j.2")
    net.post(net.gms[0].submit(job("j", first, second, burn), 0.0))
    batch = net.inbox[0].msg
    assert isinstance(batch, LaunchBatch)
    assert {p.task.task_id: p.node for p in batch.placements} == {"j.0": 0, "j.2": 1}  # j.2 is not behind j.1
    net.run()
    assert observer.nodes == {"j.0": [0], "j.2": [1], "j.1": [0]}  # the burn node freed first; j.1 waited for 0
    assert not net.gms[0].waiting and not net.gms[0].running


def test_the_lm_refuses_a_placement_on_a_node_without_the_tasks_driver() -> None:
    spec = cluster(["burn"], ["burn", "exec"])
    lm = LocalMaster.in_cluster(spec, 0)
    placements = [Placement(small("j.0", EXEC), 0, 0, False), Placement(small("j.1", EXEC), 0, 1, False)]
    (response, *_) = lm.handle(LaunchBatch(0, 0, 1, placements), 0.0)
    msg = response.msg
    assert isinstance(msg, LaunchResponse)
    assert [p.task.task_id for p in msg.accepted] == ["j.1"]
    (rejection,) = msg.rejected
    assert rejection.reason == "node 0 does not offer driver 'exec'" and not rejection.inconsistency
    assert lm.inconsistencies == 0


def test_burn_tasks_are_checked_only_where_some_node_lacks_burn() -> None:
    lm = LocalMaster.in_cluster(cluster(["exec"], ["burn"]), 0)
    (response, *_) = lm.handle(LaunchBatch(0, 0, 1, [Placement(small("j.0"), 0, 0, False)]), 0.0)
    assert [r.reason for r in response.msg.rejected] == ["node 0 does not offer driver 'burn'"]


@pytest.mark.parametrize(
    ("drivers", "message"),
    [((("burn",),), "differ in length"), ((("burn",), ("gpu",)), "drivers among"), ((("burn",), ()), "drivers among")],
)
def test_a_partition_needs_known_drivers_for_every_node(drivers: tuple[tuple[str, ...], ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PartitionSpec(0, 0, (CAP, CAP), (0, 0), drivers)
