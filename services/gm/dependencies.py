"""A GM's job dependencies at run time: finding the parents a submission names (`depends_on`), here or at a peer
GM, in the caller's scope; and telling the core's dependency gate when they end: at once for a job this GM holds
(its job table reports each job end), and for a job of another GM by asking that GM every MEGHA_DEPENDENCY_POLL
seconds (`GET /v1/peers/jobs/{id}`, with this GM's own credential). docs/dependencies.md says why it polls.

Privacy: a peer answers a GM about any job, so the asking GM shows a parent to the submitting user only when that
user may see the parent's user's jobs (`Principal.may_act_for`); any other parent is refused exactly as an unknown
one is ("no job X", 422 naming `depends_on.i`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING
from urllib.parse import quote

from megha.common.auth import Principal
from megha.common.core.dependencies import FORGOTTEN, OUTCOMES
from megha.common.models import JOB_SCOPE, made_by, scoped_job_id
from megha.common.wire.dependencies import ParentJob
from megha.services.background import wait_event
from megha.services.client import CallError
from megha.services.logs import ids

if TYPE_CHECKING:
    from megha.services.gm.service import GMService

log = logging.getLogger("megha.gm")

Lookup = Callable[[str], list[tuple["GMService", str]]]
"""The jobs held in this process (this GM's identity, and the one it stands in for) that a name finds: (holder,
job id) for each."""


class ParentRefused(Exception):
    """A parent a submission names cannot be used: `status` 422 (unknown, or not the caller's to see) or 503 (the
    GM that would hold it could not be asked); `field` is `depends_on.i`."""

    def __init__(self, status: int, message: str, field: str) -> None:
        super().__init__(message)
        self.status = status
        self.field = field


class ParentWatch:
    """The parents GM service `gm`'s waiting jobs wait for: resolved at submission, and watched until they end."""

    def __init__(self, gm: GMService) -> None:
        self.gm = gm
        self.lookup: Lookup = self._own_jobs  # the app sets one that also resolves users' names, and the stand-in's
        self.holders: Callable[[], Sequence[GMService]] = lambda: (gm,)  # services whose gates this watch serves
        self.ends: list[tuple[str, str]] = []  # (parent, outcome) to tell the gate
        self.where: dict[str, int] = {}  # a parent held by another GM -> that GM
        self._wake = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ submission

    async def resolve(self, who: Principal, refs: Sequence[str]) -> list[tuple[str, str]]:
        """The id and state of each parent `refs` names for `who`: a job id, or a name in `who`'s scope, held here
        or at a peer GM (MEGHA_GM_URLS). Raises ParentRefused naming `depends_on.i`."""
        found: list[tuple[str, str]] = []
        for i, ref in enumerate(refs):
            field = f"depends_on.{i}"
            parent = None
            for name in (ref,) if JOB_SCOPE in ref else (ref, scoped_job_id(who.name, ref)):
                parent = self._here(who, name) or await self._at_peers(who, name, field)
                if parent is not None:
                    break
            if parent is None:
                raise ParentRefused(422, f"no job {ref}", field)
            found.append(parent)
        return found

    def told(self, parents: Sequence[tuple[str, str]]) -> None:
        """A job was just accepted with these parents (id, state): tell the gate of those that ended already."""
        ended = [(p, state) for p, state in parents if state in OUTCOMES]
        if ended:
            self.ends.extend(ended)
            self._wake.set()

    def job_ended(self, job_id: str, state: str) -> None:
        """A job of this GM ended (its job table says so): its children here are told at once."""
        self.ends.append((job_id, state))
        self._wake.set()

    def _own_jobs(self, name: str) -> list[tuple[GMService, str]]:
        return [(self.gm, name)] if name in self.gm.jobs.jobs else []

    def _here(self, who: Principal, name: str) -> tuple[str, str] | None:
        for holder, job_id in self.lookup(name):
            job = holder.jobs.jobs[job_id]
            if who.may_act_for(job.user):
                return job_id, holder.jobs.job_state(job)
        return None

    def _peers_for(self, name: str) -> list[int]:
        """The other GMs that may hold job `name`: the one that made its id, else every other GM."""
        urls = self.gm.settings.gm_urls
        me = self.gm.settings.gm_id
        made = made_by(name)
        if made is not None:
            return [made] if made != me and made < len(urls) else []
        return [g for g in range(len(urls)) if g != me]

    async def _ask(self, gm: int, name: str) -> ParentJob | None:
        """GM `gm`'s answer about job `name` (None: it holds no such job); CallError when it could not be asked."""
        url = f"{self.gm.settings.gm_urls[gm]}/v1/peers/jobs/{quote(name, safe='')}"
        r = await self.gm.calls.get(url)
        if r.status == 404:
            return None
        if r.status != 200:
            raise CallError(f"GM {gm} answered {r.status}: {r.text[:200]}")
        return ParentJob.model_validate_json(r.body)

    async def _ask_holder(self, gm: int, name: str) -> ParentJob | None:
        """`_ask` GM `gm`, or, while it cannot be asked, the next GM of the ring if that one stands in for it (it then
        holds `gm`'s jobs); CallError when neither knows the job."""
        try:
            return await self._ask(gm, name)
        except CallError:
            stand_in = (gm + 1) % len(self.gm.settings.gm_urls)
            if stand_in in (gm, self.gm.settings.gm_id):  # none, or this GM (`lookup` has looked)
                raise
            with contextlib.suppress(CallError):
                found = await self._ask(stand_in, name)
                if found is not None:
                    return found
            raise

    async def _at_peers(self, who: Principal, name: str, field: str) -> tuple[str, str] | None:
        for gm in self._peers_for(name):
            try:
                parent = await self._ask_holder(gm, name)
            except CallError as exc:
                raise ParentRefused(
                    503, f"GM {gm}, which may hold job {name}, could not be asked: {exc}", field
                ) from None
            if parent is not None and who.may_act_for(parent.user):
                self.where[parent.job_id] = gm
                return parent.job_id, parent.state
        return None

    # ------------------------------------------------------------------ watching

    def start(self) -> None:
        if self._runner is None:
            self._runner = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
            self._runner = None

    async def _run(self) -> None:
        """Tell the gates of the ends heard, at once; every MEGHA_DEPENDENCY_POLL seconds, ask after every awaited
        parent too (a peer's parents, and any end missed: a GM restarted, a stand-in's jobs)."""
        poll = self.gm.settings.dependency_poll
        next_check = time.monotonic()  # at once: a recovered GM's waiting jobs may have been released already
        while True:
            await wait_event(self._wake, max(0.0, next_check - time.monotonic()))
            self._wake.clear()
            recheck = time.monotonic() >= next_check
            if recheck:
                next_check = time.monotonic() + poll
            for holder in self.holders():
                try:
                    await holder.parents.step(recheck, self)
                except Exception:  # a bug must not stop every later dependency; the next round tries again
                    log.exception("dependency check of GM %d failed", holder.settings.gm_id)

    async def step(self, recheck: bool, asker: ParentWatch) -> None:
        """Tell this service's gate the ends heard and, with `recheck`, those found by asking after each awaited
        parent (through `asker`, the watch that runs)."""
        core = self.gm.core
        if core is None or not self.gm.serving:
            return
        ends, self.ends = self.ends, []
        if recheck:
            for parent in core.dependencies.awaited():
                outcome = await asker.outcome(parent)
                if outcome is not None:
                    ends.append((parent, outcome))
        ends = [(p, o) for p, o in ends if p in core.dependencies.children]
        if not ends:
            return
        async with self.gm.lock:
            if self.gm.core is not core:
                return
            now = time.time()
            outputs = []
            for parent, outcome in ends:
                if outcome == FORGOTTEN:
                    log.warning(
                        "parent job %s is no longer known to its GM: the jobs waiting for it fail",
                        parent,
                        extra=ids(job=parent, gm=self.gm.settings.gm_id),
                    )
                outputs += core.parent_ended(parent, outcome, now)
        self.gm.dispatch.send(outputs)

    async def outcome(self, parent: str) -> str | None:
        """How job `parent` ended (an OUTCOMES value: FORGOTTEN when its GM no longer knows it), or None while it
        has not ended (or its GM cannot be asked)."""
        here = self.lookup(parent)
        if here:
            holder, job_id = here[0]
            state = holder.jobs.job_state(holder.jobs.jobs[job_id])
            return state if state in OUTCOMES else None
        gms = [self.where[parent]] if parent in self.where else self._peers_for(parent)
        for gm in gms:
            try:
                found = await self._ask_holder(gm, parent)
            except CallError as exc:
                log.warning("could not ask GM %d about parent job %s: %s", gm, parent, exc, extra=ids(job=parent))
                return None
            if found is not None:
                return found.state if found.state in OUTCOMES else None
        return FORGOTTEN
