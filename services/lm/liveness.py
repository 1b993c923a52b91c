"""An LM's watch over its agents: an agent silent past MEGHA_WORKER_TIMEOUT whose health check fails too is taken
out of service with its nodes (its runs reported lost, for their GMs to run again); heard from again, it is asked
to stop those runs, and its nodes come back once it runs nothing."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING

from megha.common.core.liveness import Heard
from megha.common.transport.rabbit import run_background
from megha.services.client import CallError
from megha.services.lm.dispatch import batch_ids
from megha.services.logs import ids

if TYPE_CHECKING:
    from megha.services.lm.service import LMService

log = logging.getLogger("megha.lm")


class AgentWatch:
    """Liveness of the agents of `lm` (its core, lock, membership and dispatch)."""

    def __init__(self, lm: LMService) -> None:
        self.lm = lm

    async def heard(self, worker_id: str, running: int) -> None:
        """A heartbeat of agent `worker_id`, running `running` tasks."""
        heard = self.lm.members.liveness.heard(worker_id, running, time.monotonic())
        if heard is Heard.BRING_BACK:
            await self._bring_back(worker_id)
        elif heard is Heard.STOP_LOST:
            # Alive after all (cut off, not dead): its tasks were reported lost, so they must not run on; its
            # nodes come back once it runs nothing.
            self.lm.dispatch.spawn(self._stop_lost(worker_id))

    async def watch_workers(self) -> None:
        """Check the agents' heartbeats every few seconds (runs until cancelled; a failed check is logged)."""
        every = min(self.lm.settings.worker_timeout / 4, 5.0)
        await asyncio.sleep(every)
        await run_background("checking worker agents", self.check_workers, every)

    async def check_workers(self) -> None:
        """Take out of service the nodes of every agent silent for more than MEGHA_WORKER_TIMEOUT seconds whose
        health check fails too, and report their tasks failed (an agent that answers is kept: its heartbeats
        are only late)."""
        if self.lm.core is None:
            return
        for worker_id, silent in self.lm.members.liveness.suspects(time.monotonic()):
            url = self.lm.members.agent_nodes[worker_id][0]
            if await self.answers(worker_id):
                log.warning("no heartbeat from %s for %.0f s, but it answers at %s: keeping it", worker_id, silent, url)
                self.lm.members.liveness.answered(worker_id, time.monotonic())
                continue
            await self.take_down(worker_id, f"worker agent {worker_id} at {url} silent for {silent:.0f} s")

    async def answers(self, worker_id: str) -> bool:
        """Whether agent `worker_id` answers its health check."""
        return await self.answers_at(self.lm.members.agent_nodes[worker_id][0])

    async def answers_at(self, url: str, worker_id: str | None = None, timeout: float | None = None) -> bool:
        """Whether the agent at `url` answers its health check (as `worker_id`, if given; within `timeout` s, if
        given, else the calls' own)."""
        try:
            call = self.lm.calls.get(f"{url}/healthz")
            r = await (call if timeout is None else asyncio.wait_for(call, timeout))
            return r.status == 200 and (worker_id is None or json.loads(r.body).get("worker") == worker_id)
        except (CallError, TimeoutError, ValueError, AttributeError):
            return False

    async def take_down(self, worker_id: str, reason: str) -> None:
        """Take agent `worker_id`'s nodes out of service and report its tasks lost (their GMs run them again,
        elsewhere or once it is back); they come back into service once it is heard again running nothing."""
        assert self.lm.core is not None
        _, nodes = self.lm.members.agent_nodes[worker_id]
        async with self.lm._lock:
            lost = [p for p in self.lm.core.tasks_on(nodes) if p.node not in self.lm.core.down]
            outputs = self.lm.core.take_down(list(nodes), reason, time.time())
        self.lm.members.liveness.taken_down(worker_id, [p.task.task_id for p in lost])
        log.error(
            "%s: worker agent %s taken out of service with its nodes %d..%d; %d tasks lost (their GMs run them "
            "again): %s",
            reason,
            worker_id,
            nodes.start,
            nodes.stop - 1,
            len(lost),
            [p.task.task_id for p in lost[:20]],
            extra=batch_ids(lost) | ids(lm=self.lm.settings.lm_id, worker=worker_id, node=list(nodes)),
        )
        self.lm.dispatch.send(outputs)
        await self.lm.dispatch.publish_events(outputs, {p.task.task_id: p for p in lost}, {})

    async def _stop_lost(self, worker_id: str) -> None:
        """Ask an agent that was found silent and is heard from again to stop the tasks reported failed then."""
        url = self.lm.members.agent_nodes[worker_id][0]
        task_ids = self.lm.members.liveness.lost.get(worker_id, [])
        log.warning(
            "worker agent %s is back with tasks running; stopping the %d it lost: %s",
            worker_id,
            len(task_ids),
            task_ids[:20],
            extra=ids(lm=self.lm.settings.lm_id, worker=worker_id, task=task_ids),
        )
        await self.lm.dispatch.stop_on(url, task_ids)
        self.lm.members.liveness.asked_to_stop(worker_id)  # the next heartbeat still showing tasks asks again

    async def _bring_back(self, worker_id: str) -> None:
        assert self.lm.core is not None
        _, nodes = self.lm.members.agent_nodes[worker_id]
        async with self.lm._lock:
            outputs = self.lm.core.bring_up(list(nodes), time.time())
        self.lm.members.liveness.brought_back(worker_id)
        log.info(
            "worker agent %s is back with nothing running: its nodes %d..%d are in service",
            worker_id,
            nodes.start,
            nodes.stop - 1,
            extra=ids(lm=self.lm.settings.lm_id, worker=worker_id, node=list(nodes)),
        )
        self.lm.dispatch.send(outputs)
