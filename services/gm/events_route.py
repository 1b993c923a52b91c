"""The job event stream, GM `GET /v1/jobs/{id}/events`: the readers of each job (`JobEvents`, fed by the GM core's
observer fan-out after the job table) and the route that sends them server-sent events.

A reader never holds the GM back: events are serialised once, queued per reader up to `BACKLOG`, and a reader
that falls that far behind gets a last `error` event instead of the rest (it may open the stream again: it starts
from the job's state). The wire format is in common/models.py ("The job event stream").
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from megha.common.core.messages import Placement
from megha.common.core.observer import CoreObserver
from megha.common.core.task import TaskSpec
from megha.common.models import ErrorBody, JobEnd, JobState, TaskChange, TaskTransition
from megha.services.background import wait_event
from megha.services.gm.jobs import ENDED, JobTable
from megha.services.http import error, errors

if TYPE_CHECKING:
    from megha.services.gm.service import GMService

BACKLOG = 1024
"""Events queued for one reader at most; one more and it is dropped with an `error` event."""
KEEPALIVE = 10.0
"""Seconds of silence after which a stream sends a comment line, so that readers and proxies see it is alive."""
EVENT_STREAM = "text/event-stream"


def frame(name: str, body: BaseModel) -> bytes:
    """One server-sent event."""
    return b"event: " + name.encode() + b"\ndata: " + body.model_dump_json().encode() + b"\n\n"


class Reader:
    """One open stream: the events still to be sent to it, at most `BACKLOG`."""

    __slots__ = ("closed", "frames", "ready")

    def __init__(self) -> None:
        self.frames: deque[bytes] = deque()
        self.ready = asyncio.Event()  # set when frames were queued
        self.closed = False  # its last frame is queued: the job ended, or the reader fell behind

    def put(self, data: bytes, last: bool = False) -> None:
        if self.closed:
            return
        if len(self.frames) >= BACKLOG:
            self.frames.clear()
            reason = f"this reader fell {BACKLOG} events behind; open the stream again to go on from the job's state"
            data, last = frame("error", ErrorBody(error=reason)), True
        self.frames.append(data)
        self.closed = last
        self.ready.set()


class _Watched:
    """The readers of one job, and how each of its tasks that ended ended (a repeated end is not told again)."""

    __slots__ = ("ended", "readers")

    def __init__(self, ended: dict[str, str]) -> None:
        self.readers: list[Reader] = []
        self.ended = ended  # task id -> finished, failed or cancelled

    def outcome(self) -> JobState:
        """The job's state once every task ended, by the job table's rule (for a job it forgot at its end)."""
        kinds = set(self.ended.values())
        return "cancelled" if "cancelled" in kinds else "failed" if "failed" in kinds else "finished"


class JobEvents(CoreObserver):
    """The readers of each job's event stream, told of each change to its tasks. It observes the GM core after the
    job table (`observe(jobs, ..., job_events)`), so the table it reads already holds the change."""

    def __init__(self, table: Callable[[], JobTable]) -> None:
        """`table`: the service's job table now (a GM that recovers makes a new one)."""
        self._table = table
        self._jobs: dict[str, _Watched] = {}  # job id -> its readers, for jobs with at least one

    def open(self, job_id: str, now: float) -> Reader:
        """A new reader of a job the table holds: its first event is the job's state (and the end, when the job
        has ended already)."""
        table = self._table()
        status = table.status(job_id)
        assert status is not None, job_id
        reader = Reader()
        reader.put(frame("state", status))
        if not table.jobs[job_id].open:
            reader.put(frame("end", JobEnd(job_id=job_id, state=status.state, at=now)), last=True)
            return reader
        watched = self._jobs.get(job_id)
        if watched is None:
            watched = self._jobs[job_id] = _Watched({t.task_id: t.state for t in status.tasks if t.state in ENDED})
        watched.readers.append(reader)
        return reader

    def close(self, job_id: str, reader: Reader) -> None:
        """The stream of `reader` is over: forget it."""
        watched = self._jobs.get(job_id)
        if watched is not None and reader in watched.readers:
            watched.readers.remove(reader)
            if not watched.readers:
                del self._jobs[job_id]

    def end_all(self, reason: str) -> None:
        """End every stream with an `error` event (the job table is about to be rebuilt)."""
        last = frame("error", ErrorBody(error=reason))
        for watched in self._jobs.values():
            for reader in watched.readers:
                reader.put(last, last=True)
        self._jobs.clear()

    # The core's events (CoreObserver), after the job table's:

    def decided(self, placements: Sequence[Placement], now: float) -> None:
        if self._jobs:
            for p in placements:
                self._tell(p.task, "launched", now, p.lm, p.node)

    def inconsistency(self, placement: Placement, now: float) -> None:
        self._tell(placement.task, "requeued", now, placement.lm, placement.node)

    def task_lost(self, task: TaskSpec, reason: str, now: float) -> None:
        self._tell(task, "lost", now, reason=reason)

    def task_preempted(self, task: TaskSpec, now: float) -> None:
        self._tell(task, "preempted", now)

    def task_failed(self, task: TaskSpec, reason: str, now: float) -> None:
        self._tell(task, "failed", now, reason=reason)

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool = False) -> None:
        self._tell(task, "failed" if error else "finished", now, reason=error)

    def task_cancelled(self, task: TaskSpec, now: float) -> None:
        self._tell(task, "cancelled", now, reason="job cancelled")

    def task_retry_scheduled(self, task: TaskSpec, reason: str, at: float, now: float) -> None:
        self._tell(task, "retrying", now, reason=reason)

    def _tell(
        self,
        task: TaskSpec,
        kind: TaskChange,
        now: float,
        lm: int | None = None,
        node: int | None = None,
        reason: str = "",
    ) -> None:
        watched = self._jobs.get(task.job_id)
        if watched is None or task.task_id in watched.ended:
            return  # nobody reads this job, or the task's end was told already (a repeated completion)
        table = self._table()
        rec = table.tasks.get(task.task_id)
        if kind in ENDED:
            watched.ended[task.task_id] = kind
        elif rec is None or rec.state in ENDED:
            return  # news of a run of a task that ended since
        if lm is None and rec is not None:
            lm, node = rec.lm, rec.node  # where the run that changed ran
        node = None if node is None or node < 0 else node  # a preemption request leaves the node to the LM
        change = TaskTransition(
            kind=kind,
            task_id=task.task_id,
            attempt=task.attempt,
            at=now,
            lm=lm,
            node=node,
            reason=reason,
        )
        data = frame("task", change)
        for reader in watched.readers:
            reader.put(data)
        job = table.jobs.get(task.job_id)
        if job is None or not job.open:
            state = table.job_state(job) if job is not None else watched.outcome()  # forgotten as it ended
            last = frame("end", JobEnd(job_id=task.job_id, state=state, at=now))
            for reader in watched.readers:
                reader.put(last, last=True)
            del self._jobs[task.job_id]


async def _send(events: JobEvents, job_id: str, reader: Reader) -> AsyncIterator[bytes]:
    """The frames of one stream as they come, a comment line after KEEPALIVE seconds without any."""
    try:
        while True:
            while reader.frames:
                yield reader.frames.popleft()
            if reader.closed:
                return
            reader.ready.clear()
            if not await wait_event(reader.ready, KEEPALIVE):
                yield b": keep-alive\n\n"
    finally:
        events.close(job_id, reader)


def mount_job_events(app: FastAPI, gm: int, find: Callable[[Request, str], tuple[GMService, str] | None]) -> None:
    """Serve GM `GET /v1/jobs/{id}/events`; `find` is the route's authorisation, that of `GET /v1/jobs/{id}` (the
    holder and id of the job the caller may see, else None: 404)."""

    @app.get(
        "/v1/jobs/{job_id}/events",
        response_class=StreamingResponse,
        responses={200: {"content": {EVENT_STREAM: {}}, "description": "server-sent events"}, **errors(404)},
    )
    async def job_events(job_id: str, request: Request) -> Response:
        """The job's events as server-sent events: its state, then each change to its tasks (`TaskTransition`),
        then its end (`JobEnd`), after which the stream closes."""
        found = find(request, job_id)
        if found is None:
            return error(404, f"no job {job_id} at GM {gm}", "job_id")
        holder, full_id = found
        reader = holder.job_events.open(full_id, time.time())
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(_send(holder.job_events, full_id, reader), media_type=EVENT_STREAM, headers=headers)
