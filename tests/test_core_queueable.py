"""Queueable tasks in the core (docs/queueable.md): the per-node queue a worker runs (start when it fits, FIFO,
eviction newest first, a guaranteed task never delayed), the LM's admission (beyond the free resources, the free
resources unchanged for GMs, a bounded queue), the GM's opportunistic placement, and replays in which every task
ends exactly once while queueable ones are evicted and run again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megha.cli import main
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import (
    FinishedTask,
    LaunchBatch,
    LaunchResponse,
    Placement,
    WorkerLaunch,
    WorkerReport,
)
from megha.common.core.observer import CoreObserver
from megha.common.core.queueable import QUEUE_FULL, NodeQueues, is_marked_queueable, mark_queueable
from megha.common.core.task import TaskSpec
from megha.common.core.worker import SimulatedExecution
from megha.loadgen.replay import ReplayConfig, replay
from megha.sim.experiments import queueable as experiment

from corekit import CAP, Net, cluster, job, task

HALF = (CAP[0] // 2, CAP[1] // 2)


def _q(task_id: str, request: tuple[int, ...] = CAP, duration: float = 1.0) -> TaskSpec:
    return replace(task(task_id, request=request, duration=duration), queueable=True)


def _queues() -> NodeQueues:
    return NodeQueues(lambda node: (10, 10))


# ------------------------------------------------------------------------------------------------ node queues


def test_a_queueable_run_starts_at_once_when_it_fits_beside_what_runs() -> None:
    q = _queues()
    assert q.launch(0, "g", (6, 6), False).started == ["g"]
    assert q.launch(0, "a", (4, 4), True).started == ["a"]
    assert q.launch(0, "b", (1, 1), True).started == []  # no room left: it waits
    assert q.waiting(0) == ["b"] and q.running_queueable(0) == ["a"]


def test_waiting_runs_start_in_fifo_order_when_capacity_frees() -> None:
    q = _queues()
    q.launch(0, "g", (10, 10), False)
    for run, size in (("a", 6), ("b", 2), ("c", 2)):
        assert q.launch(0, run, (size, size), True).started == []
    assert q.waiting(0) == ["a", "b", "c"]
    assert q.end("g") == ["a", "b", "c"]  # in arrival order, as they fit


def test_a_small_run_does_not_pass_a_big_one_waiting_before_it() -> None:
    q = _queues()
    q.launch(0, "g", (5, 5), False)
    q.launch(0, "big", (8, 8), True)
    assert q.launch(0, "small", (1, 1), True).started == []  # it would fit, but "big" waits first
    assert q.end("g") == ["big", "small"]


def test_a_guaranteed_run_evicts_the_newest_queueable_runs_only_as_many_as_it_needs() -> None:
    q = _queues()
    for run in ("old", "mid", "new"):
        assert q.launch(0, run, (3, 3), True).started == [run]
    moves = q.launch(0, "g", (5, 5), False)
    assert moves.started == ["g"]  # never delayed
    assert moves.evicted == ["new", "mid"]  # newest first, until it fits
    assert q.running_queueable(0) == ["old"]
    assert q.end("new") == []  # an evicted run is gone already


def test_a_guaranteed_run_leaves_waiting_runs_waiting_and_other_nodes_alone() -> None:
    q = _queues()
    q.launch(1, "other", (9, 9), True)
    q.launch(0, "g1", (8, 8), False)
    q.launch(0, "w", (5, 5), True)
    moves = q.launch(0, "g2", (2, 2), False)
    assert moves.started == ["g2"] and moves.evicted == [] and q.waiting(0) == ["w"]
    assert q.running_queueable(1) == ["other"]


def test_a_waiting_run_taken_out_lets_the_next_one_start() -> None:
    q = _queues()
    q.launch(0, "g", (5, 5), False)
    q.launch(0, "big", (8, 8), True)
    q.launch(0, "small", (1, 1), True)
    assert q.is_waiting("big")
    assert q.end("big") == ["small"]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["launch-g", "launch-q", "end"]), st.integers(1, 10), st.integers(0, 30)),
        max_size=60,
    )
)
def test_node_queue_invariants_hold_after_every_event(ops: list[tuple[str, int, int]]) -> None:
    """Guaranteed runs start at once; queueable ones never overcommit the node; waiting runs start in arrival
    order; nothing that fits waits; evictions are the newest running queueable runs."""
    q = NodeQueues(lambda node: (10,))
    size: dict[str, int] = {}
    guaranteed: list[str] = []
    running: list[str] = []  # queueable, start order
    waiting: list[str] = []
    started_order: list[str] = []
    arrival: list[str] = []
    for k, (op, amount, pick) in enumerate(ops):
        if op == "end":
            alive = guaranteed + running + waiting
            if not alive:
                continue
            run = alive[pick % len(alive)]
            for group in (guaranteed, running, waiting):
                if run in group:
                    group.remove(run)
            started = q.end(run)
            evicted: list[str] = []
        else:
            run = f"r{k}"
            size[run] = amount
            if op == "launch-g":
                guaranteed_total = sum(size[g] for g in guaranteed) + amount
                if guaranteed_total > 10:
                    continue  # the LM never places guaranteed runs beyond the capacity
                guaranteed.append(run)
                moves = q.launch(0, run, (amount,), False)
                assert moves.started[:1] == [run]  # a guaranteed run is never delayed
                started, evicted = moves.started[1:], moves.evicted
            else:
                arrival.append(run)
                waiting.append(run)
                moves = q.launch(0, run, (amount,), True)
                started, evicted = moves.started, moves.evicted
        assert evicted == running[::-1][: len(evicted)]  # newest first
        for run in evicted:
            running.remove(run)
        for run in started:
            assert run == waiting[0]  # FIFO
            waiting.pop(0)
            running.append(run)
            started_order.append(run)
        held = sum(size[r] for r in guaranteed + running)
        assert held <= 10
        if waiting:
            assert held + size[waiting[0]] > 10  # the head does not fit: nothing that could run waits
        assert q.waiting(0) == waiting and q.running_queueable(0) == running
    assert started_order == [r for r in arrival if r in started_order]


# ------------------------------------------------------------------------------------------------------ LM


def _lm(nodes: int = 1, per_node: int = 2) -> LocalMaster:
    spec = cluster([[[[]] * nodes]])
    return LocalMaster(0, spec.partitions[0], spec.resource_names, queueable_per_node=per_node)


def _batch(seq: int, *placements: Placement) -> LaunchBatch:
    return LaunchBatch(0, 0, seq, list(placements))


def _response(out: list) -> LaunchResponse:  # type: ignore[type-arg]
    return next(o.msg for o in out if isinstance(o.msg, LaunchResponse))


def test_lm_accepts_queueable_tasks_beyond_the_free_resources_and_leaves_those_to_guaranteed_tasks() -> None:
    lm = _lm()
    busy = lm.handle(_batch(1, Placement(task("g.0"), 0, 0, False)), 0.0)
    assert _response(busy).accepted and lm.free[0] == (0, 0)
    out = lm.handle(_batch(2, Placement(_q("q.0"), 0, 0, False)), 0.0)
    resp = _response(out)
    assert [p.task.task_id for p in resp.accepted] == ["q.0"] and lm.free[0] == (0, 0)
    assert any(isinstance(o.msg, WorkerLaunch) for o in out)
    # The node's state was reported anew (a new version), with the free resources guaranteed tasks see.
    assert resp.states[0].free == (0, 0)
    lm.handle(WorkerReport(0, [_finished("g.0")]), 1.0)
    assert lm.free[0] == CAP  # the queueable task holds nothing a guaranteed task could be refused for
    out = lm.handle(_batch(3, Placement(task("g.1"), 0, 0, False)), 1.0)
    assert [p.task.task_id for p in _response(out).accepted] == ["g.1"]


def _finished(task_id: str) -> FinishedTask:
    return FinishedTask(task_id, 0)


def test_lm_bounds_the_queueable_tasks_per_node_with_an_inconsistency_the_gm_takes_elsewhere() -> None:
    lm = _lm(per_node=2)
    lm.handle(_batch(1, Placement(task("g.0"), 0, 0, False)), 0.0)
    out = lm.handle(_batch(2, *(Placement(_q(f"q.{k}"), 0, 0, False) for k in range(3))), 0.0)
    resp = _response(out)
    assert len(resp.accepted) == 2 and len(resp.rejected) == 1
    rejection = resp.rejected[0]
    assert rejection.inconsistency and rejection.reason.startswith(QUEUE_FULL)
    lm.handle(WorkerReport(0, [_finished("q.0")]), 1.0)
    assert _response(lm.handle(_batch(3, Placement(_q("q.3"), 0, 0, False)), 1.0)).accepted


def test_lm_runs_a_queueable_task_that_fits_the_free_resources_as_a_guaranteed_one() -> None:
    """Promotion (Mercury, section 3.4): nothing would be gained by making it evictable."""
    lm = _lm()
    out = lm.handle(_batch(1, Placement(_q("q.0", request=HALF), 0, 0, False)), 0.0)
    assert [p.task.task_id for p in _response(out).accepted] == ["q.0"]
    (launch,) = [o.msg for o in out if isinstance(o.msg, WorkerLaunch)]
    assert [p.task.queueable for p in launch.launches] == [False]
    assert lm.free[0] == HALF and lm.queues.held == {}
    lm.handle(WorkerReport(0, [_finished("q.0")]), 1.0)
    assert lm.free[0] == CAP


def test_lm_refuses_a_queueable_task_larger_than_the_node_as_malformed() -> None:
    lm = _lm()
    resp = _response(lm.handle(_batch(1, Placement(_q("q.0", request=(CAP[0] + 1, 1)), 0, 0, False)), 0.0))
    assert len(resp.rejected) == 1 and not resp.rejected[0].inconsistency and "capacity" in resp.rejected[0].reason


def test_lm_reports_queueable_runs_of_a_lost_node_lost_to_their_gm() -> None:
    lm = _lm()
    lm.handle(_batch(1, Placement(_q("q.0"), 0, 0, False)), 0.0)
    out = lm.take_down([0], "worker silent", 5.0)
    items = [c for o in out if hasattr(o.msg, "items") for c in o.msg.items]
    assert [(c.task_id, c.lost) for c in items] == [("q.0", True)]
    assert lm.queues.held == {} and lm.running == {}


# ------------------------------------------------------------------------------------------------------ GM


def _net(nodes: int = 2, gms: int = 1, **gm_kwargs: object) -> Net:
    spec = cluster([[[[]] * nodes for _ in range(gms)]])
    net = Net.build(spec, **gm_kwargs)
    net.workers = [SimulatedExecution(lm, capacities=spec.lm_capacities(lm)) for lm in range(spec.num_lms)]
    return net


def _batches(net: Net) -> list[Placement]:
    return [p for m in net.inbox if isinstance(m.msg, LaunchBatch) for p in m.msg.placements]


def test_gm_sends_a_queueable_task_that_fits_nowhere_to_a_node_queue_and_parks_a_guaranteed_one() -> None:
    net = _net(nodes=2)
    gm = net.gms[0]
    net.post(gm.submit(job("g", task("g.0", duration=10.0), task("g.1", duration=10.0)), 0.0))
    while net.inbox:
        net.deliver()
    assert len(gm.running) == 2
    net.post(gm.submit(job("q", _q("q.0")), 0.0))
    net.post(gm.submit(job("h", task("h.0")), 0.0))
    sent = _batches(net)
    assert [p.task.task_id for p in sent] == ["q.0"]  # opportunistically, on a full node
    assert [t.task_id for t in gm.waiting_tasks()] == ["h.0"]  # a guaranteed task waits at its GM


def test_gm_spreads_queueable_tasks_over_the_nodes_with_the_fewest_of_its_queued_tasks_under_the_bound() -> None:
    net = _net(nodes=2)
    gm = net.gms[0]
    net.post(gm.submit(job("g", task("g.0", duration=10.0), task("g.1", duration=10.0)), 0.0))
    while net.inbox:
        net.deliver()
    net.post(gm.submit(job("q", *(_q(f"q.{k}") for k in range(10))), 0.0))
    nodes = [p.node for p in _batches(net)]
    assert sorted(nodes) == [0] * 4 + [1] * 4  # 4 per node (the bound), balanced
    assert len(gm.waiting_tasks()) == 2


def test_gm_avoids_a_node_whose_lm_refused_a_queueable_task_for_a_full_queue() -> None:
    spec = cluster([[[[], []], [[]]]])  # LM 0: GM 0 owns nodes 0-1, GM 1 owns node 2
    net = Net.build(spec)
    net.workers = [SimulatedExecution(0, capacities=spec.lm_capacities(0))]
    net.lms = [LocalMaster(0, spec.partitions[0], spec.resource_names, queueable_per_node=1)]
    g0, g1 = net.gms
    net.post(g0.submit(job("a", *(task(f"a.{k}", duration=10.0) for k in range(3))), 0.0))
    while net.inbox:
        net.deliver()
    assert len(g0.running) == 3  # every node is busy
    net.post(g1.submit(job("x", _q("x.0")), 0.0))  # GM 1 queues one on its own node 2
    while net.inbox:
        net.deliver()
    net.post(g0.submit(job("y", *(_q(f"y.{k}") for k in range(4))), 0.0))
    while net.inbox:  # ends: GM 0 does not send to a refusing node again and again
        net.deliver()
    # The bound is per GM: GM 1's task on node 2 leaves room for one of GM 0's. GM 0 assumes the default bound (4)
    # while this LM holds 1 per GM: each node refused y.3 for a full queue; GM 0 avoids all three and keeps it.
    lm = net.lms[0]
    assert lm.queues.held == {0: 1, 1: 1, 2: 2} and lm.queues.held_for[2, 1] == 1
    assert [t.task_id for t in g0.waiting_tasks()] == ["y.3"]
    assert lm.inconsistencies == 3
    assert g0.opportunistic.place(_q("z.0"), 0.5) is None  # all avoided
    assert g0.opportunistic.place(_q("z.0"), 2.0) is not None  # for REFUSED_HOLD_SECONDS


class Ends(CoreObserver):
    def __init__(self) -> None:
        self.completed: list[str] = []
        self.preempted: list[str] = []
        self.started_ids: list[str] = []

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool) -> None:
        self.completed.append(task.task_id)

    def task_preempted(self, task: TaskSpec, now: float) -> None:
        self.preempted.append(task.task_id)


def test_a_queued_task_runs_when_capacity_frees_and_a_guaranteed_task_evicts_it_and_it_runs_again() -> None:
    ends = Ends()
    net = _net(nodes=1, observer=ends)
    gm, lm, worker = net.gms[0], net.lms[0], net.workers[0]
    net.post(gm.submit(job("g", task("g.0", request=HALF, duration=3.0), task("g.1", request=HALF, duration=3.0)), 0))
    while net.inbox:
        net.deliver()
    net.post(gm.submit(job("q", _q("q.0", request=HALF, duration=5.0)), 0.0))
    while net.inbox:
        net.deliver()
    assert worker.queues is not None and worker.queues.waiting(0) == ["q.0"]  # queued behind the running tasks
    assert lm.free[0] == (0, 0)
    # g.0 and g.1 end at t=3: q.0 starts then. A guaranteed task arriving at t=4 evicts it.
    net.timers.sort(key=lambda w: w.at)
    wake = net.timers.pop(0)
    net.now = wake.at
    net.post(worker.handle(wake.msg, net.now))
    while net.inbox:
        net.deliver()
    assert worker.queues.running_queueable(0) == ["q.0"] and ends.completed == ["g.0", "g.1"]
    net.now = 4.0
    net.post(gm.submit(job("k", task("k.0", duration=2.0)), 4.0))  # the whole node
    while net.inbox and not ends.preempted:
        net.deliver()
    assert ends.preempted == ["q.0"]  # evicted, not waited for
    net.run()
    assert sorted(ends.completed) == ["g.0", "g.1", "k.0", "q.0"]  # each once
    assert lm.is_idle() and not worker.queues.waiting(0) and not gm.running


def test_marking_a_fraction_queueable_is_seeded_and_roughly_that_fraction() -> None:
    jobs = [job(f"j{k}", *(task(f"j{k}.{i}") for i in range(20))) for k in range(50)]
    marked = [mark_queueable(j, 0.3, seed=7) for j in jobs]
    share = sum(t.queueable for j in marked for t in j.tasks) / 1000
    assert 0.25 < share < 0.35
    assert all(t.queueable == is_marked_queueable(t.task_id, 0.3, 7) for j in marked for t in j.tasks)
    assert [t.queueable for t in mark_queueable(jobs[0], 0.3, seed=8).tasks] != [t.queueable for t in marked[0].tasks]


def test_replay_with_queueable_tasks_ends_every_task_exactly_once_with_evictions() -> None:
    config = ReplayConfig(
        trace="syn:40:30",
        lms=2,
        gms=2,
        workers_per_partition=6,
        queueable=0.5,
        time_scale=0.3,
        seed=3,
        constraints=False,
    )
    result = replay(config)
    m = result.metrics
    assert m.not_exactly_once == ()
    assert m.tasks_completed + m.tasks_failed == m.tasks and m.tasks_failed == 0
    assert all(lm.is_idle() for lm in result.system.lms)
    assert all(not w.queues or not w._queued for w in result.system.workers)
    evicted = sum(gm.preempted for gm in result.system.gms)
    assert evicted > 0  # queueable runs were evicted by guaranteed ones, and ran again


def test_a_waiting_run_that_starts_and_is_evicted_within_one_launch_is_reported_preempted_once() -> None:
    worker = SimulatedExecution(0, capacities=[(10, 10)])

    def launch(*tasks: TaskSpec) -> list[object]:
        out = worker.handle(WorkerLaunch(0, [Placement(t, 0, 0, False) for t in tasks]), 0.0)
        return [f for o in out if isinstance(o.msg, WorkerReport) for f in o.msg.finished]

    launch(task("g.0", request=(2, 2), duration=9.0), _q("a.0", request=(6, 6), duration=9.0))
    launch(_q("w.0", request=(3, 3), duration=9.0))
    assert worker.queues is not None and worker.queues.waiting(0) == ["w.0"]
    # g.1 evicts a.0, which lets w.0 start; g.2 then evicts w.0.
    reported = launch(task("g.1", request=(3, 3), duration=9.0), task("g.2", request=(5, 5), duration=9.0))
    assert [(f.task_id, f.preempted) for f in reported] == [("a.0", True), ("w.0", True)]  # type: ignore[attr-defined]
    assert worker.running == 3 and worker.queues.running_queueable(0) == []


def test_lm_queues_a_queueable_task_that_fits_behind_the_node_queueable_runs_instead_of_promoting_it() -> None:
    """Promoted, it would evict the queueable runs it came after."""
    lm = _lm(per_node=3)
    lm.handle(_batch(1, Placement(task("g.0", request=HALF), 0, 0, False)), 0.0)
    lm.handle(_batch(2, Placement(_q("q.0"), 0, 0, False)), 0.0)  # waits: it does not fit
    lm.handle(WorkerReport(0, [_finished("g.0")]), 1.0)
    out = lm.handle(_batch(3, Placement(_q("q.1", request=HALF), 0, 0, False)), 1.0)
    (launch,) = [o.msg for o in out if isinstance(o.msg, WorkerLaunch)]
    assert [p.task.queueable for p in launch.launches] == [True] and lm.free[0] == CAP
    assert lm.queues.held == {0: 2}


def test_a_rebuilt_lm_adopts_a_queueable_run_its_agent_holds_as_queueable() -> None:
    lm = _lm()
    lm.adopt([Placement(_q("q.0", request=HALF), 0, 0, False, 0)])
    assert lm.free[0] == CAP and lm.queues.held == {0: 1}


def test_replay_command_takes_a_queueable_fraction_and_refuses_one_above_1(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["replay", "--trace", "syn:20:5", "--lms", "1", "--gms", "1", "--workers-per-partition", "4", "--no-files"]
    with pytest.raises(SystemExit) as bad:
        main([*args, "--queueable", "1.5"])
    assert bad.value.code == 2 and "--queueable" in capsys.readouterr().err
    assert main([*args, "--queueable", "0.5", "--no-constraints"]) == 0
    assert "100 tasks" in capsys.readouterr().out.replace(",", "")
    with pytest.raises(ValueError, match="queueable"):
        replay(ReplayConfig(trace="syn:20:5", scheduler="sparrow", queueable=0.5))


def test_reduced_queueable_experiment_writes_its_page(tmp_path: Path) -> None:
    argv = ["--workloads", "syn_250[:20]@2x2x10", "--fractions", "1", "--seeds", "0", "--out", str(tmp_path)]
    assert experiment.main(argv) == 0
    page = (tmp_path / "queueable.md").read_text()
    assert "| syn_250[:20]@2x2x10 | 100% | 5,000 / 5,000 |" in page
    assert (tmp_path / "queueable.png").exists() and len((tmp_path / "queueable.csv").read_text().splitlines()) == 3
