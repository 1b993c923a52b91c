"""Which LMs a GM cannot reach, and what it does about them (docs/reliability.md, "An LM that cannot be reached").

A call to an LM that fails in transport (no connection, no answer: `CallError`) takes that LM out of the GM's view
at once (`GlobalMaster.lm_unreachable`): nothing more is placed there, and the call itself goes on under its retry
policy. So does a failed health check: every GM checks every LM's `GET /healthz` every `CHECK_EVERY` seconds, so
that a GM that seldom calls an LM (its view of it full, say) still learns that it went, and gives up its runs there.
The GM then asks the LM's `GET /healthz` every `PROBE_EVERY` seconds; once it answers ready, the LM is back in the
view (`GlobalMaster.lm_reachable`, which also stops there the runs given up meanwhile). An LM that stays
unreachable for MEGHA_LM_LOST_AFTER seconds has its runs given up (`GlobalMaster.lm_lost`): each runs again as its
next attempt elsewhere, as a lost worker's runs do.

An LM that restarted (a new incarnation in its health check, or its rebuilt notice) is asked for its layout
(`GET /v1/cluster`) before this GM places there again: one that came back with other settings (another
MEGHA_NUM_GMS or MEGHA_EXPECTED_NODES, agents with other capacities, constraints or drivers) stays out of the view,
with one ERROR line saying what differs, until it runs with the layout this GM places by again (`lm_layout`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING

from megha.services.background import spawn
from megha.services.client import CallError
from megha.services.gm.lm_layout import difference
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
        self.incarnations: dict[int, int] = {}  # LM -> the incarnation whose layout this GM last checked
        self.other_layout: dict[int, str] = {}  # LM -> how its layout differs from this GM's view (out of the view)
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
            r = await self.gm.calls.get(f"{url}/healthz")
        except CallError as exc:
            self.unreachable(lm, exc)
            return
        incarnation = _ready_incarnation(r.body) if r.status == 200 else None
        if incarnation is not None and incarnation != self.incarnations.get(lm):
            await self.check_layout(lm, incarnation)

    async def check_layout(self, lm: int, incarnation: int) -> bool:
        """LM `lm` runs as `incarnation` (new to this GM): compare its layout with this GM's view of it. One that
        differs is taken out of the view, one that is the same again is taken back in. Whether it is the same (True
        too when the LM could not be asked: the next check asks again)."""
        gm = self.gm
        if gm.cluster is None:
            return True
        try:
            r = await gm.calls.get(f"{gm.settings.lm_urls[lm]}/v1/cluster")
        except CallError:
            return True
        if r.status != 200:
            return True
        try:
            why = difference(gm.cluster, lm, r.body)
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            why = f"its layout cannot be read ({exc})"
        known = self.incarnations.get(lm)
        self.incarnations[lm] = incarnation
        if why is not None:
            if self.other_layout.get(lm) != why:
                log.error(
                    "LM %d restarted with another layout than this GM places by: %s; nothing is placed there until it "
                    "runs with its earlier settings again, or every GM restarts with its new ones",
                    lm,
                    why,
                    extra=ids(gm=gm.settings.gm_id, lm=lm),
                )
            self.other_layout[lm] = why
            await gm.apply(lambda core: core.lm_unreachable(lm) or [])
            return False
        if self.other_layout.pop(lm, None) is not None:
            log.warning(
                "LM %d runs with the layout this GM places by again: back in this GM's view",
                lm,
                extra=ids(gm=gm.settings.gm_id, lm=lm),
            )
            if lm not in self.down:
                await gm.apply(lambda core: core.lm_reachable(lm, time.time()))
        elif known is not None and known != incarnation:
            log.info(
                "LM %d restarted (incarnation %d) with the layout this GM places by",
                lm,
                incarnation,
                extra=ids(gm=gm.settings.gm_id, lm=lm),
            )
        return True

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
        while (incarnation := await self._answers(url)) is None:
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
        same = incarnation == self.incarnations.get(lm) or await self.check_layout(lm, incarnation)
        down_for = time.monotonic() - self.down.pop(lm)
        if not same:
            return  # out of the view until it runs with this GM's layout again (`check_layout`)
        log.warning(
            "LM %d answers again after %.1f s: back in this GM's view%s",
            lm,
            down_for,
            " (the runs given up there are stopped)" if given_up else "",
            extra=ids(gm=gm.settings.gm_id, lm=lm),
        )
        await gm.apply(lambda core: core.lm_reachable(lm, time.time()))

    async def _answers(self, url: str) -> int | None:
        """The incarnation of the LM at `url` when it answers its health check, ready (else None)."""
        try:
            r = await self.gm.calls.get(url)
        except CallError:
            return None
        return _ready_incarnation(r.body) if r.status == 200 else None

    def cancel(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        self.down.clear()
        self.incarnations.clear()
        self.other_layout.clear()


def _ready_incarnation(body: bytes) -> int | None:
    """The incarnation an LM's `/healthz` answer gives when it says ready (-1: ready, from an LM that gives none)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("ready") is not True:
        return None
    incarnation = doc.get("incarnation", -1)
    return incarnation if isinstance(incarnation, int) else -1
