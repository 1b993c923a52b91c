"""Wire models: lossless round trips of every core message through JSON, and validation errors naming the field."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from megha.common import models
from megha.common.core import messages
from megha.common.core.constraints import ALL_CONSTRAINTS_MASK, constraint_mask
from megha.common.core.resources import CPU, MEMORY, Resources
from megha.common.core.task import RunSpec, TaskSpec
from megha.common.limits import MAX_WAIT_SECONDS
from megha.common.models import (
    MAX_BODY_BYTES,
    BrokerMessage,
    ErrorBody,
    FinishedTaskModel,
    JobStatus,
    JobSubmission,
    NodeStateModel,
    TaskEvent,
    TaskSpecModel,
    WorkerNode,
    WorkerRegistration,
    core_json,
    to_wire,
    validation_error_body,
)

# --- strategies for core messages ----------------------------------------------------------------------------

ids = st.text("abcdefghijklmnopqrstuvwxyz0123456789_.-", min_size=1, max_size=20)
index = st.integers(0, 2**40)
seconds = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)
amounts = st.lists(st.integers(0, 2**40), min_size=1, max_size=4).map(tuple)

args = st.lists(
    st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=12), max_size=4
).map(tuple)
envs = st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), st.text("ab= $", max_size=8)).map(
    lambda env: tuple(env.items())
)
workdirs = st.sampled_from(["", "/", "/tmp/work dir"])
run_specs = st.builds(
    RunSpec,
    driver=st.just("exec"),
    command=st.tuples(ids).flatmap(lambda program: args.map(lambda rest: program + rest)),
    env=envs,
    workdir=workdirs,
) | st.builds(
    RunSpec,
    driver=st.just("container"),
    command=args,
    image=st.sampled_from(["megha:latest", "python:3.11-slim", "ghcr.io/org/app@sha256:" + "0" * 64]),
    env=envs,
    workdir=workdirs,
)
BY_NAME: dict[str, st.SearchStrategy[Any]] = {
    "attempt": st.integers(1, 5),
    "run_number": st.integers(1, 5),
    "error": st.text(max_size=20),
    "reason": st.text(max_size=40),
    "constraints": st.integers(0, ALL_CONSTRAINTS_MASK),
    "kind": st.sampled_from(["started", "finished", "preempted", "lost", "failed", "cancelled"]),
    "runs": st.lists(st.tuples(ids, st.integers(1, 5)), max_size=4),  # StopRequest: (task id, attempt)
    "lost": st.just(False),  # FinishedTask: the LM sets it, never the wire
    "exit_code": st.none() | st.integers(0, 255),  # FinishedTask, Completion: a process's exit code
    "lease_s": st.floats(min_value=0, max_value=MAX_WAIT_SECONDS),  # GangPrepare: at most a day
}
"""Strategies of the fields whose values the wire bounds more than their core type does, by field name."""
BY_TYPE: dict[Any, st.SearchStrategy[Any]] = {
    int: index,
    str: ids,
    float: seconds,
    bool: st.booleans(),
    Resources: amounts,
    RunSpec: run_specs,
}


def _values(hint: Any) -> st.SearchStrategy[Any]:
    """Values of the core type `hint`: core messages built field by field, lists of up to 4."""
    if hint in BY_TYPE:
        return BY_TYPE[hint]
    if isinstance(hint, type) and (dataclasses.is_dataclass(hint) or hasattr(hint, "_fields")):
        hints = typing.get_type_hints(hint)
        return st.builds(hint, **{name: BY_NAME[name] if name in BY_NAME else _values(h) for name, h in hints.items()})
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return st.lists(_values(args[0]), max_size=4)
    if origin is dict:
        return st.dictionaries(_values(args[0]), _values(args[1]), max_size=3)
    if type(None) in args:
        return st.none() | _values(next(a for a in args if a is not type(None)))
    raise TypeError(f"no strategy for {hint}")


CORE_MESSAGES: dict[type, st.SearchStrategy[Any]] = {
    t: _values(t) for t in models.CORE_MIRRORS if t.__module__ in (messages.__name__, TaskSpec.__module__)
}


def _same(a: object, b: object) -> None:
    """Equal, and of the same types all the way down (a list where the core has a tuple would be a bug)."""
    assert type(a) is type(b), (type(a), type(b))
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)  # type: ignore[arg-type]
        for x, y in zip(a, b):  # type: ignore[call-overload]
            _same(x, y)
    else:
        assert a == b


# --- round trips ---------------------------------------------------------------------------------------------


def test_every_core_message_has_a_mirror() -> None:
    timers_and_envelopes = {messages.Send, messages.Wake, messages.DeltaTick, messages.FinishTick}
    timers_and_envelopes |= {messages.LeaseExpiry, messages.GangRetry, messages.GangTimeout}
    core = {
        obj
        for obj in vars(messages).values()
        if isinstance(obj, type) and obj.__module__ == messages.__name__ and obj not in timers_and_envelopes
    }
    assert core == set(CORE_MESSAGES) - {TaskSpec, RunSpec}
    assert set(models.CORE_MIRRORS) == set(CORE_MESSAGES)


@pytest.mark.parametrize("core_type", list(CORE_MESSAGES), ids=lambda t: t.__name__)
def test_core_messages_travel_losslessly_and_core_json_is_the_json_of_the_model(core_type: type) -> None:
    """core -> model -> JSON -> model -> core gives back an equal object; the services' send path (no models
    built) writes what the model would, and it validates back."""
    model_type = models.CORE_MIRRORS[core_type]

    @given(CORE_MESSAGES[core_type])
    def check(obj: Any) -> None:
        wire = to_wire(obj)
        assert type(wire) is model_type
        _same(model_type.model_validate_json(wire.model_dump_json()).to_core(), obj)
        raw = core_json(obj)
        assert raw == model_type.core_json(obj)
        assert json.loads(raw) == json.loads(wire.model_dump_json())
        assert model_type.model_validate_json(raw) == wire
        _same(model_type.model_validate_json(raw).to_core(), obj)

    check()


def test_broker_message_core_json_carries_one_core_message() -> None:
    delta = messages.Delta(1, 0, 3, [messages.NodeState(2, (5, 6), 9)])
    done = messages.Completions(
        1, 0, 3, [messages.Completion("j.0", messages.NodeState(2, (5, 6), 10), "oom", preempted=True)]
    )
    report = messages.WorkerReport(1, [messages.FinishedTask("j.0", 2, error="oom")])
    for msg, field in ((delta, "delta"), (done, "completions"), (report, "worker_report")):
        envelope = BrokerMessage.model_validate_json(BrokerMessage.core_json(msg))
        _same(getattr(envelope, field).to_core(), msg)
    with pytest.raises(TypeError, match="no wire model for DeltaTick"):
        core_json(messages.DeltaTick())


def test_wire_format_of_a_placement() -> None:
    task = TaskSpec("j.0", "j", "alice", 2.5, (1000, 512), constraint_mask([20, 0, 4]))
    wire = json.loads(to_wire(messages.Placement(task, 1, 7, True)).model_dump_json())
    assert wire == {
        "task": {
            "task_id": "j.0",
            "job_id": "j",
            "user": "alice",
            "duration": 2.5,
            "request": [1000, 512],
            "constraints": [0, 4, 20],
            "attempt": 1,
            "run": None,
            "priority": 0,
            "queueable": False,
            "run_number": 1,
        },
        "lm": 1,
        "node": 7,
        "repartition": True,
        "gm": 0,
    }


def test_unsorted_constraints_on_the_wire_give_the_same_mask() -> None:
    body = {"task_id": "t", "job_id": "j", "user": "u", "duration": 1, "request": [1], "constraints": [9, 2]}
    assert TaskSpecModel.model_validate(body).to_core().constraints == constraint_mask([2, 9])


def test_to_wire_refuses_a_type_without_a_mirror() -> None:
    with pytest.raises(TypeError, match="DeltaTick"):
        to_wire(messages.DeltaTick())


def test_finished_task_measurements_reach_the_core_and_lost_is_never_on_the_wire() -> None:
    wire = FinishedTaskModel.from_core(messages.FinishedTask("t", 3, preempted=True, lost=True))
    assert "lost" not in wire.model_dump()
    assert (wire.cpu_seconds, wire.execution_delay, wire.started_at, wire.finished_at, wire.error) == (
        0.0,
        0.0,
        None,
        None,
        "",
    )
    measured = FinishedTaskModel(task_id="t", node=3, cpu_seconds=1.5, started_at=10.0, finished_at=12.0, error="oom")
    assert measured.to_core() == messages.FinishedTask(
        "t", 3, False, "oom", cpu_seconds=1.5, started_at=10.0, finished_at=12.0
    )
    with pytest.raises(ValidationError, match="lost"):
        FinishedTaskModel.model_validate({"task_id": "t", "node": 3, "lost": True})


# --- submission API ------------------------------------------------------------------------------------------


def _task(**overrides: Any) -> dict[str, Any]:
    return {"duration": 1.5, "cpu_millicores": 500, "memory_mb": 256, "constraints": [1, 4], **overrides}


def _fields(model: type[BaseModel], body: Any) -> list[str]:
    """The field paths a body's validation errors name (the body is sent as JSON text, as a service gets it)."""
    raw = body if isinstance(body, str) else json.dumps(body)
    with pytest.raises(ValidationError) as err:
        model.model_validate_json(raw)
    return [d.field for d in validation_error_body(err.value).detail]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tasks": [_task(), _task(cpu_millicores=-1)]}, "tasks.1.cpu_millicores"),
        ({"tasks": [_task(memory_mb=0)]}, "tasks.0.memory_mb"),
        ({"tasks": [_task(constraints=[3, 21])]}, "tasks.0.constraints.1"),
        ({"tasks": [_task(constraints=[-1])]}, "tasks.0.constraints.0"),
        ({"tasks": [_task(constraints=[3, 5, 3])]}, "tasks.0.constraints"),
        ({"tasks": [_task(constraints=list(range(21)) * 2)]}, "tasks.0.constraints"),
        ({"tasks": []}, "tasks"),
        ({}, "tasks"),
        ({"tasks": [_task()] * 10_001}, "tasks"),
        ({"tasks": [_task(), _task(), _task(), _task(cpu_millicores="5")]}, "tasks.3.cpu_millicores"),
        ({"tasks": [_task(cpu_millicores=5.0)]}, "tasks.0.cpu_millicores"),
        ({"tasks": [_task(cpu_millicores=True)]}, "tasks.0.cpu_millicores"),
        ({"tasks": [_task(duration="1.5")]}, "tasks.0.duration"),
        ({"tasks": [_task(duration=-2.0)]}, "tasks.0.duration"),
        ({"tasks": [_task(duration=-1e-9)]}, "tasks.0.duration"),
        ('{"tasks": [{"duration": NaN, "cpu_millicores": 1, "memory_mb": 1}]}', "tasks.0.duration"),
        ('{"tasks": [{"duration": Infinity, "cpu_millicores": 1, "memory_mb": 1}]}', "tasks.0.duration"),
        ({"tasks": [_task(gpus=1)]}, "tasks.0.gpus"),
        ({"tasks": [_task()], "priority": 3}, "priority"),
        ({"tasks": [_task()], "user": "u" * 65}, "user"),
        ({"tasks": [_task()], "user": ""}, "user"),
        ({"tasks": [_task(user="u" * 65)]}, "tasks.0.user"),
        ({"tasks": [_task()], "job_id": "a/b"}, "job_id"),
        ({"tasks": [_task()], "job_id": "j" * 65}, "job_id"),
        ({"tasks": [_task()], "job_id": 7}, "job_id"),
        ("{not json", models.ROOT_FIELD),
        ("[]", models.ROOT_FIELD),
        ({"tasks": [_task(duration=None)]}, "tasks.0.duration"),
        ({"tasks": [{"cpu_millicores": 1, "memory_mb": 1}]}, "tasks.0.duration"),
        ({"tasks": [_task(driver="docker")]}, "tasks.0.driver"),
        ({"tasks": [_task(), _task(driver="exec")]}, "tasks.1.command"),
        ({"tasks": [_task(driver="exec", command=[])]}, "tasks.0.command"),
        ({"tasks": [_task(driver="exec", command=["", "x"])]}, "tasks.0.command"),
        ({"tasks": [_task(driver="exec", command=["echo", "a\x00b"])]}, "tasks.0.command.1"),
        ({"tasks": [_task(driver="exec", command=["x"] * 257)]}, "tasks.0.command"),
        ({"tasks": [_task(driver="exec", command=["x" * 16_385])]}, "tasks.0.command.0"),
        ({"tasks": [_task(driver="exec", command=["x" * 16_000] * 5)]}, "tasks.0.command"),
        ({"tasks": [_task(driver="exec", command="echo hi")]}, "tasks.0.command"),
        ({"tasks": [_task(driver="exec", command=["true"], image="megha:latest")]}, "tasks.0.image"),
        ({"tasks": [_task(driver="exec", command=["true"], workdir="tmp")]}, "tasks.0.workdir"),
        ({"tasks": [_task(driver="exec", command=["true"], env={"A": 1})]}, "tasks.0.env.A"),
        (
            {
                "tasks": [
                    _task(
                        driver="exec",
                        command=["true"],
                        env={"A": "x" * 16_000} | {f"B{i}": "x" * 16_000 for i in range(4)},
                    )
                ]
            },
            "tasks.0.env",
        ),
        ({"tasks": [_task(driver="container")]}, "tasks.0.image"),
        ({"tasks": [_task(driver="container", image="-v=/:/host")]}, "tasks.0.image"),
        ({"tasks": [_task(driver="container", image="Megha:latest")]}, "tasks.0.image"),
        ({"tasks": [_task(driver="container", image="a" * 256)]}, "tasks.0.image"),
        ({"tasks": [_task(command=["true"])]}, "tasks.0.command"),
        ({"tasks": [_task(image="megha:latest")]}, "tasks.0.image"),
        ({"tasks": [_task(env={"A": "b"})]}, "tasks.0.env"),
        ({"tasks": [_task(workdir="/tmp")]}, "tasks.0.workdir"),
    ],
)
def test_bad_submission_names_the_field(body: Any, field: str) -> None:
    assert _fields(JobSubmission, body) == [field]


def test_python_nan_and_inf_durations_are_refused() -> None:
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ValidationError) as err:
            JobSubmission.model_validate({"tasks": [_task(duration=bad)]})
        assert [d.field for d in validation_error_body(err.value).detail] == ["tasks.0.duration"]


def test_every_error_of_a_body_is_reported() -> None:
    body = {"tasks": [_task(cpu_millicores=0, memory_mb=-5)], "extra": 1}
    assert sorted(_fields(JobSubmission, body)) == ["extra", "tasks.0.cpu_millicores", "tasks.0.memory_mb"]


def test_error_body_is_itself_a_valid_wire_message() -> None:
    with pytest.raises(ValidationError) as err:
        JobSubmission.model_validate_json(json.dumps({"tasks": [_task(memory_mb=0)]}))
    body = validation_error_body(err.value)
    assert body.error == "invalid JobSubmission"
    assert "greater than 0" in body.detail[0].message
    assert ErrorBody.model_validate_json(body.model_dump_json()) == body


def test_valid_submission_defaults_and_json_ints_for_floats() -> None:
    sub = JobSubmission.model_validate_json(
        json.dumps({"tasks": [{"duration": 3, "cpu_millicores": 1, "memory_mb": 2}]})
    )
    assert sub.user == "default"
    assert sub.job_id is None
    assert sub.tasks[0].duration == 3.0
    assert sub.tasks[0].constraints == []


def test_a_task_of_zero_seconds_is_accepted() -> None:
    """Traces hold tasks that last 0 s; the API must take them (and keep the 0)."""
    sub = JobSubmission.model_validate_json(json.dumps({"tasks": [_task(duration=0), _task(duration=0.0)]}))
    assert [t.duration for t in sub.to_tasks("j", (CPU, MEMORY))] == [0.0, 0.0]


def test_to_tasks_builds_core_task_specs() -> None:
    sub = JobSubmission.model_validate(
        {
            "user": "alice",
            "job_id": "job-1",
            "tasks": [_task(constraints=[20, 0]), _task(duration=7, cpu_millicores=9, memory_mb=11, user="bob")],
        }
    )
    assert sub.to_tasks("job-1", (CPU, MEMORY)) == (
        TaskSpec("job-1.0", "job-1", "alice", 1.5, (500, 256), (1 << 20) | 1),
        TaskSpec("job-1.1", "job-1", "bob", 7.0, (9, 11), constraint_mask([1, 4])),
    )


def test_to_tasks_carries_what_exec_and_container_tasks_run() -> None:
    sub = JobSubmission.model_validate(
        {
            "tasks": [
                _task(driver="exec", command=["sh", "-c", "echo $A"], env={"A": "1", "B": "2"}, workdir="/tmp"),
                {"cpu_millicores": 100, "memory_mb": 64, "driver": "container", "image": "megha:latest"},
                _task(),
            ]
        }
    )
    exec_task, container_task, burn_task = sub.to_tasks("j", (CPU, MEMORY))
    assert exec_task.run == RunSpec("exec", ("sh", "-c", "echo $A"), "", (("A", "1"), ("B", "2")), "/tmp")
    assert (exec_task.driver, exec_task.duration) == ("exec", 1.5)
    assert container_task.run == RunSpec("container", image="megha:latest")
    assert (container_task.driver, container_task.duration) == ("container", 0.0)  # no time limit
    assert (burn_task.run, burn_task.driver) == (None, "burn")


def test_a_journaled_submission_keeps_what_its_tasks_run() -> None:
    """The GM journals a submission as `model_dump(mode="json", exclude_defaults=True)` and recovers it with
    `model_validate` (services/gm/service.py): a recovered exec or container task still has its `run`."""
    sub = JobSubmission.model_validate_json(
        json.dumps(
            {
                "job_id": "j",
                "tasks": [
                    {
                        "cpu_millicores": 1,
                        "memory_mb": 2,
                        "driver": "exec",
                        "command": ["echo", "hi"],
                        "env": {"A": "1"},
                    },
                    {
                        "cpu_millicores": 1,
                        "memory_mb": 2,
                        "driver": "container",
                        "image": "megha:latest",
                        "duration": 9,
                    },
                    _task(),
                ],
            }
        )
    )
    record = json.loads(json.dumps(sub.model_dump(mode="json", exclude_defaults=True)))
    assert JobSubmission.model_validate(record).to_tasks("j", (CPU, MEMORY)) == sub.to_tasks("j", (CPU, MEMORY))
    assert [t.driver for t in sub.to_tasks("j", (CPU, MEMORY))] == ["exec", "container", "burn"]


def test_to_tasks_aligns_requests_to_the_resource_names() -> None:
    sub = JobSubmission.model_validate({"tasks": [_task()]})
    (task,) = sub.to_tasks("j", ("gpus", MEMORY, CPU))
    assert task.request == (0, 256, 500)
    with pytest.raises(ValueError, match=MEMORY):
        sub.to_tasks("j", (CPU, "gpus"))


def test_a_maximal_submission_fits_the_body_limit() -> None:
    task = _task(duration=1234567.891234567, cpu_millicores=2**31, memory_mb=2**31, constraints=list(range(21)))
    sub = JobSubmission(
        tasks=[models.TaskRequest(**task, user="u" * 64)] * models.MAX_TASKS_PER_JOB,
        user="u" * 64,
        job_id="j" * 64,
    )
    # As a client sends it: the fields of other drivers left out.
    assert len(sub.model_dump_json(indent=1, exclude_defaults=True).encode()) < MAX_BODY_BYTES


def test_job_status_round_trips_and_checks_states() -> None:
    status = {
        "job_id": "j",
        "user": "alice",
        "gm": 0,
        "tasks": [
            {"task_id": "j.0", "state": "finished", "arrival": 1.0, "launched_at": 1.1, "started_at": 1.2,
             "finished_at": 3.0, "lm": 2, "node": 17, "attempts": 2, "inconsistencies": 1, "repartitioned": True},
            {"task_id": "j.1", "state": "queued", "arrival": 1.0},
        ],
    }  # fmt: skip
    parsed = JobStatus.model_validate_json(json.dumps(status))
    assert parsed.tasks[1].lm is None and parsed.tasks[1].failed_reason is None
    assert JobStatus.model_validate_json(parsed.model_dump_json()) == parsed
    status["tasks"][1]["state"] = "lost"
    assert _fields(JobStatus, status) == ["tasks.1.state"]


# --- mirrors, registration and events validate too -----------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"node": 0, "free": [1, -1], "version": 0}, "free.1"),
        ({"node": 0, "free": [], "version": 0}, "free"),
        ({"node": -1, "free": [1], "version": 0}, "node"),
        ({"node": 0, "free": [1], "version": "3"}, "version"),
        ({"node": 0, "free": [1], "version": 0, "gm": 1}, "gm"),
    ],
)
def test_bad_node_state_names_the_field(body: dict[str, Any], field: str) -> None:
    assert _fields(NodeStateModel, body) == [field]


def _registration(**overrides: Any) -> dict[str, Any]:
    node = {"capacity": {CPU: 2000, MEMORY: 4096}, "constraints": [0, 3]}
    return {"worker_id": "w-1", "url": "http://10.0.0.5:8080", "nodes": [node, node], **overrides}


def test_worker_registration_gives_core_capacities() -> None:
    reg = WorkerRegistration.model_validate_json(json.dumps(_registration()))
    node = reg.nodes[0]
    assert node.resources((MEMORY, CPU)) == (4096, 2000)
    assert constraint_mask(node.constraints) == 0b1001
    with pytest.raises(ValueError, match="differ"):
        node.resources((CPU, MEMORY, "gpus"))
    with pytest.raises(ValueError, match="differ"):
        WorkerNode(capacity={CPU: 1}).resources((CPU, MEMORY))
    assert reg.drivers == ["burn"]  # an agent that does not say offers burn only
    assert WorkerRegistration.model_validate(_registration(drivers=["exec", "burn"])).drivers == ["exec", "burn"]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"nodes": []}, "nodes"),
        ({"nodes": [{"capacity": {CPU: 0, MEMORY: 1}}]}, f"nodes.0.capacity.{CPU}"),
        ({"nodes": [{"capacity": {}}]}, "nodes.0.capacity"),
        ({"nodes": [{"capacity": {CPU: 1}, "constraints": [21]}]}, "nodes.0.constraints.0"),
        ({"url": "ftp://x"}, "url"),
        ({"worker_id": ""}, "worker_id"),
        ({"drivers": []}, "drivers"),
        ({"drivers": ["exec", "exec"]}, "drivers"),
        ({"drivers": ["raw_exec"]}, "drivers.0"),
    ],
)
def test_bad_registration_names_the_field(overrides: dict[str, Any], field: str) -> None:
    assert _fields(WorkerRegistration, _registration(**overrides)) == [field]


def test_task_event_kinds_and_times() -> None:
    event = {"kind": "finished", "task_id": "j.0", "job_id": "j", "lm": 1, "node": 2, "at": 1.7e9}
    parsed = TaskEvent.model_validate_json(json.dumps(event))
    assert (parsed.cpu_seconds, parsed.execution_delay, parsed.error) == (0.0, 0.0, "")
    assert TaskEvent.model_validate_json(parsed.model_dump_json()) == parsed
    assert _fields(TaskEvent, {**event, "kind": "killed"}) == ["kind"]
    assert _fields(TaskEvent, {**event, "cpu_seconds": -1}) == ["cpu_seconds"]
    assert _fields(TaskEvent, '{"kind": "started", "task_id": "t", "job_id": "j", "lm": 0, "node": 0, '
                              '"at": NaN}') == ["at"]  # fmt: skip


def test_broker_message_carries_exactly_one_message() -> None:
    delta = messages.Delta(1, 0, 3, [messages.NodeState(2, (5, 6), 9)])
    envelope = BrokerMessage(delta=models.DeltaModel.from_core(delta))
    back = BrokerMessage.model_validate_json(envelope.model_dump_json())
    assert back.completions is None and back.worker_report is None
    assert back.delta is not None
    _same(back.delta.to_core(), delta)
    report = json.loads(models.WorkerReportModel.from_core(messages.WorkerReport(0, [])).model_dump_json())
    assert _fields(BrokerMessage, {}) == [models.ROOT_FIELD]
    assert _fields(BrokerMessage, {"delta": envelope.delta.model_dump(), "worker_report": report}) == [
        models.ROOT_FIELD
    ]
    assert _fields(BrokerMessage, {"gossip": {}}) == ["gossip"]
    beat = {"worker_id": "w", "lm": 0, "at": 1.0, "running": 2}
    assert BrokerMessage.model_validate({"heartbeat": beat}).heartbeat.running == 2  # type: ignore[union-attr]
