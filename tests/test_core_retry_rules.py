"""Retry rules by exit code (common/core/retry.py): which failed runs a job's rule retries, the jittered exponential
backoff, the failure count, what does not count (preemptions, lost workers), cancelling during a backoff and a GM
restart during one."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from megha.common.core.gm import GlobalMaster
from megha.common.core.lifecycle import Event, Lifecycle, State
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import (
    Completions,
    EndedRun,
    FinishedTask,
    LaunchBatch,
    Output,
    StopRequest,
    Wake,
    WorkerLaunch,
    WorkerReport,
    gm_address,
)
from megha.common.core.observer import CoreObserver
from megha.common.core.recovery import LMReport, lm_report, plan_recovery
from megha.common.core.retry import JITTER, MAX_BACKOFF_S, RetryBook, RetryDue, RetryRule
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.models import TaskEvent
from megha.embedded.faults import parse_faults
from megha.loadgen.events import EventRecorder
from megha.loadgen.replay import ReplayConfig, replay

from corekit import Net, cluster, task


class Seen(CoreObserver):
    """What a GM reported of its tasks' retries and ends."""

    def __init__(self) -> None:
        self.retries: list[tuple[str, int, float, str]] = []  # (task, failed attempt, due at, reason)
        self.ends: list[tuple[str, str]] = []  # (task, error or "cancelled")
        self.lost: list[str] = []

    def task_retry_scheduled(self, task: TaskSpec, reason: str, at: float, now: float) -> None:
        self.retries.append((task.task_id, task.attempt, at, reason))

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool) -> None:
        self.ends.append((task.task_id, error))

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None:
        self.ends.append((task.task_id, reason))

    def task_cancelled(self, task: TaskSpec, now: float) -> None:
        self.ends.append((task.task_id, "cancelled"))

    def task_lost(self, task: TaskSpec, reason: str, now: float) -> None:
        self.lost.append(task.task_id)


def ruled(job_id: str, rule: RetryRule | None, n: int = 1) -> JobSpec:
    return JobSpec(job_id, tuple(task(f"{job_id}.{i}", duration=60.0) for i in range(n)), 0.0, retry=rule)


def launches(net: Net) -> list[WorkerLaunch]:
    """Deliver launches and responses; the worker launches (not delivered to the simulated workers)."""
    found = []
    while net.inbox:
        if isinstance(net.inbox[0].msg, WorkerLaunch):
            found.append(net.inbox.pop(0).msg)
        else:
            net.deliver()
    return found


def end_run(net: Net, launch: WorkerLaunch, now: float, code: int | None, error: str = "") -> list[Output]:
    """The worker reports the (one) run of `launch` ended with exit code `code` (0: finished); the GM's outputs."""
    (p,) = launch.launches
    why = error or ("" if code == 0 else f"exited with code {code}")
    report = WorkerReport(
        0,
        [
            FinishedTask(
                p.task.task_id, p.node, error=why, attempt=p.task.attempt, exit_code=code, run_number=p.task.run_number
            )
        ],
    )
    (done,) = [o.msg for o in net.lms[0].handle(report, now) if isinstance(o.msg, Completions)]
    net.now = now
    return net.gms[0].handle(done, now)


def wakes(outputs: list[Output]) -> list[Wake]:
    return [o for o in outputs if isinstance(o, Wake)]


# --- The rule --------------------------------------------------------------------------------------------------


def test_a_rule_matches_its_exit_codes_or_any_non_zero_one_when_it_names_none() -> None:
    named = RetryRule(3, 1.0, frozenset({3, 137}))
    assert named.matches(3) and named.matches(137)
    assert not named.matches(1) and not named.matches(0) and not named.matches(None)
    anything = RetryRule(3, 1.0)
    assert anything.matches(1) and anything.matches(255)
    assert not anything.matches(0) and not anything.matches(None)  # no exit code: a burn task, a duration limit


def test_bad_rules_are_refused() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryRule(0, 1.0)
    with pytest.raises(ValueError, match="backoff_s"):
        RetryRule(2, -1.0)


def test_the_backoff_doubles_per_retry_up_to_the_cap_and_the_jitter_stays_within_its_bounds() -> None:
    rule = RetryRule(10, 2.0)
    assert [rule.backoff(k, 1.0) for k in (1, 2, 3, 4)] == [2.0, 4.0, 8.0, 16.0]
    assert rule.backoff(30, 1.0) == MAX_BACKOFF_S
    book = RetryBook(random.Random(7))
    book.admit(ruled("j", RetryRule(100, 2.0), 200))
    for i in range(200):
        retry = book.failed(task(f"j.{i}"), "exit 1", 1, 10.0)
        assert not isinstance(retry, str)
        assert 2.0 * JITTER[0] <= retry.at - 10.0 < 2.0 * JITTER[1]
    again = book.failed(task("j.0"), "exit 1", 1, 20.0)  # the second retry of j.0: twice the base
    assert not isinstance(again, str) and again.retry == 2 and 4.0 * JITTER[0] <= again.at - 20.0 < 4.0 * JITTER[1]


def test_the_jitter_comes_from_the_seed_so_runs_repeat() -> None:
    def dues(seed: int) -> list[float]:
        gm = GlobalMaster(0, cluster([[[[]]]]), seed=seed)
        gm.retry.admit(ruled("j", RetryRule(5, 1.0), 20))
        return [r.at for i in range(20) if not isinstance(r := gm.retry.failed(task(f"j.{i}"), "e", 1, 0.0), str)]

    assert dues(1) == dues(1) != dues(2)


# --- The GM ----------------------------------------------------------------------------------------------------


def test_a_matching_failure_runs_again_after_its_backoff_until_the_attempts_are_used_up() -> None:
    seen = Seen()
    net = Net.build(cluster([[[[]]]]), observer=seen)
    gm = net.gms[0]
    net.post(gm.submit(ruled("j", RetryRule(3, 10.0, frozenset({3}))), 0.0))
    now = 1.0
    for attempt in (1, 2):
        (launch,) = launches(net)
        assert launch.launches[0].task.attempt == attempt
        out = end_run(net, launch, now, 3)
        (wake,) = wakes(out)
        assert wake.dest == gm_address(0) and wake.msg == RetryDue("j.0", attempt + 1)
        assert 10.0 * 2 ** (attempt - 1) * JITTER[0] <= wake.at - now < 10.0 * 2 ** (attempt - 1) * JITTER[1]
        assert not [o for o in out if isinstance(o.msg, LaunchBatch)]  # nothing runs before the backoff ends
        assert "j.0" in gm.retry.backing_off and not gm.queue and seen.ends == []
        now = wake.at
        net.post(gm.handle(wake.msg, now))
    (last,) = launches(net)
    assert last.launches[0].task.attempt == 3
    assert wakes(end_run(net, last, now + 1.0, 3)) == []
    assert [(t, a) for t, a, _, _ in seen.retries] == [("j.0", 1), ("j.0", 2)]
    ((task_id, reason),) = seen.ends
    assert task_id == "j.0" and "exit code 3" in reason and "failure 3 of at most 3" in reason
    assert gm.failures_retried == 2 and gm.retry.rules == {} and gm.retry.failures == {}


def test_an_exit_code_the_rule_does_not_name_fails_the_task_at_once() -> None:
    seen = Seen()
    net = Net.build(cluster([[[[]]]]), observer=seen)
    gm = net.gms[0]
    net.post(gm.submit(ruled("j", RetryRule(5, 1.0, frozenset({3}))), 0.0))
    (launch,) = launches(net)
    assert wakes(end_run(net, launch, 1.0, 2)) == []
    ((_, reason),) = seen.ends
    assert "exit code 2 not retried" in reason and seen.retries == []


def test_a_run_without_an_exit_code_and_a_job_without_a_rule_are_not_retried() -> None:
    seen = Seen()
    net = Net.build(cluster([[[[], []]]]), observer=seen)
    gm = net.gms[0]
    net.post(gm.submit(ruled("a", RetryRule(5, 1.0)), 0.0))
    net.post(gm.submit(ruled("b", None), 0.0))
    first, second = launches(net)
    assert wakes(end_run(net, first, 1.0, None, "exceeded its duration limit of 5 s")) == []
    assert wakes(end_run(net, second, 1.0, 1)) == []
    assert [t for t, _ in seen.ends] == ["a.0", "b.0"] and seen.ends[1][1] == "exited with code 1"
    assert "no exit code not retried" in seen.ends[0][1]


def test_a_run_that_finishes_ends_the_task_and_frees_the_rule() -> None:
    seen = Seen()
    net = Net.build(cluster([[[[]]]]), observer=seen)
    gm = net.gms[0]
    net.post(gm.submit(ruled("j", RetryRule(3, 1.0)), 0.0))
    (launch,) = launches(net)
    assert wakes(end_run(net, launch, 1.0, 0)) == []
    assert seen.ends == [("j.0", "")] and gm.retry.rules == {}


def test_preemptions_and_lost_workers_are_not_failures_of_the_rule() -> None:
    seen = Seen()
    net = Net.build(cluster([[[[], [], [], []]]]), observer=seen, max_attempts=3)
    gm, lm = net.gms[0], net.lms[0]
    net.post(gm.submit(ruled("j", RetryRule(2, 1.0)), 0.0))
    (launch,) = launches(net)
    # Preempted: back in the queue, same attempt, no failure counted.
    p = launch.launches[0]
    report = WorkerReport(0, [FinishedTask("j.0", p.node, preempted=True, attempt=1)])
    lm.preempting["j.0"] = lm.running.pop("j.0")
    (done,) = [o.msg for o in lm.handle(report, 1.0) if isinstance(o.msg, Completions)]
    net.post(gm.handle(done, 1.0))
    (launch,) = launches(net)
    assert launch.launches[0].task.attempt == 1 and gm.retry.failures == {}
    # Lost: its next attempt, no failure counted.
    net.post(lm.take_down([launch.launches[0].node], "agent gone", 2.0))
    (launch,) = launches(net)
    assert launch.launches[0].task.attempt == 2 and seen.lost == ["j.0"] and gm.retry.failures == {}
    # Its one retry for a failure is still there: the first failure retries, the second fails the task.
    (wake,) = wakes(end_run(net, launch, 3.0, 1))
    net.post(gm.handle(wake.msg, wake.at))
    (launch,) = launches(net)
    assert launch.launches[0].task.attempt == 3
    # ... and its failure retries do not use up MEGHA_MAX_ATTEMPTS (3): a loss now still runs it again.
    net.post(lm.take_down([launch.launches[0].node], "agent gone", 9.0))
    (launch,) = launches(net)
    assert launch.launches[0].task.attempt == 4 and seen.lost == ["j.0", "j.0"]
    assert wakes(end_run(net, launch, 10.0, 1)) == []
    assert [t for t, _ in seen.ends] == ["j.0"] and "failure 2 of at most 2" in seen.ends[0][1]


def test_cancelling_a_job_whose_task_waits_in_backoff_cancels_it_at_once_and_the_timer_does_nothing() -> None:
    seen = Seen()
    net = Net.build(cluster([[[[]]]]), observer=seen)
    gm = net.gms[0]
    net.post(gm.submit(ruled("j", RetryRule(3, 30.0)), 0.0))
    (launch,) = launches(net)
    (wake,) = wakes(end_run(net, launch, 1.0, 1))
    gm.cancel(["j.0"], 2.0)
    assert seen.ends == [("j.0", "cancelled")] and gm.cancelled == 1
    assert gm.retry.backing_off == {} and gm.retry.rules == {}
    assert gm.handle(wake.msg, wake.at) == [] and not gm.queue


def test_a_cancelled_task_whose_run_failed_before_the_stop_reached_it_ends_failed_and_is_not_retried() -> None:
    """The job is cancelled while its run is failing: the run's failure, overtaking the stop, ends the task as it
    ended (failed), and its rule does not run a cancelled task again (it used to: the retry then ran after the
    cancel, and the stale stop could hit it)."""
    seen = Seen()
    net = Net.build(cluster([[[[]]]]), observer=seen)
    gm = net.gms[0]
    net.post(gm.submit(ruled("j", RetryRule(3, 0.0)), 0.0))
    (launch,) = launches(net)
    (stop,) = [o.msg for o in gm.cancel(["j.0"], 1.0)]
    assert isinstance(stop, StopRequest) and gm.ledger.cancelling == {"j.0"}
    assert end_run(net, launch, 1.5, 3) == []  # the failure reaches the GM before the stop reaches the LM
    assert seen.ends == [("j.0", "exited with code 3")] and seen.retries == []
    assert not gm.queue and not gm.ledger.cancelling and gm.retry.rules == {} and gm.running == {}
    assert net.lms[0].handle(stop, 2.0) == [] and net.lms[0].is_idle()


def test_a_gm_restarted_during_a_backoff_runs_the_task_again_and_keeps_its_failure_count() -> None:
    spec = cluster([[[[]]]])
    net = Net.build(spec)
    net.lms[0] = LocalMaster(0, spec.partitions[0], ended_runs_kept=10)
    rule = RetryRule(3, 30.0)
    job = ruled("j", rule)
    net.post(net.gms[0].submit(job, 0.0))
    (launch,) = launches(net)
    (wake,) = wakes(end_run(net, launch, 1.0, 1))
    assert wake.msg == RetryDue("j.0", 2)
    # The GM dies in the backoff. Its durable records hold the job and that j.0 runs again as attempt 2 after one
    # failure (the services' journal `retry` record); the LM remembers the failed run of attempt 1.
    lm = net.lms[0]
    assert [(r.task_id, r.attempt) for r in lm.ended_runs(0)] == [("j.0", 1)]
    seen = Seen()
    restarted = GlobalMaster(0, spec, observer=seen)
    accepted = [replace(t, attempt=2) for t in job.tasks]
    plan = plan_recovery(0, accepted, set(), [lm_report(lm, 0)])
    assert plan.ended == {} and [t.task_id for t in plan.queued] == ["j.0"]  # not ended by the stale end
    restarted.retry.restore(job, 1, {"j.0": 1})
    net.gms[0] = restarted
    net.post(restarted.recover(plan.deltas, plan.running, plan.queued, 5.0))
    (launch,) = launches(net)
    assert launch.launches[0].task.attempt == 2
    (wake,) = wakes(end_run(net, launch, 6.0, 1))  # failure 2 of 3: retried once more
    net.post(restarted.handle(wake.msg, wake.at))
    (launch,) = launches(net)
    assert wakes(end_run(net, launch, 200.0, 1)) == []
    assert "failure 3 of at most 3" in seen.ends[0][1]


def test_a_failure_its_gm_never_saw_before_a_restart_is_retried_from_the_lms_memory() -> None:
    """As the GM service recovers: the completion waits in the GM's broker queue until after the recovery, so the
    LM's memory of the failed run (with its exit code) is what the restarted GM's rule decides on."""
    spec = cluster([[[[]]]])
    net = Net.build(spec)
    net.lms[0] = LocalMaster(0, spec.partitions[0], ended_runs_kept=10)
    job = ruled("j", RetryRule(3, 30.0))
    net.post(net.gms[0].submit(job, 0.0))
    (launch,) = launches(net)
    (p,) = launch.launches
    report = WorkerReport(0, [FinishedTask("j.0", p.node, error="exited with code 1", exit_code=1)])
    (waiting,) = [o.msg for o in net.lms[0].handle(report, 1.0) if isinstance(o.msg, Completions)]
    seen = Seen()
    restarted = net.gms[0] = GlobalMaster(0, spec, observer=seen)
    restarted.retry.restore(job, 1, {})
    plan = plan_recovery(0, job.tasks, set(), [lm_report(net.lms[0], 0)], ruled={"j"})
    assert plan.ended == {} and plan.queued == []
    (wake,) = wakes(restarted.recover(plan.deltas, plan.running, plan.queued, 2.0, replayed=plan.replayed))
    assert wake.msg == RetryDue("j.0", 2) and [(t, a) for t, a, *_ in seen.retries] == [("j.0", 1)]
    assert restarted.handle(waiting, 2.1) == [] and not seen.ends  # the waiting completion changes nothing
    net.post(restarted.handle(wake.msg, wake.at))
    (launch,) = launches(net)
    assert launch.launches[0].task.attempt == 2 and restarted.failures_retried == 1


def test_without_its_record_a_remembered_failed_run_would_end_the_task() -> None:
    """The stale-end filter is what keeps a task in backoff alive across a restart."""
    t = task("j.0")
    report = LMReport(lm_report(Net.build(cluster([[[[]]]])).lms[0], 0).delta, [], [EndedRun("j.0", 1, 0, "exit 1")])
    assert plan_recovery(0, [t], set(), [report]).ended == {"j.0": "exit 1"}
    assert plan_recovery(0, [replace(t, attempt=2)], set(), [report]).ended == {}


def test_a_retried_failure_is_not_an_end_of_the_task_lifecycle() -> None:
    life = Lifecycle()
    for event in (Event.ARRIVED, Event.DECIDED, Event.STARTED, Event.RETRIED):
        assert life.advance("t", event)
    assert life.state("t") == State.QUEUED
    assert life.advance("t", Event.DECIDED) and life.advance("t", Event.FAILED)
    assert not life.advance("t", Event.RETRIED)  # news of a run after the end: a no-op


# --- The simulator ---------------------------------------------------------------------------------------------


def test_a_replay_with_failing_runs_retries_them_reproducibly_and_ends_every_task_once() -> None:
    small = ReplayConfig(
        trace="syn:40:20", lms=2, gms=2, workers_per_partition=10, seed=3, constraints=False, fail_fraction=0.3
    )
    alone = replay(small)
    retried = replay(replace(small, retry="4:2"))
    again = replay(replace(small, retry="4:2"))
    for result in (alone, retried):
        assert not result.metrics.not_exactly_once
        assert sum(result.recorder.jobs[j].num_tasks for j in result.recorder.jobs) == 800
    assert alone.recorder.failures_retried == 0 and alone.recorder.failed_count > 150  # about 30% of 800
    assert retried.recorder.failures_retried > 200
    assert retried.recorder.failed_count < 0.1 * alone.recorder.failed_count  # 0.3 ** 4 of the tasks, about 6
    assert retried.system.counters()["failures_retried"] == retried.recorder.failures_retried
    assert (again.recorder.failures_retried, again.recorder.failed_count) == (
        retried.recorder.failures_retried,
        retried.recorder.failed_count,
    )


def test_a_simulated_gm_crash_during_backoffs_keeps_the_tasks_and_their_failure_counts() -> None:
    """The simulator's GM journal keeps what the services' does: which tasks run again as which attempt, after how
    many failures; a GM that restarts in the middle of the backoffs ends every task once, within its rule."""
    config = ReplayConfig(
        trace="syn:40:20",
        lms=2,
        gms=2,
        workers_per_partition=10,
        seed=5,
        constraints=False,
        fail_fraction=0.5,
        retry="3:20",
        faults=parse_faults(["gm:at=40,gm=0,down=5", "gm:at=60,gm=1,down=5"], 30.0, 60.0, 5),
    )
    result = replay(config)
    assert not result.metrics.not_exactly_once
    records = result.recorder
    assert records.failures_retried > 100
    failed = [r for r in records.tasks.columns["failed_reason"] if r]
    assert failed and all("of at most 3: retries used up" in r for r in failed), failed[:3]


def test_the_services_event_recorder_counts_a_failed_run_its_rule_retries_as_no_end() -> None:
    rule = RetryRule(3, 1.0, frozenset({3}))
    recorder = EventRecorder()
    tasks = (task("j.0"), task("j.1"))
    recorder.expect(0, JobSpec("j", tasks, 0.0, retry=rule))
    recorder.accept(JobSpec("j", tasks, 0.0, retry=rule))

    def event(kind: str, task_id: str, attempt: int, code: int | None = None) -> TaskEvent:
        return TaskEvent(
            kind=kind,
            task_id=task_id,
            job_id="j",
            lm=0,
            node=0,
            at=float(attempt),
            attempt=attempt,  # type: ignore[arg-type]
            error="" if code is None else f"exit code {code}",
            exit_code=code,
        )

    for attempt in (1, 2):
        assert recorder.record(event("started", "j.0", attempt), float(attempt)) is False
        assert recorder.record(event("failed", "j.0", attempt, 3), float(attempt)) is False  # retried: no end
    assert recorder.record(event("started", "j.0", 3), 3.0) is False
    assert recorder.record(event("failed", "j.0", 3, 3), 3.0) is True  # its third failure: the end
    assert recorder.record(event("started", "j.1", 1), 1.0) is False
    assert recorder.record(event("failed", "j.1", 1, 4), 1.0) is True  # a code the rule does not name
    assert (recorder.failures_retried, recorder.ended, recorder.open, recorder.illegal) == (2, 2, 0, 0)
