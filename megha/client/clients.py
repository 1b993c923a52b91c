"""`Client` and `AsyncClient`: the typed Python clients of Megha's GMs over httpx, one blocking and one asyncio.
Both run the plans of megha/client/plans.py, so each call sends, retries and reads answers the same way.
"""

from __future__ import annotations

import asyncio
import copy
import os
import random
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, Self, TypeVar

import httpx
from pydantic import BaseModel

from megha.client.answers import GMState, Health
from megha.client.plans import (
    DEFAULT_GM_URL,
    STREAM_READ_TIMEOUT,
    Done,
    JobEvent,
    Plans,
    check_token,
    gm_urls,
    token_from_env,
)
from megha.client.retry import DEFAULT_RETRY, Call, Emit, NextLine, RetryPolicy, Send, Sleep, Step, Throttled
from megha.common.models import JobAccepted, JobList, JobState, JobStatus, JobSubmission, QueueList

M = TypeVar("M", bound=BaseModel)
Job = JobSubmission | Mapping[str, Any] | str | os.PathLike[str]
"""What `submit` takes: a model, the JSON body as a mapping, or a job file's path (YAML, or JSON for .json)."""


def next_step(plan: Any, reply: object) -> Step | Done:
    """The plan's next step once it is given `reply`, or `Done` with what it returned."""
    try:
        return plan.send(reply)  # type: ignore[no-any-return]
    except StopIteration as stop:
        return Done(stop.value)


class _Base:
    """What both clients hold: the GMs' URLs, the plans of the calls, and how httpx is to be set up."""

    def __init__(
        self,
        gm: str | list[str] | tuple[str, ...] = DEFAULT_GM_URL,
        *,
        token: str | None = None,
        ca: str | None = None,
        timeout: float = 10.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        seed: int | None = None,
        on_throttled: Callable[[Throttled], None] | None = None,
        transport: Any = None,
    ) -> None:
        """`gm`: a GM's URL, or several (a list, or separated by commas): calls about a job go to the GM that holds
        it. `token`: the user's or operator's API token (default: MEGHA_API_TOKEN, or the file
        MEGHA_API_TOKEN_FILE names; ValueError when both are set; none is sent without one). `ca`: a PEM bundle of
        the certificate authorities that verify https:// GMs (default: the system's). `timeout`: seconds for each
        answer. `on_throttled` is told of each 429 a request waits out (`RetryPolicy.wait_when_throttled`).
        `transport`: httpx's (tests give an `httpx.MockTransport`)."""
        self.urls = gm_urls(gm)
        self.plans = Plans(self.urls, retry, random.Random(seed))
        token = check_token(token, "token") if token else token_from_env()
        self._http_options: dict[str, Any] = {
            "timeout": timeout,
            "headers": {"Authorization": f"Bearer {token}"} if token else {},
            "verify": ssl.create_default_context(cafile=ca) if ca else True,
        }
        self._timeout = timeout
        self._on_throttled = on_throttled
        self._http = self._connect(transport)

    def _connect(self, transport: Any) -> Any:
        """The httpx client of the calls (blocking or asyncio)."""
        raise NotImplementedError

    def at(self, *urls: str, retry: RetryPolicy | None = None) -> Self:
        """A client of the GMs (or the LM) at `urls`, sharing this client's connections and settings (its retry
        policy unless `retry`)."""
        other = copy.copy(self)
        other.urls = gm_urls(urls)
        other.plans = Plans(other.urls, retry or self.plans.policy, self.plans.rng)
        return other

    def _throttled(self, step: Sleep) -> None:
        if isinstance(step, Throttled) and self._on_throttled is not None:
            self._on_throttled(step)

    def _request(self, http: httpx.Client | httpx.AsyncClient, step: Send) -> httpx.Request:
        call = step.call
        timeout = httpx.Timeout(self._timeout, read=STREAM_READ_TIMEOUT) if call.stream else self._timeout
        headers = {"Content-Type": "application/json"} if call.content is not None else None
        return http.build_request(
            call.method,
            step.url + call.path,
            params=dict(call.params),
            content=call.content,
            headers=headers,
            timeout=timeout,
        )


class Client(_Base):
    """Blocking calls to Megha's GMs; a context manager that closes its connections. Every call raises MeghaError
    when a GM refuses it (its status and `ErrorBody`) or none can be reached (status None)."""

    def _connect(self, transport: httpx.BaseTransport | None) -> httpx.Client:
        return httpx.Client(transport=transport, **self._http_options)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def submit(self, job: Job, gm: int | None = None) -> JobAccepted:
        """Submit a job (`gm`: the GM identity it is for, which the next GM answers while standing in for it)."""
        return self._run(self.plans.submit(job, gm))

    def status(self, job_id: str) -> JobStatus:
        return self._run(self.plans.status(job_id))

    def locate(self, job_id: str) -> tuple[Self, JobStatus]:
        """A client of the GM that holds the job (asking the GMs in turn), and the job's status there."""
        url, status = self._run(self.plans.locate(job_id))
        return self.at(url), status

    def list(
        self,
        user: str | None = None,
        queue: str | None = None,
        state: JobState | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> JobList:
        """A page of the first GM's jobs, oldest first (`at(url)` for another GM's)."""
        return self._run(self.plans.list(user, queue, state, offset, limit))

    def cancel(self, job_id: str) -> JobStatus:
        return self._run(self.plans.cancel(job_id))

    def logs(self, job_id: str, task_id: str, stream: str = "stdout", attempt: int | None = None) -> str:
        return self._run(self.plans.logs(job_id, task_id, stream, attempt))

    def wait(self, job_id: str, timeout: float = 3600.0) -> JobStatus:
        """The job's status once every task of it ended; TimeoutError after `timeout` seconds."""
        return self._run(self.plans.wait(job_id, timeout))

    def events(self, job_id: str) -> Iterator[JobEvent]:
        """The job's events as they happen: its `JobStatus`, each `TaskTransition`, its `JobEnd`; then it stops."""
        for item in self._drive(self.plans.events(job_id)):
            if not isinstance(item, Done):
                yield item  # type: ignore[misc]

    def queues(self) -> QueueList:
        return self._run(self.plans.queues())

    def state(self) -> GMState:
        return self._run(self.plans.state())

    def health(self) -> Health:
        return self._run(self.plans.health())

    def get(self, path: str, model: type[M], **params: object) -> M:
        """Any GET route's answer as `model` (an LM's `/v1/state`, say, with `at(lm_url)`)."""
        return self._run(self.plans.read(Call("GET", path, params), model))

    def _run(self, plan: Any) -> Any:
        result = None
        for item in self._drive(plan):  # to its end, which closes what it opened
            if isinstance(item, Done):
                result = item.value
        return result

    def _drive(self, plan: Any) -> Iterator[object]:
        """Run `plan`'s steps: yield what it emits, then `Done` with what it returned."""
        answer: httpx.Response | None = None  # the last answer, whose lines `NextLine` reads
        lines: Iterator[str] = iter(())
        reply: object = None
        try:
            while not isinstance(step := next_step(plan, reply), Done):
                reply = None
                if isinstance(step, Emit):
                    yield step.value
                elif isinstance(step, Send):
                    if answer is not None:
                        answer.close()
                    reply = self._send(step)
                    answer = reply if isinstance(reply, httpx.Response) else None
                    lines = iter(()) if answer is None else answer.iter_lines()
                elif isinstance(step, NextLine):
                    try:
                        reply = next(lines, None)
                    except httpx.TransportError as exc:
                        reply = exc
                elif isinstance(step, Sleep):
                    self._throttled(step)
                    time.sleep(step.seconds)
                else:
                    reply = time.monotonic()  # Clock
            yield step
        finally:
            if answer is not None:
                answer.close()
            plan.close()

    def _send(self, step: Send) -> httpx.Response | httpx.TransportError:
        try:
            response = self._http.send(self._request(self._http, step), stream=step.call.stream)
        except httpx.TransportError as exc:
            return exc
        if step.call.stream and response.status_code != 200:
            response.read()  # an error's body, read whole
        return response


class AsyncClient(_Base):
    """The asyncio twin of `Client`: the same calls, awaited; `events` is an async iterator."""

    def _connect(self, transport: httpx.AsyncBaseTransport | None) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=transport, **self._http_options)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def submit(self, job: Job, gm: int | None = None) -> JobAccepted:
        return await self._run(self.plans.submit(job, gm))

    async def status(self, job_id: str) -> JobStatus:
        return await self._run(self.plans.status(job_id))

    async def locate(self, job_id: str) -> tuple[Self, JobStatus]:
        url, status = await self._run(self.plans.locate(job_id))
        return self.at(url), status

    async def list(
        self,
        user: str | None = None,
        queue: str | None = None,
        state: JobState | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> JobList:
        return await self._run(self.plans.list(user, queue, state, offset, limit))

    async def cancel(self, job_id: str) -> JobStatus:
        return await self._run(self.plans.cancel(job_id))

    async def logs(self, job_id: str, task_id: str, stream: str = "stdout", attempt: int | None = None) -> str:
        return await self._run(self.plans.logs(job_id, task_id, stream, attempt))

    async def wait(self, job_id: str, timeout: float = 3600.0) -> JobStatus:
        return await self._run(self.plans.wait(job_id, timeout))

    async def events(self, job_id: str) -> AsyncIterator[JobEvent]:
        async for item in self._drive(self.plans.events(job_id)):
            if not isinstance(item, Done):
                yield item  # type: ignore[misc]

    async def queues(self) -> QueueList:
        return await self._run(self.plans.queues())

    async def state(self) -> GMState:
        return await self._run(self.plans.state())

    async def health(self) -> Health:
        return await self._run(self.plans.health())

    async def get(self, path: str, model: type[M], **params: object) -> M:
        return await self._run(self.plans.read(Call("GET", path, params), model))

    async def _run(self, plan: Any) -> Any:
        result = None
        async for item in self._drive(plan):  # to its end, which closes what it opened
            if isinstance(item, Done):
                result = item.value
        return result

    async def _drive(self, plan: Any) -> AsyncIterator[object]:
        answer: httpx.Response | None = None
        lines: AsyncIterator[str] | None = None
        reply: object = None
        try:
            while not isinstance(step := next_step(plan, reply), Done):
                reply = None
                if isinstance(step, Emit):
                    yield step.value
                elif isinstance(step, Send):
                    if answer is not None:
                        await answer.aclose()
                    reply = await self._send(step)
                    answer = reply if isinstance(reply, httpx.Response) else None
                    lines = None if answer is None else answer.aiter_lines()
                elif isinstance(step, NextLine):
                    try:
                        reply = None if lines is None else await anext(lines, None)
                    except httpx.TransportError as exc:
                        reply = exc
                elif isinstance(step, Sleep):
                    self._throttled(step)
                    await asyncio.sleep(step.seconds)
                else:
                    reply = time.monotonic()  # Clock
            yield step
        finally:
            if answer is not None:
                await answer.aclose()
            plan.close()

    async def _send(self, step: Send) -> httpx.Response | httpx.TransportError:
        try:
            response = await self._http.send(self._request(self._http, step), stream=step.call.stream)
        except httpx.TransportError as exc:
            return exc
        if step.call.stream and response.status_code != 200:
            await response.aread()
        return response
