"""The GM service: the cluster learnt from its LMs, the GM core and the lock its every step takes, the job table,
and the calls made on it (submission, cancel, broker messages from the LMs).

What a GM does besides lives in modules of their own: sending what its core decides (`dispatch`), coming back
from a crash and keeping its journal (`recovery`), standing in for a peer (`standin`, `peers`)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from urllib.parse import quote

from megha.common.core.cluster import ClusterSpec
from megha.common.core.gm import GlobalMaster, Unschedulable
from megha.common.core.messages import Completions, Output
from megha.common.core.observer import observe
from megha.common.core.placement.choice import make_choice
from megha.common.core.policies import gm_policies
from megha.common.core.recovery import RunsHeld, runs_lost
from megha.common.core.task import JobSpec
from megha.common.lifecycle import StartupError, check_stop
from megha.common.models import (
    GMRecovery,
    JobStatus,
    JobSubmission,
    LMRebuilt,
)
from megha.common.settings import GMSettings
from megha.common.transport.rabbit import Broker, TryLater
from megha.services import retry
from megha.services.client import CallError, Reply, ServiceClient
from megha.services.gm.dependencies import ParentWatch
from megha.services.gm.dispatch import GMDispatch
from megha.services.gm.events_route import JobEvents
from megha.services.gm.jobs import ENDED, JobTable
from megha.services.gm.journal import Journal, NotWritten
from megha.services.gm.lm_layout import partitions_of
from megha.services.gm.lm_reports import LMReportGate, lm_of
from megha.services.gm.metrics import GMMeter
from megha.services.gm.peers import Replicator
from megha.services.gm.recovery import Restart
from megha.services.logs import ids

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
        self.restart = Restart(self)  # recovery after a start, and the journal's upkeep
        self.parents = ParentWatch(self)  # the parents its waiting jobs wait for (depends_on)
        self.classes = settings.classes()  # MEGHA_PRIORITY_CLASSES: each job's class name -> its tasks' priority
        self.jobs = self._job_table()
        self.meter = GMMeter(self.jobs)  # scheduling attempts and allocation times, for GET /metrics
        self.job_events = JobEvents(lambda: self.jobs)  # the readers of GET /v1/jobs/{id}/events
        # What the GM core reports goes to each, the table first (the meter reads it).
        self.observer = observe(self.jobs, self.meter, self.job_events)
        self.core: GlobalMaster | None = None
        self.cluster: ClusterSpec | None = None
        # Fencing (megha.common.core.fencing): the term this GM identity was claimed with at every LM; `serving`
        # is cleared once an LM says a newer holder took the identity over, and `on_superseded` is told.
        self.term = 0
        self.serving = True
        self.on_superseded: Callable[[str], None] | None = None
        self.lock = asyncio.Lock()  # taken by every step of the core
        self.lm_reports = LMReportGate(settings)  # which of the LMs' broker messages count (docs/security.md)
        self.calls = ServiceClient(settings.http_timeout, authorization=settings.credentials())
        self.dispatch = GMDispatch(self)  # the core's outputs to the LMs and the broker
        self._accepting: set[str] = set()  # job ids being journaled
        self._reserved: dict[str, int] = {}  # tasks of jobs being journaled, per user (the submission bound)

    def ready_core(self) -> GlobalMaster:
        """The GM core; NotServing until this GM learnt the cluster from its LMs."""
        if self.core is None:
            raise NotServing(f"GM {self.settings.gm_id} has no view of the cluster yet")
        return self.core

    async def discover(self) -> ClusterSpec:
        """Ask every LM for its partitions, waiting (MEGHA_LM_TIMEOUT) for LMs whose workers have not all
        registered yet."""
        timeout = self.settings.lm_timeout
        policy = retry.RetryPolicy(deadline=timeout, first_pause=0.2, max_pause=0.2, jitter=0.0, retry=lambda s: True)
        rows = []
        names: tuple[str, ...] = ()
        for lm, url in enumerate(self.settings.lm_urls):
            next_note = time.monotonic() + 2.0

            def waiting(attempt: int, failure: str, lm: int = lm, url: str = url) -> None:
                nonlocal next_note
                check_stop(f"LM {lm} at {url}")
                if time.monotonic() >= next_note:
                    log.warning("waiting for LM %d at %s: %s", lm, url, failure)
                    next_note = time.monotonic() + 5.0

            outcome = await retry.call(partial(self.calls.get, f"{url}/v1/cluster"), policy, f"LM {lm}", waiting)
            r = outcome.reply
            if not outcome.succeeded or r is None:
                raise StartupError(f"LM {lm} at {url} not ready after {timeout:g} s: {outcome.failure}")
            doc = json.loads(r.body)
            if doc["lm"] != lm:
                raise StartupError(f"{url} is LM {doc['lm']}, but it is listed as LM {lm}")
            names = tuple(doc["resource_names"])
            rows.append(partitions_of(doc, lm))
            if isinstance(doc.get("incarnation"), int):  # the layout of that life: a later one's is checked
                self.dispatch.watch.incarnations[lm] = doc["incarnation"]
        try:
            cluster = ClusterSpec(tuple(rows), names)
        except ValueError as exc:  # LMs that disagree (MEGHA_NUM_GMS set differently, say): one line, not a traceback
            raise StartupError(
                f"the LMs' clusters do not fit together: {exc}; start every LM with the same MEGHA_NUM_GMS"
            ) from None
        if self.settings.gm_id >= cluster.num_gms:
            raise StartupError(
                f"MEGHA_GM_ID={self.settings.gm_id}, but the LMs have a partition for GMs 0..{cluster.num_gms - 1} "
                f"only (their MEGHA_NUM_GMS={cluster.num_gms})"
            )
        try:
            self.settings.check_queue_gms(cluster.num_gms, "the LMs have a partition per GM")
        except ValueError as exc:
            raise StartupError(str(exc)) from None
        self.adopt(cluster)
        return cluster

    async def task_logs(self, lm: int, node: int, task_id: str, query: str) -> Reply:
        """LM `lm`'s answer to `GET /v1/nodes/{node}/tasks/{task_id}/logs?{query}`: the output a run of the task
        left on the agent of that node. Raises CallError when the LM cannot be reached."""
        url = f"{self.settings.lm_urls[lm]}/v1/nodes/{node}/tasks/{quote(task_id, safe='')}/logs?{query}"
        return await self.calls.get(url)

    def adopt(self, cluster: ClusterSpec) -> None:
        """Build the GM core over `cluster`, all free: the LMs' deltas and responses correct the view from here."""
        self.cluster = cluster
        settings = self.settings
        choice = make_choice(settings.matching)
        self.core = GlobalMaster(
            settings.gm_id,
            cluster,
            seed=settings.seed,
            observer=self.observer,
            max_attempts=settings.max_attempts,
            policies=gm_policies(
                settings.gm_id,
                cluster,
                settings.fairness(),
                choice,
                settings.queue_order,
                settings.lm_order,
                settings.unplaceable,
                priority_classes=True,
                gang_reserve_after=settings.gang_reserve_after,
            ),
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
        job = sub.to_job(job_id, core.resource_names, arrived, self.priority(sub.priority_class))
        core.admit(job, arrived)  # a job that can never run is refused before it is journaled
        self._check_bound(sub.user, len(job.tasks))
        self._accepting.add(job_id)  # a resent submission arriving meanwhile is a duplicate
        self._reserved[sub.user] = self._reserved.get(sub.user, 0) + len(job.tasks)  # held while journaling
        try:
            if self.journal is not None:  # on disk (here, and at the peer that would stand in) before the answer
                await self._journal_job(sub, job_id, arrived, core)
            async with self.lock:
                if self.core is not core or not self.serving:
                    return job  # this identity changed hands meanwhile: its next holder recovers the job
                outputs = core.submit(job, time.time())
                if sub.array is not None and job_id in self.jobs.jobs:
                    self.jobs.jobs[job_id].array = sub.array
        finally:
            self._accepting.discard(job_id)
            self._reserved[sub.user] -= len(job.tasks)
            if not self._reserved[sub.user]:
                del self._reserved[sub.user]
        self.dispatch.send(outputs)
        await asyncio.sleep(0)  # the launch calls go out before the submission is answered
        return job

    async def _journal_job(self, sub: JobSubmission, job_id: str, arrived: float, core: GlobalMaster) -> None:
        """Journal an accepted job durably, here and at the peer's copy. When this identity changes hands meanwhile
        (fenced after a stall, it closes its journal to recover), a job not written is refused with NotServing
        (503: submit again); one written before the journal closed is returned as accepted, since the recovery that
        follows reads it (answering 503 would make the client's next try a 409 for its own job)."""
        assert self.journal is not None
        record = sub.model_dump(mode="json", exclude_defaults=True) | {"job_id": job_id}
        try:
            line = await self.journal.append_durably({"job": record, "at": arrived})
        except NotWritten as exc:
            if self.core is not core or not self.serving:
                raise NotServing(f"GM {self.settings.gm_id} is changing hands; submit again in a few seconds") from None
            log.error("could not journal job %s: %s", job_id, exc)
            raise NotServing(f"GM {self.settings.gm_id} could not journal job {job_id}: {exc}") from None
        except (OSError, ValueError) as exc:
            if self.core is not core or not self.serving:
                return  # written: the recovery of this identity's next holder reads it
            log.error("could not sync the journal line of job %s: %s", job_id, exc)
            raise NotServing(f"GM {self.settings.gm_id} could not journal job {job_id}: {exc}") from None
        if self.replicator is not None:
            await self.replicator.add_durably(line)

    def _job_table(self) -> JobTable:
        """An empty job table that journals ends and retries, names priority classes and tells the dependency watch
        of each job's end."""
        settings, restart = self.settings, self.restart
        jobs = JobTable(
            settings.gm_id,
            settings.finished_tasks_kept,
            restart.journal_end,
            restart.journal_retry,
            self.classes.name_of,
        )
        jobs.on_job_end = self.parents.job_ended
        return jobs

    def priority(self, name: str | None) -> int:
        """The value of priority class `name` (None: the default class); Unschedulable (a 422 naming
        `priority_class`) for a class MEGHA_PRIORITY_CLASSES does not list."""
        try:
            return self.classes.value(name)
        except KeyError as exc:
            raise Unschedulable(f"{exc.args[0]} (MEGHA_PRIORITY_CLASSES)", "priority_class") from None

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
        async with self.lock:
            if self.core is not core or not self.serving:
                raise NotServing(f"GM {self.settings.gm_id} changed hands; cancel again in a few seconds")
            job.cancelled = True
            outputs = self.cancel_open(job_id)
        self.dispatch.send(outputs)
        return self.jobs.status(job_id)

    def cancel_open(self, job_id: str) -> list[Output]:
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

    async def recover(self) -> None:
        """Rebuild this GM after a start, from the LMs and its journal (`Restart.recover`)."""
        await self.restart.recover()

    def reset(self) -> None:
        """Forget what this GM identity held (its core, job table and calls in flight) before recovering it
        again: it was fenced while stalled or cut off, and takes its identity back from the LMs and its journal."""
        self.serving = False
        self.dispatch.cancel()
        if self.journal is not None:
            self.journal.close()
            self.journal = None
        self.jobs = self._job_table()
        self.meter = GMMeter(self.jobs)
        self.job_events.end_all(f"GM {self.settings.gm_id} recovers its jobs; open the stream again")
        self.observer = observe(self.jobs, self.meter, self.job_events)
        self.adopt(self.cluster)

    def superseded(self, reason: str) -> None:
        """An LM refused a call: another holder claimed this GM identity with a newer term. Stop acting as it."""
        if not self.serving:
            return
        self.serving = False
        log.warning("GM %d (term %d) stops serving: %s", self.settings.gm_id, self.term, reason)
        if self.on_superseded is not None:
            self.on_superseded(reason)

    async def on_broker_message(self, body: bytes, headers: Mapping[str, object] | None = None) -> None:
        """Apply an LM's delta, completions or rebuilt notice. With MEGHA_AUTH=on only what the LM it names signed
        for this GM counts: the rest is ignored and logged (`LMReportGate`), never requeued."""
        msg = self.lm_reports.admitted(body, headers or {})
        if msg is None:
            return
        if (lm := lm_of(msg)) and int(lm) >= len(self.settings.lm_urls):  # a GM restarted without one of its LMs
            known = len(self.settings.lm_urls)
            self.lm_reports.ignore(lm, f"this GM has no LM {lm} (MEGHA_LM_URLS lists {known})", body)
            return
        if not self.serving:
            raise TryLater(f"GM {self.settings.gm_id} is changing hands")
        core = self.ready_core()
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
        async with self.lock:
            outputs = core.handle(core_msg, now)
            if isinstance(core_msg, Completions):
                self.jobs.runs_started(core_msg.items)
        self.dispatch.send(outputs)

    async def _runs_lost_with(self, rebuilt: LMRebuilt) -> None:
        """LM `rebuilt.lm` came back from a crash: run again this GM's runs there that it neither holds nor saw
        end. The LM's state is read under this GM's lock, so every run this GM counts as running there was
        accepted before that read."""
        assert self.core is not None
        watch = self.dispatch.watch
        if rebuilt.incarnation != watch.incarnations.get(rebuilt.lm):  # out of the view first if it changed
            await watch.check_layout(rebuilt.lm, rebuilt.incarnation)
        url = f"{self.settings.lm_urls[rebuilt.lm]}/v1/gms/{self.settings.gm_id}/state"
        async with self.lock:
            try:
                r = await self.calls.get(url)
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
        self.dispatch.send(outputs)

    async def apply(self, step: Callable[[GlobalMaster], list[Output]]) -> None:
        """Take a step of the core under the lock (an LM's answer, a call that failed) and send what it decided."""
        core = self.ready_core()
        async with self.lock:
            outputs = step(core)
        self.dispatch.send(outputs)

    def queues(self) -> list[dict[str, object]]:
        """Every configured queue with this GM's view of its usage (exact for its own queues)."""
        book = self.ready_core().book
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
        self.dispatch.cancel()
        await self.calls.aclose()
        if self.replicator is not None:
            await self.replicator.close()
        if self.journal is not None:
            self.journal.close()
