"""The GM service's state: the cluster learnt from the LMs, the GM core, and its outputs turned into batched
launch calls to LMs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from pydantic_core import to_json

from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.constraints import constraint_mask
from megha.common.core.gm import GlobalMaster, Unschedulable
from megha.common.core.messages import (
    Delta,
    LaunchBatch,
    LaunchResponse,
    NodeState,
    Output,
    PreemptRequest,
    Send,
    StopRequest,
)
from megha.common.core.observer import observe
from megha.common.core.placement.choice import make_choice
from megha.common.core.recovery import LMReport, RunsHeld, plan_recovery, runs_lost
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.lifecycle import StartupError, check_stop
from megha.common.models import (
    BrokerMessage,
    ErrorBody,
    GMRecovery,
    JobStatus,
    JobSubmission,
    LaunchBatchModel,
    LaunchResponseModel,
    LMRebuilt,
    PreemptRequestModel,
    PreemptResponseModel,
    StopRequestModel,
)
from megha.common.settings import GMSettings
from megha.common.transport.rabbit import Broker, TryLater
from megha.services.gm.jobs import ENDED, JobTable
from megha.services.gm.journal import Journal, Replayed
from megha.services.gm.peers import Replicator
from megha.services.http import CallError, Reply, ServiceClient, ids, spawn
from megha.services.metrics import GMMeter

log = logging.getLogger("megha.gm")


class DuplicateJob(ValueError):
    """A submission reuses a job id this GM already has."""


class TooManyUnfinished(RuntimeError):
    """The job's user holds MEGHA_MAX_UNFINISHED_TASKS_PER_USER unfinished tasks here already (a 429)."""


class NotServing(RuntimeError):
    """This GM identity is being taken back or handed over: submissions are answered 503 meanwhile."""


class GMService:
    def __init__(
        self, settings: GMSettings, broker: Broker | None = None, journal: Path | None = None, holder: int | None = None
    ) -> None:
        """A peer standing in for GM `settings.gm_id` is its `holder` and works on its copy of that GM's
        `journal`."""
        self.settings = settings
        self.holder = settings.gm_id if holder is None else holder
        self.broker = broker
        self._journal_path = journal
        self.journal: Journal | None = None
        self.replicator: Replicator | None = None  # the journal's copy at the next GM, when peers are configured
        self.jobs = JobTable(settings.gm_id, settings.finished_tasks_kept, self._journal_end)
        self.meter = GMMeter()  # scheduling attempts and allocation times, for GET /metrics
        self.observer = observe(self.jobs, self.meter)  # what the GM core reports goes to both
        self.core: GlobalMaster | None = None
        self.cluster: ClusterSpec | None = None
        # Fencing (megha.common.core.fencing): the term this GM identity was claimed with at every LM; `serving`
        # is cleared once an LM says a newer holder took the identity over, and `on_superseded` is told.
        self.term = 0
        self.serving = True
        self.on_superseded: Callable[[str], None] | None = None
        self._lock = asyncio.Lock()
        self._calls = ServiceClient(settings.http_timeout, authorization=settings.credentials())
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting: set[str] = set()  # job ids being journaled
        self._reserved: dict[str, int] = {}  # tasks of jobs being journaled, per user (the submission bound)

    async def discover(self) -> ClusterSpec:
        """Ask every LM for its partitions, waiting (MEGHA_LM_TIMEOUT) for LMs whose workers have not all
        registered yet."""
        timeout = self.settings.lm_timeout
        rows = []
        deadline = time.monotonic() + timeout
        next_note = time.monotonic() + 2.0
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
                check_stop(f"LM {lm} at {url}")
                if time.monotonic() > deadline:
                    raise StartupError(f"LM {lm} at {url} not ready after {timeout:g} s: {reason}")
                if time.monotonic() >= next_note:
                    log.warning("waiting for LM %d at %s: %s", lm, url, reason)
                    next_note = time.monotonic() + 5.0
                await asyncio.sleep(0.2)
            doc = json.loads(r.body)
            if doc["lm"] != lm:
                raise StartupError(f"{url} is LM {doc['lm']}, but it is listed as LM {lm}")
            names = tuple(doc["resource_names"])
            rows.append(
                tuple(
                    PartitionSpec(
                        lm,
                        p["gm"],
                        tuple(tuple(c) for c in p["capacities"]),
                        tuple(constraint_mask(ids) for ids in p["constraints"]),
                        tuple(tuple(d) for d in p.get("drivers", ())),  # an LM from before drivers: burn only
                    )
                    for p in doc["partitions"]
                )
            )
        cluster = ClusterSpec(tuple(rows), names)
        self.adopt(cluster)
        return cluster

    async def task_logs(self, lm: int, node: int, task_id: str, query: str) -> Reply:
        """LM `lm`'s answer to `GET /v1/nodes/{node}/tasks/{task_id}/logs?{query}`: the output a run of the task
        left on the agent of that node. Raises CallError when the LM cannot be reached."""
        url = f"{self.settings.lm_urls[lm]}/v1/nodes/{node}/tasks/{quote(task_id, safe='')}/logs?{query}"
        return await self._calls.get(url)

    def adopt(self, cluster: ClusterSpec) -> None:
        """Build the GM core over `cluster`, all free: the LMs' deltas and responses correct the view from here."""
        self.cluster = cluster
        self.core = GlobalMaster(
            self.settings.gm_id,
            cluster,
            make_choice(self.settings.matching),
            self.settings.seed,
            self.observer,
            self.settings.fairness(),
            self.settings.max_attempts,
        )
        log.info("view of %d nodes on %d LMs x %d partitions", cluster.num_nodes, cluster.num_lms, cluster.num_gms)

    async def submit(self, sub: JobSubmission, arrived: float) -> JobSpec:
        """Queue a job that reached the GM at unix time `arrived` (its `submitted_at`, and every task's arrival in
        the job table); raises Unschedulable (a 422) when some task could never run anywhere."""
        core = self.core
        assert core is not None
        job_id = sub.job_id
        assert job_id is not None, "the GM route names every job (JobIds, or the id the user chose)"
        if job_id in self.jobs.jobs or job_id in self._accepting:
            raise DuplicateJob(f"job {job_id} already exists")
        if not self.serving:
            raise NotServing(f"GM {self.settings.gm_id} is changing hands; submit again in a few seconds")
        job = JobSpec(job_id, sub.to_tasks(job_id, core.resource_names), arrived)
        core.admit(job, arrived)  # a job that can never run is refused before it is journaled
        self._check_bound(sub.user, len(job.tasks))
        self._accepting.add(job_id)  # a resent submission arriving meanwhile is a duplicate
        self._reserved[sub.user] = self._reserved.get(sub.user, 0) + len(job.tasks)  # held while journaling
        try:
            if self.journal is not None:  # on disk (here, and at the peer that would stand in) before the answer
                record = sub.model_dump(mode="json", exclude_defaults=True) | {"job_id": job_id}
                line = await self.journal.append_durably({"job": record, "at": arrived})
                if self.replicator is not None:
                    await self.replicator.add_durably(line)
            async with self._lock:
                if self.core is not core or not self.serving:
                    return job  # this identity changed hands meanwhile: its next holder recovers the job
                outputs = core.submit(job, time.time())
        finally:
            self._accepting.discard(job_id)
            self._reserved[sub.user] -= len(job.tasks)
            if not self._reserved[sub.user]:
                del self._reserved[sub.user]
        self._dispatch(outputs)
        await asyncio.sleep(0)  # the launch calls go out before the submission is answered
        return job

    def _check_bound(self, user: str, tasks: int) -> None:
        """Submission is bounded per user (MEGHA_MAX_UNFINISHED_TASKS_PER_USER): Unschedulable (422) for a job
        that could never fit under the bound, TooManyUnfinished (429) for one that must wait for tasks to end."""
        limit = self.settings.max_unfinished_tasks_per_user
        if not limit:
            return
        if tasks > limit:
            raise Unschedulable(
                f"a job of {tasks:,} tasks exceeds MEGHA_MAX_UNFINISHED_TASKS_PER_USER={limit:,} "
                f"of GM {self.settings.gm_id}"
            )
        held = self.jobs.open_by_user.get(user, 0) + self._reserved.get(user, 0)
        if held + tasks > limit:
            raise TooManyUnfinished(
                f"user {user!r} has {held:,} unfinished tasks at GM {self.settings.gm_id}; {tasks:,} more would exceed "
                f"MEGHA_MAX_UNFINISHED_TASKS_PER_USER={limit:,}: submit again once some have ended"
            )

    async def cancel(self, job_id: str) -> JobStatus | None:
        """Cancel a job (None when this GM does not hold it): durably noted in the journal, its queued tasks
        dropped at once, and its placed ones stopped at their LMs (they end cancelled when the LM reports the
        stop). A job that ended, or was cancelled already, is left as it is."""
        core = self.core
        assert core is not None
        job = self.jobs.jobs.get(job_id)
        if job is None:
            return None
        if job.cancelled or not job.open:
            return self.jobs.status(job_id)
        if not self.serving:
            raise NotServing(f"GM {self.settings.gm_id} is changing hands; cancel again in a few seconds")
        if self.journal is not None:
            line = await self.journal.append_durably({"cancel": job_id, "at": time.time()})
            if self.replicator is not None:
                await self.replicator.add_durably(line)
        async with self._lock:
            if self.core is not core or not self.serving:
                raise NotServing(f"GM {self.settings.gm_id} changed hands; cancel again in a few seconds")
            job.cancelled = True
            outputs = self._cancel_open(job_id)
        self._dispatch(outputs)
        return self.jobs.status(job_id)

    def _cancel_open(self, job_id: str) -> list[Output]:
        """Cancel in the core the tasks of `job_id` that did not end (under the lock)."""
        assert self.core is not None
        job = self.jobs.jobs[job_id]
        open_tasks = [tid for tid in job.task_ids if self.jobs.tasks[tid].state not in ENDED]
        placed = [tid for tid in open_tasks if self.jobs.tasks[tid].state == "launched"]
        log.info(
            "job %s of user %s cancelled: %d tasks dropped from the queue, %d placed ones to be stopped at their "
            "LMs: %s",
            job_id,
            job.user,
            len(open_tasks) - len(placed),
            len(placed),
            placed[:20],
            extra=ids(job=job_id, user=job.user, gm=self.settings.gm_id, task=open_tasks),
        )
        return self.core.cancel(open_tasks, time.time())

    # ---------------------------------------------------------------- recovery

    def journal_path(self) -> Path:
        if self._journal_path is not None:
            return self._journal_path
        return Path(self.settings.journal_dir) / f"{self.settings.run_id}.gm-{self.settings.gm_id}.journal"

    def _journal_end(self, task_id: str, state: str, reason: str) -> None:
        if self.journal is not None:
            line = self.journal.append({"end": task_id, "state": state, "reason": reason})
            if self.replicator is not None:
                self.replicator.add(line)

    def _restore_end(self, task_id: str, state: str, reason: str, now: float) -> None:
        """A task end this GM learnt while recovering (from its journal or an LM), not from its core."""
        self.jobs.restore_end(task_id, state, reason, now)
        self.meter.ended(task_id)

    async def recover(self) -> None:
        """Rebuild this GM after a start: its view from every LM's full state, its job table from its journal, and
        its queue from the accepted tasks that no LM runs and that did not end (nothing running or finished is
        launched again). Then keep journaling, with the journal rewritten to what is still held."""
        assert self.core is not None
        replayed = Journal.replay(self.journal_path()) if self.settings.journal_dir else None
        states = await self._claim()
        now = time.time()
        tasks: list[TaskSpec] = []
        ended: set[str] = set()  # accepted tasks the journal shows ended
        if replayed is not None:
            if replayed.damaged:
                log.warning("journal %s: %d damaged lines skipped", self.journal_path(), replayed.damaged)
            for record, arrived in replayed.jobs:
                sub = JobSubmission.model_validate(record)
                job_id = sub.job_id or ""
                job = JobSpec(job_id, sub.to_tasks(job_id, self.core.resource_names), arrived)
                if job_id in self.jobs.jobs:
                    continue
                self.observer.job_arrived(job, self.settings.gm_id, arrived)
                tasks.extend(job.tasks)
            # Read from the journal, not the job table: restoring the ends forgets finished jobs (their tasks too)
            # beyond MEGHA_FINISHED_TASKS_KEPT, as it did when they ended.
            ended = {t.task_id for t in tasks if t.task_id in replayed.ends}
            for task_id, (how, reason) in replayed.ends.items():
                self._restore_end(task_id, how, reason, now)
        reports = [
            LMReport(
                s.delta.to_core(), [p.to_core() for p in s.running], [(r.task_id, r.attempt, r.error) for r in s.ended]
            )
            for s in states
        ]
        plan = plan_recovery(self.settings.gm_id, tasks, ended, reports)
        for task_id, reason in plan.ended.items():  # ends the journal missed, remembered by an LM
            self._restore_end(task_id, "failed" if reason else "finished", reason, now)
        self.observer.decided(plan.running, now)
        cancels = {job_id for job_id in (replayed.cancels if replayed is not None else ()) if job_id in self.jobs.jobs}
        for job_id in cancels:
            self.jobs.jobs[job_id].cancelled = True
        queued = [t for t in plan.queued if t.job_id not in cancels]
        for task in plan.queued:
            if task.job_id in cancels:  # cancelled before the crash, while still queued
                self.observer.task_cancelled(task, now)
        async with self._lock:
            outputs = self.core.recover(plan.deltas, plan.running, queued, now)
            for job_id in cancels:  # their runs the LMs still hold are stopped now
                if job_id in self.jobs.jobs:  # a job whose last tasks were just cancelled may be forgotten already
                    outputs += self._cancel_open(job_id)
        if replayed is not None:
            self.journal = Journal(self.journal_path())
            self.journal.rewrite(self._journal_records(replayed))
            if self.replicator is not None:
                self.replicator.behind = True  # the peer's copy is rebuilt from the rewritten journal
        self.serving = True  # submissions were refused (503) from the claim until here
        self._dispatch(outputs)
        if replayed is not None:
            log.info(
                "recovered %d jobs from %s: %d tasks running on LMs, %d queued again, %d ended",
                len(self.jobs.jobs),
                self.journal_path(),
                len(plan.running),
                len(plan.queued),
                len(ended) + len(plan.ended),
            )

    def _journal_records(self, replayed: Replayed) -> list[dict[str, object]]:
        """The journal's records for the jobs the table still holds (forgotten finished jobs are dropped)."""
        records: list[dict[str, object]] = []
        for record, arrived in replayed.jobs:
            job = self.jobs.jobs.get(str(record.get("job_id")))
            if job is None:
                continue
            records.append({"job": record, "at": arrived})
            if job.cancelled:
                records.append({"cancel": record.get("job_id"), "at": arrived})
            for tid in job.task_ids:
                rec = self.jobs.tasks[tid]
                if rec.state in ENDED:
                    records.append({"end": tid, "state": rec.state, "reason": rec.failed_reason or ""})
        return records

    async def _claim(self) -> list[GMRecovery]:
        """Claim this GM identity at every LM with a term above any they have seen for it, which fences the holder
        before (a stalled or cut-off GM, or a peer that stood in for it), and return each LM's state of that
        moment. Two claimants racing for a term retry with a higher one."""
        gm = self.settings.gm_id
        while True:
            seen = [await self._lm_call(lm, "GET", f"/v1/gms/{gm}/state") for lm in range(len(self.settings.lm_urls))]
            self.term = max([self.term, *(GMRecovery.model_validate_json(r.body).term for r in seen)]) + 1
            claim = to_json({"term": self.term, "by": self.holder})
            states = []
            for lm in range(len(self.settings.lm_urls)):
                r = await self._lm_call(lm, "POST", f"/v1/gms/{gm}/claim", claim, (409,))
                if r.status == 409:
                    log.warning("claiming GM %d with term %d at LM %d: %s; again", gm, self.term, lm, r.text[:200])
                    break
                states.append(GMRecovery.model_validate_json(r.body))
            else:
                log.info("GM %d claimed with term %d at every LM", gm, self.term)
                return states

    async def _lm_call(
        self, lm: int, method: str, path: str, body: bytes | None = None, ok: tuple[int, ...] = ()
    ) -> Reply:
        url = f"{self.settings.lm_urls[lm]}{path}"
        try:
            r = await self._calls.request(method, url, body)
        except CallError as exc:
            raise StartupError(f"LM {lm} unreachable at {url}: {exc}") from None
        if r.status != 200 and r.status not in ok:
            raise StartupError(f"LM {lm} answered {r.status} at {url}: {r.text[:300]}")
        return r

    def reset(self) -> None:
        """Forget what this GM identity held (its core, job table and calls in flight) before recovering it
        again: it was fenced while stalled or cut off, and takes its identity back from the LMs and its journal."""
        self.serving = False
        for task in list(self._tasks):
            task.cancel()
        if self.journal is not None:
            self.journal.close()
            self.journal = None
        self.jobs = JobTable(self.settings.gm_id, self.settings.finished_tasks_kept, self._journal_end)
        self.meter = GMMeter()
        self.observer = observe(self.jobs, self.meter)
        self.adopt(self.cluster)

    def _superseded(self, reason: str) -> None:
        """An LM refused a call: another holder claimed this GM identity with a newer term. Stop acting as it."""
        if not self.serving:
            return
        self.serving = False
        log.warning("GM %d (term %d) stops serving: %s", self.settings.gm_id, self.term, reason)
        if self.on_superseded is not None:
            self.on_superseded(reason)

    async def on_broker_message(self, body: bytes) -> None:
        msg = BrokerMessage.model_validate_json(body)
        if not self.serving:
            raise TryLater(f"GM {self.settings.gm_id} is changing hands")
        assert self.core is not None
        now = time.time()
        if msg.completions is not None:
            core_msg: object = msg.completions.to_core()
        elif msg.delta is not None:
            core_msg = msg.delta.to_core()
        elif msg.lm_rebuilt is not None:
            await self._runs_lost_with(msg.lm_rebuilt)
            return
        else:
            return
        async with self._lock:
            outputs = self.core.handle(core_msg, now)
        self._dispatch(outputs)

    async def _runs_lost_with(self, rebuilt: LMRebuilt) -> None:
        """LM `rebuilt.lm` came back from a crash: run again this GM's runs there that it neither holds nor saw
        end. The LM's state is read under this GM's lock, so every run this GM counts as running there was
        accepted before that read."""
        assert self.core is not None
        url = f"{self.settings.lm_urls[rebuilt.lm]}/v1/gms/{self.settings.gm_id}/state"
        async with self._lock:
            try:
                r = await self._calls.get(url)
            except CallError as exc:
                raise TryLater(f"LM {rebuilt.lm} unreachable: {exc}") from None
            if r.status != 200:
                raise TryLater(f"LM {rebuilt.lm} answered {r.status}")
            state = GMRecovery.model_validate_json(r.body)
            if state.incarnation != rebuilt.incarnation:
                return  # rebuilt again since: its own announcement follows
            known = frozenset([p.task.task_id for p in state.running] + [e.task_id for e in state.ended])
            lost = runs_lost(self.core.running, RunsHeld(rebuilt.lm, self.settings.gm_id, rebuilt.incarnation, known))
            if lost is None:
                return
            lost_ids = [c.task_id for c in lost.items]
            log.warning(
                "LM %d came back without %d runs of this GM: they run again (%s)",
                rebuilt.lm,
                len(lost_ids),
                lost_ids[:20],
                extra=ids(
                    job=sorted({self.core.running[t].task.job_id for t in lost_ids}),
                    task=lost_ids,
                    gm=self.settings.gm_id,
                    lm=rebuilt.lm,
                ),
            )
            outputs = self.core.handle(lost, time.time())
        self._dispatch(outputs)

    def _dispatch(self, outputs: list[Output]) -> None:
        if not self.serving:
            return  # the next holder recovers these tasks from the LMs and the journal
        if self.jobs.ended_here:
            spawn(self._tasks, self._publish_ends())
        for out in outputs:
            if not isinstance(out, Send):
                raise TypeError(f"GM cannot send {out!r}")
            if isinstance(out.msg, LaunchBatch):
                spawn(self._tasks, self._launch(out.msg))
            elif isinstance(out.msg, PreemptRequest):
                spawn(self._tasks, self._preempt(out.msg))
            elif isinstance(out.msg, StopRequest):
                spawn(self._tasks, self._stop(out.msg))
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
        what its agents run), so the call is retried (`_post_retrying`): an LM that restarts in MEGHA_LM_TIMEOUT
        seconds gets the batch.

        A batch whose body would pass the LM's body limit (tasks' commands may be 64K characters each) goes as
        several calls, one after the other, each with some of its placements and the batch's `seq` (the LM applies
        each as it comes; it needs nothing else of a batch), and their answers are merged into the one
        `LaunchResponse` the core awaits for the batch (`_merged`). So a user's big tasks never make another's
        fail with a 413. A call that fails for good fails the whole batch (`call_failed`), as an unanswered call of a
        batch in one part does: the LM may have launched what an earlier call carried, as it may have launched
        the tasks of a call whose answer was lost."""
        parts = LaunchBatchModel.core_json_parts(batch)
        if len(parts) > 1:
            log.info(
                "launch batch %d of %d tasks to LM %d sent in %d parts (%s bytes), each under the body limit",
                batch.seq,
                len(batch.placements),
                batch.lm,
                len(parts),
                "+".join(str(len(body)) for _, body in parts),
                extra=ids(gm=batch.gm, lm=batch.lm),
            )
        answers: list[LaunchResponse] = []
        r: Reply | None = None
        failure = ""
        for k, (_, body) in enumerate(parts):
            what = f"launch batch {batch.seq}" + (f" (part {k + 1} of {len(parts)})" if len(parts) > 1 else "")
            r, failure = await self._post_retrying(batch.lm, "/v1/launch", body, what)
            if r is None or r.status != 200:
                break
            answers.append(LaunchResponseModel.model_validate_json(r.body).to_core())
        if r is not None and _fenced(r):
            return
        if r is None or r.status != 200:
            tasks = [p.task for p in batch.placements]
            log.warning(
                "gave up launch batch %d of %d tasks at LM %d (they are queued again or failed): %s; tasks %s",
                batch.seq,
                len(tasks),
                batch.lm,
                failure,
                [t.task_id for t in tasks[:20]],
                extra=ids(
                    job=sorted({t.job_id for t in tasks}),
                    task=[t.task_id for t in tasks],
                    gm=batch.gm,
                    lm=batch.lm,
                    node=sorted({p.node for p in batch.placements}),
                ),
            )
            async with self._lock:
                assert self.core is not None
                outputs = self.core.call_failed(batch.lm, batch.seq, failure, time.time())
            self._dispatch(outputs)
            return
        response = answers[0] if len(answers) == 1 else _merged(answers)
        assert self.core is not None
        async with self._lock:
            outputs = self.core.handle(response, time.time())
        self._dispatch(outputs)

    async def _stop(self, req: StopRequest) -> None:
        """POST the runs of cancelled jobs to stop to their LM. Stopping is idempotent there (a run it no longer
        holds is left alone), so the call is retried (`_post_retrying`); a run its LM never got the stop for ends
        as it ends (finished or failed), never twice."""
        what = f"stop of {len(req.runs)} runs"
        r, failure = await self._post_retrying(req.lm, "/v1/stop", StopRequestModel.core_json(req), what)
        if r is None or (r.status != 200 and not _fenced(r)):
            log.error(
                "gave up the %s of cancelled jobs at LM %d: %s; runs %s",
                what,
                req.lm,
                failure,
                req.runs[:20],
                extra=ids(task=[t for t, _ in req.runs], gm=req.gm, lm=req.lm),
            )

    async def _post_retrying(self, lm: int, path: str, body: bytes, what: str) -> tuple[Reply | None, str]:
        """POST an idempotent call to LM `lm` with this GM's term, retrying transport errors, 5xx and 429 with
        backoff for up to MEGHA_LM_TIMEOUT seconds. Returns the last reply (None if none came) and, unless it is a
        200, why the call failed. A 409 naming the term (a newer holder fenced this GM) stops serving at once."""
        url = self.settings.lm_urls[lm]
        r: Reply | None = None
        failure = ""
        deadline = time.monotonic() + self.settings.lm_timeout
        attempt = 0
        while True:
            attempt += 1
            try:
                r = await self._calls.post(f"{url}{path}?term={self.term}", body)
            except CallError as exc:
                failure = f"LM {lm} unreachable at {url}: {exc}"
            else:
                if r.status == 200:
                    return r, ""
                if _fenced(r):
                    self._superseded(f"LM {lm} refused {what}: {r.text[:300]}")
                    return r, f"fenced: {r.text[:300]}"
                failure = f"LM {lm} answered {r.status}: {r.text[:500]}"
                if r.status < 500 and r.status != 429:
                    return r, failure  # the LM refused the call itself: retrying cannot help
            if time.monotonic() > deadline:
                return r, failure + f" (for {self.settings.lm_timeout:g} s)"
            if attempt == 1 or attempt % 10 == 0:
                log.warning("%s to LM %d failed (attempt %d): %s", what, lm, attempt, failure)
            await asyncio.sleep(min(0.1 * 2 ** min(attempt - 1, 5), 2.0))

    async def _preempt(self, req: PreemptRequest) -> None:
        """POST a preemption request to its LM; an LM that cannot be reached counts as refusing it (the core
        then asks the next LM or parks the task). Not retried: a repeat could preempt twice."""
        url = self.settings.lm_urls[req.lm]
        task = req.task
        about = ids(job=task.job_id, task=task.task_id, attempt=task.attempt, gm=req.gm, lm=req.lm, user=task.user)
        try:
            body = PreemptRequestModel.core_json(req)
            r = await self._calls.post(f"{url}/v1/preempt?term={self.term}", body, resend=False)
        except CallError as exc:
            failure = f"LM {req.lm} unreachable at {url}: {exc}"
        else:
            if _fenced(r):
                self._superseded(f"LM {req.lm} refused preemption request {req.seq}: {r.text[:300]}")
                return
            if r.status == 200:
                response = PreemptResponseModel.model_validate_json(r.body).to_core()
                if response.placement is not None:
                    self.jobs.placed_by_preemption(response.placement)
                    log.info(
                        "task %s (user %s) runs on LM %d node %d after preempting %s",
                        task.task_id,
                        task.user,
                        req.lm,
                        response.placement.node,
                        response.preempted,
                        extra=about | {"node": response.placement.node},
                    )
                else:
                    log.info(
                        "LM %d refused to preempt for task %s (user %s): %s",
                        req.lm,
                        task.task_id,
                        task.user,
                        response.reason,
                        extra=about,
                    )
                assert self.core is not None
                async with self._lock:
                    outputs = self.core.handle(response, time.time())
                self._dispatch(outputs)
                return
            failure = f"LM {req.lm} answered {r.status}: {r.text[:500]}"
        log.warning(
            "preemption request %d for task %s (user %s) to LM %d failed: %s",
            req.seq,
            task.task_id,
            task.user,
            req.lm,
            failure,
            extra=about,
        )
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
        self.serving = False
        for task in list(self._tasks):
            task.cancel()
        await self._calls.aclose()
        if self.replicator is not None:
            await self.replicator.close()
        if self.journal is not None:
            self.journal.close()


def _merged(answers: list[LaunchResponse]) -> LaunchResponse:
    """The answer to a batch sent in parts, from the answers to its parts in the order they came: every placement
    accepted and rejected, the newest state of each node (node states are versioned), and one delta with the
    newest state of each of its nodes, the highest `applied_through` and the latest usage."""

    def newest(states: list[NodeState]) -> list[NodeState]:
        by_node: dict[int, NodeState] = {}
        for state in states:
            if state.node not in by_node or state.version > by_node[state.node].version:
                by_node[state.node] = state
        return list(by_node.values())

    first, last = answers[0], answers[-1]
    delta = Delta(
        last.delta.lm,
        last.delta.gm,
        max(a.delta.applied_through for a in answers),
        newest([s for a in answers for s in a.delta.nodes]),
        last.delta.usage,
    )
    return LaunchResponse(
        first.gm,
        first.lm,
        first.seq,
        [p for a in answers for p in a.accepted],
        [r for a in answers for r in a.rejected],
        newest([s for a in answers for s in a.states]),
        delta,
    )


def _fenced(r: Reply) -> bool:
    """An LM's 409 naming the term: a newer holder of this GM identity fenced this one."""
    if r.status != 409:
        return False
    with contextlib.suppress(ValueError):
        return any(d.field == "term" for d in ErrorBody.model_validate_json(r.body).detail)
    return False
