"""Cancelling a job in the core: the GM drops its queued and parked tasks at once, has its LM stop its running
ones (and those whose placement is still unanswered once the answer comes), and reports each as cancelled, never
as finished, never run again; the resources come back to the view."""

from __future__ import annotations

from dataclasses import replace

from megha.common.core.fairness.config import FairnessConfig, QueueSpec
from megha.common.core.gm import GlobalMaster
from megha.common.core.messages import Completion, Completions, LaunchBatch, NodeState, StopRequest, WorkerPreempt
from megha.common.core.observer import CoreObserver
from megha.common.core.task import TaskSpec

from corekit import CAP, Net, cluster, job, task


class Ends(CoreObserver):
    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.completed: list[str] = []
        self.failed: list[str] = []

    def task_cancelled(self, task: TaskSpec, now: float) -> None:
        self.cancelled.append(task.task_id)

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool) -> None:
        self.completed.append(task.task_id)

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None:
        self.failed.append(task.task_id)


def _net(nodes: int = 1) -> tuple[Net, Ends]:
    ends = Ends()
    net = Net.build(cluster([[[[]] * nodes]]), observer=ends)
    return net, ends


def test_queued_parked_unanswered_and_running_tasks_all_end_cancelled_and_free_their_node() -> None:
    net, ends = _net()
    gm, lm = net.gms[0], net.lms[0]
    long = [task(f"j.{k}", duration=100.0) for k in range(3)]  # each takes the whole node
    net.post(gm.submit(job("j", *long), 0.0))
    # j.0 is placed (its batch not answered yet); j.1 and j.2 fit nowhere and are parked.
    assert gm.waiting_tasks() == long[1:] and len(net.inbox) == 1
    net.post(gm.cancel(["j.0", "j.1", "j.2"], 1.0))
    assert sorted(ends.cancelled) == ["j.1", "j.2"] and not gm.waiting_tasks() and not gm.queue
    net.run()  # the batch is answered: j.0 runs, so it is stopped; the worker reports the stop
    assert sorted(ends.cancelled) == ["j.0", "j.1", "j.2"]
    assert ends.completed == [] and ends.failed == []
    assert gm.running == {} and gm.cancelled == 3 and lm.stopped == 1 and lm.running == {} and lm.preempting == {}
    assert lm.free[0] == CAP
    # The node is free in the GM's view too: another job's task is placed on it at once.
    net.post(gm.submit(job("k", task("k.0")), 2.0))
    net.run()
    assert ends.completed == ["k.0"]


def test_a_running_task_is_stopped_through_its_lm_and_not_run_again() -> None:
    net, ends = _net(nodes=2)
    gm, lm = net.gms[0], net.lms[0]
    net.post(gm.submit(job("j", task("j.0", duration=100.0), task("j.1", duration=100.0)), 0.0))
    while net.inbox:
        net.deliver()
    assert set(gm.running) == {"j.0", "j.1"}
    net.post(gm.cancel(["j.1"], 5.0))
    stop = net.take("lm/0", StopRequest)
    assert stop == StopRequest(0, 0, [("j.1", 1)])
    net.post(lm.handle(stop, 5.0))
    assert "j.1" not in lm.running and net.take("worker/0", WorkerPreempt).task_ids == ["j.1"]  # type: ignore[attr-defined]
    net.post(net.workers[0].handle(WorkerPreempt(0, ["j.1"]), 5.0))
    net.run()
    assert ends.cancelled == ["j.1"] and ends.completed == ["j.0"]
    assert gm.queue == type(gm.queue)() and gm.preempted == 0  # a stop is not a preemption: nothing requeued


def test_a_stop_for_a_run_the_lm_no_longer_holds_changes_nothing() -> None:
    net, ends = _net()
    gm, lm = net.gms[0], net.lms[0]
    net.post(gm.submit(job("j", task("j.0", duration=1.0)), 0.0))
    net.run()
    assert ends.completed == ["j.0"]
    assert lm.handle(StopRequest(0, 0, [("j.0", 1)]), 9.0) == [] and lm.stopped == 0
    assert gm.cancel(["j.0"], 9.0) == [] and gm.cancelled == 0 and ends.cancelled == []


def test_a_run_that_ended_before_the_stop_reached_it_counts_as_it_ended() -> None:
    net, ends = _net()
    gm = net.gms[0]
    net.post(gm.submit(job("j", task("j.0", duration=100.0)), 0.0))
    while net.inbox:
        net.deliver()
    net.post(gm.cancel(["j.0"], 1.0))
    net.take("lm/0", StopRequest)  # the stop is still on its way when the task ends
    state = NodeState(0, CAP, 99)
    net.post(gm.handle(Completions(0, 0, 1, [Completion("j.0", state)]), 2.0))
    assert ends.completed == ["j.0"] and ends.cancelled == [] and gm.running == {}


def test_a_run_refused_by_its_lm_while_cancelled_is_cancelled_not_queued_again() -> None:
    net, ends = _net()
    gm, lm = net.gms[0], net.lms[0]
    net.post(gm.submit(job("j", task("j.0")), 0.0))
    batch = net.take("lm/0", LaunchBatch)
    net.post(gm.cancel(["j.0"], 1.0))
    lm.free[0] = (0, 0)  # the LM has no room: an inconsistency, which would normally queue the task again
    net.post(gm.handle(lm.handle(batch, 1.0)[0].msg, 1.0))  # type: ignore[union-attr]
    assert ends.cancelled == ["j.0"] and not gm.queue and not gm.waiting_tasks() and gm.inconsistencies == 1


def test_under_fair_scheduling_queued_tasks_are_taken_out_of_their_users_queue_and_demand() -> None:
    spec = cluster([[[[]]]])
    ends = Ends()
    fairness = FairnessConfig((QueueSpec("user-0", 0.5, 0), QueueSpec("user-1", 0.5, 0)))
    gm = GlobalMaster(0, spec, observer=ends, fairness=fairness)
    other = replace(task("o.0", duration=100.0), user="user-1", job_id="o")
    gm.submit(job("o", other), 0.0)  # takes the node
    gm.submit(job("j", *(task(f"j.{k}", duration=100.0) for k in range(3))), 0.0)
    assert gm.book is not None and gm.book.demand["user-0"] == [3 * CAP[0], 3 * CAP[1]]
    gm.cancel(["j.0", "j.2"], 1.0)
    assert sorted(ends.cancelled) == ["j.0", "j.2"]
    assert [t.task_id for t in (*gm.queue, *gm.waiting_tasks())] == ["j.1"]
    assert gm.book.demand["user-0"] == list(CAP)


def test_a_launch_call_that_fails_after_its_tasks_completed_ends_them_only_once() -> None:
    """The LM launched and finished the task but its launch response was lost: the completion counts, and the
    failed call neither fails the task a second time nor lets a later cancel wait for it forever."""
    net, ends = _net()
    gm = net.gms[0]
    net.post(gm.submit(job("j", task("j.0")), 0.0))
    batch = net.take("lm/0", LaunchBatch)
    net.post(net.lms[0].handle(batch, 0.0))
    net.take("gm/0", object)  # the launch response is lost on the way
    net.run()  # the worker runs the task; its completion reaches the GM
    assert ends.completed == ["j.0"]
    net.post(gm.cancel(["j.0"], 2.0))
    net.post(gm.call_failed(0, batch.seq, "LM 0 unreachable", 3.0))
    net.run()
    assert ends.completed == ["j.0"] and ends.failed == [] and ends.cancelled == []
    assert not gm.running and not gm.ledger.cancelling and not gm.ledger.awaiting_response
