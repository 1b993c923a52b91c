"""A submitted task's duration is bounded: one that would hold a node for ever is refused with 422 naming it."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.models import JobSubmission
from megha.common.settings import GMSettings
from megha.common.wire.fields import MAX_AMOUNT
from megha.common.wire.jobs import MAX_TASK_SECONDS
from megha.services.gm.app import create_app as create_gm


def _task(duration: float) -> dict[str, object]:
    return {"duration": duration, "cpu_millicores": 1, "memory_mb": 1}


def test_a_duration_up_to_a_year_is_taken_and_one_beyond_it_refused() -> None:
    assert JobSubmission.model_validate({"tasks": [_task(MAX_TASK_SECONDS)]}).tasks[0].duration == MAX_TASK_SECONDS
    with pytest.raises(ValidationError, match="duration"):
        JobSubmission.model_validate({"tasks": [_task(MAX_TASK_SECONDS * 2)]})


@pytest.mark.asyncio
async def test_a_burn_task_of_1e300_seconds_is_refused_with_422_naming_the_field() -> None:
    cluster = ClusterSpec(((PartitionSpec(0, 0, ((2000, 4096),), (0,)),),))
    app = create_gm(GMSettings(lm_urls=["http://127.0.0.1:9"], lm_timeout=0.5), use_broker=False, cluster=cluster)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://t") as gm:
        r = await gm.post("/v1/jobs", json={"tasks": [_task(1e300)]})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "tasks.0.duration", r.text


@pytest.mark.asyncio
async def test_a_request_beyond_what_json_keeps_exact_is_refused_with_422_naming_the_field() -> None:
    cluster = ClusterSpec(((PartitionSpec(0, 0, ((2000, 4096),), (0,)),),))
    app = create_gm(GMSettings(lm_urls=["http://127.0.0.1:9"], lm_timeout=0.5), use_broker=False, cluster=cluster)
    transport = httpx.ASGITransport(app=app)
    huge = {"duration": 1, "cpu_millicores": 1, "memory_mb": 10**4000}  # a 4,001-digit number: not echoed back
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://t") as gm:
        r = await gm.post("/v1/jobs", json={"tasks": [huge]})
        edge = await gm.post("/v1/jobs", json={"tasks": [_task(1) | {"cpu_millicores": MAX_AMOUNT + 1}]})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "tasks.0.memory_mb", r.text
    assert len(r.text) < 500, r.text[:1000]
    assert edge.status_code == 422 and edge.json()["detail"][0]["field"] == "tasks.0.cpu_millicores", edge.text
    assert JobSubmission.model_validate({"tasks": [_task(1) | {"cpu_millicores": MAX_AMOUNT}]}).tasks[0].cpu_millicores
