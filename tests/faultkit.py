"""What the fault tests share: a replay through a local deployment with a fault injected beside it, and the
check that nothing was lost or counted twice."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from megha.common.settings import LoadgenSettings
from megha.deploy.local import LocalDeployment
from megha.loadgen.progress import Progress
from megha.loadgen.services import ServicesRun, replay_services

from servicekit import api, small_deployment, wait_until

TRACE = LoadgenSettings(trace="demo", first_jobs=20, time_scale=0.0002, mode="scaled", mem_scale=1000, timeout=240)


# Slot mode on 8 simulated nodes: 78 tasks of about 0.65 s arrive within 0.43 s, so GMs hold a queue for seconds.
BACKLOG = LoadgenSettings(trace="demo", first_jobs=10, time_scale=0.00001, mode="slot", timeout=240)


def backlog_deployment(log_dir: Path, **settings: object) -> LocalDeployment:
    """2 GMs x 2 LMs x 2 agents of 2 simulated nodes each: the size BACKLOG keeps queued."""
    return small_deployment(
        log_dir, gms=2, lms=2, workers_per_lm=2, nodes_per_worker=2, heartbeat_interval=0.5, **settings
    )


def replay_with_fault(
    deployment: LocalDeployment,
    fault: Callable[[], None],
    trace: LoadgenSettings = TRACE,
    gone: frozenset[int] = frozenset(),
) -> tuple[ServicesRun, list[dict[str, Any]]]:
    """Replay `trace` through the running `deployment` while `fault` runs beside it, then wait until every LM is
    idle but those in `gone` (which the fault left down): the run, and those LMs' states then."""
    api.use(deployment)
    settings = deployment.loadgen(trace)
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            fault()
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    thread = threading.Thread(target=guarded)
    thread.start()
    run = asyncio.run(replay_services(settings, Progress()))
    thread.join()
    assert not errors, errors

    def states() -> list[dict[str, Any]]:
        return [service_state(url) for lm, url in enumerate(deployment.lm_urls) if lm not in gone]

    wait_until(lambda: all(s.get("idle") for s in states()), 30, states)
    return run, states()


def assert_nothing_lost(run: ServicesRun, tasks: int = 434) -> None:
    m = run.metrics
    assert m is not None
    assert run.timed_out == [] and m.not_exactly_once == (), (run.timed_out, m.not_exactly_once)
    failed = {tid: r.failed_reason for tid, r in run.tasks.items() if r.failed_reason}
    assert not failed and m.tasks_completed == m.tasks == tasks, failed
    for tid, events in run.events.items():
        assert [e.kind for e in events].count("finished") == 1, (tid, events)


def service_state(url: str) -> dict[str, object]:
    """A GM's or an LM's GET /v1/state, or why it did not answer."""
    try:
        return api.get(f"{url}/v1/state", timeout=2.0).json()
    except httpx.HTTPError as exc:
        return {"unreachable": str(exc)}
