"""The chaos matrix in CI: one trial of every fault of the process backend (`megha chaos`) but those
LEFT_TO_MEGHA_CHAOS names, each through real processes and a RabbitMQ node of its own. Target in every trial: nothing
lost, nothing counted twice, no gang run in part, every node usable again within 2 x (worker timeout + delta
interval) of the fault clearing. The container backend's trials are in test_chaos_containers.py."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from megha.common.core.messages import GangCommit, GangPrepare
from megha.common.models import TaskEvent
from megha.deploy import chaos
from megha.deploy.chaos import (
    PROCESS_FAULTS,
    ChaosConfig,
    _keep_suspects,
    _keep_views,
    _partial_gang_runs,
    _tally,
    main,
    run_trial,
)
from megha.deploy.deployment import Deployment, as_ctrl_c
from megha.loadgen.records import JobRecord, TaskColumns, TaskRecord
from megha.loadgen.services import ServicesRun, submission
from megha.loadgen.trace import resolve_trace
from megha.loadgen.workload import WorkloadConfig, build_workload, mark_gangs
from megha.services.client import CallError, Reply
from megha.services.gm.dispatch import GMDispatch
from megha.services.retry import RetryPolicy

from servicekit import needs_rabbitmq


def test_a_fault_of_another_backend_is_refused_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--backend", "containers", "--faults", "gm-stall"]) == 2
    assert "unknown faults ['gm-stall'] for the containers backend" in capsys.readouterr().err


def test_the_events_of_tasks_not_finished_exactly_once_are_kept_for_tracing(tmp_path: Path) -> None:
    tasks = [TaskRecord(t, "j", 0, "u", 1.0, (1, 1), completions=n) for t, n in (("j.0", 1), ("j.1", 2), ("j.2", 0))]
    run = ServicesRun(TaskColumns.of(tasks), {"j": JobRecord("j", 0, 0.0, 3, 1.0)}, {})
    run.events["j.1"] = [
        TaskEvent(kind="finished", task_id="j.1", job_id="j", lm=0, node=1, at=10.0, attempt=a) for a in (1, 2)
    ]
    _keep_suspects(run, tmp_path / "suspects.json")
    kept = json.loads((tmp_path / "suspects.json").read_text())
    assert sorted(kept) == ["j.1", "j.2"]
    assert [e["attempt"] for e in kept["j.1"]["events"]] == [1, 2] and kept["j.2"]["events"] == []

    run.tasks = TaskColumns.of(tasks[:1])
    _keep_suspects(run, tmp_path / "none" / "suspects.json")
    assert not (tmp_path / "none").exists()


def _gang_run(runs: list[tuple[str, str, int]]) -> ServicesRun:
    """A replay of gang job g (tasks g.0-g.2) whose tasks had these events (kind, task, attempt), in order."""
    tasks = [TaskRecord(f"g.{i}", "g", 0, "u", 1.0, (1, 1)) for i in range(3)]
    run = ServicesRun(TaskColumns.of(tasks), {"g": JobRecord("g", 0, 0.0, 3, 1.0)}, {}, gangs={"g"})
    for n, (kind, task, attempt) in enumerate(runs):
        event = TaskEvent(kind=kind, task_id=task, job_id="g", lm=0, node=0, at=float(n), attempt=attempt)  # type: ignore[arg-type]
        run.events.setdefault(task, []).append(event)  # type: ignore[attr-defined]
        if kind == "finished":
            run.tasks[task].completions += 1
    return run


def _started_and_finished(task: str, attempt: int) -> list[tuple[str, str, int]]:
    return [("started", task, attempt), ("finished", task, attempt)]


def test_a_gang_whose_every_member_started_in_the_attempt_it_finished_in_ran_whole() -> None:
    whole = [e for i in range(3) for e in _started_and_finished(f"g.{i}", 1)]
    assert _partial_gang_runs(_gang_run(whole), ["g"]) == []
    # g.0 finished in run 1 while g.2 was lost: g.1 and g.2 ran again together as attempt 2. Whole.
    rerun = [*_started_and_finished("g.0", 1), ("started", "g.1", 1), ("started", "g.2", 1), ("lost", "g.2", 1)]
    rerun += [("preempted", "g.1", 1), *_started_and_finished("g.1", 2), *_started_and_finished("g.2", 2)]
    assert _partial_gang_runs(_gang_run(rerun), ["g"]) == []
    # A part launched in a crash and stopped before its end (never finished in that attempt): allowed.
    stopped = [("started", "g.0", 1), ("preempted", "g.0", 1)]
    stopped += [e for i in range(3) for e in _started_and_finished(f"g.{i}", 2)]
    assert _partial_gang_runs(_gang_run(stopped), ["g"]) == []


def test_a_gang_part_that_ran_to_its_end_without_its_peers_is_a_partial_run_and_fails_the_trial() -> None:
    # Attempt 1: only g.0 and g.1 started (g.2's LM refused its commit) and g.0 finished before the stop.
    partial = [*_started_and_finished("g.0", 1), ("started", "g.1", 1), ("preempted", "g.1", 1)]
    partial += [*_started_and_finished("g.1", 2), *_started_and_finished("g.2", 2)]
    run = _gang_run(partial)
    assert _partial_gang_runs(run, ["g"]) == [("g", 1)]
    trial = _tally("gang-lm-kill", 1, run, 0.0)
    assert (trial.gangs, trial.partial_gangs, trial.finished_once, trial.lost) == (1, 1, 3, 0)
    # No gang: the same events are three independent tasks.
    run.gangs = set()
    assert _tally("lm-kill", 1, run, 0.0).partial_gangs == 0


def test_the_gang_faults_load_marks_gangs_that_span_both_lms_of_the_chaos_deployment() -> None:
    """MEGHA_GANGS's jobs are submitted with "gang": true; each of the gang trace's jobs needs more nodes than one
    LM of the chaos deployment has (slot mode: a task holds a node), and fewer than the whole."""
    config = ChaosConfig()
    fault = PROCESS_FAULTS["gang-lm-kill"]
    assert fault.trace is not None and fault.gangs > 0
    workload = build_workload(resolve_trace(fault.trace, None, config.time_scale), WorkloadConfig("slot", 0, 2))
    gangs = [job for _, job in mark_gangs(workload, fault.gangs, 0) if job.gang is not None]
    per_lm = config.workers_per_lm * config.nodes_per_worker
    assert sum(len(job.tasks) for _, job in workload) == 450 and len(gangs) >= 20
    assert all(per_lm < len(job.tasks) <= per_lm * config.lms for job in gangs)
    assert submission(gangs[0])["gang"] is True and "gang_timeout" not in submission(gangs[0])
    assert "gang" not in submission(workload[0][1] if workload[0][1].gang is None else workload[1][1])


class _UnreachableLMs:
    """What `GMDispatch` needs of its GM service, with every LM unreachable (connection refused)."""

    def __init__(self) -> None:
        self.settings = SimpleNamespace(
            lm_timeout=30.0, lm_lost_after=0, gm_id=0, lm_urls=["http://lm-0", "http://lm-1"]
        )
        self.term = 1
        self.serving = True
        self.calls = SimpleNamespace(post=self._post, get=self._get)
        self.posts: list[str] = []
        self.failed: list[tuple[int, int]] = []  # (LM, seq) of the calls the core was told failed for good

    async def _post(self, url: str, body: bytes, idempotent: bool = False) -> Reply:
        self.posts.append(url.split("?")[0])
        raise CallError("ConnectionRefusedError(111, 'Connection refused')")

    async def _get(self, url: str) -> Reply:
        raise CallError("ConnectionRefusedError(111, 'Connection refused')")  # the LM watch's health checks

    async def apply(self, step: Callable[[Any], None]) -> None:
        core = SimpleNamespace(
            call_failed=lambda lm, seq, why, now: self.failed.append((lm, seq)), lm_unreachable=lambda lm: None
        )
        step(core)


def test_a_gang_commit_to_an_unreachable_lm_fails_at_once_so_the_launched_parts_are_stopped_before_they_end() -> None:
    """The finding of gang-lm-kill: an LM killed after every LM prepared a gang, before its commit. The GM used to
    try the commit again for MEGHA_LM_TIMEOUT seconds, while the other LM's part, committed and launched, ran alone to
    its end (a gang run in part, finished). A commit is now tried once: its failure reaches the core at once
    (`call_failed`), which stops the launched parts, and the gang runs again whole. A prepare is still retried (it
    launches nothing)."""
    gm = _UnreachableLMs()
    dispatch = GMDispatch(gm)  # type: ignore[arg-type]
    began = time.monotonic()
    asyncio.run(dispatch._gang(GangCommit(0, 1, 7, "g")))
    assert gm.posts == ["http://lm-1/v1/gangs/commit"] and gm.failed == [(1, 7)]
    assert time.monotonic() - began < 5  # not MEGHA_LM_TIMEOUT

    gm.posts.clear()
    dispatch.lm_calls = RetryPolicy(deadline=30.0, attempts=3, first_pause=0.01)
    asyncio.run(dispatch._gang(GangPrepare(0, 0, 8, "g", [], 10.0)))
    assert gm.posts == ["http://lm-0/v1/gangs/prepare"] * 3 and gm.failed[-1] == (0, 8)


@dataclass
class _Views:
    """A target for `_keep_views`: one GM and two LMs, the second unreachable."""

    gm_urls: list[str]
    lm_urls: list[str]
    headers: dict[str, str] = field(default_factory=lambda: {"Authorization": "Bearer op"})


def test_what_the_services_hold_of_a_trial_s_suspect_jobs_is_kept_before_teardown(tmp_path: Path) -> None:
    asked: list[tuple[str, str | None]] = []

    class Service(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append((self.path, self.headers.get("Authorization")))
            known = {"/v1/state": {"queued": 2}, "/v1/jobs/j": {"job_id": "j", "state": "running"}}
            known["/v1/gms/0/state"] = {"running": [{"task": {"task_id": "j.2"}}]}
            body = json.dumps(known.get(self.path, {"error": "no such thing"})).encode()
            self.send_response(200 if self.path in known else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    tasks = [TaskRecord(t, t[0], 0, "u", 1.0, (1, 1), completions=n) for t, n in (("j.1", 1), ("j.2", 0), ("k.0", 1))]
    run = ServicesRun(TaskColumns.of(tasks), {"j": JobRecord("j", 0, 0.0, 2, 1.0), "k": JobRecord("k", 0, 0.0, 1, 1.0)})
    try:
        _keep_views(_Views([url], [url, "http://127.0.0.1:9"]), run, tmp_path / "views.json")
    finally:
        server.shutdown()
    views = json.loads((tmp_path / "views.json").read_text())
    gm = views["gms"][url]
    assert gm["state"] == {"status": 200, "body": {"queued": 2}}
    assert gm["jobs"] == {"j": {"status": 200, "body": {"job_id": "j", "state": "running"}}}  # k ended once
    lm = views["lms"][url]
    assert lm["gm 0"]["body"]["running"][0]["task"]["task_id"] == "j.2" and lm["state"]["status"] == 200
    assert "error" in views["lms"]["http://127.0.0.1:9"]["state"]  # an LM that cannot be reached is said so
    assert {auth for _, auth in asked} == {"Bearer op"}

    run.tasks.set("j.2", completions=1)
    _keep_views(_Views([url], [url]), run, tmp_path / "none" / "views.json")  # nothing suspect: nothing asked
    assert not (tmp_path / "none").exists()


def test_a_fault_that_fails_to_clear_ends_the_replay_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that does not come back fails the trial with the reason, not after the replay's own timeout."""
    cancelled: list[bool] = []

    async def replay_forever(settings: object) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    monkeypatch.setattr(chaos, "replay_services", replay_forever)
    errors: list[BaseException] = []
    threading.Timer(0.5, lambda: errors.append(TimeoutError("RabbitMQ node did not start"))).start()
    began = time.monotonic()
    assert asyncio.run(chaos._replay_unless_failed(None, errors)) is None  # type: ignore[arg-type]
    assert time.monotonic() - began < 10 and cancelled == [True]


LEFT_TO_MEGHA_CHAOS = {
    "gm-down": "tests/test_gm_takeover.py kills a GM and keeps it down until its next GM stands in",
    "broker-5": "tests/test_services_recovery.py kills the broker mid-replay and starts it again",
    "broker-60": "tests/test_services_recovery.py kills the broker mid-replay and starts it again",
    "gm-stall": "tests/test_gm_takeover.py stalls a GM (SIGSTOP) mid-replay, past the stand-in's takeover",
    "lm-stall": "lm-partition (here) leaves an LM's calls and broker connections unanswered for 30 s, as a stopped "
    "LM's are",
    "gang-gm-kill": "tests/test_core_gang.py crashes a GM at each step of a gang's prepares and commits, and "
    "tests/test_gang_services.py runs gangs across the LMs of a real deployment",
    "lm-kill": "gang-lm-kill (here) kills an LM mid-replay and restarts it, with gangs among its tasks; "
    "tests/test_services_recovery.py does it without gangs",
    "agent-kill": "tests/test_services_e2e.py kills a worker agent mid-replay: its tasks run again elsewhere and its "
    "node comes back",
}
"""Faults left out to keep the default run under 20 minutes (the long outages, faults another test makes the same
way, and one of the two gang faults: a trial takes 25-40 s): `megha chaos` runs them (every matrix in
docs/reliability.md has them), and CI covers each path with the test named here."""

CI_FAULTS = [name for name in PROCESS_FAULTS if name not in LEFT_TO_MEGHA_CHAOS]


@pytest.mark.parametrize("name", CI_FAULTS)
def test_one_trial_of_each_fault_loses_nothing_and_recovers_in_time(name: str, tmp_path: Path) -> None:
    config = ChaosConfig(out=tmp_path)
    trial = run_trial(config, name, 1, print)
    assert trial.accepted == 450
    assert (trial.lost, trial.duplicated, trial.failed_with_reason, trial.partial_gangs) == (0, 0, 0, 0), trial
    assert trial.gangs > 0 if PROCESS_FAULTS[name].gangs else trial.gangs == 0
    assert trial.finished_once == trial.accepted
    assert trial.recovery_seconds <= config.recovery_target, trial


def test_a_container_deployment_publishes_each_service_on_a_port_of_its_own_and_names_no_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Free ports are drawn at random and bound only when Docker starts a container: two services of one plan must
    not draw the same one. A failed docker command's message shows no secret variable's value."""
    from megha.deploy import containers

    drawn = iter([61_001, 61_001, 61_002, 61_002, 61_001, 61_003, 61_004, 61_005, 61_006, 61_007, 61_008])
    monkeypatch.setattr(containers, "free_port", lambda low, high: next(drawn))
    deployment = containers.ContainerDeployment()
    deployment._plan("10.99.1")
    published = [c.host_port for c in deployment.containers.values() if c.host_port is not None]
    assert len(published) == len(set(published)) == 1 + deployment.lms + deployment.gms, published
    lm = deployment.containers["lm-0"]
    shown = containers._shown(("run", *lm.run))
    assert "--env=MEGHA_CREDENTIAL=***" in shown and "megha-credential1" not in shown
    assert deployment.broker_password not in shown and "--env=MEGHA_LM_ID=0" in shown


def _descendants(pid: int) -> set[int]:
    """The processes below `pid` now (children, their children, ...)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@needs_rabbitmq
def test_interrupting_megha_chaos_mid_trial_stops_every_service_in_one_line(tmp_path: Path) -> None:
    """SIGTERM, which the deployment handles as Ctrl-C (one path for both; a trial takes half a minute, so only one
    is run)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "megha.cli", "chaos", "--faults", "gm-kill", "--trials", "1", "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        seen.append(line)
        if "injecting" in line:
            break
        assert time.monotonic() < deadline, "the trial did not start: " + "".join(seen)
    services = _descendants(proc.pid)
    assert len(services) >= 4, services  # the broker node, GMs, LMs and agents
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    rest = proc.stdout.read()
    assert "Traceback" not in rest, rest
    assert rest.strip().splitlines()[-1].startswith("interrupted: every service was stopped; 0 finished trials"), rest
    assert [pid for pid in services if _alive(pid)] == []


@dataclass
class _NothingDeployed(Deployment):
    def bring_up(self) -> None:
        pass

    def tear_down(self) -> None:
        pass


def test_sigterm_inside_a_deployment_cancels_the_event_loop_as_ctrl_c_does(caplog: pytest.LogCaptureFixture) -> None:
    """The signal arrives while a task other than the main one runs (here blocked in a call that does not yield):
    every task is cancelled through its `finally`, `asyncio.run` raises KeyboardInterrupt, and no task ends with an
    error the loop reports (it did when the handler raised KeyboardInterrupt in the running task's frame)."""
    unwound: list[str] = []

    async def busy() -> None:
        try:
            time.sleep(1.0)  # the signal comes during this call
            await asyncio.sleep(30)
        finally:
            unwound.append("busy")

    async def main() -> None:
        task = asyncio.create_task(busy())
        try:
            await asyncio.sleep(30)
        finally:
            unwound.append("main")
            assert not task.done()  # left to asyncio.run, which cancels it on its way out

    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGTERM))
    with caplog.at_level(logging.DEBUG, logger="asyncio"), pytest.raises(KeyboardInterrupt), _NothingDeployed():
        timer.start()
        asyncio.run(main())
    timer.join()
    gc.collect()  # a task that ended with an exception nobody retrieved is reported when it is collected
    assert sorted(unwound) == ["busy", "main"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert signal.getsignal(signal.SIGTERM) is not as_ctrl_c  # the handler before is put back
