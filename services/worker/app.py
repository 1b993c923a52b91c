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

from megha.common.core.resources import DEFAULT_RESOURCE_NAMES
from megha.common.lifecycle import StartupError, exit_on_startup_error
from megha.common.models import (
    ROOT_FIELD,
    StopResponse,
    TasksAccepted,
    WorkerHealth,
    WorkerLaunchModel,
    WorkerPreemptModel,
    WorkerState,
)
from megha.common.settings import WorkerSettings
from megha.common.transport.rabbit import connected
from megha.services.appfactory import sealed, service_app
from megha.services.auth import WORKER_RULES, acts_as, principal
from megha.services.background import serving_gc
from megha.services.http import caller_left, error, errors, json_body, json_response, read_body
from megha.services.logroutes import ATTEMPT_HEADER
from megha.services.logs import configure_logging, ids
from megha.services.worker.agent import LaunchRefused, UnknownRun, WorkerAgent
from megha.services.worker.metrics import worker_registry
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

    def health() -> WorkerHealth:
        return WorkerHealth(worker=settings.worker_id, registered=agent.registered is not None)

    app = service_app(f"Megha worker {settings.worker_id}", lifespan, worker_registry(agent), health)
    app.state.agent = agent

    def lm_call(request: Request, lm: int, what: str) -> tuple[int, str, str] | None:
        """Why this agent refuses a call of LM `lm` to `what` (status, message, field), None when it takes it:
        503 before it registered, 422 for another LM's call, 403 for a caller that may not act as its LM."""
        registered = agent.registered
        if registered is None:
            return 503, "not registered with an LM yet", ROOT_FIELD
        if lm != registered.lm:
            return 422, f"this agent belongs to LM {registered.lm}, not {lm}", "lm"
        if not acts_as(who := principal(request), "lm", str(registered.lm)):
            return 403, f"{who} may not {what} an agent of LM {registered.lm}", "lm"
        return None

    @app.post(
        "/v1/tasks",
        status_code=202,
        response_model=TasksAccepted,
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

        if (why := lm_call(request, body.lm, "launch on")) is not None:
            return refuse(*why)
        registered = agent.registered
        assert registered is not None
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
        if await caller_left(request):  # the LM gave up on this call (and reported its tasks lost) while we stalled
            log.warning(
                "did not start a launch of %d tasks from LM %d: it closed the call before this agent read it (gave up "
                "or sent it again)",
                len(body.launches),
                body.lm,
                extra=ids(task=[p.task.task_id for p in body.launches], lm=body.lm, worker=settings.worker_id),
            )
            return Response(status_code=499)
        try:
            accepted = agent.launch(body.to_core().launches)
        except LaunchRefused as refused:
            return refuse(refused.status, str(refused), refused.field)
        await asyncio.sleep(0)  # the tasks start (simulated ones all of them) before the LM is answered
        return json_response(TasksAccepted(accepted=accepted), 202)

    @app.post(
        "/v1/preempt", response_model=StopResponse, openapi_extra=json_body(WorkerPreemptModel), responses=errors(503)
    )
    async def preempt(request: Request) -> Response:
        body = await read_body(request, WorkerPreemptModel)
        if (why := lm_call(request, body.lm, "stop tasks on")) is not None:
            return error(*why)
        stopped = await agent.preempt(body.task_ids)
        return json_response(StopResponse(stopped=stopped))

    @app.get("/v1/state", response_model=WorkerState)
    async def state() -> WorkerState:
        return WorkerState(
            worker=settings.worker_id,
            execution=settings.execution,
            running=agent.executor.running(),
            queued=agent.queues.all_waiting(),
        )

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

    bodies = (WorkerLaunchModel, WorkerPreemptModel)
    return sealed(app, settings.verifier(), WORKER_RULES, f"agent {settings.worker_id}", *bodies)
