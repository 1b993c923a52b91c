"""The LM core as plan applier: validation, repartition carving and return, inconsistencies, deltas,
rescheduling, and the race of two GMs for the last fitting node."""

from __future__ import annotations

import pytest

from megha.common.core.lm import LocalMaster
from megha.common.core.messages import (
    Completions,
    Delta,
    DeltaTick,
    FinishedTask,
    LaunchBatch,
    LaunchResponse,
    Placement,
    Wake,
    WorkerLaunch,
    WorkerReport,
)

from corekit import CAP, Net, cluster, job, task

HALF = (CAP[0] // 2, CAP[1] // 4)


def test_repartition_carves_exactly_the_request_into_a_logical_node_and_returns_it() -> None:
    spec = cluster([[[[]], [[]]]])  # one LM; node 0 is GM 0's, node 1 is GM 1's
    lm = LocalMaster.in_cluster(spec, 0)
    t = task("j.0", request=HALF)
    out = lm.handle(LaunchBatch(gm=1, lm=0, seq=1, placements=[Placement(t, 0, 0, True)]), 0.0)
    resp = out[0].msg
    assert isinstance(resp, LaunchResponse) and [p.task.task_id for p in resp.accepted] == ["j.0"]
    assert lm.free[0] == (CAP[0] - HALF[0], CAP[1] - HALF[1])
    (logical,) = lm.logical_nodes.values()
    assert (logical.node, logical.gm, logical.resources, logical.task_id) == (0, 1, HALF, "j.0")
    assert isinstance(out[1].msg, WorkerLaunch)
    lm.handle(WorkerReport(0, [FinishedTask("j.0", 0)]), 1.0)
    assert lm.logical_nodes == {} and lm.free[0] == CAP and lm.is_idle()


def test_lm_never_overcommits_and_counts_the_inconsistency() -> None:
    spec = cluster([[[[]]]])
    lm = LocalMaster.in_cluster(spec, 0)
    a, b, c = task("a.0", request=HALF), task("b.0", request=HALF), task("c.0", request=HALF)
    resp = lm.handle(LaunchBatch(0, 0, 1, [Placement(a, 0, 0, False), Placement(b, 0, 0, False)]), 0.0)[0].msg
    assert len(resp.accepted) == 2 and lm.free[0] == (0, CAP[1] - 2 * HALF[1])
    resp = lm.handle(LaunchBatch(0, 0, 2, [Placement(c, 0, 0, False)]), 0.0)[0].msg
    (rejection,) = resp.rejected
    assert rejection.inconsistency and "cpu_millicores=0" in rejection.reason
    assert resp.states[0].free == lm.free[0]
    assert lm.inconsistencies == 1


def test_malformed_placements_are_rejected_but_are_not_inconsistencies() -> None:
    spec = cluster([[[[1]], [[]]]])
    lm = LocalMaster.in_cluster(spec, 0)
    bad = [
        Placement(task("a.0", [2]), 0, 0, False),  # node lacks constraint 2
        Placement(task("b.0"), 0, 1, False),  # node 1 is GM 1's: must be a repartition
        Placement(task("c.0"), 0, 9, False),  # no such node
    ]
    resp = lm.handle(LaunchBatch(0, 0, 1, bad), 0.0)[0].msg
    reasons = [r.reason for r in resp.rejected]
    assert not any(r.inconsistency for r in resp.rejected) and lm.inconsistencies == 0
    assert "lacks placement constraints [2]" in reasons[0]
    assert "repartition flag" in reasons[1]
    assert "has no node 9" in reasons[2]
    assert lm.is_idle()


@pytest.mark.parametrize(
    ("interval", "offset", "now", "due"),
    [(1.0, 0.0, 0.25, 1.0), (1.0, 0.95, 0.25, 0.95), (1.0, 0.95, 0.95, 1.95), (10.0, 0.95, 1.0, 10.95)],
)
def test_a_change_arms_the_next_delta_at_the_offset_past_a_multiple_of_the_interval(
    interval: float, offset: float, now: float, due: float
) -> None:
    spec = cluster([[[[]], [[]]]])
    lm = LocalMaster(0, spec.partitions[0], delta_interval=interval, delta_offset=offset)
    out = lm.handle(LaunchBatch(0, 0, 1, [Placement(task("a.0", request=HALF), 0, 0, False)]), now)
    (timer,) = [o for o in out if isinstance(o, Wake)]
    assert timer.at == pytest.approx(due)


@pytest.mark.parametrize("offset", [-0.1, 1.0, 2.5])
def test_an_offset_outside_the_interval_is_refused(offset: float) -> None:
    with pytest.raises(ValueError, match="delta_offset must be at least 0 and less than delta_interval"):
        LocalMaster(0, cluster([[[[]]]]).partitions[0], delta_interval=1.0, delta_offset=offset)


def test_repeated_launch_of_a_running_task_is_idempotent() -> None:
    spec = cluster([[[[]]]])
    lm = LocalMaster.in_cluster(spec, 0)
    p = Placement(task("a.0", request=HALF), 0, 0, False)
    lm.handle(LaunchBatch(0, 0, 1, [p]), 0.0)
    out = lm.handle(LaunchBatch(0, 0, 1, [p]), 0.0)
    assert len(out) == 1 and out[0].msg.accepted == [p]  # accepted again, not launched twice
    assert lm.free[0] == (CAP[0] - HALF[0], CAP[1] - HALF[1])


def test_deltas_carry_only_changes_by_other_gms_and_own_completions_come_by_message() -> None:
    spec = cluster([[[[]], [[]]]])
    lm = LocalMaster.in_cluster(spec, 0)
    t = task("a.0", request=HALF)
    out = lm.handle(LaunchBatch(0, 0, 1, [Placement(t, 0, 0, False)]), 0.25)
    resp = out[0].msg
    assert resp.delta.nodes == []  # GM 0 made this change itself
    (timer,) = [o for o in out if isinstance(o, Wake)]
    assert isinstance(timer.msg, DeltaTick) and timer.at == 1.0  # the change arms the next periodic delta
    deltas = {s.msg.gm: s.msg for s in lm.handle(DeltaTick(), 1.0) if isinstance(s.msg, Delta)}
    assert set(deltas) == {1}
    assert [(n.node, n.free) for n in deltas[1].nodes] == [(0, lm.free[0])]
    assert lm.handle(DeltaTick(), 2.0) == []  # nothing changed since: no delta at all
    out = lm.handle(WorkerReport(0, [FinishedTask("a.0", 0)]), 3.0)
    (completions,) = (s.msg for s in out if not isinstance(s, Wake))
    assert isinstance(completions, Completions) and completions.gm == 0
    assert [(c.task_id, c.state.free) for c in completions.items] == [("a.0", CAP)]
    deltas = {s.msg.gm: s.msg for s in lm.handle(DeltaTick(), 4.0) if isinstance(s.msg, Delta)}
    assert set(deltas) == {1} and deltas[1].nodes[0].free == CAP


def test_two_gms_race_for_the_last_fitting_node_exactly_one_wins_the_other_waits_then_runs() -> None:
    # Node 0 (GM 0's) and node 1 (GM 1's) both have constraint 5; node 2 (GM 1's) has it too but GM 1's view is
    # made stale so that both GMs pick node 0 first.
    spec = cluster([[[[5]], [[5], [5]]]])
    net = Net.build(spec)
    gm0, gm1 = net.gms
    net.post(gm0.submit(job("a", task("a.0", [5])), 0.0))
    # GM 1 believes its own nodes are busy (stale view), so it repartitions onto node 0.
    for i in (0, 1):
        gm1.views[0][1].set_free(i, (0, 0))
    net.post(gm1.submit(job("b", task("b.0", [5])), 0.0))
    b0 = net.inbox[0].msg.placements[0]
    b1 = net.inbox[1].msg.placements[0]
    assert (b0.node, b0.repartition) == (0, False) and (b1.node, b1.repartition) == (0, True)
    net.deliver(0)  # GM 0's launch reaches the LM first and wins
    net.deliver(0)  # GM 1's launch is rejected with the LM's state
    resp = net.take("gm/1", LaunchResponse)
    assert resp.accepted == [] and resp.rejected[0].inconsistency
    net.post(gm1.handle(resp, 0.001))  # GM 1 learns node 0 is full; its view of nodes 1-2 is still stale
    assert gm1.inconsistencies == 1 and [t.task_id for t in gm1.waiting_tasks()] == ["b.0"]
    net.run()
    # Completions and deltas eventually free GM 1's view, and b.0 runs exactly once.
    assert net.lms[0].inconsistencies == 1
    net.post(net.lms[0].handle(DeltaTick(), 5.0))
    net.run()
    assert net.lms[0].is_idle() and not gm1.waiting and not gm1.running
    assert net.lms[0].launched == 2  # both tasks ran, each once


def test_loser_of_a_race_with_another_free_node_is_placed_there_at_once() -> None:
    spec = cluster([[[[5]], [[]]], [[[5]], [[]]]])  # constraint 5 on GM 0's node of each LM
    net = Net.build(spec)
    gm0, gm1 = net.gms
    net.post(gm0.submit(job("a", task("a.0", [5])), 0.0))  # GM 0 takes LM 0's node 0
    first = net.inbox[0].msg.placements[0]
    assert (first.lm, first.node) == (0, 0)
    net.post(gm1.submit(job("b", task("b.0", [5])), 0.0))  # GM 1 also aims at LM 0, node 0
    assert net.inbox[1].msg.placements[0].lm == 0
    net.deliver(0)
    net.deliver(0)  # rejected
    net.deliver(net.inbox.index(next(m for m in net.inbox if m.dest == "gm/1")))
    retry = next(m.msg for m in net.inbox if isinstance(m.msg, LaunchBatch) and m.msg.gm == 1)
    assert (retry.lm, retry.placements[0].node, retry.placements[0].repartition) == (1, 0, True)
    net.run()
    assert all(lm.is_idle() for lm in net.lms) and gm1.inconsistencies == 1


def test_task_that_fits_nowhere_waits_and_is_rescheduled_when_resources_free() -> None:
    spec = cluster([[[[]]]])
    net = Net.build(spec)
    gm = net.gms[0]
    net.post(gm.submit(job("a", task("a.0", duration=2.0), task("a.1", duration=1.0)), 0.0))
    assert [t.task_id for t in gm.waiting_tasks()] == ["a.1"] and gm.reschedules == 1
    net.run()  # a.0 finishes; its completion frees the node; a.1 is retried and runs
    assert not gm.waiting and net.lms[0].launched == 2 and net.lms[0].is_idle()


def test_a_batch_that_gets_no_answer_runs_its_tasks_again_then_fails_them_with_the_reason() -> None:
    """The LM may have launched a batch it never answered: its tasks are lost runs, run again as their next
    attempt, and fail with the reason once MEGHA_MAX_ATTEMPTS attempts got no answer; nothing of them stays."""
    from megha.loadgen.recorder import Recorder

    spec = cluster([[[[], []]]])
    rec = Recorder()
    net = Net.build(spec, observer=rec, max_attempts=2)
    gm = net.gms[0]
    j = job("j", task("j.0"), task("j.1"))
    rec.expect(0, j)
    net.post(gm.submit(j, 0.0))
    batch = net.take("lm/0", LaunchBatch)
    assert gm.ledger.unanswered_batches[0] and gm.view._unanswered_requests[0]
    net.post(gm.call_failed(0, batch.seq, "LM 0 unreachable", 0.1))
    again = net.take("lm/0", LaunchBatch)  # placed again at once, as their second attempts
    assert [(p.task.task_id, p.task.attempt) for p in again.placements] == [("j.0", 2), ("j.1", 2)]
    assert [rec.tasks[t].failed_reason for t in ("j.0", "j.1")] == ["", ""] and gm.retries == 2
    gm.call_failed(0, again.seq, "LM 0 unreachable", 0.2)
    assert not gm.ledger.unanswered_batches[0] and not gm.view._unanswered_requests[0]
    assert not gm.ledger.awaiting_response and not net.inbox
    reason = "LM 0 unreachable (attempt 2 of MEGHA_MAX_ATTEMPTS=2)"
    assert [rec.tasks[t].failed_reason for t in ("j.0", "j.1")] == [reason] * 2
    # Their requests are back in the view (the LM's next report of those nodes would say if they ran).
    assert gm.views[0][0].free == [CAP, CAP]


def test_a_node_taken_down_reports_its_tasks_lost_to_their_gm_and_takes_no_launch_until_it_is_back() -> None:
    spec = cluster([[[[], []]]])  # one LM, one GM, nodes 0 and 1
    lm = LocalMaster.in_cluster(spec, 0)
    a, b, c = task("a.0", duration=60.0), task("b.0", duration=60.0), task("c.0")
    resp = lm.handle(LaunchBatch(0, 0, 1, [Placement(a, 0, 0, False), Placement(b, 0, 1, False)]), 0.0)[0].msg
    assert len(resp.accepted) == 2
    out = lm.take_down([0], "worker agent w0 silent for 30 s", 1.0)
    (completions,) = [o.msg for o in out if isinstance(o.msg, Completions)]
    assert [(i.task_id, i.error, i.lost) for i in completions.items] == [
        ("a.0", "worker agent w0 silent for 30 s", True)
    ]
    assert lm.free[0] == (0, 0) and set(lm.running) == {"b.0"} and lm.down == {0: "worker agent w0 silent for 30 s"}
    assert lm.take_down([0], "again", 1.5) == []  # already down: nothing more to fail
    # A GM whose view predates the failure is told the node is out of service, with its state, and places again.
    resp = lm.handle(LaunchBatch(0, 0, 2, [Placement(c, 0, 0, False)]), 2.0)[0].msg
    (rejection,) = resp.rejected
    assert rejection.inconsistency and "out of service: worker agent w0 silent" in rejection.reason
    assert resp.states[0].free == (0, 0)
    # Every GM learns of it by delta, this one on the response (the change was no GM's own).
    assert [(s.node, s.free) for s in resp.delta.nodes] == [(0, (0, 0))]
    lm.bring_up([0], 4.0)
    assert lm.free[0] == CAP and not lm.down
    resp = lm.handle(LaunchBatch(0, 0, 3, [Placement(c, 0, 0, False)]), 5.0)[0].msg
    assert [p.task.task_id for p in resp.accepted] == ["c.0"]
    # The lost run's worker, if it ever reports, is ignored: its GM runs the task again as attempt 2.
    assert [
        o for o in lm.handle(WorkerReport(0, [FinishedTask("a.0", 0)]), 6.0) if isinstance(o.msg, Completions)
    ] == []
    lm.handle(WorkerReport(0, [FinishedTask("b.0", 1), FinishedTask("c.0", 0)]), 7.0)
    assert lm.is_idle()


def test_in_simulation_a_failed_node_loses_only_its_tasks_and_every_other_task_completes() -> None:
    from megha.loadgen.recorder import Recorder

    spec = cluster([[[[], []]], [[[], []]]])  # two LMs of two nodes, one GM
    recorder = Recorder()
    net = Net.build(spec, observer=recorder)
    for part in (*net.lms, *net.workers):
        part.observer = recorder
    work = job("j", *(task(f"j.{i}", duration=10.0) for i in range(6)))
    recorder.expect(0, work)
    net.post(net.gms[0].submit(work, 0.0))
    while net.inbox:  # launches reach the LMs and their workers; the first four tasks start
        net.deliver()
    on_node0 = [t for t in recorder.tasks.values() if t.lm == 0 and t.node == 0]
    assert len(on_node0) == 1
    net.workers[0].crash({0})
    net.post(net.lms[0].take_down([0], "agent gone", 1.0))
    net.run()
    for lm in net.lms:  # deltas show the GM the nodes the first tasks freed
        net.post(lm.handle(DeltaTick(), 100.0))
    net.run()
    # The lost task ran again elsewhere (attempt 2) and every task completed exactly once; none failed.
    assert not [t for t in recorder.tasks.values() if t.failed_reason]
    assert all(t.completions == 1 for t in recorder.tasks.values()) and len(recorder.tasks) == 6
    again = recorder.tasks[on_node0[0].task_id]
    assert (again.lm, again.node) != (0, 0) and again.started_at >= 10.0 and net.gms[0].retries == 1
    assert all(t.node != 0 or t.lm != 0 for t in recorder.tasks.values() if t.started_at > 1.0)  # not on the dead node
