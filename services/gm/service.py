"""The GM service's state: the cluster learnt from the LMs, the GM core, and its outputs turned into batched
launch calls to LMs."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time

from pydantic_core import to_json

from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.constraints import constraint_mask
from megha.common.core.gm import GlobalMaster
from megha.common.core.messages import LaunchBatch, Output, PreemptRequest, Send
from megha.common.core.placement.choice import make_choice
from megha.common.core.task import JobSpec
from megha.common.models import (
    BrokerMessage,
    JobSubmission,
    LaunchBatchModel,
    LaunchResponseModel,
    PreemptRequestModel,
    PreemptResponseModel,
)
from megha.common.settings import GMSettings
from megha.common.transport.rabbit import Broker
from megha.services.gm.jobs import JobTable
from megha.services.http import CallError, Reply, ServiceClient, spawn

log = logging.getLogger("megha.gm")


class DuplicateJob(ValueError):
    """A submission reuses a job id this GM already has."""


class GMService:
    def __init__(self, settings: GMSettings, broker: Broker | None = None) -> None:
        self.settings = settings
        self.broker = broker
        self.jobs = JobTable(settings.gm_id, settings.finished_tasks_kept)
        self.core: GlobalMaster | None = None
        self._lock = asyncio.Lock()
        self._calls = ServiceClient(settings.http_timeout)
        self._tasks: set[asyncio.Task[None]] = set()
        self._job_numbers = itertools.count()

    async def discover(self, timeout: float = 120.0) -> ClusterSpec:
        """Ask every LM for its partitions, waiting for LMs whose workers have not all registered yet."""
        rows = []
        deadline = time.monotonic() + timeout
        names: tuple[str, ...] = ()
        for lm, url in enumerate(self.settings.lm_urls):
            while True:
                try:
                    r = await self._calls.get(f"{url}/v1/cluster")
                    if r.status == 200:
                        break
                    reason = r.text
                except CallError as exc:
                    reason = str(exc)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"LM {lm} at {url} not ready after {timeout} s: {reason}")
                await asyncio.sleep(0.2)
            doc = json.loads(r.body)
            if doc["lm"] != lm:
                raise RuntimeError(f"{url} is LM {doc['lm']}, but it is listed as LM {lm}")
            names = tuple(doc["resource_names"])
            rows.append(
                tuple(
                    PartitionSpec(
                        lm,
                        p["gm"],
                        tuple(tuple(c) for c in p["capacities"]),
                        tuple(constraint_mask(ids) for ids in p["constraints"]),
                    )
                    for p in doc["partitions"]
                )
            )
        cluster = ClusterSpec(tuple(rows), names)
        self.adopt(cluster)
        return cluster

    def adopt(self, cluster: ClusterSpec) -> None:
        """Build the GM core over `cluster`, all free: the LMs' deltas and responses correct the view from here."""
        self.core = GlobalMaster(
            self.settings.gm_id,
            cluster,
            make_choice(self.settings.matching),
            self.settings.seed,
            self.jobs,
            self.settings.fairness(),
            self.settings.max_attempts,
        )
        log.info("view of %d nodes on %d LMs x %d partitions", cluster.num_nodes, cluster.num_lms, cluster.num_gms)

    async def submit(self, sub: JobSubmission, arrived: float) -> JobSpec:
        """Queue a job that reached the GM at unix time `arrived` (its `submitted_at`, and every task's arrival in
        the job table); raises Unschedulable (a 422) when some task could never run anywhere."""
        assert self.core is not None
        job_id = sub.job_id
        if job_id is None:
            job_id = f"g{self.settings.gm_id}-{next(self._job_numbers)}"
            while job_id in self.jobs.jobs:  # a client may have chosen this name
                job_id = f"g{self.settings.gm_id}-{next(self._job_numbers)}"
        elif job_id in self.jobs.jobs:
            raise DuplicateJob(f"job {job_id} already exists")
        job = JobSpec(job_id, sub.to_tasks(job_id, self.core.resource_names), arrived)
        async with self._lock:
            outputs = self.core.submit(job, time.time())
        self._dispatch(outputs)
        await asyncio.sleep(0)  # the launch calls go out before the submission is answered
        return job

    async def on_broker_message(self, body: bytes) -> None:
        msg = BrokerMessage.model_validate_json(body)
        assert self.core is not None
        now = time.time()
        if msg.completions is not None:
            core_msg: object = msg.completions.to_core()
        elif msg.delta is not None:
            core_msg = msg.delta.to_core()
        else:
            return
        async with self._lock:
            outputs = self.core.handle(core_msg, now)
        self._dispatch(outputs)

    def _dispatch(self, outputs: list[Output]) -> None:
        if self.jobs.ended_here:
            spawn(self._tasks, self._publish_ends())
        for out in outputs:
            if isinstance(out, Send) and isinstance(out.msg, LaunchBatch | PreemptRequest):
                call = self._launch(out.msg) if isinstance(out.msg, LaunchBatch) else self._preempt(out.msg)
                spawn(self._tasks, call)
            else:
                raise TypeError(f"GM cannot send {out!r}")

    async def _publish_ends(self) -> None:
        """Publish a task event for each end no LM announced: tasks this GM gave up on, and runs a rebuilt LM
        forwarded (it had not placed them, so it could not tell a stale copy from the run the GM knows)."""
        ended, self.jobs.ended_here = self.jobs.ended_here, []
        if self.broker is None or not ended:
            return
        now = time.time()
        events = [
            {
                "kind": kind,
                "task_id": task.task_id,
                "job_id": task.job_id,
                "lm": lm,
                "node": node,
                "at": now,
                "error": reason,
                "attempt": task.attempt,
            }
            for task, kind, reason, lm, node in ended
        ]
        await self.broker.publish("events", "", to_json({"events": events}))

    async def _launch(self, batch: LaunchBatch) -> None:
        """POST the batch to its LM. Launch is idempotent per task at the LM (an LM rebuilt after a crash knows
        what its agents run), so transport errors and 5xx answers are retried for up to MEGHA_LM_TIMEOUT seconds:
        an LM that restarts in that time gets the batch."""
        url = self.settings.lm_urls[batch.lm]
        body = LaunchBatchModel.core_json(batch)
        r: Reply | None = None
        failure = ""
        deadline = time.monotonic() + self.settings.lm_timeout
        attempt = 0
        while True:
            attempt += 1
            try:
                r = await self._calls.post(f"{url}/v1/launch", body)
            except CallError as exc:
                failure = f"LM {batch.lm} unreachable at {url}: {exc}"
            else:
                if r.status == 200:
                    break
                failure = f"LM {batch.lm} answered {r.status}: {r.text[:500]}"
                if r.status < 500 and r.status != 429:
                    break  # the LM refused the batch itself: retrying cannot help
            if time.monotonic() > deadline:
                failure += f" (for {self.settings.lm_timeout:g} s)"
                break
            if attempt == 1 or attempt % 10 == 0:
                log.warning("launch batch %d to LM %d failed (attempt %d): %s", batch.seq, batch.lm, attempt, failure)
            await asyncio.sleep(min(0.1 * 2 ** min(attempt - 1, 5), 2.0))
        if r is None or r.status != 200:
            async with self._lock:
                assert self.core is not None
                outputs = self.core.call_failed(batch.lm, batch.seq, failure, time.time())
            self._dispatch(outputs)
            return
        response = LaunchResponseModel.model_validate_json(r.body).to_core()
        assert self.core is not None
        async with self._lock:
            outputs = self.core.handle(response, time.time())
        self._dispatch(outputs)

    async def _preempt(self, req: PreemptRequest) -> None:
        """POST a preemption request to its LM; an LM that cannot be reached counts as refusing it (the core
        then asks the next LM or parks the task). Not retried: a repeat could preempt twice."""
        url = self.settings.lm_urls[req.lm]
        try:
            r = await self._calls.post(f"{url}/v1/preempt", PreemptRequestModel.core_json(req))
        except CallError as exc:
            failure = f"LM {req.lm} unreachable at {url}: {exc}"
        else:
            if r.status == 200:
                response = PreemptResponseModel.model_validate_json(r.body).to_core()
                if response.placement is not None:
                    self.jobs.placed_by_preemption(response.placement)
                    log.info(
                        "task %s (user %s) runs on LM %d node %d after preempting %s",
                        req.task.task_id,
                        req.task.user,
                        req.lm,
                        response.placement.node,
                        response.preempted,
                    )
                else:
                    log.info("LM %d refused to preempt for %s: %s", req.lm, req.task.task_id, response.reason)
                assert self.core is not None
                async with self._lock:
                    outputs = self.core.handle(response, time.time())
                self._dispatch(outputs)
                return
            failure = f"LM {req.lm} answered {r.status}: {r.text[:500]}"
        log.warning("preemption request %d to LM %d failed: %s", req.seq, req.lm, failure)
        assert self.core is not None
        async with self._lock:
            outputs = self.core.call_failed(req.lm, req.seq, failure, time.time())
        self._dispatch(outputs)

    def queues(self) -> list[dict[str, object]]:
        """Every configured queue with this GM's view of its usage (exact for its own queues)."""
        assert self.core is not None
        book = self.core.book
        if book is None:
            return []
        return [
            {
                "user": q.user,
                "share": q.share,
                "gm": q.gm,
                "own": q.user in book.own,
                "usage": list(book.usage(q.user)),
                "consumption": round(book.consumption(q.user), 6),
                "below_share": book.below_share(q.user),
                "demand": list(book.demand[q.user]) if q.user in book.own else None,
            }
            for q in book.config.queues
        ]

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self._calls.aclose()
