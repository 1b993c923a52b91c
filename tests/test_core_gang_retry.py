"""A retry rule on a gang job (docs/gang.md, docs/retry.md): a member whose run fails with an exit code the rule
matches stops the rest, and the gang runs again whole, every member as its next attempt, after the rule's backoff;
a code the rule does not match, or failures used up, fail the whole gang with reasons naming the member; failures
count per gang; a cancel during the backoff cancels the gang; a replay with gangs, failures and retries ends every
task exactly once."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_core_gang import Seen as GangSeen
from test_core_gang import _assert_whole, drive_shuffled

from megha.common.core.gm import GlobalMaster
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import Completions, GangRetry, Output, Placement, Wake
from megha.common.core.observer import CoreObserver
from megha.common.core.recovery import lm_report, plan_recovery
from megha.common.core.retry import RetryRule, SimulatedFailures
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.core.worker import SimulatedExecution
from megha.embedded.system import EmbeddedConfig, EmbeddedSystem

from corekit import CAP, Net, cluster, task


class Seen(CoreObserver):
    """Runs started (task, attempt), retries scheduled, ends."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, int]] = []
        self.retries: list[tuple[str, int, float, str]] = []  # (task, failed attempt, due at, reason)
        self.ends: dict[str, tuple[str, str]] = {}  # task -> (how, reason)
        self.end_count: dict[str, int] = {}
        self.preempted: list[str] = []

    def launched(self, placements: Sequence[Placement], now: float) -> None:
        self.runs.extend((p.task.task_id, p.task.attempt) for p in placements)

    def task_retry_scheduled(self, task: TaskSpec, reason: str, at: float, now: float) -> None:
        self.retries.append((task.task_id, task.attempt, at, reason))

    def _end(self, task_id: str, how: str, reason: str) -> None:
        self.ends[task_id] = (how, reason)
        self.end_count[task_id] = self.end_count.get(task_id, 0) + 1

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool) -> None:
        self._end(task.task_id, "failed" if error else "finished", error)

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None:
        self._end(task.task_id, "failed", reason)

    def task_cancelled(self, task: TaskSpec, now: float) -> None:
        self._end(task.task_id, "cancelled", "")

    def task_preempted(self, task: TaskSpec, now: float) -> None:
        self.preempted.append(task.task_id)


def ruled_gang(rule: RetryRule | None, durations: Sequence[float] = (10.0, 60.0, 60.0)) -> JobSpec:
    tasks = tuple(task(f"g.{k}", duration=d) for k, d in enumerate(durations))
    return JobSpec("g", tasks, 0.0, gang=math.inf, retry=rule)


def scripted(workers: Sequence[SimulatedExecution], plan: dict[tuple[str, int], int]) -> None:
    """The simulated `workers` fail the runs `plan` names (task, attempt) with its exit code; the others finish."""
    for worker in workers:
        start: Callable[[list[Placement], float], list[Output]] = worker._start

        def scripted_start(launches: list[Placement], now: float, start=start, worker=worker) -> list[Output]:  # type: ignore[no-untyped-def]
            codes = [plan.get((p.task.task_id, p.task.attempt)) for p in launches]
            worker.failures = lambda: codes.pop(0)  # type: ignore[assignment]
            return start(launches, now)

        worker._start = scripted_start  # type: ignore[method-assign]


def _net(plan: dict[tuple[str, int], int], lms: int = 1) -> tuple[Net, Seen]:
    seen = Seen()
    net = Net.build(cluster([[[[], [], []]] for _ in range(lms)]), observer=seen)
    for lm in net.lms:
        lm.observer = seen
    scripted(net.workers, plan)
    return net, seen


def test_a_member_failing_with_a_matching_code_reruns_the_whole_gang_after_the_backoff() -> None:
    net, seen = _net({("g.0", 1): 3})
    gm = net.gms[0]
    out = gm.submit(ruled_gang(RetryRule(3, 5.0, frozenset({3}))), 0.0)
    net.post(out)
    net.run()
    # g.0 failed at t=10; g.1 and g.2 were stopped; after the backoff every member ran again as attempt 2.
    assert sorted(seen.runs) == [("g.0", 1), ("g.0", 2), ("g.1", 1), ("g.1", 2), ("g.2", 1), ("g.2", 2)]
    assert sorted(t for t, *_ in seen.retries) == ["g.0", "g.1", "g.2"]
    (at,) = {at for _, _, at, _ in seen.retries}
    assert 10.0 + 5.0 * 0.5 <= at < 10.0 + 5.0 * 1.5  # the jittered backoff, from when the last member stopped
    assert all("gang member g.0" in reason and "exit code 3" in reason for *_, reason in seen.retries)
    assert seen.ends == {t: ("finished", "") for t in ("g.0", "g.1", "g.2")}
    assert seen.end_count == {"g.0": 1, "g.1": 1, "g.2": 1} and not seen.preempted
    assert gm.failures_retried == 1 and not gm.gangs.members and not gm.retry.rules and not gm.retry.failures
    assert net.lms[0].free == [CAP, CAP, CAP] and not net.lms[0].running


def test_a_finished_member_is_held_and_runs_again_when_another_fails_later() -> None:
    # g.0 (10 s) finishes, g.1 (20 s) fails: g.0's finish is not reported, and it runs again with the rest.
    net, seen = _net({("g.1", 1): 1})
    gm = net.gms[0]
    net.post(gm.submit(ruled_gang(RetryRule(2, 1.0), (10.0, 20.0, 60.0)), 0.0))
    net.run()
    assert sorted(t for t, a in seen.runs if a == 2) == ["g.0", "g.1", "g.2"]
    assert seen.ends == {t: ("finished", "") for t in ("g.0", "g.1", "g.2")}
    assert seen.end_count == {"g.0": 1, "g.1": 1, "g.2": 1}


def test_a_code_the_rule_does_not_match_fails_the_whole_gang_naming_the_member() -> None:
    net, seen = _net({("g.0", 1): 4})
    gm = net.gms[0]
    net.post(gm.submit(ruled_gang(RetryRule(3, 5.0, frozenset({3}))), 0.0))
    net.run()
    assert not seen.retries and all(a == 1 for _, a in seen.runs)
    how, reason = seen.ends["g.0"]
    assert how == "failed" and "exit code 4 not retried" in reason
    for other in ("g.1", "g.2"):  # stopped at t=10, not run to their end
        how, reason = seen.ends[other]
        assert how == "failed" and "gang member g.0 failed" in reason and "exit code 4" in reason
    assert seen.end_count == {"g.0": 1, "g.1": 1, "g.2": 1} and not seen.preempted
    assert not gm.gangs.members and not gm.retry.rules
    assert net.lms[0].free == [CAP, CAP, CAP] and not net.lms[0].running


def test_failures_count_per_gang_and_once_used_up_fail_the_gang() -> None:
    # Attempt 1: g.0 fails; attempt 2: g.1 fails. Per task each failed once; per gang twice = max_attempts.
    net, seen = _net({("g.0", 1): 1, ("g.1", 2): 1})
    gm = net.gms[0]
    net.post(gm.submit(ruled_gang(RetryRule(2, 1.0), (10.0, 10.0, 60.0)), 0.0))
    net.run()
    assert sorted(t for t, a in seen.runs if a == 2) == ["g.0", "g.1", "g.2"]
    assert not any(a == 3 for _, a in seen.runs)
    assert "gang failure 2 of at most 2: retries used up" in seen.ends["g.1"][1]
    assert all(seen.ends[t][0] == "failed" and "gang member g.1 failed" in seen.ends[t][1] for t in ("g.0", "g.2"))
    assert seen.end_count == {"g.0": 1, "g.1": 1, "g.2": 1}
    assert gm.failures_retried == 1 and not gm.gangs.members and not gm.retry.rules


def test_cancelling_a_gang_during_its_backoff_cancels_every_member() -> None:
    net, seen = _net({("g.0", 1): 3})
    gm = net.gms[0]
    net.post(gm.submit(ruled_gang(RetryRule(3, 100.0)), 0.0))
    while not seen.retries:  # until the retry is scheduled (the gang waits out its backoff)
        if net.inbox:
            net.deliver()
            continue
        net.timers.sort(key=lambda w: w.at)
        wake = net.timers.pop(0)
        net.now = max(net.now, wake.at)
        net.post(net.endpoint(wake.dest).handle(wake.msg, net.now))
    while net.inbox:
        net.deliver()
    assert "g" in gm.gangs.waiting and all(w.at > net.now for w in net.timers if isinstance(w.msg, GangRetry))
    net.post(gm.cancel(["g.0", "g.1", "g.2"], net.now))
    assert seen.ends == {t: ("cancelled", "") for t in ("g.0", "g.1", "g.2")}
    net.run()  # the stale GangRetry wake does nothing
    assert not any(a == 2 for _, a in seen.runs) and seen.end_count == {"g.0": 1, "g.1": 1, "g.2": 1}
    assert not gm.gangs.members and not gm.gangs.waiting and not gm.retry.rules


def test_a_gang_spanning_two_lms_reruns_whole_after_a_failure() -> None:
    net, seen = _net({("g.3", 1): 2}, lms=2)
    gm = net.gms[0]
    tasks = tuple(task(f"g.{k}", duration=10.0 if k == 3 else 60.0) for k in range(5))
    net.post(gm.submit(JobSpec("g", tasks, 0.0, gang=math.inf, retry=RetryRule(2, 1.0)), 0.0))
    net.run()
    assert sorted(t for t, a in seen.runs if a == 2) == [f"g.{k}" for k in range(5)]
    assert seen.ends == {f"g.{k}": ("finished", "") for k in range(5)}
    assert all(n == 1 for n in seen.end_count.values())
    assert all(lm.free == [CAP, CAP, CAP] and not lm.running and not lm.gangs.held for lm in net.lms)


def test_a_gang_without_a_rule_still_lets_a_failed_member_fail_alone() -> None:
    net, seen = _net({("g.0", 1): 3})
    gm = net.gms[0]
    net.post(gm.submit(ruled_gang(None), 0.0))
    net.run()
    assert seen.ends["g.0"][0] == "failed" and seen.ends["g.1"] == ("finished", "") and not seen.retries
    assert not any(isinstance(w.msg, GangRetry) for w in net.timers if isinstance(w, Wake))


def _crashing_gm(plan: dict[tuple[str, int], int], at: float) -> tuple[EmbeddedSystem, Seen]:
    """One GM over one LM of three nodes; GM 0 crashes at `at` and is back a second later (its journal and the LM's
    memory of ended runs rebuild it, embedded/outages.py); the workers fail the runs `plan` names."""
    from megha.embedded.faults import Fault, Faults

    seen = Seen()
    faults = Faults(at=(Fault("gm", at, 0, down=1.0),))
    system = EmbeddedSystem(cluster([[[[], [], []]]]), EmbeddedConfig(faults=faults), seen)
    scripted(system.workers, plan)
    return system, seen


def test_a_member_finished_and_held_when_its_gm_crashed_runs_again_when_another_fails_after_the_restart() -> None:
    # g.0 finishes at 1 s and is held; the GM crashes at 2 s and is back at 3 s; g.1 fails (exit 3) at 5 s.
    system, seen = _crashing_gm({("g.1", 1): 3}, at=2.0)
    system.submit(0, ruled_gang(RetryRule(3, 1.0, frozenset({3})), (1.0, 5.0, 5.0)))
    system.run()
    assert system.counters()["gm_crashes"] == 1
    assert sorted(t for t, a in seen.runs if a == 2) == ["g.0", "g.1", "g.2"]  # the whole gang, g.0 too
    assert sorted(t for t, *_ in seen.retries) == ["g.0", "g.1", "g.2"]
    assert seen.ends == {t: ("finished", "") for t in ("g.0", "g.1", "g.2")}
    assert seen.end_count == {"g.0": 1, "g.1": 1, "g.2": 1}
    assert all(not gm.gangs.members and not gm.retry.rules for gm in system.gms)  # type: ignore[attr-defined]


def test_members_finished_and_held_when_their_gm_crashed_end_finished_once_with_the_last() -> None:
    # g.0 and g.1 finish (held) before the crash at 2 s; g.2 finishes at 4 s, after the restart.
    system, seen = _crashing_gm({}, at=2.0)
    system.submit(0, ruled_gang(RetryRule(3, 1.0), (1.0, 1.5, 4.0)))
    system.run()
    assert system.counters()["gm_crashes"] == 1
    assert all(a == 1 for _, a in seen.runs) and not seen.retries
    assert seen.ends == {t: ("finished", "") for t in ("g.0", "g.1", "g.2")}
    assert seen.end_count == {"g.0": 1, "g.1": 1, "g.2": 1}


def _until(net: Net, end: float, backlog: list[Completions] | None = None) -> None:
    """Deliver what `net` holds and fire the timers due by `end`. With `backlog`, GM 0 is down: completions for it
    wait there (its broker queue), and anything else for it is lost with it."""
    while True:
        if net.inbox:
            sent = net.inbox.pop(0)
            if backlog is None or sent.dest != "gm/0":
                net.post(net.endpoint(sent.dest).handle(sent.msg, net.now))
            elif isinstance(sent.msg, Completions):
                backlog.append(sent.msg)
            continue
        due = [w for w in net.timers if w.at <= end]
        if not due:
            break
        wake = min(due, key=lambda w: w.at)
        net.timers.remove(wake)
        net.now = max(net.now, wake.at)
        if backlog is None or wake.dest != "gm/0":
            net.post(net.endpoint(wake.dest).handle(wake.msg, net.now))
    net.now = end


def test_a_gm_recovered_as_the_services_do_holds_a_finished_member_again_and_reruns_the_gang_for_a_failure() -> None:
    """As the GM service recovers (services/gm/recovery.py), with the completions that waited in its broker queue
    handled only after it recovered: the LMs' memory of ended runs alone says that g.0 finished (held before the
    crash) and that g.1 failed with exit code 3 while the GM was down. Both ends are replayed through the core: g.0
    is held again and g.1's failure reruns the whole gang; the waiting completion then changes nothing."""
    seen = Seen()
    spec = cluster([[[[], [], []]]])
    net = Net.build(spec, observer=seen)
    net.lms[0] = LocalMaster(0, spec.partitions[0], observer=seen, ended_runs_kept=10)
    scripted(net.workers, {("g.1", 1): 3})
    job = ruled_gang(RetryRule(3, 1.0, frozenset({3})), (1.0, 2.0, 10.0))
    net.post(net.gms[0].submit(job, 0.0))
    _until(net, 1.5)  # g.0 finished at 1 s: held
    assert not seen.ends and "g.0" in net.gms[0].gangs.members["g.0"].held
    backlog: list[Completions] = []
    _until(net, 3.0, backlog)  # GM 0 is down; g.1 fails at 2 s
    assert [c.task_id for msg in backlog for c in msg.items] == ["g.1"]
    restarted = net.gms[0] = GlobalMaster(0, spec, observer=seen)
    restarted.retry.restore(job, 3, {})  # the journal: the job, its rule, no end, no retry
    plan = plan_recovery(0, job.tasks, set(), [lm_report(net.lms[0], 0)], ruled={"g"})
    assert plan.ended == {} and plan.queued == []
    assert [(c.task_id, c.error != "", c.exit_code) for msg in plan.replayed for c in msg.items] == [
        ("g.0", False, None),
        ("g.1", True, 3),
    ]
    net.post(restarted.recover(plan.deltas, plan.running, plan.queued, net.now, {"g": math.inf}, plan.replayed))
    for msg in backlog:
        net.post(restarted.handle(msg, net.now))
    net.run()
    assert sorted(t for t, a in seen.runs if a == 2) == ["g.0", "g.1", "g.2"]  # the whole gang, g.0 too
    assert seen.ends == {t: ("finished", "") for t in ("g.0", "g.1", "g.2")}
    assert seen.end_count == {"g.0": 1, "g.1": 1, "g.2": 1}
    assert restarted.failures_retried == 1 and not restarted.gangs.members and not restarted.retry.rules
    assert net.lms[0].free == [CAP, CAP, CAP] and not net.lms[0].running


def test_a_replay_with_gangs_failures_and_retries_ends_every_task_exactly_once() -> None:
    from megha.loadgen.replay import ReplayConfig, replay

    config = ReplayConfig(
        trace="syn:6:30", lms=2, gms=2, workers_per_partition=2, constraints=False, gangs=0.5,
        fail_fraction=0.1, retry="3:1",
    )  # fmt: skip
    result = replay(config)
    metrics = result.metrics
    assert not metrics.not_exactly_once
    assert metrics.tasks_completed + metrics.tasks_failed == 180
    assert sum(gm.failures_retried for gm in result.system.gms) > 0  # type: ignore[attr-defined]
    assert sum(gm.gangs.started for gm in result.system.gms) > 0  # type: ignore[attr-defined]


class Whole(GangSeen):
    """test_core_gang's observer, with each task's ends (finished or failed) and retries."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: list[tuple[str, bool]] = []  # (task, finished)
        self.retried: list[str] = []

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool) -> None:
        self.ends.append((task.task_id, not error))

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None:
        self.ends.append((task.task_id, False))

    def task_retry_scheduled(self, task: TaskSpec, reason: str, at: float, now: float) -> None:
        self.retried.append(task.task_id)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=st.lists(
        st.tuples(
            st.booleans(),  # gang?
            st.integers(1, 5),  # tasks
            st.sampled_from([1000, 2000, 4000]),  # CPU per task
            st.floats(0.0, 3.0),  # submitted at
            st.floats(0.1, 4.0),  # duration
            st.integers(0, 1),  # GM
        ),
        min_size=1,
        max_size=8,
    ),
    fail=st.sampled_from([0.1, 0.3]),
    seed=st.integers(0, 3),
    crash=st.none() | st.tuples(st.floats(0.0, 6.0), st.integers(0, 1)),
)
def test_gangs_with_a_rule_rerun_whole_and_end_whole_whatever_fails(
    jobs: list[tuple[bool, int, int, float, float, int]], fail: float, seed: int, crash: tuple[float, int] | None
) -> None:
    """Random gang and single jobs with a rule, runs failing at random, and (`crash`) a GM crashing at a random time
    and back a second later, recovered from its journal and the LMs' memory of ended runs."""
    from megha.embedded.faults import Fault, Faults

    spec = cluster([[[[], []], [[]]], [[[]], [[], []]]])
    seen = Whole()
    faults = None if crash is None else Faults(at=(Fault("gm", crash[0], crash[1], down=1.0),))
    config = EmbeddedConfig(hop_delay=0.0005, fail_fraction=fail, seed=seed, faults=faults)
    system = EmbeddedSystem(spec, config, seen)
    sizes: dict[str, int] = {}
    expected: list[str] = []
    rule = RetryRule(3, 0.5)
    for j, (is_gang, n, cpu, at, duration, g) in enumerate(jobs):
        # Members of unequal lengths: a gang's first members finish (and are held) while the others run.
        tasks = tuple(task(f"j{j}.{k}", request=(cpu, 1024), duration=duration * (1 + k / 2)) for k in range(n))
        system.submit(g, JobSpec(f"j{j}", tasks, at, gang=math.inf if is_gang else None, retry=rule))
        if is_gang:
            sizes[f"j{j}"] = n
        expected.extend(t.task_id for t in tasks)
    system.run()
    _assert_whole(seen, sizes)  # every attempt of a gang launched every member
    assert sorted(t for t, _ in seen.ends) == sorted(expected)  # every task ends exactly once
    outcome: dict[str, set[bool]] = {}
    for task_id, finished in seen.ends:
        outcome.setdefault(task_id.split(".")[0], set()).add(finished)
    assert all(len(outcome[job]) == 1 for job in sizes)  # a gang ends all finished or all failed
    for job in sizes:  # a gang retried retries every member of the attempt
        assert len({t for t in seen.retried if t.split(".")[0] == job}) in (0, sizes[job])
    assert all(lm.free == lm.capacity and not lm.gangs.held and not lm.running for lm in system.lms)
    assert all(not gm.gangs.members and not gm.retry.rules for gm in system.gms)  # type: ignore[attr-defined]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=st.lists(
        st.tuples(st.booleans(), st.integers(1, 5), st.sampled_from([2000, 4000]), st.integers(0, 1)),
        min_size=1,
        max_size=6,
    ),
    order=st.randoms(use_true_random=False),
    cancels=st.dictionaries(st.integers(1, 200), st.integers(0, 5), max_size=2),
    losses=st.dictionaries(st.integers(1, 120), st.tuples(st.integers(0, 1), st.integers(0, 2)), max_size=2),
    seed=st.integers(0, 5),
)
def test_gangs_with_a_rule_stay_whole_whatever_order_messages_arrive_in_and_whatever_is_cancelled(  # type: ignore[no-untyped-def]
    jobs: list[tuple[bool, int, int, int]],
    order,
    cancels: dict[int, int],
    losses: dict[int, tuple[int, int]],
    seed: int,
) -> None:
    """Messages delivered in any order, runs failing at random (exit code 3, retried by the rule), workers lost (and
    back 30 steps later) and jobs cancelled at any step (also during a gang's backoff): every task ends exactly
    once, a gang not cancelled ends all finished or all failed (and, without losses, never starts a task after
    another of the same attempt ended), and nothing stays held."""
    seen = Whole()
    net = Net.build(cluster([[[[], []], [[]]], [[[]], [[], []]]]), observer=seen)
    for lm in net.lms:
        lm.observer = seen
    for w in net.workers:
        w.observer = seen
        w.failures = SimulatedFailures(0.3, 3, seed, w.lm_id)
    rule = RetryRule(3, 0.2, frozenset({3}))
    sizes: dict[str, int] = {}
    expected: list[str] = []
    for j, (is_gang, n, cpu, g) in enumerate(jobs):
        tasks = tuple(task(f"j{j}.{k}", request=(cpu, 1024), duration=1.0 + j) for k in range(n))
        try:
            net.post(
                net.gms[g].submit(JobSpec(f"j{j}", tasks, 0.0, gang=math.inf if is_gang else None, retry=rule), 0.0)
            )
        except Exception as exc:  # a job too big for the data centre is refused whole
            assert "gang needs" in str(exc) or "could" in str(exc), exc
            continue
        if is_gang:
            sizes[f"j{j}"] = n
        expected.extend(t.task_id for t in tasks)

    def cancel(step: int) -> None:
        if step in cancels and cancels[step] < len(jobs):
            j = cancels[step]
            net.post(net.gms[jobs[j][3]].cancel([f"j{j}.{k}" for k in range(jobs[j][1])], net.now))

    drive_shuffled(net, order, cancel, losses)
    cancelled = {t.split(".")[0] for t in seen.cancelled}
    if not losses:  # (a lost member may stop one part of its gang before another part's launch lands)
        assert not [t for t in seen.late_starts if t[0].split(".")[0] in sizes.keys() - cancelled]
    ends = [t for t, _ in seen.ends] + seen.cancelled
    if losses:  # only the gangs' tasks: single tasks under losses, failures and any order are not this test's
        ends = [t for t in ends if t.split(".")[0] in sizes]
        expected = [t for t in expected if t.split(".")[0] in sizes]
    assert sorted(ends) == sorted(expected) and len(set(ends)) == len(ends)
    outcome: dict[str, set[bool]] = {}
    for task_id, finished in seen.ends:
        outcome.setdefault(task_id.split(".")[0], set()).add(finished)
    mixed = [job for job in sizes.keys() - cancelled if len(outcome.get(job, ())) > 1]
    assert not mixed, (mixed, seen.ends)
    for lm in net.lms:
        assert lm.free == lm.capacity and not lm.gangs.held, (lm.free, lm.gangs.held)
    for gm in net.gms:
        assert not gm.gangs.members and not gm.gangs.waiting, (gm.gangs.members, gm.gangs.waiting)
        assert not [job for job in gm.retry.rules if job in sizes], gm.retry.rules


def test_a_backoff_wake_a_hair_early_still_places_the_gang() -> None:
    """The services sleep on another clock than the one they stamp `now` with: a wake 1 ms early ends the backoff."""
    net, seen = _net({("g.0", 1): 3})
    gm = net.gms[0]
    net.post(gm.submit(ruled_gang(RetryRule(3, 5.0)), 0.0))
    while not seen.retries:
        if net.inbox:
            net.deliver()
            continue
        net.timers.sort(key=lambda w: w.at)
        wake = net.timers.pop(0)
        net.now = max(net.now, wake.at)
        net.post(net.endpoint(wake.dest).handle(wake.msg, net.now))
    while net.inbox:
        net.deliver()
    (wake,) = [w for w in net.timers if isinstance(w.msg, GangRetry)]
    net.timers.remove(wake)
    net.now = wake.at - 0.001
    net.post(gm.handle(wake.msg, net.now))
    net.run()
    assert sorted(t for t, a in seen.runs if a == 2) == ["g.0", "g.1", "g.2"]
    assert seen.ends == {t: ("finished", "") for t in ("g.0", "g.1", "g.2")}
