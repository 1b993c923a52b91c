"""An LM's outputs to the transports: launches POSTed to worker agents (each split under the agents' body limit and
retried under its policy), stops of preempted or lost runs, completions and deltas published to each GM's queue,
task events published for the load generator and the job tables, and the core's timers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any

from megha.common.auth import MessageSigner
from megha.common.core.messages import (
    Completions,
    Delta,
    FinishedTask,
    Output,
    Placement,
    RunEvent,
    Send,
    WorkerLaunch,
    WorkerPreempt,
)
from megha.common.models import BrokerMessage, TaskEvents, WorkerLaunchModel, WorkerPreemptModel
from megha.common.settings import LMSettings
from megha.common.transport.rabbit import Broker, gm_key, lm_report_headers
from megha.services import retry
from megha.services.background import spawn
from megha.services.client import CallError, ServiceClient
from megha.services.lm.membership import Membership
from megha.services.logs import ids

log = logging.getLogger("megha.lm")

AGENT_LAUNCH = retry.RetryPolicy(deadline=30.0, attempts=3, first_pause=0.2, max_pause=0.4, retry=lambda s: s != 422)
"""Launches on an agent (which runs each (task, attempt) once however often it comes): three attempts; a 422
says nothing of the launch could ever run there, so it is not sent again."""


class LMDispatch:
    """Sends what an LM core decided. Its calls to agents are idempotent there (an agent runs a (task, attempt)
    once, and stopping a run it stopped already stops nothing), so the client may send them again.
    `lose(placements, reason, worker)` reports runs no agent could take as lost (the service applies that under
    its lock); `tick()` hands the core its delta timer."""

    def __init__(
        self,
        settings: LMSettings,
        broker: Broker | None,
        calls: ServiceClient,
        members: Membership,
        lose: Callable[[list[Placement], str, str | None, bool], Awaitable[None]],
        tick: Callable[[object], Awaitable[None]],
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.calls = calls
        self.members = members
        self._lose = lose
        self._tick = tick
        # Signs each message to a GM with this LM's credential (None with MEGHA_AUTH=off: nothing is signed).
        self.signer = MessageSigner(settings.own_credential()) if settings.auth == "on" else None
        self.tasks: set[asyncio.Task[None]] = set()  # background sends, cancelled when the LM closes
        # Tasks whose launch call to their agent is not over yet, each with a future done when it is: a stop of such
        # a task waits for it (`launched`), so that it never reaches the agent before the launch (then unknown
        # there, it was left alone, and the launch that came next ran the task to its end).
        self._launching: dict[str, asyncio.Future[None]] = {}

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        spawn(self.tasks, coro)

    def send(self, outputs: list[Output]) -> None:
        for out in outputs:
            if isinstance(out, Send):
                if isinstance(out.msg, WorkerLaunch):
                    self.send_to_workers(out.msg)
                elif isinstance(out.msg, Completions | Delta):
                    self.spawn(self.publish(out.msg.gm, BrokerMessage.core_json(out.msg)))
                else:
                    raise TypeError(f"LM cannot send {type(out.msg).__name__}")
            else:
                self.spawn(self._timer(out.at, out.msg))

    async def send_confirmed(self, outputs: list[Output]) -> None:
        """`send`, but the completions go out first, in order, and this returns once the broker confirmed them: the
        worker report they follow from is acked only then. An LM killed before loses no run's end: the report is
        delivered again, to its successor, which forwards it to the run's GM."""
        completions = [o for o in outputs if isinstance(o, Send) and isinstance(o.msg, Completions)]
        if self.broker is None or not completions:
            self.send(outputs)
            return
        confirmed = [
            asyncio.ensure_future(self.publish(o.msg.gm, BrokerMessage.core_json(o.msg), confirmed=True))
            for o in completions
        ]
        self.send([o for o in outputs if not (isinstance(o, Send) and isinstance(o.msg, Completions))])
        await asyncio.gather(*confirmed)

    async def _timer(self, at: float, msg: object) -> None:
        await asyncio.sleep(max(0.0, at - time.time()))
        await self._tick(msg)

    async def publish(self, gm: int, body: bytes, confirmed: bool = False) -> None:
        """Publish `body` to GM `gm`'s queue, signed for that GM (docs/security.md, "Broker reports"); with
        `confirmed`, return only once the broker confirmed it (`Broker.publish_confirmed`)."""
        assert self.broker is not None, "the LM needs a broker to reach GMs"
        headers = None if self.signer is None else lm_report_headers(self.signer, gm, body)
        publish = self.broker.publish_confirmed if confirmed else self.broker.publish
        await publish("gm", gm_key(gm), body, headers)

    def send_to_workers(self, launch: WorkerLaunch) -> None:
        """One POST per agent, concurrently, split into several when its body would pass the agent's body limit
        (a task's command may be 64K characters): each part is launched, or reported lost, on its own, so one
        user's big tasks never fail another's. An agent that cannot be reached gets its tasks reported failed,
        never lost."""
        by_url: dict[str, list[Placement]] = {}
        for p in launch.launches:
            by_url.setdefault(self.members.node_worker[p.node], []).append(p)
        for url, placements in by_url.items():
            parts = WorkerLaunchModel.core_json_parts(WorkerLaunch(launch.lm, placements))
            if len(parts) > 1:
                log.info(
                    "launch of %d tasks on %s sent in %d parts (%s bytes), each under the body limit",
                    len(placements),
                    url,
                    len(parts),
                    "+".join(str(len(body)) for _, body in parts),
                    extra=ids(lm=launch.lm, worker=self.members.worker_of(placements[0].node)),
                )
            for part, body in parts:
                over = asyncio.get_running_loop().create_future()
                for p in part:
                    self._launching[p.task.task_id] = over
                self.spawn(self._post_to_worker(url, WorkerLaunch(launch.lm, part), body, over))

    async def launched(self, task_ids: list[str]) -> None:
        """Return once no launch call of these tasks to their agents is still going on."""
        going = {f for t in task_ids if (f := self._launching.get(t)) is not None and not f.done()}
        if going:
            await asyncio.wait(going)

    async def _post_to_worker(self, url: str, launch: WorkerLaunch, body: bytes, over: asyncio.Future[None]) -> None:
        """POST `launch` (whose JSON is `body`) to the agent at `url`, retried; its tasks are reported lost when
        the agent refuses it or stays unreachable. `over` is done once the call is over, however it ended."""
        try:
            await self._launch_on(url, launch, body)
        finally:
            over.set_result(None)
            for p in launch.launches:
                if self._launching.get(p.task.task_id) is over:
                    del self._launching[p.task.task_id]

    async def _launch_on(self, url: str, launch: WorkerLaunch, body: bytes) -> None:
        placements = launch.launches

        def failed(attempt: int, failure: str) -> None:
            log.warning(
                "launch of %d tasks on %s failed (attempt %d of %d): %s; tasks %s",
                len(placements),
                url,
                attempt,
                AGENT_LAUNCH.attempts,
                failure,
                [p.task.task_id for p in placements[:20]],
                extra=batch_ids(placements) | ids(lm=launch.lm, worker=self.members.worker_of(placements[0].node)),
            )

        send = partial(self.calls.post, f"{url}/v1/tasks", body, idempotent=True)
        outcome = await retry.call(send, AGENT_LAUNCH, "worker agent", failed, url)
        if outcome.succeeded:
            return
        r = outcome.reply
        refused = r is not None
        reason = f"worker agent {url} refused the launch: answered {r.status}: {r.text[:500]}" if r else outcome.failure
        await self._lose(placements, reason, self.members.worker_of(placements[0].node), not refused)
        if not refused:  # the agent may have started them after all (a call that timed out): they must not run on
            self.spawn(self.stop_on(url, [p.task.task_id for p in placements]))

    async def publish_events(
        self, outputs: list[Output], placed: dict[str, Placement], measured: dict[str, FinishedTask]
    ) -> None:
        if self.broker is None:
            return
        now = time.time()
        events = []
        for out in outputs:
            if not isinstance(out.msg, Completions):
                continue
            for c in out.msg.items:
                p = placed.get(c.task_id)
                if p is None:  # a forwarded end of a run this LM did not place: its GM checks it and publishes it
                    continue
                m = measured.get(c.task_id)
                kind = "preempted" if c.preempted else "lost" if c.lost else "failed" if c.error else "finished"
                events.append(
                    RunEvent(
                        kind,
                        c.task_id,
                        p.task.job_id,
                        p.lm,
                        p.node,
                        at=m.finished_at if m is not None and m.finished_at is not None else now,
                        cpu_seconds=m.cpu_seconds if m is not None else 0.0,
                        execution_delay=m.execution_delay if m is not None else 0.0,
                        process_overhead=m.process_overhead if m is not None else 0.0,
                        error=c.error,
                        attempt=p.task.attempt,
                        exit_code=c.exit_code,
                        run_number=p.task.run_number,
                    )
                )
        if events:
            await self.broker.publish("events", "", TaskEvents.core_json(events))

    async def stop_then_send(self, by_url: dict[str, list[str]], outputs: list[Output]) -> None:
        """Stop the victims on their agents (each reports them preempted), then launch the waiting task: on a real
        node the victims' CPU and memory are free before the new task takes them."""
        lm = self.settings.lm_id

        async def stop(url: str, task_ids: list[str]) -> None:
            await self.launched(task_ids)
            body = WorkerPreemptModel.core_json(WorkerPreempt(lm, task_ids))
            try:
                r = await self.calls.post(f"{url}/v1/preempt", body, idempotent=True)
                if r.status != 200:
                    log.warning("agent %s answered %d to a preemption: %s", url, r.status, r.text[:300])
            except CallError as exc:
                log.warning("agent %s unreachable for a preemption of %s: %s", url, task_ids, exc)

        await asyncio.gather(*(stop(url, ids) for url, ids in by_url.items()))
        self.send(outputs)

    async def stop_on(self, url: str, task_ids: list[str]) -> None:
        """Ask an agent to stop runs this LM reported lost (best effort: a stale run's result is ignored anyway,
        but it holds its node's resources at the agent until it ends)."""
        await self.launched(task_ids)
        body = WorkerPreemptModel.core_json(WorkerPreempt(self.settings.lm_id, task_ids))
        try:
            r = await self.calls.post(f"{url}/v1/preempt", body, idempotent=True)
            if r.status != 200:
                log.warning("agent %s answered %d when asked to stop lost tasks: %s", url, r.status, r.text[:300])
        except CallError as exc:
            log.warning("agent %s unreachable to stop lost tasks: %s", url, exc)


def batch_ids(placements: list[Placement]) -> dict[str, object]:
    """The log ids of several runs: lists of their jobs, tasks, GMs and nodes."""
    return ids(
        job=sorted({p.task.job_id for p in placements}),
        task=[p.task.task_id for p in placements],
        gm=sorted({p.gm for p in placements}),
        node=sorted({p.node for p in placements}),
    )
