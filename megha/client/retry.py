"""The client's one retry policy, sans-I/O: which answers and failures a request is sent again after, how long to
wait, and to which GM; and the one error every client call raises (`MeghaError`).

A request goes again only when sending it again cannot do anything twice: it never reached a GM (no connection
was made), or it is idempotent (GET, DELETE of a job, a submission with a job id of the caller's, which a GM
answers 409 once it holds it) and failed in transit or was answered 502, 503 or 504. A submission without a job
id that may have reached a GM is never sent again. Waits between attempts grow exponentially with full jitter.
"""

from __future__ import annotations

import random
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field

import httpx

from megha.common.models import ErrorBody

RETRY_STATUSES = frozenset({502, 503, 504})
"""Answers after which an idempotent request is sent again (to the next GM, when there are several)."""
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)
"""Failures of a request that never reached a server: sending it again is always safe."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a request is sent again."""

    attempts: int = 4  # tries of one request at most, the first included
    base: float = 0.1  # seconds: the longest wait after the first failed try; it doubles after each
    cap: float = 2.0  # seconds: the longest wait at all
    wait_when_throttled: bool = False  # a 429 (the user's unfinished tasks are at the GM's bound) waits Retry-After
    # seconds and asks again, for as long as the GM answers so, instead of being an error

    def delay(self, failures: int, rng: random.Random) -> float:
        """Seconds to wait after `failures` failed tries (full jitter)."""
        return rng.uniform(0, min(self.cap, self.base * 2 ** (failures - 1)))


DEFAULT_RETRY = RetryPolicy()
NO_RETRY = RetryPolicy(attempts=1)


class MeghaError(Exception):
    """A GM refused a request (`status`, and its `ErrorBody` as `body`: its `detail` names the field), or could not
    be reached (`status` None). `maybe_sent`: the request may have reached the GM (it was not sent elsewhere)."""

    def __init__(
        self, url: str, status: int | None, body: ErrorBody | None, reason: str, maybe_sent: bool = False
    ) -> None:
        what = f"answered {status}" if status is not None else "cannot be reached"
        super().__init__(f"{url} {what}: {reason}")
        self.url = url
        self.status = status
        self.body = body
        self.reason = reason
        self.maybe_sent = maybe_sent

    @classmethod
    def answered(cls, url: str, response: httpx.Response) -> MeghaError:
        """The error of an answer with an error status, its `ErrorBody` in one line."""
        try:
            body: ErrorBody | None = ErrorBody.model_validate_json(response.content)
        except ValueError:
            body = None
        if body is None:
            reason = " ".join(response.text.split())[:200] or response.reason_phrase
        else:
            extra = (f"{d.field}: {d.message}" for d in body.detail if d.message != body.error)
            reason = "; ".join([body.error, *extra])
        return cls(url, response.status_code, body, reason)

    @classmethod
    def unreachable(cls, url: str, exc: httpx.TransportError) -> MeghaError:
        return cls(url, None, None, str(exc) or type(exc).__name__, maybe_sent=not isinstance(exc, NOT_SENT))


@dataclass(frozen=True)
class Call:
    """One request, as the client means it: to every GM it knows, or to the first that does not answer
    `pass_on` (404 of a job lookup: another GM may hold the job; 422 of a submission: another GM may serve the
    user's queue)."""

    method: str
    path: str
    params: Mapping[str, object] = field(default_factory=dict)
    content: bytes | None = None  # a JSON body
    idempotent: bool = True  # may be sent again after it may have reached a GM
    pass_on: int | None = None
    sticky: bool = False  # once a try may have reached a GM, the next go to that GM only (a submission is known
    # as a repeat only by the GM that holds it)
    stream: bool = False  # the answer's body is read line by line (`NextLine`), not at once


@dataclass(frozen=True)
class Send:
    """Step: send `call` to the GM at `url`; the driver answers the `httpx.Response` or the `httpx.TransportError`."""

    url: str
    call: Call


@dataclass(frozen=True)
class Sleep:
    """Step: wait `seconds`; the driver answers None."""

    seconds: float


@dataclass(frozen=True)
class Throttled(Sleep):
    """Step: wait `seconds`, as the GM at `url` asked in its `times`-th 429 to this request (`reason`); the driver
    tells its `on_throttled` hook, then answers None."""

    url: str
    times: int
    reason: str


@dataclass(frozen=True)
class Clock:
    """Step: the driver answers `time.monotonic()`."""


@dataclass(frozen=True)
class NextLine:
    """Step: the next line of the streamed answer; the driver answers it, None at its end, or the
    `httpx.TransportError` that cut it."""


@dataclass(frozen=True)
class Emit:
    """Step: hand `value` to the caller (an event of a stream); the driver answers None."""

    value: object


Step = Send | Sleep | Throttled | Clock | NextLine | Emit


@dataclass(frozen=True)
class Answer:
    """What `exchange` ends with: the answer of the GM at `url`; `maybe_sent`: an earlier try may have reached a
    GM too (a 409 then may be that try's job)."""

    url: str
    response: httpx.Response
    maybe_sent: bool


def exchange(call: Call, urls: list[str], policy: RetryPolicy, rng: random.Random) -> Generator[Step, object, Answer]:
    """Send `call` until a GM gives an answer that is not to be retried, trying the next GM after each failed try
    and after a `pass_on` answer (a `sticky` call stays with the GM a try may have reached). Every GM answered
    `pass_on`: the first such answer. MeghaError when the tries run out, or when a request that is not idempotent
    may have reached a GM and no answer came."""
    passed: dict[str, httpx.Response] = {}  # GMs that answered `call.pass_on`
    failures = 0
    throttled = 0
    maybe_sent = False
    url = urls[0]
    turn = 0
    while True:
        left = [u for u in urls if u not in passed]
        if maybe_sent and call.sticky:
            left = [u for u in left if u == url]  # the GM the last try may have reached
        if not left:
            first = next(iter(passed.items()))
            return Answer(*first, maybe_sent)
        url = left[turn % len(left)]
        outcome = yield Send(url, call)
        if isinstance(outcome, httpx.TransportError):
            failed = MeghaError.unreachable(url, outcome)
            if failed.maybe_sent and not call.idempotent:
                raise failed
            maybe_sent |= failed.maybe_sent
        else:
            assert isinstance(outcome, httpx.Response)
            status = outcome.status_code
            if status == call.pass_on:
                passed[url] = outcome
                continue
            if status == 429 and policy.wait_when_throttled:
                throttled += 1
                reason = MeghaError.answered(url, outcome).reason
                yield Throttled(retry_after(outcome, policy.cap), url, throttled, reason)
                continue
            if status not in RETRY_STATUSES or not call.idempotent:
                return Answer(url, outcome, maybe_sent)
            failed = MeghaError.answered(url, outcome)
            maybe_sent |= status != 503  # a gateway's 502 or 504: the GM behind it may have acted
        failures += 1
        if failures >= policy.attempts:
            raise failed
        turn += 1
        yield Sleep(policy.delay(failures, rng))


def retry_after(response: httpx.Response, default: float) -> float:
    """The seconds a 429 asks a client to wait (its Retry-After, which a GM gives in seconds), else `default`."""
    value = response.headers.get("Retry-After", "")
    return float(value) if value.isdigit() else default
