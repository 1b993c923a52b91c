"""Task events and worker reports travel as core objects with mirrors: what the agent measured of a run reaches the
LM's published event, and what every publisher sends validates as the wire model its consumers read."""

from __future__ import annotations

import time
from typing import Any

import pytest

from megha.common.core.messages import FinishedTask, LaunchBatch, Placement, WorkerReport
from megha.common.core.task import TaskSpec
from megha.common.models import BrokerMessage, TaskEvents, WorkerRegistration
from megha.common.settings import LMSettings
from megha.services.lm.service import LMService

from servicekit import wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


class _Broker:
    """Keeps what the LM publishes, as the bytes it sent."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []

    async def publish(self, exchange: str, routing_key: str, body: bytes, headers: object = None) -> None:
        self.published.append((exchange, body))

    publish_confirmed = publish  # as the broker's: here every message is confirmed at once

    async def backlog(self, exchange: str, routing_key: str) -> int:
        return 0  # nothing waits in the LM's queue


def _registration() -> dict[str, Any]:
    node = {"capacity": {"cpu_millicores": 4000, "memory_mb": 8192}, "constraints": []}
    return {"worker_id": "w0", "url": "http://127.0.0.1:9/", "nodes": [node, node]}


async def test_the_lm_publishes_what_the_agent_measured_of_a_run_it_placed() -> None:
    broker = _Broker()
    service = LMService(LMSettings(expected_nodes=2, num_gms=1), broker)  # type: ignore[arg-type]
    await service.register(WorkerRegistration.model_validate(_registration()))
    task = TaskSpec("a.0", "a", "u", 5.0, (500, 256), 0)
    assert service.core is not None
    async with service._lock:  # the run is placed, without calling the (unreachable) agent
        service.core.handle(LaunchBatch(0, 0, 1, [Placement(task, 0, 1, False)]), time.time())
    measured = FinishedTask(
        "a.0",
        1,
        cpu_seconds=2.5,
        execution_delay=0.125,
        process_overhead=0.05,
        started_at=1000.0,
        finished_at=1005.0,
        error="exit 3",
    )
    report = BrokerMessage.core_json(WorkerReport(0, [measured]))
    assert BrokerMessage.model_validate_json(report).worker_report is not None  # what the agent sends validates
    await service.on_broker_message(report)

    def events() -> list[Any]:
        return [
            e
            for exchange, body in broker.published
            if exchange == "events"
            for e in TaskEvents.model_validate_json(body).events
        ]

    await wait_for(lambda: bool(events()), 5.0, lambda: broker.published)
    (event,) = events()
    assert (event.kind, event.task_id, event.job_id, event.lm, event.node, event.attempt) == (
        "failed",
        "a.0",
        "a",
        0,
        1,
        1,
    )
    assert (event.at, event.cpu_seconds, event.execution_delay, event.error) == (1005.0, 2.5, 0.125, "exit 3")
    assert event.process_overhead == 0.05
    await service.close()
