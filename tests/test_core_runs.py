"""Runs of one attempt told apart (`TaskSpec.run_number`): a preempted task runs again as the same attempt and its
next run, so a copy of an earlier run's end, replayed while it runs again on the same LM, is ignored at the LM and
at the GM (docs/security.md, "An LM's messages to the GMs"); a recovering GM queues its tasks as runs no earlier
term used."""

from __future__ import annotations

from dataclasses import replace

from megha.common.core.gm import GlobalMaster
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import (
    Completion,
    Completions,
    Delta,
    FinishedTask,
    PreemptRequest,
    WorkerLaunch,
    WorkerReport,
)
from megha.common.core.observer import CoreObserver
from megha.common.core.policies import gm_policies
from megha.common.core.recovery import LMReport, first_run_number, plan_recovery
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.core.worker import SimulatedExecution

from corekit import CAP, Net, cluster, task

LOW, HIGH = 0, 1000


class Ends(CoreObserver):
    """How the GM said its tasks ended, and which it preempted."""

    def __init__(self) -> None:
        self.completed: list[str] = []
        self.preempted: list[str] = []
        self.repeated: list[tuple[int, str, int]] = []  # forwarded ends the GM had applied already

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool = False) -> None:
        self.completed.append(task.task_id)

    def task_preempted(self, task: TaskSpec, now: float) -> None:
        self.preempted.append(task.task_id)

    def forwarded_end_repeated(self, lm: int, item: Completion, now: float) -> None:
        self.repeated.append((lm, item.task_id, item.attempt))


def _net(ends: Ends) -> Net:
    """One GM with priority classes, one LM of one node."""
    spec = cluster([[[[]]]])
    gm = GlobalMaster(0, spec, observer=ends, policies=gm_policies(0, spec, priority_classes=True))
    return Net([gm], [LocalMaster.in_cluster(spec, 0, priority_classes=True)], [SimulatedExecution(0)])


def _deliver_until(net: Net, kind: type, copy: list[Completions]) -> None:
    """Deliver messages (firing timers when none is pending) until one of `kind` has been delivered; keep a copy
    of every Completions delivered."""
    while True:
        if not net.inbox:
            net.timers.sort(key=lambda w: w.at)
            wake = net.timers.pop(0)
            net.now = max(net.now, wake.at)
            net.post(net.endpoint(wake.dest).handle(wake.msg, net.now))
            continue
        sent = net.deliver()
        if isinstance(sent.msg, Completions):
            copy.append(sent.msg)
        if isinstance(sent.msg, kind):
            return


def test_a_replayed_preempted_completion_of_an_earlier_run_does_not_end_the_run_again() -> None:
    ends = Ends()
    net = _net(ends)
    gm, lm = net.gms[0], net.lms[0]
    low = TaskSpec("low.0", "low", "user-0", 100.0, CAP, 0, priority=LOW)
    high = TaskSpec("high.0", "high", "user-0", 5.0, CAP, 0, priority=HIGH)
    net.post(gm.submit(JobSpec("low", (low,), 0.0), 0.0))
    completions: list[Completions] = []
    _deliver_until(net, WorkerLaunch, completions)
    assert lm.running["low.0"].placement.task.run_number == 1
    # A task of a higher class fits nowhere: the LM preempts the low task (its first run) for it.
    net.post(gm.submit(JobSpec("high", (high,), 1.0), 1.0))
    _deliver_until(net, PreemptRequest, completions)
    _deliver_until(net, Completions, completions)
    (first_end,) = completions
    assert [(c.task_id, c.preempted, c.attempt, c.run_number) for c in first_end.items] == [("low.0", True, 1, 1)]
    assert ends.preempted == ["low.0"]
    # The high task finishes; the low one runs again on the same LM and node, as the same attempt, its run 2.
    _deliver_until(net, Completions, completions)
    assert ends.completed == ["high.0"]
    _deliver_until(net, WorkerLaunch, completions)
    rerun = lm.running["low.0"].placement
    assert (rerun.task.attempt, rerun.task.run_number, rerun.node) == (1, 2, first_end.items[0].state.node)
    assert gm.running["low.0"].task.run_number == 2
    # A copy of the first run's end, replayed now, names run 1: the GM ignores it, as a repeat, and counts it.
    assert gm.ignored_run_ends == 0
    assert gm.handle(first_end, net.now) == []
    assert "low.0" in gm.running and not gm.queue and not gm.waiting_tasks()
    assert ends.preempted == ["low.0"] and gm.preempted == 1 and gm.ignored_run_ends == 1
    # So does the LM a copy of the first run's worker report: it names run 1, not the run it placed.
    stale = WorkerReport(0, [FinishedTask("low.0", rerun.node, preempted=True, attempt=1, run_number=1)])
    assert lm.handle(stale, net.now) == [] and "low.0" in lm.running
    # The second run ends once, as finished.
    net.run()
    assert ends.completed == ["high.0", "low.0"] and gm.running == {} and lm.is_idle()
    assert gm.handle(first_end, net.now) == [] and ends.completed == ["high.0", "low.0"]
    assert gm.view_snapshot()["ignored_run_ends"] == 2


def test_a_forwarded_copy_of_an_end_the_gm_applied_is_told_to_its_observer_not_applied_again() -> None:
    """A rebuilt LM forwards an end the GM heard of already (the LM that placed the run died after telling the GM,
    perhaps before announcing it): the GM ignores it, counts it, and tells its observer, which may announce the end.
    A copy that is not forwarded (the LM that placed the run, repeating itself) announced the end itself."""
    ends = Ends()
    net = _net(ends)
    gm = net.gms[0]
    net.post(gm.submit(JobSpec("j", (TaskSpec("j.0", "j", "user-0", 1.0, CAP, 0),), 0.0), 0.0))
    completions: list[Completions] = []
    _deliver_until(net, Completions, completions)
    (end,) = completions
    assert ends.completed == ["j.0"] and gm.running == {}
    assert gm.handle(end, net.now) == [] and ends.repeated == []
    forwarded = Completions(end.lm, end.gm, end.applied_through, [replace(c, forwarded=True) for c in end.items])
    assert gm.handle(forwarded, net.now) == []
    assert ends.repeated == [(0, "j.0", 1)] and ends.completed == ["j.0"] and gm.ignored_run_ends == 2


def test_a_recovering_gm_queues_its_tasks_as_runs_no_earlier_term_used() -> None:
    t = task("j.0")
    plan = plan_recovery(0, [t], set(), [LMReport(Delta(0, 0, 0), [], [])], term=3)
    (queued,) = plan.queued
    assert queued.run_number == first_run_number(3) > first_run_number(2) + 1000
    assert plan_recovery(0, [t], set(), [LMReport(Delta(0, 0, 0), [], [])]).queued == [t]  # no term: unchanged
