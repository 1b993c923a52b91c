"""Which LMs a GM cannot reach, and what it does about them (docs/reliability.md, "An LM that cannot be reached").

A call to an LM that fails in transport (no connection, no answer: `CallError`) takes that LM out of the GM's view
at once (`GlobalMaster.lm_unreachable`): nothing more is placed there, and the call itself goes on under its retry
policy. So does a failed health check: every GM checks every LM's `GET /healthz` every `CHECK_EVERY` seconds, so
that a GM that seldom calls an LM (its view of it full, say) still learns that it went, and gives up its runs there.
The GM then asks the LM's `GET /healthz` every `PROBE_EVERY` seconds; once it answers ready, the LM is back in the
view (`GlobalMaster.lm_reachable`, which also stops there the runs given up meanwhile). An LM that stays
unreachable for MEGHA_LM_LOST_AFTER seconds has its runs given up (`GlobalMaster.lm_lost`): each runs again as its
next attempt elsewhere, as a lost worker's runs do.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING

from megha.services.background import spawn
from megha.services.client import CallError
from megha.services.logs import ids

if TYPE_CHECKING:
    from megha.services.gm.service import GMService

log = logging.getLogger("megha.gm")

PROBE_EVERY = 1.0  # seconds between two health checks of an unreachable LM
CHECK_EVERY = 5.0  # seconds between two health checks of each LM this GM can reach


class LMWatch:
    """The LMs a GM took out of its view because a call to them failed, each with a health check running."""

    def __init__(self, gm: GMService) -> None:
        self.gm = gm
        self.down: dict[int, float] = {}  # LM -> when (monotonic) a call to it first failed in this outage
        self.tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Check every LM's health every CHECK_EVERY seconds, until `cancel`."""
        spawn(self.tasks, self._check_all())

    async def _check_all(self) -> None:
        urls = self.gm.settings.lm_urls
        while True:
            await asyncio.sleep(CHECK_EVERY)
            await asyncio.gather(*(self._check(lm, url) for lm, url in enumerate(urls) if lm not in self.down))

    async def _check(self, lm: int, url: str) -> None:
        try:
            await self.gm.calls.get(f"{url}/healthz")
        except CallError as exc:
            self.unreachable(lm, exc)

    def unreachable(self, lm: int, failure: CallError) -> None:
        """A call to LM `lm` failed in transport: take it out of the view (once per outage) and check its health
        until it answers."""
        if lm in self.down or not self.gm.serving:
            return
        self.down[lm] = time.monotonic()
        lost_after = self.gm.settings.lm_lost_after
        log.warning(
            "LM %d unreachable (%s): nothing is placed there until it answers its health check%s",
            lm,
            failure,
            f"; its runs are given up after MEGHA_LM_LOST_AFTER={lost_after:g} s" if lost_after else "",
            extra=ids(gm=self.gm.settings.gm_id, lm=lm),
        )
        spawn(self.tasks, self._watch(lm))

    async def _watch(self, lm: int) -> None:
        gm = self.gm
        await gm.apply(lambda core: core.lm_unreachable(lm) or [])
        url = f"{gm.settings.lm_urls[lm]}/healthz"
        lost_after = gm.settings.lm_lost_after
        given_up = False
        while not await self._answers(url):
            down_for = time.monotonic() - self.down[lm]
            if lost_after and not given_up and down_for >= lost_after:
                given_up = True
                reason = f"LM {lm} unreachable for {down_for:.0f} s (MEGHA_LM_LOST_AFTER={lost_after:g} s)"
                log.error(
                    "%s: its runs of this GM are given up and run again elsewhere",
                    reason,
                    extra=ids(gm=gm.settings.gm_id, lm=lm),
                )
                await gm.apply(lambda core, why=reason: core.lm_lost(lm, why, time.time()))
            await asyncio.sleep(PROBE_EVERY)
        down_for = time.monotonic() - self.down.pop(lm)
        log.warning(
            "LM %d answers again after %.1f s: back in this GM's view%s",
            lm,
            down_for,
            " (the runs given up there are stopped)" if given_up else "",
            extra=ids(gm=gm.settings.gm_id, lm=lm),
        )
        await gm.apply(lambda core: core.lm_reachable(lm, time.time()))

    async def _answers(self, url: str) -> bool:
        """Whether the LM at `url` answers its health check, ready."""
        try:
            r = await self.gm.calls.get(url)
            return r.status == 200 and json.loads(r.body).get("ready") is True
        except (CallError, ValueError, AttributeError):
            return False

    def cancel(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        self.down.clear()
