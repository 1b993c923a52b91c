"""A GM that stays down is stood in for by the next GM of the ring, through separate OS processes and a real
RabbitMQ: the stand-in serves the GM's queue from its journal copy, and the GM takes its identity back when it
returns; a GM stalled past the takeover time is fenced at the LMs and rejoins. Nothing lost or counted twice."""

from __future__ import annotations

import time

import httpx

from faultkit import BACKLOG, assert_nothing_lost, backlog_deployment, replay_with_fault, service_state
from servicekit import api, needs_rabbitmq, wait_until

pytestmark = needs_rabbitmq

TAKEOVER_AFTER = 3.0
SHORT = BACKLOG.model_copy(update={"timeout": 60.0})


def _health(url: str) -> dict[str, object]:
    try:
        return api.get(f"{url}/healthz", timeout=2.0).json()
    except httpx.HTTPError as exc:
        return {"unreachable": str(exc)}


def _backlog(url: str) -> int:
    state = service_state(url)
    return int(state.get("queued", 0)) + int(state.get("waiting", 0))  # type: ignore[call-overload]


def test_a_gm_that_stays_down_is_stood_in_for_and_takes_its_identity_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    deployment = backlog_deployment(tmp_path / "logs", takeover_after=TAKEOVER_AFTER)
    seen: dict[str, object] = {}

    def kill_gm_with_a_queue() -> None:
        url = deployment.gm_urls[1]
        wait_until(lambda: _backlog(url) > 0, 60, lambda: service_state(url))
        seen["before"] = service_state(url)
        deployment.kill("gm-1")  # and it stays down: the replay can only end if GM 0 serves its queue
        stand_in = deployment.gm_urls[0]
        wait_until(lambda: _health(stand_in).get("standing_in_for") == [1], 30, lambda: _health(stand_in))

    with deployment:
        run, states = replay_with_fault(deployment, kill_gm_with_a_queue, BACKLOG)
        # GM 1 returns: it takes its identity and what its stand-in did back, and GM 0 stops standing in.
        deployment.restart("gm-1")
        wait_until(
            lambda: _health(deployment.gm_urls[1]).get("ready") is True, 60, lambda: _health(deployment.gm_urls[1])
        )
        after = [_health(url) for url in deployment.gm_urls]
        jobs = [j for j in run.jobs.values() if j.gm == 1]
        statuses = [api.get(f"{deployment.gm_urls[1]}/v1/jobs/{j.job_id}", timeout=5.0) for j in jobs]
    assert_nothing_lost(run, 78)
    before = seen["before"]
    assert isinstance(before, dict) and before["queued"] + before["waiting"] > 0  # tasks waited at the kill
    for state in states:
        assert state["idle"] and state["free"] == state["capacity"]
    assert after[0]["standing_in_for"] == [] and after[1]["standing_in_for"] == []
    assert after[1]["term"] > 1  # GM 1 claimed its identity back above its stand-in's term
    # The returned GM knows each of its jobs, every task finished once (those its stand-in ran too).
    assert jobs and all(r.status_code == 200 for r in statuses)
    assert all(t["state"] == "finished" for r in statuses for t in r.json()["tasks"])


def test_a_gm_stalled_past_the_takeover_time_is_fenced_and_rejoins(tmp_path) -> None:  # type: ignore[no-untyped-def]
    deployment = backlog_deployment(tmp_path / "logs", takeover_after=TAKEOVER_AFTER)
    seen: dict[str, object] = {}

    def stall_gm_with_a_queue() -> None:
        url, stand_in = deployment.gm_urls[1], deployment.gm_urls[0]
        wait_until(lambda: _backlog(url) > 0, 60, lambda: service_state(url))
        seen["term"] = _health(url)["term"]
        deployment.pause("gm-1")  # it holds its connections and its stale queue
        try:
            wait_until(lambda: _health(stand_in).get("standing_in_for") == [1], 30, lambda: _health(stand_in))
            time.sleep(1.0)  # the stall goes on while the stand-in serves GM 1's queue (the fault, not a wait)
        finally:
            deployment.resume("gm-1")
        # Refused by its stand-in (or fenced at an LM), GM 1 takes its identity back with a newer term.
        wait_until(
            lambda: _health(stand_in).get("standing_in_for") == [] and _health(url).get("ready") is True,
            30,
            lambda: (_health(stand_in), _health(url)),
        )

    with deployment:
        run, states = replay_with_fault(deployment, stall_gm_with_a_queue, SHORT)
        term = _health(deployment.gm_urls[1])["term"]
    assert_nothing_lost(run, 78)
    assert term >= seen["term"] + 2  # type: ignore[operator]  # the stand-in's claim, then GM 1's own
    for state in states:
        assert state["idle"] and state["free"] == state["capacity"]
