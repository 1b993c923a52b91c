"""Core recovery paths for lost workers: a lost task runs again as its next attempt, at most `max_attempts` times,
and a stale copy's report never frees resources or completes the task twice."""

from __future__ import annotations

from megha.common.core.gm import GlobalMaster
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import (
    Completions,
    FinishedTask,
    LaunchBatch,
    LaunchResponse,
    WorkerLaunch,
    WorkerReport,
)
from megha.common.core.observer import CoreObserver
from megha.common.core.task import TaskSpec

from corekit import Net, cluster, job, task


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
