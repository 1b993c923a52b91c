"""The papers' variants as options: a task that fits nowhere parked by shape or put at the back of its queue (fair
paper IV-B5), a task no node could ever run rejecting its job or dropped (the authors' simulator), machine
constraints drawn per node or per LM machine class, and a replay under several seeds. Each keeps every accepted
task ending exactly once or failing with a reason."""

from __future__ import annotations

import json
import math
import statistics
import typing
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from megha import cli
from megha.common.clusterfile import generate_cluster
from megha.common.constraint_stats import load_constraint_stats
from megha.common.core.fairness.config import FairnessConfig, QueueSpec
from megha.common.core.gm import GlobalMaster, Unschedulable
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import (
    Delta,
    DeltaTick,
    LaunchBatch,
    LaunchResponse,
    NodeState,
    PreemptRequest,
    PreemptResponse,
    Victim,
)
from megha.common.core.node_table import NodeTable
from megha.common.core.observer import CoreObserver
from megha.common.core.placement.choice import make_choice
from megha.common.core.policies import ANSWER_STATES, UNPLACEABLE, UNSATISFIABLE, gm_policies
from megha.common.core.policies.queue_order import KeyedQueue
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.core.worker import SimulatedExecution
from megha.common.machine_classes import MACHINE_DRAWS
from megha.common.settings import GMSettings
from megha.embedded.system import EmbeddedConfig, EmbeddedSystem
from megha.loadgen.metrics import compute_metrics
from megha.loadgen.recorder import Recorder
from megha.loadgen.replay import ReplayConfig, replay
from megha.loadgen.seeds import SeedFigures
from megha.services.gm.service import GMService

from corekit import CAP, Net, cluster, job, task

HALF = (CAP[0] // 2, CAP[1] // 2)


class Ends(CoreObserver):
    """The ends a GM reports: completions and failures (with their reasons), and rejected jobs."""

    def __init__(self) -> None:
        self.completed: list[str] = []
        self.failed: dict[str, str] = {}
        self.rejected: dict[str, str] = {}

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool) -> None:
        self.completed.append(task.task_id)

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None:
        self.failed[task.task_id] = reason

    def job_rejected(self, job: JobSpec, gm: int, reason: str, now: float) -> None:
        self.rejected[job.job_id] = reason


def _gm(spec, observer: CoreObserver | None = None, **names: str) -> GlobalMaster:  # type: ignore[no-untyped-def]
    return GlobalMaster(0, spec, observer=observer, policies=gm_policies(0, spec, **names))


# ------------------------------------------------------------------ unplaceable: park | requeue-back


def test_park_holds_a_task_by_shape_and_retries_it_only_when_a_node_frees() -> None:
    spec = cluster([[[[]]]])  # one LM, one GM, one node
    gm = _gm(spec)
    gm.submit(job("a", task("a.0")), 0.0)
    gm.submit(job("b", task("b.0")), 0.1)
    gm.submit(job("c", task("c.0", request=HALF)), 0.2)
    assert [t.task_id for t in gm.waiting_tasks()] == ["b.0", "c.0"] and not gm.queue
    gm.handle(Delta(0, 0, 0), 0.3)  # news that frees nothing
    assert gm.reschedules == 2


def test_requeue_back_puts_the_task_at_the_back_and_tries_it_again_in_every_pass() -> None:
    spec = cluster([[[[]]]])
    gm = _gm(spec, unplaceable="requeue-back")
    gm.submit(job("a", task("a.0")), 0.0)
    gm.submit(job("b", task("b.0")), 0.1)
    assert [t.task_id for t in gm.queue] == ["b.0"] and not gm.waiting
    gm.submit(job("c", task("c.0", request=HALF)), 0.2)  # b.0 is tried again (and fails) before c.0
    assert [t.task_id for t in gm.queue] == ["b.0", "c.0"] and gm.reschedules == 3
    gm.handle(Delta(0, 0, 0), 0.3)  # any message starts a pass: both are new requests again
    assert [t.task_id for t in gm.queue] == ["b.0", "c.0"] and gm.reschedules == 5 and not gm.waiting


@pytest.mark.parametrize("unplaceable", sorted(UNPLACEABLE))
def test_both_policies_run_every_task_exactly_once_when_the_node_frees(unplaceable: str) -> None:
    spec = cluster([[[[]]]])
    ends = Ends()
    net = Net.build(spec, observer=ends, policies=gm_policies(0, spec, unplaceable=unplaceable))
    gm = net.gms[0]
    for i, name in enumerate("abcd"):
        net.post(gm.submit(job(name, task(f"{name}.0", duration=1.0)), 0.0))
        assert i == 0 or len(gm.queue) + len(gm.waiting_tasks()) == i
    net.run()
    assert sorted(ends.completed) == ["a.0", "b.0", "c.0", "d.0"] and not ends.failed
    assert not gm.queue and not gm.waiting and not gm.running and net.lms[0].is_idle()


@pytest.mark.parametrize(("unplaceable", "node"), [("park", 1), ("park-freed-node", 0)])
def test_park_freed_node_hands_the_freed_node_to_the_parked_task_without_the_node_choice(
    unplaceable: str, node: int
) -> None:
    """Nodes 0 (three constraints) and 1 (none) free up in one delta, node 0 first: under `park` the parked task is
    matched over the view, and Minimum-Constraints takes node 1; under `park-freed-node` it takes node 0, the first
    freed node it fits (the authors' simulator)."""
    spec = cluster([[[[1, 2, 3], []]]])
    policies = gm_policies(0, spec, choice=make_choice("min-constraints"), unplaceable=unplaceable)
    gm = GlobalMaster(0, spec, policies=policies)
    gm.submit(job("a", task("a.0"), task("a.1")), 0.0)
    gm.submit(job("b", task("b.0")), 0.1)
    assert [t.task_id for t in gm.waiting_tasks()] == ["b.0"]
    out = gm.handle(Delta(0, 0, 1, [NodeState(0, CAP, 10), NodeState(1, CAP, 10)]), 0.2)
    placed = [(p.task.task_id, p.node) for o in out if isinstance(o.msg, LaunchBatch) for p in o.msg.placements]
    assert placed == [("b.0", node)]


def test_a_keyed_queue_takes_a_task_back_by_its_key_after_its_equals() -> None:
    a, b, c = task("a.0", request=(3, 3)), task("b.0", request=(1, 1)), task("c.0", request=(1, 1))
    queue = KeyedQueue(lambda t: t.request)
    queue.extend([a, b])
    queue.push_back(c)
    assert [queue.popleft() for _ in range(3)] == [b, c, a]


def test_under_requeue_back_a_refused_preemption_parks_and_a_delta_asks_again() -> None:
    """A refusal never starts its own retry: the GM cannot tell every reason an LM refuses, and would ask forever."""
    spec = cluster([[[[]], [[]]]])  # one LM, two GMs, a node each
    fairness = FairnessConfig((QueueSpec("A", 0.5, 0), QueueSpec("B", 0.5, 1)))
    gm = GlobalMaster(1, spec, policies=gm_policies(1, spec, fairness, unplaceable="requeue-back"))
    book = gm.book
    assert book is not None
    over = {"A": (2 * CAP[0], 2 * CAP[1])}
    book.report(0, over)  # stale: A looks over its share
    for view in gm.views[0]:
        view.set_free(0, (0, 0))
    waiting = TaskSpec("b.0", "b", "B", 10.0, CAP, 0)
    out = gm.submit(JobSpec("b", (waiting,), 0.0), 0.0)
    (request,) = [o.msg for o in out if isinstance(o.msg, PreemptRequest)]
    assert request.victims == [Victim("A", (0, 0))]
    refusal = PreemptResponse(
        1, 0, request.seq, waiting, None, [], "no victim on a node it could use", [], Delta(0, 1, 0)
    )
    assert gm.handle(refusal, 0.1) == []
    assert gm.waiting_tasks() == [waiting] and not gm.queue and book.demand["B"] == list(CAP)  # counted once
    again = gm.handle(Delta(0, 1, 0, [], over), 0.2)
    assert [type(o.msg) for o in again] == [PreemptRequest] and not gm.waiting


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=st.lists(
        st.tuples(st.integers(0, 1), st.integers(1, 4), st.floats(0, 5), st.sampled_from([0.5, 2.0, 7.0])),
        min_size=1,
        max_size=8,
    )
)
def test_requeue_back_under_fair_scheduling_and_contention_loses_nothing(
    jobs: list[tuple[int, int, float, float]],
) -> None:
    fairness = FairnessConfig((QueueSpec("A", 0.5, 0), QueueSpec("B", 0.5, 1)))
    spec = cluster([[[[]] * 2, [[]] * 2]])
    recorder = Recorder()
    system = EmbeddedSystem(spec, EmbeddedConfig(fairness=fairness, unplaceable="requeue-back"), recorder)
    for k, (q, n, at, duration) in enumerate(jobs):
        user = "AB"[q]
        submitted = JobSpec(
            f"j{k}", tuple(TaskSpec(f"j{k}.{i}", f"j{k}", user, duration, CAP, 0) for i in range(n)), at
        )
        recorder.expect(q, submitted)
        system.submit(q, submitted)
    system.run()
    assert all(r.completions == 1 for r in recorder.tasks.values())
    assert all(lm.is_idle() for lm in system.lms)


# ------------------------------------------------------------------ inconsistent: retry | wait-for-free


def _refused_then_another(inconsistent: str) -> tuple[Net, Ends, list[str]]:
    """One LM of two nodes: a.0's node is taken behind its GM's back, so the LM refuses a.0 as inconsistent; then
    b.0, of the same shape, arrives. Returns the net and the order the two started in."""
    spec = cluster([[[[], []]]])
    ends = Ends()
    net = Net.build(spec, observer=ends, policies=gm_policies(0, spec, inconsistent=inconsistent))
    gm, lm = net.gms[0], net.lms[0]
    started: list[str] = []
    net.post(gm.submit(job("a", task("a.0")), 0.0))
    batch = net.take("lm/0", LaunchBatch)
    lm.free[batch.placements[0].node] = (0, 0)  # type: ignore[attr-defined]
    net.post(gm.handle(lm.handle(batch, 0.0)[0].msg, 0.0))  # type: ignore[arg-type, union-attr]
    assert gm.inconsistencies == 1
    net.post(gm.submit(job("b", task("b.0")), 0.1))
    for send in net.inbox:
        if isinstance(send.msg, LaunchBatch):
            started += [p.task.task_id for p in send.msg.placements]
    net.run()
    return net, ends, started


def test_retry_matches_a_refused_task_again_at_once_before_newer_tasks() -> None:
    _net, ends, first = _refused_then_another("retry")
    assert first == ["a.0"] and ends.completed == ["a.0", "b.0"] and not ends.failed


def test_wait_for_free_holds_a_refused_task_until_a_node_frees_without_holding_back_its_shape() -> None:
    net, ends, first = _refused_then_another("wait-for-free")
    # b.0 takes the free node at once; a.0 waits for a node to free up (b.0's, when it ends), then runs.
    assert first == ["b.0"] and ends.completed == ["b.0", "a.0"] and not ends.failed
    gm = net.gms[0]
    assert not gm.queue and not gm.waiting_tasks() and not gm.running


def test_a_cancelled_task_waiting_after_an_inconsistency_is_dropped() -> None:
    spec = cluster([[[[]]]])
    ends = Ends()
    net = Net.build(spec, observer=ends, policies=gm_policies(0, spec, inconsistent="wait-for-free"))
    gm, lm = net.gms[0], net.lms[0]
    net.post(gm.submit(job("a", task("a.0")), 0.0))
    batch = net.take("lm/0", LaunchBatch)
    lm.free[0] = (0, 0)  # type: ignore[attr-defined]
    net.post(gm.handle(lm.handle(batch, 0.0)[0].msg, 0.0))  # type: ignore[arg-type, union-attr]
    assert [t.task_id for t in gm.waiting_tasks()] == ["a.0"]
    gm.cancel(["a.0"], 1.0)
    assert not gm.waiting_tasks() and gm.cancelled == 1


def test_an_unknown_inconsistent_policy_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown inconsistent policy 'later'.*retry.*wait-for-free"):
        gm_policies(0, cluster([[[[]]]]), inconsistent="later")


# ------------------------------------------------------------------ answer states: always | on-refusal


def _answered_after_a_free(answer_states: str) -> tuple[Net, list[str]]:
    """One LM: node 0 (constraint 1) in GM 0's partition, node 1 (constraint 2) in GM 1's. GM 1's x.0 runs on
    node 1; GM 0's a.0 (constraint 2) takes node 1 by repartition, is refused and waits for a freed node. x.0 ends,
    freeing node 1, then GM 0's c.0 (constraint 1) launches on node 0. Returns the net and the tasks GM 0 holds
    once c.0's answer arrived, before any heartbeat."""
    spec = cluster([[[[1]], [[2]]]])
    gms = [GlobalMaster(g, spec, policies=gm_policies(g, spec, inconsistent="wait-for-free")) for g in range(2)]
    lm = LocalMaster(0, spec.partitions[0], spec.resource_names, answer_states=ANSWER_STATES[answer_states]())
    net = Net(gms, [lm], [SimulatedExecution(0)])

    def deliver_all() -> None:
        while net.inbox:
            net.deliver()

    net.post(gms[1].submit(job("x", task("x.0", [2])), 0.0))
    deliver_all()
    net.now = 0.1
    net.post(gms[0].submit(job("a", task("a.0", [2])), 0.1))
    deliver_all()
    assert gms[0].inconsistencies == 1
    net.run()  # x.0 ends at 1.0; its completion goes to GM 1 and the freed node waits in GM 0's pending delta
    net.now = 1.5
    net.post(gms[0].submit(job("c", task("c.0", [1])), 1.5))
    deliver_all()
    return net, [t.task_id for t in gms[0].waiting_tasks()]


def test_always_the_answer_to_an_accepted_batch_brings_the_nodes_other_gms_freed() -> None:
    net, waiting = _answered_after_a_free("always")
    assert waiting == [] and "a.0" in net.gms[0].running  # placed on node 1 as c.0's answer arrived


def test_on_refusal_a_gm_hears_of_a_node_another_gm_freed_only_at_the_next_heartbeat() -> None:
    net, waiting = _answered_after_a_free("on-refusal")
    gm, lm = net.gms[0], net.lms[0]
    assert waiting == ["a.0"]  # c.0's answer carried no states: node 1 still looks busy to GM 0
    net.post(lm.handle(DeltaTick(), 2.0))  # the heartbeat carries the pending delta
    net.run()
    assert not gm.waiting_tasks() and not gm.running and gm.inconsistencies == 1


def test_on_refusal_answers_a_refusal_with_the_states_and_the_pending_delta() -> None:
    spec = cluster([[[[]], [[]]]])
    lm = LocalMaster(0, spec.partitions[0], spec.resource_names, answer_states=ANSWER_STATES["on-refusal"]())
    gm0, gm1 = GlobalMaster(0, spec), GlobalMaster(1, spec)
    lm.handle(next(o.msg for o in gm1.submit(job("x", task("x.0")), 0.0)), 0.0)  # GM 1 takes node 1
    accepted = lm.handle(next(o.msg for o in gm0.submit(job("a", task("a.0")), 0.1)), 0.1)[0].msg
    assert isinstance(accepted, LaunchResponse) and not accepted.rejected
    assert accepted.states == [] and accepted.delta.nodes == []  # node 1's change stays pending for GM 0
    refused = lm.handle(next(o.msg for o in gm0.submit(job("b", task("b.0")), 0.2)), 0.2)[0].msg
    assert isinstance(refused, LaunchResponse) and refused.rejected and refused.rejected[0].inconsistency
    assert [s[0] for s in refused.states] == [1] and [s[0] for s in refused.delta.nodes] == [1]


def test_an_unknown_answer_states_policy_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown --answer-states 'never'.*always.*on-refusal"):
        replay(ReplayConfig(answer_states="never"))


# ------------------------------------------------------------------ delta states: latest | freed-wins


@pytest.mark.parametrize(("delta_states", "reported"), [("latest", (0, 0)), ("freed-wins", CAP)])
def test_freed_wins_reports_a_node_freed_since_the_last_delta_free_even_if_taken_again(
    delta_states: str, reported: tuple[int, int]
) -> None:
    table = NodeTable(cluster([[[[]], [[]]]]).partitions[0], 0, delta_states)
    table.set_free(1, (0, 0), except_gm=1)  # GM 1 takes node 1 ...
    table.set_free(1, CAP, except_gm=1)  # ... its task ends ...
    table.set_free(1, (0, 0), except_gm=1)  # ... and it takes the node again
    assert table.take_changes(0) == [(1, reported, table.version[1])] and table.take_changes(1) == []
    table.set_free(1, CAP, except_gm=1)
    assert table.take_changes(0) == [(1, CAP, table.version[1])]
    table.set_free(1, (0, 0), except_gm=1)  # only taken since the last delta: busy under both
    assert table.take_changes(0) == [(1, (0, 0), table.version[1])]


def test_an_unknown_delta_states_policy_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown --delta-states 'oldest'.*latest.*freed-wins"):
        replay(ReplayConfig(delta_states="oldest"))


# ------------------------------------------------------------------ unsatisfiable: reject | drop


def test_reject_refuses_the_whole_job_naming_the_first_task_no_node_could_run() -> None:
    spec = cluster([[[[1], []]]])
    ends = Ends()
    gm = _gm(spec, ends)
    with pytest.raises(Unschedulable, match=r"task j.1: no node satisfies placement constraints \[2\]") as exc:
        gm.submit(job("j", task("j.0"), task("j.1", [2]), task("j.2", [3])), 0.0)
    assert exc.value.field == "tasks.1.constraints" and list(ends.rejected) == ["j"] and not gm.queue


def test_drop_fails_each_task_no_node_could_run_with_its_reason_and_runs_the_others() -> None:
    spec = cluster([[[[1], []]]])
    ends = Ends()
    gm = _gm(spec, ends, unsatisfiable="drop")
    too_big = task("j.2", request=(CAP[0] + 1, CAP[1]))
    out = gm.submit(job("j", task("j.0", [1]), task("j.1", [2]), too_big, task("j.3")), 0.0)
    (batch,) = [o.msg for o in out if isinstance(o.msg, LaunchBatch)]
    assert sorted(p.task.task_id for p in batch.placements) == ["j.0", "j.3"]
    assert ends.failed == {
        "j.1": "dropped at submission: no node satisfies placement constraints [2]",
        "j.2": "dropped at submission: no node has capacity for cpu_millicores=4001, memory_mb=8192",
    }
    assert gm.dropped == 2 and not ends.rejected


def test_drop_still_rejects_bad_input_a_malformed_request_or_a_user_without_a_queue() -> None:
    spec = cluster([[[[]]]])
    gm = _gm(spec, unsatisfiable="drop")
    with pytest.raises(Unschedulable, match="request has 1 amounts; expected 2"):
        gm.submit(job("m", task("m.0", [2]), task("m.1", request=(1,))), 0.0)
    fair = GlobalMaster(
        0, spec, policies=gm_policies(0, spec, FairnessConfig((QueueSpec("user-0", 1.0, 0),)), unsatisfiable="drop")
    )
    stranger = TaskSpec("s.0", "s", "mallory", 1.0, CAP, 0)
    with pytest.raises(Unschedulable, match="user 'mallory' has no queue") as exc:
        fair.submit(JobSpec("s", (task("s.1", [2]), stranger), 0.0), 0.0)
    assert exc.value.field == "tasks.1.user" and gm.dropped == fair.dropped == 0


def test_a_job_with_dropped_tasks_finishes_with_its_other_tasks_and_its_delay_is_measured() -> None:
    spec = cluster([[[[]]]])
    recorder = Recorder()
    system = EmbeddedSystem(spec, EmbeddedConfig(unsatisfiable="drop"), recorder)
    submitted = job("j", task("j.0", duration=2.0), task("j.1", [4], duration=50.0), at=1.0)
    recorder.expect(0, submitted)
    system.submit(0, submitted)
    system.run()
    record = recorder.jobs["j"]
    assert (record.num_tasks, record.dropped_tasks, record.ideal_jrt) == (2, 1, 2.0)  # as in the trace; 1 dropped
    assert not math.isnan(record.jrt_delay)
    metrics = compute_metrics(recorder.tasks, [record], spec.total_capacity(), spec.resource_names, 1.0)
    assert (metrics.tasks_completed, metrics.tasks_failed, metrics.not_exactly_once) == (1, 1, ())
    assert metrics.jrt_delay.count == 1 and system.counters()["dropped"] == 1


@pytest.mark.parametrize(
    ("unsatisfiable", "machine_constraints"), [("reject", "per-node"), ("drop", "per-node"), ("drop", "per-lm")]
)
def test_an_overloaded_replay_under_either_policy_ends_every_accepted_task_exactly_once(
    unsatisfiable: str, machine_constraints: str
) -> None:
    """40 one-second tasks a second on 40 nodes, a few of which no node satisfies (more with per-LM classes)."""
    config = ReplayConfig(trace="syn:40:30", lms=2, gms=2, workers_per_partition=10, seed=1)
    result = replay(
        replace(
            config, unsatisfiable=unsatisfiable, unplaceable="requeue-back", machine_constraints=machine_constraints
        )
    )
    m, dropped = result.metrics, result.system.counters()["dropped"]
    assert m.not_exactly_once == () and m.tasks_completed + m.tasks_failed == m.tasks and m.reschedules > 0
    if unsatisfiable == "drop":
        assert m.jobs_rejected == 0 and m.tasks_failed == dropped > 0 and m.jrt_delay.count == m.jobs
        assert all(reason.startswith("dropped at submission: no node") for reason, _ in m.failure_reasons)
    else:
        assert 0 < m.jobs_rejected < m.jobs and dropped == 0 and m.jrt_delay.count == m.jobs - m.jobs_rejected


# ------------------------------------------------------------------ machine constraints: per-node | per-lm


def _lm_fractions(spec, constraint: int) -> list[float]:  # type: ignore[no-untyped-def]
    return [
        sum(m >> constraint & 1 for m in spec.lm_constraint_masks(lm)) / spec.lm_size(lm) for lm in range(spec.num_lms)
    ]


def test_per_node_is_the_default_draw_and_per_lm_concentrates_constrained_nodes_per_lm() -> None:
    fractions = load_constraint_stats().machine_fraction
    per_node = generate_cluster(12, 2, 200, CAP, 5)
    assert per_node == generate_cluster(12, 2, 200, CAP, 5, machine_constraints="per-node")
    per_lm = generate_cluster(12, 2, 200, CAP, 5, machine_constraints="per-lm")
    assert per_lm == generate_cluster(12, 2, 200, CAP, 5, machine_constraints="per-lm")  # reproducible
    spreads = {"per-node": [], "per-lm": []}  # type: dict[str, list[float]]
    for k, f in enumerate(fractions):
        if 0 < f < 1:
            for name, spec in (("per-node", per_node), ("per-lm", per_lm)):
                spreads[name].append(statistics.pstdev(_lm_fractions(spec, k)))
        else:  # a constraint every node (or none) satisfies stays so
            assert set(_lm_fractions(per_lm, k)) == {f}
    # Per node an LM's share of a constraint varies by sampling only (sd < 0.04 for 400 nodes); per LM by class.
    assert max(spreads["per-node"]) < 0.05 < 0.15 < statistics.fmean(spreads["per-lm"])


def test_per_lm_keeps_the_data_centres_fractions_on_average() -> None:
    fractions = load_constraint_stats().machine_fraction
    spec = generate_cluster(200, 1, 20, CAP, 3, machine_constraints="per-lm")
    masks = [m for lm in range(spec.num_lms) for m in spec.lm_constraint_masks(lm)]
    # An LM's share of constraint k has mean f and variance f (1 - f) / 2: over 200 LMs, sd <= 0.025 each.
    deviations = [sum(m >> k & 1 for m in masks) / len(masks) - f for k, f in enumerate(fractions)]
    assert max(map(abs, deviations)) < 0.1 and abs(statistics.fmean(deviations)) < 0.03


def test_unknown_draws_and_per_lm_on_a_cluster_file_are_refused() -> None:
    with pytest.raises(
        ValueError, match=r"unknown machine constraints 'per-rack'; choose one of \['per-lm', 'per-node'\]"
    ):
        generate_cluster(1, 1, 1, CAP, 0, machine_constraints="per-rack")
    with pytest.raises(ValueError, match="drawn for a generated cluster"):
        replay(ReplayConfig(cluster="reference", machine_constraints="per-lm"))


# ------------------------------------------------------------------ seeds


def test_seed_figures_give_each_seed_the_mean_and_the_range_leaving_out_what_was_not_measured() -> None:
    figures = SeedFigures(
        (0, 1, 2),
        {
            "JRT delay p50": (1.0, 2.0, 6.0),
            "JRT delay p99": (math.nan, 4.0, 8.0),
            "allocation time p99": (math.nan,) * 3,
        },
    )
    assert figures.mean("JRT delay p50") == 3.0 and figures.range("JRT delay p50") == (1.0, 6.0)
    assert figures.mean("JRT delay p99") == 6.0 and figures.range("JRT delay p99") == (4.0, 8.0)
    assert math.isnan(figures.mean("allocation time p99"))
    table = figures.table()
    assert "mean" in table and "1.000 s - 6.000 s" in table and "seed 2" in table
    doc = figures.document()["figures_seconds"]
    assert doc["JRT delay p99"] == {"by_seed": [None, 4.0, 8.0], "mean": 6.0, "min": 4.0, "max": 8.0}  # type: ignore[index]


SMALL = ["replay", "--trace", "syn:10:4", "--lms", "1", "--gms", "2", "--workers-per-partition", "10", "--quiet"]
SMALL += ["--no-constraints"]


def test_replay_with_three_seeds_reports_each_and_their_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*SMALL, "--seed", "4", "--seeds", "3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert all(f"seed {s})" in out for s in (4, 5, 6)) and "3 seeds" in out and "min - max" in out
    doc = json.loads((tmp_path / "seeds.json").read_text())
    assert doc["seeds"] == [4, 5, 6]
    p99 = doc["figures_seconds"]["JRT delay p99"]
    assert p99["mean"] == pytest.approx(statistics.fmean(p99["by_seed"]))
    for seed in (4, 5, 6):
        summary = json.loads((tmp_path / f"seed-{seed}" / "summary.json").read_text())
        assert summary["extra"]["config"]["seed"] == seed
    assert cli.main([*SMALL, "--seed", "3", "--seeds", "2", "--out", str(tmp_path)]) == 2  # seed-4 holds a report
    assert "already holds a report" in capsys.readouterr().err and not (tmp_path / "seed-3").exists()


def test_one_seed_reports_as_before(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*SMALL, "--no-files"]) == 0
    out = capsys.readouterr().out
    assert "slot mode)\n" in out and "seed" not in out


# ------------------------------------------------------------------ options and settings


def test_the_variants_are_replay_options_and_the_unplaceable_one_a_gm_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["replay", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for flag in ("--unplaceable", "--unsatisfiable", "--machine-constraints", "--seeds"):
        assert flag in shown
    assert set(typing.get_args(GMSettings.model_fields["unplaceable"].annotation)) == set(UNPLACEABLE)
    assert {c for p in cli.megha.commands["replay"].params if "--unsatisfiable" in p.opts for c in p.type.choices} == (
        set(UNSATISFIABLE)
    )
    assert {
        c for p in cli.megha.commands["replay"].params if "--machine-constraints" in p.opts for c in p.type.choices
    } == (set(MACHINE_DRAWS))
    monkeypatch.setenv("MEGHA_UNPLACEABLE", "requeue-back")
    assert GMSettings().unplaceable == "requeue-back"
    with pytest.raises(ValidationError, match="unplaceable"):
        GMSettings(unplaceable="drop")
    with pytest.raises(ValueError, match="unknown unplaceable policy 'later'"):
        gm_policies(0, cluster([[[[]]]]), unplaceable="later")


def test_a_gm_service_runs_the_unplaceable_policy_its_setting_names(tmp_path: Path) -> None:
    settings = GMSettings(lm_urls=["http://127.0.0.1:9"], journal_dir=str(tmp_path), unplaceable="requeue-back")
    service = GMService(settings)
    service.adopt(cluster([[[[]]]]))
    assert service.core is not None and service.core.unplaceable.name == "requeue-back"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--unplaceable", "later"], "--unplaceable: invalid choice: 'later'"),
        (["--unsatisfiable", "ignore"], "--unsatisfiable: invalid choice: 'ignore'"),
        (["--inconsistent", "later"], "--inconsistent: invalid choice: 'later'"),
        (["--waiting-order", "lifo"], "--waiting-order: invalid choice: 'lifo'"),
        (["--machine-constraints", "per-rack"], "--machine-constraints: invalid choice: 'per-rack'"),
        (["--seeds", "0"], "--seeds: must be at least 1, got 0"),
    ],
)
def test_bad_variant_options_are_usage_errors_naming_them(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["replay", *args])
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [
        ["--unsatisfiable", "drop"],
        ["--unplaceable", "requeue-back"],
        ["--lm-order", "scarcity"],
        ["--inconsistent", "wait-for-free"],
        ["--waiting-order", "arrival"],
    ],
)
def test_the_gm_policies_are_refused_for_a_baseline(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*SMALL, "--no-files", "--scheduler", "sparrow", *args]) == 2
    assert "is a policy of Megha's GMs (megha, centralized), not sparrow" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("scheduler", "args", "named"),
    [
        ("sparrow", ["--matching", "rarity"], "--matching"),
        ("sparrow", ["--matching", "random"], "--matching"),  # named, even as the value it would have
        ("sparrow", ["--delta-interval", "5"], "--delta-interval"),
        ("pigeonc", ["--delta-interval", "0.1"], "--delta-interval"),
        ("pigeonc-published", ["--delta-offset", "0.5"], "--delta-offset"),
        ("megha", ["--pigeonc-masters", "10"], "--pigeonc-masters"),
        ("sparrow", ["--pigeonc-masters", "100"], "--pigeonc-masters"),
    ],
)
def test_an_option_a_baseline_has_no_use_for_is_refused_not_ignored(
    scheduler: str, args: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main([*SMALL, "--no-files", "--scheduler", scheduler, *args])
    assert exc.value.code == 2
    assert f"{named} plays no part in --scheduler {scheduler}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--cluster", "reference", "--gms", "2"], "--gms sizes a generated data centre (--cluster generate)"),
        (["--cluster", "reference", "--workers-per-partition", "3"], "--workers-per-partition sizes a generated"),
        (["--no-files", "--out", "somewhere"], "--out names the report's folder, and --no-files writes none"),
        (["--no-files", "--gang-reserve-after", "5"], "--gang-reserve-after is for gangs: give --gangs too"),
        (["--no-files", "--share-policy", "drf"], "--share-policy divides the --queues' shares: give --queues too"),
        (["--no-files", "--fail-detect", "5"], "--fail-detect is for workers crashed by --fail: give --fail too"),
        (["--no-files", "--fail-repair", "5"], "--fail-repair is for crashes by --fail: give --fail too"),
    ],
)
def test_an_option_that_needs_another_is_refused_without_it_not_ignored(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["replay", "--trace", "syn:2:2", "--quiet", *args])
    assert exc.value.code == 2
    assert said in capsys.readouterr().err


def test_a_delta_offset_of_a_whole_interval_or_more_is_refused_naming_both_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main([*SMALL, "--no-files", "--delta-interval", "2", "--delta-offset", "2"]) == 2
    assert "--delta-offset 2.0 must be at least 0 and less than --delta-interval 2.0" in capsys.readouterr().err


def test_deltas_at_an_offset_change_when_the_gms_hear_of_other_gms_placements() -> None:
    """With a job of 1,000 one-second tasks arriving each whole second, deltas 0.05 s before each arrival (as the
    authors' simulator sends them) tell each GM of the last job's placements before it places the next, where deltas
    on the whole second reach it just after: far fewer placements are refused (30 and 1 here)."""
    base = ReplayConfig(trace="syn:1000:8", lm_order="first-fit")
    on_the_second = replay(base)
    early = replay(replace(base, delta_offset=0.95))
    assert on_the_second.metrics.tasks_completed == early.metrics.tasks_completed == 8000
    assert early.metrics.inconsistencies < on_the_second.metrics.inconsistencies / 10


def test_a_baseline_replay_titles_only_the_policies_it_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """Sparrow's title names no matching (its probes pick the workers); PigeonC's names the one it ran."""
    assert cli.main([*SMALL, "--no-files", "--scheduler", "sparrow"]) == 0
    assert "Sparrow replay of syn:10:4 (slot mode)" in capsys.readouterr().out
    pigeonc = ["--scheduler", "pigeonc", "--workers-per-partition", "60"]  # a node for each of its 100 masters
    assert cli.main([*SMALL, "--no-files", *pigeonc, "--matching", "min-constraints"]) == 0
    assert "Pigeonc replay of syn:10:4 (min-constraints matching, slot mode)" in capsys.readouterr().out
