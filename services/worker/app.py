"""The worker agent's HTTP API: POST /v1/tasks (launch), POST /v1/preempt, GET /v1/state, GET /healthz, and
GET /v1/tasks/{task_id}/logs (a task's kept stdout or stderr, as text/plain).

A launch is refused as a whole, nothing of it started, with a 4xx naming the field: 422 for what no state of the
node could accept (a node or LM not this agent's, a request that is not aligned, asks 0 of a resource or more
than the node's whole capacity), 409 for what the node's current state refuses (a task that does not fit what
its node has free, a task running here as another run); 503 before the agent has registered."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import PlainTextResponse, Response
from pydantic_core import to_json

from megha.common.core.resources import DEFAULT_RESOURCE_NAMES
from megha.common.lifecycle import StartupError, exit_on_startup_error
from megha.common.models import WorkerLaunchModel, WorkerPreemptModel
from megha.common.settings import WorkerSettings
from megha.common.transport.rabbit import connected
from megha.services.apidocs import serve_docs_offline
from megha.services.auth import WORKER_RULES, acts_as, principal, protect
from megha.services.http import (
    configure_logging,
    document_bodies,
    error,
    errors,
    ids,
    install_error_handlers,
    json_body,
    json_response,
    read_body,
    serving_gc,
)
from megha.services.logroutes import ATTEMPT_HEADER
from megha.services.metrics import mount_metrics, worker_registry
from megha.services.worker.agent import LaunchRefused, UnknownRun, WorkerAgent
from megha.services.worker.tasklogs import Stream

TaskIdParam = Annotated[str, PathParam(min_length=1, max_length=256)]
StreamParam = Annotated[Stream, Query(description="which output: stdout or stderr")]
AttemptParam = Annotated[int | None, Query(ge=1, description="the attempt (default: the latest run here)")]
TailParam = Annotated[int | None, Query(ge=0, description="only the last this many bytes")]
LOGS_ANSWER = (
    "The kept output as it was written (bounded: MEGHA_TASK_LOG_BYTES per file, rotated once), empty for a burn "
    "task; the X-Megha-Attempt header names the attempt it is of"
)


def create_app(settings: WorkerSettings, use_broker: bool = True) -> FastAPI:
    log = configure_logging(settings.log_level, settings.worker_id)
    if os.environ.get("MEGHA_TASK_USER"):  # replaced (2026-11-24): one user for every task let tasks reach each other
        log.warning(
            "MEGHA_TASK_USER is no longer read: each exec task runs as a uid of its own from MEGHA_TASK_UIDS "
            "(docs/drivers.md, Isolation)"
        )
    broker = settings.broker() if use_broker else None
    agent = WorkerAgent(settings, broker)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            await agent.prepare()
        except StartupError as exc:
            exit_on_startup_error(exc)
        async with connected(broker):
            try:
                await agent.register()
            except StartupError as exc:
                exit_on_startup_error(exc)
            beating = asyncio.get_running_loop().create_task(agent.heartbeats())
            log.info(
                "%s serving on %s (%s execution, %d node(s))",
                settings.worker_id,
                settings.url(),
                settings.execution,
                settings.nodes,
            )
            with serving_gc():
                yield
            beating.cancel()
            await agent.close()

    app = FastAPI(title=f"Megha worker {settings.worker_id}", lifespan=lifespan)
    app.state.agent = agent
    install_error_handlers(app)
    mount_metrics(app, worker_registry(agent))

    @app.get("/healthz")
    async def healthz() -> dict[str, object]:
        return {"status": "ok", "worker": settings.worker_id, "registered": agent.registered is not None}

    @app.post(
        "/v1/tasks",
        status_code=202,
        response_model=None,
        openapi_extra=json_body(WorkerLaunchModel),
        responses=errors(409, 503),
    )
    async def launch(request: Request) -> Response:
        body = await read_body(request, WorkerLaunchModel)

        def refuse(status: int, message: str, *field: str) -> Response:
            """Answer an error (naming `field`) and log the refused launch with its tasks' ids: the LM reports
            them lost, and their GMs place them again."""
            launches = body.launches
            log.warning(
                "refused a launch of %d tasks from LM %d (%d): %s; tasks %s",
                len(launches),
                body.lm,
                status,
                message,
                [p.task.task_id for p in launches[:20]],
                extra=ids(
                    job=sorted({p.task.job_id for p in launches}),
                    task=[p.task.task_id for p in launches],
                    gm=sorted({p.gm for p in launches}),
                    lm=body.lm,
                    node=sorted({p.node for p in launches}),
                    worker=settings.worker_id,
                ),
            )
            return error(status, message, *field)

        registered = agent.registered
        if registered is None:
            return refuse(503, "not registered with an LM yet")
        if body.lm != registered.lm:
            return refuse(422, f"this agent belongs to LM {registered.lm}, not {body.lm}", "lm")
        if not acts_as(who := principal(request), "lm", str(registered.lm)):
            return refuse(403, f"{who} may not launch on an agent of LM {registered.lm}", "lm")
        mine = range(registered.first_node, registered.first_node + registered.nodes)
        stray = [p.node for p in body.launches if p.node not in mine]
        if stray:
            return refuse(422, f"nodes {stray} are not this agent's ({mine.start}..{mine.stop - 1})", "launches")
        for i, p in enumerate(body.launches):
            if p.lm != registered.lm:  # its completion would be reported to the wrong LM
                return refuse(422, f"placement for LM {p.lm} in a launch from LM {registered.lm}", f"launches.{i}.lm")
            if len(p.task.request) != len(DEFAULT_RESOURCE_NAMES):
                names = list(DEFAULT_RESOURCE_NAMES)
                return refuse(422, f"request {p.task.request} is not aligned to {names}", f"launches.{i}.task.request")
            if 0 in p.task.request:  # negative amounts the model refuses
                k = p.task.request.index(0)
                message = f"request {p.task.request} asks no {DEFAULT_RESOURCE_NAMES[k]}: every amount must be > 0"
                return refuse(422, message, f"launches.{i}.task.request.{k}")
        try:
            accepted = agent.launch(body.to_core().launches)
        except LaunchRefused as refused:
            return refuse(refused.status, str(refused), refused.field)
        await asyncio.sleep(0)  # the tasks start (simulated ones all of them) before the LM is answered
        return json_response(to_json({"accepted": accepted}), 202)

    @app.post("/v1/preempt", response_model=None, openapi_extra=json_body(WorkerPreemptModel), responses=errors(503))
    async def preempt(request: Request) -> Response:
        body = await read_body(request, WorkerPreemptModel)
        registered = agent.registered
        if registered is None:
            return error(503, "not registered with an LM yet")
        if body.lm != registered.lm:
            return error(422, f"this agent belongs to LM {registered.lm}, not {body.lm}", "lm")
        if not acts_as(who := principal(request), "lm", str(registered.lm)):
            return error(403, f"{who} may not stop tasks on an agent of LM {registered.lm}", "lm")
        stopped = await agent.preempt(body.task_ids)
        return json_response(to_json({"stopped": stopped}))

    @app.get("/v1/state")
    async def state() -> dict[str, object]:
        return {"worker": settings.worker_id, "execution": settings.execution, "running": agent.executor.running()}

    @app.get(
        "/v1/tasks/{task_id}/logs",
        response_class=PlainTextResponse,
        responses={200: {"description": LOGS_ANSWER, "content": {"text/plain": {}}}, **errors(404)},
    )
    async def task_logs(
        request: Request,
        task_id: TaskIdParam,
        stream: StreamParam = "stdout",
        attempt: AttemptParam = None,
        tail: TailParam = None,
    ) -> Response:
        """The kept stdout or stderr of a task this agent runs or ran (its latest attempt unless `attempt`)."""
        who, registered = principal(request), agent.registered
        if who.role == "lm" and (registered is None or not acts_as(who, "lm", str(registered.lm))):
            return error(403, f"{who} may not read the output of an agent of another LM", "authorization")
        try:
            served, output = agent.task_output(task_id, stream, attempt, tail)
        except UnknownRun as unknown:
            return error(404, unknown.message, unknown.field)
        return PlainTextResponse(output, headers={ATTEMPT_HEADER: str(served)})

    document_bodies(app, WorkerLaunchModel, WorkerPreemptModel)
    serve_docs_offline(app)
    protect(app, settings.verifier(), WORKER_RULES, f"agent {settings.worker_id}")
    return app
