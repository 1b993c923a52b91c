"""The retry helper every service-to-service call goes through: a policy per call (attempts, backoff with jitter,
deadline, which answers are tried again)."""

from __future__ import annotations

import asyncio

import pytest

from megha.services.client import CallError, Reply
from megha.services.retry import RetryPolicy, busy, call

QUICK = {"first_pause": 0.001, "max_pause": 0.002}


def _scripted(*answers: Reply | CallError) -> tuple[list[int], object]:
    """A call answering each attempt with the next of `answers` (raising a CallError), and the attempts made."""
    made: list[int] = []

    async def send() -> Reply:
        made.append(len(made) + 1)
        answer = answers[len(made) - 1]
        if isinstance(answer, CallError):
            raise answer
        return answer

    return made, send


def test_pauses_back_off_exponentially_up_to_the_cap_with_jitter_below_each() -> None:
    policy = RetryPolicy(deadline=10.0, first_pause=0.1, max_pause=0.5, jitter=0.5)
    for attempt, full in ((1, 0.1), (2, 0.2), (3, 0.4), (4, 0.5), (40, 0.5)):
        pauses = [policy.pause(attempt) for _ in range(200)]
        assert all(full * 0.5 <= p <= full for p in pauses)
        assert max(pauses) - min(pauses) > full * 0.2  # spread: callers that failed together do not retry together
    assert RetryPolicy(deadline=1.0, first_pause=0.2, jitter=0.0).pause(1) == 0.2


def test_transport_failures_and_busy_answers_are_tried_again_until_a_success() -> None:
    made, send = _scripted(CallError("reset"), Reply(503, b"not ready"), Reply(429, b"slow down"), Reply(200, b"ok"))
    told: list[tuple[int, str]] = []
    outcome = asyncio.run(call(send, RetryPolicy(deadline=5.0, **QUICK), "LM 0", lambda a, f: told.append((a, f))))
    assert outcome.succeeded and outcome.reply == Reply(200, b"ok") and outcome.attempts == 4 and made == [1, 2, 3, 4]
    assert [a for a, _ in told] == [1, 2, 3]
    assert told[0][1] == "LM 0 unreachable: reset" and told[1][1] == "LM 0 answered 503: not ready"


def test_an_answer_the_policy_does_not_retry_ends_the_call_at_once() -> None:
    made, send = _scripted(Reply(422, b"never"), Reply(200, b""))
    outcome = asyncio.run(call(send, RetryPolicy(deadline=5.0, **QUICK), "agent"))
    assert not outcome.succeeded and outcome.failure == "agent answered 422: never" and made == [1]
    made, send = _scripted(Reply(409, b"fenced"), Reply(200, b""))
    policy = RetryPolicy(deadline=5.0, retry=lambda s: s != 422, **QUICK)  # a policy that retries a 409
    assert asyncio.run(call(send, policy, "agent")).succeeded and made == [1, 2]


def test_a_call_gives_up_after_its_attempts_or_its_deadline() -> None:
    made, send = _scripted(*[CallError("down")] * 5)
    outcome = asyncio.run(call(send, RetryPolicy(deadline=5.0, attempts=3, **QUICK), "agent"))
    assert (outcome.reply, outcome.attempts, made) == (None, 3, [1, 2, 3])
    assert outcome.failure == "agent unreachable: down"
    made, send = _scripted(Reply(503, b"a"), Reply(503, b"b"))
    outcome = asyncio.run(call(send, RetryPolicy(deadline=0.0, **QUICK), "LM 1"))
    assert outcome.attempts == 1 and outcome.failure == "LM 1 answered 503: a (for 0 s)"


def test_a_caller_can_give_up_between_attempts() -> None:
    made, send = _scripted(CallError("down"), Reply(200, b""))

    def stop(attempt: int, failure: str) -> None:
        raise RuntimeError(f"stopped after {failure}")

    with pytest.raises(RuntimeError, match="stopped after agent unreachable: down"):
        asyncio.run(call(send, RetryPolicy(deadline=5.0, **QUICK), "agent", stop))
    assert made == [1]


def test_busy_is_a_server_failure_or_a_request_to_slow_down() -> None:
    assert [s for s in (200, 404, 409, 422, 429, 500, 502, 503) if busy(s)] == [429, 500, 502, 503]
