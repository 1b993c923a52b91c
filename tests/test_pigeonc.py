"""The PigeonC baseline: its distributors and masters in isolation, hand-checked runs on the event loop, property
tests of its invariants, and replays (including the published reference figures)."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megha.common.core.baselines.pigeonc import (
    GroupCatalogue,
    Master,
    TaskBatch,
    split_groups,
)
from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.constraints import constraint_mask
from megha.common.core.messages import FinishedTask, Placement, WorkerLaunch, WorkerReport
from megha.common.core.observer import CoreObserver
from megha.common.core.task import JobSpec, TaskSpec
from megha.embedded.system import EmbeddedConfig
from megha.loadgen.replay import ReplayConfig, replay
from megha.sim.pigeonc import PigeonCConfig, PigeonCSystem

from corekit import CAP, cluster, job, task

HOP = 0.0005


class Log(CoreObserver):
    """Keeps every placement with its decision time, every start and every finish."""

    def __init__(self) -> None:
        self.placed: list[tuple[float, Placement]] = []
        self.starts: dict[str, float] = {}
        self.finishes: Counter[str] = Counter()

    def decided(self, placements: Sequence[Placement], now: float) -> None:
        self.placed.extend((now, p) for p in placements)

    def started(self, placements: Sequence[Placement], now: float) -> None:
        self.starts.update((p.task.task_id, now) for p in placements)

    def finished(self, task_ids: Sequence[str], now: float) -> None:
        self.finishes.update(task_ids)


def _system(spec: ClusterSpec, masters: int, **kwargs: object) -> tuple[PigeonCSystem, Log]:
    log = Log()
    config = PigeonCConfig(distributors=kwargs.pop("distributors", 1), masters=masters, **kwargs)  # type: ignore[arg-type]
    return PigeonCSystem(spec, EmbeddedConfig(hop_delay=HOP), log, config), log


# ------------------------------------------------------------------ groups and weights


def test_groups_are_contiguous_runs_of_the_data_centre_nodes_in_lm_order() -> None:
    spec = cluster([[[[0], [1]], [[2]]], [[[3], [4]], [[5], [6]]]])  # 7 nodes: LM 0 has 3, LM 1 has 4
    groups = split_groups(spec, 3)
    assert [g.size for g in groups] == [3, 2, 2]
    assert [g.constraint_masks for g in groups] == [
        (constraint_mask([0]), constraint_mask([1]), constraint_mask([2])),
        (constraint_mask([3]), constraint_mask([4])),
        (constraint_mask([5]), constraint_mask([6])),
    ]
    catalogue = GroupCatalogue(groups, spec.resource_names)
    assert [catalogue.group_of(n) for n in range(7)] == [0, 0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match=r"1\.\.7 masters"):
        split_groups(spec, 8)


def test_weights_count_the_satisfying_nodes_of_each_group() -> None:
    spec = cluster([[[[0, 1], [0], [1]], [[0, 1], [2], [2]]]])
    catalogue = GroupCatalogue(split_groups(spec, 2), spec.resource_names)
    assert catalogue.weights((constraint_mask([0]), CAP)) == ([0, 1], [2, 3])
    assert catalogue.weights((constraint_mask([2]), CAP)) == ([1], [2])
    assert catalogue.weights((0, CAP)) == ([0, 1], [3, 6])
    assert catalogue.weights((constraint_mask([3]), CAP)) == ([], [])
    # A request no node's capacity covers weighs nothing anywhere.
    assert catalogue.weights((0, (CAP[0] + 1, CAP[1]))) == ([], [])


def test_published_weighting_reproduces_the_authors_constraint_set_tally() -> None:
    # Group 0 in order: {0,1} is recorded; {0} and {1} are subsets of it and add to its count; {2} is recorded.
    # Group 1: {1} and then {0,1} are recorded; {} and the second {1} are subsets of both and add to each.
    spec = cluster([[[[0, 1], [0], [1], [2]], [[1], [0, 1], [], [1]]]])
    catalogue = GroupCatalogue(split_groups(spec, 2), spec.resource_names, "published")
    # True counts for constraint 0 are 2 and 1, for constraint 1 are 2 and 3, for none 4 and 4.
    assert catalogue.weights((constraint_mask([0]), CAP)) == ([0, 1], [3, 6])
    assert catalogue.weights((constraint_mask([1]), CAP)) == ([0, 1], [3, 9])
    assert catalogue.weights((0, CAP)) == ([0, 1], [4, 10])
    assert catalogue.weights((constraint_mask([2]), CAP)) == ([0], [1])
    with pytest.raises(ValueError, match="unknown PigeonC weighting"):
        GroupCatalogue(split_groups(spec, 2), spec.resource_names, "even")


def test_unschedulable_tasks_are_refused_at_the_distributor_with_the_reason() -> None:
    spec = cluster([[[[0], [0]], [[1], [1]]]])
    pigeon, log = _system(spec, masters=2)
    pigeon.submit(0, job("j0", task("j0.0", [0]), task("j0.1", [0, 1])))
    pigeon.submit(0, job("j1", task("j1.0", [], request=(CAP[0] * 2, CAP[1]))))
    pigeon.run()
    reasons = {j.job_id: reason for j, reason in pigeon.rejected}
    assert "no node satisfies placement constraints [0, 1]" in reasons["j0"]
    assert "has capacity for cpu_millicores=8000" in reasons["j1"]
    assert not log.placed and not pigeon.stranded_tasks()


# ------------------------------------------------------------------ hand-checked runs


def test_a_task_waits_at_its_master_for_a_whole_task_even_when_another_group_is_idle() -> None:
    # Master 0 owns nodes 0-1 (constraint 1), master 1 owns nodes 2-3 (constraint 2 only).
    spec = cluster([[[[1], [1]], [[2], [2]]]])
    pigeon, log = _system(spec, masters=2)
    pigeon.submit(0, job("j0", task("j0.a", [1]), task("j0.b", [1]), task("j0.c", [1]), task("j0.d", [2])))
    pigeon.run()
    # submit -> distributor -> master -> worker: three hops.
    assert log.starts["j0.a"] == log.starts["j0.b"] == log.starts["j0.d"] == pytest.approx(3 * HOP)
    # j0.c waits for a node of its own group: a and b end at 1 s + 3 hops, the report reaches the master one
    # hop later and the launch the worker one more: 1 s + 5 hops. The idle group 1 cannot take it.
    assert log.starts["j0.c"] == pytest.approx(1.0 + 5 * HOP)
    placed = {p.task.task_id: p for _, p in log.placed}
    assert {placed[t].node for t in ("j0.a", "j0.b")} == {0, 1} and placed["j0.c"].node in (0, 1)
    assert placed["j0.d"].lm == 1 and placed["j0.d"].node in (2, 3)
    assert log.finishes == Counter({"j0.a": 1, "j0.b": 1, "j0.c": 1, "j0.d": 1})
    assert pigeon.counters() == {"queued_at_master": 1, "long_tasks": 0, "fqw_long_turns": 0}


def test_a_waiting_task_takes_the_first_freed_node_it_can_run_on() -> None:
    # One master, nodes 0 ({1}) and 1 ({}); two long-running tasks fill them, then a task needing constraint 1
    # and one needing nothing wait. Node 1 frees first: only the second waiting task can use it.
    spec = cluster([[[[1], []]]])
    pigeon, log = _system(spec, masters=1)
    pigeon.submit(0, job("j0", task("j0.0", [1], duration=3.0), task("j0.1", [], duration=1.0)))
    pigeon.submit(0, job("j1", task("j1.0", [1]), task("j1.1", []), at=0.5))
    pigeon.run()
    assert log.starts["j1.1"] == pytest.approx(1.0 + 5 * HOP)
    assert log.starts["j1.0"] == pytest.approx(3.0 + 5 * HOP)
    assert not pigeon.stranded_tasks()


# ------------------------------------------------------------------ weighted fair queuing at a master


def _tasks(*ids: str, constraints: Sequence[int] = ()) -> list[TaskSpec]:
    return [task(t, constraints) for t in ids]


def _launched(outputs: list) -> list[str]:  # type: ignore[type-arg]
    return [p.task.task_id for out in outputs for p in out.msg.launches]


def _finish(master: Master, task_id: str) -> list[str]:
    node = master.running[task_id][0] + master.view.start
    return _launched(master.handle(WorkerReport(master.master_id, [FinishedTask(task_id, node)]), 0.0))


def test_a_master_dequeues_one_long_task_per_fqw_short_tasks() -> None:
    group = PartitionSpec(0, 0, (CAP,), (0,))
    master = Master(0, group, first=0, fqw=2)
    assert _launched(master.handle(TaskBatch(0, 0, False, _tasks("s0")), 0.0)) == ["s0"]
    assert master.handle(TaskBatch(0, 0, True, _tasks("l1", "l2")), 0.0) == []
    assert master.handle(TaskBatch(0, 0, False, _tasks("s1", "s2", "s3", "s4", "s5")), 0.0) == []
    order, running = [], "s0"
    while master.running:
        launched = _finish(master, running)
        if not launched:
            break
        order.extend(launched)
        running = launched[0]
    assert order == ["s1", "s2", "l1", "s3", "s4", "l2", "s5"]
    assert master.queued == 7 and master.long_turns == 2
    assert master.waiting_tasks() == []


def test_a_long_task_gets_resources_that_no_waiting_short_task_can_use() -> None:
    group = PartitionSpec(0, 0, (CAP, CAP), (constraint_mask([1]), 0))
    master = Master(0, group, first=10, fqw=20)
    first = master.handle(TaskBatch(0, 0, False, _tasks("s0", "s1")), 0.0)
    assert {p.node for p in first[0].msg.launches} == {10, 11}
    master.handle(TaskBatch(0, 0, False, _tasks("short-needs-1", constraints=[1])), 0.0)
    master.handle(TaskBatch(0, 0, True, _tasks("long")), 0.0)
    freed = next(t for t, (i, _) in master.running.items() if i == 1)  # the node without constraint 1
    assert _finish(master, freed) == ["long"]
    assert master.long_turns == 0  # no short task could have run there: not a fair-queuing turn
    assert [t.task_id for t in master.waiting_tasks()] == ["short-needs-1"]


def test_a_master_refuses_messages_it_does_not_know() -> None:
    master = Master(0, PartitionSpec(0, 0, (CAP,), (0,)), first=0)
    with pytest.raises(TypeError, match="PigeonC master cannot handle WorkerLaunch"):
        master.handle(WorkerLaunch(0, []), 0.0)
    with pytest.raises(ValueError, match="fair queue weight"):
        Master(0, PartitionSpec(0, 0, (CAP,), (0,)), first=0, fqw=0)


def test_jobs_are_long_when_their_mean_task_duration_exceeds_the_cutoff() -> None:
    spec = cluster([[[[], []]]])
    pigeon, _ = _system(spec, masters=1, short_cutoff=10.0)
    distributor = pigeon.distributors[0]
    short = distributor.submit(job("s", task("s.0", duration=1.0), task("s.1", duration=19.0)), 0.0)
    long = distributor.submit(job("l", task("l.0", duration=1.0), task("l.1", duration=19.5)), 0.0)
    assert [out.msg.long for out in (*short, *long)] == [False, True]
    assert pigeon.counters()["long_tasks"] == 2


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("masters", 0, "masters must be at least 1"), ("weighting", "even", "weighting must be one of")],
)
def test_bad_configuration_is_refused_naming_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PigeonCConfig(**{field: value})  # type: ignore[arg-type]


# ------------------------------------------------------------------ invariants


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ClusterSpec, int, list[JobSpec]]:
    nodes = draw(st.integers(2, 8))
    masks = tuple(draw(st.integers(0, 7)) for _ in range(nodes))
    caps = tuple((draw(st.sampled_from([2, 4])), 4) for _ in range(nodes))
    spec = ClusterSpec(((PartitionSpec(0, 0, caps, masks),),))
    jobs = [
        JobSpec(
            f"j{j}",
            tuple(
                TaskSpec(
                    f"j{j}.{i}",
                    f"j{j}",
                    "u",
                    draw(st.sampled_from([0.5, 1.0, 2.0])),
                    (draw(st.integers(1, 4)), draw(st.integers(1, 4))),
                    draw(st.integers(0, 7)),
                )
                for i in range(draw(st.integers(1, 5)))
            ),
            draw(st.sampled_from([0.0, 0.25, 1.0])),
        )
        for j in range(draw(st.integers(1, 6)))
    ]
    return spec, draw(st.integers(1, nodes)), jobs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from(["satisfying", "published"]), st.sampled_from(["random", "min-constraints"]))
def test_placements_stay_in_the_masters_group_and_every_accepted_task_completes_once(
    scenario: tuple[ClusterSpec, int, list[JobSpec]], weighting: str, matching: str
) -> None:
    spec, masters, jobs = scenario
    log = Log()
    pigeon = PigeonCSystem(
        spec, EmbeddedConfig(matching=matching, hop_delay=HOP), log, PigeonCConfig(2, masters, 1, 1.5, weighting)
    )
    for k, j in enumerate(jobs):
        pigeon.submit(k % 2, j)
    pigeon.run()
    rejected = {j.job_id for j, _ in pigeon.rejected}
    accepted = [t for j in jobs if j.job_id not in rejected for t in j.tasks]
    assert log.finishes == Counter(t.task_id for t in accepted)
    assert not pigeon.stranded_tasks()
    catalogue = pigeon.catalogue
    masks = [m for g in split_groups(spec, masters) for m in g.constraint_masks]
    for _, p in log.placed:
        assert catalogue.group_of(p.node) == p.lm  # never outside its master's group
        assert p.task.constraints & ~masks[p.node] == 0
    # The weighted choice only ever offers masters whose group holds a node that could run the task.
    for t in accepted:
        for m in catalogue.weights((t.constraints, t.request))[0]:
            group = split_groups(spec, masters)[m]
            assert any(
                t.constraints & ~mask == 0 and all(c >= r for c, r in zip(cap, t.request))
                for cap, mask in zip(group.capacities, group.constraint_masks)
            )
    assert all(not m.running for m in pigeon.masters) and all(m.view.free == m.view.capacity for m in pigeon.masters)


# ------------------------------------------------------------------ replays


def _assert_nothing_lost(result) -> None:  # type: ignore[no-untyped-def]
    m = result.metrics
    assert m.not_exactly_once == ()
    assert m.tasks_completed + m.tasks_failed == m.tasks
    assert not result.system.stranded_tasks()
    assert all(rec.completions == 1 for rec in result.recorder.tasks.values() if not rec.failed_reason)


def test_reduced_replay_completes_every_task() -> None:
    result = replay(ReplayConfig(trace="syn:50:20", lms=2, gms=2, workers_per_partition=25, scheduler="pigeonc"))
    _assert_nothing_lost(result)
    m = result.metrics
    assert m.tasks == 1000 and m.tasks_completed + 50 * m.jobs_rejected == 1000
    # submit -> distributor -> master -> worker: no job beats three hops of delay.
    assert m.jrt_delay.median >= 3 * HOP - 1e-9


@pytest.mark.parametrize("scheduler", ["pigeonc", "pigeonc-published"])
def test_a_replay_runs_pigeonc_with_the_masters_it_names(scheduler: str) -> None:
    config = ReplayConfig(trace="syn:50:20", lms=2, gms=2, workers_per_partition=25, scheduler=scheduler)
    default, seven = replay(config), replay(dataclasses.replace(config, pigeonc_masters=7))
    for result, masters in ((default, 100), (seven, 7)):
        _assert_nothing_lost(result)
        system = result.system
        assert isinstance(system, PigeonCSystem) and len(system.masters) == masters
        assert system.pigeonc.weighting == ("published" if scheduler == "pigeonc-published" else "satisfying")
        # Every task ran in one of the masters' groups: nodes 0..99 of the data centre, numbered group by group.
        groups = {rec.lm for rec in result.recorder.tasks.values() if rec.node >= 0}
        assert groups and groups <= set(range(masters))
    assert len({rec.lm for rec in seven.recorder.tasks.values() if rec.node >= 0}) == 7


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"pigeonc_masters": 0}, "--pigeonc-masters 0 must be at least 1"),
        ({"pigeonc_masters": 101}, "PigeonC needs 1..100 masters for 100 nodes, got 101"),
        ({"pigeonc_masters": 7, "scheduler": "megha"}, "--pigeonc-masters is PigeonC's"),
        ({"pigeonc_masters": 7, "scheduler": "sparrow"}, "--pigeonc-masters is PigeonC's"),
    ],
)
def test_a_replay_refuses_masters_pigeonc_cannot_have(fields: dict[str, object], message: str) -> None:
    config = ReplayConfig(trace="syn:5:2", lms=2, gms=2, workers_per_partition=25, scheduler="pigeonc")
    with pytest.raises(ValueError, match=re.escape(message)):
        replay(dataclasses.replace(config, **fields))  # type: ignore[arg-type]


def test_scaled_mode_replay_shares_nodes_between_tasks() -> None:
    # 100 nodes for the default 100 masters: one node per group, so only sharing lets a group run two tasks.
    result = replay(
        ReplayConfig(trace="syn:40:10", lms=1, gms=2, workers_per_partition=50, mode="scaled", scheduler="pigeonc")
    )
    _assert_nothing_lost(result)
    runs = [(rec.node, rec.started_at, rec.finished_at) for rec in result.recorder.tasks.values() if rec.node >= 0]
    assert any(a[0] == b[0] and a[1] < b[2] and b[1] < a[2] for i, a in enumerate(runs) for b in runs[i + 1 :]), (
        "no node ever ran two tasks at once"
    )


def test_reference_replay_of_syn_250_against_the_published_pigeonc_delays(
    syn_250: Path, reference_cluster: Path
) -> None:
    """Published (authors' simulator, first 200 jobs of syn_250, reference cluster, Random, 0.5 ms per hop):
    median 1.0025 s, p99 11.04 s, max 11.06 s.

    Delays come in waves: a job whose task waited for a node of its group ends one whole task (1 s) plus five
    hops later, so a median of 1.0025 s says more than half the jobs had a task wait once. With the
    distributors' weights as the paper defines them (the default) fewer than half the jobs wait and nothing
    waits twice in a row for long; with the authors' constraint-set tally ("published") the median is the
    published one-wave value within a few hops, and the tail is a backlog of several waves. How many waves the
    second-worst of about 200 jobs waits depends on which rare constraint combinations the seeded draw gives:
    seeds 0-7 give p99 of 4-8 s (seed 0: 6.0 s) against the published 11.04 s, so the p99 band is 3-12 s.
    """
    config = ReplayConfig(trace=str(syn_250), first_jobs=200, cluster=str(reference_cluster), scheduler="pigeonc")

    paper = replay(config)
    _assert_nothing_lost(paper)
    assert paper.metrics.jobs == 200
    assert paper.metrics.jrt_delay.median < 0.010, paper.metrics.jrt_delay
    assert 1.0 < paper.metrics.jrt_delay.p99 < 2.1, paper.metrics.jrt_delay

    published = replay(dataclasses.replace(config, scheduler="pigeonc-published"))
    _assert_nothing_lost(published)
    d = published.metrics.jrt_delay
    assert 1.0025 - 1e-9 <= d.median <= 1.0025 + 10 * HOP, d
    assert 3.0 < d.p99 < 12.0 and d.max < 12.0, d
    queued = [r.system.counters()["queued_at_master"] for r in (paper, published)]
    assert queued[1] > 2 * queued[0]
    for j, reason in published.system.rejected:
        assert "no node satisfies placement constraints" in reason, (j.job_id, reason)
