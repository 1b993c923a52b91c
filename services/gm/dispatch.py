"""A GM's outputs to the transports: launch batches to LMs (split under the LM's body limit, retried under their
policy, their answers merged), preemption requests (never repeated), stops of cancelled runs, gangs' prepares,
commits and aborts, the core's timers, and the task events of ends no LM announced."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from megha.common.core.messages import (
    Delta,
    GangAbort,
    GangCommit,
    GangPrepare,
    LaunchBatch,
    LaunchResponse,
    NodeState,
    Output,
    PreemptRequest,
    RunEvent,
    StopRequest,
    Wake,
)
from megha.common.models import (
    ErrorBody,
    GangAbortModel,
    GangCommitModel,
    GangCommittedModel,
    GangPreparedModel,
    GangPrepareModel,
    LaunchBatchModel,
    LaunchResponseModel,
    PreemptRequestModel,
    PreemptResponseModel,
    StopRequestModel,
    TaskEvents,
)
from megha.services import retry
from megha.services.background import spawn
from megha.services.client import CallError, Reply
from megha.services.gm.lm_watch import LMWatch
from megha.services.logs import ids, log_preemption

if TYPE_CHECKING:
    from megha.services.gm.service import GMService

log = logging.getLogger("megha.gm")

UNSENT_GIVE_UP = 3.0  # seconds of launch attempts that all failed to connect before the batch is placed again


class GMDispatch:
    """Sends what the core of GM service `gm` decides, and hands the LMs' answers back to it (`GMService.apply`)."""

    def __init__(self, gm: GMService) -> None:
        self.gm = gm
        # Launch batches and stops to LMs: the LM applies each once, so they are tried until MEGHA_LM_TIMEOUT.
        self.lm_calls = retry.RetryPolicy(deadline=gm.settings.lm_timeout)
        # A gang's commit is not tried again: while it is, the parts other LMs launched would run alone (until the
        # LM, restarted without its lease, refused it), long enough to run to their end. One failed attempt
        # stops the gang at once (`call_failed`) and it runs again whole (docs/gang.md).
        self.commit_calls = retry.RetryPolicy(deadline=gm.settings.lm_timeout, attempts=1)
        # A launch batch no attempt of which got a connection is given up sooner: its tasks are placed again
        # (`GlobalMaster.call_failed(..., reached=False)`), elsewhere while the LM is out of the view.
        self.launch_calls = retry.RetryPolicy(
            deadline=gm.settings.lm_timeout, unsent_deadline=min(UNSENT_GIVE_UP, gm.settings.lm_timeout)
        )
        self.tasks: set[asyncio.Task[None]] = set()  # calls in flight, cancelled when the GM closes or resets
        self.watch = LMWatch(gm)  # the LMs a call failed to reach: out of the view until they answer again

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        spawn(self.tasks, coro)

    def cancel(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        self.watch.cancel()

    def send(self, outputs: list[Output]) -> None:
        """Send what the GM core decided: launch batches, preemption requests and stops to their LMs (each a
        call in the background), and a task event for each end no LM announced."""
        gm = self.gm
        if not gm.serving:
            return  # the next holder recovers these tasks from the LMs and the journal
        if gm.jobs.ended_here:
            self.spawn(self._publish_ends())
        for out in outputs:
            if isinstance(out, Wake):
                self.spawn(self._wake(out))
                continue
            if isinstance(out.msg, LaunchBatch):
                self.spawn(self._launch(out.msg))
            elif isinstance(out.msg, PreemptRequest):
                self.spawn(self._preempt(out.msg))
            elif isinstance(out.msg, StopRequest):
                self.spawn(self._stop(out.msg))
            elif isinstance(out.msg, GangPrepare | GangCommit | GangAbort):
                self.spawn(self._gang(out.msg))
            else:
                raise TypeError(f"GM cannot send {out!r}")

    async def _wake(self, wake: Wake) -> None:
        """A timer the core set (a retried task's backoff, a gang's backoff or timeout): at `wake.at` (unix seconds),
        hand its message back to the core under the lock. Cancelled with the other background steps when the GM
        closes or resets (a recovered GM queues the task again from its journal)."""
        await asyncio.sleep(max(0.0, wake.at - time.time()))
        await self.gm.apply(lambda core: core.handle(wake.msg, time.time()))

    async def _publish_ends(self) -> None:
        """Publish a task event for each end no LM announced: tasks this GM gave up on, and runs a rebuilt LM
        forwarded (it had not placed them, so it could not tell a stale copy from the run the GM knows). A
        forwarded end carries the time its worker measured: an LM killed after publishing that end, but before
        its GM heard of it, forwards it again once restarted, and the two events are then the same event. One
        killed after its GM heard of the end but before publishing it forwards it again too: the GM, which
        applied it already, announces it then (`JobTable.forwarded_end_repeated`)."""
        gm = self.gm
        ended, gm.jobs.ended_here = gm.jobs.ended_here, []
        if gm.broker is None or not ended:
            return
        events = [
            RunEvent(e.kind, e.task_id, e.job_id, e.lm, e.node, e.at, error=e.reason, attempt=e.attempt) for e in ended
        ]
        await gm.broker.publish("events", "", TaskEvents.core_json(events))

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
        reached = True
        for k, (_, body) in enumerate(parts):
            what = f"launch batch {batch.seq}" + (f" (part {k + 1} of {len(parts)})" if len(parts) > 1 else "")
            r, failure, reached = await self._post_retrying(batch.lm, "/v1/launch", body, what, self.launch_calls)
            if r is None or r.status != 200:
                break
            answers.append(LaunchResponseModel.model_validate_json(r.body).to_core())
        if r is not None and fenced(r):
            return
        if r is None and not reached and not answers:
            tasks = [p.task for p in batch.placements]
            log.warning(
                "launch batch %d of %d tasks never reached LM %d: they are placed again; %s",
                batch.seq,
                len(tasks),
                batch.lm,
                failure,
                extra=ids(task=[t.task_id for t in tasks], gm=batch.gm, lm=batch.lm),
            )
            await self.gm.apply(lambda core: core.call_failed(batch.lm, batch.seq, failure, time.time(), reached=False))
            return
        if r is None or r.status != 200:
            tasks = [p.task for p in batch.placements]
            log.warning(
                "gave up launch batch %d of %d tasks at LM %d (it may have launched them: they run again as their "
                "next attempt): %s; tasks %s",
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
            await self.gm.apply(lambda core: core.call_failed(batch.lm, batch.seq, failure, time.time()))
            return
        response = answers[0] if len(answers) == 1 else _merged(answers)
        await self.gm.apply(lambda core: core.handle(response, time.time()))

    async def _stop(self, req: StopRequest) -> None:
        """POST the runs of cancelled jobs to stop to their LM. Stopping is idempotent there (a run it no longer
        holds is left alone), so the call is retried (`_post_retrying`); a run its LM never got the stop for ends
        as it ends (finished or failed), never twice."""
        what = f"stop of {len(req.runs)} runs"
        r, failure, _ = await self._post_retrying(req.lm, "/v1/stop", StopRequestModel.core_json(req), what)
        if r is None or (r.status != 200 and not fenced(r)):
            log.error(
                "gave up the %s of cancelled jobs at LM %d: %s; runs %s",
                what,
                req.lm,
                failure,
                req.runs[:20],
                extra=ids(task=[t for t, _ in req.runs], gm=req.gm, lm=req.lm),
            )

    async def _gang(self, msg: GangPrepare | GangCommit | GangAbort) -> None:
        """POST a gang's prepare, commit or abort to its LM (docs/gang.md). Each is idempotent there (a repeated
        prepare or commit is answered as the first was; an abort of nothing is nothing), so a prepare or abort is
        retried (`_post_retrying`); a commit is not (`commit_calls`: the other LMs' parts may run meanwhile). A
        prepare or commit that fails for good is `call_failed` (its lease expires, or what it may have launched is
        stopped), an abort that fails is left to the lease's expiry."""
        if isinstance(msg, GangPrepare):
            path, body, answer = "prepare", GangPrepareModel.core_json(msg), GangPreparedModel
        elif isinstance(msg, GangCommit):
            path, body, answer = "commit", GangCommitModel.core_json(msg), GangCommittedModel
        else:
            path, body, answer = "abort", GangAbortModel.core_json(msg), None
        what = f"gang {msg.gang} {path} {msg.seq}"
        policy = self.commit_calls if isinstance(msg, GangCommit) else self.lm_calls
        r, failure, _ = await self._post_retrying(msg.lm, f"/v1/gangs/{path}", body, what, policy)
        if r is not None and fenced(r):
            return
        if r is None or r.status != 200:
            log.warning("%s to LM %d failed: %s", what, msg.lm, failure, extra=ids(job=msg.gang, gm=msg.gm, lm=msg.lm))
            if answer is not None:
                await self.gm.apply(lambda core: core.call_failed(msg.lm, msg.seq, failure, time.time()))
            return
        if answer is not None:
            reply = answer.model_validate_json(r.body).to_core()
            await self.gm.apply(lambda core: core.handle(reply, time.time()))

    async def _post_retrying(
        self, lm: int, path: str, body: bytes, what: str, policy: retry.RetryPolicy | None = None
    ) -> tuple[Reply | None, str, bool]:
        """POST an idempotent call to LM `lm` with this GM's term under `policy` (default `self.lm_calls`: transport
        errors, 5xx and 429 tried again with backoff for up to MEGHA_LM_TIMEOUT seconds). Returns the last reply
        (None if none came), unless it is a 200 why the call failed, and whether it may have reached the LM (False:
        no attempt got a connection). A 409 naming the term (a newer holder fenced this GM) stops serving at once;
        a transport failure takes the LM out of the view until it answers again (`LMWatch`)."""
        url = self.gm.settings.lm_urls[lm]

        def failed(attempt: int, failure: str) -> None:
            if attempt == 1 or attempt % 10 == 0:
                log.warning("%s to LM %d failed (attempt %d): %s", what, lm, attempt, failure)

        target = f"{url}{path}?term={self.gm.term}"

        async def send() -> Reply:
            try:
                return await self.gm.calls.post(target, body, idempotent=True)
            except CallError as exc:
                self.watch.unreachable(lm, exc)
                raise

        outcome = await retry.call(send, policy or self.lm_calls, f"LM {lm}", failed, url)
        r = outcome.reply
        if r is not None and fenced(r):
            self.gm.superseded(f"LM {lm} refused {what}: {r.text[:300]}")
            return r, f"fenced: {r.text[:300]}", True
        return r, outcome.failure, outcome.reached

    async def _preempt(self, req: PreemptRequest) -> None:
        """POST a preemption request to its LM; an LM that cannot be reached counts as refusing it (the core
        then asks the next LM or parks the task). Not retried: a repeat could preempt twice."""
        url = self.gm.settings.lm_urls[req.lm]
        task = req.task
        about = ids(job=task.job_id, task=task.task_id, attempt=task.attempt, gm=req.gm, lm=req.lm, user=task.user)
        try:
            body = PreemptRequestModel.core_json(req)
            r = await self.gm.calls.post(f"{url}/v1/preempt?term={self.gm.term}", body)
        except CallError as exc:
            self.watch.unreachable(req.lm, exc)
            failure = f"LM {req.lm} unreachable at {url}: {exc}"
        else:
            if fenced(r):
                self.gm.superseded(f"LM {req.lm} refused preemption request {req.seq}: {r.text[:300]}")
                return
            if r.status == 200:
                response = PreemptResponseModel.model_validate_json(r.body).to_core()
                if response.placement is not None:
                    self.gm.jobs.placed_by_preemption(response.placement)
                log_preemption(log, req, response)
                await self.gm.apply(lambda core: core.handle(response, time.time()))
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
        await self.gm.apply(lambda core: core.call_failed(req.lm, req.seq, failure, time.time()))


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


def fenced(r: Reply) -> bool:
    """An LM's 409 naming the term: a newer holder of this GM identity fenced this one."""
    if r.status != 409:
        return False
    with contextlib.suppress(ValueError):
        return any(d.field == "term" for d in ErrorBody.model_validate_json(r.body).detail)
    return False
