"""The worker agent: registers its node(s) with its LM, runs launched tasks, and reports starts and completions."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Coroutine
from functools import partial
from pathlib import Path
from typing import Any

from pydantic_core import to_json

from megha.common.constraint_stats import load_constraint_stats
from megha.common.core.messages import FinishedTask, Placement, RunEvent, WorkerReport
from megha.common.core.queueable import NodeQueues
from megha.common.core.resources import CPU, DEFAULT_RESOURCE_NAMES, MEMORY, describe
from megha.common.lifecycle import StartupError, check_stop
from megha.common.models import (
    BrokerMessage,
    PlacementModel,
    TaskEvents,
    WorkerHeartbeat,
    WorkerNode,
    WorkerRegistered,
)
from megha.common.settings import WorkerSettings
from megha.common.transport.rabbit import Broker, lm_key, report_headers, run_background
from megha.services import retry
from megha.services.client import CallError, ServiceClient
from megha.services.logs import ids
from megha.services.worker.drivers import Driver, DriverUnavailable
from megha.services.worker.exec_driver import ExecDriver
from megha.services.worker.execution import ExecutionResult
from megha.services.worker.executor import TaskExecutor
from megha.services.worker.ledger import NodeLedger
from megha.services.worker.node_claim import NodeClaim, default_claim_folder
from megha.services.worker.simulated import SimulatedExecutor
from megha.services.worker.tasklogs import Stream, TaskLogs, default_log_dir

log = logging.getLogger("megha.worker")

FLUSH_SECONDS = 0.002
"""Reports and events produced within this window travel as one broker message each."""

REMEMBER_FINISHED = 100_000
"""How many finished runs (task id, attempt) an agent remembers so that a repeated launch does not run one twice."""


class LaunchRefused(Exception):
    """A launch the agent refuses as a whole (none of its tasks is started): the HTTP status and the field to name."""

    def __init__(self, status: int, message: str, field: str) -> None:
        super().__init__(message)
        self.status = status
        self.field = field


class WorkerAgent:
    def __init__(self, settings: WorkerSettings, broker: Broker | None) -> None:
        if settings.execution == "real" and settings.nodes != 1:
            raise ValueError("MEGHA_NODES > 1 needs MEGHA_EXECUTION=simulated: a real agent is one node")
        self.settings = settings
        self.broker = broker
        self.executor: TaskExecutor | SimulatedExecutor
        self.logs: TaskLogs | None = None  # the kept output of exec and container tasks
        self._drivers: dict[str, Driver] = {}
        if settings.execution == "real":
            self.drivers = tuple(settings.drivers)
            self._drivers = _drivers(settings)
            if self._drivers:
                folder = (
                    Path(settings.task_log_dir)
                    if settings.task_log_dir
                    else default_log_dir(settings.run_id, settings.worker_id)
                )
                self.logs = TaskLogs(folder, settings.task_log_bytes, settings.task_logs_kept)
            self.executor = TaskExecutor(self._on_finished, drivers=self._drivers, logs=self.logs)
        else:  # a simulated agent offers only burn, whatever MEGHA_DRIVERS says
            self.drivers = ("burn",)
            self.executor = SimulatedExecutor(self._on_finished)
        self.registered: WorkerRegistered | None = None
        # The node numbers this agent had before it restarted, kept for a restart together with its LM.
        self._claim = NodeClaim(default_claim_folder(), settings.run_id, settings.worker_id)
        self._kept_first_node: int | None = None
        self._report_key: bytes | None = None  # signs the reports to the LM (None with MEGHA_AUTH=off)
        self._placements: dict[str, Placement] = {}  # launched and not yet reported, by task id
        self.ledger = NodeLedger((settings.node_cpu_millicores, settings.node_memory_mb))  # what guaranteed runs hold
        # Queueable runs wait in their node's queue until they fit, and guaranteed runs evict them (docs/queueable.md).
        self.queues = NodeQueues(lambda node: self.ledger.capacity)
        # Recently reported runs (task id, attempt, run number), for idempotency: a GM that restarted launches an
        # attempt again under a new run number, which is another run.
        self._done: OrderedDict[tuple[str, int, int], None] = OrderedDict()
        self._starting: set[asyncio.Task[object]] = set()
        self._evicting: set[str] = set()  # queueable runs evicted before their process started (stopped at start)
        # Not yet published: the runs that ended, per LM, and the runs that started.
        self._reports: dict[int, list[FinishedTask]] = {}
        self._events: list[RunEvent] = []
        self._flusher: asyncio.Task[None] | None = None
        self._calls = ServiceClient(timeout=10.0, authorization=settings.credentials())
        self._lm_unreachable = False

    def nodes(self) -> list[WorkerNode]:
        s = self.settings
        capacity = {CPU: s.node_cpu_millicores, MEMORY: s.node_memory_mb}
        if s.constraint_seed is None:
            return [WorkerNode(capacity=capacity, constraints=sorted(set(s.constraints)))] * s.nodes
        rng = random.Random(s.constraint_seed)
        fractions = load_constraint_stats().machine_fraction
        return [
            WorkerNode(capacity=capacity, constraints=[k for k, f in enumerate(fractions) if rng.random() < f])
            for _ in range(s.nodes)
        ]

    def registration(self) -> bytes:
        """This agent's `WorkerRegistration`: its nodes, the node numbers it had (if it registered before) and the
        tasks it runs, from which an LM rebuilt after a crash learns its state."""
        before = self.registered
        return to_json(
            {
                "worker_id": self.settings.worker_id,
                "url": self.settings.url(),
                "nodes": [n.model_dump() for n in self.nodes()],
                "first_node": before.first_node if before is not None else None,
                "kept_first_node": self._kept_first_node if before is None else None,
                "running": [PlacementModel.plain(p) for p in self._placements.values()],
                "drivers": list(self.drivers),
            }
        )

    async def prepare(self) -> None:
        """Check that every driver this agent offers can run tasks here, and log how each does; raises
        `StartupError` (say, MEGHA_DRIVERS lists container and the Docker engine does not answer, or the kept
        output's folder is another user's). A driver that cannot run tasks safely here (exec on an agent that cannot
        switch uids) is left out of the drivers offered, with one line saying why."""
        if self.logs is not None:
            self.logs.prepare()
        for name, driver in list(self._drivers.items()):
            try:
                log.info("%s", await driver.prepare())
            except DriverUnavailable as exc:
                log.warning("%s", exc)
                del self._drivers[name]
                assert isinstance(self.executor, TaskExecutor)
                self.executor.withdraw(name)
                self.drivers = tuple(d for d in self.drivers if d != name)

    async def register(self, timeout: float = 120.0) -> WorkerRegistered:
        """Register with the LM, retrying until it answers (it may start after us, or be restarting); the LM gives
        an agent that registers again the nodes it had, so the call is idempotent."""
        lm = f"LM at {self.settings.lm_url}"
        if self.registered is None:
            self._kept_first_node = self._claim.read(self.settings.lm_url, self.settings.nodes)
        policy = retry.RetryPolicy(deadline=timeout, first_pause=0.2, max_pause=0.2, jitter=0.0)
        send = partial(self._calls.post, f"{self.settings.lm_url}/v1/workers", self.registration(), idempotent=True)
        next_note = time.monotonic() + 2.0

        def waiting(attempt: int, failure: str) -> None:  # as the GM waits for its LMs: a line every 5 s
            nonlocal next_note
            check_stop(lm)
            if time.monotonic() >= next_note:
                log.warning("waiting for %s (up to %g s): %s", lm, timeout, failure)
                next_note = time.monotonic() + 5.0

        outcome = await retry.call(send, policy, lm, waiting)
        r = outcome.reply
        if not outcome.succeeded or r is None:
            if r is not None and not retry.busy(r.status):
                raise StartupError(f"{lm} refused the registration: {outcome.failure}")
            raise StartupError(f"{lm} unreachable for {timeout:g} s: {outcome.failure}")
        self.registered = WorkerRegistered.model_validate_json(r.body)
        self._claim.keep(self.settings.lm_url, self.registered)
        key = self.registered.report_key
        self._report_key = bytes.fromhex(key) if key is not None else None
        log.info(
            "registered with LM %d (incarnation %d) as nodes %d..%d, %d tasks running",
            self.registered.lm,
            self.registered.incarnation,
            self.registered.first_node,
            self.registered.first_node + self.registered.nodes - 1,
            len(self._placements),
        )
        return self.registered

    async def heartbeats(self) -> None:
        """Tell the LM every `heartbeat_interval` seconds that this agent is alive, and register again when the LM
        is a new incarnation (runs until cancelled; a failed beat is logged and the next one goes out on time)."""

        async def beat() -> None:
            await self.heartbeat()
            await self.check_lm()

        await run_background("heartbeat", beat, self.settings.heartbeat_interval)

    async def check_lm(self) -> None:
        """Ask the LM which incarnation it is; after it restarted, register again with the tasks this agent runs
        (they keep running through the LM's outage, and their reports wait in the broker)."""
        if self.registered is None:
            return
        try:
            r = await self._calls.get(f"{self.settings.lm_url}/healthz")
            incarnation = json.loads(r.body).get("incarnation") if r.status == 200 else None
        except (CallError, ValueError) as exc:
            if not self._lm_unreachable:
                log.warning("LM at %s unreachable (%s); tasks keep running, reports wait", self.settings.lm_url, exc)
            self._lm_unreachable = True
            return
        self._lm_unreachable = False
        if incarnation is not None and incarnation != self.registered.incarnation:
            log.warning(
                "LM %d restarted (incarnation %d, was %d): registering again with %d running tasks",
                self.registered.lm,
                incarnation,
                self.registered.incarnation,
                len(self._placements),
            )
            await self.register()

    async def heartbeat(self) -> None:
        if self.broker is None or self.registered is None:
            return
        beat = WorkerHeartbeat(
            worker_id=self.settings.worker_id,
            lm=self.registered.lm,
            at=time.time(),
            running=len(self.executor.running()),
        )
        await self._to_lm(beat.lm, BrokerMessage(heartbeat=beat).model_dump_json().encode())

    async def _to_lm(self, lm: int, body: bytes) -> None:
        """Publish a heartbeat or report to LM `lm`, signed with this agent's report key (docs/topology.md)."""
        assert self.broker is not None
        key = self._report_key
        headers = None if key is None else report_headers(key, lm, self.settings.worker_id, body)
        await self.broker.publish("lm", lm_key(lm), body, headers)

    def launch(self, placements: list[Placement]) -> list[str]:
        """Accept a launch and start its tasks in the background; returns the ids accepted. Idempotent: a run
        (task, attempt) that runs or ran here (the LM retries calls that timed out) is not started again, nor
        counted again against its node.

        All or nothing: raises `LaunchRefused`, starting none of the tasks, when one asks more than its node's
        whole capacity (422), does not fit what its node has free with the new runs before it in the launch
        (409), or names a task that runs here as another run (409) or twice (422). The LM sends one launch per
        agent and reports all of a launch's tasks lost when it is refused, so accepting part of it would run
        tasks the LM reports lost. Needs `registered` (the node numbers)."""
        assert self.registered is not None, "launch before registration"
        first = self.registered.first_node
        fresh: list[tuple[int, Placement]] = []
        seen: set[str] = set()
        offered = self.drivers
        for i, p in enumerate(placements):
            task = p.task
            if task.driver not in offered:
                raise LaunchRefused(
                    422,
                    f"task {task.task_id} runs with the {task.driver} driver, which this agent does not offer "
                    f"(it offers {', '.join(offered)}); nothing in this launch was started",
                    f"launches.{i}.task.run.driver",
                )
            if task.task_id in seen:
                raise LaunchRefused(
                    422, f"task {task.task_id} appears twice in this launch", f"launches.{i}.task.task_id"
                )
            seen.add(task.task_id)
            running = self._placements.get(task.task_id)
            if running is not None:
                if (running.task.attempt, running.node) != (task.attempt, p.node):
                    raise LaunchRefused(
                        409,
                        f"task {task.task_id} runs here as attempt {running.task.attempt} on node {running.node}, "
                        f"not as attempt {task.attempt} on node {p.node}; nothing in this launch was started",
                        f"launches.{i}.task.attempt",
                    )
            elif (task.task_id, task.attempt, task.run_number) not in self._done:
                fresh.append((i, p))
        ledger = self.ledger
        for i, p in fresh:
            if not ledger.could_hold(p.task.request):
                raise LaunchRefused(
                    422,
                    f"task {p.task.task_id} asks {_amounts(p.task.request)}, more than node {p.node} has at all "
                    f"({_amounts(ledger.capacity)}); nothing in this launch was started",
                    f"launches.{i}.task.request",
                )
        guaranteed = [(i, p) for i, p in fresh if not p.task.queueable]  # queueable runs wait instead
        over = ledger.overflow([(p.node - first, p.task.request) for _, p in guaranteed])
        if over is not None:
            k, free = over
            i, p = guaranteed[k]
            raise LaunchRefused(
                409,
                f"task {p.task.task_id} asks {_amounts(p.task.request)}, and node {p.node} has {_amounts(free)} free"
                f"{' after the tasks before it in this launch' if free != ledger.free(p.node - first) else ''} "
                f"(capacity {_amounts(ledger.capacity)}); nothing in this launch was started",
                f"launches.{i}.task.request",
            )
        starts: list[str] = []
        evicted: list[str] = []
        for _, p in fresh:
            task = p.task
            self._placements[task.task_id] = p
            if not task.queueable:
                ledger.hold(task.task_id, p.node - first, task.request)
            moves = self.queues.launch(p.node - first, task.task_id, task.request, task.queueable)
            starts += moves.started
            evicted += moves.evicted
        if evicted:  # one that has not started yet (perhaps in this launch) is reported by `_start_all`
            self._evicting.update(evicted)
            self._in_background(self.preempt(evicted))
        if starts:
            self._in_background(self._start_all([self._placements[task_id] for task_id in starts]))
        return [p.task.task_id for p in placements]

    def _in_background(self, work: Coroutine[Any, Any, object]) -> None:
        """Run `work` as a task of the loop, kept until it is done."""
        started = asyncio.get_running_loop().create_task(work)
        self._starting.add(started)
        started.add_done_callback(self._starting.discard)

    async def preempt(self, task_ids: list[str]) -> list[str]:
        """Stop these tasks' processes (each is reported preempted); returns those that were running, or waiting in
        their node's queue (taken out, reported preempted too), or launched here and still starting (never run, or
        killed as soon as its process exists; reported preempted). A task already finished was reported finished;
        one whose launch has not reached this agent is not known and is left alone (its LM sends a stop only once
        its launch call is over: `LMDispatch.launched`)."""
        waiting = [task_id for task_id in task_ids if self.queues.is_waiting(task_id)]
        for task_id in waiting:
            now = time.time()
            self._report(self._placements[task_id], ExecutionResult(task_id, now, now, 0, 0, 0, 0, 0, 0, True, ""))
        task_ids = [task_id for task_id in task_ids if task_id not in waiting]
        placed = {task_id: self._placements.get(task_id) for task_id in task_ids}
        stopped = await asyncio.gather(*(self.executor.kill(task_id) for task_id in task_ids))
        killed = {task_id for task_id, was in zip(task_ids, stopped) if was}
        # Launched here but not started yet (its process is being made, or waits its turn in `_start_all`): a stop
        # found nothing to kill, and the start would then run it to its end. It is started never, or killed at once.
        starting = [t for t, was in zip(task_ids, stopped) if not was and t in self._placements]
        if starting:
            self._evicting.update(starting)
            killed.update(starting)
        if killed:
            runs = [p for task_id, p in placed.items() if task_id in killed and p is not None]
            log.info(
                "stopped %d tasks at the LM's request (a preemption, a cancelled job or a lost run): %s",
                len(killed),
                sorted(killed)[:20],
                extra=ids(
                    job=sorted({p.task.job_id for p in runs}),
                    task=sorted(killed),
                    gm=sorted({p.gm for p in runs}),
                    lm=self.registered.lm if self.registered is not None else None,
                    node=sorted({p.node for p in runs}),
                    worker=self.settings.worker_id,
                ),
            )
        return waiting + [task_id for task_id in task_ids if task_id in killed]

    async def _start_all(self, placements: list[Placement]) -> None:
        executor = self.executor
        for p in placements:
            task = p.task
            if task.task_id in self._evicting:  # evicted before it started: reported preempted, never run
                now = time.time()
                self._report(p, ExecutionResult(task.task_id, now, now, 0, 0, 0, 0, 0, 0, True, ""))
                continue
            try:
                await executor.start(
                    task.task_id, task.request[0], task.request[1], task.duration, task.run, task.attempt
                )
            except Exception as exc:  # the task must still be reported, never silently dropped
                if isinstance(exc, OSError | ValueError):  # the task's own (no such program, a workdir it cannot enter)
                    log.warning("could not start %s: %s", task.task_id, exc, extra=ids(task=task.task_id))
                else:
                    log.exception("could not start %s", task.task_id)
                self._report(p, ExecutionResult.failed_to_start(task.task_id, str(exc)))
                continue
            self._started(p, at=time.time())
            if task.task_id in self._evicting:  # evicted while its process was starting
                await executor.kill(task.task_id)

    async def _on_finished(self, result: ExecutionResult) -> None:
        self._report(self._placements[result.task_id], result)

    def _report(self, placement: Placement, result: ExecutionResult) -> None:
        """Report the end of a task to the LM (which frees its resources) and to whoever watches task events."""
        self._placements.pop(result.task_id, None)
        if result.error and not result.preempted:
            task = placement.task
            log.warning(
                "task %s of job %s failed on node %d: %s",
                task.task_id,
                task.job_id,
                placement.node,
                result.error,
                extra=ids(
                    job=task.job_id,
                    task=task.task_id,
                    attempt=task.attempt,
                    gm=placement.gm,
                    lm=placement.lm,
                    node=placement.node,
                    worker=self.settings.worker_id,
                    user=task.user,
                ),
            )
        self.ledger.release(result.task_id)
        self._evicting.discard(result.task_id)
        starts = self.queues.end(result.task_id)
        if starts:  # queued runs that fit now
            self._in_background(self._start_all([self._placements[task_id] for task_id in starts]))
        if not result.preempted:  # a preempted task is launched again as the same attempt: not a repeat
            self._done[(result.task_id, placement.task.attempt, placement.task.run_number)] = None
            if len(self._done) > REMEMBER_FINISHED:
                self._done.popitem(last=False)
        self._reports.setdefault(placement.lm, []).append(
            FinishedTask.of(
                placement,
                preempted=result.preempted,
                error=result.error,
                gm=placement.gm,
                cpu_seconds=result.cpu_seconds,
                execution_delay=max(0.0, result.execution_delay),
                process_overhead=min(result.process_overhead, max(0.0, result.execution_delay)),
                started_at=result.started_at,
                finished_at=result.finished_at,
                exit_code=result.task_exit_code,
            )
        )
        self._flush_soon()

    def _started(self, p: Placement, at: float) -> None:
        """Queue the event of a run's start for the next flush (as a core `RunEvent`: building the wire model for
        every task start would cost a few microseconds each on the path of allocation time). How a run ended is
        published by the LM, which checks the report against the run it placed."""
        task = p.task
        self._events.append(
            RunEvent(
                "started", task.task_id, task.job_id, p.lm, p.node, at, attempt=task.attempt, run_number=task.run_number
            )
        )
        self._flush_soon()

    def _flush_soon(self) -> None:
        """Publish what accumulated within FLUSH_SECONDS as one message per LM and one events message."""
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush(FLUSH_SECONDS))

    async def _flush(self, after: float) -> None:
        """Publish until nothing is left: what arrives while a publish is in flight goes in the next round. The
        bodies are a `BrokerMessage` with a `WorkerReportModel` per LM, and `TaskEvents`."""
        await asyncio.sleep(after)
        while self._reports or self._events:
            reports, self._reports = self._reports, {}
            events, self._events = self._events, []
            if self.broker is None:
                continue
            for lm, finished in reports.items():
                await self._to_lm(lm, BrokerMessage.core_json(WorkerReport(lm, finished)))
            if events:
                await self.broker.publish("events", "", TaskEvents.core_json(events))

    async def close(self) -> None:
        await self.executor.shutdown()
        await self._flush(0.0)
        await self._calls.aclose()

    def task_output(self, task_id: str, stream: Stream, attempt: int | None, tail: int | None) -> tuple[int, bytes]:
        """What is kept of a task's `stream` (of `attempt`, else its latest), its last `tail` bytes when given, and
        the attempt it is of. A burn task this agent runs or ran keeps nothing: b"". Raises `UnknownRun` naming the
        field when there is no record of the task (or of that attempt)."""
        attempts = self.logs.attempts(task_id) if self.logs is not None else None
        if attempts:
            if attempt is None:
                attempt = attempts[-1]
            elif attempt not in attempts:
                raise UnknownRun(f"task {task_id} has no attempt {attempt} here (it has {attempts})", "attempt")
            assert self.logs is not None
            return attempt, self.logs.read(task_id, attempt, stream, tail)
        runs = [a for (t, a, _) in self._done if t == task_id]
        running = self._placements.get(task_id)
        if running is not None:
            runs.append(running.task.attempt)
        if not runs:
            raise UnknownRun(f"this agent has no record of task {task_id}", "task_id")
        if attempt is not None and attempt not in runs:
            raise UnknownRun(f"task {task_id} has no attempt {attempt} here (it has {sorted(set(runs))})", "attempt")
        return attempt if attempt is not None else max(runs), b""


class UnknownRun(LookupError):
    """No record on this agent of the task (or the attempt) asked for; `field` names which."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def _drivers(settings: WorkerSettings) -> dict[str, Driver]:
    """The driver objects of the drivers MEGHA_DRIVERS lists besides burn."""
    drivers: dict[str, Driver] = {}
    if "exec" in settings.drivers:
        drivers["exec"] = ExecDriver(
            settings.worker_id,
            settings.task_uid_range(),
            settings.task_max_processes,
            settings.exec_as_agent_user,
            max_files=settings.task_max_files,
            max_disk_mb=settings.task_max_disk_mb,
            max_disk_files=settings.task_max_disk_files,
            uid_wait=settings.task_uid_wait,
        )
    if "container" in settings.drivers:
        from megha.services.worker.container_driver import ContainerDriver  # imports the Docker SDK

        drivers["container"] = ContainerDriver(
            settings.worker_id, settings.task_max_processes, settings.container_network, settings.task_max_files
        )
    return drivers


def _amounts(amounts: tuple[int, ...]) -> str:
    return describe(amounts, DEFAULT_RESOURCE_NAMES)
