"""GMs as peers: a GM copies its journal to the next GM of the ring, that GM stands in for it when it stays down
longer than MEGHA_TAKEOVER_AFTER (serving its queue, its jobs and its partitions under its identity), and the GM
takes its identity back when it returns; a GM fenced while stalled or cut off rejoins the same way.

Who holds a GM identity is settled at the LMs by terms (`megha.common.core.fencing`): each holder claims it with
a higher term, so the older holder's next launch is refused and it stops. docs/reliability.md gives the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path

from megha.common.lifecycle import StartupError, stop_requested
from megha.common.models import JobSubmission, JournalLines
from megha.common.settings import GMSettings
from megha.common.transport.rabbit import Broker, gm_key
from megha.services.background import spawn
from megha.services.client import CallError, ServiceClient
from megha.services.gm.journal import merge_lines
from megha.services.gm.peers import ReplicaStore, Replicator
from megha.services.gm.service import GMService

log = logging.getLogger("megha.gm")

WATCH_EVERY = 1.0
"""Seconds between two health checks of the previous GM."""

RETRY_PAUSE = 2.0
"""Seconds before trying again to rejoin or to stand in after an LM could not be reached."""


class NotHere(RuntimeError):
    """A submission names a GM this GM does not serve now (503: its GM, or soon its stand-in, will)."""


class StandingIn(RuntimeError):
    """The journal copy of a GM this GM stands in for cannot be written by that GM (it must rejoin first)."""


class Peers:
    """This GM's side of peering: the copy of its journal at the next GM, taking its identity back, and standing
    in for the previous GM."""

    def __init__(self, service: GMService, settings: GMSettings, broker: Broker | None) -> None:
        self.service = service
        self.settings = settings
        self.broker = broker
        self.next = settings.peer(1) if settings.journal_dir else None
        self.previous = settings.peer(-1) if settings.journal_dir else None
        self.store = ReplicaStore(Path(settings.journal_dir), settings.run_id)
        self._calls = ServiceClient(min(settings.http_timeout, 5.0), authorization=settings.credentials())
        self._tasks: set[asyncio.Task[None]] = set()
        self._rejoining = False
        self.stand_in: GMService | None = None  # this GM acting as the previous one
        self._consumer = ""
        self._armed = True  # cleared when the previous GM takes its identity back, set again once it is seen up
        self._down_since: float | None = None
        service.on_superseded = self._on_superseded

    # ------------------------------------------------------------ this GM's own identity

    def start(self) -> None:
        """After this GM recovered: copy its journal to the next GM, and watch the previous one."""
        if self.next is not None:
            self.service.replicator = Replicator(
                self.settings.gm_urls[self.next],
                self.settings.gm_id,
                self.service.journal_path(),
                min(self.settings.http_timeout, 5.0),
                self._on_superseded,
                self.settings.credentials(),
            )
            self.service.replicator.start()
        if self.previous is not None and self.settings.takeover_after > 0:
            spawn(self._tasks, self._watch())

    async def take_back(self) -> None:
        """Before recovering: have the next GM stop standing in for this one, and add to this GM's journal what it
        accepted or saw end meanwhile. An unreachable next GM is logged; the LMs' terms fence it anyway."""
        if self.next is None:
            return
        url = f"{self.settings.gm_urls[self.next]}/v1/peers/{self.settings.gm_id}/release"
        try:
            r = await self._calls.post(url, b"{}")
        except CallError as exc:
            log.warning("could not take the journal copy back from GM %d: %s", self.next, exc)
            return
        if r.status != 200:
            log.warning("GM %d answered %d to %s: %s", self.next, r.status, url, r.text[:300])
            return
        added = merge_lines(self.service.journal_path(), JournalLines.model_validate_json(r.body).lines)
        if added:
            log.info("took back %d journal records from GM %d, which stood in for this GM", added, self.next)

    def _on_superseded(self, reason: str) -> None:
        if not self._rejoining:
            self._rejoining = True
            self.service.serving = False
            spawn(self._tasks, self._rejoin(reason))

    async def _rejoin(self, reason: str) -> None:
        """A newer holder has this GM's identity (a peer stood in while this GM was stalled or cut off): forget what
        was held and recover as after a restart, taking the identity and the journal copy back."""
        log.warning("GM %d rejoins: %s", self.settings.gm_id, reason)
        try:
            while not stop_requested.is_set():
                try:
                    self.service.reset()
                    await self.take_back()
                    await self.service.recover()
                except StartupError as exc:
                    log.warning("rejoining failed, again in %g s: %s", RETRY_PAUSE, exc)
                    await asyncio.sleep(RETRY_PAUSE)
                else:
                    log.info("GM %d serves again with term %d", self.settings.gm_id, self.service.term)
                    return
        finally:
            self._rejoining = False

    # ------------------------------------------------------------ the previous GM's identity

    def service_for(self, sub: JobSubmission, gm: int | None) -> GMService:
        """The GM identity a submission goes to: GM `gm` when named (this GM's own, or the one it stands in for),
        else the one whose queue holds the job's user; raises NotHere when this GM does not serve GM `gm`."""
        stand_in = self.stand_in
        if gm is not None and gm != self.settings.gm_id:
            if stand_in is None or gm != self.previous:
                raise NotHere(
                    f"GM {self.settings.gm_id} takes jobs for GM {gm} only while standing in for it "
                    f"(after it is unreachable for MEGHA_TAKEOVER_AFTER={self.settings.takeover_after:g} s)"
                )
            return stand_in
        book = stand_in.core.book if gm is None and stand_in is not None and stand_in.core is not None else None
        if stand_in is not None and book is not None and sub.tasks and sub.tasks[0].user in book.own:
            return stand_in
        return self.service

    def not_kept(self, gm: int) -> str | None:
        """Why this GM keeps no journal copy of GM `gm` (None when it does)."""
        if self.previous is None:
            return f"GM {self.settings.gm_id} keeps no peer's journal (MEGHA_GM_URLS or MEGHA_JOURNAL_DIR unset)"
        if gm != self.previous:
            return f"GM {self.settings.gm_id} keeps the journal of GM {self.previous}, not of GM {gm}"
        return None

    async def receive(self, gm: int, lines: JournalLines) -> None:
        """Keep the previous GM's journal lines; raises StandingIn while this GM serves that identity."""
        if self.stand_in is not None:
            raise StandingIn(f"GM {self.settings.gm_id} stands in for GM {gm}, which must take its identity back")
        self._down_since = None
        self._armed = True
        await self.store.write(gm, lines.reset, lines.lines)

    async def release(self, why: str) -> list[str]:
        """Stop standing in for the previous GM (it returned) and hand back the journal copy."""
        assert self.previous is not None
        stand_in, self.stand_in = self.stand_in, None
        self._down_since = None
        if stand_in is not None:
            self._armed = False
            if self.broker is not None and self._consumer:
                await self.broker.stop_consuming(self._consumer)
            await stand_in.close()
            log.warning("GM %d stops standing in for GM %d: %s", self.settings.gm_id, self.previous, why)
        return self.store.lines(self.previous)

    async def _watch(self) -> None:
        assert self.previous is not None
        url = f"{self.settings.gm_urls[self.previous]}/healthz"
        while True:
            await asyncio.sleep(WATCH_EVERY)
            try:
                r = await self._calls.get(url)
                up = r.status == 200 and json.loads(r.body).get("ready") is True
            except (CallError, ValueError, AttributeError):
                up = False
            now = time.monotonic()
            if up:  # the GM takes its identity back itself (told by a refused journal batch or launch)
                self._down_since = None
                self._armed = True
                continue
            self._down_since = self._down_since or now
            if self.stand_in is None and self._armed and now - self._down_since >= self.settings.takeover_after:
                await self._take_over(now - self._down_since)

    async def _take_over(self, down_for: float) -> None:
        """Serve the previous GM's identity: its queue and job table from the journal copy, its running tasks and
        the nodes' state from the LMs, which fence the GM itself from now on."""
        assert self.previous is not None
        gm = self.previous
        log.warning("GM %d unreachable for %.0f s: GM %d stands in for it", gm, down_for, self.settings.gm_id)
        settings = self.settings.model_copy(update={"gm_id": gm})
        stand_in = GMService(settings, self.broker, journal=self.store.path(gm), holder=self.settings.gm_id)
        stand_in.serving = False  # until it has recovered: no submission goes to it before
        stand_in.on_superseded = lambda reason: spawn(self._tasks, self.release(reason))
        self.stand_in = stand_in  # from here on the previous GM's journal lines are refused
        try:
            assert self.service.cluster is not None
            stand_in.adopt(self.service.cluster)
            await stand_in.recover()
            if self.broker is not None:
                self._consumer = await self.broker.consume("gm", gm_key(gm), stand_in.on_broker_message, headers=True)
        except StartupError as exc:
            log.warning("standing in for GM %d failed, again in %g s: %s", gm, RETRY_PAUSE, exc)
            self.stand_in = None
            await stand_in.close()
            await asyncio.sleep(RETRY_PAUSE)
            return
        stand_in.dispatch.watch.start()
        log.warning("GM %d stands in for GM %d with term %d", self.settings.gm_id, gm, stand_in.term)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self.stand_in is not None:
            with contextlib.suppress(Exception):
                await self.release("shutting down")
        await self._calls.aclose()
