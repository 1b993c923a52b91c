"""A GM and an LM it cannot reach (docs/reliability.md, "An LM that cannot be reached"): the LM is out of the GM's
view until it answers (`lm_unreachable`, `lm_reachable`), a launch that never reached it is placed again
(`call_failed(..., reached=False)`), and its runs are given up after MEGHA_LM_LOST_AFTER (`lm_lost`): they run
again elsewhere as their next attempt, and are stopped there if the LM comes back."""

from __future__ import annotations

from test_core_cancel import Ends

from megha.common.core.global_view import GlobalView
from megha.common.core.messages import LaunchBatch, LaunchResponse, NodeState, StopRequest
from megha.common.core.task import TaskSpec

from corekit import CAP, Net, cluster, job, task


class Lost(Ends):
    def __init__(self) -> None:
        super().__init__()
        self.lost: list[tuple[str, str]] = []

    def task_lost(self, task: TaskSpec, reason: str, now: float) -> None:
        self.lost.append((task.task_id, reason))


def _two_lms() -> tuple[Net, Lost]:
    """One GM; LMs 0 and 1 of one node each (a task of CAP takes a whole node)."""
    ends = Lost()
    return Net.build(cluster([[[[]]], [[[]]]]), observer=ends), ends


def test_an_unreachable_lm_gets_no_placement_until_it_answers() -> None:
    net, ends = _two_lms()
    gm = net.gms[0]
    gm.lm_unreachable(0)
    net.post(gm.submit(job("j", task("j.0", duration=5.0), task("j.1", duration=5.0)), 0.0))
    [batch] = [m.msg for m in net.inbox]
    assert isinstance(batch, LaunchBatch) and batch.lm == 1  # LM 0's free node is out of the view
    assert [t.task_id for t in gm.waiting_tasks()] == ["j.1"]
    net.post(gm.lm_reachable(0, 1.0))  # it answers again: the waiting task goes there
    assert [(m.dest, [p.task.task_id for p in m.msg.placements]) for m in net.inbox[1:]] == [("lm/0", ["j.1"])]
    net.run()
    assert sorted(ends.completed) == ["j.0", "j.1"] and ends.failed == []


def test_what_an_lm_reported_while_out_of_the_view_counts_once_it_is_back() -> None:
    spec = cluster([[[[], []]], [[[]]]])
    view = GlobalView(spec)
    view.take_out(0)
    assert view.views[0][0].free == [(0, 0), (0, 0)] and view.views[1][0].free == [CAP]
    assert not view.views[0][0].fitting((1, 1))
    view.hold_states(0, [NodeState(0, (1000, 2000), 7)], 0)  # a report of node 0 while out
    view.sync()
    assert view.views[0][0].free == [(0, 0), (0, 0)]
    view.deduct(0, 1, (500, 500))  # a gang's deduction, then its undo, while out: they apply to what is kept aside
    view.undo(0, 1, (100, 100))
    view.take_in(0)
    assert view.views[0][0].free == [CAP, (CAP[0] - 400, CAP[1] - 400)]
    assert view.take_freed() == [(0, 0), (0, 1)]  # parked tasks may fit there again
    view.sync()  # the report held while out is adopted now
    assert view.views[0][0].free == [(1000, 2000), (CAP[0] - 400, CAP[1] - 400)]
    assert view.views[0][0].fitting((1000, 2000)) == 0b11


def test_a_launch_that_never_reached_its_lm_is_placed_again_elsewhere_not_failed() -> None:
    net, ends = _two_lms()
    gm = net.gms[0]
    net.post(gm.submit(job("j", task("j.0")), 0.0))
    batch = net.take("lm/0", LaunchBatch)
    gm.lm_unreachable(0)
    net.post(gm.call_failed(0, batch.seq, "LM 0 unreachable: connection refused", 3.0, reached=False))
    again = net.take("lm/1", LaunchBatch)
    assert [(p.task.task_id, p.task.attempt) for p in again.placements] == [("j.0", 1)]  # the same attempt
    net.post(net.lms[1].handle(again, 3.0))
    net.run()
    assert ends.completed == ["j.0"] and ends.failed == [] and ends.lost == []
    assert not gm.ledger.unanswered_batches[0] and not gm.ledger.awaiting_response


def test_the_runs_of_an_lm_given_up_run_again_elsewhere_and_are_stopped_when_it_comes_back() -> None:
    net, ends = _two_lms()
    gm, lm0 = net.gms[0], net.lms[0]
    net.post(gm.submit(job("j", task("j.0", duration=10.0)), 0.0))
    net.deliver()  # the batch reaches LM 0, which launches j.0 on its worker
    net.post(gm.handle(net.take("gm/0", LaunchResponse), 0.1))  # and the GM learns it runs
    assert "j.0" in gm.running
    gm.lm_unreachable(0)  # LM 0 stops answering; its worker's messages wait in the inbox
    net.post(gm.lm_lost(0, "LM 0 unreachable for 300 s", 300.0))
    assert ends.lost == [("j.0", "LM 0 unreachable for 300 s")]
    rerun = net.take("lm/1", LaunchBatch)
    assert [(p.task.task_id, p.task.attempt) for p in rerun.placements] == [("j.0", 2)]
    net.post(net.lms[1].handle(rerun, 300.0))
    net.post(gm.lm_reachable(0, 301.0))  # it comes back: the run given up is stopped there
    stop = net.take("lm/0", StopRequest)
    assert stop.runs == [("j.0", 1)]
    net.post(lm0.handle(stop, 301.0))
    ignored = gm.ignored_run_ends
    net.run()  # the stopped run's end reaches the GM, and so does the second attempt's
    assert ends.completed == ["j.0"] and ends.failed == [] and gm.ignored_run_ends == ignored + 1
    assert lm0.running == {} and lm0.free[0] == CAP and not gm.running
