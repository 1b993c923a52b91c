"""An LM takes a worker agent's heartbeat or report only when that agent signed it, and of a report only what is
about the agent's own nodes (docs/security.md, "Broker reports"): a forged, unsigned or misdirected one is
ignored and logged, never requeued. First the LM service in this process, fed broker messages directly; then real
deployments (separate processes, the real RabbitMQ, a broker user per role) where a forged completion is
published to the LM's queue with the worker agents' broker credentials while the real run goes on."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_broker_users import users  # noqa: F401 (a fixture: a broker user per role)

from megha.common.core.messages import LaunchBatch, Placement
from megha.common.core.task import TaskSpec
from megha.common.models import BrokerMessage, TaskEvents, WorkerHeartbeat, WorkerNode, WorkerRegistration
from megha.common.settings import LMSettings
from megha.common.transport.rabbit import (
    IGNORED_LOG_EVERY,
    REPORT_SENDER,
    REPORT_SIGNATURE,
    Broker,
    lm_key,
    loadgen_queue,
    report_headers,
    report_key,
)
from megha.deploy.local import LocalDeployment
from megha.services.lm.service import LMService

from servicekit import AMQP, needs_rabbitmq, task_visible_folder, wait_for, wait_until

SECRET = "report-binding-test-secret-0123456789"
NODE = WorkerNode(capacity={"cpu_millicores": 2000, "memory_mb": 4096})


class RecordingBroker:
    """Stands in for RabbitMQ where the LM publishes completions and task events."""

    def __init__(self) -> None:
        self.published: list[tuple[str, str, dict[str, Any]]] = []

    async def publish(self, exchange: str, routing_key: str, body: bytes, headers: object = None) -> None:
        self.published.append((exchange, routing_key, json.loads(body)))

    publish_confirmed = publish  # as the broker's: here every message is confirmed at once

    async def backlog(self, exchange: str, routing_key: str) -> int:
        return 0  # nothing waits in the LM's queue


def report(task_id: str, node: int, lm: int = 0) -> bytes:
    return json.dumps({"worker_report": {"lm": lm, "finished": [{"task_id": task_id, "node": node}]}}).encode()


def heartbeat(worker_id: str, running: int = 1) -> bytes:
    beat = WorkerHeartbeat(worker_id=worker_id, lm=0, at=time.time(), running=running)
    return BrokerMessage(heartbeat=beat).model_dump_json().encode()


async def settle() -> None:
    """Let the tasks the LM spawns (its publishes) run: before checking that none published anything."""
    for _ in range(5):
        await asyncio.sleep(0)


@asynccontextmanager
async def lm_running_one_task_per_agent(auth: str = "on") -> AsyncIterator[tuple[LMService, RecordingBroker]]:
    """An LM (MEGHA_AUTH=`auth`) whose agents a and b hold nodes 0 and 1, each running one task (a.0, b.0)."""
    broker = RecordingBroker()
    settings = LMSettings(auth=auth, cluster_secret=SECRET, lm_id=0, num_gms=1, expected_nodes=2)
    lm = LMService(settings, broker)  # type: ignore[arg-type]
    lm.dispatch.send_to_workers = lambda launch: None  # type: ignore[method-assign]  # no agent listens
    try:
        for worker in ("a", "b"):
            await lm.register(WorkerRegistration(worker_id=worker, url="http://127.0.0.1:9", nodes=[NODE]))
        tasks = [TaskSpec(f"{w}.0", w, "u", 60.0, (1000, 1000), 0) for w in ("a", "b")]
        response = await lm.launch(LaunchBatch(0, 0, 1, [Placement(t, 0, n, False) for n, t in enumerate(tasks)]))
        assert len(response.accepted) == 2
        yield lm, broker
    finally:
        await lm.close()


def completed(broker: RecordingBroker) -> list[str]:
    """The tasks the LM told its GM ended."""
    return [
        c["task_id"] for _, _, body in broker.published if "completions" in body for c in body["completions"]["items"]
    ]


@pytest.mark.asyncio
async def test_each_agent_gets_a_key_of_its_own_that_the_lm_derives_again_after_a_restart() -> None:
    settings = LMSettings(auth="on", cluster_secret=SECRET, lm_id=0, num_gms=1, expected_nodes=2)
    keys = {}
    for _ in range(2):  # the same LM, restarted: it derives the same keys
        lm = LMService(settings, None)
        for worker in ("a", "b"):
            got = await lm.register(WorkerRegistration(worker_id=worker, url="http://127.0.0.1:9", nodes=[NODE]))
            assert got.report_key is not None and "report_key" not in repr(got)
            keys.setdefault(worker, set()).add(got.report_key)
        await lm.close()
    assert {w: len(k) for w, k in keys.items()} == {"a": 1, "b": 1} and keys["a"] != keys["b"]
    assert keys["a"] == {report_key(settings.report_secret(), "a").hex()}
    other_lm = LMSettings(auth="on", cluster_secret=SECRET, lm_id=1, num_gms=1, expected_nodes=2)
    assert report_key(other_lm.report_secret(), "a").hex() not in keys["a"]  # every LM derives its own


@pytest.mark.asyncio
async def test_forged_unsigned_and_misdirected_reports_are_ignored_and_the_agents_own_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="megha.lm")
    async with lm_running_one_task_per_agent() as (lm, broker):
        secret = lm.settings.report_secret()
        key_a, key_b = report_key(secret, "a"), report_key(secret, "b")
        forged = [
            (report("b.0", 1), {}),  # unsigned
            (report("b.0", 1), {REPORT_SENDER: "b"}),  # names b, no signature
            (report("b.0", 1), {REPORT_SENDER: "b", REPORT_SIGNATURE: "00" * 32}),  # names b, signature made up
            (report("b.0", 1), report_headers(key_a, 0, "b", report("b.0", 1))),  # names b, signed with a's key
            (report("b.0", 1), report_headers(key_a, 0, "a", report("b.0", 1))),  # a's, about b's node
            (report("b.0", 1, lm=1), report_headers(key_b, 1, "b", report("b.0", 1, lm=1))),  # b's, for LM 1
            (report("b.0", 1), report_headers(key_b, 0, "b", report("a.0", 1))),  # b's signature of another body
            (b"not json at all", {}),  # garbage is ignored too (not dead-lettered)
        ]
        for body, headers in forged:
            await lm.on_broker_message(body, headers)
        await settle()
        assert lm.reports.ignored.count == len(forged) and completed(broker) == []
        assert lm.core is not None and sorted(lm.core.running) == ["a.0", "b.0"]
        # A heartbeat of b signed by a does not count as b's; a's own does.
        await lm.on_broker_message(heartbeat("b"), report_headers(key_a, 0, "a", heartbeat("b")))
        beat = heartbeat("a")
        await lm.on_broker_message(beat, report_headers(key_a, 0, "a", beat))
        assert set(lm.state()["heartbeats"]) == {"a"} and lm.reports.ignored.count == len(forged) + 1  # type: ignore[arg-type]
        # A report of a's signed by a: its item about a's node counts, the one about b's node does not.
        body = json.dumps(
            {"worker_report": {"lm": 0, "finished": [{"task_id": "a.0", "node": 0}, {"task_id": "b.0", "node": 1}]}}
        ).encode()
        await lm.on_broker_message(body, report_headers(key_a, 0, "a", body))
        await wait_for(lambda: completed(broker) == ["a.0"], 5, lambda: completed(broker))
        assert sorted(lm.core.running) == ["b.0"]
        # b's own report, signed by b, ends b.0.
        await lm.on_broker_message(report("b.0", 1), report_headers(key_b, 0, "b", report("b.0", 1)))
        await wait_for(lambda: completed(broker) == ["a.0", "b.0"], 5, lambda: completed(broker))
        assert lm.core.is_idle()
        # Logged with the sender each claimed, at most one line per claimed sender within IGNORED_LOG_EVERY
        # seconds: 5 messages named b, 2 none, 2 were a's.
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ignored ")]
        assert len(lines) == 3, lines
        assert "from worker agent (none named) (a report of tasks ['b.0'] on nodes [1]): it is not signed" in lines[0]
        assert "from worker agent 'b'" in lines[1] and "signature is not that agent's" in lines[1]
        assert "from worker agent 'a'" in lines[2] and "runs on nodes [1], which that agent does not hold" in lines[2]
        # Once IGNORED_LOG_EVERY seconds have passed, the next one is logged with the count of those not logged.
        last, unlogged = lm.reports.ignored._logged["b"]
        lm.reports.ignored._logged["b"] = (last - IGNORED_LOG_EVERY, unlogged)
        await lm.on_broker_message(report("b.0", 1), {REPORT_SENDER: "b"})
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ignored ")]
        assert len(lines) == 4 and lines[3].endswith("; 4 more ignored since the last such line"), lines


@pytest.mark.asyncio
async def test_with_authentication_off_nothing_is_signed_or_checked() -> None:
    async with lm_running_one_task_per_agent(auth="off") as (lm, broker):
        assert lm.members.workers["a"].report_key is None
        await lm.on_broker_message(report("b.0", 1))
        await wait_for(lambda: completed(broker) == ["b.0"], 5, lambda: completed(broker))
        assert lm.reports.ignored.count == 0


# -------------------------------------------------------------------------------------- real deployments


CAT = shutil.which("cat") or "/bin/cat"


class Gate:
    """A FIFO a held task reads (`cat`) until the test lets it go: `open()` opens and closes its writing end, the
    task reads end-of-file and ends with exit code 0. Its folder is open to every user: the task runs as another."""

    def __init__(self) -> None:
        self.folder = task_visible_folder("megha-gate-")
        self.fifo = self.folder / "gate"
        os.mkfifo(self.fifo)
        self.fifo.chmod(0o666)

    def task(self) -> dict[str, object]:
        """An exec task of a sliver of a node that runs until `open()`."""
        return {"driver": "exec", "command": [CAT, str(self.fifo)], "cpu_millicores": 100, "memory_mb": 64}

    def open(self, timeout: float = 30.0) -> None:
        """Let the held task end (waiting up to `timeout` seconds for it to have the FIFO open)."""

        def opened() -> bool:
            try:
                os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError as exc:  # ENXIO: nobody reads it (yet)
                if exc.errno != errno.ENXIO:
                    raise
                return False
            return True

        wait_until(opened, timeout, lambda: f"nobody reads {self.fifo}")


@pytest.fixture
def gate() -> Iterator[Gate]:
    made = Gate()
    yield made
    shutil.rmtree(made.folder)


@contextmanager
def deployment(
    tmp_path: Path, broker_users: tuple[str, dict[str, str]] | None = None, **shape: Any
) -> Iterator[LocalDeployment]:
    """One GM, one LM, two real agents (exec offered), each agent one node: worker-0-1's node alone satisfies
    constraint 0, so a task asking it runs there. `broker_users`: the run id and each role's broker URL; `shape`:
    other `LocalDeployment` fields (gms, lms, workers_per_lm, worker_settings)."""
    broker = {"run_id": broker_users[0], "amqp_urls": broker_users[1]} if broker_users is not None else {}
    fields: dict[str, Any] = {"gms": 1, "lms": 1, "workers_per_lm": 2} | broker | shape
    fields.setdefault("worker_settings", {"worker-0-0": {"constraints": ""}, "worker-0-1": {"constraints": "0"}})
    with LocalDeployment(heartbeat_interval=0.5, log_dir=tmp_path / "logs", **fields) as d:
        yield d


def call(d: LocalDeployment, method: str, url: str, **kwargs: Any) -> httpx.Response:
    with d.client() as http:
        return http.request(method, url, **kwargs)


def task_status(d: LocalDeployment, job_id: str = "held") -> dict[str, Any]:
    r = call(d, "GET", f"{d.gm_urls[0]}/v1/jobs/{job_id}")
    assert r.status_code == 200, r.text
    return r.json()["tasks"][0]  # type: ignore[no-any-return]


def lm_state(d: LocalDeployment) -> dict[str, Any]:
    return call(d, "GET", f"{d.lm_urls[0]}/v1/state").json()  # type: ignore[no-any-return]


def agent_runs(d: LocalDeployment, worker: str = "worker-0-1") -> list[str]:
    """The tasks agent `worker` runs now."""
    return call(d, "GET", f"{d.process(worker).url}/v1/state").json()["running"]  # type: ignore[no-any-return]


def submit_held(d: LocalDeployment, gate: Gate) -> dict[str, Any]:
    """Submit job "held": one held task, on worker-0-1's node; returns its status once it runs there."""
    task = {**gate.task(), "constraints": [0]}
    r = call(d, "POST", f"{d.gm_urls[0]}/v1/jobs", json={"job_id": "held", "user": "alice", "tasks": [task]})
    assert r.status_code == 201, r.text
    wait_until(lambda: agent_runs(d) != [] or task_status(d)["state"] == "failed", 30, lambda: task_status(d))
    status = task_status(d)
    assert status["state"] == "launched" and agent_runs(d) == [status["task_id"]], status
    return status


@asynccontextmanager
async def events_of(d: LocalDeployment) -> AsyncIterator[list[Any]]:
    """The task events of the deployment's run from now on (through the guest account: the test is the operator)."""
    broker = Broker(AMQP, d.run_id)
    await broker.connect()
    events: list[Any] = []

    async def collect(body: bytes) -> None:
        events.extend(TaskEvents.model_validate_json(body).events)

    queue = await broker.consume("events", "", collect, queue=loadgen_queue(d.run_id))
    try:
        yield events
    finally:
        await broker.delete_queue(queue)
        await broker.close()


def ended(events: list[Any], task_id: str) -> list[tuple[str, int]]:
    return [(e.kind, e.attempt) for e in events if e.task_id == task_id and e.kind != "started"]


def lm_log(d: LocalDeployment) -> str:
    return (d.log_dir / "lm-0.log").read_text()


@needs_rabbitmq
def test_a_forged_completion_on_the_lms_queue_is_ignored_and_logged_and_the_run_ends_once(
    users: tuple[str, dict[str, str]],  # noqa: F811
    tmp_path: Path,
    gate: Gate,
) -> None:
    run_id, urls = users
    with deployment(tmp_path, users) as d:
        status = submit_held(d, gate)
        node, task_id = status["node"], status["task_id"]
        body = report(task_id, node)

        async def forge_then_release() -> list[Any]:
            async with events_of(d) as events:
                # What a compromised agent (or a task holding the agents' broker password) can publish.
                attacker = Broker(urls["worker"], run_id, role="worker")
                await attacker.connect()
                try:
                    await attacker.publish("lm", lm_key(0), body)
                    await attacker.publish("lm", lm_key(0), body, {REPORT_SENDER: "worker-0-1"})
                    await attacker.publish(
                        "lm", lm_key(0), body, {REPORT_SENDER: "worker-0-1", REPORT_SIGNATURE: "ab" * 32}
                    )
                    assert await attacker.flush(10)
                finally:
                    await attacker.close()
                await wait_for(lambda: lm_state(d)["ignored_reports"] == 3, 20, lambda: lm_state(d))
                # Ignored: the run still runs, at the LM and at its GM.
                assert lm_state(d)["running"] == 1 and task_status(d)["state"] == "launched" and agent_runs(d) != []
                gate.open()
                await wait_for(lambda: task_status(d)["state"] == "finished", 30, lambda: task_status(d))
                await wait_for(lambda: ended(events, task_id) != [], 10, lambda: events)
                return events

        events = asyncio.run(forge_then_release())
        assert ended(events, task_id) == [("finished", 1)]
        final = task_status(d)
        assert (final["attempts"], final["retries"]) == (1, 0)
        state = lm_state(d)
        assert state["idle"] and state["ignored_reports"] == 3
        log = lm_log(d)
    lines = [line for line in log.splitlines() if "ignored a broker message" in line]
    assert len(lines) == 2, lines  # one per claimed sender: none named, worker-0-1
    assert f"from worker agent (none named) (a report of tasks ['{task_id}'] on nodes [{node}])" in lines[0]
    assert "from worker agent 'worker-0-1'" in lines[1] and "signature is not that agent's" in lines[1]


@needs_rabbitmq
def test_a_report_signed_with_one_agents_key_about_another_agents_node_is_ignored(
    users: tuple[str, dict[str, str]],  # noqa: F811
    tmp_path: Path,
    gate: Gate,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_id, urls = users
    with deployment(tmp_path, users) as d:
        status = submit_held(d, gate)
        node, task_id = status["node"], status["task_id"]
        # worker-0-0 is compromised: it holds its own report key (what its LM derives for it) and signs with it.
        for name, value in d.process("lm-0").env.items():
            if name.startswith("MEGHA_"):
                monkeypatch.setenv(name, value)
        key = report_key(LMSettings().report_secret(), "worker-0-0")
        body = report(task_id, node)
        beat = heartbeat("worker-0-1", running=0)

        async def forge() -> None:
            attacker = Broker(urls["worker"], run_id, role="worker")
            await attacker.connect()
            try:
                await attacker.publish("lm", lm_key(0), body, report_headers(key, 0, "worker-0-0", body))
                await attacker.publish("lm", lm_key(0), beat, report_headers(key, 0, "worker-0-0", beat))
                assert await attacker.flush(10)
            finally:
                await attacker.close()
            await wait_for(lambda: lm_state(d)["ignored_reports"] == 2, 20, lambda: lm_state(d))

        asyncio.run(forge())
        assert lm_state(d)["running"] == 1 and task_status(d)["state"] == "launched" and agent_runs(d) != []
        gate.open()
        wait_until(lambda: task_status(d)["state"] == "finished", 30, lambda: task_status(d))
        assert task_status(d)["attempts"] == 1 and lm_state(d)["ignored_reports"] == 2
        log = lm_log(d)
    (line,) = [line for line in log.splitlines() if "ignored a broker message" in line]
    assert "from worker agent 'worker-0-0'" in line and f"runs on nodes [{node}], which that agent" in line, line


@needs_rabbitmq
def test_reports_that_wait_in_the_broker_while_the_lm_restarts_are_accepted(tmp_path: Path, gate: Gate) -> None:
    """The held task ends while its LM is down: its agent's signed report waits in the LM's queue, and the LM,
    restarted, derives the same key and accepts it. Had it been dropped, the rebuilt LM would not know the run
    ended, and its GM would run it again (attempt 2)."""
    with deployment(tmp_path) as d:
        status = submit_held(d, gate)

        async def run() -> list[Any]:
            async with events_of(d) as events:
                d.kill("lm-0")
                gate.open()
                await wait_for(lambda: agent_runs(d) == [], 30, lambda: agent_runs(d))
                d.restart("lm-0")
                await wait_for(lambda: task_status(d)["state"] == "finished", 60, lambda: task_status(d))
                await wait_for(lambda: ended(events, status["task_id"]) != [], 10, lambda: events)
                return events

        events = asyncio.run(run())
        final = task_status(d)
        assert (final["attempts"], final["retries"]) == (1, 0)
        assert ended(events, status["task_id"]) == [("finished", 1)]
        state = lm_state(d)
        assert state["ignored_reports"] == 0 and state["idle"]
