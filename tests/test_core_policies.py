"""The GM core's extension points: queue orders (a new one registered in one line), preemption and usage defaults,
and "why unschedulable" read off the placer's feasibility filters."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest
from pydantic import ValidationError

from megha.common.core.fairness.config import parse_queues
from megha.common.core.gm import GlobalMaster
from megha.common.core.messages import LaunchBatch
from megha.common.core.placement.choice import FirstFitChoice, make_choice
from megha.common.core.placement.filters import CAPACITY, CONSTRAINTS, DRIVER, Filter, explain
from megha.common.core.placement.search import FirstFitSearch, PartitionSearch
from megha.common.core.policies import QUEUE_ORDERS, gm_policies
from megha.common.core.policies.fair_share import FairQueueOrder, FairSharePreemption
from megha.common.core.policies.preemption import NoPreemption
from megha.common.core.policies.queue_order import FifoQueue, KeyedOrder, KeyedQueue, UserTurnsOrder, UserTurnsQueue
from megha.common.core.policies.usage import NoAccounting
from megha.common.core.task import TaskSpec
from megha.common.settings import GMSettings
from megha.loadgen.replay import ReplayConfig, replay

from corekit import CAP, Net, cluster, job, task


class SmallestFirst(KeyedOrder):
    """The example of docs/architecture.md: a queue order in one class, registered with one line."""

    name = "smallest-first"

    def key(self, task: TaskSpec) -> tuple[int, ...]:
        return task.request


def test_a_registered_queue_order_decides_which_task_gets_the_only_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(QUEUE_ORDERS, SmallestFirst.name, SmallestFirst)
    spec = cluster([[[[]]]])
    big, small = task("j.0", request=CAP), task("j.1", request=(CAP[0] // 2, CAP[1] // 2))

    def first_placed(queue_order: str) -> str:
        gm = GlobalMaster(0, spec, policies=gm_policies(0, spec, queue_order=queue_order))
        # One job: both tasks are queued before the GM drains, so the order alone decides.
        outputs = gm.submit(job("j", big, small), 0.0)
        (batch,) = [s.msg for s in outputs if isinstance(s.msg, LaunchBatch)]
        return batch.placements[0].task.task_id

    assert first_placed("fifo") == "j.0"
    assert first_placed("smallest-first") == "j.1"


def test_unknown_queue_order_and_lm_order_are_refused_by_name() -> None:
    spec = cluster([[[[]]]])
    with pytest.raises(ValueError, match="unknown queue order 'lifo'; choose one of"):
        gm_policies(0, spec, queue_order="lifo")
    with pytest.raises(ValueError, match="unknown LM order 'spiral'"):
        gm_policies(0, spec, lm_order="spiral")
    with pytest.raises(ValueError, match="does not apply under fair scheduling"):
        gm_policies(0, spec, parse_queues("a:100%:0"), queue_order="smallest-first")


def test_defaults_are_plain_and_fairness_plugs_in_its_three_policies() -> None:
    spec = cluster([[[[]]]])
    plain = gm_policies(0, spec)
    assert (plain.queue_order.name, type(plain.preemption), type(plain.usage)) == ("fifo", NoPreemption, NoAccounting)
    assert plain.preemption.plan(task("a.0"), None) is None
    fair = gm_policies(0, spec, parse_queues("user-0:100%:0"))
    assert isinstance(fair.queue_order, FairQueueOrder) and isinstance(fair.preemption, FairSharePreemption)
    assert fair.queue_order.admission_reason(task("a.0")) is None
    other = TaskSpec("b.0", "b", "mallory", 1.0, CAP, 0)
    assert fair.queue_order.admission_reason(other) == "user 'mallory' has no queue (configured users: user-0)"


def test_fifo_and_keyed_queues_put_retried_tasks_first_and_remove_cancelled_ones_in_order() -> None:
    a, b, c, d = (task(f"{n}.0", request=(r, r)) for n, r in (("a", 3), ("b", 1), ("c", 2), ("d", 9)))
    fifo = FifoQueue()
    fifo.extend([a, b, c])
    fifo.extendleft([d])
    assert fifo.remove_if(lambda t: t is b) == [b] and list(fifo) == [d, a, c]
    keyed = KeyedQueue(lambda t: t.request)
    keyed.extend([a, b, c])
    keyed.extendleft([d])
    keyed.push_front(c)
    assert list(keyed) == [c, d, b, c, a]
    assert keyed.remove_if(lambda t: t is b) == [b]
    assert [keyed.popleft() for _ in range(len(keyed))] == [c, d, c, a]
    with pytest.raises(IndexError):
        keyed.popleft()


def _of(user: str, task_id: str) -> TaskSpec:
    return replace(task(task_id), user=user)


def test_the_users_order_serves_users_in_turns_retried_tasks_first_and_removes_cancelled_ones_in_order() -> None:
    """`users`: alice's job of four queued before bob's one task does not keep it waiting behind all four."""
    a = [_of("alice", f"a.{i}") for i in range(4)]
    b = [_of("bob", f"b.{i}") for i in range(2)]
    c = _of("carol", "c.0")
    queue = UserTurnsQueue()
    queue.extend(a)
    queue.extend(b)
    queue.extend([c])
    assert [t.task_id for t in queue] == ["a.0", "b.0", "c.0", "a.1", "b.1", "a.2", "a.3"]
    queue.extendleft([a[3]])  # retried first (as deque.extendleft)
    assert queue.remove_if(lambda t: t.user == "bob") == b and len(queue) == 6
    served = [queue.popleft().task_id for _ in range(len(queue))]
    assert served == ["a.3", "a.0", "c.0", "a.1", "a.2", "a.3"]
    with pytest.raises(IndexError):
        queue.popleft()
    queue.push_back(b[0])
    queue.push_front(c)
    assert [queue.popleft().task_id for _ in range(2)] == ["c.0", "b.0"] and len(queue) == 0


def test_the_users_order_gives_freed_nodes_to_the_users_parked_shapes_in_turns() -> None:
    order = UserTurnsOrder()
    shapes = [(0, (1, 1), "alice", None, 0), (0, (2, 2), "alice", None, 0), (0, (1, 1), "bob", None, 0)]
    first = list(order.service_order(iter(shapes), {}))
    second = list(order.service_order(iter(shapes), {}))
    assert first == [shapes[0], shapes[2], shapes[1]] and second == [shapes[2], shapes[0], shapes[1]]
    assert list(order.service_order(iter(shapes[:2]), {})) == shapes[:2]


def test_the_users_order_runs_another_user_s_task_before_the_rest_of_a_big_job() -> None:
    """One node, room for one task at a time, alice's job of four then bob's one task: under `fifo` bob's task runs
    after all of alice's, under `users` after her second (freed nodes go to the users' parked tasks in turns)."""
    spec = cluster([[[[]]]])

    def started(queue_order: str) -> list[str]:
        net = Net.build(spec, policies=gm_policies(0, spec, queue_order=queue_order))
        net.post(net.gms[0].submit(job("a", *(_of("alice", f"a.{i}") for i in range(4))), 0.0))
        net.post(net.gms[0].submit(job("b", _of("bob", "b.0")), 0.0))
        order: list[str] = []
        while net.inbox or net.timers:
            if net.inbox:
                sent = net.deliver()
                if isinstance(sent.msg, LaunchBatch):
                    order += [p.task.task_id for p in sent.msg.placements]
                continue
            net.timers.sort(key=lambda w: w.at)
            wake = net.timers.pop(0)
            net.now = max(net.now, wake.at)
            net.post(net.endpoint(wake.dest).handle(wake.msg, net.now))
        return order

    assert started("fifo") == ["a.0", "a.1", "a.2", "a.3", "b.0"]
    assert started("users") == ["a.0", "a.1", "b.0", "a.2", "a.3"]


@pytest.mark.parametrize(
    ("passing", "expected"),
    [
        ({(CONSTRAINTS, CAPACITY, DRIVER)}, None),
        (set(), ("no node satisfies placement constraints [1]", "constraints")),
        ({(CONSTRAINTS,)}, ("no node has capacity for cpu_millicores=1, memory_mb=2", "")),
        ({(CONSTRAINTS,), (CAPACITY,)}, ("no node offers driver 'burn'", "driver")),
        (
            {(CONSTRAINTS,), (CAPACITY,), (DRIVER,)},
            ("no node satisfying placement constraints [1] has capacity for cpu_millicores=1, memory_mb=2", ""),
        ),
        (
            {(CONSTRAINTS,), (CAPACITY,), (DRIVER,), (CONSTRAINTS, CAPACITY)},
            (
                "no node satisfying placement constraints [1] with capacity for cpu_millicores=1, memory_mb=2 "
                "offers driver 'burn'",
                "driver",
            ),
        ),
    ],
    ids=["feasible", "constraints", "capacity", "driver", "constraints-then-capacity", "all-three"],
)
def test_the_reason_names_the_first_filter_no_node_passes_alone_or_after_the_earlier_ones(
    passing: set[tuple[Filter, ...]], expected: tuple[str, str] | None
) -> None:
    def passes(steps: Sequence[Filter]) -> bool:
        return tuple(steps) in passing

    one = task("j.0", [1], request=(1, 2))
    assert explain(one, ("cpu_millicores", "memory_mb"), passes) == expected
    assert explain(task("j.1", request=(1, 0)), ("cpu_millicores", "memory_mb"), passes) == (
        "request cpu_millicores=1, memory_mb=0 must be positive",
        "",
    )


def test_the_gm_explains_a_task_no_node_could_run_with_the_filters_that_match() -> None:
    spec = cluster([[[[1], [2]]]])
    gm = GlobalMaster(0, spec)
    assert gm.unschedulable_reason(task("a.0", [1])) is None
    assert gm.unschedulable_reason(task("a.1", [1, 2])) == "no node satisfies placement constraints [1, 2]"
    too_big = task("a.2", [1], request=(CAP[0] + 1, CAP[1]))
    assert gm.unschedulable_reason(too_big) == "no node has capacity for cpu_millicores=4001, memory_mb=8192"
    assert gm.submit(job("ok", task("ok.0", [2])), 0.0)


def test_first_fit_choice_takes_the_lowest_feasible_node() -> None:
    spec = cluster([[[[1], [], [1], [1]]]])
    view = GlobalMaster(0, spec).views[0][0]
    t = task("a.0", [1])
    assert FirstFitChoice().choose(view, 0b1100, random.Random(0), t) == 2
    assert make_choice("first-fit").choose(view, 0b1000, random.Random(0), t) == 3


def test_first_fit_lm_order_starts_at_lm_0_for_every_task_and_round_robin_rotates() -> None:
    spec = cluster([[[[]], [[]], [[]]], [[[]], [[]], [[]]]])  # 2 LMs x 3 GMs, one node per partition
    views = GlobalMaster(1, spec).views
    first_fit, rotating = FirstFitSearch(1, views), PartitionSearch(1, views)
    for _ in range(2):
        assert [(v.lm, v.gm) for v in first_fit.internal(task("t"))] == [(0, 1), (1, 1)]
        assert [(v.lm, v.gm) for v in first_fit.external(task("t"))] == [(0, 0), (0, 2), (1, 0), (1, 2)]
    assert [[v.lm for v in rotating.internal(task("t"))] for _ in range(2)] == [[0, 1], [1, 0]]


def test_the_variants_are_settings_and_replay_options_that_still_complete_every_task() -> None:
    with pytest.raises(ValidationError, match="unknown queue order 'lifo'"):
        GMSettings(queue_order="lifo")
    assert GMSettings(lm_order="first-fit", matching="first-fit").lm_order == "first-fit"
    config = ReplayConfig(trace="syn:40:30", lms=2, gms=3, workers_per_partition=30)
    paper = replay(replace(config, lm_order="first-fit", matching="first-fit"))
    assert paper.system.gms[0].placer.search.__class__ is FirstFitSearch
    accepted = [rec for rec in paper.recorder.tasks.values() if not rec.failed_reason]
    assert len(accepted) >= 200 and all(rec.completions == 1 for rec in accepted)
    assert all(lm.is_idle() for lm in paper.system.lms)
    with pytest.raises(ValueError, match="unknown queue order 'lifo'"):
        replay(replace(config, queue_order="lifo"))
