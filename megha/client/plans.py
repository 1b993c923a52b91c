"""What each client call sends and how it reads the answer, sans-I/O: a plan is a generator of steps (`Send`,
`Sleep`, `Clock`, `NextLine`, `Emit`) that returns the typed answer. `Client` and `AsyncClient` run the same plans,
one with blocking httpx calls and one with asyncio; tests run them against `httpx.MockTransport`.
"""

from __future__ import annotations

import os
import random
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from megha.client.answers import GMState, Health, submission
from megha.client.retry import (
    Call,
    Clock,
    Emit,
    MeghaError,
    NextLine,
    RetryPolicy,
    Sleep,
    Step,
    exchange,
)
from megha.common.checks import check_http_urls, read_secret_file
from megha.common.models import (
    ErrorBody,
    JobAccepted,
    JobEnd,
    JobList,
    JobState,
    JobStatus,
    JobSubmission,
    QueueList,
    TaskTransition,
)

DEFAULT_GM_URL = "http://127.0.0.1:8000"
"""Where docker-compose.yml publishes its first GM (gm-0) on this host."""
TASK_ENDS = ("finished", "failed", "cancelled")
STREAM_READ_TIMEOUT = 60.0
"""Seconds a job event stream may be silent before the client opens it again (a GM sends a comment line every 10 s
of silence: services/gm/events_route.py)."""
EVENTS: dict[str, type[BaseModel]] = {"state": JobStatus, "task": TaskTransition, "end": JobEnd}
"""The models of the job event stream's events (common/models.py); `error` ends a stream early."""

M = TypeVar("M", bound=BaseModel)
Plan = Generator[Step, Any, M]
JobEvent = JobStatus | TaskTransition | JobEnd
"""What a job event stream yields: the job's state when the stream (re)opens, each task's changes, its end."""


@dataclass(frozen=True)
class Done:
    """The value a plan returned, as a driver hands it to its caller."""

    value: object


def check_token(token: str, source: str) -> str:
    """`token` if it is visible ASCII only (what an HTTP `Authorization: Bearer` header can carry); otherwise
    ValueError naming `source` (the option or variable it came from), never the token."""
    if not all("!" <= c <= "~" for c in token):
        raise ValueError(f"{source}: an API token holds visible ASCII characters only (no spaces, new lines, accents)")
    return token


def token_from_env() -> str | None:
    """The API token the CLI and `Client` use: MEGHA_API_TOKEN, or the file MEGHA_API_TOKEN_FILE names (a Docker
    secret). ValueError when both are set (which one is meant? as the services' settings refuse a secret given both
    ways, docs/security.md), the file cannot be read, or the token is not visible ASCII (`check_token`)."""
    token, path = os.environ.get("MEGHA_API_TOKEN"), os.environ.get("MEGHA_API_TOKEN_FILE")
    if token and path:
        raise ValueError("MEGHA_API_TOKEN and MEGHA_API_TOKEN_FILE are both set: set one")
    if token:
        return check_token(token, "MEGHA_API_TOKEN")
    if not path:
        return None
    try:
        text = read_secret_file(path)
    except OSError as exc:
        raise ValueError(f"MEGHA_API_TOKEN_FILE: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError("MEGHA_API_TOKEN_FILE: an API token holds visible ASCII characters only") from None
    return check_token(text, "MEGHA_API_TOKEN_FILE") or None


def gm_urls(gm: str | list[str] | tuple[str, ...]) -> list[str]:
    """The GMs' URLs of a URL, comma-separated URLs or a list of them; ValueError naming the first that is not an
    http(s) URL with a host and a port from 0 to 65535 (`check_http_urls`, as the settings check theirs) that httpx
    can send to."""
    texts = [gm] if isinstance(gm, str) else list(gm)
    urls = [u.strip().rstrip("/") for text in texts for u in text.split(",") if u.strip()]
    for url in urls:
        try:
            check_http_urls([url])
            httpx.URL(url)  # what urlsplit lets through and httpx refuses: a control character, say
        except (ValueError, httpx.InvalidURL) as exc:  # urlsplit's own errors (an IPv6 host not closed) omit the URL
            raise ValueError(str(exc) if repr(url) in str(exc) else f"{url!r} is not a URL: {exc}") from None
    if not urls:
        raise ValueError("no GM URL given")
    return list(dict.fromkeys(urls))


def job_path(job_id: str, *more: str) -> str:
    return "/".join(["/v1/jobs", quote(job_id, safe=""), *more])


class Plans:
    """The plans of the calls to the GMs at `urls` (the first only, for what one GM answers alone: its job list,
    queues, state, health)."""

    def __init__(self, urls: list[str], policy: RetryPolicy, rng: random.Random) -> None:
        self.urls = urls
        self.policy = policy
        self.rng = rng

    def read(self, call: Call, model: type[M], ok: int = 200, urls: list[str] | None = None) -> Plan[M]:
        """`call`'s answer as `model`; MeghaError for any status but `ok`."""
        answer = yield from exchange(call, urls or self.urls, self.policy, self.rng)
        if answer.response.status_code != ok:
            raise MeghaError.answered(answer.url, answer.response)
        return model.model_validate_json(answer.response.content)

    def submit(
        self, job: JobSubmission | Mapping[str, Any] | str | os.PathLike[str], gm: int | None = None
    ) -> Plan[JobAccepted]:
        """To the first GM that takes it: the next is asked when one answered 422 (another GM may serve the user's
        queue). A job for GM `gm` is that GM's to refuse: its 422 is final (the next GM only stands in for it while
        it is away, and answers 503 meanwhile). A job with an id of the caller's is idempotent (a GM holding it
        answers 409): it is sent again after failures, and a 409 after a try that may have reached the GM is that
        try's job."""
        sub = submission(job)
        call = Call(
            "POST",
            "/v1/jobs",
            {} if gm is None else {"gm": gm},
            sub.model_dump_json(exclude_unset=True, exclude_none=True).encode(),
            idempotent=sub.job_id is not None,
            pass_on=422 if gm is None else None,
            sticky=gm is None,
        )
        answer = yield from exchange(call, self.urls, self.policy, self.rng)
        r = answer.response
        if r.status_code == 201:
            return JobAccepted.model_validate_json(r.content)
        if r.status_code == 409 and answer.maybe_sent and sub.job_id is not None:
            held = yield from self.read(Call("GET", job_path(sub.job_id)), JobStatus, urls=[answer.url])
            return JobAccepted(job_id=held.job_id, task_ids=[t.task_id for t in held.tasks], gm=held.gm)
        raise MeghaError.answered(answer.url, r)

    def status(self, job_id: str) -> Plan[JobStatus]:
        """From the first GM that holds the job (the caller's: another user's answers 404)."""
        found = yield from self.locate(job_id)
        return found[1]

    def locate(self, job_id: str) -> Generator[Step, Any, tuple[str, JobStatus]]:
        """The URL of the first GM that holds the job, and the job's status there."""
        answer = yield from exchange(Call("GET", job_path(job_id), pass_on=404), self.urls, self.policy, self.rng)
        if answer.response.status_code != 200:
            raise MeghaError.answered(answer.url, answer.response)
        return answer.url, JobStatus.model_validate_json(answer.response.content)

    def cancel(self, job_id: str) -> Plan[JobStatus]:
        """Queued tasks end at once, placed ones once their LM stopped them; 409 for a job that had ended."""
        return self.read(Call("DELETE", job_path(job_id), pass_on=404), JobStatus, ok=202)

    def list(
        self,
        user: str | None = None,
        queue: str | None = None,
        state: JobState | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> Plan[JobList]:
        filters = {"user": user, "queue": queue, "state": state, "offset": offset, "limit": limit}
        call = Call("GET", "/v1/jobs", {k: v for k, v in filters.items() if v is not None})
        return self.read(call, JobList, urls=self.urls[:1])

    def logs(
        self, job_id: str, task_id: str, stream: str = "stdout", attempt: int | None = None, tail: int | None = None
    ) -> Generator[Step, Any, str]:
        """What a task's run wrote (its latest attempt's unless `attempt`; the last `tail` bytes when given)."""
        params = {k: v for k, v in (("stream", stream), ("attempt", attempt), ("tail", tail)) if v is not None}
        call = Call("GET", job_path(job_id, "tasks", quote(task_id, safe=""), "logs"), params, pass_on=404)
        answer = yield from exchange(call, self.urls, self.policy, self.rng)
        if answer.response.status_code != 200:
            raise MeghaError.answered(answer.url, answer.response)
        return answer.response.text

    def queues(self) -> Plan[QueueList]:
        return self.read(Call("GET", "/v1/queues"), QueueList, urls=self.urls[:1])

    def state(self) -> Plan[GMState]:
        return self.read(Call("GET", "/v1/state"), GMState, urls=self.urls[:1])

    def health(self) -> Plan[Health]:
        return self.read(Call("GET", "/healthz"), Health, urls=self.urls[:1])

    def wait(self, job_id: str, timeout: float, poll: float = 1.0) -> Plan[JobStatus]:
        """The job's status once every task ended, asked every `poll` seconds at most (more often at first);
        TimeoutError after `timeout` seconds."""
        start = yield Clock()
        pause = 0.05
        while True:
            status = yield from self.status(job_id)
            if all(t.state in TASK_ENDS for t in status.tasks):
                return status
            now = yield Clock()
            if now - start >= timeout:
                raise TimeoutError(f"job {job_id} did not end within {timeout:g} s ({status.state})")
            yield Sleep(min(pause, start + timeout - now))
            pause = min(2 * pause, poll)

    def events(self, job_id: str) -> Generator[Step, Any, None]:
        """The job event stream (`Emit` steps), opened again after it was cut or ended early (the reader fell
        behind, the GM recovers its jobs) as the retry policy allows; each opening starts with the job's state."""
        failures = 0
        while True:
            call = Call("GET", job_path(job_id, "events"), pass_on=404, stream=True)
            answer = yield from exchange(call, self.urls, self.policy, self.rng)
            if answer.response.status_code != 200:
                raise MeghaError.answered(answer.url, answer.response)
            name, data = "message", []
            while True:
                line = yield NextLine()
                if line is None or isinstance(line, httpx.TransportError):
                    cut = MeghaError(answer.url, None, None, f"the event stream of job {job_id} was cut: {line}")
                    break
                if line:
                    field, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    if field == "event":
                        name = value
                    elif field == "data":
                        data.append(value)
                    continue  # a comment (keep-alive), or an event still being read
                if not data:
                    continue
                (text, data), (event, name) = ("\n".join(data), []), (name, "message")
                if event == "error":
                    body = ErrorBody.model_validate_json(text)
                    cut = MeghaError(answer.url, 200, body, body.error)
                    break
                if (model := EVENTS.get(event)) is not None:  # one this client does not know is passed over
                    yield Emit(model.model_validate_json(text))
                    failures = 0
                if event == "end":
                    return
            failures += 1
            if failures >= self.policy.attempts:
                raise cut
            yield Sleep(self.policy.delay(failures, self.rng))
