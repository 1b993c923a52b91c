"""Priority classes in the core: the queue order (higher classes first, FIFO or fair share within a class),
priority preemption chosen by the GM and verified by the LM (lowest classes first, fewest victims, refused when no
victim is lower), its interplay with fair share, and the no-loop property of the two preemptions together."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from megha.common.core.fairness.config import FairnessConfig, QueueSpec
from megha.common.core.fairness.policy import make_share_policy
from megha.common.core.fairness.verify import LocalShares
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import LaunchBatch, Placement, PreemptRequest, Victim, WorkerPreempt
from megha.common.core.policies import gm_policies
from megha.common.core.policies.fair_share import FairQueueOrder
from megha.common.core.policies.preemption import PreemptionPlan
from megha.common.core.policies.priority import (
    ClassBook,
    PreemptionChain,
    PriorityOrder,
    PriorityPreemption,
    parse_priority_classes,
)
from megha.common.core.policies.priority_verify import ClassVictims, LocalClasses
from megha.common.core.task import JobSpec, TaskSpec
from megha.embedded.system import EmbeddedConfig, EmbeddedSystem
from megha.loadgen.recorder import Recorder

from corekit import CAP, cluster

HALF = (CAP[0] // 2, CAP[1] // 2)
LOW, NORMAL, HIGH = 0, 100, 1000


def t(task_id: str, priority: int, user: str = "A", duration: float = 10.0, request: tuple[int, ...] = CAP) -> TaskSpec:
    return TaskSpec(task_id, task_id.split(".")[0], user, duration, request, 0, priority=priority)


def job(job_id: str, n: int, priority: int, at: float, user: str = "A", duration: float = 10.0) -> JobSpec:
    return JobSpec(job_id, tuple(t(f"{job_id}.{i}", priority, user, duration) for i in range(n)), at)


# ---------------------------------------------------------------- classes


def test_priority_classes_parse_with_normal_as_the_default() -> None:
    classes = parse_priority_classes("low:0, normal:100,high:1000")
    assert classes.value(None) == 100
    assert classes.value("high") == 1000
    assert classes.name_of(0) == "low"
    assert parse_priority_classes("batch:5,urgent:50").default == "batch"  # no `normal`: the lowest
    with pytest.raises(KeyError, match="unknown priority class 'top'"):
        classes.value("top")
    for bad in ("", "low", "low:x", "a:1,a:2", "neg:-1", f"huge:{10**18}"):  # a delta keys usage by 18 digits
        with pytest.raises(ValueError):
            parse_priority_classes(bad)


# ------------------------------------------------------------ queue order


def test_higher_classes_are_served_first_and_fifo_within_a_class() -> None:
    queue = PriorityOrder().new_queue()
    queue.extend([t("a", LOW), t("b", HIGH), t("c", NORMAL), t("d", HIGH), t("e", LOW)])
    queue.extendleft([t("r", LOW)])  # a preempted low task goes to the front of its own class only
    queue.push_back(t("f", HIGH))
    assert len(queue) == 7
    assert [x.task_id for x in queue] == ["b", "d", "f", "c", "r", "a", "e"]
    assert [queue.popleft().task_id for _ in range(7)] == ["b", "d", "f", "c", "r", "a", "e"]
    with pytest.raises(IndexError):
        queue.popleft()


def test_fair_share_orders_users_within_a_class_not_across_classes() -> None:
    fairness = FairnessConfig((QueueSpec("A", 0.5, 0), QueueSpec("B", 0.5, 0)), "drf")
    policies = gm_policies(0, cluster([[[[]] * 4]]), fairness, priority_classes=True)
    order = policies.queue_order
    assert isinstance(order, PriorityOrder) and isinstance(order.base, FairQueueOrder)
    queue = order.new_queue()
    queue.extend([t("a1", LOW, "A"), t("a2", LOW, "A"), t("b1", LOW, "B"), t("a3", HIGH, "A"), t("a4", HIGH, "A")])
    order.base.book.placed(t("x", LOW, "A"), 0)  # A now holds a slot: among the low tasks, B goes first
    served = [queue.popleft().task_id for _ in range(5)]
    assert served[:2] == ["a3", "a4"]  # the high class first, whatever A's usage
    assert served[2] == "b1"
    assert queue.remove_if(lambda x: True) == [] and len(queue) == 0


# ----------------------------------------------------- LM verification


def local(*running: tuple[TaskSpec, int]) -> LocalClasses:
    classes = LocalClasses(2)
    for task, node in running:
        classes.started(task, node)
    return classes


def test_the_lm_picks_the_lowest_classes_then_the_fewest_victims() -> None:
    classes = local(
        (t("n.0", NORMAL, request=HALF), 0),
        (t("l.0", LOW, request=HALF), 0),
        (t("l.1", LOW, request=HALF), 1),
        (t("l.2", LOW, request=HALF), 1),
        (t("n.1", NORMAL), 2),
    )
    free = [(0, 0)] * 3
    masks = [0] * 3
    # Node 1 needs two low victims, node 0 a normal one, node 2 one normal: lowest highest class first.
    assert classes.plan(t("h", HIGH), free, masks) == ClassVictims(1, ("l.2", "l.1"))
    # A half-node task: one low victim on node 0 or 1; fewest victims, then the lowest node.
    assert classes.plan(t("h", HIGH, request=HALF), free, masks) == ClassVictims(0, ("l.0",))
    assert classes.snapshot() == {NORMAL: (CAP[0] * 3 // 2, CAP[1] * 3 // 2), LOW: (CAP[0] * 3 // 2, CAP[1] * 3 // 2)}


def test_the_lm_refuses_when_no_running_task_is_strictly_lower() -> None:
    classes = local((t("n.0", NORMAL), 0), (t("h.0", HIGH), 1))
    reason = classes.plan(t("n", NORMAL), [(0, 0), (0, 0)], [0, 0])
    assert isinstance(reason, str) and "below priority 100" in reason
    classes.ended(t("n.0", NORMAL), 0)  # once ended, it is no victim either
    assert classes.snapshot() == {HIGH: CAP}


def test_the_lm_never_takes_victims_on_nodes_lacking_the_tasks_constraints() -> None:
    classes = local((t("l.0", LOW), 0))
    constrained = replace(t("h", HIGH), constraints=0b100)
    assert isinstance(classes.plan(constrained, [(0, 0)], [0b011]), str)
    assert classes.plan(constrained, [(0, 0)], [0b111]) == ClassVictims(0, ("l.0",))


def test_fair_share_verification_never_takes_a_task_of_a_higher_class() -> None:
    fairness = FairnessConfig((QueueSpec("A", 0.25, 0), QueueSpec("B", 0.75, 0)))
    shares = LocalShares(fairness, 2, make_share_policy("share"))
    total = (CAP[0] * 4, CAP[1] * 4)
    for k in range(3):
        shares.started(t(f"a.{k}", HIGH, "A"), k)  # A holds 3/4, far over its 1/4 share, all in the high class
    plan = shares.plan(t("b", NORMAL, "B"), [Victim("A", (0, 0))], [(0, 0)] * 4, [0] * 4, total)
    assert isinstance(plan, str)
    shares.started(t("a.3", NORMAL, "A"), 3)
    plan = shares.plan(t("b", NORMAL, "B"), [Victim("A", (0, 0))], [(0, 0)] * 4, [0] * 4, total)
    assert not isinstance(plan, str) and plan.task_ids == ("a.3",)


def test_the_local_master_preempts_a_lower_class_and_refuses_when_none_is_lower() -> None:
    spec = cluster([[[[]]]])  # one LM, one GM, one node
    lm = LocalMaster.in_cluster(spec, 0, priority_classes=True)
    lm.handle(LaunchBatch(0, 0, 1, [Placement(t("n.0", NORMAL), 0, 0, False)]), 0.0)
    total = spec.total_capacity()
    refused = lm.handle(PreemptRequest(0, 0, 2, t("m.0", NORMAL), [], total), 1.0)[0].msg
    assert refused.placement is None and "below priority 100" in refused.reason
    assert lm.preemption_refusals == 1 and "n.0" in lm.running
    granted = lm.handle(PreemptRequest(0, 0, 3, t("h.0", HIGH), [], total), 2.0)
    assert granted[0].msg.preempted == ["n.0"] and granted[0].msg.placement.node == 0
    assert set(lm.running) == {"h.0"} and set(lm.preempting) == {"n.0"}
    assert any(isinstance(o.msg, WorkerPreempt) and o.msg.task_ids == ["n.0"] for o in granted)
    assert lm.full_state(0).priority_usage == {HIGH: CAP}  # reported to the GMs in deltas


# ------------------------------------------------------------ GM's choice


def test_the_gm_asks_the_lm_with_the_lowest_class_that_could_make_room() -> None:
    book = ClassBook(3, (CAP[0] * 6, CAP[1] * 6))
    policy = PriorityPreemption(book)
    assert policy.plan(t("h", HIGH), None) is None  # nothing reported: nothing to preempt
    book.report(0, {NORMAL: CAP})
    book.report(1, {LOW: HALF, HIGH: CAP})  # too little of a lower class for a whole node
    book.report(2, {LOW: CAP})
    plan = policy.plan(t("h", HIGH), None)
    assert plan is not None and (plan.lm, plan.rest, plan.victims) == (2, [0], [])
    assert policy.plan(t("n", NORMAL), None).lm == 2  # type: ignore[union-attr]
    assert policy.plan(t("l", LOW), None) is None  # nothing is below the lowest class


class Fixed:
    """A preemption policy with one answer per LM list (None: any LM)."""

    name = "fixed"

    def __init__(self, plans: dict[tuple[int, ...] | None, PreemptionPlan]) -> None:
        self.plans = plans
        self.asked: list[list[int] | None] = []

    def plan(self, task: TaskSpec, lms: list[int] | None) -> PreemptionPlan | None:
        self.asked.append(lms)
        return self.plans.get(None if lms is None else tuple(lms))

    def retry(self, parked: object, asking: object, attempt: object) -> None: ...


def test_the_chain_takes_the_lm_of_the_first_plan_and_the_victims_each_policy_names_there() -> None:
    victim = Victim("A", (0, 0))
    first = Fixed({None: PreemptionPlan(1, [2], [], CAP)})
    elsewhere = PreemptionPlan(0, [], [Victim("B", (1, 1))], CAP)
    second = Fixed({None: elsewhere, (1,): PreemptionPlan(1, [], [victim], CAP)})
    chain = PreemptionChain([first, second])  # type: ignore[list-item]
    assert chain.name == "fixed+fixed"
    assert chain.plan(t("h", HIGH), None) == PreemptionPlan(1, [2], [victim], CAP)
    assert second.asked == [[1]]  # asked about the first plan's LM only
    only_second = PreemptionChain([Fixed({}), second])  # type: ignore[list-item]
    assert only_second.plan(t("h", HIGH), None) == elsewhere
    assert PreemptionChain([Fixed({})]).plan(t("h", HIGH), None) is None  # type: ignore[list-item]


# ------------------------------------------------------- whole system


def system(nodes: int, fairness: FairnessConfig | None = None, gms: int = 1) -> tuple[EmbeddedSystem, Recorder]:
    spec = cluster([[[[]] * nodes for _ in range(gms)]])  # 1 LM
    recorder = Recorder()
    config = EmbeddedConfig(fairness=fairness, priority_classes=True)
    return EmbeddedSystem(spec, config, recorder), recorder


def run(sys_: EmbeddedSystem, recorder: Recorder, *submissions: tuple[int, JobSpec]) -> None:
    for gm, submitted in submissions:
        recorder.expect(gm, submitted)
        sys_.submit(gm, submitted)
    sys_.run()


def finish(recorder: Recorder, task_id: str) -> float:
    c = recorder.tasks.columns
    return float(c["finished_at"][recorder.tasks.number[task_id]])


def preemptions(recorder: Recorder, task_id: str) -> int:
    return int(recorder.tasks.columns["preemptions"][recorder.tasks.number[task_id]])


def assert_all_completed_once(recorder: Recorder, sys_: EmbeddedSystem) -> None:
    c = recorder.tasks.columns
    assert all(x == x for x in c["finished_at"]), "a task never finished"
    assert all(lm.is_idle() for lm in sys_.lms)


def test_a_high_job_preempts_a_running_low_job_across_gms_and_the_low_one_runs_again() -> None:
    sys_, rec = system(2, gms=2)
    low = job("low", 4, LOW, 0.0, duration=100.0)  # GM 0's low job fills both partitions
    high = job("high", 2, HIGH, 5.0, user="B", duration=10.0)  # GM 1's high job finds no room
    run(sys_, rec, (0, low), (1, high))
    assert all(finish(rec, f"high.{i}") < 20.0 for i in range(2))
    assert sum(preemptions(rec, f"low.{i}") for i in range(4)) == 2
    assert max(finish(rec, f"low.{i}") for i in range(4)) > 100.0  # the preempted ones ran again, later
    assert sys_.lms[0].preemptions == 2
    assert_all_completed_once(rec, sys_)


def test_a_task_never_preempts_its_own_class_or_a_higher_one() -> None:
    sys_, rec = system(2)
    run(sys_, rec, (0, job("first", 4, NORMAL, 0.0)), (0, job("second", 2, NORMAL, 1.0)))
    assert sys_.lms[0].preemptions == 0
    assert finish(rec, "second.0") >= 10.0
    assert_all_completed_once(rec, sys_)


def test_priority_preempts_whatever_the_shares_and_fair_share_stays_within_reach() -> None:
    # A is far below its share but low; B is over its share but high: B's high task still preempts A's low one.
    fairness = FairnessConfig((QueueSpec("A", 0.75, 0), QueueSpec("B", 0.25, 0)))
    sys_, rec = system(4, fairness)
    run(
        sys_,
        rec,
        (0, job("b", 2, HIGH, 0.0, "B", duration=100.0)),
        (0, job("a", 2, LOW, 0.0, "A", duration=100.0)),
        (0, job("bb", 1, HIGH, 5.0, "B", duration=10.0)),
    )
    assert finish(rec, "bb.0") < 20.0
    assert sum(preemptions(rec, f"a.{i}") for i in range(2)) == 1
    assert sum(preemptions(rec, f"b.{i}") for i in range(2)) == 0  # fair share never took B's high tasks for A
    assert_all_completed_once(rec, sys_)


# -------------------------------------------------------------- no loop

CLASSES = (LOW, NORMAL, HIGH)


@st.composite
def contention(draw: st.DrawFn) -> tuple[FairnessConfig, list[tuple[int, JobSpec]]]:
    users = draw(st.integers(2, 3))
    weights = draw(st.lists(st.integers(1, 5), min_size=users, max_size=users))
    queues = tuple(QueueSpec(f"u{k}", w / sum(weights), k % 2) for k, w in enumerate(weights))
    jobs = []
    for k in range(draw(st.integers(2, 8))):
        queue = queues[draw(st.integers(0, users - 1))]
        priority = draw(st.sampled_from(CLASSES))
        n = draw(st.integers(1, 4))
        at = draw(st.floats(0, 20))
        duration = draw(st.floats(1, 30))
        half = draw(st.booleans())
        tasks = tuple(t(f"j{k}.{i}", priority, queue.user, duration, HALF if half else CAP) for i in range(n))
        jobs.append((queue.gm, JobSpec(f"j{k}", tasks, at)))
    return FairnessConfig(queues), jobs


THIRDS = FairnessConfig(tuple(QueueSpec(f"u{k}", 1 / 3, gm) for k, gm in enumerate((0, 1, 0))))
PREEMPTED_BACK = (  # found by hypothesis: j3.0 preempts j1.1 at 1.001 s; by 3.001 s the rest of j1 ended and j3
    # started two more tasks, so u0 holds nothing and u2 three of four nodes: j1.1 preempts j3.0 back, by the rules
    THIRDS,
    [
        (1, JobSpec("j0", (t("j0.0", HIGH, "u1", 1.0),), 1.0)),
        (0, JobSpec("j1", tuple(t(f"j1.{i}", HIGH, "u0", 1.0) for i in range(4)), 0.0)),
        (0, JobSpec("j2", (t("j2.0", LOW, "u0", 1.0),), 0.0)),
        (0, JobSpec("j3", tuple(t(f"j3.{i}", HIGH, "u2", 2.0) for i in range(3)), 1.0)),
    ],
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(contention())
@example(PREEMPTED_BACK)
def test_priority_and_fair_share_preemptions_never_loop(case: tuple[FairnessConfig, list[tuple[int, JobSpec]]]) -> None:
    """Every preemption either strictly lowers the victims' class below the preemptor's (priority) or keeps to one
    class or below, from users over their share (verified before) to a user under it, leaving the victim at or over
    its share (fair share): so a victim never preempts its preemptor back unless some other task started or ended
    in between (the preemption cannot cause it on its own: docs/priority.md), nothing is preempted twice by the
    same task, and every task completes exactly once."""
    fairness, jobs = case
    shares = fairness.shares()
    sys_, rec = system(2, fairness, gms=2)
    lm = sys_.lms[0]
    handle = lm.handle
    local = lm.shares
    assert isinstance(local, LocalShares)
    problems: list[str] = []
    preempted_by: dict[str, dict[str, int]] = {}  # victim -> its preemptors -> len(changes) when it preempted
    changes: list[str] = []  # the task of every start and end at the LM, in order
    started, ended = local.started, local.ended

    def start(task: TaskSpec, node: int) -> None:
        changes.append(task.task_id)
        started(task, node)

    def end(task: TaskSpec, node: int) -> None:
        changes.append(task.task_id)
        ended(task, node)

    local.started, local.ended = start, end  # type: ignore[method-assign]

    def checked(msg: object, now: float):  # type: ignore[no-untyped-def]
        if not isinstance(msg, PreemptRequest):
            return handle(msg, now)
        task = msg.task
        usage = {u: list(v) for u, v in local._usage.items()}
        before = {u: local.policy.consumption(tuple(v), msg.total) for u, v in usage.items()}
        out = handle(msg, now)
        for victim_id in out[0].msg.preempted:
            victim = lm.preempting[victim_id].placement.task
            usage[victim.user] = [a - b for a, b in zip(usage[victim.user], victim.request, strict=True)]
        for victim_id in out[0].msg.preempted:
            victim = lm.preempting[victim_id].placement.task
            if victim.priority > task.priority:
                problems.append(f"{task.task_id} ({task.priority}) preempted higher {victim_id} ({victim.priority})")
            if victim.priority == task.priority:
                after = local.policy.consumption(tuple(usage[victim.user]), msg.total)
                if victim.user == task.user or before[victim.user] <= shares[victim.user]:
                    problems.append(f"{task.task_id} preempted {victim_id} of its class, not over its share")
                elif after < shares[victim.user]:
                    problems.append(f"{task.task_id} took {victim.user} below its share ({after:.3f})")
                elif before.get(task.user, 0.0) >= shares[task.user]:
                    problems.append(f"{task.task_id} preempted {victim_id} of its class, its user not under its share")
            back = preempted_by.get(task.task_id, {}).get(victim_id)
            if back is not None and not set(changes[back:]) - {task.task_id, victim_id}:
                problems.append(f"{task.task_id} preempted {victim_id} back with nothing else changed: a loop")
            preempted_by.setdefault(victim_id, {})[task.task_id] = len(changes)
        return out

    sys_.loop._endpoints["lm/0"] = checked
    run(sys_, rec, *jobs)
    assert problems == []
    assert_all_completed_once(rec, sys_)
