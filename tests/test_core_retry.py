"""Core recovery paths for lost workers: a lost task runs again as its next attempt, at most `max_attempts` times,
and a stale copy's report never frees resources or completes the task twice."""

from __future__ import annotations

from collections.abc import Sequence

from megha.common.core.gm import GlobalMaster
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import (
    Completion,
    Completions,
    Delta,
    FinishedTask,
    LaunchBatch,
    LaunchResponse,
    NodeState,
    Placement,
    Rejection,
    StopRequest,
    WorkerLaunch,
    WorkerReport,
)
from megha.common.core.observer import CoreObserver
from megha.common.core.task import TaskSpec
from megha.common.core.worker import SimulatedExecution

from corekit import CAP, Net, cluster, job, task


class Ends(CoreObserver):
    """What a GM reported about how tasks ended."""

    def __init__(self) -> None:
        self.lost: list[tuple[str, int, str]] = []
        self.failed: list[tuple[str, str]] = []

    def task_lost(self, task: TaskSpec, reason: str, now: float) -> None:
        self.lost.append((task.task_id, task.attempt, reason))

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None:
        self.failed.append((task.task_id, reason))


def _launch_all(net: Net) -> list[WorkerLaunch]:
    """Deliver GM -> LM launches and LM -> GM responses; return the worker launches (not delivered)."""
    launches = []
    while net.inbox:
        msg = net.inbox[0]
        if isinstance(msg.msg, WorkerLaunch):
            launches.append(net.inbox.pop(0).msg)
        else:
            net.deliver()
    return launches


def test_a_lost_task_runs_again_as_its_next_attempt_and_completes_once() -> None:
    spec = cluster([[[[], []]]])  # one LM, one GM, two nodes
    ends = Ends()
    net = Net.build(spec, observer=ends)
    gm, lm = net.gms[0], net.lms[0]
    net.post(gm.submit(job("j", task("j.0", duration=60.0)), 0.0))
    (first,) = _launch_all(net)
    (p1,) = first.launches
    assert p1.task.attempt == 1
    net.post(lm.take_down([p1.node], "worker agent w silent for 30 s", 5.0))
    (second,) = _launch_all(net)
    (p2,) = second.launches
    assert p2.task.attempt == 2 and p2.node != p1.node
    assert ends.lost == [("j.0", 1, "worker agent w silent for 30 s")] and ends.failed == []
    # The first run's worker was only cut off: its late report is a stale copy, ignored by the LM.
    assert lm.handle(WorkerReport(0, [FinishedTask("j.0", p1.node, attempt=1)]), 30.0) == []
    assert "j.0" in lm.running and lm.running["j.0"].placement.task.attempt == 2
    # So is a report naming the right attempt on the wrong node.
    assert lm.handle(WorkerReport(0, [FinishedTask("j.0", p1.node, attempt=2)]), 31.0) == []
    out = lm.handle(WorkerReport(0, [FinishedTask("j.0", p2.node, attempt=2)]), 65.0)
    (done,) = [o.msg for o in out if isinstance(o.msg, Completions)]
    assert [(c.task_id, c.lost, c.error) for c in done.items] == [("j.0", False, "")]
    gm.handle(done, 65.0)
    assert gm.running == {} and gm.retries == 1
    lm.bring_up([p1.node], 70.0)
    assert lm.is_idle()


def test_a_task_lost_max_attempts_times_fails_with_the_reason() -> None:
    spec = cluster([[[[], [], []]]])
    ends = Ends()
    net = Net.build(spec, observer=ends, max_attempts=2)
    gm, lm = net.gms[0], net.lms[0]
    net.post(gm.submit(job("j", task("j.0", duration=60.0)), 0.0))
    for attempt in (1, 2):
        (launch,) = _launch_all(net)
        assert launch.launches[0].task.attempt == attempt
        net.post(lm.take_down([launch.launches[0].node], f"agent {attempt} gone", float(attempt)))
    assert _launch_all(net) == []  # not placed a third time
    assert [(t, a) for t, a, _ in ends.lost] == [("j.0", 1)]
    assert ends.failed == [("j.0", "agent 2 gone (attempt 2 of MEGHA_MAX_ATTEMPTS=2)")]
    assert gm.running == {} and not gm.queue and not gm.waiting


def test_a_loss_reported_before_the_launch_response_still_runs_the_task_again_once() -> None:
    spec = cluster([[[[], []]]])
    gm = GlobalMaster(0, spec)
    lm = LocalMaster.in_cluster(spec, 0)
    (batch,) = [o.msg for o in gm.submit(job("j", task("j.0", duration=60.0)), 0.0)]
    assert isinstance(batch, LaunchBatch)
    response, *_ = [o.msg for o in lm.handle(batch, 0.1)]
    assert isinstance(response, LaunchResponse)
    node = batch.placements[0].node
    (lost,) = [o.msg for o in lm.take_down([node], "gone", 0.2) if isinstance(o.msg, Completions)]
    relaunch = [o.msg for o in gm.handle(lost, 0.3)]  # the loss overtakes the launch response
    assert [(p.task.task_id, p.task.attempt) for b in relaunch for p in b.placements] == [("j.0", 2)]
    gm.handle(response, 0.4)  # the late response must not make attempt 1 count as running
    assert "j.0" not in gm.running
    out = lm.handle(relaunch[0], 0.5)
    (resp2,) = [o.msg for o in out if isinstance(o.msg, LaunchResponse)]
    gm.handle(resp2, 0.6)
    assert gm.running["j.0"].task.attempt == 2 and gm.running["j.0"].node != node


def test_a_launch_retried_after_its_run_ended_is_accepted_but_not_run_again() -> None:
    # The GM's launch reached the LM, the run started and ended, but the answer was lost: the GM's retry of the
    # same batch must not run the task a second time.
    spec = cluster([[[[], []]]])
    lm = LocalMaster(0, spec.partitions[0], ended_runs_kept=10)
    gm = GlobalMaster(0, spec)
    (batch,) = [o.msg for o in gm.submit(job("j", task("j.0", duration=1.0)), 0.0)]
    first = lm.handle(batch, 0.1)
    assert [type(o.msg).__name__ for o in first] == ["LaunchResponse", "WorkerLaunch"]
    node = batch.placements[0].node
    lm.handle(WorkerReport(0, [FinishedTask("j.0", node, attempt=1)]), 1.2)
    again = lm.handle(batch, 1.3)
    (response,) = [o.msg for o in again if isinstance(o.msg, LaunchResponse)]
    assert [p.task.task_id for p in response.accepted] == ["j.0"] and response.rejected == []
    assert not [o for o in again if isinstance(o.msg, WorkerLaunch)] and lm.is_idle()


def test_a_run_that_ended_before_its_batch_was_refused_is_not_placed_again() -> None:
    """An LM launched a batch and was killed before it answered; its successor forwarded the run's end, then
    refused the batch the GM sent again (its node looked busy: an inconsistency). The end came first, so the task
    ended: the refusal must not queue it again (found by `megha chaos`, lm-kill: the task ran and finished twice)."""
    spec = cluster([[[[], []]]])
    lives = Lives()
    gm = GlobalMaster(0, spec, observer=lives)
    lm = LocalMaster.in_cluster(spec, 0)
    (batch,) = [o.msg for o in gm.submit(job("j", task("j.0", duration=1.0)), 0.0)]
    (placement,) = batch.placements
    lm.handle(batch, 0.1)  # launched; its answer never reaches the GM (the LM is killed)
    state = NodeState(placement.node, CAP, 7)
    end = Completions(0, 0, 0, [Completion("j.0", state, forwarded=True, finished_at=1.1)])
    gm.handle(end, 5.0)  # the restarted LM forwards the worker's report of the end
    assert lives.completed == [("j.0", 1)]
    refusal = Rejection(placement, "node 0 lacks the free resources", inconsistency=True)
    answer = LaunchResponse(0, 0, batch.seq, [], [refusal], [state], Delta(0, 0, 0))
    again = gm.handle(answer, 6.0)
    assert [p for o in again if isinstance(o.msg, LaunchBatch) for p in o.msg.placements] == []
    assert lives.placed == [("j.0", 1)] and lives.completed == [("j.0", 1)] and lives.failed == []
    assert not gm.queue and gm.inconsistencies == 0


class Lives(Ends):
    """Also what a GM decided, completed and cancelled, per task: (task id, attempt)."""

    def __init__(self) -> None:
        super().__init__()
        self.placed: list[tuple[str, int]] = []
        self.completed: list[tuple[str, int]] = []
        self.cancelled: list[str] = []

    def decided(self, placements: Sequence[Placement], now: float) -> None:
        self.placed += [(p.task.task_id, p.task.attempt) for p in placements]

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool) -> None:
        self.completed.append((task.task_id, task.attempt))

    def task_cancelled(self, task: TaskSpec, now: float) -> None:
        self.cancelled.append(task.task_id)


def _first_attempt_lost_before_its_answer(
    ends: CoreObserver | None = None,
) -> tuple[GlobalMaster, LocalMaster, LaunchResponse, Completions]:
    """One GM and one LM of two nodes: task j.0's first launch is answered (the answer not yet delivered) and its
    worker then lost; the loss (not yet delivered) is returned with the answer."""
    spec = cluster([[[[], []]]])
    gm = GlobalMaster(0, spec, observer=ends)
    lm = LocalMaster.in_cluster(spec, 0)
    (batch,) = [o.msg for o in gm.submit(job("j", task("j.0", duration=60.0)), 0.0)]
    (response,) = [o.msg for o in lm.handle(batch, 0.1) if isinstance(o.msg, LaunchResponse)]
    (lost,) = [o.msg for o in lm.take_down([batch.placements[0].node], "gone", 0.2) if isinstance(o.msg, Completions)]
    return gm, lm, response, lost


def test_a_late_answer_for_a_lost_attempt_does_not_take_the_place_of_the_next_attempt() -> None:
    """The loss overtakes attempt 1's launch answer, and attempt 2's answer overtakes attempt 1's too: the GM
    holds attempt 2 as running, so attempt 2's end ends the task (it used to hold attempt 1 for ever)."""
    ends = Lives()
    gm, lm, response1, lost = _first_attempt_lost_before_its_answer(ends)
    (batch2,) = [o.msg for o in gm.handle(lost, 0.3)]
    (response2,) = [o.msg for o in lm.handle(batch2, 0.4) if isinstance(o.msg, LaunchResponse)]
    gm.handle(response2, 0.5)
    gm.handle(response1, 0.6)
    assert {t: p.task.attempt for t, p in gm.running.items()} == {"j.0": 2}
    node2 = batch2.placements[0].node
    (done,) = [o.msg for o in lm.handle(WorkerReport(0, [FinishedTask("j.0", node2, attempt=2)]), 60.5)]
    gm.handle(done, 60.6)
    assert ends.completed == [("j.0", 2)] and gm.running == {} and not gm.ledger.awaiting_response


def test_the_next_attempts_end_arriving_before_every_launch_answer_ends_the_task_once() -> None:
    """Attempt 2 runs and ends before the GM hears either launch answer: its end counts (it used to be taken
    for a repeat, and attempt 2's answer then left the task running for ever)."""
    ends = Lives()
    gm, lm, response1, lost = _first_attempt_lost_before_its_answer(ends)
    (batch2,) = [o.msg for o in gm.handle(lost, 0.3)]
    (response2,) = [o.msg for o in lm.handle(batch2, 0.4) if isinstance(o.msg, LaunchResponse)]
    node2 = batch2.placements[0].node
    (done,) = [o.msg for o in lm.handle(WorkerReport(0, [FinishedTask("j.0", node2, attempt=2)]), 60.5)]
    gm.handle(done, 60.6)
    gm.handle(response1, 60.7)
    gm.handle(response2, 60.8)
    assert ends.completed == [("j.0", 2)] and ends.failed == [] and gm.running == {}
    assert not gm.ledger.awaiting_response and not gm.ledger.finished_early


def test_a_repeated_loss_report_before_the_launch_answer_runs_the_task_again_only_once() -> None:
    """A broker may deliver the LM's report of the loss twice: the copy is a repeat, not a second loss."""
    ends = Lives()
    gm, _, response1, lost = _first_attempt_lost_before_its_answer(ends)
    assert [(p.task.task_id, p.task.attempt) for o in gm.handle(lost, 0.3) for p in o.msg.placements] == [("j.0", 2)]  # type: ignore[attr-defined]
    assert gm.handle(lost, 0.4) == [] and not gm.queue and not gm.waiting
    gm.handle(response1, 0.5)
    assert ends.placed == [("j.0", 1), ("j.0", 2)] and gm.retries == 1 and "j.0" not in gm.running


def test_a_repeated_loss_report_of_a_cancelled_task_does_not_run_it_again() -> None:
    """Cancelled while its launch awaits its answer, then its worker lost: the loss ends it cancelled, and a
    repeat of the loss must neither place it again nor leave it cancelling."""
    ends = Lives()
    gm, _, response1, lost = _first_attempt_lost_before_its_answer(ends)
    assert gm.cancel(["j.0"], 0.25) == [] and gm.ledger.cancelling == {"j.0"}
    assert gm.handle(lost, 0.3) == [] and ends.cancelled == ["j.0"]
    assert gm.handle(lost, 0.4) == [] and gm.handle(response1, 0.5) == []
    assert ends.placed == [("j.0", 1)] and ends.cancelled == ["j.0"] and ends.lost == []
    assert gm.running == {} and not gm.ledger.cancelling and not gm.ledger.awaiting_response and not gm.queue


def test_a_stale_report_from_another_lm_of_the_same_attempt_is_ignored() -> None:
    """A preempted task runs again under the same attempt number, maybe at another LM: a repeated report of the
    preempted run, forwarded by its first LM, must not stop the run at the second."""
    spec = cluster([[[[]]], [[[]]]])  # two LMs of one node each
    ends = Lives()
    gm = GlobalMaster(0, spec, observer=ends)
    (batch,) = [o.msg for o in gm.submit(job("j", task("j.0", duration=60.0)), 0.0)]
    lm = batch.placements[0].lm
    gm.handle(LaunchResponse(0, lm, batch.seq, batch.placements, [], [], Delta(lm, 0, batch.seq)), 0.1)
    stale = Completions(1 - lm, 0, 0, [Completion("j.0", NodeState(0, CAP, 1), preempted=True, forwarded=True)])
    assert gm.handle(stale, 0.2) == [] and gm.preempted == 0 and "j.0" in gm.running
    assert ends.placed == [("j.0", 1)]


def test_a_task_cancelled_while_its_next_attempt_launches_ends_cancelled_whatever_answer_comes_first() -> None:
    """Attempt 1 lost before its answer, attempt 2 launched, the job cancelled, and attempt 2's answer first: the
    GM stops attempt 2 and ends the task cancelled. (It used to take attempt 1's early end for attempt 2's: the
    cancel then stopped nothing and attempt 2 ran to its end; cancelled a moment later, the task stayed cancelling
    for ever, the GM holding attempt 1 as running.)"""
    ends = Lives()
    gm, lm, response1, lost = _first_attempt_lost_before_its_answer(ends)
    (batch2,) = [o.msg for o in gm.handle(lost, 0.3)]
    lm_out = lm.handle(batch2, 0.4)
    (response2,) = [o.msg for o in lm_out if isinstance(o.msg, LaunchResponse)]
    assert gm.cancel(["j.0"], 0.5) == [] and gm.ledger.cancelling == {"j.0"}
    (stop,) = [o.msg for o in gm.handle(response2, 0.6)]
    assert stop == StopRequest(0, 0, [("j.0", 2)])
    assert gm.handle(response1, 0.7) == []
    worker = SimulatedExecution(0)
    worker.handle(next(o.msg for o in lm_out if isinstance(o.msg, WorkerLaunch)), 0.4)
    (preempt,) = [o.msg for o in lm.handle(stop, 0.8)]
    (report,) = [o.msg for o in worker.handle(preempt, 0.9)]
    (stopped,) = [o.msg for o in lm.handle(report, 1.0) if isinstance(o.msg, Completions)]
    gm.handle(stopped, 1.1)
    assert ends.cancelled == ["j.0"] and ends.completed == [] and ends.failed == []
    assert gm.running == {} and not gm.ledger.cancelling and not gm.ledger.awaiting_response and lm.running == {}
