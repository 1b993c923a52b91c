"""The GM's HTTP API: POST /v1/jobs, GET /v1/jobs/{id}, GET /v1/queues, GET /v1/state, GET /healthz."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response

from megha.common.core.cluster import ClusterSpec
from megha.common.core.gm import Unschedulable
from megha.common.lifecycle import StartupError, exit_on_startup_error
from megha.common.models import JobAccepted, JobStatus, JobSubmission
from megha.common.settings import GMSettings
from megha.common.transport.rabbit import connected, gm_key
from megha.services.gm.service import DuplicateJob, GMService
from megha.services.http import (
    configure_logging,
    document_bodies,
    error,
    install_error_handlers,
    json_body,
    json_response,
    read_body,
    serving_gc,
)


def create_app(settings: GMSettings, use_broker: bool = True, cluster: ClusterSpec | None = None) -> FastAPI:
    """The GM app. It learns the cluster from its LMs at start-up unless `cluster` is given (tests)."""
    log = configure_logging(settings.log_level, f"gm-{settings.gm_id}")
    broker = settings.broker() if use_broker else None
    service = GMService(settings, broker)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if cluster is None:
            try:
                await service.discover()
                await service.recover()  # the LMs' full state, and the journal of a GM that crashed
            except StartupError as exc:
                exit_on_startup_error(exc)
        else:
            service.adopt(cluster)
        async with connected(broker):
            if broker is not None:
                await broker.consume("gm", gm_key(settings.gm_id), service.on_broker_message)
            log.info("GM %d serving on %s with %s matching", settings.gm_id, settings.url(), settings.matching)
            with serving_gc():
                yield
            await service.close()

    app = FastAPI(title=f"Megha GM {settings.gm_id}", lifespan=lifespan)
    app.state.service = service
    install_error_handlers(app)

    @app.get("/healthz")
    async def healthz() -> dict[str, object]:
        return {"status": "ok", "gm": settings.gm_id, "ready": service.core is not None}

    @app.post("/v1/jobs", status_code=201, response_model=JobAccepted, openapi_extra=json_body(JobSubmission))
    async def submit(request: Request) -> Response:
        arrived = time.time()  # allocation time counts from here: parsing the job is part of it
        sub = await read_body(request, JobSubmission)
        try:
            job = await service.submit(sub, arrived)
        except Unschedulable as exc:
            return error(422, str(exc), "tasks")
        except DuplicateJob as exc:
            return error(409, str(exc), "job_id")
        accepted = JobAccepted(job_id=job.job_id, task_ids=[t.task_id for t in job.tasks], gm=settings.gm_id)
        return json_response(accepted, 201)

    @app.get("/v1/jobs/{job_id}", response_model=JobStatus)
    async def job_status(job_id: str) -> Response:
        status = service.jobs.status(job_id)
        if status is None:
            message = f"no job {job_id} at GM {settings.gm_id}"
            if service.jobs.dropped_jobs:
                message += (
                    f" (this GM has forgotten its {service.jobs.dropped_jobs:,} oldest finished jobs to keep at most "
                    f"MEGHA_FINISHED_TASKS_KEPT={settings.finished_tasks_kept:,} finished tasks)"
                )
            return error(404, message, "job_id")
        return json_response(status)

    @app.get("/v1/queues")
    async def queues() -> dict[str, object]:
        """Fair scheduling: the configured queues, shares and share policy, with this GM's view of each."""
        fairness = settings.fairness()
        return {
            "gm": settings.gm_id,
            "fair_scheduling": fairness is not None,
            "policy": fairness.policy if fairness is not None else None,
            "queues": service.queues(),
        }

    @app.get("/v1/state")
    async def state() -> dict[str, object]:
        assert service.core is not None
        snapshot = service.core.view_snapshot()
        snapshot["unfinished_tasks"] = service.jobs.unfinished()
        snapshot["finished_jobs_dropped"] = service.jobs.dropped_jobs
        return snapshot

    document_bodies(app, JobSubmission)
    return app
