"""Route answers as typed models: the GM core's `view_snapshot()` keys are exactly `GMState`'s, and every route of
every service documents a response model in its OpenAPI document."""

from __future__ import annotations

import pytest
from fastapi import FastAPI

from megha.common.core.gm import GlobalMaster
from megha.common.models import GMState
from megha.common.settings import GMSettings, LMSettings, WorkerSettings
from megha.services.gm.app import create_app as create_gm
from megha.services.lm.app import create_app as create_lm
from megha.services.worker.app import create_app as create_worker

from corekit import CAP, cluster, job, task

SERVICE_ADDS = {
    "unfinished_tasks": 3,
    "finished_jobs_dropped": 0,
    "lm_urls": ["http://127.0.0.1:9100"],
    "ignored_broker_messages": 0,
}
"""What the GM service adds to the core's snapshot in `GET /v1/state`."""


def test_the_gm_core_view_snapshot_validates_as_gm_state() -> None:
    gm = GlobalMaster(0, cluster([[[[3]], [[3], [3]]]]))
    gm.submit(job("j", task("j.0", [3]), task("j.1")), 0.0)
    snapshot = gm.view_snapshot()
    assert set(snapshot) | set(SERVICE_ADDS) == set(GMState.model_fields)
    state = GMState.model_validate(snapshot | SERVICE_ADDS)
    assert state.gm == 0 and state.total_capacity == [3 * c for c in CAP]
    assert [(p.lm, p.gm, p.nodes) for p in state.partitions] == [(0, 0, 1), (0, 1, 2)]


def _apps() -> list[FastAPI]:
    return [
        create_gm(GMSettings(gm_id=0, lm_urls=["http://127.0.0.1:9"]), use_broker=False),
        create_lm(LMSettings(lm_id=0, gm_count=1), use_broker=False),
        create_worker(WorkerSettings(worker_id="w0", lm_url="http://127.0.0.1:9"), use_broker=False),
    ]


@pytest.mark.parametrize("app", _apps(), ids=["gm", "lm", "worker"])
def test_every_json_route_documents_a_response_model(app: FastAPI) -> None:
    doc = app.openapi()
    untyped = []
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            ok = next(v for k, v in operation["responses"].items() if k.startswith("2"))
            content = ok.get("content", {})
            if "application/json" in content and "$ref" not in str(content["application/json"].get("schema", {})):
                untyped.append(f"{method.upper()} {path}")
    assert untyped == []
    health = doc["paths"]["/healthz"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert health["$ref"].endswith("Health")
