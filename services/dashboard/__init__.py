"""A GM's live dashboard: `GET /dashboard` serves a page (plain HTML, CSS and JavaScript shipped in this package:
no build step, no CDN, it loads offline) that polls `GET /v1/overview` and draws the data centre as LMs x
partitions with their utilization, the queues' share against their usage over time, jobs and tasks per state, the
latest jobs (`GET /v1/jobs`: state, class, and gang/array/parents/retry markers) and the allocation-time
histogram. Everything it shows is this GM's view: partitions as its (eventually consistent) view has them, its own
queues and jobs exactly."""

from __future__ import annotations

import time
from collections import Counter
from importlib import resources
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.responses import Response

from megha.common.models import Histogram, Overview, PartitionUse, QueueUse
from megha.services.gm.metrics import ALLOCATION_TIME_BUCKETS, NO_QUEUE
from megha.services.http import error, errors, json_response

if TYPE_CHECKING:
    from megha.services.gm.service import GMService

ASSETS = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}


def overview(service: GMService) -> Overview:
    """What the dashboard shows, read from the GM's core, job table and meter."""
    core = service.core
    assert core is not None
    jobs = service.jobs
    pending: Counter[str] = Counter(t.user for t in core.queue)
    pending.update(t.user for parked in core.waiting.values() for t in parked)
    running: Counter[str] = Counter(p.task.user for p in core.running.values())
    book = core.book
    if book is not None:
        users = [q.user for q in book.config.queues_of(service.settings.gm_id)]
        queues = [
            QueueUse(
                queue=user,
                share=book.shares[user],
                consumption=round(book.consumption(user), 6),
                pending=pending[user],
                running=running[user],
            )
            for user in users
        ]
    else:
        queues = [QueueUse(queue=NO_QUEUE, pending=sum(pending.values()), running=sum(running.values()))]
    meter = service.meter.allocation
    return Overview(
        gm=service.settings.gm_id,
        at=time.time(),
        partitions=[
            PartitionUse(lm=v.lm, gm=v.gm, nodes=v.size, used_fraction=round(min(1.0, max(0.0, v.used_fraction())), 4))
            for row in core.views
            for v in row
        ],
        queues=queues,
        jobs=Counter(jobs.job_state(job) for job in jobs.jobs.values()),  # type: ignore[arg-type]
        tasks=Counter(rec.state for rec in jobs.tasks.values()),  # type: ignore[arg-type]
        allocation_time=Histogram(
            bounds=list(ALLOCATION_TIME_BUCKETS), counts=list(meter.buckets), count=meter.count, sum=max(0.0, meter.sum)
        ),
    )


def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def mount_dashboard(app: FastAPI, service: GMService) -> None:
    """Add `GET /dashboard`, its assets, and `GET /v1/overview` to a GM's app."""

    @app.get("/v1/overview", response_model=Overview, responses=errors(503))
    async def get_overview() -> Response:
        """This GM's view of the data centre, its queues, jobs and allocation times (what /dashboard shows)."""
        if service.core is None:
            return error(503, f"GM {service.settings.gm_id} has no view yet")
        return json_response(overview(service))

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard() -> Response:
        return Response(_asset("index.html"), media_type="text/html; charset=utf-8")

    @app.get("/dashboard/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in ASSETS:
            return error(404, f"no dashboard asset {name}", "name")
        return Response(_asset(name), media_type=ASSETS[name], headers={"Cache-Control": "max-age=300"})
