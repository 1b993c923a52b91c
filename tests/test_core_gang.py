"""Gang scheduling in the core: a gang is placed whole or not at all, on one LM in one phase when it fits there,
across LMs by ordered prepares under leases then commits; a refused prepare aborts the others and nothing of the
gang runs; a lease its GM never commits expires and frees its resources, and a late commit is refused; competing
gangs all run; a cancelled, preempted or timed-out gang is handled as a whole."""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megha.common.core.messages import (
    DeltaTick,
    GangAbort,
    GangCommit,
    GangCommitted,
    GangPrepare,
    GangPrepared,
    LaunchBatch,
    LeaseExpiry,
    Placement,
    Send,
)
from megha.common.core.observer import CoreObserver
from megha.common.core.task import JobSpec, TaskSpec
from megha.embedded.system import EmbeddedConfig, EmbeddedSystem

from corekit import CAP, Net, cluster, task

INF = math.inf


class Seen(CoreObserver):
    """What happened to each task: launches (with attempt), ends, gang retries."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, int]] = []
        self.completed: list[str] = []
        self.failed: dict[str, str] = {}
        self.cancelled: list[str] = []
        self.retries: list[str] = []
        self.run_attempt: dict[str, int] = {}  # task -> the attempt its worker last started
        self.ended: set[tuple[str, int]] = set()  # (job, attempt) of which some run ended on its worker
        self.late_starts: list[tuple[str, int]] = []  # runs started after a run of the same job attempt ended

    def started(self, placements: Sequence[Placement], now: float) -> None:
        for p in placements:
            self.run_attempt[p.task.task_id] = p.task.attempt
            if (p.task.job_id, p.task.attempt) in self.ended:
                self.late_starts.append((p.task.task_id, p.task.attempt))

    def finished(self, task_ids: Sequence[str], now: float) -> None:
        for t in task_ids:
            self.ended.add((t.split(".")[0], self.run_attempt[t]))

    def preempted(self, task_ids: Sequence[str], now: float) -> None:
        self.finished(task_ids, now)

    def launched(self, placements: Sequence[Placement], now: float) -> None:
        self.runs.extend((p.task.task_id, p.task.attempt) for p in placements)

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool) -> None:
        self.completed.append(task.task_id)

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None:
        self.failed[task.task_id] = reason

    def task_cancelled(self, task: TaskSpec, now: float) -> None:
        self.cancelled.append(task.task_id)

    def gang_retry(self, job_id: str, reason: str, now: float) -> None:
        self.retries.append(reason)


def gang(job_id: str, n: int, duration: float = 1.0, timeout: float = INF, at: float = 0.0) -> JobSpec:
    return JobSpec(job_id, tuple(task(f"{job_id}.{k}", duration=duration) for k in range(n)), at, gang=timeout)


def _net(layout: list) -> tuple[Net, Seen]:  # type: ignore[type-arg]
    seen = Seen()
    net = Net.build(cluster(layout), observer=seen)
    for lm in net.lms:
        lm.observer = seen
    return net, seen


def _pending(net: Net) -> list[tuple[str, str]]:
    return [(m.dest, type(m.msg).__name__) for m in net.inbox]


def _tick(net: Net) -> None:
    """Every LM sends its deltas now."""
    for lm in net.lms:
        net.post(lm.handle(DeltaTick(), net.now))


def drive_shuffled(
    net: Net,
    order: random.Random,
    on_step: Callable[[int], None] | None = None,
    losses: Mapping[int, tuple[int, int]] | None = None,
) -> None:
    """Run `net` until nothing is left to do, delivering its messages in `order`'s random order (the services' calls
    run concurrently): the LMs' deltas every 7 steps and whenever nothing else is pending (as their timer would send
    them), timers in time order, `on_step(step)` at each step, and the worker of node `losses[step]` (LM, node) lost
    at that step and back 30 steps later."""
    back: dict[int, tuple[int, int]] = {}
    steps = 0
    while True:
        steps += 1
        assert steps < 20_000, "no progress"
        if steps % 7 == 0:
            _tick(net)
        if on_step is not None:
            on_step(steps)
        if losses and steps in losses:
            lm, node = losses[steps]
            net.workers[lm].crash({node})
            net.post(net.lms[lm].take_down([node], "worker lost", net.now))
            back[steps + 30] = (lm, node)
        if steps in back:
            lm, node = back.pop(steps)
            net.workers[lm].repair({node})
            net.post(net.lms[lm].bring_up([node], net.now))
        if net.inbox:
            net.deliver(order.randrange(len(net.inbox)))
        elif net.timers:
            net.timers.sort(key=lambda w: w.at)
            wake = net.timers.pop(0)
            net.now = max(net.now, wake.at)
            net.post(net.endpoint(wake.dest).handle(wake.msg, net.now))
        elif any(d for lm in net.lms for d in lm.nodes.dirty):
            _tick(net)
        elif back:
            steps = min(back) - 1
        else:
            break


# ------------------------------------------------------------------ single LM


def test_a_gang_that_fits_one_lm_is_placed_whole_there_in_one_phase() -> None:
    net, seen = _net([[[[], []]], [[[], []]]])  # two LMs of two nodes, one GM
    gm = net.gms[0]
    net.post(gm.submit(gang("g", 2), 0.0))
    assert _pending(net) == [("lm/0", "GangPrepare")]
    prepare = net.inbox[0].msg
    assert isinstance(prepare, GangPrepare) and prepare.commit and len(prepare.placements) == 2
    net.run()
    assert sorted(seen.completed) == ["g.0", "g.1"]
    assert net.lms[0].launched == 2 and net.lms[1].launched == 0
    assert gm.gangs.started == 1 and not gm.gangs.members and net.lms[0].free == [CAP, CAP]


def test_a_single_lm_gang_with_one_invalid_placement_launches_none() -> None:
    net, _ = _net([[[[], []]]])
    lm = net.lms[0]
    tasks = [task("g.0"), task("g.1")]
    # The GM's view was stale: node 1 is busy at the LM.
    net.post(lm.handle(LaunchBatch(0, 0, 1, [Placement(task("x.0", duration=5.0), 0, 1, False)]), 0.0))
    net.inbox.clear()
    placements = [Placement(tasks[0], 0, 0, False), Placement(tasks[1], 0, 1, False)]
    out = lm.handle(GangPrepare(0, 0, 2, "g", placements, 10.0, commit=True), 0.0)
    answers = [o.msg for o in out if isinstance(o, Send) and isinstance(o.msg, GangPrepared)]
    assert len(answers) == 1 and not answers[0].ok and "node 1" in answers[0].reason
    assert lm.launched == 1 and set(lm.running) == {"x.0"} and lm.free[0] == CAP  # g.0 was not reserved either
    assert {s.node for s in answers[0].states} == {0, 1}  # so the GM adopts the LM's state of both


# ----------------------------------------------------------------- across LMs


def test_a_gang_spanning_two_lms_is_prepared_in_lm_order_then_committed() -> None:
    net, seen = _net([[[[], []]], [[[], []]]])
    gm = net.gms[0]
    net.post(gm.submit(gang("g", 3), 0.0))  # three whole nodes: no LM has them
    assert _pending(net) == [("lm/0", "GangPrepare")]  # the lowest LM first, alone
    assert not net.inbox[0].msg.commit
    net.deliver()  # LM 0 reserves its part under a lease
    assert net.lms[0].launched == 0 and len(net.lms[0].gangs.held) == 1
    net.deliver()  # prepared -> the GM prepares LM 1
    assert _pending(net) == [("lm/1", "GangPrepare")]
    net.deliver()
    net.deliver()  # LM 1 prepared -> commits to both
    assert sorted(_pending(net)) == [("lm/0", "GangCommit"), ("lm/1", "GangCommit")]
    assert seen.runs == []
    net.run()
    assert sorted(seen.completed) == ["g.0", "g.1", "g.2"] and not seen.retries
    assert net.lms[0].launched + net.lms[1].launched == 3
    assert all(lm.free == [CAP, CAP] and not lm.gangs.held for lm in net.lms)


def _stale_lm1_layout() -> list:  # type: ignore[type-arg]
    """LM 0: GM 0's two nodes and GM 1's one; LM 1: one node of each GM, GM 1's with constraint 1."""
    return [[[[], []], [[]]], [[[]], [[1]]]]


def test_a_refused_prepare_aborts_the_others_launches_nothing_and_the_gang_runs_later() -> None:
    net, seen = _net(_stale_lm1_layout())
    gm0, gm1 = net.gms
    # GM 1 takes its node on LM 1 (GM 0 does not know: no delta reaches it yet).
    net.post(gm1.submit(JobSpec("x", (task("x.0", (1,), duration=5.0),), 0.0), 0.0))
    net.deliver()
    net.deliver()  # its answer to GM 1
    net.deliver()  # and its launch on the worker
    net.post(gm0.submit(gang("g", 5), 0.0))  # every node of the data centre
    net.deliver()  # LM 0 reserves three nodes
    net.deliver()  # -> GM 0 prepares LM 1
    net.deliver()  # LM 1 refuses: its GM-1 node is busy
    assert not net.lms[1].gangs.held and net.lms[1].gangs.refused == 1
    net.deliver()  # GM 0 learns it: aborts LM 0
    assert _pending(net) == [("lm/0", "GangAbort")]
    net.deliver()
    assert net.lms[0].free == [CAP] * 3 and not net.lms[0].gangs.held
    assert seen.runs == [("x.0", 1)] and len(seen.retries) == 1
    assert [t.task_id for t in gm0.waiting_tasks()] == [f"g.{k}" for k in range(5)]
    net.run()  # x.0 finishes at t=5 (its completion goes to GM 1); the gang's retries do not fit meanwhile
    assert seen.completed == ["x.0"] and [t for t, _ in seen.runs] == ["x.0"]
    _tick(net)  # the LMs' deltas tell GM 0 the node is free again
    net.run()
    assert sorted(seen.completed) == [f"g.{k}" for k in range(5)] + ["x.0"]
    assert all(a == 1 for t, a in seen.runs)


def test_a_lease_never_committed_expires_and_frees_its_resources_and_a_late_commit_is_refused() -> None:
    net, seen = _net([[[[], []]], [[[], []]]])
    gm, lm0 = net.gms[0], net.lms[0]
    net.post(gm.submit(gang("g", 3), 0.0))
    prepare = net.inbox[0].msg
    net.deliver()
    assert lm0.free == [(0, 0), (0, 0)]
    # The GM goes silent (its prepare answer and everything after are lost): the lease's timer fires.
    net.inbox.clear()
    [expiry] = [w for w in net.timers if isinstance(w.msg, LeaseExpiry)]
    assert expiry.at == prepare.lease_s
    net.post(lm0.handle(expiry.msg, expiry.at))
    assert lm0.free == [CAP, CAP] and not lm0.gangs.held and lm0.gangs.expired == 1
    assert all(lm0.nodes.dirty[g] for g in range(len(lm0.nodes.dirty)))  # every GM learns it by delta
    out = lm0.handle(GangCommit(0, 0, prepare.seq, "g"), expiry.at + 1.0)
    [answer] = [o.msg for o in out if isinstance(o.msg, GangCommitted)]
    assert not answer.ok and "no lease" in answer.reason
    assert lm0.launched == 0 and seen.runs == []


def test_a_commit_refused_after_the_lease_expired_stops_the_rest_and_the_gang_runs_again_whole() -> None:
    net, seen = _net([[[[], []]], [[[], []]]])
    gm = net.gms[0]
    net.post(gm.submit(gang("g", 3, duration=2.0), 0.0))
    for _ in range(4):
        net.deliver()  # prepares and their answers
    commit0 = net.take("lm/0", GangCommit)
    net.deliver()  # LM 1 commits: its part launches
    net.deliver()  # (its worker launch)
    # LM 0's lease ran out before its commit arrived.
    lease = net.lms[0].gangs.held[(0, "g")]
    net.now = lease.expires_at
    net.post(net.lms[0].handle(commit0, net.now))
    net.run()
    # LM 1's part was stopped, and the whole gang ran again as its next attempt.
    assert any("refused the commit" in r for r in seen.retries)
    assert sorted(seen.completed) == ["g.0", "g.1", "g.2"]
    assert sorted(t for t, a in seen.runs if a == 2) == ["g.0", "g.1", "g.2"]
    assert all(lm.free == [CAP, CAP] and not lm.gangs.held and not lm.running for lm in net.lms)


def test_a_late_prepare_answer_for_an_abandoned_attempt_is_aborted() -> None:
    net, _ = _net([[[[], []]], [[[], []]]])
    gm = net.gms[0]
    net.post(gm.submit(gang("g", 3), 0.0))
    lm, seq = 0, net.inbox[0].msg.seq
    net.post(gm.call_failed(lm, seq, "LM 0 unreachable", 0.0))  # the GM gave up on the prepare
    assert ("lm/0", "GangAbort") in _pending(net)
    assert [t.task_id for t in gm.waiting_tasks()] == ["g.0", "g.1", "g.2"]


# ------------------------------------------------------------- competition


def test_two_gangs_competing_for_the_same_lms_both_run_without_deadlock() -> None:
    spec = cluster([[[[], []], [[]]], [[[]], [[], []]]])  # 3 nodes on each LM, split between two GMs
    seen = Seen()
    system = EmbeddedSystem(spec, EmbeddedConfig(), seen)
    for g in range(2):
        system.submit(g, gang(f"g{g}", 6, duration=3.0))  # each needs the whole data centre
    system.run()
    assert sorted(seen.completed) == [f"g{g}.{k}" for g in range(2) for k in range(6)]
    _assert_whole(seen, {f"g{g}": 6 for g in range(2)})


def _assert_whole(seen: Seen, sizes: dict[str, int]) -> None:
    """Every attempt of every gang launched all its tasks or none, and every task of an attempt started before
    any of them ended: no part of a gang ever runs without the rest."""
    assert not [t for t in seen.late_starts if t[0].split(".")[0] in sizes]
    by_attempt: defaultdict[tuple[str, int], set[str]] = defaultdict(set)
    for task_id, attempt in seen.runs:
        job = task_id.split(".")[0]
        if job in sizes:
            by_attempt[(job, attempt)].add(task_id)
    for (job, attempt), tasks in by_attempt.items():
        assert len(tasks) == sizes[job], f"gang {job} attempt {attempt} launched only {sorted(tasks)}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=st.lists(
        st.tuples(
            st.booleans(),  # gang?
            st.integers(1, 6),  # tasks
            st.sampled_from([1000, 2000, 4000]),  # CPU per task
            st.floats(0.0, 3.0),  # submitted at
            st.floats(0.1, 4.0),  # duration
            st.integers(0, 1),  # GM
        ),
        min_size=1,
        max_size=10,
    ),
    hop=st.sampled_from([0.0005, 0.05]),
    reserve=st.none() | st.floats(0.1, 3.0),
)
def test_no_gang_ever_runs_partly_and_every_task_ends_once(
    jobs: list[tuple[bool, int, int, float, float, int]], hop: float, reserve: float | None
) -> None:
    """Also with GMs holding LMs for a gang that waited `reserve` seconds (docs/gang.md, "Starvation")."""
    spec = cluster([[[[], []], [[]]], [[[]], [[], []]]])
    seen = Seen()
    system = EmbeddedSystem(spec, EmbeddedConfig(hop_delay=hop, gang_reserve_after=reserve), seen)
    sizes: dict[str, int] = {}
    expected: list[str] = []
    for j, (is_gang, n, cpu, at, duration, g) in enumerate(jobs):
        tasks = tuple(task(f"j{j}.{k}", request=(cpu, 1024), duration=duration) for k in range(n))
        system.submit(g, JobSpec(f"j{j}", tasks, at, gang=INF if is_gang else None))
        if is_gang:
            sizes[f"j{j}"] = n
        expected.extend(t.task_id for t in tasks)
    system.run()
    _assert_whole(seen, sizes)
    assert sorted(seen.completed) == sorted(expected) and not seen.failed
    assert Counter(seen.completed).most_common(1)[0][1] == 1
    assert all(lm.free == lm.capacity and not lm.gangs.held for lm in system.lms)
    assert all(gm.gangs.reservation is None or gm.gangs.reservation.gang is None for gm in system.gms)  # type: ignore[attr-defined]


# ------------------------------------------------------- as a whole: cancel, preempt, timeout


def test_cancelling_a_waiting_gang_drops_every_task() -> None:
    net, seen = _net([[[[]]]])
    gm = net.gms[0]
    net.post(gm.submit(JobSpec("x", (task("x.0", duration=5.0),), 0.0), 0.0))
    net.deliver()  # x.0 runs on the only node
    net.post(gm.submit(gang("g", 1), 0.0))
    assert not any(isinstance(m.msg, GangPrepare) for m in net.inbox)  # no room: it waits
    net.post(gm.cancel(["g.0"], 1.0))
    assert seen.cancelled == ["g.0"] and not gm.waiting_tasks() and not gm.gangs.members
    net.run()
    assert seen.completed == ["x.0"] and ("g.0", 1) not in seen.runs


def test_cancelling_a_running_gang_stops_all_its_tasks() -> None:
    net, seen = _net([[[[], []]], [[[], []]]])
    gm = net.gms[0]
    net.post(gm.submit(gang("g", 3, duration=10.0), 0.0))
    while net.inbox:
        net.deliver()
    assert len(seen.runs) == 3
    net.post(gm.cancel(["g.0", "g.1", "g.2"], 1.0))
    net.run()
    assert sorted(seen.cancelled) == ["g.0", "g.1", "g.2"] and not seen.completed
    assert all(lm.free == [CAP, CAP] and not lm.running for lm in net.lms)


def test_cancelling_a_gang_between_prepare_and_commit_aborts_it() -> None:
    net, seen = _net([[[[], []]], [[[], []]]])
    gm = net.gms[0]
    net.post(gm.submit(gang("g", 3), 0.0))
    net.deliver()  # LM 0 prepared
    net.post(gm.cancel(["g.0", "g.1", "g.2"], 0.0))
    net.run()
    assert sorted(seen.cancelled) == ["g.0", "g.1", "g.2"] and seen.runs == []
    assert all(lm.free == [CAP, CAP] and not lm.gangs.held for lm in net.lms)


def test_a_lost_member_stops_the_rest_and_the_gang_runs_again_as_a_whole() -> None:
    net, seen = _net([[[[], []]], [[[], []]]])
    gm = net.gms[0]
    net.post(gm.submit(gang("g", 3, duration=10.0), 0.0))
    while net.inbox:
        net.deliver()
    lost_node = next(a.placement.node for a in net.lms[1].running.values())
    net.now = 1.0
    net.post(net.lms[1].take_down([lost_node], "worker silent", 1.0))
    net.run()
    # The two others were stopped; all three ran again (attempt 2), on the nodes left.
    assert sorted(t for t, a in seen.runs if a == 2) == ["g.0", "g.1", "g.2"]
    assert sorted(seen.completed) == ["g.0", "g.1", "g.2"] and gm.retries == 1


def test_a_gang_that_waits_longer_than_its_timeout_fails_with_a_reason() -> None:
    net, seen = _net([[[[]]]])
    gm = net.gms[0]
    net.post(gm.submit(JobSpec("x", (task("x.0", duration=5.0),), 0.0), 0.0))
    net.post(gm.submit(gang("g", 1, timeout=2.0), 0.0))
    net.run()
    assert "gang_timeout=2s" in seen.failed["g.0"] and seen.completed == ["x.0"]
    assert ("g.0", 1) not in seen.runs and not gm.gangs.members


def test_a_gang_bigger_than_the_data_centre_is_refused_at_submission() -> None:
    import pytest

    from megha.common.core.gm import Unschedulable

    net, _ = _net([[[[], []]]])
    with pytest.raises(Unschedulable, match="gang needs 12000 cpu"):
        net.gms[0].submit(gang("g", 3), 0.0)


def test_a_job_that_is_no_gang_never_meets_the_gang_machinery() -> None:
    net, seen = _net([[[[], []]], [[[], []]]])
    gm = net.gms[0]
    net.post(gm.submit(JobSpec("j", (task("j.0"), task("j.1"), task("j.2")), 0.0), 0.0))
    assert all(isinstance(m.msg, LaunchBatch) for m in net.inbox)
    net.run()
    assert sorted(seen.completed) == ["j.0", "j.1", "j.2"] and gm.gangs.started == 0


def test_an_abort_for_a_lease_already_gone_is_a_no_op() -> None:
    net, _ = _net([[[[]]]])
    assert net.lms[0].handle(GangAbort(0, 0, 7, "g"), 0.0) == []


def test_a_repeated_prepare_or_commit_is_answered_as_the_first_was() -> None:
    net, _ = _net([[[[], []]]])
    lm = net.lms[0]
    placements = [Placement(task("g.0"), 0, 0, False), Placement(task("g.1"), 0, 1, False)]
    prepare = GangPrepare(0, 0, 1, "g", placements, 10.0)
    first = [o.msg for o in lm.handle(prepare, 0.0) if isinstance(o.msg, GangPrepared)]
    again = [o.msg for o in lm.handle(prepare, 0.1) if isinstance(o.msg, GangPrepared)]
    assert first[0].ok and again[0].ok and lm.free == [(0, 0), (0, 0)]  # reserved once
    commit = GangCommit(0, 0, 1, "g")
    for at in (0.2, 0.3):  # the second is a resend whose first answer was lost
        [answer] = [o.msg for o in lm.handle(commit, at) if isinstance(o.msg, GangCommitted)]
        assert answer.ok
    assert lm.launched == 2 and set(lm.running) == {"g.0", "g.1"}


def test_a_replay_with_gangs_runs_every_task_once() -> None:
    from megha.loadgen.replay import ReplayConfig, replay

    config = ReplayConfig(trace="syn:6:30", lms=2, gms=2, workers_per_partition=2, constraints=False, gangs=0.5)
    result = replay(config)
    assert result.metrics.tasks_completed == 180 and not result.metrics.not_exactly_once
    assert sum(gm.gangs.started for gm in result.system.gms) > 0  # type: ignore[attr-defined]


def test_a_gm_restarted_between_commits_stops_the_launched_part_and_reruns_the_gang_whole() -> None:
    from megha.common.core.gm import GlobalMaster

    net, seen = _net([[[[], []]], [[[], []]]])
    net.post(net.gms[0].submit(gang("g", 3, duration=2.0), 0.0))
    for _ in range(4):
        net.deliver()  # both prepares and their answers: the commits are out
    net.take("lm/0", GangCommit)  # the GM dies: its commit to LM 0 is lost
    net.deliver()  # LM 1 launches its part
    net.inbox = [m for m in net.inbox if not m.dest.startswith("gm/")]  # the old GM hears nothing more
    gm = GlobalMaster(0, cluster([[[[], []]], [[[], []]]]), observer=seen)  # the GM restarted
    net.gms[0] = gm
    running = [a.placement for lm in net.lms for a in lm.running.values()]
    queued = [t for t in gang("g", 3, duration=2.0).tasks if t.task_id not in {p.task.task_id for p in running}]
    assert len(running) == 1 and len(queued) == 2
    states = [lm.full_state(0) for lm in net.lms]
    net.post(gm.recover(states, running, queued, net.now, gangs={"g": INF}))
    assert ("lm/1", "StopRequest") in _pending(net)
    net.run()  # the stop, LM 0's lease running out, and the gang placed again whole
    _tick(net)
    net.run()
    assert sorted(seen.completed) == ["g.0", "g.1", "g.2"]
    assert sorted(t for t, a in seen.runs if a == 2) == ["g.0", "g.1", "g.2"]
    assert all(lm.free == [CAP, CAP] and not lm.gangs.held for lm in net.lms)


def test_an_lm_restarted_between_prepare_and_commit_refuses_the_commit_and_the_gang_reruns_whole() -> None:
    from megha.common.core.lm import LocalMaster

    spec = cluster([[[[], []]], [[[], []]]])
    net, seen = _net([[[[], []]], [[[], []]]])
    gm = net.gms[0]
    net.post(gm.submit(gang("g", 3, duration=2.0), 0.0))
    for _ in range(4):
        net.deliver()  # both LMs prepared; the commits are out
    # LM 0 crashes and comes back (a later incarnation): its lease is gone with it.
    net.lms[0] = LocalMaster(0, spec.partitions[0], spec.resource_names, seen, incarnation=1)
    net.post(net.lms[0].start(net.now))
    net.run()
    _tick(net)
    net.run()
    assert any("refused the commit" in r and "no lease" in r for r in seen.retries)
    # LM 1 had launched its part before LM 0's refusal reached the GM: that part was stopped (never reported
    # finished), and the gang ran again whole as attempt 2 (docs/gang.md, what invariant 3 does not cover).
    assert len([t for t, a in seen.runs if a == 1]) == 1  # the one task placed on LM 1
    assert sorted(t for t, a in seen.runs if a == 2) == ["g.0", "g.1", "g.2"]
    assert sorted(seen.completed) == ["g.0", "g.1", "g.2"] and not seen.late_starts
    assert all(lm.free == [CAP, CAP] and not lm.gangs.held and not lm.running for lm in net.lms)


def test_a_commit_whose_call_failed_stops_the_part_another_lm_launched_before_it_runs_to_its_end() -> None:
    """`megha chaos` gang-lm-kill: LM 0 dies after both LMs prepared, before its commit. The GM's service gives the
    commit up at its first failure (services/gm/dispatch.py, `commit_calls`) rather than trying it until LM 0 is
    back: LM 1's part, launched by its commit, is stopped before it ends (it used to run alone to its end, reported
    finished: a gang run in part), and the gang runs again whole as attempt 2."""
    from megha.common.core.lm import LocalMaster

    spec = cluster([[[[], []]], [[[], []]]])
    net, seen = _net([[[[], []]], [[[], []]]])
    completed: list[tuple[str, int]] = []
    seen.task_completed = lambda task, error, now, forwarded: completed.append((task.task_id, task.attempt))  # type: ignore[method-assign]
    gm = net.gms[0]
    net.post(gm.submit(gang("g", 3, duration=2.0), 0.0))
    for _ in range(4):
        net.deliver()  # both LMs prepared; the commits are out
    commit0 = net.take("lm/0", GangCommit)
    assert isinstance(commit0, GangCommit)
    net.deliver()  # LM 1 commits: its part launches
    net.deliver()  # its worker starts it
    net.now = 0.1  # well before LM 1's part would end (2 s)
    net.post(gm.call_failed(0, commit0.seq, "LM 0 unreachable: connection refused", net.now))
    # LM 0 died with its lease, and comes back (a later incarnation).
    net.lms[0] = LocalMaster(0, spec.partitions[0], spec.resource_names, seen, incarnation=1)
    net.post(net.lms[0].start(net.now))
    net.run()
    _tick(net)
    net.run()
    assert len([t for t, a in seen.runs if a == 1]) == 1  # LM 1's part of attempt 1 launched, was stopped ...
    assert sorted(t for t, a in seen.runs if a == 2) == ["g.0", "g.1", "g.2"]
    assert sorted(completed) == [("g.0", 2), ("g.1", 2), ("g.2", 2)]  # ... and never finished
    assert not seen.late_starts
    assert all(lm.free == [CAP, CAP] and not lm.gangs.held and not lm.running for lm in net.lms)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=st.lists(
        st.tuples(st.integers(1, 5), st.floats(0.0, 4.0), st.floats(0.5, 4.0), st.integers(0, 1)),
        min_size=1,
        max_size=8,
    ),
    crash=st.tuples(st.sampled_from(["gm", "lm"]), st.floats(0.0, 5.0), st.integers(0, 1)),
)
def test_a_gm_or_lm_crash_never_lets_part_of_a_gang_finish_and_loses_nothing(
    jobs: list[tuple[int, float, float, int]], crash: tuple[str, float, int]
) -> None:
    from megha.embedded.faults import Fault, Faults

    spec = cluster([[[[], []], [[]]], [[[]], [[], []]]])
    kind, at, index = crash
    faults = Faults(at=(Fault(kind, at, index, down=1.0),), detect=0.5, repair=1.0)  # type: ignore[arg-type]
    seen = Seen()
    system = EmbeddedSystem(spec, EmbeddedConfig(hop_delay=0.01, faults=faults), seen)
    sizes: dict[str, int] = {}
    for j, (n, at_j, duration, g) in enumerate(jobs):
        tasks = tuple(task(f"j{j}.{k}", request=(2000, 1024), duration=duration) for k in range(n))
        system.submit(g, JobSpec(f"j{j}", tasks, at_j, gang=INF))
        sizes[f"j{j}"] = n
    system.run()
    assert not [t for t in seen.late_starts if t[0].split(".")[0] in sizes]
    # Every task ended once, and every gang's tasks finished in one attempt that started them all.
    assert sorted(seen.completed) == sorted(f"j{j}.{k}" for j, n in enumerate(sizes.values()) for k in range(n))
    assert not seen.failed


@pytest.mark.parametrize("kind", ["gm", "lm"])
@pytest.mark.parametrize("at", [0.015, 0.025, 0.035, 0.045, 0.055, 0.065, 0.075])
def test_a_crash_during_prepare_or_commit_runs_the_gang_whole_once(kind: str, at: float) -> None:
    """Hops of 10 ms: the gang's prepares, answers and commits fall between 0.01 and 0.08 s; GM 0 or LM 0 crashes
    at `at` and is back a second later."""
    from megha.embedded.faults import Fault, Faults

    spec = cluster([[[[], []], [[]]], [[[]], [[], []]]])
    faults = Faults(at=(Fault(kind, at, 0, down=1.0),), detect=0.5, repair=1.0)  # type: ignore[arg-type]
    seen = Seen()
    system = EmbeddedSystem(spec, EmbeddedConfig(hop_delay=0.01, faults=faults), seen)
    system.submit(0, gang("g", 5, duration=3.0))  # five whole nodes: three on one LM, two on the other
    system.run()
    assert system.counters()[f"{kind}_crashes"] == 1
    assert sorted(seen.completed) == [f"g.{k}" for k in range(5)] and not seen.failed
    assert not seen.late_starts
    finished_attempt = {a for t, a in seen.runs}
    assert sorted(t for t, a in seen.runs if a == max(finished_attempt)) == [f"g.{k}" for k in range(5)]
    assert all(lm.free == lm.capacity and not lm.gangs.held for lm in system.lms)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=st.lists(
        st.tuples(st.booleans(), st.integers(1, 5), st.sampled_from([2000, 4000]), st.integers(0, 1)),
        min_size=1,
        max_size=6,
    ),
    order=st.randoms(use_true_random=False),
    cancels=st.dictionaries(st.integers(1, 60), st.integers(0, 5), max_size=2),
)
def test_gangs_stay_whole_whatever_order_messages_arrive_in(  # type: ignore[no-untyped-def]
    jobs: list[tuple[bool, int, int, int]], order, cancels: dict[int, int]
) -> None:
    """Messages delivered in any order (the services' calls run concurrently), deltas now and then, jobs cancelled
    at any step: every task ends once (finished or cancelled), and a gang not cancelled never starts a task after
    another of the same attempt ended (a cancel racing a commit may stop one part before the other starts)."""
    seen = Seen()
    net = Net.build(cluster([[[[], []], [[]]], [[[]], [[], []]]]), observer=seen)
    for lm in net.lms:
        lm.observer = seen
    for w in net.workers:
        w.observer = seen
    sizes: dict[str, int] = {}
    expected: list[str] = []
    for j, (is_gang, n, cpu, g) in enumerate(jobs):
        tasks = tuple(task(f"j{j}.{k}", request=(cpu, 1024), duration=1.0 + j) for k in range(n))
        if is_gang:
            sizes[f"j{j}"] = n
        expected.extend(t.task_id for t in tasks)
        try:
            net.post(net.gms[g].submit(JobSpec(f"j{j}", tasks, 0.0, gang=INF if is_gang else None), 0.0))
        except Exception as exc:  # a job too big for the data centre is refused whole
            assert "gang needs" in str(exc) or "could" in str(exc), exc
            expected = [t for t in expected if not t.startswith(f"j{j}.")]
            sizes.pop(f"j{j}", None)

    def cancel(step: int) -> None:
        if step in cancels and cancels[step] < len(jobs):
            j = cancels[step]
            net.post(net.gms[jobs[j][3]].cancel([f"j{j}.{k}" for k in range(jobs[j][1])], net.now))

    drive_shuffled(net, order, cancel)
    cancelled = {t.split(".")[0] for t in seen.cancelled}
    assert not [t for t in seen.late_starts if t[0].split(".")[0] in sizes.keys() - cancelled]
    ends = seen.completed + seen.cancelled
    assert sorted(ends) == sorted(expected) and len(set(ends)) == len(ends) and not seen.failed
    assert all(lm.free == lm.capacity and not lm.gangs.held for lm in net.lms)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=st.lists(
        st.tuples(st.booleans(), st.integers(1, 5), st.sampled_from([2000, 4000]), st.integers(0, 1)),
        min_size=1,
        max_size=6,
    ),
    order=st.randoms(use_true_random=False),
    losses=st.dictionaries(st.integers(1, 80), st.tuples(st.integers(0, 1), st.integers(0, 2)), max_size=2),
)
def test_gangs_survive_lost_workers_whatever_order_messages_arrive_in(  # type: ignore[no-untyped-def]
    jobs: list[tuple[bool, int, int, int]], order, losses: dict[int, tuple[int, int]]
) -> None:
    """Workers lost (and back 30 steps later) at any step, messages in any order: every task of every gang ends
    once, run to its end or failed after MEGHA_MAX_ATTEMPTS (a member that ran to its end is never run again), and
    the LMs end with everything free and no lease held. (A lost member may stop one part of its gang before another
    part's launch lands: that part is stopped as it starts, and the gang runs again whole.)"""
    seen = Seen()
    net = Net.build(cluster([[[[], []], [[]]], [[[]], [[], []]]]), observer=seen)
    for lm in net.lms:
        lm.observer = seen
    for w in net.workers:
        w.observer = seen
    gang_tasks: list[str] = []
    for j, (is_gang, n, cpu, g) in enumerate(jobs):
        tasks = tuple(task(f"j{j}.{k}", request=(cpu, 1024), duration=1.0 + j) for k in range(n))
        try:
            net.post(net.gms[g].submit(JobSpec(f"j{j}", tasks, 0.0, gang=INF if is_gang else None), 0.0))
        except Exception as exc:  # a gang too big for the data centre is refused whole
            assert "gang needs" in str(exc), exc
            continue
        if is_gang:
            gang_tasks.extend(t.task_id for t in tasks)
    drive_shuffled(net, order, losses=losses)
    ends = [t for t in (*seen.completed, *seen.failed) if t in set(gang_tasks)]
    assert sorted(ends) == sorted(gang_tasks), (sorted(ends), sorted(gang_tasks))
    assert all("MEGHA_MAX_ATTEMPTS" in seen.failed[t] for t in seen.failed if t in set(gang_tasks))
    assert all(lm.free == lm.capacity and not lm.gangs.held for lm in net.lms)


def test_an_older_prepare_overtaken_by_a_newer_one_reserves_nothing() -> None:
    net, _ = _net([[[[], []]]])
    lm = net.lms[0]
    older = GangPrepare(0, 0, 1, "g", [Placement(task("g.0"), 0, 0, False)], 10.0)
    newer = GangPrepare(0, 0, 2, "g", [Placement(task("g.0"), 0, 1, False)], 10.0)
    lm.handle(newer, 0.0)
    [answer] = [o.msg for o in lm.handle(older, 0.1) if isinstance(o.msg, GangPrepared)]
    assert not answer.ok and "superseded" in answer.reason
    assert lm.free == [CAP, (0, 0)] and lm.gangs.held[(0, "g")].seq == 2
