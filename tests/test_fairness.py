"""Global fair scheduling in the core: queues and shares, preemption only under contention and only of users
above their share, LM verification, preempted tasks completing later exactly once, and the share policies'
orderings on hand-computed examples (DRF's classic example; a demand-aware example of our own)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megha.common.core.fairness.config import FairnessConfig, QueueSpec, parse_queues
from megha.common.core.fairness.policy import make_share_policy
from megha.common.core.fairness.verify import LocalShares
from megha.common.core.gm import GlobalMaster, Unschedulable
from megha.common.core.messages import LaunchBatch, PreemptRequest, PreemptResponse, Victim
from megha.common.core.task import JobSpec, TaskSpec
from megha.embedded.system import EmbeddedConfig, EmbeddedSystem
from megha.loadgen.recorder import Recorder

from corekit import CAP, cluster

SLOT = CAP


def t(task_id: str, user: str, duration: float = 10.0, request: tuple[int, ...] = SLOT) -> TaskSpec:
    return TaskSpec(task_id, task_id.split(".")[0], user, duration, request, 0)


def two_users(shares: tuple[float, float] = (0.5, 0.5), policy: str = "share") -> FairnessConfig:
    return FairnessConfig((QueueSpec("A", shares[0], 0), QueueSpec("B", shares[1], 1)), policy)


def system(nodes_per_partition: int, fairness: FairnessConfig) -> tuple[EmbeddedSystem, Recorder]:
    spec = cluster([[[[]] * nodes_per_partition, [[]] * nodes_per_partition]])  # 1 LM, 2 GMs
    recorder = Recorder()
    return EmbeddedSystem(spec, EmbeddedConfig(fairness=fairness), recorder), recorder


def run(sys_: EmbeddedSystem, recorder: Recorder, *submissions: tuple[int, JobSpec]) -> None:
    for gm, job in submissions:
        recorder.expect(gm, job)
        sys_.submit(gm, job)
    sys_.run()


def job(job_id: str, user: str, n: int, at: float, duration: float = 10.0) -> JobSpec:
    return JobSpec(job_id, tuple(t(f"{job_id}.{i}", user, duration) for i in range(n)), at)


def assert_all_completed_once(recorder: Recorder, sys_: EmbeddedSystem) -> None:
    assert all(r.completions == 1 for r in recorder.tasks.values()), {
        r.task_id: r.completions for r in recorder.tasks.values() if r.completions != 1
    }
    assert all(lm.is_idle() for lm in sys_.lms)


def test_a_user_below_its_share_preempts_the_user_over_its_share_under_contention() -> None:
    sys_, rec = system(2, two_users())  # 4 slots; A (GM 0) takes all four, then B (GM 1) arrives
    run(sys_, rec, (0, job("a", "A", 4, 0.0, duration=100.0)), (1, job("b", "B", 2, 1.0)))
    a_runs = [rec.tasks[f"a.{i}"] for i in range(4)]
    b_runs = [rec.tasks[f"b.{i}"] for i in range(2)]
    assert sum(r.preemptions for r in a_runs) == 2 and all(r.preemptions == 0 for r in b_runs)
    assert all(r.started_at < 1.01 for r in b_runs), "B waited although it was below its share"
    preempted = [r for r in a_runs if r.preemptions]
    # Work lost: each preempted A task had run about 1 s of its 100 s on a full 4-core slot.
    assert all(3.9 < r.lost_cpu_seconds < 4.1 for r in preempted)
    # A is at its share once B runs, so it cannot preempt back: its stopped tasks wait for B's to finish.
    assert all(r.started_at >= 11.0 for r in preempted)
    assert sys_.counters()["preemptions"] == 2
    assert_all_completed_once(rec, sys_)


def test_no_preemption_without_contention() -> None:
    sys_, rec = system(4, two_users())  # 8 slots: A's 4 tasks leave room for B's
    run(sys_, rec, (0, job("a", "A", 4, 0.0, duration=100.0)), (1, job("b", "B", 2, 1.0)))
    assert sys_.counters()["preemption_attempts"] == 0
    assert all(r.preemptions == 0 for r in rec.tasks.values())
    assert_all_completed_once(rec, sys_)


def test_a_user_at_its_share_cannot_cause_preemption() -> None:
    sys_, rec = system(2, two_users())
    run(
        sys_,
        rec,
        (0, job("a", "A", 2, 0.0, duration=50.0)),
        (1, job("b", "B", 2, 0.0, duration=50.0)),
        (0, job("a2", "A", 1, 1.0)),  # A holds exactly its share: it waits, B keeps running
    )
    assert sys_.counters()["preemption_attempts"] == 0
    assert rec.tasks["a2.0"].started_at >= 50.0
    assert_all_completed_once(rec, sys_)


def test_a_user_over_its_share_never_preempts_and_never_loses_to_itself() -> None:
    sys_, rec = system(2, two_users())
    run(sys_, rec, (0, job("a", "A", 4, 0.0, duration=20.0)), (0, job("a2", "A", 2, 1.0)))
    assert sys_.counters()["preemption_attempts"] == 0
    assert all(r.preemptions == 0 for r in rec.tasks.values())
    assert_all_completed_once(rec, sys_)


def test_the_lm_refuses_a_victim_that_is_not_over_its_share_and_the_gm_requeues() -> None:
    spec = cluster([[[[]], [[]]]])
    fairness = two_users()
    gm = GlobalMaster(1, spec, fairness=fairness)
    total = spec.total_capacity()
    lm_shares = LocalShares(fairness, 2, make_share_policy("share"))
    lm_shares.started(t("a.0", "A"), 0)  # A holds one of two nodes: exactly its share
    waiting = t("b.0", "B")
    plan = lm_shares.plan(waiting, [Victim("A", (0, 0))], [(0, 0), (0, 0)], [0, 0], total)
    assert plan == "A: not over its share"
    own = lm_shares.plan(t("a.1", "A"), [Victim("A", (9000, 9000))], [(0, 0)], [0], total)
    assert "never preempts its own" in str(own)
    # The GM side: a refused request puts the task back among its shape's waiting tasks.
    gm.book.report(0, {"A": (2 * SLOT[0], 2 * SLOT[1])})  # type: ignore[union-attr]  # stale: A looks over share
    for view in gm.views[0]:
        view.set_free(0, (0, 0))
    out = gm.submit(JobSpec("b", (waiting,), 0.0), 0.0)
    (request,) = [o.msg for o in out if isinstance(o.msg, PreemptRequest)]
    assert request.victims == [Victim("A", (0, 0))]
    gm.handle(PreemptResponse(1, 0, request.seq, waiting, None, [], "A: not over its share", [], _delta()), 0.1)
    assert gm.waiting_tasks() == [waiting] and gm.book.usage("B") == (0, 0)  # type: ignore[union-attr]


def _delta():  # type: ignore[no-untyped-def]
    from megha.common.core.messages import Delta

    return Delta(0, 1, 0, [], {"A": SLOT})


def test_a_gm_refuses_users_whose_queue_it_does_not_serve() -> None:
    spec = cluster([[[[]], [[]]]])
    gm = GlobalMaster(0, spec, fairness=two_users())
    with pytest.raises(Unschedulable, match="queue is served by GM 1"):
        gm.submit(JobSpec("b", (t("b.0", "B"),), 0.0), 0.0)
    with pytest.raises(Unschedulable, match="has no queue"):
        gm.submit(JobSpec("c", (t("c.0", "C"),), 0.0), 0.0)


def test_queue_configuration_is_validated() -> None:
    assert parse_queues("q1:10%:0,q2:0.25:1").queues == (QueueSpec("q1", 0.10, 0), QueueSpec("q2", 0.25, 1))
    with pytest.raises(ValueError, match="add up to"):
        parse_queues("a:0.7:0,b:0.7:1")
    with pytest.raises(ValueError, match="configured twice"):
        parse_queues("a:0.2:0,a:0.2:1")
    with pytest.raises(ValueError, match="user:share:gm"):
        parse_queues("a:0.2")
    with pytest.raises(ValueError, match="mapped to GM 3"):
        parse_queues("a:0.2:3").check_gms(2)


# ------------------------------------------------------------------- policies on hand-computed examples


def dispatch_order(policy: str, node: tuple[int, int], tasks: list[TaskSpec]) -> list[str]:
    """Users in the order one GM serving queues A and B places `tasks` (all queued at once) on one node."""
    spec = cluster([[[[]]]], capacity=node)
    gm = GlobalMaster(0, spec, fairness=FairnessConfig((QueueSpec("A", 0.5, 0), QueueSpec("B", 0.5, 0)), policy))
    (out,) = gm.submit(JobSpec("j", tuple(tasks), 0.0), 0.0)
    assert isinstance(out.msg, LaunchBatch)
    return [p.task.user for p in out.msg.placements]


def test_drf_gives_the_classic_example_three_tasks_to_a_and_two_to_b() -> None:
    # DRF paper: 9 CPUs and 18 GB; A's tasks need <1 CPU, 4 GB>, B's <3 CPUs, 1 GB>.
    # Dominant shares after each pick (ties go to the queue next in round-robin order):
    # A 0=B 0 -> A (A: 4/18=.22) ; B 0 < A .22 -> B (B: 3/9=.33) ; A .22 < .33 -> A (.44) ;
    # B .33 < .44 -> B (.67) ; A .44 < .67 -> A (.67) ; now 9 CPUs are used and nothing more fits.
    tasks = [t(f"j.a{i}", "A", request=(1000, 4096)) for i in range(10)]
    tasks += [t(f"j.b{i}", "B", request=(3000, 1024)) for i in range(10)]
    assert dispatch_order("drf", (9000, 18432), tasks) == ["A", "B", "A", "B", "A"]


def test_demand_aware_ordering_serves_the_largest_pending_demand_first() -> None:
    # One node of 8 CPUs, 8 GB. A queues 6 tasks of <1 CPU, 1 GB>, B 2 tasks of <2 CPUs, 2 GB>.
    # Dominant demand shares (DDS) before each pick, ties to the queue next in round-robin order:
    # A 6/8=.75 > B 4/8=.5 -> A (.625) ; B .5 < A .625 -> A (.5) ; B .5 = A .5, B next -> B (.25) ;
    # A .5 > B .25 -> A (.375) ; B .25 < A .375 -> A (.25) ; B .25 = A .25, B next -> B (0): 8 CPUs used.
    tasks = [t(f"j.a{i}", "A", request=(1000, 1024)) for i in range(6)]
    tasks += [t(f"j.b{i}", "B", request=(2000, 2048)) for i in range(2)]
    assert dispatch_order("demand", (8000, 8192), tasks) == ["A", "A", "B", "A", "A", "B"]
    # The paper's policy serves the queues round-robin.
    assert dispatch_order("share", (8000, 8192), tasks) == ["A", "B", "A", "B", "A", "A"]
    # Demand-DRF factor DDS - DS/share: A .75 > B .5 -> A (.625-.25=.375) ; B .5 > .375 -> B (.25-.5=-.25) ;
    # A .375 -> A (.5-.5=0) ; B -.25 < A 0 -> A (.375-.75=-.375) ; B -.25 > -.375 -> B (0-1=-1) ; A -> A.
    assert dispatch_order("demand-drf", (8000, 8192), tasks) == ["A", "B", "A", "A", "B", "A"]


# ------------------------------------------------------------------------- random interleavings


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    weights=st.lists(st.integers(1, 4), min_size=2, max_size=3),
    jobs=st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 4), st.floats(0, 5), st.sampled_from([0.5, 2.0, 7.0])),
        min_size=1,
        max_size=8,
    ),
)
def test_random_contention_preempts_only_users_over_their_share_and_loses_nothing(
    weights: list[int], jobs: list[tuple[int, int, float, float]]
) -> None:
    """With one LM, its verification is exact: every victim's user must truly be above its share."""
    queues = tuple(QueueSpec(f"u{k}", w / sum(weights), k % 2) for k, w in enumerate(weights))
    fairness = FairnessConfig(queues, "share")
    sys_, rec = system(2, fairness)
    lm = sys_.lms[0]
    checks: list[str] = []
    handle = lm.handle

    def checked(msg: object, now: float):  # type: ignore[no-untyped-def]
        if isinstance(msg, PreemptRequest):
            shares = lm.shares
            assert shares is not None
            before = {u: shares.policy.consumption(tuple(v), msg.total) for u, v in shares._usage.items()}
            out = handle(msg, now)
            resp = out[0].msg
            for task_id in resp.preempted:
                victim = lm.preempting[task_id].placement.task.user
                if victim == msg.task.user:
                    checks.append(f"{msg.task.user} preempted its own task {task_id}")
                if before[victim] <= fairness.shares()[victim]:
                    checks.append(f"{victim} preempted at {before[victim]:.2f} <= share")
            return out
        return handle(msg, now)

    lm.handle = checked  # type: ignore[method-assign]
    sys_.loop._endpoints["lm/0"] = checked
    subs = []
    for k, (q, n, at, duration) in enumerate(jobs):
        queue = queues[q % len(queues)]
        subs.append((queue.gm, job(f"j{k}", queue.user, n, at, duration)))
    run(sys_, rec, *subs)
    assert checks == []
    assert_all_completed_once(rec, sys_)
