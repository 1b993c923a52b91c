"""Job dependencies in the core: the GM's dependency gate holds a job until its parents finished, then queues it;
a parent that failed or was cancelled fails its children without running them, each reason naming the parent;
cancelling a waiting job cancels it; cycles are refused; and the embedded mode routes parent ends between GMs."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from pydantic import ValidationError

from megha.client.answers import submission
from megha.common.core.dependencies import DependencyGate, JobEnds
from megha.common.core.gm import GlobalMaster, Unschedulable
from megha.common.core.messages import LaunchBatch, Output, Send
from megha.common.core.observer import CoreObserver
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.models import MAX_ARRAY_RUN_CHARS, MAX_RUN_CHARS, MAX_TASKS_PER_JOB, JobSubmission
from megha.common.wire.fields import MAX_ENV
from megha.embedded.system import EmbeddedConfig, EmbeddedSystem
from megha.loadgen.dependencies import Chains, parse_dependencies
from megha.loadgen.recorder import Recorder
from megha.loadgen.replay import ReplayConfig, replay

from corekit import CAP, cluster, job, task


class Seen(CoreObserver):
    def __init__(self) -> None:
        self.waiting: list[str] = []
        self.released: list[str] = []
        self.failed: dict[str, str] = {}
        self.cancelled: list[str] = []

    def job_waiting(self, job: JobSpec, now: float) -> None:
        self.waiting.append(job.job_id)

    def job_released(self, job: JobSpec, now: float) -> None:
        self.released.append(job.job_id)

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None:
        self.failed[task.task_id] = reason

    def task_cancelled(self, task: TaskSpec, now: float) -> None:
        self.cancelled.append(task.task_id)


def _gm() -> tuple[GlobalMaster, Seen]:
    seen = Seen()
    return GlobalMaster(0, cluster([[[[]] * 4]]), observer=seen), seen


def _child(job_id: str, *parents: str, tasks: int = 2) -> JobSpec:
    return replace(job(job_id, *(task(f"{job_id}.{i}") for i in range(tasks))), depends_on=parents)


def _placed(outputs: list[Output]) -> list[str]:
    batches = [o.msg for o in outputs if isinstance(o, Send) and isinstance(o.msg, LaunchBatch)]
    return [p.task.task_id for batch in batches for p in batch.placements]


def test_a_child_waits_until_every_parent_finished_then_is_placed() -> None:
    gm, seen = _gm()
    assert gm.submit(_child("c", "p1", "p2"), 0.0) == []
    assert seen.waiting == ["c"] and not gm.queue and len(gm.dependencies) == 1
    assert gm.parent_ended("p1", "finished", 1.0) == []  # p2 still runs
    assert seen.released == []
    outputs = gm.parent_ended("p2", "finished", 2.0)
    assert seen.released == ["c"] and sorted(_placed(outputs)) == ["c.0", "c.1"]
    assert not gm.dependencies.jobs and not gm.dependencies.children


def test_a_failed_or_cancelled_parent_fails_its_children_with_its_name_and_nothing_runs() -> None:
    gm, seen = _gm()
    gm.submit(_child("c", "p1", "p2"), 0.0)
    gm.submit(_child("d", "p2", tasks=1), 0.0)
    assert gm.parent_ended("p2", "failed", 1.0) == []
    assert seen.failed == {
        "c.0": "dependency: parent job p2 failed; this job did not run",
        "c.1": "dependency: parent job p2 failed; this job did not run",
        "d.0": "dependency: parent job p2 failed; this job did not run",
    }
    assert not gm.dependencies.jobs and not gm.dependencies.children  # c no longer waits for p1 either
    gm.submit(_child("e", "p3", tasks=1), 2.0)
    gm.parent_ended("p3", "cancelled", 3.0)
    assert seen.failed["e.0"] == "dependency: parent job p3 was cancelled; this job did not run" and not seen.released


def test_an_end_told_twice_or_of_a_job_nobody_awaits_changes_nothing() -> None:
    gm, seen = _gm()
    gm.submit(_child("c", "p"), 0.0)
    assert gm.parent_ended("x", "failed", 0.5) == [] and not seen.failed
    gm.parent_ended("p", "finished", 1.0)
    assert gm.parent_ended("p", "finished", 1.5) == [] and gm.parent_ended("p", "failed", 2.0) == []
    assert seen.released == ["c"] and not seen.failed
    with pytest.raises(ValueError, match="outcome 'lost'"):
        gm.parent_ended("p", "lost", 3.0)


def test_cancelling_a_waiting_job_cancels_its_tasks_and_it_never_runs() -> None:
    gm, seen = _gm()
    gm.submit(_child("c", "p"), 0.0)
    gm.cancel(["c.0", "c.1"], 1.0)
    assert sorted(seen.cancelled) == ["c.0", "c.1"] and gm.cancelled == 2
    assert not gm.dependencies.jobs and not gm.dependencies.children
    assert gm.parent_ended("p", "finished", 2.0) == [] and seen.released == []


def test_self_dependency_and_cycles_are_refused_naming_depends_on() -> None:
    gm, _ = _gm()
    with pytest.raises(Unschedulable, match=r"dependency cycle a -> a") as exc:
        gm.submit(_child("a", "a"), 0.0)
    assert exc.value.field == "depends_on"
    gm.submit(_child("b", "c"), 0.0)  # c does not exist yet: a driver that checks parents refuses it first
    gm.submit(_child("d", "b"), 0.0)
    with pytest.raises(Unschedulable, match=r"dependency cycle c -> d -> b -> c"):
        gm.submit(_child("c", "d"), 0.0)
    assert sorted(gm.dependencies.jobs) == ["b", "d"]


def test_the_gate_alone_releases_in_any_order_of_ends() -> None:
    gate = DependencyGate()
    gate.hold(_child("c", "p", "q"))
    gate.hold(_child("d", "q"))
    assert gate.parent_ended("q", "finished") == ([_child("d", "q")], [])
    assert sorted(gate.awaited()) == ["p"]
    released, failed = gate.parent_ended("p", "finished")
    assert [j.job_id for j in released] == ["c"] and failed == [] and not gate.awaited()


def test_job_ends_reports_each_job_once_with_its_worst_outcome() -> None:
    ended: list[tuple[str, str]] = []
    ends = JobEnds(lambda job_id, outcome, now: ended.append((job_id, outcome)))
    ends.job_arrived(job("a", task("a.0"), task("a.1")), 0, 0.0)
    ends.task_completed(task("a.0"), "", 1.0, False)
    assert ended == [] and ends.known("a") and ends.outcome("a") is None
    ends.task_completed(task("a.1"), "exit 1", 2.0, False)
    ends.job_arrived(job("b", task("b.0")), 0, 0.0)
    ends.task_cancelled(task("b.0"), 3.0)
    ends.job_rejected(job("r", task("r.0")), 0, "no node", 4.0)
    assert ended == [("a", "failed"), ("b", "cancelled"), ("r", "failed")] and ends.outcome("a") == "failed"


def _system(gms: int = 2) -> tuple[EmbeddedSystem, Recorder]:
    recorder = Recorder()
    spec = cluster([[[[]] * 2 for _ in range(gms)]])
    return EmbeddedSystem(spec, EmbeddedConfig(dependencies=True), recorder), recorder


def _burn(job_id: str, n: int, duration: float, at: float, *parents: str, user: str = "u") -> JobSpec:
    tasks = tuple(TaskSpec(f"{job_id}.{i}", job_id, user, duration, CAP, 0) for i in range(n))
    return JobSpec(job_id, tasks, at, parents)


def test_embedded_a_child_on_gm_1_runs_after_its_parent_on_gm_0_finished() -> None:
    system, recorder = _system()
    parent, child = _burn("p", 2, 5.0, 0.0), _burn("c", 1, 1.0, 0.1, "p")
    for gm, j in ((0, parent), (1, child)):
        recorder.expect(gm, j)
        system.submit(gm, j)
    system.run()
    tasks = recorder.tasks
    parent_done = max(tasks.columns["finished_at"][tasks.number[t]] for t in ("p.0", "p.1"))
    child_start = tasks.columns["started_at"][tasks.number["c.0"]]
    assert parent_done >= 5.0 and child_start >= parent_done
    assert all(r.completions == 1 for r in tasks.values()) and system.stranded_tasks() == []


def test_embedded_a_failed_parent_fails_its_grandchildren_across_gms() -> None:
    system, recorder = _system()
    rejected = _burn("p", 1, 1.0, 0.0)
    rejected = replace(rejected, tasks=(replace(rejected.tasks[0], request=(CAP[0] * 2, CAP[1])),))  # fits nowhere
    jobs = [(0, rejected), (1, _burn("c", 1, 1.0, 0.1, "p")), (0, _burn("g", 1, 1.0, 0.2, "c"))]
    for gm, j in jobs:
        recorder.expect(gm, j)
        system.submit(gm, j)
    system.run()
    assert [j.job_id for j, _ in system.rejected] == ["p"]
    reasons = recorder.tasks.columns["failed_reason"]
    assert reasons[recorder.tasks.number["c.0"]] == "dependency: parent job p failed; this job did not run"
    assert reasons[recorder.tasks.number["g.0"]] == "dependency: parent job c failed; this job did not run"
    assert system.stranded_tasks() == []


def test_embedded_an_unknown_parent_is_refused_naming_depends_on() -> None:
    system, recorder = _system()
    child = _burn("c", 1, 1.0, 0.0, "nope")
    recorder.expect(0, child)
    system.submit(0, child)
    system.run()
    assert [(j.job_id, why) for j, why in system.rejected] == [("c", "job c: no job nope")]


# ------------------------------------------------------------------ the wire: arrays and depends_on


def _body(**fields: object) -> dict[str, object]:
    task = {"driver": "exec", "command": ["sh", "-c", "echo $MEGHA_ARRAY_INDEX"], "cpu_millicores": 100, "memory_mb": 8}
    return {"tasks": [task], **fields}


def _error_field(body: dict[str, object]) -> str:
    with pytest.raises(ValidationError) as exc:
        JobSubmission.model_validate(body)
    return ".".join(str(part) for part in exc.value.errors()[0]["loc"])


def test_an_array_expands_its_one_template_into_n_tasks_each_with_its_index() -> None:
    sub = JobSubmission.model_validate(_body(array=3, depends_on=["g0-abc-1", "alice~x~g1-abc-2"]))
    tasks = sub.to_tasks("j", ("cpu_millicores", "memory_mb"))
    assert [t.task_id for t in tasks] == ["j.0", "j.1", "j.2"]
    assert [dict(t.run.env)["MEGHA_ARRAY_INDEX"] for t in tasks if t.run is not None] == ["0", "1", "2"]
    assert len(JobSubmission.model_validate(_body()).to_tasks("j", ("cpu_millicores", "memory_mb"))) == 1


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"array": 0}, "array"),
        ({"array": MAX_TASKS_PER_JOB + 1}, "array"),
        ({"array": True}, "array"),
        ({"depends_on": ["a b"]}, "depends_on.0"),
        ({"depends_on": ["p", "p"]}, "depends_on.1"),
        ({"job_id": "me", "depends_on": ["p", "me"]}, "depends_on.1"),
        ({"job_id": "me", "user": "bob", "depends_on": ["bob~me"]}, "depends_on.0"),
    ],
)
def test_bad_arrays_and_parents_are_refused_naming_the_field(fields: dict[str, object], field: str) -> None:
    assert _error_field(_body(**fields)) == field


def test_an_array_whose_template_leaves_no_room_for_the_index_is_refused_naming_array() -> None:
    body = _body(array=10)
    body["tasks"][0]["env"] = {f"V{i}": "x" for i in range(MAX_ENV)}  # type: ignore[index]
    assert _error_field(body) == "array"
    room = MAX_RUN_CHARS - sum(map(len, body["tasks"][0]["command"])) - 4 * 2 - 10  # type: ignore[index]
    body["tasks"][0]["env"] = {f"V{i}": "x" * (room // 4 + (i < room % 4)) for i in range(4)}  # type: ignore[index]
    JobSubmission.model_validate(body | {"array": None})
    assert _error_field(body) == "array"


def test_an_array_that_would_expand_past_its_runs_bound_is_refused_naming_array() -> None:
    """A small request must not make every service hold hundreds of MB: 2,000 copies of a 64 KB template (sent in
    64 KB) are refused, naming `array`; as many copies of a small one are not."""
    body = _body(array=2_000)
    body["tasks"][0]["env"] = {f"X{i}": "A" * 16_000 for i in range(4)}  # type: ignore[index]
    assert _error_field(body) == "array"
    JobSubmission.model_validate(body | {"array": MAX_ARRAY_RUN_CHARS // 70_000})
    body["tasks"][0]["env"] = {"X": "A" * 100}  # type: ignore[index]
    JobSubmission.model_validate(body | {"array": 10_000})


def test_an_array_of_two_templates_is_refused_naming_array() -> None:
    body = _body(array=2)
    body["tasks"] = body["tasks"] * 2  # type: ignore[operator]
    assert _error_field(body) == "array"


# ------------------------------------------------------------------ megha replay --dependencies


def test_a_replay_with_chains_runs_every_child_after_its_parent_and_counts_every_job() -> None:
    result = replay(
        ReplayConfig(
            trace="syn:50:12", gms=3, lms=2, workers_per_partition=4, constraints=False, dependencies="chain:2"
        )
    )
    tasks, jobs = result.recorder.tasks, result.recorder.jobs
    column = tasks.columns
    ended = {j: max(column["finished_at"][tasks.number[f"{j}.{i}"]] for i in range(50)) for j in jobs}
    for k in range(2, 12):
        started = min(column["started_at"][tasks.number[f"j{k}.{i}"]] for i in range(50))
        assert started >= ended[f"j{k - 2}"], k
    assert result.metrics.jobs == 12 and all(r.completions == 1 for r in tasks.values())


@pytest.mark.parametrize("spec", ["chain", "chain:0", "chain:2:0", "chain:2:1.5", "tree:2", "chain:x"])
def test_bad_dependency_specs_are_refused_with_the_syntax(spec: str) -> None:
    with pytest.raises(ValueError, match="expected chain:K or chain:K:FRACTION"):
        parse_dependencies(spec)
    assert parse_dependencies("none") is None and parse_dependencies("chain:3:0.5") == Chains(3, 0.5)


def test_a_parent_its_gm_forgot_fails_its_children_saying_so() -> None:
    gm, seen = _gm()
    gm.submit(_child("c", "p", tasks=1), 0.0)
    gm.parent_ended("p", "forgotten", 1.0)
    assert seen.failed == {
        "c.0": "dependency: parent job p is no longer known to its GM (forgotten or lost); this job did not run"
    }


def test_the_python_client_and_job_files_pass_both_fields_through() -> None:
    job = submission(_body(array=2, depends_on=["prepare"]))
    assert (job.array, job.depends_on) == (2, ["prepare"])
    assert json.loads(job.model_dump_json(exclude_defaults=True))["depends_on"] == ["prepare"]


def test_a_parent_named_twice_is_awaited_once() -> None:
    gm, seen = _gm()
    gm.submit(_child("c", "p", "p"), 0.0)
    assert gm.dependencies.awaited() == ["p"] and gm.dependencies.children == {"p": ["c"]}
    gm.parent_ended("p", "finished", 1.0)
    assert seen.released == ["c"] and not gm.dependencies.children


def test_embedded_a_gang_child_is_released_to_the_gang_scheduler_and_starts_whole() -> None:
    """A gang that waits for a parent is placed as a gang once released: its four tasks need every node of the
    data centre, so none starts before the parent's two tasks end, and all start together."""
    system, recorder = _system()
    parent = _burn("p", 2, 5.0, 0.0)
    child = replace(_burn("c", 4, 1.0, 0.1, "p"), gang=math.inf)
    for gm, j in ((0, parent), (1, child)):
        recorder.expect(gm, j)
        system.submit(gm, j)
    system.run()
    tasks = recorder.tasks
    column = tasks.columns
    parent_done = max(column["finished_at"][tasks.number[t]] for t in ("p.0", "p.1"))
    starts = [column["started_at"][tasks.number[f"c.{i}"]] for i in range(4)]
    assert min(starts) >= parent_done and max(starts) - min(starts) < 0.01, (parent_done, starts)
    assert all(r.completions == 1 for r in tasks.values()) and system.stranded_tasks() == []
