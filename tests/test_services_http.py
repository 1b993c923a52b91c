"""Every HTTP route of the GM, LM and worker-agent services refuses bad input at the edge: a 4xx whose body names
the offending field, never a 500. In-process (httpx's ASGI transport), no broker, no other service running."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import pytest
import pytest_asyncio
import uvicorn
from fastapi import FastAPI

from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.constraints import constraint_mask
from megha.common.core.messages import LaunchBatch, Placement, WorkerLaunch
from megha.common.core.task import TaskSpec
from megha.common.models import (
    MAX_BODY_BYTES,
    MAX_TASKS_PER_JOB,
    ROOT_FIELD,
    BrokerMessage,
    ErrorBody,
    JobAccepted,
    JobStatus,
    JobSubmission,
    LaunchResponseModel,
    TaskEvents,
    WorkerHeartbeat,
    WorkerRegistered,
    WorkerRegistration,
    WorkerReportModel,
)
from megha.common.settings import GMSettings, LMSettings, WorkerSettings
from megha.services.client import CallError, Reply, ServiceClient
from megha.services.gm.app import create_app as create_gm
from megha.services.http import JOURNAL_COPY_BYTES
from megha.services.lm.app import create_app as create_lm
from megha.services.lm.membership import RegistrationError
from megha.services.lm.service import LMService
from megha.services.worker.agent import WorkerAgent
from megha.services.worker.app import create_app as create_worker
from megha.services.worker.execution import ExecutionResult

from servicekit import wait_for

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]

NOWHERE = "http://127.0.0.1:9"  # the discard port: connections are refused at once, nothing is ever reached

# The GM's cluster: one LM, one GM, two nodes. Only node 0 satisfies constraints 0 and 1; node 1 is bigger.
CLUSTER = ClusterSpec(((PartitionSpec(0, 0, ((2000, 4096), (4000, 8192)), (constraint_mask([0, 1]), 0)),),))


@contextmanager
def silent_lm() -> Iterator[str]:
    """The URL of an LM that takes connections (the kernel accepts them) and never answers: a call may have reached
    it, so a launch that gets no answer fails its tasks."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        yield f"http://127.0.0.1:{silent.getsockname()[1]}"


def client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


def fields(r: httpx.Response) -> list[str]:
    """The fields an error response names (its body must be an ErrorBody)."""
    body = ErrorBody.model_validate(r.json())
    return [d.field for d in body.detail]


def assert_error(r: httpx.Response, status: int, field: str) -> ErrorBody:
    assert r.status_code == status, r.text
    assert field in fields(r), r.text
    return ErrorBody.model_validate(r.json())


async def post_raw(c: httpx.AsyncClient, path: str, content: bytes) -> httpx.Response:
    return await c.post(path, content=content, headers={"content-type": "application/json"})


# --------------------------------------------------------------------------------------------------- fixtures
# Tests that only send bad input share one app per service (module-scoped, on one module-wide event loop) and check
# it stayed untouched; tests that change state get a fresh app. Building an app costs tens of milliseconds.


def gm_app() -> FastAPI:
    settings = GMSettings(lm_urls=[NOWHERE], http_timeout=1.0, lm_timeout=0.5)
    return create_gm(settings, use_broker=False, cluster=CLUSTER)


def lm_app(expected_nodes: int = 4, num_gms: int = 2) -> FastAPI:
    return create_lm(LMSettings(expected_nodes=expected_nodes, num_gms=num_gms, http_timeout=1.0), use_broker=False)


def worker_app() -> FastAPI:
    """A simulated-execution agent of 2 nodes whose events and reports go to a RecordingBroker."""
    settings = WorkerSettings(execution="simulated", worker_id="w0", nodes=2, lm_url=NOWHERE)
    app = create_worker(settings, use_broker=False)
    app.state.agent.broker = RecordingBroker()
    return app


class RecordingBroker:
    """Stands in for RabbitMQ where an agent publishes task events and reports."""

    def __init__(self) -> None:
        self.published: list[tuple[str, str, dict[str, Any]]] = []

    async def publish(self, exchange: str, routing_key: str, body: bytes, headers: object = None) -> None:
        self.published.append((exchange, routing_key, json.loads(body)))

    publish_confirmed = publish  # as the broker's: here every message is confirmed at once

    async def backlog(self, exchange: str, routing_key: str) -> int:
        return 0  # nothing waits in the LM's queue


@asynccontextmanager
async def running(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app), client(app) as c:
        yield c


@asynccontextmanager
async def unstarted_worker() -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The worker's lifespan would register with an LM over real HTTP, so it is not run."""
    app = worker_app()
    try:
        async with client(app) as c:
            yield app, c
    finally:
        await app.state.agent.close()


async def register_all(lm: httpx.AsyncClient) -> None:
    """Complete a fresh lm_app(): 4 nodes from two agents; nodes 0-1 are GM 0's, 2-3 GM 1's."""
    for w in ("w0", "w1"):
        r = await lm.post("/v1/workers", json=registration(w, 2))
        assert r.status_code == 201, r.text


def register_worker(app: FastAPI, lm: int = 1, first_node: int = 4, nodes: int = 2) -> None:
    app.state.agent.registered = WorkerRegistered(worker_id="w0", lm=lm, first_node=first_node, nodes=nodes)


@pytest_asyncio.fixture(loop_scope="module")
async def gm() -> AsyncIterator[httpx.AsyncClient]:
    async with running(gm_app()) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="module")
async def lm() -> AsyncIterator[httpx.AsyncClient]:
    """An LM expecting 4 nodes for 2 GMs, none registered yet."""
    async with running(lm_app()) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="module")
async def ready_lm(lm: httpx.AsyncClient) -> httpx.AsyncClient:
    await register_all(lm)
    return lm


@pytest_asyncio.fixture(loop_scope="module")
async def worker() -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    async with unstarted_worker() as w:
        yield w


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_gm() -> AsyncIterator[httpx.AsyncClient]:
    async with running(gm_app()) as c:
        yield c


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_lm() -> AsyncIterator[httpx.AsyncClient]:
    async with running(lm_app()) as c:
        yield c


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_ready_lm() -> AsyncIterator[httpx.AsyncClient]:
    async with running(lm_app()) as c:
        await register_all(c)
        yield c


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_worker() -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    async with unstarted_worker() as (app, c):
        register_worker(app)
        yield app, c


@pytest_asyncio.fixture(loop_scope="module")
async def untouched_gm(shared_gm: httpx.AsyncClient) -> AsyncIterator[httpx.AsyncClient]:
    """The shared GM, checked to hold no job after the test."""
    yield shared_gm
    assert (await shared_gm.get("/v1/state")).json()["unfinished_tasks"] == 0


@pytest_asyncio.fixture(loop_scope="module")
async def untouched_lm(shared_ready_lm: httpx.AsyncClient) -> AsyncIterator[httpx.AsyncClient]:
    """The shared ready LM, checked to have allocated nothing and registered no more after the test."""
    yield shared_ready_lm
    state = (await shared_ready_lm.get("/v1/state")).json()
    assert (state["launched"], state["workers"], state["free"]) == (0, 2, [[2000, 4096]] * 4)


@pytest_asyncio.fixture(loop_scope="module")
async def untouched_worker(
    shared_worker: tuple[FastAPI, httpx.AsyncClient],
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The shared registered worker, checked to have started and published nothing after the test."""
    yield shared_worker
    app = shared_worker[0]
    assert app.state.agent.executor.running() == [] and app.state.agent.broker.published == []


@pytest_asyncio.fixture(loop_scope="module", params=["gm", "lm", "lm-launch", "worker"])
async def edge(
    request: pytest.FixtureRequest,
    untouched_gm: httpx.AsyncClient,
    untouched_lm: httpx.AsyncClient,
    untouched_worker: tuple[FastAPI, httpx.AsyncClient],
) -> tuple[httpx.AsyncClient, str]:
    """Each service's POST route, for what every route shares (JSON parsing, the body limit)."""
    return {
        "gm": (untouched_gm, "/v1/jobs"),
        "lm": (untouched_lm, "/v1/workers"),
        "lm-launch": (untouched_lm, "/v1/launch"),
        "worker": (untouched_worker[1], "/v1/tasks"),
    }[request.param]


# ------------------------------------------------------------------------------------------------ body builders


def task(**override: Any) -> dict[str, Any]:
    return {"duration": 5.0, "cpu_millicores": 500, "memory_mb": 256, **override}


def job(*tasks: dict[str, Any], **override: Any) -> dict[str, Any]:
    return {"tasks": list(tasks) or [task()], **override}


NODE = {"capacity": {"cpu_millicores": 2000, "memory_mb": 4096}, "constraints": [0]}


def registration(worker_id: str = "w0", nodes: int | list[Any] = 1, **override: Any) -> dict[str, Any]:
    """An agent offering `nodes` copies of NODE, or the given node list."""
    return {
        "worker_id": worker_id,
        "url": NOWHERE,
        "nodes": [NODE] * nodes if isinstance(nodes, int) else nodes,
        **override,
    }


def wire_task(task_id: str = "j.0", **override: Any) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "job_id": "j",
        "user": "u",
        "duration": 3600.0,
        "request": [100, 100],
        "constraints": [],
        **override,
    }


def placement(node: int = 0, lm: int = 0, repartition: bool = False, **task_override: Any) -> dict[str, Any]:
    return {"task": wire_task(**task_override), "lm": lm, "node": node, "repartition": repartition}


def batch(*placements: dict[str, Any], gm: int = 0, lm: int = 0, seq: int = 1) -> dict[str, Any]:
    return {"gm": gm, "lm": lm, "seq": seq, "placements": list(placements)}


def worker_launch(*placements: dict[str, Any], lm: int = 1) -> dict[str, Any]:
    return {"lm": lm, "launches": list(placements)}


# ------------------------------------------------------------------------------- shared edge: every service


@pytest.mark.parametrize(
    "content",
    [b'{"tasks": [', b"{'a': 1}", b"not json", b'{"a": 1,}', b"\xff\xfe"],
    ids=["truncated", "single-quotes", "bare-word", "trailing-comma", "not-utf8"],
)
async def test_malformed_json_is_422_about_the_body(edge: tuple[httpx.AsyncClient, str], content: bytes) -> None:
    c, path = edge
    r = await post_raw(c, path, content)
    assert_error(r, 422, ROOT_FIELD)
    assert fields(r) == [ROOT_FIELD]


@pytest.mark.parametrize("content", [b"[]", b"null", b"5", b'"x"', b""], ids=["list", "null", "int", "str", "empty"])
async def test_a_body_that_is_not_an_object_is_422(edge: tuple[httpx.AsyncClient, str], content: bytes) -> None:
    c, path = edge
    assert_error(await post_raw(c, path, content), 422, ROOT_FIELD)


async def test_body_over_the_limit_is_413(edge: tuple[httpx.AsyncClient, str]) -> None:
    c, path = edge
    big = b'{"x": "' + b"a" * MAX_BODY_BYTES + b'"}'
    r = await post_raw(c, path, big)
    assert r.request.headers["content-length"] == str(len(big))
    assert_error(r, 413, ROOT_FIELD)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(5):
            yield b" " * (MAX_BODY_BYTES // 4)

    r = await c.post(path, content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert r.request.headers["transfer-encoding"] == "chunked"
    assert_error(r, 413, ROOT_FIELD)

    r = await c.post(path, content=b"{}", headers={"content-type": "application/json", "content-length": "x"})
    assert r.status_code in (400, 413), r.text


async def test_a_journal_copy_may_be_larger_than_a_job_body(untouched_gm: httpx.AsyncClient) -> None:
    """A GM's journal copy to its peer carries whole jobs (up to the body limit each) as JSON strings, which may
    double them: its route takes up to JOURNAL_COPY_BYTES, every other route MAX_BODY_BYTES. (It was refused with
    413 once a journal outgrew 4 MiB, and the copy never caught up: jobs lost when the GM then failed.)"""
    line = json.dumps({"job": "x" * (MAX_BODY_BYTES // 2), "quotes": '"' * (MAX_BODY_BYTES // 4)})
    body = json.dumps({"reset": False, "lines": [line]}).encode()
    assert MAX_BODY_BYTES < len(body) < JOURNAL_COPY_BYTES
    r = await post_raw(untouched_gm, "/v1/peers/0/journal", body)
    assert r.status_code != 413, r.text  # whatever the GM says of a copy of its own journal, the body was read
    assert_error(await post_raw(untouched_gm, "/v1/jobs", body), 413, ROOT_FIELD)
    over = b'{"lines": ["' + b"a" * JOURNAL_COPY_BYTES + b'"]}'
    assert_error(await post_raw(untouched_gm, "/v1/peers/0/journal", over), 413, ROOT_FIELD)


async def test_a_journal_copy_goes_in_batches_within_the_body_limit() -> None:
    """A whole journal (a reset) larger than a body goes as several batches, the first replacing the copy, the
    others appended, each of at most MAX_BODY_BYTES of lines; a line longer than that goes alone."""
    from megha.services.gm.peers import Replicator

    lines = [json.dumps({"n": i, "job": "x" * (MAX_BODY_BYTES // 3)}) for i in range(7)] + ["y" * MAX_BODY_BYTES]
    sent: list[dict[str, Any]] = []

    class Peer:
        async def post(self, url: str, body: bytes) -> Reply:
            sent.append(json.loads(body))
            return Reply(200, b"{}")

    replicator = Replicator("http://peer", 0, journal=None, timeout=1.0, on_refused=print)  # type: ignore[arg-type]
    replicator._client = Peer()  # type: ignore[assignment]
    assert await replicator._post(True, lines) is None
    assert [batch["reset"] for batch in sent] == [True, False, False, False, False]  # 2 + 2 + 2 + 1 lines, then y
    assert [line for batch in sent for line in batch["lines"]] == lines  # all, in order
    assert all(sum(map(len, batch["lines"])) <= MAX_BODY_BYTES for batch in sent)


# ----------------------------------------------------------------------------------------------- GM /v1/jobs


BAD_JOBS: list[tuple[str, Any, str]] = [
    ("negative-cpu", job(task(cpu_millicores=-1)), "tasks.0.cpu_millicores"),
    ("zero-cpu", job(task(cpu_millicores=0)), "tasks.0.cpu_millicores"),
    ("zero-memory", job(task(memory_mb=0)), "tasks.0.memory_mb"),
    ("negative-duration", job(task(duration=-1.0)), "tasks.0.duration"),
    ("tiny-negative-duration", job(task(duration=-1e-9)), "tasks.0.duration"),
    ("string-nan-duration", job(task(duration="NaN")), "tasks.0.duration"),
    ("string-duration", job(task(duration="5")), "tasks.0.duration"),
    ("constraint-21", job(task(constraints=[21])), "tasks.0.constraints.0"),
    ("constraint-minus-1", job(task(constraints=[-1])), "tasks.0.constraints.0"),
    ("duplicate-constraints", job(task(constraints=[3, 3])), "tasks.0.constraints"),
    ("constraints-not-a-list", job(task(constraints=3)), "tasks.0.constraints"),
    ("empty-tasks", {"tasks": []}, "tasks"),
    ("missing-tasks", {"user": "u"}, "tasks"),
    ("too-many-tasks", {"tasks": [task()] * (MAX_TASKS_PER_JOB + 1)}, "tasks"),
    ("string-for-int", job(task(cpu_millicores="5")), "tasks.0.cpu_millicores"),
    ("float-for-int", job(task(memory_mb=1.5)), "tasks.0.memory_mb"),
    ("bool-for-int", job(task(cpu_millicores=True)), "tasks.0.cpu_millicores"),
    ("list-for-object", {"tasks": [[5.0, 500, 256]]}, "tasks.0"),
    ("object-for-list", {"tasks": task()}, "tasks"),
    ("missing-field", job({"duration": 1.0, "cpu_millicores": 5}), "tasks.0.memory_mb"),
    ("second-task-bad", job(task(), task(memory_mb=-5)), "tasks.1.memory_mb"),
    ("unknown-field", job(priority=1), "priority"),
    ("unknown-task-field", job(task(gpus=1)), "tasks.0.gpus"),
    ("bad-job-id", job(job_id="a b"), "job_id"),
    ("long-job-id", job(job_id="j" * 65), "job_id"),
    ("int-job-id", job(job_id=5), "job_id"),
    ("empty-user", job(user=""), "user"),
    ("long-task-user", job(task(user="u" * 65)), "tasks.0.user"),
]


@pytest.mark.parametrize(("body", "field"), [b[1:] for b in BAD_JOBS], ids=[b[0] for b in BAD_JOBS])
async def test_gm_refuses_bad_jobs(untouched_gm: httpx.AsyncClient, body: Any, field: str) -> None:
    assert_error(await untouched_gm.post("/v1/jobs", json=body), 422, field)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
async def test_gm_refuses_non_finite_durations(untouched_gm: httpx.AsyncClient, literal: str) -> None:
    raw = f'{{"tasks": [{{"duration": {literal}, "cpu_millicores": 5, "memory_mb": 5}}]}}'.encode()
    assert_error(await post_raw(untouched_gm, "/v1/jobs", raw), 422, "tasks.0.duration")


async def test_gm_names_every_bad_field(untouched_gm: httpx.AsyncClient) -> None:
    r = await untouched_gm.post("/v1/jobs", json=job(task(cpu_millicores=-1, memory_mb=0), task(duration=-1)))
    assert r.status_code == 422
    assert set(fields(r)) == {"tasks.0.cpu_millicores", "tasks.0.memory_mb", "tasks.1.duration"}


RAW_TASK = '"duration": 5.0, "cpu_millicores": 500, "memory_mb": 256'
RAW_EXEC = '"driver": "exec", "command": ["true"]'


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (f'{{"user": "alice", "user": "bob", "tasks": [{{{RAW_TASK}}}]}}', "user"),
        (f'{{"user": "alice", "tasks": [{{{RAW_TASK}}}], "user": "alice"}}', "user"),  # the same value twice too
        (f'{{"tasks": [{{{RAW_TASK}}}, {{{RAW_TASK}, "memory_mb": 512}}]}}', "tasks.1.memory_mb"),
        (f'{{"tasks": [{{{RAW_TASK}, {RAW_EXEC}, "env": {{"A": "1", "B": "2", "A": "3"}}}}]}}', "tasks.0.env.A"),
    ],
    ids=["user", "user-same-value", "second-task-field", "env-name"],
)
async def test_gm_refuses_a_job_with_a_key_given_twice(untouched_gm: httpx.AsyncClient, raw: str, field: str) -> None:
    """Readers disagree on which of a key's two values counts (Python's and pydantic's, the last): a proxy or an
    audit log that reads the first would see another user, another size or another environment than the GM."""
    JobSubmission.model_validate_json(raw)  # valid but for the key given twice: pydantic keeps the last value
    r = await post_raw(untouched_gm, "/v1/jobs", raw.encode())
    err = assert_error(r, 422, field)
    assert fields(r) == [field] and "given twice" in err.detail[0].message, r.text


@pytest.mark.parametrize(
    ("body", "reason", "field"),
    [
        (job(task(constraints=[5, 7])), "no node satisfies placement constraints [5, 7]", "tasks.0.constraints"),
        (job(task(constraints=[0, 1, 2])), "no node satisfies placement constraints [0, 1, 2]", "tasks.0.constraints"),
        (job(task(cpu_millicores=4001)), "has capacity", "tasks.0"),
        (job(task(memory_mb=8193)), "has capacity", "tasks.0"),
        (
            job(task(constraints=[0, 1], cpu_millicores=3000)),
            "no node satisfying placement constraints [0, 1] has",
            "tasks.0",
        ),
        (
            job(task(), task(constraints=[9])),
            "task J.1: no node satisfies placement constraints [9]",
            "tasks.1.constraints",
        ),
        (
            job(task(), task(driver="container", image="megha:latest")),
            "task J.1: no node offers driver 'container'",
            "tasks.1.driver",
        ),
    ],
    ids=["constraints", "constraint-superset", "cpu", "memory", "constraints-and-size", "second-task", "driver"],
)
async def test_gm_refuses_tasks_no_node_could_run(
    gm: httpx.AsyncClient, body: dict[str, Any], reason: str, field: str
) -> None:
    r = await gm.post("/v1/jobs", json={**body, "job_id": "J"})
    err = assert_error(r, 422, field)
    assert reason in err.error and reason in err.detail[0].message
    # an unschedulable job leaves nothing behind: its id stays free
    assert_error(await gm.get("/v1/jobs/J"), 404, "job_id")
    assert (await gm.post("/v1/jobs", json=job(job_id="J"))).status_code == 201


async def test_a_body_with_very_many_bad_fields_gets_the_first_50_named_and_their_count(gm: httpx.AsyncClient) -> None:
    """A body of 345,000 unknown keys took a GM 3.5 s to answer with 21 MB naming each; now the first 50."""
    body = {**job(task()), **{f"k{i}": 1 for i in range(2000)}}
    r = await gm.post("/v1/jobs", json=body)
    assert r.status_code == 422 and len(r.content) < 10_000, len(r.content)
    answer = r.json()
    assert len(answer["detail"]) == 50 and answer["detail"][0]["field"] == "k0"
    assert "(2000 errors; the first 50 are named)" in answer["error"]


async def test_a_job_for_a_gm_that_does_not_exist_is_422_naming_gm_not_503(gm: httpx.AsyncClient) -> None:
    """503 tells a client to try again (a GM's stand-in will take it); a GM the data centre does not have never
    will. A GM that exists but is not served here stays 503."""
    for gm_id in (CLUSTER.num_gms, 2**64):
        err = assert_error(await gm.post(f"/v1/jobs?gm={gm_id}", json=job(task())), 422, "gm")
        assert f"the GMs are 0..{CLUSTER.num_gms - 1}" in err.error and str(2**64) not in err.error


async def test_gm_accepts_a_valid_job_and_reports_it(gm: httpx.AsyncClient) -> None:
    body = job(task(), task(constraints=[0, 1], cpu_millicores=2000), task(memory_mb=8192), job_id="job-1", user="ann")
    r = await gm.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    accepted = JobAccepted.model_validate(r.json())
    assert accepted == JobAccepted(job_id="job-1", task_ids=["job-1.0", "job-1.1", "job-1.2"], gm=0)

    r = await gm.get("/v1/jobs/job-1")
    assert r.status_code == 200, r.text
    status = JobStatus.model_validate(r.json())
    assert (status.job_id, status.user, status.gm) == ("job-1", "ann", 0)
    assert [t.task_id for t in status.tasks] == accepted.task_ids
    assert all(t.state in ("queued", "launched") for t in status.tasks)

    assert_error(await gm.post("/v1/jobs", json=job(job_id="job-1")), 409, "job_id")

    # concurrent submissions of one job id: exactly one wins
    racing = await asyncio.gather(*(gm.post("/v1/jobs", json=job(job_id="twin")) for _ in range(4)))
    assert sorted(r.status_code for r in racing) == [201, 409, 409, 409]
    assert [t.task_id for t in JobStatus.model_validate((await gm.get("/v1/jobs/twin")).json()).tasks] == ["twin.0"]

    r = await gm.post("/v1/jobs", json=job())  # the GM names an anonymous job
    assert r.status_code == 201, r.text
    named = JobAccepted.model_validate(r.json())
    assert named.job_id != "job-1" and named.task_ids == [f"{named.job_id}.0"]

    r = await gm.get("/v1/state")
    assert r.status_code == 200, r.text
    assert r.json()["unfinished_tasks"] == 5
    r = await gm.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "gm": 0, "ready": True, "term": 0, "standing_in_for": [], "journal_failing": ""}


async def test_gm_accepts_tasks_of_zero_seconds(gm: httpx.AsyncClient) -> None:
    """Traces hold tasks that last 0 s: they are valid work, not bad input."""
    r = await gm.post("/v1/jobs", json=job(task(duration=0), task(duration=0.0), job_id="instant"))
    assert r.status_code == 201, r.text
    assert JobAccepted.model_validate(r.json()).task_ids == ["instant.0", "instant.1"]
    status = JobStatus.model_validate((await gm.get("/v1/jobs/instant")).json())
    assert [t.state for t in status.tasks] == ["launched", "launched"]


async def test_gm_places_again_a_launch_that_never_reached_its_lm(gm: httpx.AsyncClient) -> None:
    """Every attempt of the batch is refused at connect (the LM's process is down): nothing of it can run, so its
    task is not failed but queued again, and waits: the LM is out of the GM's view until it answers."""
    r = await gm.post("/v1/jobs", json=job(task(cpu_millicores=3000), job_id="unsent"))
    assert r.status_code == 201, r.text

    async def unsent_task() -> Any:
        [t] = JobStatus.model_validate((await gm.get("/v1/jobs/unsent")).json()).tasks
        return t

    async def placed_again() -> bool:
        return (await unsent_task()).attempts >= 2

    await wait_for(placed_again, 10, unsent_task)  # its batch is given up after 0.5 s (MEGHA_LM_TIMEOUT here)
    t = await unsent_task()
    assert t.state == "queued" and t.failed_reason is None
    state = (await gm.get("/v1/state")).json()
    assert state["unfinished_tasks"] == 1
    assert [p["used_fraction"] for p in state["partitions"]] == [1.0]  # the LM out of the view: nothing free
    metrics = (await gm.get("/metrics")).text
    assert 'megha_gm_unreachable_lms{gm="0"} 1.0' in metrics


async def test_gm_runs_again_the_tasks_of_a_launch_no_lm_answers() -> None:
    """The GM's LM takes the batch (a connection is made) and never answers, past MEGHA_LM_TIMEOUT: the LM may have
    launched it, so its task is a lost run, queued again as its next attempt; the LM, out of the GM's view now,
    gets nothing more."""
    with silent_lm() as url:
        settings = GMSettings(lm_urls=[url], http_timeout=0.3, lm_timeout=0.5)
        async with running(create_gm(settings, use_broker=False, cluster=CLUSTER)) as gm:
            r = await gm.post("/v1/jobs", json=job(task(cpu_millicores=3000), job_id="lost"))
            assert r.status_code == 201, r.text

            async def gm_state() -> dict[str, Any]:
                return (await gm.get("/v1/state")).json()  # type: ignore[no-any-return]

            async def lost() -> bool:
                return (await gm_state())["retries"] == 1

            await wait_for(lost, 5, gm_state)
            [t] = JobStatus.model_validate((await gm.get("/v1/jobs/lost")).json()).tasks
            assert t.state == "queued" and t.retries == 1 and t.failed_reason is None
            assert (await gm_state())["unfinished_tasks"] == 1


async def test_gm_arrival_is_when_the_request_came_in(gm: httpx.AsyncClient) -> None:
    """Allocation time counts from the submission's arrival at the GM: reading and validating it is included."""
    before = time.time()
    r = await gm.post("/v1/jobs", json=job(task(), job_id="timed"))
    after = time.time()
    assert r.status_code == 201, r.text
    [t] = JobStatus.model_validate((await gm.get("/v1/jobs/timed")).json()).tasks
    assert t.arrival is not None and t.launched_at is not None
    assert before <= t.arrival <= t.launched_at <= after


@pytest.mark.parametrize("job_id", ["nope", "job-1.0", "%20", "a" * 300])
async def test_gm_unknown_job_is_404(untouched_gm: httpx.AsyncClient, job_id: str) -> None:
    err = assert_error(await untouched_gm.get(f"/v1/jobs/{job_id}"), 404, "job_id")
    assert "no job" in err.error


async def test_gm_forgets_its_oldest_finished_jobs_beyond_the_limit_and_says_so() -> None:
    # The LM is unreachable, so nothing runs; each job ends when it is cancelled. Keeping 2 finished tasks, the GM
    # forgets job A (2 tasks) when job B (1 task) ends.
    settings = GMSettings(lm_urls=[NOWHERE], http_timeout=1.0, finished_tasks_kept=2, lm_timeout=0.5)
    async with running(create_gm(settings, use_broker=False, cluster=CLUSTER)) as c:

        async def gm_state() -> dict[str, Any]:
            return (await c.get("/v1/state")).json()  # type: ignore[no-any-return]

        async def state_when_ended() -> dict[str, Any]:
            async def ended() -> bool:
                return (await gm_state())["unfinished_tasks"] == 0

            await wait_for(ended, 20, gm_state)  # the GM retries a launch for MEGHA_LM_TIMEOUT (0.5 s)
            return await gm_state()

        assert (await c.post("/v1/jobs", json=job(task(), task(), job_id="A"))).status_code == 201
        assert (await c.delete("/v1/jobs/A")).status_code == 202
        assert (await state_when_ended())["finished_jobs_dropped"] == 0
        assert JobStatus.model_validate((await c.get("/v1/jobs/A")).json()).tasks[0].state == "cancelled"
        assert (await c.post("/v1/jobs", json=job(job_id="B"))).status_code == 201
        assert (await c.delete("/v1/jobs/B")).status_code == 202
        state = await state_when_ended()
        assert (state["unfinished_tasks"], state["finished_jobs_dropped"]) == (0, 1)
        err = assert_error(await c.get("/v1/jobs/A"), 404, "job_id")
        assert "forgotten its 1 oldest finished jobs" in err.error and "MEGHA_FINISHED_TASKS_KEPT=2" in err.error
        assert JobStatus.model_validate((await c.get("/v1/jobs/B")).json()).tasks[0].state == "cancelled"


async def test_lm_takes_a_silent_agent_out_of_service_reports_its_tasks_lost_and_brings_it_back_when_idle() -> None:
    settings = LMSettings(expected_nodes=4, num_gms=2, http_timeout=1.0, worker_timeout=20.0)
    app = create_lm(settings, use_broker=False)
    service = app.state.service
    broker = service.broker = RecordingBroker()
    async with running(app) as c:
        await register_all(c)  # w0 holds nodes 0-1, w1 nodes 2-3; both at NOWHERE, so health checks fail
        lost, kept = TaskSpec("a.0", "a", "u", 60.0, (500, 256), 0), TaskSpec("b.0", "b", "u", 60.0, (500, 256), 0)
        launch = LaunchBatch(0, 0, 1, [Placement(lost, 0, 0, False), Placement(kept, 0, 2, True)])
        async with service._lock:  # tasks running on nodes 0 and 2, without calling the (unreachable) agents
            service.core.handle(launch, time.time())
        await service.watch.check_workers()
        assert (await c.get("/v1/state")).json()["down_nodes"] == {}  # nobody silent for long yet
        service.members.liveness.last_seen["w0"] -= 60
        await service.watch.check_workers()
        published = {"gm", "events"}  # the spawned publications: the lost task's completion, and its event
        await wait_for(lambda: published <= {ex for ex, _, _ in broker.published}, 5, broker.published)
        state = (await c.get("/v1/state")).json()
        assert set(state["down_nodes"]) == {"0", "1"} and state["lost_workers"] == {"w0": 1}
        assert re.search(r"worker agent w0 at \S+ silent for 6\d s", state["down_nodes"]["0"])
        assert state["free"][0] == [0, 0] and state["running"] == 1
        (completion,) = [
            item
            for ex, _, body in broker.published
            if ex == "gm" and body.get("completions")
            for item in body["completions"]["items"]
        ]
        assert completion["task_id"] == "a.0" and completion["lost"] and "silent for" in completion["error"]
        assert completion["state"]["free"] == [0, 0]  # no GM places it back on the down node
        (lost_event,) = [e for ex, _, body in broker.published if ex == "events" for e in body["events"]]
        assert (lost_event["task_id"], lost_event["kind"], lost_event["attempt"]) == ("a.0", "lost", 1)
        assert "silent for" in lost_event["error"]
        # Back while its old tasks still run (it was cut off, not dead): kept out, and asked to stop the tasks
        # reported lost (they run again elsewhere); back with nothing running: in service again.
        asked: list[tuple[str, bytes]] = []

        async def post(url: str, body: bytes, idempotent: bool = False) -> Any:
            asked.append((url, body))
            raise CallError("not reachable in this test")

        service.calls.post = post
        for running_tasks, down in ((1, {"0", "1"}), (0, set())):
            beat = WorkerHeartbeat(worker_id="w0", lm=0, at=time.time(), running=running_tasks)
            await service.on_broker_message(BrokerMessage(heartbeat=beat).model_dump_json().encode())

            async def down_nodes() -> set[str]:
                return set((await c.get("/v1/state")).json()["down_nodes"])

            async def as_expected(down: set[str] = down, running_tasks: int = running_tasks) -> bool:
                # Kept out with tasks running, it is asked to stop them (from a task of the LM's own).
                return await down_nodes() == down and (running_tasks == 0 or asked != [])

            await wait_for(as_expected, 5, down_nodes)
        state = (await c.get("/v1/state")).json()
        ((url, body),) = asked
        assert url == f"{NOWHERE}/v1/preempt" and json.loads(body)["task_ids"] == ["a.0"]
        assert state["free"][0] == state["capacity"][0] and state["lost_workers"] == {}


# -------------------------------------------------------------------------------------------- LM /v1/workers


BAD_REGISTRATIONS: list[tuple[str, Any, str]] = [
    ("missing-resource", registration(nodes=[{"capacity": {"cpu_millicores": 2000}}]), "nodes.0.capacity"),
    ("extra-resource", registration(nodes=[{"capacity": {**NODE["capacity"], "gpu": 1}}]), "nodes.0.capacity"),
    ("empty-capacity", registration(nodes=[{"capacity": {}}]), "nodes.0.capacity"),
    (
        "zero-capacity",
        registration(nodes=[NODE, {"capacity": {"cpu_millicores": 2000, "memory_mb": 0}}]),
        "nodes.1.capacity.memory_mb",
    ),
    (
        "string-capacity",
        registration(nodes=[{"capacity": {"cpu_millicores": "2000", "memory_mb": 1}}]),
        "nodes.0.capacity.cpu_millicores",
    ),
    ("constraint-30", registration(nodes=[{**NODE, "constraints": [1, 30]}]), "nodes.0.constraints.1"),
    ("duplicate-constraints", registration(nodes=[{**NODE, "constraints": [1, 1]}]), "nodes.0.constraints"),
    ("no-nodes", registration(nodes=[]), "nodes"),
    ("url-scheme", registration(url="ftp://host:1"), "url"),
    ("url-not-a-url", registration(url="not a url"), "url"),
    ("url-no-host", registration(url="http://"), "url"),
    ("url-int", registration(url=8200), "url"),
    ("worker-id", registration(worker_id="a b"), "worker_id"),
    ("missing-url", {"worker_id": "w", "nodes": [NODE]}, "url"),
    ("unknown-field", registration(zone="eu"), "zone"),
    ("unknown-node-field", registration(nodes=[{**NODE, "gpus": 1}]), "nodes.0.gpus"),
]


@pytest.mark.parametrize(("body", "field"), [b[1:] for b in BAD_REGISTRATIONS], ids=[b[0] for b in BAD_REGISTRATIONS])
async def test_lm_refuses_bad_registrations(shared_lm: httpx.AsyncClient, body: Any, field: str) -> None:
    assert_error(await shared_lm.post("/v1/workers", json=body), 422, field)
    state = (await shared_lm.get("/v1/state")).json()
    assert (state["registered_nodes"], state["workers"]) == (0, 0)  # nothing half-registered


async def test_lm_registration_is_idempotent_and_bounded(
    lm: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    err = assert_error(await lm.post("/v1/workers", json=registration("big", 5)), 409, "nodes")
    assert "expects 4 nodes" in err.error
    assert (await lm.get("/v1/state")).json()["registered_nodes"] == 0

    first = await lm.post("/v1/workers", json=registration("w0", 3))
    assert first.status_code == 201, first.text
    registered = WorkerRegistered.model_validate(first.json())
    assert registered.model_dump(exclude={"incarnation", "report_key"}) == {
        "worker_id": "w0",
        "lm": 0,
        "first_node": 0,
        "nodes": 3,
    }
    assert registered.report_key is None  # MEGHA_AUTH=off: reports are not signed
    assert registered.incarnation == (await lm.get("/healthz")).json()["incarnation"] > 0
    again = await lm.post("/v1/workers", json=registration("w0", 3))
    assert (again.status_code, again.json()) == (201, first.json())
    assert (await lm.get("/v1/state")).json()["registered_nodes"] == 3

    assert_error(await lm.post("/v1/workers", json=registration("w1", 2)), 409, "nodes")
    r = await lm.get("/v1/cluster")
    assert_error(r, 503, ROOT_FIELD)
    assert "3/4" in r.json()["error"]

    r = await lm.post("/v1/workers", json=registration("w1", 1))
    assert r.status_code == 201 and r.json()["first_node"] == 3
    assert (await lm.get("/v1/cluster")).status_code == 200
    # once complete: a known agent re-registers (after a restart), a new one is refused
    again = await lm.post("/v1/workers", json=registration("w0", 3))
    assert (again.status_code, again.json()) == (201, first.json())
    assert_error(await lm.post("/v1/workers", json=registration("w2", 1)), 409, "nodes")
    # a known agent back with other nodes keeps its first ones until the LM restarts, and the LM says so (it said
    # nothing); one whose nodes cannot be read is refused as a new one is
    other = registration("w0", [{"capacity": {"cpu_millicores": 2**64, "memory_mb": 1}}] * 5)
    with caplog.at_level(logging.WARNING, logger="megha.lm"):
        again = await lm.post("/v1/workers", json=other)
    assert (again.status_code, again.json()) == (201, first.json())
    assert "w0 registered again with other nodes (5" in caplog.text and "keep what it first registered" in caplog.text
    bad = registration("w0", [{"capacity": {"cpu_millicores": 2000}}])
    assert_error(await lm.post("/v1/workers", json=bad), 422, "nodes.0.capacity")


async def test_lm_forwards_the_report_of_a_run_it_did_not_place_without_publishing_its_end() -> None:
    """A report of a run this LM does not know (placed by an earlier incarnation, or reported lost after a launch
    call timed out) goes to the run's GM, which checks the attempt and publishes the end; the LM publishes no
    task event for it, and the handler does not fail. It remembers the run as ended for that GM: a GM that claims
    it before the forwarded end reaches it learns so that the run ended (a repeated report is remembered once)."""
    broker = RecordingBroker()
    service = LMService(LMSettings(expected_nodes=1, num_gms=2), broker)  # type: ignore[arg-type]
    await service.register(WorkerRegistration.model_validate(registration("w0", 1)))
    report = {"lm": 0, "finished": [{"task_id": "gone.0", "node": 0, "attempt": 2, "gm": 1}]}
    await service.on_broker_message(json.dumps({"worker_report": report}).encode())
    # The LM publishes from tasks of its own.
    await wait_for(lambda: any(exchange == "gm" for exchange, _, _ in broker.published), 5, broker.published)
    forwarded = [body for exchange, key, body in broker.published if exchange == "gm" and "completions" in body]
    assert [(c["task_id"], c["forwarded"], c["attempt"]) for b in forwarded for c in b["completions"]["items"]] == [
        ("gone.0", True, 2)
    ]
    assert not [body for exchange, _, body in broker.published if exchange == "events"]
    await service.on_broker_message(json.dumps({"worker_report": report}).encode())
    await wait_for(service.backlog_read.is_set, 5, "the LM's backlog")
    ended = service.recovery_state(1)["ended"]
    assert [(r["task_id"], r["attempt"], r["node"]) for r in ended] == [("gone.0", 2, 0)]  # type: ignore[attr-defined,index]
    assert service.recovery_state(0)["ended"] == []
    await service.close()


async def test_lm_calls_an_agent_that_registers_again_at_its_new_address() -> None:
    """An agent restarted in a new container or VM keeps its nodes, and the LM calls it where it is now."""
    service = LMService(LMSettings(expected_nodes=2, num_gms=1), None)
    await service.register(WorkerRegistration.model_validate(registration("w0", 2, url="http://old:8200")))
    again = await service.register(WorkerRegistration.model_validate(registration("w0", 2, url="http://new:8200")))
    assert again.first_node == 0
    assert service.state()["workers"] == 1
    assert service.members.node_worker == ["http://new:8200", "http://new:8200"]  # where launches go
    await service.close()


async def test_an_lm_refuses_a_second_agent_with_the_id_of_one_that_still_answers() -> None:
    """Two agents started with one MEGHA_WORKER_ID: the second, at another address while the first still answers its
    health check as that id, is refused (409 naming `worker_id`; its start-up says so in one line). Before, the LM
    took it for a restart of the first: the first's tasks were reported lost, and its nodes pointed at the second
    (an outside audit). One whose first address no longer answers is a restart, and is let in."""

    async def healthz(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = json.dumps({"worker": "w0", "registered": True, "ready": True}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        writer.write(body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(healthz, "127.0.0.1", 0)
    first = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    service = LMService(LMSettings(expected_nodes=2, num_gms=1), None)
    try:
        await service.register(WorkerRegistration.model_validate(registration("w0", 2, url=first)))
        with pytest.raises(RegistrationError, match="registered already by an agent that answers at") as refused:
            await service.register(WorkerRegistration.model_validate(registration("w0", 2, url="http://127.0.0.1:9")))
        assert refused.value.field == "worker_id"
        assert service.members.node_worker == [first, first]
        server.close()
        await server.wait_closed()
        again = await service.register(
            WorkerRegistration.model_validate(registration("w0", 2, url="http://127.0.0.1:9"))
        )
        assert again.first_node == 0 and service.members.node_worker == ["http://127.0.0.1:9"] * 2
    finally:
        server.close()
        await service.close()


async def test_an_lm_gives_an_agent_the_node_numbers_it_kept_without_taking_itself_for_rebuilt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An agent restarted together with its LM claims the numbers it kept (`kept_first_node`) and gets them when
    free, registering first or not: the layout stays the one the GMs place by. Such a claim says nothing of the LM
    having restarted (the agent runs nothing), unlike an agent that lived through it (`first_node`); one that
    cannot be met gets the first free numbers, logged at INFO, not as a WARNING."""
    service = LMService(LMSettings(expected_nodes=3, num_gms=1), None)
    kept = await service.register(WorkerRegistration.model_validate(registration("w1", 1, kept_first_node=2)))
    assert kept.first_node == 2 and not service.members.rebuilt
    with caplog.at_level(logging.INFO, logger="megha.lm"):
        taken = await service.register(WorkerRegistration.model_validate(registration("w2", 1, kept_first_node=2)))
    assert taken.first_node == 0 and not service.members.rebuilt
    assert [r.levelname for r in caplog.records if "which are taken" in r.getMessage()] == ["INFO"]
    live = await service.register(WorkerRegistration.model_validate(registration("w0", 1, first_node=1)))
    assert live.first_node == 1 and service.members.rebuilt
    await service.close()


@pytest.mark.parametrize(
    ("nodes", "gms", "sizes"), [(4, 2, [2, 2]), (5, 2, [2, 3]), (4, 3, [1, 1, 2]), (3, 1, [3]), (2, 2, [1, 1])]
)
async def test_lm_cluster_is_503_until_complete_then_split_contiguously(nodes: int, gms: int, sizes: list[int]) -> None:
    app = lm_app(expected_nodes=nodes, num_gms=gms)
    async with app.router.lifespan_context(app), client(app) as c:
        assert_error(await c.get("/v1/cluster"), 503, ROOT_FIELD)
        assert (await c.get("/healthz")).json()["ready"] is False
        for i in range(nodes):
            node = {"capacity": {"cpu_millicores": 1000 + i, "memory_mb": 100 + i}, "constraints": [i]}
            if i:  # the cluster is served only once every node is in
                assert (await c.get("/v1/cluster")).status_code == 503
            r = await c.post("/v1/workers", json=registration(f"w{i}", nodes=[node]))
            assert r.status_code == 201 and r.json()["first_node"] == i, r.text
        r = await c.get("/v1/cluster")
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["lm"] == 0 and doc["resource_names"] == ["cpu_millicores", "memory_mb"]
        assert [p["gm"] for p in doc["partitions"]] == list(range(gms))
        assert [len(p["capacities"]) for p in doc["partitions"]] == sizes
        # contiguous, in registration order
        assert [c for p in doc["partitions"] for c in p["capacities"]] == [[1000 + i, 100 + i] for i in range(nodes)]
        assert [c for p in doc["partitions"] for c in p["constraints"]] == [[i] for i in range(nodes)]
        assert (await c.get("/healthz")).json()["ready"] is True


# --------------------------------------------------------------------------------------------- LM /v1/launch


async def test_lm_launch_before_ready_is_503(lm: httpx.AsyncClient) -> None:
    assert (await lm.post("/v1/workers", json=registration("w0", 2))).status_code == 201
    err = assert_error(await lm.post("/v1/launch", json=batch(placement())), 503, ROOT_FIELD)
    assert "2/4" in err.error


BAD_BATCHES: list[tuple[str, Any, str]] = [
    ("wrong-lm", batch(placement(), lm=1), "lm"),
    ("unknown-gm", batch(placement(), gm=2), "gm"),
    ("negative-node", batch(placement(node=-1)), "placements.0.node"),
    ("negative-lm", batch(placement(lm=-1)), "placements.0.lm"),
    ("negative-seq", batch(placement(), seq=-1), "seq"),
    ("missing-seq", {"gm": 0, "lm": 0, "placements": []}, "seq"),
    ("missing-task", batch({"lm": 0, "node": 0, "repartition": False}), "placements.0.task"),
    ("missing-repartition", batch({"task": wire_task(), "lm": 0, "node": 0}), "placements.0.repartition"),
    ("missing-request", batch({**placement(), "task": {**wire_task(), "request": None}}), "placements.0.task.request"),
    ("empty-request", batch(placement(request=[])), "placements.0.task.request"),
    ("short-request", batch(placement(request=[100])), "placements.0.task.request"),
    ("long-request", batch(placement(request=[100, 100, 100])), "placements.0.task.request"),
    ("negative-request", batch(placement(request=[100, -1])), "placements.0.task.request.1"),
    ("zero-request", batch(placement(request=[100, 0])), "placements.0.task.request"),
    ("zero-cpu", batch(placement(), placement(node=1, task_id="j.1", request=[0, 100])), "placements.1.task.request"),
    ("string-node", batch(placement(node="0")), "placements.0.node"),
    ("bad-constraint", batch(placement(constraints=[21])), "placements.0.task.constraints.0"),
    ("negative-duration", batch(placement(duration=-1.0)), "placements.0.task.duration"),
    ("empty-task-id", batch(placement(task_id="")), "placements.0.task.task_id"),
    ("second-placement", batch(placement(), placement(node=-3, task_id="j.1")), "placements.1.node"),
    ("unknown-field", {**batch(placement()), "priority": 1}, "priority"),
    (  # a delta keys the LM's usage per priority by at most 18 digits: a GM would drop every delta as malformed
        "huge-priority",
        batch({**placement(), "task": {**wire_task(), "priority": 10**18}}),
        "placements.0.task.priority",
    ),
    ("placements-object", {**batch(), "placements": placement()}, "placements"),
]


@pytest.mark.parametrize(("body", "field"), [b[1:] for b in BAD_BATCHES], ids=[b[0] for b in BAD_BATCHES])
async def test_lm_refuses_bad_launch_batches(untouched_lm: httpx.AsyncClient, body: Any, field: str) -> None:
    assert_error(await untouched_lm.post("/v1/launch", json=body), 422, field)


async def test_lm_launch_accepts_then_rejects_an_overcommit_as_inconsistency(ready_lm: httpx.AsyncClient) -> None:
    r = await ready_lm.post("/v1/launch", json=batch(placement(node=1, request=[1500, 1000])))
    assert r.status_code == 200, r.text
    first = LaunchResponseModel.model_validate(r.json())
    assert (first.gm, first.lm, first.seq) == (0, 0, 1)
    assert [p.task.task_id for p in first.accepted] == ["j.0"] and first.rejected == []
    assert [(s.node, s.free) for s in first.states] == [(1, [500, 3096])]

    r = await ready_lm.post("/v1/launch", json=batch(placement(node=1, task_id="j.1", request=[600, 10]), seq=2))
    assert r.status_code == 200, r.text
    second = LaunchResponseModel.model_validate(r.json())
    assert second.seq == 2 and second.accepted == []
    [rejection] = second.rejected
    assert rejection.inconsistency is True
    assert rejection.placement.task.task_id == "j.1" and rejection.placement.node == 1
    assert "free" in rejection.reason
    assert [(s.node, s.free) for s in second.states] == [(1, [500, 3096])]  # the GM learns the true state
    state = (await ready_lm.get("/v1/state")).json()
    assert (state["launched"], state["inconsistencies"]) == (1, 1)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (placement(node=4), "has no node 4"),
        (placement(node=0, lm=1), "has no node"),
        (placement(node=2), "repartition flag is wrong"),  # GM 1's node without the repartition flag
        (placement(node=0, repartition=True), "repartition flag is wrong"),
        (placement(node=0, constraints=[3]), "lacks placement constraints [3]"),
    ],
    ids=["no-such-node", "other-lm", "foreign-node", "own-node-flagged", "constraints"],
)
async def test_lm_launch_rejects_impossible_placements_without_inconsistency(
    ready_lm: httpx.AsyncClient, bad: dict[str, Any], reason: str
) -> None:
    good = placement(node=0, task_id="ok.0")
    r = await ready_lm.post("/v1/launch", json=batch(good, bad))
    assert r.status_code == 200, r.text
    resp = LaunchResponseModel.model_validate(r.json())
    assert [p.task.task_id for p in resp.accepted] == ["ok.0"]
    [rejection] = resp.rejected
    assert rejection.inconsistency is False and reason in rejection.reason


async def test_lm_launch_is_idempotent_per_task(ready_lm: httpx.AsyncClient) -> None:
    body = batch(placement(node=0))
    first = await ready_lm.post("/v1/launch", json=body)
    again = await ready_lm.post("/v1/launch", json=body)
    assert first.status_code == again.status_code == 200
    assert len(LaunchResponseModel.model_validate(again.json()).accepted) == 1
    state = (await ready_lm.get("/v1/state")).json()
    assert state["launched"] == 1 and state["free"][0] == [1900, 3996]


async def call_while_the_loop_is_held(app: FastAPI, path: str, body: dict[str, Any], caller_waits: bool) -> None:
    """POST `body` to `app` served over real TCP while the app's event loop is held, as a paused process (SIGSTOP, a
    stalled host) holds it: the caller then closes the call (a caller that gave up) or waits for its answer."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning"))
    serving = asyncio.create_task(server.serve())
    try:
        await wait_for(lambda: server.started, 10.0)
        port = server.servers[0].sockets[0].getsockname()[1]
        data = json.dumps(body).encode()
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}"
        # Blocking calls: the app's event loop does not run until the caller is done (the kernel accepts).
        with socket.create_connection(("127.0.0.1", port)) as caller:
            caller.sendall(head.encode() + b"\r\n\r\n" + data)
            if caller_waits:
                answer = await asyncio.wait_for(asyncio.to_thread(caller.recv, 65536), 10.0)
                assert answer.startswith(b"HTTP/1.1 20"), answer[:200]
        await asyncio.sleep(0.3)  # the app reads what was left in its socket
    finally:
        server.should_exit = True
        await serving


@pytest.mark.parametrize("gm_waits", [True, False], ids=["gm-waits", "gm-gave-up"])
async def test_lm_does_not_apply_a_launch_its_gm_closed_while_the_lm_stalled(gm_waits: bool) -> None:
    """A GM gives up on a launch after MEGHA_LM_TIMEOUT, closes the call and runs its tasks again elsewhere. An LM
    that was paused meanwhile finds the call in its socket once it resumes, and must not start runs its GM no
    longer tracks; a GM that waits for the answer gets its run, as always."""
    app = lm_app()
    service = app.state.service
    service.broker = RecordingBroker()

    async def post(url: str, body: bytes, idempotent: bool = False) -> Reply:
        return Reply(202, b"{}")  # the agents' launch calls

    service.calls.post = post
    async with running(app) as c:
        await register_all(c)
        await call_while_the_loop_is_held(app, "/v1/launch", batch(placement(node=0)), gm_waits)
        state = (await c.get("/v1/state")).json()
        assert state["launched"] == (1 if gm_waits else 0), state
        assert state["free"][0] == ([1900, 3996] if gm_waits else [2000, 4096])


@pytest.mark.parametrize("lm_waits", [True, False], ids=["lm-waits", "lm-gave-up"])
async def test_an_agent_does_not_start_a_launch_its_lm_closed_while_the_agent_stalled(lm_waits: bool) -> None:
    """The same between an LM and a paused agent: the LM gave up on the launch and reported its tasks lost (their
    GM runs them again), so the agent must not start them once it resumes."""
    async with unstarted_worker() as (app, c):
        register_worker(app)
        await call_while_the_loop_is_held(app, "/v1/tasks", worker_launch(placement(node=4, lm=1)), lm_waits)
        assert (await c.get("/v1/state")).json()["running"] == (["j.0"] if lm_waits else [])


def calls_to_agents(service: LMService) -> list[str]:
    """The URLs of the launches `service` sends its agents from now on (each answered 202, none really sent)."""
    sent: list[str] = []

    async def post(url: str, body: bytes, idempotent: bool = False) -> Reply:
        sent.append(url)
        return Reply(202, b"{}")

    service.calls.post = post  # type: ignore[method-assign]
    return sent


@asynccontextmanager
async def lm_where_a_run_ended() -> AsyncIterator[tuple[httpx.AsyncClient, httpx.Response, list[str]]]:
    """An LM (agents registered, launches recorded, not sent) that launched j.0 (run 1 of attempt 1) on node 0 and
    applied its worker's report of its end: its client, the launch's answer, and the launches sent to agents."""
    app = lm_app()
    service = app.state.service
    service.broker = RecordingBroker()
    async with running(app) as c:
        await register_all(c)
        sent = calls_to_agents(service)
        first = await c.post("/v1/launch", json=batch(placement(node=0)))
        assert first.status_code == 200 and len(first.json()["accepted"]) == 1
        await wait_for(lambda: sent, 5.0)
        report = WorkerReportModel.model_validate({"lm": 0, "finished": [{"task_id": "j.0", "node": 0, "gm": 0}]})
        await service.on_broker_message(BrokerMessage(worker_report=report).model_dump_json().encode())
        yield c, first, sent


async def test_lm_answers_a_launch_batch_repeated_after_its_run_ended_from_its_record() -> None:
    """A GM's launch batch is sent again when its answer was lost (the client resends calls marked idempotent, and
    the GM's retry policy tries it again): the LM accepts the repeat from its record of the runs it saw end, and
    launches nothing twice."""
    async with lm_where_a_run_ended() as (c, first, sent):
        again = await c.post("/v1/launch", json=batch(placement(node=0)))
        assert again.status_code == 200 and again.json()["accepted"] == first.json()["accepted"]
        state = (await c.get("/v1/state")).json()
    assert state["launched"] == 1 and state["running"] == 0 and state["free"][0] == [2000, 4096]
    assert len(sent) == 1  # one launch on the agent


async def test_lm_launches_an_attempt_that_ended_here_again_under_a_new_run_number() -> None:
    """A GM that restarted launches the attempts it cannot account for again under run numbers its earlier term never
    used, and ignores the ends of the earlier runs. The LM's record of the runs it saw end holds the run number: a
    repeat of the same run is not launched again, the same attempt under a new run number is (found by `megha chaos
    --faults all-kill`: with the record keyed by attempt, such a task was accepted, never launched, and never
    ended)."""
    async with lm_where_a_run_ended() as (c, first, sent):
        repeat = await c.post("/v1/launch", json=batch(placement(node=0)))
        again = await c.post("/v1/launch", json=batch(placement(node=1, run_number=2097153), seq=2))
        assert again.status_code == 200 and len(again.json()["accepted"]) == 1, again.text
        await wait_for(lambda: len(sent) == 2, 5.0, lambda: sent)
        state = (await c.get("/v1/state")).json()
    assert repeat.json()["accepted"] == first.json()["accepted"]
    assert state["launched"] == 2 and state["running"] == 1


async def test_lm_handles_a_worker_report_only_once_the_broker_confirmed_the_completion_it_publishes() -> None:
    """A worker report's message is acked when its handler returns: the handler waits until the broker confirmed
    the completion for the run's GM. Were it acked before, an LM killed with that completion in its (in-memory)
    outbox would lose the run's end, and its GM would run the task again (a chaos trial counted two tasks twice)."""

    class GatedBroker(RecordingBroker):
        def __init__(self) -> None:
            super().__init__()
            self.gate = asyncio.Event()
            self.confirmed: list[str] = []

        async def publish_confirmed(self, exchange: str, routing_key: str, body: bytes, headers: object = None) -> None:
            await self.publish(exchange, routing_key, body, headers)
            await self.gate.wait()  # the broker has not confirmed it yet
            self.confirmed.append(exchange)

    app = lm_app()
    service = app.state.service
    broker = service.broker = GatedBroker()
    async with running(app) as c:
        await register_all(c)
        service.calls.post = lambda url, body, idempotent=False: _accepted()
        assert (await c.post("/v1/launch", json=batch(placement(node=0)))).status_code == 200
        report = WorkerReportModel.model_validate({"lm": 0, "finished": [{"task_id": "j.0", "node": 0, "gm": 0}]})
        handling = asyncio.ensure_future(
            service.on_broker_message(BrokerMessage(worker_report=report).model_dump_json().encode())
        )
        await wait_for(lambda: any(ex == "gm" and "completions" in body for ex, _, body in broker.published), 5)
        await asyncio.sleep(0.05)  # the handler had every chance to return
        assert not handling.done()  # the completion is in the outbox, not confirmed: the report is not acked
        broker.gate.set()
        await asyncio.wait_for(handling, 5)
        assert broker.confirmed == ["gm"]


async def _accepted() -> Reply:
    return Reply(202, b"{}")


async def test_lm_fences_a_gm_identity_claimed_with_a_newer_term(ready_lm: httpx.AsyncClient) -> None:
    """A GM's holder claims it with a term above any seen; launches with an older term get 409 naming `term`."""
    assert (await ready_lm.get("/v1/gms/0/state")).json()["term"] == 0
    claimed = await ready_lm.post("/v1/gms/0/claim", json={"term": 1, "by": 0})
    assert claimed.status_code == 200 and claimed.json()["term"] == 1
    assert (await ready_lm.post("/v1/launch?term=1", json=batch(placement(node=0)))).status_code == 200
    # A peer stands in for GM 0 with term 2: GM 0's term-1 calls are refused from now on, the stand-in's are not.
    assert (await ready_lm.post("/v1/gms/0/claim", json={"term": 2, "by": 1})).status_code == 200
    refused = await ready_lm.post("/v1/launch?term=1", json=batch(placement(node=1, task_id="j.1"), seq=2))
    assert_error(refused, 409, "term")
    assert "superseded by term 2" in refused.json()["error"]
    accepted = await ready_lm.post("/v1/launch?term=2", json=batch(placement(node=1, task_id="j.1"), seq=2))
    assert accepted.status_code == 200 and len(accepted.json()["accepted"]) == 1
    # A claim must exceed every term seen: two claimants never share one.
    assert_error(await ready_lm.post("/v1/gms/0/claim", json={"term": 2, "by": 0}), 409, "term")
    assert_error(await ready_lm.post("/v1/gms/0/claim", json={"term": 3, "by": 9}), 422, "by")
    assert_error(await ready_lm.post("/v1/gms/0/claim", json={"term": 0, "by": 0}), 422, "term")
    state = (await ready_lm.get("/v1/state")).json()
    assert state["launched"] == 2


# -------------------------------------------------------------------------------------------- worker /v1/tasks


async def test_worker_before_registration_is_503(worker: tuple[FastAPI, httpx.AsyncClient]) -> None:
    app, c = worker
    assert_error(await c.post("/v1/tasks", json=worker_launch(placement(node=4, lm=1))), 503, ROOT_FIELD)
    assert (await c.get("/healthz")).json()["registered"] is False
    assert app.state.agent.executor.running() == []


BAD_WORKER_LAUNCHES: list[tuple[str, Any, str, str]] = [
    ("wrong-lm", worker_launch(placement(node=4, lm=0), lm=0), "lm", "belongs to LM 1, not 0"),
    ("node-below", worker_launch(placement(node=3, lm=1)), "launches", "nodes [3] are not this agent's (4..5)"),
    (
        "node-above",
        worker_launch(placement(node=4, lm=1), placement(node=6, lm=1, task_id="j.1")),
        "launches",
        "nodes [6] are not this agent's (4..5)",
    ),
    ("negative-node", worker_launch(placement(node=-1, lm=1)), "launches.0.node", ""),
    ("missing-task", worker_launch({"lm": 1, "node": 4, "repartition": False}), "launches.0.task", ""),
    ("short-request", worker_launch(placement(node=4, lm=1, request=[100])), "launches.0.task.request", "aligned"),
    (
        "placement-lm",
        worker_launch(placement(node=4, lm=1), placement(node=5, lm=0, task_id="j.1")),
        "launches.1.lm",
        "placement for LM 0",
    ),
    ("negative-duration", worker_launch(placement(node=4, lm=1, duration=-1.0)), "launches.0.task.duration", ""),
    ("missing-launches", {"lm": 1}, "launches", ""),
    ("unknown-field", {**worker_launch(), "extra": 1}, "extra", ""),
]


@pytest.mark.parametrize(
    ("body", "field", "message"), [b[1:] for b in BAD_WORKER_LAUNCHES], ids=[b[0] for b in BAD_WORKER_LAUNCHES]
)
async def test_worker_refuses_bad_launches(
    untouched_worker: tuple[FastAPI, httpx.AsyncClient], body: Any, field: str, message: str
) -> None:
    # untouched: nothing started, not even the good placement of a batch with a bad one
    err = assert_error(await untouched_worker[1].post("/v1/tasks", json=body), 422, field)
    assert message in err.error


async def test_worker_accepts_launches_on_its_nodes(worker: tuple[FastAPI, httpx.AsyncClient]) -> None:
    app, c = worker
    register_worker(app)
    body = worker_launch(placement(node=4, lm=1), placement(node=5, lm=1, task_id="j.1"))
    r = await c.post("/v1/tasks", json=body)
    assert r.status_code == 202, r.text
    assert r.json() == {"accepted": ["j.0", "j.1"]}

    async def running() -> list[str]:
        return (await c.get("/v1/state")).json()["running"]  # type: ignore[no-any-return]

    async def both_run() -> bool:  # the agent may start tasks in the background
        return len(await running()) == 2

    await wait_for(both_run, 2, running)
    r = await c.post("/v1/tasks", json=body)  # repeated: still accepted, not started twice
    assert (r.status_code, r.json()) == (202, {"accepted": ["j.0", "j.1"]})
    await asyncio.sleep(0.05)  # an absence: no second start of either task meanwhile
    state = (await c.get("/v1/state")).json()
    assert state == {"worker": "w0", "execution": "simulated", "running": ["j.0", "j.1"], "queued": []}
    assert (await c.get("/healthz")).json()["registered"] is True


@pytest.mark.parametrize("execution", ["simulated", "real"])
async def test_worker_runs_a_task_of_zero_seconds_to_completion(execution: str) -> None:
    """A 0-s task starts, finishes without error and is reported to the LM; the agent publishes its start (the LM,
    having checked the report, publishes how it ended)."""
    settings = WorkerSettings(execution=execution, worker_id="w0", nodes=1, lm_url=NOWHERE)
    app = create_worker(settings, use_broker=False)
    broker = RecordingBroker()
    app.state.agent.broker = broker
    register_worker(app, lm=0, first_node=0, nodes=1)
    try:
        async with client(app) as c:
            r = await c.post("/v1/tasks", json=worker_launch(placement(node=0, duration=0.0), lm=0))
            assert (r.status_code, r.json()) == (202, {"accepted": ["j.0"]})
            await wait_for(lambda: any(exchange == "lm" for exchange, _, _ in broker.published), 10, broker.published)
    finally:
        await app.state.agent.close()
    events = [e for exchange, _, body in broker.published if exchange == "events" for e in body["events"]]
    assert [(e["kind"], e["task_id"], e["attempt"]) for e in events] == [("started", "j.0", 1)]
    TaskEvents.model_validate({"events": events})  # the agent's plain events are valid wire messages
    [report] = [BrokerMessage.model_validate(body) for exchange, _, body in broker.published if exchange == "lm"]
    assert report.worker_report is not None
    [finished] = report.worker_report.finished
    assert (finished.task_id, finished.node, finished.preempted, finished.error, finished.attempt) == (
        "j.0",
        0,
        False,
        "",
        1,
    )


async def test_worker_runs_an_attempt_it_ran_before_again_under_a_new_run_number() -> None:
    """An agent does not run a repeated launch of a run it reported (same task, attempt and run number), but does run
    the same attempt under a new run number: a GM that restarted launches it so, and ignores the earlier run's end."""
    settings = WorkerSettings(execution="simulated", worker_id="w0", nodes=1, lm_url=NOWHERE)
    app = create_worker(settings, use_broker=False)
    broker = RecordingBroker()
    app.state.agent.broker = broker
    register_worker(app, lm=0, first_node=0, nodes=1)

    def ended() -> list[tuple[str, int, int]]:
        reports = [BrokerMessage.model_validate(b) for exchange, _, b in broker.published if exchange == "lm"]
        return [
            (f.task_id, f.attempt, f.run_number) for r in reports if r.worker_report for f in r.worker_report.finished
        ]

    try:
        async with client(app) as c:
            for run_number in (1, 1, 2097153):
                launch = worker_launch(placement(node=0, duration=0.0, run_number=run_number), lm=0)
                r = await c.post("/v1/tasks", json=launch)
                assert (r.status_code, r.json()) == (202, {"accepted": ["j.0"]})
                await asyncio.sleep(0.1)  # a run of 0 s ends (and is reported) within this, if it runs
                await wait_for(lambda: len(ended()) >= 1, 10, ended)
    finally:
        await app.state.agent.close()
    assert ended() == [("j.0", 1, 1), ("j.0", 1, 2097153)]


# ------------------------------------------------------------------------------------------------- API documentation


@pytest.mark.parametrize(
    ("make", "path", "body"),
    [
        (gm_app, "/v1/jobs", "JobSubmission"),
        (lm_app, "/v1/workers", "WorkerRegistration"),
        (lm_app, "/v1/launch", "LaunchBatchModel"),
        (worker_app, "/v1/tasks", "WorkerLaunchModel"),
    ],
)
async def test_openapi_documents_each_request_body(make: Any, path: str, body: str) -> None:
    """Routes read their bodies themselves (for speed); the OpenAPI document still gives each body's schema."""
    app = make()
    try:
        async with client(app) as c:
            r = await c.get("/openapi.json")
    finally:
        if hasattr(app.state, "agent"):
            await app.state.agent.close()
    assert r.status_code == 200, r.text
    doc = r.json()
    schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": f"#/components/schemas/{body}"}
    components = doc["components"]["schemas"]
    refs = {part.split('"')[0] for part in json.dumps(doc).split('"#/components/schemas/')[1:]}
    assert body in refs and refs <= set(components)  # every reference resolves


@pytest.mark.parametrize("make", [gm_app, lm_app, worker_app])
async def test_openapi_documents_every_error_with_its_body(make: Any) -> None:
    """Every operation lists the errors it may answer, each an ErrorBody: 422 where input is validated, 413 for a
    POST, and what its route declares; Starlette's own 404 and 405 answer an ErrorBody too."""
    app = make()
    try:
        async with client(app) as c:
            doc = (await c.get("/openapi.json")).json()
            unknown, wrong_method = await c.get("/v1/nowhere"), await c.put("/healthz")
    finally:
        if hasattr(app.state, "agent"):
            await app.state.agent.close()
    error_body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            responses = op["responses"]
            assert "500" not in responses
            for status, response in responses.items():
                if int(status) >= 400:
                    assert response["content"] == error_body, (method, path, status)
            assert ("422" in responses) == bool(op.get("parameters") or "requestBody" in op), (method, path)
            assert ("413" in responses) == (method == "post"), (method, path)
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    assert {"ErrorBody", "FieldError"} <= set(doc["components"]["schemas"])
    assert_error(unknown, 404, ROOT_FIELD)
    assert_error(wrong_method, 405, ROOT_FIELD)


@pytest.mark.parametrize(
    ("make", "path", "field"),
    [
        (gm_app, "/v1/jobs?limit=0", "limit"),
        (gm_app, "/v1/jobs?state=lost", "state"),
        (lm_app, "/v1/gms/x/state", "gm"),
    ],
)
async def test_a_bad_parameter_is_a_422_error_body_naming_it(make: Any, path: str, field: str) -> None:
    """FastAPI's own validation of path and query parameters answers the documented ErrorBody, not its own."""
    async with client(make()) as c:
        assert_error(await c.get(path), 422, field)


# ------------------------------------------------------------------------------- client for calls between services

HANG = b"hang"  # a FakeServer answer: read the request, never answer


class FakeServer:
    """A loopback HTTP/1.1 server answering each request with the next of `answers`: raw bytes, HANG, or None to
    close the connection without answering. It records the requests and counts connections."""

    def __init__(self, *answers: bytes | None) -> None:
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                lengths = [int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.startswith(b"content-length:")]
                self.requests.append(head + await reader.readexactly(sum(lengths)))
                reply = self.answers.pop(0)
                if reply is None:
                    break
                if reply == HANG:
                    await asyncio.sleep(3600)
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        writer.close()


def answer(status: int, body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n{head}\r\n".encode() + body


async def test_service_client_keeps_connections_alive() -> None:
    server = FakeServer(answer(200, b'{"a":1}'), answer(422, b"bad"))
    async with server as url:
        calls = ServiceClient(timeout=5.0)
        first = await calls.post(f"{url}/v1/launch", b'{"x":1}')
        second = await calls.get(f"{url}/v1/state?x=1")
        await calls.aclose()
    assert (first.status, first.body, second.status, second.text) == (200, b'{"a":1}', 422, "bad")
    assert server.connections == 1
    post, get = server.requests
    assert post.startswith(b"POST /v1/launch HTTP/1.1\r\nhost: 127.0.0.1:")
    assert b"content-type: application/json\r\ncontent-length: 7\r\n\r\n" in post and post.endswith(b'{"x":1}')
    assert get.startswith(b"GET /v1/state?x=1 HTTP/1.1\r\n") and get.endswith(b"\r\n\r\n")
    assert b"content-length" not in get


async def test_service_client_keeps_at_most_keep_idle_connections() -> None:
    servers = [FakeServer(answer(200, b"a"), answer(200, b"b")), FakeServer(answer(200, b"c"), answer(200, b"d"))]
    async with servers[0] as one, servers[1] as two:
        calls = ServiceClient(timeout=5.0, keep_idle=1)
        replies = [await calls.post(f"{url}/x", b"{}") for url in (one, two, one, two)]
        await calls.aclose()
    assert [r.body for r in replies] == [b"a", b"c", b"b", b"d"]
    # one connection is kept (the first server's), the second server's is closed after each call
    assert (servers[0].connections, servers[1].connections) == (1, 2)


async def test_service_client_reads_chunked_answers_and_honours_connection_close() -> None:
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"
    server = FakeServer(chunked, answer(200, b"one", "connection: close"), answer(200, b"two"))
    async with server as url:
        calls = ServiceClient(timeout=5.0)
        assert (await calls.post(f"{url}/a", b"{}")).body == b"abcde"
        assert (await calls.post(f"{url}/b", b"{}")).body == b"one"
        assert (await calls.post(f"{url}/c", b"{}")).body == b"two"
        await calls.aclose()
    assert server.connections == 2  # the server said close: a new connection for the third call


async def test_service_client_sends_an_idempotent_call_again_when_an_idle_connection_was_closed() -> None:
    """A kept-alive connection the server dropped is noticed on the next request, which goes out again when its
    caller marked it idempotent (a launch batch: the LM applies it once)."""
    server = FakeServer(answer(200, b"1"), None, answer(200, b"2"))
    async with server as url:
        calls = ServiceClient(timeout=5.0)
        assert (await calls.post(f"{url}/a", b"{}")).body == b"1"
        assert (await calls.post(f"{url}/b", b'{"n":2}', idempotent=True)).body == b"2"
        await calls.aclose()
    assert server.connections == 2
    assert [r.split(b" ")[1] for r in server.requests] == [b"/a", b"/b", b"/b"]
    assert server.requests[-1].endswith(b'\r\n\r\n{"n":2}')


async def test_service_client_does_not_send_again_what_its_caller_did_not_mark_idempotent() -> None:
    """By default a call (a preemption, say) fails when its kept-alive connection was dropped: the server may have
    acted on it before closing. A GET is idempotent by definition and goes out again."""
    server = FakeServer(answer(200, b"1"), None, answer(200, b"2"), None, answer(200, b"3"))
    async with server as url:
        calls = ServiceClient(timeout=5.0)
        assert (await calls.post(f"{url}/a", b"{}")).body == b"1"
        with pytest.raises(CallError, match="/v1/preempt"):
            await calls.post(f"{url}/v1/preempt", b"{}")
        assert (await calls.post(f"{url}/b", b"{}")).body == b"2"
        assert (await calls.get(f"{url}/c")).body == b"3"
        await calls.aclose()
    assert [r.split(b" ")[1] for r in server.requests] == [b"/a", b"/v1/preempt", b"/b", b"/c", b"/c"]


@pytest.mark.parametrize(
    ("reply", "reason"),
    [(b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP"), (None, "IncompleteReadError"), (HANG, "no answer within 0.3 s")],
    ids=["not-http", "closed", "silent"],
)
async def test_service_client_reports_transport_failures(reply: bytes | None, reason: str) -> None:
    async with FakeServer(reply) as url:
        calls = ServiceClient(timeout=0.3)
        with pytest.raises(CallError, match=reason):
            await calls.post(f"{url}/v1/tasks", b"{}")
        await calls.aclose()


async def test_service_client_reports_a_refused_connection() -> None:
    calls = ServiceClient(timeout=2.0)
    with pytest.raises(CallError, match=re.escape("POST http://127.0.0.1:9/v1/launch")):
        await calls.post(f"{NOWHERE}/v1/launch", b"{}")
    with pytest.raises(ValueError, match="not an http"):
        await calls.post("ftp://host/x", b"{}")


# --------------------------------------------------------------------------------------- fair scheduling

PREEMPT = {
    "gm": 1,
    "lm": 0,
    "seq": 1,
    "task": {
        "task_id": "b.0",
        "job_id": "b",
        "user": "B",
        "duration": 1.0,
        "request": [1000, 512],
        "constraints": [],
    },
    "victims": [{"user": "A", "usage_elsewhere": [0, 0]}],
    "total": [8000, 16384],
}


@pytest.mark.asyncio(loop_scope="module")
async def test_preempt_on_an_lm_without_fair_scheduling_looks_only_for_lower_priority_victims(
    shared_ready_lm: httpx.AsyncClient,
) -> None:
    r = await shared_ready_lm.post("/v1/preempt", json=PREEMPT)  # nothing runs: no victim of a lower class
    assert r.status_code == 200 and r.json()["placement"] is None
    assert "classes below priority 0" in r.json()["reason"] and "not configured for fair scheduling" in r.text


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"total": [8000]}, "total"),
        ({"total": [0, 16384]}, "total"),
        ({"victims": [{"user": "A", "usage_elsewhere": [1]}]}, "victims.0.usage_elsewhere"),
        ({"victims": [{"user": "", "usage_elsewhere": [0, 0]}]}, "victims.0.user"),
        ({"lm": 3}, "lm"),
        ({"gm": 7}, "gm"),
        ({"task": {**PREEMPT["task"], "request": [-1, 5]}}, "task.request.0"),
    ],
)
async def test_bad_preemption_requests_are_4xx_naming_the_field(change: dict[str, object], field: str) -> None:
    settings = LMSettings(expected_nodes=4, num_gms=2, http_timeout=1.0, queues="A:0.5:0,B:0.5:1")
    async with running(create_lm(settings, use_broker=False)) as lm:
        await register_all(lm)
        r = await lm.post("/v1/preempt", json={**PREEMPT, **change})
    assert 400 <= r.status_code < 500, r.text
    assert field in r.text, r.text


# ------------------------------------------------------------------------------ a stop racing its task's launch


@pytest.mark.asyncio
async def test_an_lm_sends_a_stop_to_an_agent_only_once_the_task_s_launch_call_there_is_over() -> None:
    """A job cancelled (or a task preempted) right after its launch: the launch and the stop are separate calls
    to the agent, and a stop that got there first found nothing to stop, so the launch that followed ran the task
    to its end (a cancelled 600 s task ran 600 s). The LM sends the stop once the launch call is over."""
    service = LMService(LMSettings(lm_id=0, num_gms=1, expected_nodes=1), None)
    service.members.node_worker[0] = NOWHERE
    order: list[str] = []
    launch_may_answer = asyncio.Event()

    async def post(url: str, body: bytes, idempotent: bool = False) -> Reply:
        path = url.removeprefix(NOWHERE)
        order.append(f"{path} sent")
        if path == "/v1/tasks":
            await launch_may_answer.wait()  # a slow launch call: the stop is asked for meanwhile
        order.append(f"{path} answered")
        return Reply(200, b'{"accepted": ["a.0"], "stopped": ["a.0"]}', {})

    service.dispatch.calls.post = post  # type: ignore[method-assign]
    task = TaskSpec("a.0", "a", "alice", 600.0, (100, 16), 0)
    service.dispatch.send_to_workers(WorkerLaunch(0, [Placement(task, 0, 0, False)]))
    stopping = asyncio.ensure_future(service.dispatch.stop_then_send({NOWHERE: ["a.0"]}, []))
    await asyncio.sleep(0.1)
    assert order == ["/v1/tasks sent"]  # the stop waits for the launch call
    launch_may_answer.set()
    await asyncio.wait_for(stopping, 5)
    assert order == ["/v1/tasks sent", "/v1/tasks answered", "/v1/preempt sent", "/v1/preempt answered"]
    assert service.dispatch._launching == {}


@pytest.mark.asyncio
async def test_an_agent_asked_to_stop_a_task_it_accepted_and_has_not_started_yet_never_runs_it() -> None:
    """The agent's side of the same race: the launch was accepted (its tasks start in the background) and the stop
    came before the task's process existed. It is reported preempted and never run, not left to run to its end."""
    agent = WorkerAgent(WorkerSettings(worker_id="w-stop", execution="simulated", lm_url=NOWHERE), None)
    agent.registered = WorkerRegistered(worker_id="w-stop", lm=0, first_node=0, nodes=1, incarnation=1)
    reported: list[ExecutionResult] = []
    agent._report = lambda placement, result: reported.append(result)  # type: ignore[method-assign]
    start, may_start = agent.executor.start, asyncio.Event()

    async def slow_start(*args: Any, **kwargs: Any) -> None:  # a process that takes a while to make
        await may_start.wait()
        await start(*args, **kwargs)

    agent.executor.start = slow_start  # type: ignore[method-assign]
    try:
        task = TaskSpec("a.0", "a", "alice", 600.0, (100, 16), 0)
        assert agent.launch([Placement(task, 0, 0, False)]) == ["a.0"]
        await asyncio.sleep(0.05)  # its start is under way
        assert await agent.preempt(["a.0"]) == ["a.0"]  # before its process exists
        may_start.set()
        await wait_for(lambda: reported, 5)
        await asyncio.sleep(0.1)
        assert [(r.task_id, r.preempted) for r in reported] == [("a.0", True)]
        assert agent.executor.running() == []
    finally:
        await agent.close()
