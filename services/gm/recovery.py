"""How a GM comes back: its identity claimed at every LM with a newer term (fencing the holder before), its job table
from its journal, its view from the LMs' full states, its queue from what neither runs nor ended; and how it keeps
its journal (every task end, with its finish time) from then on. A peer standing in for a GM recovers it the same
way from its copy of the journal (services/gm/standin.py)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from pydantic import ValidationError
from pydantic_core import to_json

from megha.common.core.gm import Unschedulable
from megha.common.core.messages import Completions
from megha.common.core.recovery import LMReport, plan_recovery
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.lifecycle import StartupError
from megha.common.models import GMRecovery, JobSubmission
from megha.common.transport.rabbit import gm_key
from megha.services.client import CallError, Reply
from megha.services.gm.jobs import ENDED
from megha.services.gm.journal import Journal, Replayed, open_private

if TYPE_CHECKING:
    from megha.services.gm.service import GMService

log = logging.getLogger("megha.gm")

CLAIM_PAUSE = 0.2
"""Seconds between two calls to an LM that answered 503 while this GM recovers."""


class Restart:
    """The recovery and journal upkeep of GM service `gm`."""

    def __init__(self, gm: GMService) -> None:
        self.gm = gm

    def journal_end(self, task_id: str, state: str, reason: str) -> None:
        if self.gm.journal is not None:
            at = self.gm.jobs.tasks[task_id].finished_at  # restored as it is, so a finish time never changes
            self._journal({"end": task_id, "state": state, "reason": reason, "at": at})

    def journal_retry(self, task: TaskSpec, failures: int) -> None:
        """A failed run of `task` runs again under its job's retry rule, as its next attempt (docs/retry.md)."""
        self._journal({"retry": task.task_id, "attempt": task.attempt + 1, "failures": failures})

    def _journal(self, record: dict[str, object]) -> None:
        """Append an end or retry record, and copy it to the peer. One the journal cannot take (a full or read-only
        disk) is logged and left out, not raised: the job table takes the end all the same (raised, the end was
        left half applied, and its job stayed unfinished for ever), and a restarted GM learns it from its LMs."""
        if self.gm.journal is None:
            return
        try:
            line = self.gm.journal.append(record)
        except OSError as exc:
            log.error("could not journal %s: %s (a restart learns it from the LMs)", record, exc)
            return
        if self.gm.replicator is not None:
            self.gm.replicator.add(line)

    def _restore_end(self, task_id: str, state: str, reason: str, at: float | None) -> None:
        """A task end this GM learnt while recovering (from its journal or an LM), not from its core; `at`: its
        finish time as first recorded."""
        self.gm.jobs.restore_end(task_id, state, reason, at)

    def _read_journal(self) -> Replayed:
        """The journal of this GM's earlier life (empty: none), once the journal is known to be writable:
        StartupError naming MEGHA_JOURNAL_DIR when it is not (a file, a folder that cannot be made or written)."""
        path = self.gm.journal_path()
        try:
            replayed = Journal.replay(path)
            open_private(path, "ab").close()
        except OSError as exc:
            raise StartupError(
                f"MEGHA_JOURNAL_DIR={self.gm.settings.journal_dir}: cannot keep the journal {path}: "
                f"{exc.strerror or exc}"
            ) from None
        return replayed

    async def recover(self) -> None:
        """Rebuild this GM after a start: its view from every LM's full state, its job table from its journal, and
        its queue from the accepted tasks that no LM runs and that did not end (nothing running or finished is
        launched again). Then keep journaling, with the journal rewritten to what is still held."""
        gm = self.gm
        assert gm.core is not None
        replayed = self._read_journal() if gm.settings.journal_dir else None
        states = await self.claim()
        now = time.time()
        tasks: list[TaskSpec] = []
        gangs: dict[str, float] = {}  # gang jobs: job id -> JobSpec.gang
        ended: set[str] = set()  # accepted tasks the journal shows ended
        with_parents: dict[str, JobSpec] = {}  # accepted jobs that named parents (depends_on)
        ruled: list[JobSpec] = []  # jobs with a retry rule
        if replayed is not None:
            if replayed.damaged:
                log.warning("journal %s: %d damaged lines skipped", gm.journal_path(), replayed.damaged)
            for record, arrived in replayed.jobs:
                # The record's id is the one the GM made (`<user>~<name>~<made>` for a name a user chose), which no
                # client may submit: validate the rest as the submission it was.
                job_id = record.get("job_id", "")
                try:
                    sub = JobSubmission.model_validate({k: v for k, v in record.items() if k != "job_id"})
                except ValidationError as exc:  # written by another version: the GM starts without it, loudly
                    log.error("journal %s: job %s cannot be read, skipped: %s", gm.journal_path(), job_id, exc)
                    continue
                try:
                    priority = gm.priority(sub.priority_class)
                except Unschedulable:  # accepted under classes since changed: it runs, in the default class
                    priority = gm.priority(None)
                job = sub.to_job(job_id, gm.core.resource_names, arrived, priority)
                if job_id in gm.jobs.jobs:
                    continue
                gm.observer.job_arrived(job, gm.settings.gm_id, arrived)
                if sub.array is not None:
                    gm.jobs.jobs[job_id].array = sub.array
                if job.depends_on:
                    with_parents[job_id] = job
                if job.retry is not None:
                    ruled.append(job)
                if job.gang is not None:
                    gangs[job_id] = job.gang
                retried = replayed.retries
                tasks.extend(
                    t if t.task_id not in retried else replace(t, attempt=retried[t.task_id][0]) for t in job.tasks
                )
            # Read from the journal, not the job table: restoring the ends forgets finished jobs (their tasks too)
            # beyond MEGHA_FINISHED_TASKS_KEPT, as it did when they ended.
            ended = {t.task_id for t in tasks if t.task_id in replayed.ends}
            for task_id, end in replayed.ends.items():
                self._restore_end(task_id, end.state, end.reason, end.at)
        reports = [
            LMReport(s.delta.to_core(), [p.to_core() for p in s.running], [r.to_core() for r in s.ended])
            for s in states
        ]
        # Completions that waited in the GM's broker queue are handled after this, as they come; each task whose run
        # one reports is taken as running, so that its completion ends it, rather than launched again (a run whose
        # LM restarted meanwhile is known to no LM: launched again, it would run twice and end twice). A job's end
        # that an LM remembers is replayed now if the job has a retry rule (the rule decides again; a gang holds it
        # again).
        plan = plan_recovery(
            gm.settings.gm_id,
            tasks,
            ended,
            reports,
            await self._waiting_completions(),
            ruled={job.job_id for job in ruled},
            term=gm.term,
        )
        for task_id, reason in plan.ended.items():  # ends the journal missed, remembered by an LM: first seen now
            self._restore_end(task_id, "failed" if reason else "finished", reason, now)
        gm.observer.decided(plan.running, now)
        cancels = {job_id for job_id in (replayed.cancels if replayed is not None else ()) if job_id in gm.jobs.jobs}
        for job_id in cancels:
            gm.jobs.jobs[job_id].cancelled = True
        # A job none of whose tasks ran nor ended may still wait for its parents: it waits again, and the dependency
        # watch asks after its parents (one released before the crash is released again at once).
        queued_ids = {t.task_id for t in plan.queued}
        waiting = [
            job
            for job_id, job in with_parents.items()
            if job_id not in cancels and all(t.task_id in queued_ids for t in job.tasks)
        ]
        waiting_ids = {job.job_id for job in waiting}
        queued = [t for t in plan.queued if t.job_id not in cancels and t.job_id not in waiting_ids]
        for task in plan.queued:
            if task.job_id in cancels:  # cancelled before the crash, while still queued
                gm.observer.task_cancelled(task, now)
        for job in ruled:  # their rules, and the failures retried so far, for the tasks still open
            assert replayed is not None
            if job.job_id in cancels:
                continue
            open_ids = [t.task_id for t in job.tasks if t.task_id not in ended and t.task_id not in plan.ended]
            failures = {tid: replayed.retries[tid][1] for tid in open_ids if tid in replayed.retries}
            for tid, count in failures.items():
                gm.jobs.tasks[tid].failures_retried = count
            gm.core.retry.restore(job, len(open_ids), failures)
        async with gm.lock:
            for job in waiting:
                gm.core.wait_for_parents(job, now)
            ready_gangs = {job_id: gang for job_id, gang in gangs.items() if job_id not in waiting_ids}
            outputs = gm.core.recover(plan.deltas, plan.running, queued, now, ready_gangs, plan.replayed)
            for job_id in cancels:  # their runs the LMs still hold are stopped now
                if job_id in gm.jobs.jobs:  # a job whose last tasks were just cancelled may be forgotten already
                    outputs += gm.cancel_open(job_id)
        if replayed is not None:
            gm.journal = Journal(gm.journal_path())
            gm.journal.rewrite(self._journal_records(replayed))
            if gm.replicator is not None:
                gm.replicator.behind = True  # the peer's copy is rebuilt from the rewritten journal
        gm.serving = True  # submissions were refused (503) from the claim until here
        gm.dispatch.send(outputs)
        if replayed is not None:
            log.info(
                "recovered %d jobs from %s: %d tasks running on LMs, %d queued again, %d ended",
                len(gm.jobs.jobs),
                gm.journal_path(),
                len(plan.running),
                len(plan.queued),
                len(ended) + len(plan.ended),
            )

    def _journal_records(self, replayed: Replayed) -> list[dict[str, object]]:
        """The journal's records for the jobs the table still holds (forgotten finished jobs are dropped)."""
        jobs = self.gm.jobs
        records: list[dict[str, object]] = []
        for record, arrived in replayed.jobs:
            job = jobs.jobs.get(str(record.get("job_id")))
            if job is None:
                continue
            records.append({"job": record, "at": arrived})
            if job.cancelled:
                records.append({"cancel": record.get("job_id"), "at": arrived})
            for tid in job.task_ids:
                if tid in replayed.retries and jobs.tasks[tid].state not in ENDED:
                    attempt, failures = replayed.retries[tid]
                    records.append({"retry": tid, "attempt": attempt, "failures": failures})
            for tid in job.task_ids:
                rec = jobs.tasks[tid]
                if rec.state in ENDED:
                    end = {"end": tid, "state": rec.state, "reason": rec.failed_reason or "", "at": rec.finished_at}
                    records.append(end)
        return records

    async def _waiting_completions(self) -> list[Completions]:
        """The completions for this GM identity waiting in its broker queue (read and left there, `Broker.peek`),
        as the GM believes them (`LMReportGate.believed`)."""
        gm = self.gm
        if gm.broker is None:
            return []
        gm_id = gm.settings.gm_id
        try:
            waiting = await gm.broker.peek("gm", gm_key(gm_id))
        except Exception as exc:  # the broker is away: recover from the LMs alone, as before
            log.warning("could not read the completions waiting for GM %d (%s); recovering without them", gm_id, exc)
            return []
        found = []
        for body, headers in waiting:
            msg = gm.lm_reports.believed(body, headers)
            if msg is not None and msg.completions is not None and msg.completions.gm == gm_id:
                found.append(msg.completions.to_core())
        if found:
            log.info(
                "GM %d: %d completions waited for it (%d runs): their tasks count as running until those are applied",
                gm_id,
                len(found),
                sum(len(c.items) for c in found),
            )
        return found

    async def claim(self) -> list[GMRecovery]:
        """Claim this GM identity at every LM with a term above any they have seen for it, which fences the holder
        before (a stalled or cut-off GM, or a peer that stood in for it), and return each LM's state of that
        moment. Two claimants racing for a term retry with a higher one."""
        me = self.gm
        gm = me.settings.gm_id
        while True:
            seen = [await self._lm_call(lm, "GET", f"/v1/gms/{gm}/state") for lm in range(len(me.settings.lm_urls))]
            me.term = max([me.term, *(GMRecovery.model_validate_json(r.body).term for r in seen)]) + 1
            claim = to_json({"term": me.term, "by": me.holder})
            states = []
            for lm in range(len(me.settings.lm_urls)):
                r = await self._lm_call(lm, "POST", f"/v1/gms/{gm}/claim", claim, (409,))
                if r.status == 409:
                    log.warning("claiming GM %d with term %d at LM %d: %s; again", gm, me.term, lm, r.text[:200])
                    break
                states.append(GMRecovery.model_validate_json(r.body))
            else:
                log.info("GM %d claimed with term %d at every LM", gm, me.term)
                return states

    async def _lm_call(
        self, lm: int, method: str, path: str, body: bytes | None = None, ok: tuple[int, ...] = ()
    ) -> Reply:
        """One call to LM `lm` while recovering; a 503 (the LM applies the reports that waited for it while it was
        down, `BACKLOG_WAIT` there) is asked again every CLAIM_PAUSE s for up to MEGHA_LM_TIMEOUT."""
        url = f"{self.gm.settings.lm_urls[lm]}{path}"
        deadline = time.monotonic() + self.gm.settings.lm_timeout
        for attempt in itertools.count():
            try:
                r = await self.gm.calls.request(method, url, body, idempotent=method == "GET")
            except CallError as exc:
                raise StartupError(f"LM {lm} unreachable at {url}: {exc}") from None
            if r.status != 503 or time.monotonic() >= deadline:
                break
            if attempt == 0:
                log.info("LM %d is not ready to answer %s %s: %s; asking again", lm, method, path, r.text[:200])
            await asyncio.sleep(CLAIM_PAUSE)
        if r.status != 200 and r.status not in ok:
            raise StartupError(f"LM {lm} answered {r.status} at {url}: {r.text[:300]}")
        return r
