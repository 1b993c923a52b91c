"""The LM's HTTP API: POST /v1/workers, /v1/launch, /v1/preempt, /v1/stop, /v1/gangs/prepare|commit|abort and
/v1/gms/{gm}/claim; GET /v1/cluster, /v1/gms/{gm}/state, /v1/nodes/{node}/tasks/{task_id}/logs, /v1/state and
/healthz."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Query, Request
from fastapi.responses import Response
from pydantic_core import to_json

from megha.common.core.constraints import constraint_ids
from megha.common.core.fencing import Superseded
from megha.common.models import (
    GangAborted,
    GangAbortModel,
    GangCommitModel,
    GangCommittedModel,
    GangPreparedModel,
    GangPrepareModel,
    GMClaim,
    GMRecovery,
    LaunchBatchModel,
    LaunchResponseModel,
    LMCluster,
    LMHealth,
    LMState,
    PreemptRequestModel,
    PreemptResponseModel,
    StopRequestModel,
    StopResponse,
    WorkerRegistered,
    WorkerRegistration,
    made_by,
)
from megha.common.settings import LMSettings
from megha.common.transport.rabbit import connected, lm_key
from megha.services.appfactory import sealed, service_app
from megha.services.auth import LM_RULES, acts_as_gm, principal
from megha.services.background import serving_gc
from megha.services.client import CallError
from megha.services.http import caller_left, error, errors, json_body, json_response, read_body
from megha.services.lm.membership import RegistrationError
from megha.services.lm.metrics import lm_registry
from megha.services.lm.service import LMService, NotReady
from megha.services.logroutes import LogQueryParam, relay, relay_route
from megha.services.logs import configure_logging, ids


def create_app(settings: LMSettings, use_broker: bool = True) -> FastAPI:
    log = configure_logging(settings.log_level, f"lm-{settings.lm_id}")
    broker = settings.broker() if use_broker else None
    service = LMService(settings, broker)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with connected(broker):
            if broker is not None:
                await broker.consume("lm", lm_key(settings.lm_id), service.on_broker_message, headers=True)
            log.info(
                "LM %d serving on %s, expecting %d nodes for %d GMs",
                settings.lm_id,
                settings.url(),
                settings.expected_nodes,
                settings.num_gms,
            )
            # Heartbeats come over the broker: without one, silence would say nothing about an agent.
            watching = service.watch.watch_workers() if broker is not None else None
            watcher = asyncio.get_running_loop().create_task(watching) if watching is not None else None
            with serving_gc():
                yield
            if watcher is not None:
                watcher.cancel()
            await service.close()

    def refuse(status: int, what: str, message: str, field: str, about: dict[str, object]) -> Response:
        """Answer an error naming `field`, and log the refusal of `what` with the ids it concerns."""
        log.warning("refused %s (%d): %s", what, status, message, extra=about)
        return error(status, message, field)

    def health() -> LMHealth:
        return LMHealth(lm=settings.lm_id, ready=service.core is not None, incarnation=service.incarnation)

    name = f"LM {settings.lm_id}"
    app = service_app(f"Megha {name}", lifespan, lm_registry(service), health, NotReady, name)
    app.state.service = service

    def gm_call(request: Request, what: str, lm: int, gm: int, about: dict[str, object]) -> Response | None:
        """The refusal of a GM's call (a launch, preemption or stop) for LM `lm` as GM `gm`, None when this LM
        takes it: a call for another LM or an unknown GM is a 422, one by a caller that may not act as that GM
        a 403."""
        if lm != settings.lm_id:
            return refuse(422, what, f"{what} for LM {lm} sent to LM {settings.lm_id}", "lm", about)
        if not 0 <= gm < settings.num_gms:
            return refuse(422, what, f"no GM {gm}; this deployment has {settings.num_gms}", "gm", about)
        if not acts_as_gm(who := principal(request), gm, settings.num_gms):
            return refuse(403, what, f"{who} may not act as GM {gm}", "gm", about)
        return None

    async def abandoned(request: Request, what: str, about: dict[str, object]) -> Response | None:
        """An empty 499 (nobody reads it) when the GM closed its call before this LM got to apply it: the GM gave
        up on it (and counts its tasks as failed or its request as refused) or sends it again on a new connection.
        Checked just before the core applies a launch, a preemption or a gang's prepare or commit, so that an LM
        that was paused past its GM's MEGHA_LM_TIMEOUT does not start runs its GM no longer tracks."""
        if not await caller_left(request):
            return None
        log.warning(
            "did not apply %s: its GM closed the call before this LM read it (gave up or sent it again)",
            what,
            extra=about,
        )
        return Response(status_code=499)

    @app.post(
        "/v1/workers",
        status_code=201,
        response_model=WorkerRegistered,
        openapi_extra=json_body(WorkerRegistration),
        responses=errors(409),
    )
    async def register(request: Request) -> Response:
        reg = await read_body(request, WorkerRegistration)
        worker = ids(worker=reg.worker_id, lm=settings.lm_id)
        if (who := principal(request)).role == "worker" and who.name != reg.worker_id:
            return refuse(
                403, f"registration of {reg.worker_id}", f"{who} may register only itself", "worker_id", worker
            )
        for i, node in enumerate(reg.nodes):
            if set(node.capacity) != set(service.resource_names):
                message = f"capacity names {sorted(node.capacity)} differ from {sorted(service.resource_names)}"
                return refuse(422, f"registration of {reg.worker_id}", message, f"nodes.{i}.capacity", worker)
        try:
            return json_response(await service.register(reg), 201)
        except RegistrationError as exc:
            return refuse(409, f"registration of {reg.worker_id}", str(exc), exc.field, worker)

    @app.get("/v1/cluster", response_model=LMCluster, responses=errors(503))
    async def cluster() -> object:
        """This LM's partitions (one per GM): each node's capacity, machine constraints and task drivers."""
        parts = service.partitions()
        return {
            "lm": settings.lm_id,
            "incarnation": service.incarnation,
            "resource_names": list(service.resource_names),
            "partitions": [
                {
                    "gm": p.gm,
                    "capacities": [list(c) for c in p.capacities],
                    "constraints": [constraint_ids(m) for m in p.constraint_masks],
                    "drivers": [list(d) for d in p.node_drivers()],
                }
                for p in parts
            ],
        }

    term_query = Query(
        0, ge=0, description="the calling GM's term (POST /v1/gms/{gm}/claim); a call with an older term gets 409"
    )

    @app.post(
        "/v1/launch",
        response_model=LaunchResponseModel,
        openapi_extra=json_body(LaunchBatchModel),
        responses=errors(409, 503),
    )
    async def launch(request: Request, term: int = term_query) -> Response:
        batch = await read_body(request, LaunchBatchModel)
        what = f"launch batch {batch.seq} of GM {batch.gm}"
        tasks = [p.task for p in batch.placements]
        about = ids(job=sorted({t.job_id for t in tasks}), task=[t.task_id for t in tasks], gm=batch.gm, lm=batch.lm)
        if (refused := gm_call(request, what, batch.lm, batch.gm, about)) is not None:
            return refused
        for i, p in enumerate(batch.placements):
            field = f"placements.{i}.task.request"
            if len(p.task.request) != len(service.resource_names):
                names = list(service.resource_names)
                return refuse(422, what, f"request {p.task.request} is not aligned to {names}", field, about)
            if min(p.task.request) <= 0:  # a GM never sends one (it refuses them at submission)
                return refuse(422, what, f"request {p.task.request} must be positive in every resource", field, about)
        if (gone := await abandoned(request, what, about)) is not None:
            return gone
        try:
            response = await service.launch(batch.to_core(), term)
        except Superseded as exc:
            return refuse(409, what, str(exc), "term", about)
        return json_response(LaunchResponseModel.core_json(response))

    @app.post(
        "/v1/preempt",
        response_model=PreemptResponseModel,
        openapi_extra=json_body(PreemptRequestModel),
        responses=errors(409, 503),
    )
    async def preempt(request: Request, term: int = term_query) -> Response:
        req = await read_body(request, PreemptRequestModel)
        what = f"preemption request {req.seq} of GM {req.gm} for task {req.task.task_id}"
        t = req.task
        about = ids(job=t.job_id, task=t.task_id, attempt=t.attempt, gm=req.gm, lm=req.lm, user=t.user)
        if (refused := gm_call(request, what, req.lm, req.gm, about)) is not None:
            return refused
        width = len(service.resource_names)
        if len(t.request) != width:
            message = f"request {t.request} is not aligned to {list(service.resource_names)}"
            return refuse(422, what, message, "task", about)
        if min(t.request) <= 0:
            return refuse(422, what, f"request {t.request} must be positive in every resource", "task.request", about)
        if len(req.total) != width or any(v <= 0 for v in req.total):
            return refuse(422, what, f"total {req.total} must be {width} positive amounts", "total", about)
        for i, v in enumerate(req.victims):
            if len(v.usage_elsewhere) != width:
                message = f"usage {v.usage_elsewhere} has not {width} amounts"
                return refuse(422, what, message, f"victims.{i}.usage_elsewhere", about)
        if (gone := await abandoned(request, what, about)) is not None:
            return gone
        try:
            response = await service.preempt(req.to_core(), term)
        except Superseded as exc:
            return refuse(409, what, str(exc), "term", about)
        return json_response(PreemptResponseModel.core_json(response))

    @app.post(
        "/v1/stop", response_model=StopResponse, openapi_extra=json_body(StopRequestModel), responses=errors(409, 503)
    )
    async def stop(request: Request, term: int = term_query) -> Response:
        """A GM's runs of cancelled jobs to stop: each frees its resources and is stopped on its agent, and its
        end reaches the GM as usual. Runs this LM does not hold for that GM are left alone (a repeat is harmless)."""
        req = await read_body(request, StopRequestModel)
        what = f"stop of {len(req.runs)} runs of GM {req.gm}"
        about = ids(task=[r.task_id for r in req.runs], gm=req.gm, lm=req.lm)
        if (refused := gm_call(request, what, req.lm, req.gm, about)) is not None:
            return refused
        try:
            stopped = await service.stop(req.to_core(), term)
        except Superseded as exc:
            return refuse(409, what, str(exc), "term", about)
        return json_response(StopResponse(stopped=stopped))

    async def gang_call(
        request: Request, model: type[GangPrepareModel | GangCommitModel | GangAbortModel], term: int
    ) -> Response:
        """A GM's gang prepare, commit or abort (docs/gang.md), refused as a launch would be."""
        req = await read_body(request, model)
        step = model.__name__.removeprefix("Gang").removesuffix("Model").lower()
        what = f"gang {req.gang} {step} {req.seq} of GM {req.gm}"
        about = ids(job=req.gang, gm=req.gm, lm=req.lm)
        if (refused := gm_call(request, what, req.lm, req.gm, about)) is not None:
            return refused
        if isinstance(req, GangPrepareModel):
            if not req.commit and req.lease_s <= 0:
                return refuse(422, what, "a prepare without commit needs a lease above 0 s", "lease_s", about)
            for i, p in enumerate(req.placements):
                if len(p.task.request) != len(service.resource_names) or min(p.task.request) <= 0:
                    message = f"request {p.task.request} must be {len(service.resource_names)} positive amounts"
                    return refuse(422, what, message, f"placements.{i}.task.request", about)
        if not isinstance(req, GangAbortModel) and (gone := await abandoned(request, what, about)) is not None:
            return gone  # an abort applied late does no harm: it only releases
        try:
            answer = await service.gang(req.to_core(), term)
        except Superseded as exc:
            return refuse(409, what, str(exc), "term", about)
        if answer is None:
            return json_response(GangAborted(gang=req.gang))
        mirror = GangPreparedModel if isinstance(req, GangPrepareModel) else GangCommittedModel
        return json_response(mirror.core_json(answer))

    @app.post(
        "/v1/gangs/prepare",
        response_model=GangPreparedModel,
        openapi_extra=json_body(GangPrepareModel),
        responses=errors(409, 503),
    )
    async def gang_prepare(request: Request, term: int = term_query) -> Response:
        """Validate a gang's placements all-or-nothing; reserve them under a lease (or, with `commit`, launch them)."""
        return await gang_call(request, GangPrepareModel, term)

    @app.post(
        "/v1/gangs/commit",
        response_model=GangCommittedModel,
        openapi_extra=json_body(GangCommitModel),
        responses=errors(409, 503),
    )
    async def gang_commit(request: Request, term: int = term_query) -> Response:
        """Launch a prepared gang part; refused once its lease expired."""
        return await gang_call(request, GangCommitModel, term)

    @app.post(
        "/v1/gangs/abort",
        response_model=GangAborted,
        openapi_extra=json_body(GangAbortModel),
        responses=errors(409, 503),
    )
    async def gang_abort(request: Request, term: int = term_query) -> Response:
        """Release a prepared gang part's reservation (nothing when none is held)."""
        return await gang_call(request, GangAbortModel, term)

    @app.get("/v1/gms/{gm}/state", response_model=GMRecovery, responses=errors(404, 503))
    async def gm_state(gm: int, request: Request) -> Response:
        """What GM `gm` needs when it (re)starts: every node's state, its runs here, and its recently ended runs."""
        if not 0 <= gm < settings.num_gms:
            return error(404, f"no GM {gm}; this deployment has {settings.num_gms}", "gm")
        if not ((who := principal(request)).operator or acts_as_gm(who, gm, settings.num_gms)):
            return error(403, f"{who} may not read GM {gm}'s state", "gm")
        return json_response(to_json(service.recovery_state(gm)))

    @app.post(
        "/v1/gms/{gm}/claim",
        response_model=GMRecovery,
        openapi_extra=json_body(GMClaim),
        responses=errors(404, 409, 503),
    )
    async def gm_claim(gm: int, request: Request) -> Response:
        """GM `gm` (re)starts, or a peer stands in for it: fence its older terms and answer its state here."""
        claim = await read_body(request, GMClaim)
        for status, field, value in ((404, "gm", gm), (422, "by", claim.by)):
            if not 0 <= value < settings.num_gms:
                return error(status, f"no GM {value}; this deployment has {settings.num_gms}", field)
        who = principal(request)
        if not acts_as_gm(who, claim.by, settings.num_gms, stand_in=False) or not acts_as_gm(who, gm, settings.num_gms):
            return error(403, f"{who} may not claim GM {gm} as GM {claim.by}", "by")
        try:
            return json_response(to_json(await service.claim(gm, claim.term, claim.by)))
        except Superseded as exc:
            return error(409, str(exc), "term")

    @relay_route(app, "/v1/nodes/{node}/tasks/{task_id}/logs")
    async def task_logs(
        request: Request,
        node: int,
        task_id: str,
        query: LogQueryParam,
    ) -> Response:
        """The output (stdout or stderr) a task's run left on the agent that holds `node`: that agent's
        `GET /v1/tasks/{task_id}/logs`, relayed. 404 names `node` when no agent registered it here. A GM reads the
        output of the jobs it named only (or those of the GM it stands in for); 403 names `task_id` otherwise."""
        owner, who = made_by(task_id.rpartition(".")[0]), principal(request)
        if owner is not None and who.role == "gm" and not acts_as_gm(who, owner, settings.num_gms):
            return error(403, f"{who} may not read the output of GM {owner}'s task {task_id}", "task_id")
        try:
            reply = await service.task_logs(node, task_id, query.passed_on())
        except KeyError:
            return error(404, f"LM {settings.lm_id} has no registered node {node}", "node")
        except CallError as exc:
            return error(502, f"the agent of node {node} of LM {settings.lm_id} could not be reached: {exc}", "node")
        return relay(reply, f"the agent of node {node} of LM {settings.lm_id}", "node")

    @app.get("/v1/state", response_model=LMState)
    async def state() -> LMState:
        return LMState.model_validate(service.state())

    bodies = (WorkerRegistration, LaunchBatchModel, PreemptRequestModel, StopRequestModel, GMClaim)
    bodies += (GangPrepareModel, GangCommitModel, GangAbortModel)
    return sealed(app, settings.verifier(), LM_RULES, name, *bodies)
