"""The retry policy of each call between services: how many attempts, the pause between them (exponential backoff
with jitter), the deadline, and which answers are worth another try; `call` makes a call under one.

Every service-to-service call that is retried goes through `call`, each with a policy named where it is made (a
GM's launch batches, an LM's launches on an agent, an agent's registration, ...). A policy says nothing about
sending a request twice at the transport level: only a call its caller marks idempotent is ever repeated after
its request may have reached the service (`ServiceClient.post(..., idempotent=True)`), and only such calls, or
calls whose service refuses a repeat, should be given a policy of more than one attempt.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from megha.services.client import CallError, NotSent, Reply


def busy(status: int) -> bool:
    """A status worth another try: the service failed or is not ready (5xx), or asked for time (429)."""
    return status >= 500 or status == 429


def success(status: int) -> bool:
    return 200 <= status < 300


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a call is retried. A call ends at its first success, at an answer `retry` does not accept, after
    `attempts` attempts, or once `deadline` seconds passed since it began (no attempt starts after that)."""

    deadline: float  # seconds from the first attempt
    attempts: int | None = None  # at most this many attempts (None: as many as the deadline allows)
    first_pause: float = 0.1  # seconds before the second attempt; each later pause doubles, up to `max_pause`
    max_pause: float = 2.0
    jitter: float = 0.5  # a pause is drawn uniformly from [(1 - jitter) x, x]: callers that failed together spread
    # Seconds after which a call none of whose attempts left this process (every connection refused or not made:
    # `NotSent`) is given up, when sooner than `deadline` (None: `deadline` only).
    unsent_deadline: float | None = None
    retry: Callable[[int], bool] = busy  # which statuses other than a success are tried again
    ok: Callable[[int], bool] = success  # which statuses are a success

    def pause(self, attempt: int) -> float:
        """Seconds to wait after failed attempt `attempt` (1, 2, ...)."""
        full = min(self.first_pause * 2 ** min(attempt - 1, 30), self.max_pause)
        return full * (1.0 - self.jitter * random.random())


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a call under a policy ended: its last answer (None when none came), why it failed ("" when `reply` is a
    success), and how many attempts it took."""

    reply: Reply | None
    failure: str
    attempts: int
    reached: bool = True  # whether some attempt may have reached the service (False: every one was `NotSent`)

    @property
    def succeeded(self) -> bool:
        return not self.failure


async def call(
    send: Callable[[], Awaitable[Reply]],
    policy: RetryPolicy,
    what: str,
    on_failure: Callable[[int, str], None] | None = None,
    where: str = "",
) -> Outcome:
    """Make the call `send`, trying again under `policy` after a transport failure (CallError) or an answer
    `policy.retry` accepts. A failure reads "<what> unreachable at <where>: ..." or "<what> answered <status>: ..."
    (`what`: who is called, say "LM 0"; `where`: its URL, if it says more). `on_failure(attempt, failure)` is told
    of each failed attempt that will be tried again, before the pause (to log it, or to raise and give up)."""
    at = f" at {where}" if where else ""
    started = time.monotonic()
    deadline = started + policy.deadline
    attempt = 0
    reached = False
    while True:
        attempt += 1
        reply: Reply | None = None
        try:
            reply = await send()
        except CallError as exc:
            reached = reached or not isinstance(exc, NotSent)
            failure = f"{what} unreachable{at}: {exc}"
        else:
            reached = True
            if policy.ok(reply.status):
                return Outcome(reply, "", attempt)
            failure = f"{what} answered {reply.status}: {reply.text[:500]}"
            if not policy.retry(reply.status):
                return Outcome(reply, failure, attempt)
        if policy.attempts is not None and attempt >= policy.attempts:
            return Outcome(reply, failure, attempt, reached)
        now = time.monotonic()
        if now > deadline:
            return Outcome(reply, f"{failure} (for {policy.deadline:g} s)", attempt, reached)
        if not reached and policy.unsent_deadline is not None and now - started > policy.unsent_deadline:
            return Outcome(reply, f"{failure} (not sent for {policy.unsent_deadline:g} s)", attempt, False)
        if on_failure is not None:
            on_failure(attempt, failure)
        await asyncio.sleep(policy.pause(attempt))
