"""One observer mechanism (common/core/observer.py): `observe` fans a core's events out to several observers, and
the services' meters are observers beside the job table and the recorder."""

from __future__ import annotations

from collections.abc import Sequence

from megha.common.core.fairness.config import FairnessConfig, QueueSpec
from megha.common.core.gm import GlobalMaster
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import LaunchBatch, Placement, StopRequest
from megha.common.core.observer import EVENTS, CoreObserver, Observers, observe, records
from megha.common.core.placement.choice import make_choice
from megha.common.core.task import JobSpec, TaskSpec
from megha.embedded.system import EmbeddedConfig, EmbeddedSystem
from megha.loadgen.recorder import Recorder, WallClockRecorder
from megha.services.gm.jobs import JobTable
from megha.services.gm.metrics import GMMeter
from megha.services.lm.metrics import LMMeter

from corekit import CAP, cluster, job, task


class Log(CoreObserver):
    """Records the events it implements, tagged with its name, into a shared list."""

    def __init__(self, name: str, seen: list[tuple[str, str, object]]) -> None:
        self.name = name
        self.seen = seen

    def finished(self, task_ids: Sequence[str], now: float) -> None:
        self.seen.append((self.name, "finished", tuple(task_ids)))

    def attempt(self, task: TaskSpec, now: float) -> None:
        self.seen.append((self.name, "attempt", task.task_id))


class OnlyFailures(CoreObserver):
    def __init__(self, seen: list[tuple[str, str, object]]) -> None:
        self.seen = seen

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None:
        self.seen.append(("failures", "task_failed", reason))


def test_every_event_goes_to_each_observer_that_records_it_in_order() -> None:
    seen: list[tuple[str, str, object]] = []
    fan = observe(Log("a", seen), OnlyFailures(seen), Log("b", seen))
    assert isinstance(fan, Observers)
    fan.finished(["t.0", "t.1"], 1.0)
    fan.attempt(task("t.2"), 2.0)
    fan.task_failed(task("t.3"), "boom", 3.0)
    fan.started([], 4.0)  # nobody records it: nothing happens
    assert seen == [
        ("a", "finished", ("t.0", "t.1")),
        ("b", "finished", ("t.0", "t.1")),
        ("a", "attempt", "t.2"),
        ("b", "attempt", "t.2"),
        ("failures", "task_failed", "boom"),
    ]


def test_an_event_one_observer_records_is_bound_straight_to_it_and_others_stay_no_ops() -> None:
    seen: list[tuple[str, str, object]] = []
    failures = OnlyFailures(seen)
    fan = observe(Log("a", seen), failures)
    assert fan.task_failed == failures.task_failed  # no loop in between
    assert not records(fan, "started") and records(fan, "finished") and records(fan, "task_failed")
    assert {name for name in EVENTS if records(fan, name)} == {"finished", "attempt", "task_failed"}


def test_one_observer_is_passed_as_it_is_and_none_is_the_no_op_base() -> None:
    recorder = Recorder()
    assert observe(recorder) is recorder
    assert type(observe()) is CoreObserver


def test_fan_outs_nest_and_see_events_the_base_class_declares_after_the_recorder_was_written() -> None:
    seen: list[tuple[str, str, object]] = []
    fan = observe(observe(Log("a", seen), Log("b", seen)), Log("c", seen))
    fan.finished(["x"], 0.0)
    assert [name for name, _, _ in seen] == ["a", "b", "c"]
    assert set(EVENTS) >= {"rejected", "preempting", "preemption_refused", "stopping", "launched", "decided"}


def test_a_wall_clock_recorder_in_a_fan_out_still_stamps_its_own_times() -> None:
    wall = WallClockRecorder()
    j = job("j", task("j.0"))
    wall.expect(0, j)
    observe(wall, Log("a", [])).job_arrived(j, 0, 1e9)  # the core's time is replaced by the wall clock's
    assert 0.0 <= wall.tasks["j.0"].arrival < 60.0


def test_the_gm_job_table_and_meter_observe_one_core_side_by_side() -> None:
    spec = cluster([[[[]]]])
    table = JobTable(0)
    meter = GMMeter(table)
    gm = GlobalMaster(0, spec, make_choice("random"), 0, observe(table, meter))
    lm = LocalMaster.in_cluster(spec, 0)
    out = gm.submit(JobSpec("j", (task("j.0"), task("j.1")), 10.0), 10.5)
    (batch,) = [o.msg for o in out if isinstance(o.msg, LaunchBatch)]  # j.0 placed; j.1 fits nowhere yet
    for o in lm.handle(batch, 11.0):
        if o.dest == "gm/0":
            gm.handle(o.msg, 11.0)
    # Attempts and the allocation time (decision at 10.5 of a job that arrived at 10.0) in the meter ...
    assert meter.allocation.attempts == 2 and meter.allocation.count == 1
    assert meter.allocation.sum == 0.5
    # ... read from the task states in the table, which knows nothing of the meter.
    assert [t.state for t in table.status("j").tasks] == ["launched", "queued"]
    assert not hasattr(table, "meter")
    # A decision for an ended task is not observed (the table logs it as an illegal event).
    fan = observe(table, meter)
    fan.task_completed(task("j.0"), "", 12.0, False)
    fan.decided([Placement(task("j.0"), 0, 0, False)], 13.0)
    assert meter.allocation.count == 1 and table.illegal == 1


def test_a_recovered_run_is_not_observed_as_an_allocation() -> None:
    table = JobTable(0)
    meter = GMMeter(table)
    fan = observe(table, meter)
    fan.job_arrived(job("j", task("j.0"), at=1.0), 0, 1.0)
    fan.decided([Placement(task("j.0"), 0, 0, False)], 5.0)  # recovered from an LM: no attempt here
    assert meter.allocation.count == 0
    fan.inconsistency(Placement(task("j.0"), 0, 0, False), 5.5)  # the LM refused it: queued again
    fan.attempt(task("j.0"), 6.0)
    fan.decided([Placement(task("j.0"), 0, 0, False)], 7.0)
    assert (meter.allocation.count, meter.allocation.sum) == (1, 6.0)


def test_the_lm_meter_counts_what_the_lm_core_decides() -> None:
    half = (CAP[0] // 2, CAP[1] // 2)
    spec = cluster([[[[]], [[]]]])  # one LM, a node in each of two GMs' partitions
    meter = LMMeter()
    lm = LocalMaster(0, spec.partitions[0], spec.resource_names, observer=meter)
    placements = [
        Placement(task("a.0", request=half), 0, 0, False),
        Placement(task("a.1", request=half), 0, 1, True),  # GM 1's node: a repartition
        Placement(task("a.2", request=CAP), 0, 0, False),  # node 0 has half left: an inconsistency
        Placement(task("a.3"), 0, 9, False),  # no such node: malformed
    ]
    lm.handle(LaunchBatch(0, 0, 1, placements), 1.0)
    lm.handle(StopRequest(0, 0, [("a.0", 1), ("a.1", 1)]), 2.0)
    assert (meter.launches, meter.repartitions, meter.inconsistencies, meter.malformed, meter.stops) == (2, 1, 1, 1, 2)
    assert (meter.launches, meter.repartitions, meter.inconsistencies, meter.stops) == (
        lm.launched,
        lm.repartitions,
        lm.inconsistencies,
        lm.stopped,
    )


def test_the_lm_meter_counts_preemptions_granted_beside_a_replays_recorder() -> None:
    fairness = FairnessConfig((QueueSpec("A", 0.5, 0), QueueSpec("B", 0.5, 1)), "share")
    spec = cluster([[[[]] * 2, [[]] * 2]])  # 4 slots on one LM; A takes them all, then B arrives
    recorder, meter = Recorder(), LMMeter()
    system = EmbeddedSystem(spec, EmbeddedConfig(fairness=fairness), observe(recorder, meter))
    a = JobSpec("a", tuple(TaskSpec(f"a.{i}", "a", "A", 100.0, CAP, 0) for i in range(4)), 0.0)
    b = JobSpec("b", tuple(TaskSpec(f"b.{i}", "b", "B", 10.0, CAP, 0) for i in range(2)), 1.0)
    for gm, j in ((0, a), (1, b)):
        recorder.expect(gm, j)
        system.submit(gm, j)
    system.run()
    (lm,) = system.lms
    assert meter.preemptions == lm.preemptions == sum(r.preemptions for r in recorder.tasks.values()) == 2
    assert meter.launches == lm.launched == 6 + 2  # every task once, and the two preempted ones again
    assert meter.preemption_refusals == lm.preemption_refusals
