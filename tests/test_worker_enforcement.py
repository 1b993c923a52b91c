"""A worker agent enforces its nodes: it refuses, as a whole and with a 4xx naming the field, a launch whose task
does not fit what its node has free (409) or could never fit the node (422), asks 0 of a resource (422), or is for
a node that is not the agent's (422); a repeated launch is accepted again and not counted twice. In-process
(httpx's ASGI transport), no broker, no LM: the agent is registered by hand as LM 1's nodes 4 and up."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from test_services_http import (
    NOWHERE,
    RecordingBroker,
    assert_error,
    client,
    placement,
    register_worker,
    worker_launch,
)

from megha.common.settings import WorkerSettings
from megha.services.worker.agent import WorkerAgent
from megha.services.worker.app import create_app as create_worker
from megha.services.worker.ledger import NodeLedger

from servicekit import wait_for

pytestmark = pytest.mark.timeout(60)

CAPACITY = (2000, 4096)  # WorkerSettings' default node: 2,000 millicores, 4,096 MB
FIRST = 4  # the agent's first node number at LM 1


@asynccontextmanager
async def agent_app(
    nodes: int = 2, execution: str = "simulated"
) -> AsyncIterator[tuple[WorkerAgent, httpx.AsyncClient]]:
    """An agent of `nodes` default nodes, registered as LM 1's nodes FIRST.., publishing to a RecordingBroker."""
    settings = WorkerSettings(execution=execution, worker_id="w0", nodes=nodes, lm_url=NOWHERE)
    app: FastAPI = create_worker(settings, use_broker=False)
    app.state.agent.broker = RecordingBroker()
    register_worker(app, lm=1, first_node=FIRST, nodes=nodes)
    try:
        async with client(app) as c:
            yield app.state.agent, c
    finally:
        await app.state.agent.close()


def launch(*placements: dict[str, Any]) -> dict[str, Any]:
    return worker_launch(*placements, lm=1)


def on(node: int, request: list[int], task_id: str = "j.0", **override: Any) -> dict[str, Any]:
    """A placement of LM 1 on `node` asking `request` (an hour long unless told)."""
    return placement(node=node, lm=1, task_id=task_id, request=request, **override)


async def accepted(c: httpx.AsyncClient, body: dict[str, Any]) -> list[str]:
    r = await c.post("/v1/tasks", json=body)
    assert r.status_code == 202, r.text
    ids: list[str] = r.json()["accepted"]
    return ids


# ------------------------------------------------------------------------------------------------ over capacity


@pytest.mark.asyncio
@pytest.mark.parametrize("execution", ["simulated", "real"])
async def test_a_request_beyond_the_whole_node_is_422_and_runs_nothing(execution: str) -> None:
    """The reported case: 64,000 millicores and 1,000,000 MB on a 2,000-millicore, 4,096-MB node."""
    async with agent_app(nodes=1, execution=execution) as (agent, c):
        r = await c.post("/v1/tasks", json=launch(on(FIRST, [64_000, 1_000_000])))
        err = assert_error(r, 422, "launches.0.task.request")
        assert "cpu_millicores=64000, memory_mb=1000000" in err.error
        assert "more than node 4 has at all (cpu_millicores=2000, memory_mb=4096)" in err.error
        assert agent.executor.running() == [] and agent.ledger.free(0) == CAPACITY


@pytest.mark.asyncio
@pytest.mark.parametrize("request_", [[2001, 100], [100, 4097]], ids=["cpu", "memory"])
async def test_one_resource_beyond_the_node_is_enough_to_refuse(request_: list[int]) -> None:
    async with agent_app() as (agent, c):
        assert_error(await c.post("/v1/tasks", json=launch(on(FIRST, request_))), 422, "launches.0.task.request")
        assert agent.executor.running() == []


@pytest.mark.asyncio
async def test_a_task_that_fits_exactly_is_accepted_and_fills_the_node() -> None:
    async with agent_app() as (agent, c):
        assert await accepted(c, launch(on(FIRST, list(CAPACITY)))) == ["j.0"]
        assert agent.ledger.free(0) == (0, 0) and agent.ledger.free(1) == CAPACITY
        r = await c.post("/v1/tasks", json=launch(on(FIRST, [1, 1], task_id="j.1")))
        err = assert_error(r, 409, "launches.0.task.request")
        assert "node 4 has cpu_millicores=0, memory_mb=0 free" in err.error
        assert await accepted(c, launch(on(FIRST + 1, [1, 1], task_id="j.1"))) == ["j.1"]  # the other node is free
        assert agent.executor.running() == ["j.0", "j.1"]


@pytest.mark.asyncio
async def test_two_tasks_that_together_exceed_the_node_the_second_is_409() -> None:
    async with agent_app() as (agent, c):
        await accepted(c, launch(on(FIRST, [1500, 1000])))
        r = await c.post("/v1/tasks", json=launch(on(FIRST, [1000, 1000], task_id="j.1")))
        err = assert_error(r, 409, "launches.0.task.request")
        assert "node 4 has cpu_millicores=500, memory_mb=3096 free (capacity cpu_millicores=2000" in err.error
        assert "nothing in this launch was started" in err.error
        r = await c.post("/v1/tasks", json=launch(on(FIRST, [100, 3200], task_id="j.2")))  # memory alone
        assert_error(r, 409, "launches.0.task.request")
        assert agent.executor.running() == ["j.0"] and agent.ledger.free(0) == (500, 3096)


@pytest.mark.asyncio
async def test_a_launch_is_all_or_nothing() -> None:
    """Two tasks of one launch that together exceed their node: the second is named, and neither starts (nor does
    a task of the same launch for another node): the LM reports every task of a refused launch lost."""
    async with agent_app() as (agent, c):
        body = launch(
            on(FIRST + 1, [100, 100], task_id="j.0"),
            on(FIRST, [1200, 2000], task_id="j.1"),
            on(FIRST, [1200, 2000], task_id="j.2"),
        )
        err = assert_error(await c.post("/v1/tasks", json=body), 409, "launches.2.task.request")
        assert (
            "node 4 has cpu_millicores=800, memory_mb=2096 free after the tasks before it in this launch" in err.error
        )
        assert agent.executor.running() == [] and agent.broker.published == []
        assert (agent.ledger.free(0), agent.ledger.free(1)) == (CAPACITY, CAPACITY)
        body["launches"][2]["task"]["request"] = [800, 2096]  # now they fit together, exactly
        assert await accepted(c, body) == ["j.0", "j.1", "j.2"]
        assert agent.ledger.free(0) == (0, 0)


# ----------------------------------------------------------------------------------------------- freed again


@pytest.mark.asyncio
async def test_a_task_that_ends_makes_room_again() -> None:
    async with agent_app() as (agent, c):
        await accepted(c, launch(on(FIRST, list(CAPACITY), duration=0.2)))
        assert_error(
            await c.post("/v1/tasks", json=launch(on(FIRST, [100, 100], task_id="j.1"))), 409, "launches.0.task.request"
        )
        await wait_for(lambda: agent.ledger.free(0) == CAPACITY, 10.0, lambda: agent.ledger.free(0))
        assert agent.executor.running() == []
        assert await accepted(c, launch(on(FIRST, list(CAPACITY), task_id="j.1"))) == ["j.1"]


@pytest.mark.asyncio
async def test_a_preempted_task_makes_room_before_the_preemption_is_answered() -> None:
    """The LM stops victims, then launches the waiting task on the room they leave."""
    async with agent_app() as (agent, c):
        await accepted(c, launch(on(FIRST, list(CAPACITY))))
        r = await c.post("/v1/preempt", json={"lm": 1, "task_ids": ["j.0"]})
        assert (r.status_code, r.json()) == (200, {"stopped": ["j.0"]})
        assert agent.ledger.free(0) == CAPACITY
        assert await accepted(c, launch(on(FIRST, list(CAPACITY), task_id="j.1"))) == ["j.1"]
        assert await accepted(c, launch(on(FIRST + 1, list(CAPACITY)))) == ["j.0"]  # relaunched, same attempt


# ------------------------------------------------------------------------------------------------ idempotency


@pytest.mark.asyncio
async def test_a_repeated_launch_is_accepted_again_and_not_counted_twice() -> None:
    async with agent_app() as (agent, c):
        body = launch(on(FIRST, [1500, 3000]), on(FIRST + 1, [2000, 4096], task_id="j.1"))
        assert await accepted(c, body) == ["j.0", "j.1"]
        assert await accepted(c, body) == ["j.0", "j.1"]  # the LM resends a launch whose answer it missed
        assert agent.executor.running() == ["j.0", "j.1"]
        assert (agent.ledger.free(0), agent.ledger.free(1)) == ((500, 1096), (0, 0))
        # a repeat beside a new task: the repeat holds what it held, the new task gets what is left
        again = launch(on(FIRST, [1500, 3000]), on(FIRST, [500, 1096], task_id="j.2"))
        assert await accepted(c, again) == ["j.0", "j.2"]
        assert agent.ledger.free(0) == (0, 0)


@pytest.mark.asyncio
async def test_a_repeated_launch_of_a_run_that_ended_is_not_run_or_counted_again() -> None:
    async with agent_app() as (agent, c):
        body = launch(on(FIRST, list(CAPACITY), duration=0.0))
        await accepted(c, body)
        await wait_for(lambda: agent.ledger.free(0) == CAPACITY, 10.0, lambda: agent.ledger.free(0))
        assert await accepted(c, body) == ["j.0"]
        assert agent.executor.running() == [] and agent.ledger.free(0) == CAPACITY


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("override", "what"), [({"attempt": 2}, "attempt 2 on node 4"), ({"node": FIRST + 1}, "attempt 1 on node 5")]
)
async def test_another_run_of_a_running_task_is_409(override: dict[str, Any], what: str) -> None:
    """Its report would not match the run the LM placed, which would then never end."""
    async with agent_app() as (agent, c):
        await accepted(c, launch(on(FIRST, [100, 100])))
        other = on(override.get("node", FIRST), [100, 100], attempt=override.get("attempt", 1))
        err = assert_error(await c.post("/v1/tasks", json=launch(other)), 409, "launches.0.task.attempt")
        assert f"runs here as attempt 1 on node 4, not as {what}" in err.error
        assert agent.ledger.free(0) == (1900, 3996) and agent.ledger.free(1) == CAPACITY


@pytest.mark.asyncio
async def test_a_task_twice_in_one_launch_is_422() -> None:
    async with agent_app() as (agent, c):
        body = launch(on(FIRST, [100, 100]), on(FIRST + 1, [100, 100]))
        err = assert_error(await c.post("/v1/tasks", json=body), 422, "launches.1.task.task_id")
        assert "j.0 appears twice" in err.error and agent.executor.running() == []


# ---------------------------------------------------------------------------------------- input the node refuses


@pytest.mark.asyncio
async def test_a_launch_for_another_node_is_422() -> None:
    async with agent_app() as (agent, c):
        for node in (FIRST - 1, FIRST + 2):
            body = launch(on(FIRST, [100, 100]), on(node, [100, 100], task_id="j.1"))
            err = assert_error(await c.post("/v1/tasks", json=body), 422, "launches")
            assert f"nodes [{node}] are not this agent's (4..5)" in err.error
        assert agent.executor.running() == []


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("request_", "field", "message"),
    [
        ([0, 100], "launches.0.task.request.0", "asks no cpu_millicores"),
        ([100, 0], "launches.0.task.request.1", "asks no memory_mb"),
        ([0, 0], "launches.0.task.request.0", "every amount must be > 0"),
        ([100, -1], "launches.0.task.request.1", "greater than or equal to 0"),  # refused by the model
        ([-5, 100], "launches.0.task.request.0", "greater than or equal to 0"),
    ],
)
async def test_zero_or_negative_requests_are_422(request_: list[int], field: str, message: str) -> None:
    """There is no best-effort class: every task asks some of every resource (as `TaskRequest` requires)."""
    async with agent_app() as (agent, c):
        err = assert_error(await c.post("/v1/tasks", json=launch(on(FIRST, request_))), 422, field)
        assert message in str(err.model_dump())
        assert agent.executor.running() == []


# -------------------------------------------------------------------------------- many nodes per agent (simulated)


@pytest.mark.asyncio
async def test_many_nodes_per_agent_each_node_is_accounted_alone() -> None:
    """A simulated agent of 200 nodes: one launch fills every node exactly with two tasks; then each node refuses
    one more task, the last node included, and ending one task frees its node only."""
    nodes = 200
    async with agent_app(nodes=nodes) as (agent, c):
        half = [CAPACITY[0] // 2, CAPACITY[1] // 2]
        body = launch(*(on(FIRST + k // 2, half, task_id=f"j.{k}") for k in range(2 * nodes)))
        assert len(await accepted(c, body)) == 2 * nodes
        assert len(agent.executor.running()) == 2 * nodes
        assert all(agent.ledger.free(k) == (0, 0) for k in range(nodes))
        for node in (FIRST, FIRST + nodes // 2, FIRST + nodes - 1):
            r = await c.post("/v1/tasks", json=launch(on(node, [1, 1], task_id="k.0")))
            assert_error(r, 409, "launches.0.task.request")
        r = await c.post("/v1/preempt", json={"lm": 1, "task_ids": ["j.398", "j.399"]})  # both tasks of the last node
        assert r.json() == {"stopped": ["j.398", "j.399"]}
        assert agent.ledger.free(nodes - 1) == CAPACITY and agent.ledger.free(nodes - 2) == (0, 0)
        assert await accepted(c, launch(on(FIRST + nodes - 1, list(CAPACITY), task_id="k.0"))) == ["k.0"]
        assert_error(await c.post("/v1/tasks", json=launch(on(FIRST + nodes, [1, 1], task_id="k.1"))), 422, "launches")


@pytest.mark.asyncio
async def test_the_account_follows_the_node_when_the_lm_numbers_it_anew() -> None:
    """After an LM restart the agent may get other node numbers; what its nodes run still holds them."""
    async with agent_app() as (agent, c):
        await accepted(c, launch(on(FIRST, list(CAPACITY))))
        assert agent.registered is not None
        agent.registered = agent.registered.model_copy(update={"first_node": 10})  # node 4 is now node 10
        assert_error(
            await c.post("/v1/tasks", json=launch(on(10, [1, 1], task_id="j.1"))), 409, "launches.0.task.request"
        )
        assert await accepted(c, launch(on(11, list(CAPACITY), task_id="j.1"))) == ["j.1"]


# ---------------------------------------------------------------------------------------------------- the ledger


def test_ledger_overflow_counts_the_runs_before_on_the_same_node_only() -> None:
    ledger = NodeLedger((10, 10))
    ledger.hold("a", 0, (4, 4))
    assert ledger.overflow([(0, (6, 6)), (1, (10, 10))]) is None
    assert ledger.overflow([(0, (3, 3)), (1, (10, 10)), (0, (4, 1))]) == (2, (3, 3))
    ledger.release("a")
    ledger.release("a")  # a second release gives nothing back
    assert ledger.free(0) == (10, 10)
