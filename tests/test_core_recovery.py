"""Core recovery paths after a GM or LM crash (`megha.common.core.recovery`): a restarted GM launches again only
what neither runs nor ended, and a waiting completion ends its task through the usual path; a rebuilt LM's states
win over the crashed incarnation's, a run that ended while it was down reaches its GM, and a run whose worker was
lost meanwhile runs again."""

from __future__ import annotations

from megha.common.core.gm import GlobalMaster
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import (
    Completion,
    Completions,
    Delta,
    EndedRun,
    FinishedTask,
    LaunchBatch,
    Placement,
    WorkerLaunch,
    WorkerReport,
    node_state,
)
from megha.common.core.node_table import VERSION_BITS
from megha.common.core.recovery import LMReport, lm_report, plan_recovery, runs_held, runs_lost

from corekit import CAP, cluster, job, task


def _launched(lm: LocalMaster, outputs: list, now: float) -> list[Placement]:  # type: ignore[type-arg]
    """Hand the GM's launch batches to `lm`; return what it launched on its workers."""
    launched = []
    for batch in (o.msg for o in outputs if isinstance(o.msg, LaunchBatch)):
        for out in lm.handle(batch, now):
            if isinstance(out.msg, WorkerLaunch):
                launched += out.msg.launches
    return launched


def _completions(outputs: list) -> Completions:  # type: ignore[type-arg]
    (msg,) = [o.msg for o in outputs if isinstance(o.msg, Completions)]
    return msg


def test_a_plan_runs_what_lms_run_queues_the_rest_and_leaves_ended_tasks_alone() -> None:
    a, b, c, d, e = (task(f"j.{k}") for k in range(5))
    report = LMReport(
        Delta(0, 0, 7, [node_state((0, CAP, 1))]),
        [Placement(a, 0, 0, False, 0), Placement(task("other.0"), 0, 1, False, 0)],
        [EndedRun("j.2", 1, 2), EndedRun("j.3", 1, 3, "exit 1")],
    )
    plan = plan_recovery(0, [a, b, c, d, e], {"j.3", "j.4"}, [report])
    assert [p.task.task_id for p in plan.running] == ["j.0"]  # a run of a task the GM never accepted is ignored
    assert [t.task_id for t in plan.queued] == ["j.1"]
    assert plan.ended == {"j.2": ""}  # j.3's end is already recorded
    assert plan.deltas == [report.delta]


def test_a_remembered_end_of_a_job_with_a_retry_rule_is_replayed_through_the_gm_not_recorded() -> None:
    """The GM's records cannot say whether such an end was decided (a gang's finished member may have been held,
    a failure not yet retried): its run counts as running and its completion is replayed, exit code and all;
    a waiting completion of the same run wins, and other jobs' remembered ends are recorded as before."""
    a, b, c, d = task("r.0"), task("r.1"), task("r.2"), task("j.0")
    ended = [EndedRun("r.0", 1, 2), EndedRun("r.1", 1, 3, "exit 3", 3), EndedRun("r.2", 1, 1), EndedRun("j.0", 1, 0)]
    backlog = [Completions(0, 0, 0, [Completion("r.2", node_state((1, CAP, 9)))])]
    plan = plan_recovery(0, [a, b, c, d], set(), [LMReport(Delta(0, 0, 5), [], ended)], backlog, ruled={"r"})
    assert plan.ended == {"j.0": ""} and plan.queued == []
    assert [(p.task.task_id, p.lm, p.node) for p in plan.running] == [("r.2", 0, 1), ("r.0", 0, 2), ("r.1", 0, 3)]
    (replayed,) = plan.replayed
    assert [(c.task_id, c.state.node, c.state.version, c.error, c.exit_code) for c in replayed.items] == [
        ("r.0", 2, 0, "", None),
        ("r.1", 3, 0, "exit 3", 3),
    ]


def test_a_completion_that_waited_for_the_gm_makes_its_run_count_as_running() -> None:
    a, b = task("j.0"), task("j.1")
    state = node_state((3, CAP, 9))
    backlog = [
        Delta(1, 0, 0),
        Completions(1, 0, 0, [Completion("j.0", state, lost=True, attempt=2), Completion("j.1", state)]),
    ]
    remembered = LMReport(Delta(1, 0, 0), [], [EndedRun("j.1", 1, 3)])
    plan = plan_recovery(0, [a, b], set(), [remembered], backlog)
    assert [(p.task.task_id, p.task.attempt, p.lm, p.node) for p in plan.running] == [
        ("j.0", 2, 1, 3),
        ("j.1", 1, 1, 3),
    ]
    assert plan.queued == [] and plan.ended == {}  # j.1's completion ends it, not the LM's memory


def test_a_restarted_gm_launches_only_what_neither_runs_nor_ended_and_a_waiting_completion_ends_its_task() -> None:
    spec = cluster([[[[], [], []]]])  # one LM, one GM, three nodes
    lm = LocalMaster(0, spec.partitions[0], ended_runs_kept=10)
    gm = GlobalMaster(0, spec)
    tasks = [task(f"j.{k}", duration=10.0) for k in range(4)]
    launched = _launched(lm, gm.submit(job("j", *tasks), 0.0), 0.1)
    assert len(launched) == 3 and len(gm.queue) + len(gm.waiting_tasks()) == 1  # three nodes, four tasks
    by_id = {p.task.task_id: p for p in launched}
    first, second = sorted(by_id)[:2]
    gm.handle(_completions(lm.handle(WorkerReport(0, [FinishedTask(first, by_id[first].node)]), 5.0)), 5.0)
    # The GM crashes; the run of `second` ends while it is down: its completion waits in the GM's queue.
    waiting = lm.handle(WorkerReport(0, [FinishedTask(second, by_id[second].node)]), 6.0)
    journal_ended = {first}
    plan = plan_recovery(0, tasks, journal_ended, [lm_report(lm, 0)], [_completions(waiting)])
    restarted = GlobalMaster(0, spec)
    out = restarted.recover(plan.deltas, plan.running, plan.queued, 7.0)
    relaunched = _launched(lm, out, 7.1)
    never_ran = {t.task_id for t in tasks} - set(by_id)
    assert [p.task.task_id for p in relaunched] == sorted(never_ran)  # nothing running or finished again
    restarted.handle(_completions(waiting), 7.2)
    assert set(restarted.running) == set(by_id) - {first, second}  # the relaunched task awaits its response


def test_a_rebuilt_lm_adopts_its_workers_runs_and_gms_take_its_states_as_newer() -> None:
    spec = cluster([[[[], []]]])
    gm = GlobalMaster(0, spec)
    lm = LocalMaster.in_cluster(spec, 0)
    out = gm.submit(job("j", task("j.0", duration=10.0), task("j.1", duration=1.0)), 0.0)
    (batch,) = [o.msg for o in out if isinstance(o.msg, LaunchBatch)]
    answered = lm.handle(batch, 0.1)
    gm.handle(answered[0].msg, 0.2)  # the launch response
    (launch,) = [o.msg for o in answered if isinstance(o.msg, WorkerLaunch)]
    launched = launch.launches
    assert set(gm.running) == {"j.0", "j.1"}
    # The LM crashes; j.1 ends while it is down (its report waits) and j.0 runs on.
    short = next(p for p in launched if p.task.task_id == "j.1")
    long = next(p for p in launched if p.task.task_id == "j.0")
    rebuilt = LocalMaster(0, spec.partitions[0], incarnation=1)
    rebuilt.adopt([long])
    assert rebuilt.free[long.node] == tuple(c - r for c, r in zip(CAP, long.task.request))
    started = rebuilt.start(2.0)
    assert started  # it reports every node to every GM on its next delta
    ticked = rebuilt.handle(started[0].msg, 3.0)
    (delta,) = [o.msg for o in ticked if isinstance(o.msg, Delta)]
    assert min(s.version for s in delta.nodes) > max(lm.version) and min(s.version for s in delta.nodes) >= 1 << 20
    gm.handle(delta, 3.0)
    # The waiting report is of a run the rebuilt LM did not place: it is forwarded to the GM named in it.
    forwarded = _completions(rebuilt.handle(WorkerReport(0, [FinishedTask("j.1", short.node, gm=0)]), 3.1))
    assert [(c.task_id, c.forwarded) for c in forwarded.items] == [("j.1", True)]
    gm.handle(forwarded, 3.2)
    assert set(gm.running) == {"j.0"}
    assert runs_lost(gm.running, runs_held(rebuilt, 0)) is None  # it holds every run the GM knows of
    done = _completions(rebuilt.handle(WorkerReport(0, [FinishedTask("j.0", long.node, gm=0)]), 10.1))
    gm.handle(done, 10.2)
    assert gm.running == {} and rebuilt.is_idle()
    assert rebuilt.incarnation << VERSION_BITS <= min(rebuilt.version)


def test_a_run_whose_worker_was_lost_while_its_lm_was_down_runs_again_as_its_next_attempt() -> None:
    spec = cluster([[[[], []]]])
    gm = GlobalMaster(0, spec)
    lm = LocalMaster.in_cluster(spec, 0)
    out = gm.submit(job("j", task("j.0", duration=10.0)), 0.0)
    (batch,) = [o.msg for o in out if isinstance(o.msg, LaunchBatch)]
    for o in lm.handle(batch, 0.1):
        if not isinstance(o.msg, WorkerLaunch):
            gm.handle(o.msg, 0.1)
    assert set(gm.running) == {"j.0"}
    # The LM crashes and the run's worker dies with its run: the rebuilt LM adopts nothing.
    rebuilt = LocalMaster(0, spec.partitions[0], incarnation=1)
    held = runs_held(rebuilt, 0)
    lost = runs_lost(gm.running, held)
    assert lost is not None and [(c.task_id, c.lost, c.attempt) for c in lost.items] == [("j.0", True, 1)]
    relaunch = [o.msg for o in gm.handle(lost, 2.0) if isinstance(o.msg, LaunchBatch)]
    assert [(p.task.task_id, p.task.attempt) for b in relaunch for p in b.placements] == [("j.0", 2)]
    assert gm.retries == 1


def test_an_lm_report_counts_a_run_being_preempted_as_held() -> None:
    spec = cluster([[[[], []]]])
    lm = LocalMaster(0, spec.partitions[0], ended_runs_kept=10)
    victim = Placement(task("v.0"), 0, 0, False, 0)
    lm.adopt([victim])
    lm.preempting["v.0"] = lm.running.pop("v.0")  # stopped for another task; its worker has not confirmed
    assert [p.task.task_id for p in lm_report(lm, 0).running] == ["v.0"]
    assert runs_held(lm, 0).task_ids == frozenset({"v.0"})
    lm.handle(WorkerReport(0, [FinishedTask("v.0", 0, preempted=True)]), 1.0)
    assert lm_report(lm, 0).running == [] and lm_report(lm, 0).ended == []  # a preempted run did not end


def test_the_attempt_of_a_waiting_loss_is_kept_so_the_task_is_not_retried_past_its_limit() -> None:
    spec = cluster([[[[], []]]])
    t = task("j.0", duration=5.0)
    lost = Completions(0, 0, 0, [Completion("j.0", node_state((1, CAP, 3)), "gone", lost=True, attempt=2)])
    plan = plan_recovery(0, [t], set(), [LMReport(Delta(0, 0, 0), [], [])], [lost])
    gm = GlobalMaster(0, spec, max_attempts=2)
    gm.recover(plan.deltas, plan.running, plan.queued, 1.0)
    assert gm.handle(lost, 1.0) == [] and gm.running == {} and not gm.queue and not gm.waiting
