"""The task-log routes of the GM and the LM: their query (stream, attempt, tail) and how each relays the answer of
the service behind it (GM -> LM -> the agent that ran the task, whose `GET /v1/tasks/{task_id}/logs` reads the
output it kept: services/worker/tasklogs.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlencode

from fastapi import Depends, FastAPI, Query
from fastapi.responses import Response

from megha.services.client import Reply
from megha.services.http import error, errors

Stream = Literal["stdout", "stderr"]

MAX_TAIL_BYTES = 64 * 1024 * 1024

STREAM_QUERY: Any = Query("stdout", description="which stream of the run: stdout or stderr")
ATTEMPT_QUERY: Any = Query(None, ge=1, description="which attempt of the task (default: its latest)")
TAIL_QUERY: Any = Query(
    None, ge=1, le=MAX_TAIL_BYTES, description="only the last this many bytes (default: all that is kept)"
)

LOG_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The stream's text as the agent kept it (bounded and rotated: its newest part)",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}

ATTEMPT_HEADER = "X-Megha-Attempt"
"""Names the attempt whose output an answer holds (the agent sets it; the LM and the GM pass it on)."""

PASSED_ON = frozenset({200, 404, 422, 502, 503})
"""Statuses a log route answers as the service behind it did: the text, an unknown task, node or attempt, and an
unreachable or unready service further on. Any other (say, a refused credential between services) is a 502."""


@dataclass(frozen=True, slots=True)
class LogQuery:
    """A log route's validated query: which stream, which attempt (None: the latest), how many last bytes."""

    stream: Stream
    attempt: int | None
    tail: int | None

    def passed_on(self) -> str:
        """The query string to pass on to the service behind."""
        params: dict[str, object] = {"stream": self.stream}
        if self.attempt is not None:
            params["attempt"] = self.attempt
        if self.tail is not None:
            params["tail"] = self.tail
        return urlencode(params)


def _log_query(
    stream: Stream = STREAM_QUERY, attempt: int | None = ATTEMPT_QUERY, tail: int | None = TAIL_QUERY
) -> LogQuery:
    return LogQuery(stream, attempt, tail)


LogQueryParam = Annotated[LogQuery, Depends(_log_query)]
"""A log route's query parameters, read into one `LogQuery` (`query: LogQueryParam`)."""


Route = TypeVar("Route", bound=Callable[..., Any])


def relay_route(app: FastAPI, path: str) -> Callable[[Route], Route]:
    """Declare GET `path` of `app`, a log route that relays the service behind it (the GM's and the LM's): the
    stream's text, or the error it passed on, or a 502."""
    return app.get(path, response_class=Response, responses={**LOG_RESPONSE, **errors(404, 502, 503)})


def relay(reply: Reply, who: str, field: str) -> Response:
    """The answer of `who` (say, "the agent of node 3") to a log request, as this route's answer."""
    if reply.status == 200:
        attempt = reply.header(ATTEMPT_HEADER)
        headers = {ATTEMPT_HEADER: attempt} if attempt is not None else None
        return Response(reply.body, media_type="text/plain; charset=utf-8", headers=headers)
    if reply.status in PASSED_ON:
        return Response(reply.body, status_code=reply.status, media_type="application/json")
    return error(502, f"{who} answered {reply.status}: {reply.text[:300]}", field)
