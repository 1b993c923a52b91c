"""The GM's HTTP API: POST /v1/jobs, GET /v1/jobs, GET and DELETE /v1/jobs/{id}, GET
/v1/jobs/{id}/tasks/{task_id}/logs, GET /v1/queues, GET /v1/state, GET /healthz; between
peers POST /v1/peers/{gm}/journal and POST /v1/peers/{gm}/release (services/gm/standin.py).

Identities (docs/security.md, "Identities and privacy"): a user submits as itself only and owns every task of
its job; a job id a user chooses is put in that user's scope (`<user>~<id>`), and a job id the GM makes never
repeats (`JobIds`), so that no two jobs of the federation share an id, nor their tasks' runs at the LMs and agents.
A user sees its own jobs and queue only; an operator every one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import FastAPI, Query, Request
from fastapi.responses import Response

from megha.common.auth import Principal
from megha.common.core.cluster import ClusterSpec
from megha.common.core.gm import Unschedulable
from megha.common.lifecycle import StartupError, exit_on_startup_error
from megha.common.models import (
    JOB_SCOPE,
    ErrorBody,
    GMHealth,
    GMState,
    JobAccepted,
    JobList,
    JobState,
    JobStatus,
    JobSubmission,
    JournalCopied,
    JournalLines,
    QueueList,
    QueueState,
    QueueTasks,
    job_scope,
    scoped_job_id,
)
from megha.common.settings import GMSettings
from megha.common.transport.rabbit import connected, gm_key
from megha.common.wire.dependencies import ParentJob
from megha.services.appfactory import sealed, service_app
from megha.services.auth import GM_RULES, acts_as_gm, principal
from megha.services.background import serving_gc
from megha.services.client import CallError
from megha.services.dashboard import mount_dashboard
from megha.services.gm.dependencies import ParentRefused
from megha.services.gm.events_route import mount_job_events
from megha.services.gm.job_ids import JobIds
from megha.services.gm.metrics import gm_registry, tasks_per_queue
from megha.services.gm.service import DuplicateJob, GMService, NotServing, TooManyUnfinished
from megha.services.gm.standin import NotHere, Peers, StandingIn
from megha.services.http import error, errors, json_body, json_response, read_body
from megha.services.logroutes import LogQueryParam, relay, relay_route
from megha.services.logs import configure_logging, ids

SUBMIT_AGAIN_AFTER = 2
"""Seconds a 429 (the user's unfinished tasks are at MEGHA_MAX_UNFINISHED_TASKS_PER_USER) asks a client to wait."""

log = logging.getLogger("megha.gm")


def create_app(settings: GMSettings, use_broker: bool = True, cluster: ClusterSpec | None = None) -> FastAPI:
    """The GM app. It learns the cluster from its LMs at start-up unless `cluster` is given (tests)."""
    log = configure_logging(settings.log_level, f"gm-{settings.gm_id}")
    broker = settings.broker() if use_broker else None
    service = GMService(settings, broker)
    peers = Peers(service, settings, broker)
    fairness = settings.fairness()
    queue_users = None if fairness is None else frozenset(q.user for q in fairness.queues)
    job_ids: dict[int, JobIds] = {}  # per GM identity served here (its own, the one it stands in for)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with connected(broker):  # before recovering: the completions that waited for this GM count
            if cluster is None:
                try:
                    await service.discover()
                    await peers.take_back()  # what the next GM accepted while standing in for this one
                    await service.recover()  # the LMs' full state, and the journal of a GM that crashed
                except StartupError as exc:
                    exit_on_startup_error(exc)
            else:
                service.adopt(cluster)
            if broker is not None:
                await broker.consume("gm", gm_key(settings.gm_id), service.on_broker_message, headers=True)
            peers.start()
            service.parents.start()
            service.dispatch.watch.start()
            log.info(
                "GM %d serving on %s with the %s LM order and %s matching",
                settings.gm_id,
                settings.url(),
                settings.lm_order,
                settings.matching,
            )
            with serving_gc():
                yield
            await service.parents.close()
            await peers.close()
            await service.close()

    def health() -> GMHealth:
        return GMHealth(
            gm=settings.gm_id,
            ready=service.core is not None and service.serving,
            term=service.term,
            standing_in_for=[] if peers.stand_in is None else [peers.previous],
            journal_failing=(service.journal.failing or "") if service.journal is not None else "",
        )

    name = f"GM {settings.gm_id}"
    app = service_app(f"Megha {name}", lifespan, gm_registry(service, lambda: peers.stand_in), health)
    app.state.service = service
    mount_dashboard(app, service)

    @app.post(
        "/v1/jobs",
        status_code=201,
        response_model=JobAccepted,
        openapi_extra=json_body(JobSubmission),
        responses=errors(409, 429, 503),
    )
    async def submit(
        request: Request,
        gm: int | None = Query(
            None,
            ge=0,
            description="the GM identity the job is for: this GM's, or the one it stands in for (others get 503, "
            "to be tried again); without it, the GM whose queue holds the job's user",
        ),
    ) -> Response:
        arrived = time.time()  # allocation time counts from here: parsing the job is part of it
        sub = await read_body(request, JobSubmission, keys_once=True)  # a user's body: no key twice
        who = principal(request)
        for field, user in sub.named_users():
            if not who.may_act_for(user):  # a user submits as itself only, for the job and each of its tasks
                message = f"{who} submits only as itself, not as {user} ({field}); operators act for every user"
                log.warning("refused job %s (422): %s", sub.job_id or "(unnamed)", message, extra=ids(user=who.name))
                return error(422, message, field)
        if not who.operator and "user" not in sub.model_fields_set:
            sub = sub.model_copy(update={"user": who.name})
        if sub.job_id is not None:
            job_id = sub.job_id if who.operator else scoped_job_id(who.name, sub.job_id)
            if (scope := job_scope(job_id)) is not None and scope != sub.owner:
                message = f"job id {job_id} is in the scope of user {scope}, and this job's user is {sub.owner}"
                log.warning("refused job %s (422): %s", job_id, message, extra=ids(user=sub.owner))
                return error(422, message, "job_id")
            sub = sub.model_copy(update={"job_id": job_id})

        def refuse(status: int, exc: Exception | str, *field: str) -> Response:
            log.warning(
                "refused job %s of user %s (%d): %s",
                sub.job_id or "(unnamed)",
                sub.user,
                status,
                exc,
                extra=ids(job=sub.job_id, user=sub.user, gm=settings.gm_id if gm is None else gm),
            )
            return error(status, str(exc), *field)

        if (refusal := class_refusal(who, sub.priority_class)) is not None:
            return refuse(403, refusal, "priority_class")
        if not who.operator and queue_users is not None and sub.owner not in queue_users:
            return refuse(422, f"user {sub.owner} has no queue (MEGHA_QUEUES)", "user")  # nor others' names
        if gm is not None and service.cluster is not None and gm >= service.cluster.num_gms:
            return refuse(422, f"no such GM: the GMs are 0..{service.cluster.num_gms - 1}", "gm")  # not 503: never
        try:
            target = peers.service_for(sub, gm)
        except NotHere as exc:
            return refuse(503, exc, "gm")
        naming, held = ids_of(target), target.jobs.jobs
        if sub.job_id is None:
            sub = sub.model_copy(update={"job_id": naming.next(held)})
        elif JOB_SCOPE in sub.job_id:  # a user's name, made unique
            try:
                sub = sub.model_copy(update={"job_id": naming.named(sub.job_id, held)})
            except ValueError as exc:
                return refuse(409, exc, "job_id")
        parents: list[tuple[str, str]] = []
        if sub.depends_on:
            try:
                parents = await target.parents.resolve(who, sub.depends_on)
            except ParentRefused as exc:
                return refuse(exc.status, exc, exc.field)
            sub = sub.model_copy(update={"depends_on": [job_id for job_id, _ in parents]})
        try:
            job = await target.submit(sub, arrived)
        except Unschedulable as exc:
            return refuse(422, exc, exc.field)
        except DuplicateJob as exc:
            return refuse(409, exc, "job_id")
        except NotServing as exc:
            return refuse(503, exc)
        except TooManyUnfinished as exc:
            refused = refuse(429, exc, "user")
            refused.headers["Retry-After"] = str(SUBMIT_AGAIN_AFTER)
            return refused
        naming.accepted(job.job_id)
        target.parents.told(parents)
        accepted = JobAccepted(job_id=job.job_id, task_ids=[t.task_id for t in job.tasks], gm=target.settings.gm_id)
        return json_response(accepted, 201)

    classes, class_users = settings.classes(), settings.class_users()

    def class_refusal(who: Principal, name: str | None) -> str | None:
        """Why `who` may not name priority class `name` (a class above the default one, for operators and the users
        MEGHA_PRIORITY_CLASS_USERS lists for it), or None; an unknown class is refused later, as a 422."""
        if name is None or who.operator or name not in dict(classes.values) or not classes.above_default(name):
            return None
        if who.name in class_users.get(name, ()):
            return None
        listed = class_users.get(name)
        who_may = "operators" if not listed else f"operators and {', '.join(sorted(listed))}"
        return f"priority class {name} preempts the default class {classes.default}: only {who_may} may name it"

    def find(request: Request, job_id: str) -> tuple[GMService, str] | None:
        """The holder (this GM's identity or the one it stands in for) and the id of the job `job_id` names for
        the caller: the job of that id, else, for a name without a scope, the caller's job of that name
        (`<caller>~<name>`); only a job the caller may see and cancel (a user's own; an operator every one), so
        that other users' jobs answer 404 as unknown ones do."""
        who = principal(request)
        for name in (job_id,) if JOB_SCOPE in job_id else (job_id, scoped_job_id(who.name, job_id)):
            for holder, full_id in held_as(name):
                if who.may_act_for(holder.jobs.jobs[full_id].user):
                    return holder, full_id
        return None

    def held_as(name: str) -> list[tuple[GMService, str]]:
        """The jobs held here (this GM's identity, the one it stands in for) that `name` finds: (holder, job id)."""
        found = []
        for holder in (service, peers.stand_in):
            if holder is None:
                continue
            held = holder.jobs.jobs
            full_id = name if name in held else ids_of(holder).resolve(name, held)
            if full_id is not None and full_id in held:
                found.append((holder, full_id))
        return found

    service.parents.lookup = held_as
    service.parents.holders = lambda: [h for h in (service, peers.stand_in) if h is not None]

    def ids_of(holder: GMService) -> JobIds:
        """The job ids of the GM identity `holder` serves."""
        identity = holder.settings.gm_id
        if identity not in job_ids:
            job_ids[identity] = JobIds(identity, holder.jobs.jobs, time.time())
        return job_ids[identity]

    mount_job_events(app, settings.gm_id, find)

    @app.get("/v1/jobs/{job_id}", response_model=JobStatus, responses=errors(404))
    async def job_status(job_id: str, request: Request) -> Response:
        found = find(request, job_id)
        status = None if found is None else found[0].jobs.status(found[1])
        if status is None:
            message = f"no job {job_id} at GM {settings.gm_id}"
            if service.jobs.dropped_jobs:
                message += (
                    f" (this GM has forgotten its {service.jobs.dropped_jobs:,} oldest finished jobs to keep at most "
                    f"MEGHA_FINISHED_TASKS_KEPT={settings.finished_tasks_kept:,} finished tasks)"
                )
            return error(404, message, "job_id")
        return json_response(status)

    @relay_route(app, "/v1/jobs/{job_id}/tasks/{task_id}/logs")
    async def task_logs(
        job_id: str,
        task_id: str,
        request: Request,
        query: LogQueryParam,
    ) -> Response:
        """What a task's run printed (stdout or stderr), read from the agent that ran it through its LM: the node
        of the attempt asked for (an earlier attempt, lost or preempted, may have run on another node), else of the
        task's latest placement. Burn tasks print nothing and keep no output. 404 names `job_id`, `task_id` or the
        `attempt` this GM knows no run of (or the agent kept nothing of). A job and its task may be named by the
        name the caller chose, without its scope."""
        found = find(request, job_id)
        status = None if found is None else found[0].jobs.status(found[1])
        if found is None or status is None:
            return error(404, f"no job {job_id} at GM {settings.gm_id}", "job_id")
        holder, full_id = found
        for name in (job_id, scoped_job_id(principal(request).name, job_id)):  # `<name>.<i>`, `<user>~<name>.<i>`
            if full_id != name and task_id.startswith(f"{name}."):
                task_id = full_id + task_id[len(name) :]
                break
        task = next((t for t in status.tasks if t.task_id == task_id), None)
        if task is None:
            return error(404, f"job {job_id} has no task {task_id}", "task_id")
        where = holder.jobs.where_ran(task_id, query.attempt)
        if where is None:
            if query.attempt is not None and (runs := holder.jobs.attempts_run(task_id)):
                return error(
                    404, f"task {task_id} has no attempt {query.attempt} run on a node (its runs: {runs})", "attempt"
                )
            return error(404, f"task {task_id} has not run ({task.state}): it has no output", "task_id")
        lm, node = where
        try:
            reply = await holder.task_logs(lm, node, task_id, query.passed_on())
        except CallError as exc:
            return error(502, f"LM {lm}, where task {task_id} ran, could not be reached: {exc}", "task_id")
        return relay(reply, f"LM {lm}", "task_id")

    @app.delete(
        "/v1/jobs/{job_id}",
        status_code=202,
        response_model=JobStatus,
        responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}, 503: {"model": ErrorBody}},
    )
    async def cancel_job(job_id: str, request: Request) -> Response:
        """Cancel a job: its queued tasks end `cancelled` at once; its placed ones are stopped on their agents and
        end `cancelled` when their LM reports the stop (a task that finished first stays finished). 409 when the
        job had already ended; cancelling a cancelled job again answers its status."""
        found = find(request, job_id)
        if found is None:
            return error(404, f"no job {job_id} at GM {settings.gm_id}", "job_id")
        holder, full_id = found
        job = holder.jobs.jobs[full_id]
        if not job.open and not job.cancelled:
            state = holder.jobs.job_state(job)
            return error(409, f"job {full_id} already ended ({state}); nothing to cancel", "job_id")
        try:
            status = await holder.cancel(full_id)
        except NotServing as exc:
            return error(503, str(exc))
        assert status is not None
        return json_response(status, 202)

    @app.get("/v1/jobs", response_model=JobList, responses={422: {"model": ErrorBody}})
    async def list_jobs(
        request: Request,
        user: str | None = Query(None, min_length=1, max_length=64, description="only this user's jobs"),
        queue: str | None = Query(
            None,
            min_length=1,
            max_length=64,
            description="only the jobs of this queue (a queue is named after its user)",
        ),
        state: Annotated[JobState | None, Query(description="only jobs in this state")] = None,
        limit: int = Query(100, ge=1, le=1000, description="jobs per page"),
        offset: int = Query(0, ge=0, description="jobs to skip (the previous page's next_offset)"),
    ) -> Response:
        """The jobs this GM holds (and those of the GM it stands in for), oldest first, a page at a time. Finished
        jobs are forgotten beyond MEGHA_FINISHED_TASKS_KEPT finished tasks."""
        if user is not None and queue is not None and user != queue:
            return json_response(JobList(jobs=[], total=0, offset=offset, limit=limit))
        who = user if user is not None else queue
        caller = principal(request)
        if not caller.operator:  # a user lists its own jobs only
            if who is not None and who != caller.name:
                return error(403, f"{caller} may list only its own jobs, not {who}'s", "user" if user else "queue")
            who = caller.name
        found = service.jobs.summaries(who, state)
        if peers.stand_in is not None:
            found += peers.stand_in.jobs.summaries(who, state)
        page = found[offset : offset + limit]
        after = offset + len(page)
        listed = JobList(
            jobs=page, total=len(found), offset=offset, limit=limit, next_offset=after if after < len(found) else None
        )
        return json_response(listed)

    @app.get("/v1/queues", response_model=QueueList)
    async def queues(request: Request) -> Response:
        """Fair scheduling: the configured queues, shares and share policy, with this GM's view of each; and this
        GM's pending and running tasks per queue. A user sees its own queue only, an operator every one."""
        who = principal(request)
        mine = _own_queue(who)
        tasks: dict[str, QueueTasks] = {}
        for holder in (service, peers.stand_in):
            if holder is not None and holder.core is not None:
                for queue, (pending, running) in tasks_per_queue(holder.core).items():
                    if mine(queue):
                        before = tasks.get(queue, QueueTasks())
                        tasks[queue] = QueueTasks(pending=before.pending + pending, running=before.running + running)
        listed = QueueList(
            gm=settings.gm_id,
            fair_scheduling=fairness is not None,
            policy=fairness.policy if fairness is not None else None,
            queues=[QueueState.model_validate(q) for q in service.queues() if mine(str(q["user"]))],
            tasks=tasks,
        )
        return json_response(listed)

    def _own_queue(who: Principal) -> Callable[[str], bool]:
        """Whether a queue is one `who` may see: every one for an operator, the queue named after it for a user
        (without fair scheduling there is none: the one queue `default` holds every user's tasks)."""
        if who.operator:
            return lambda queue: True
        return lambda queue: fairness is not None and queue == who.name

    @app.get("/v1/state", response_model=GMState)
    async def state() -> GMState:
        assert service.core is not None
        snapshot = service.core.view_snapshot()
        snapshot["unfinished_tasks"] = service.jobs.unfinished()
        snapshot["finished_jobs_dropped"] = service.jobs.dropped_jobs
        snapshot["lm_urls"] = settings.lm_urls  # as this GM reaches them (`megha nodes` asks here without --lm)
        snapshot["ignored_broker_messages"] = service.lm_reports.ignored.count  # unsigned or forged (docs/security.md)
        return GMState.model_validate(snapshot)

    @app.get("/v1/peers/jobs/{job_id}", response_model=ParentJob, responses=errors(404))
    async def parent_job(job_id: str) -> Response:
        """For a peer GM whose jobs depend on job `job_id` (an id, or a user's scoped name): its user and state.
        Peers only: the asking GM shows it to its caller only if that caller may see the job's user's jobs."""
        for holder, full_id in held_as(job_id):
            job = holder.jobs.jobs[full_id]
            state = holder.jobs.job_state(job)
            return json_response(ParentJob(job_id=full_id, user=job.user, gm=holder.settings.gm_id, state=state))
        return error(404, f"no job {job_id} at GM {settings.gm_id}", "job_id")

    @app.post(
        "/v1/peers/{gm}/journal",
        response_model=JournalCopied,
        openapi_extra=json_body(JournalLines),
        responses=errors(404, 409, 503),
    )
    async def journal_copy(gm: int, request: Request) -> Response:
        """The previous GM's journal lines, kept so that this GM can stand in for it."""
        lines = await read_body(request, JournalLines)
        if not acts_as_gm(who := principal(request), gm, len(settings.gm_urls), stand_in=False):
            return error(403, f"{who} may not write GM {gm}'s journal copy", "gm")
        if (why := peers.not_kept(gm)) is not None:
            return error(404, why, "gm")
        try:
            await peers.receive(gm, lines)
        except StandingIn as exc:
            return error(409, str(exc), "gm")
        except OSError as exc:  # a full or read-only disk: the sender marks its copy behind and tries again
            log.error("could not keep GM %d's journal copy: %s", gm, exc)
            return error(503, f"GM {settings.gm_id} cannot keep GM {gm}'s journal copy: {exc}", "gm")
        return json_response(JournalCopied(gm=gm, lines=len(lines.lines)))

    @app.post("/v1/peers/{gm}/release", response_model=JournalLines, responses=errors(404))
    async def release(gm: int, request: Request) -> Response:
        """GM `gm` takes its identity back: stop standing in for it and answer the journal copy."""
        if not acts_as_gm(who := principal(request), gm, len(settings.gm_urls), stand_in=False):
            return error(403, f"{who} may not take GM {gm}'s identity back", "gm")
        if (why := peers.not_kept(gm)) is not None:
            return error(404, why, "gm")
        lines = await peers.release(f"GM {gm} takes its identity back")
        return json_response(JournalLines(reset=True, lines=lines))

    return sealed(app, settings.verifier(), GM_RULES, name, JobSubmission, JournalLines)
