"""megha.client's one retry policy and its reading of answers, against httpx.MockTransport: what is sent again (a GET,
a submission that never reached a GM or names its job), what never is (a submission without a job id after the
connection was reset on its answer), which GM a retry goes to, and the job event stream's parsing."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable

import httpx
import pytest

from megha.client import AsyncClient, Client, MeghaError, RetryPolicy
from megha.client.retry import Call, Send, Sleep, Throttled, exchange
from megha.common.models import JobEnd, JobStatus, TaskTransition

GM0, GM1 = "http://gm0.test", "http://gm1.test"
QUICK = RetryPolicy(attempts=4, base=0.0, cap=0.0)  # no waits in tests
JOB = {"user": "alice", "tasks": [{"duration": 1.0, "cpu_millicores": 100, "memory_mb": 64}]}
STATUS = {"job_id": "j", "user": "alice", "gm": 0, "state": "queued", "tasks": [{"task_id": "j.0", "state": "queued"}]}
ACCEPTED = {"job_id": "j", "task_ids": ["j.0"], "gm": 0}

Answers = list[httpx.Response | type[httpx.TransportError]]


def scripted(answers: Answers, seen: list[httpx.Request]) -> Callable[[httpx.Request], httpx.Response]:
    """A transport handler that answers (or fails) each request with the next of `answers`, noting each request."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0)
        if isinstance(answer, httpx.Response):
            return answer
        raise answer("scripted failure", request=request)

    return handle


def client(answers: Answers, seen: list[httpx.Request], gms: tuple[str, ...] = (GM0,)) -> Client:
    return Client(list(gms), token="t", retry=QUICK, transport=httpx.MockTransport(scripted(answers, seen)))


def test_a_submission_without_a_job_id_is_not_sent_again_after_a_reset_on_its_answer() -> None:
    seen: list[httpx.Request] = []
    with client([httpx.ReadError, httpx.Response(201, json=ACCEPTED)], seen) as gm, pytest.raises(MeghaError) as err:
        gm.submit(JOB)
    assert len(seen) == 1 and err.value.status is None and err.value.maybe_sent
    assert seen[0].headers["Authorization"] == "Bearer t"


def test_a_get_is_sent_again_after_a_reset_and_after_503() -> None:
    seen: list[httpx.Request] = []
    answers: Answers = [httpx.ReadError, httpx.Response(503, json={"error": "busy"}), httpx.Response(200, json=STATUS)]
    with client(answers, seen) as gm:
        assert gm.status("j") == JobStatus.model_validate(STATUS)
    assert [r.method for r in seen] == ["GET"] * 3


def test_a_submission_that_never_reached_a_gm_is_sent_again_to_the_next() -> None:
    seen: list[httpx.Request] = []
    with client([httpx.ConnectError, httpx.Response(201, json=ACCEPTED)], seen, (GM0, GM1)) as gm:
        assert gm.submit(JOB).job_id == "j"
    assert [str(r.url) for r in seen] == [f"{GM0}/v1/jobs", f"{GM1}/v1/jobs"]


def test_a_named_submission_is_sent_again_to_the_same_gm_and_its_409_is_the_earlier_try() -> None:
    seen: list[httpx.Request] = []
    answers: Answers = [
        httpx.ReadError,
        httpx.Response(409, json={"error": "job j already exists"}),
        httpx.Response(200, json=STATUS),
    ]
    with client(answers, seen, (GM0, GM1)) as gm:
        accepted = gm.submit({**JOB, "job_id": "j"})
    assert accepted.job_id == "j" and accepted.task_ids == ["j.0"]
    assert [(r.method, r.url.host) for r in seen] == [("POST", "gm0.test"), ("POST", "gm0.test"), ("GET", "gm0.test")]


@pytest.mark.parametrize(
    ("status", "error", "field", "message", "says"),
    [
        (503, "GM 0 is changing hands", "gm", "GM 0 is changing hands", "GM 0 is changing hands"),
        (422, "invalid job", "tasks.0.cpu_millicores", "too big", "invalid job; tasks.0.cpu_millicores: too big"),
    ],
)
def test_an_unnamed_submission_refused_is_not_sent_again_and_its_error_carries_the_body_and_names_the_field(
    status: int, error: str, field: str, message: str, says: str
) -> None:
    seen: list[httpx.Request] = []
    body = {"error": error, "detail": [{"field": field, "message": message}]}
    with client([httpx.Response(status, json=body)], seen) as gm, pytest.raises(MeghaError) as err:
        gm.submit(JOB)
    assert len(seen) == 1 and err.value.status == status
    assert err.value.body is not None and err.value.body.detail[0].field == field
    assert str(err.value) == f"{GM0} answered {status}: {says}"


def test_a_job_for_a_gm_that_it_refuses_is_refused_at_once_not_asked_of_its_stand_in() -> None:
    """The GM a job is for answers 422 (no node could run a task): that is the job's answer. Its stand-in, which
    answers 503 while that GM is up, is not asked (it was, until its 503s ran out the tries and hid the 422)."""
    seen: list[httpx.Request] = []
    body = {
        "error": "no node satisfies placement constraints [5, 18]",
        "detail": [{"field": "tasks.0", "message": "x"}],
    }
    answers: Answers = [httpx.Response(422, json=body)] + [httpx.Response(503, json={"error": "not standing in"})] * 8
    with client(answers, seen, (GM0, GM1)) as gm, pytest.raises(MeghaError) as err:
        gm.submit({**JOB, "job_id": "j"}, gm=0)
    assert err.value.status == 422 and "placement constraints" in str(err.value)
    assert [r.url.host for r in seen] == ["gm0.test"]


def test_a_job_is_looked_for_at_each_gm_until_one_holds_it() -> None:
    seen: list[httpx.Request] = []
    answers: Answers = [httpx.Response(404, json={"error": "no job j at GM 0"}), httpx.Response(200, json=STATUS)]
    with client(answers, seen, (GM0, GM1)) as gm:
        assert gm.status("j").job_id == "j"
    assert [r.url.host for r in seen] == ["gm0.test", "gm1.test"]


def test_the_tries_run_out_with_the_last_failure() -> None:
    seen: list[httpx.Request] = []
    with client([httpx.ConnectError] * 4, seen) as gm, pytest.raises(MeghaError) as err:
        gm.status("j")
    assert len(seen) == QUICK.attempts and err.value.status is None and not err.value.maybe_sent


def test_waits_grow_exponentially_with_jitter_up_to_the_cap() -> None:
    policy = RetryPolicy(attempts=8, base=0.1, cap=1.0)
    plan = exchange(Call("GET", "/v1/jobs"), [GM0], policy, random.Random(1))
    waits = []
    step = next(plan)
    for _ in range(policy.attempts - 1):
        assert isinstance(step, Send)
        step = plan.send(httpx.ConnectError("refused"))
        assert isinstance(step, Sleep)
        waits.append(step.seconds)
        step = next(plan)
    bounds = [min(1.0, 0.1 * 2**k) for k in range(len(waits))]
    assert all(0 <= w <= b for w, b in zip(waits, bounds)) and len(set(waits)) == len(waits)
    with pytest.raises(MeghaError):
        plan.send(httpx.ConnectError("refused"))


def test_the_async_client_does_not_resend_an_unnamed_submission_either() -> None:
    seen: list[httpx.Request] = []

    async def run() -> None:
        transport = httpx.MockTransport(scripted([httpx.RemoteProtocolError, httpx.Response(201, json=ACCEPTED)], seen))
        async with AsyncClient(GM0, token="t", retry=QUICK, transport=transport) as gm:
            with pytest.raises(MeghaError):
                await gm.submit(JOB)
            assert (await gm.submit(JOB)).job_id == "j"

    asyncio.run(run())
    assert len(seen) == 2


def sse(*events: tuple[str, object]) -> bytes:
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


def test_the_event_stream_yields_typed_events_and_opens_again_after_an_error_event() -> None:
    change = {"kind": "finished", "task_id": "j.0", "at": 2.0, "lm": 0, "node": 1}
    first = b": keep-alive\n\n" + sse(("state", STATUS), ("error", {"error": "fell behind"}))
    second = sse(("state", STATUS), ("task", change), ("end", {"job_id": "j", "state": "finished", "at": 2.0}))
    seen: list[httpx.Request] = []
    answers: Answers = [httpx.Response(200, content=first), httpx.Response(200, content=second)]
    with client(answers, seen) as gm:
        events = list(gm.events("j"))
    assert [type(e) for e in events] == [JobStatus, JobStatus, TaskTransition, JobEnd]
    assert events[2] == TaskTransition.model_validate(change) and events[3].state == "finished"
    assert [r.url.path for r in seen] == ["/v1/jobs/j/events"] * 2


def test_a_429_is_waited_out_when_the_policy_says_so_and_an_error_otherwise() -> None:
    seen: list[httpx.Request] = []
    told: list[Throttled] = []
    held = httpx.Response(429, json={"error": "alice holds 100 unfinished tasks"}, headers={"Retry-After": "0"})
    transport = httpx.MockTransport(scripted([held, held, httpx.Response(201, json=ACCEPTED)], seen))
    patient = RetryPolicy(attempts=1, wait_when_throttled=True)
    with Client(GM0, retry=patient, transport=transport, on_throttled=told.append) as gm:
        assert gm.submit(JOB).job_id == "j"  # an unnamed submission too: a 429 is a refusal, nothing was done
    assert len(seen) == 3 and [t.times for t in told] == [1, 2] and told[0].reason == "alice holds 100 unfinished tasks"
    with client([held], seen) as gm, pytest.raises(MeghaError) as err:
        gm.submit(JOB)
    assert err.value.status == 429


def test_a_named_submission_a_gateway_answered_504_stays_with_that_gm() -> None:
    seen: list[httpx.Request] = []
    answers: Answers = [
        httpx.Response(504, text="gateway timeout"),
        httpx.Response(409, json={"error": "job j already exists"}),
        httpx.Response(200, json=STATUS),
    ]
    with client(answers, seen, (GM0, GM1)) as gm:
        assert gm.submit({**JOB, "job_id": "j"}).task_ids == ["j.0"]
    assert [r.url.host for r in seen] == ["gm0.test"] * 3
