"""A GM's journal copied to its peer: the sending side (`Replicator`, to the next GM of the ring) and the
receiving side (`ReplicaStore`, the copies of the previous GM's journal that this GM stands in for it with).

The copy lets the next GM serve a GM's queue while it stays down (services/gm/standin.py); a GM that returns
takes the copy back, with whatever its stand-in accepted, before it recovers (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from pydantic_core import to_json

from megha.common.models import MAX_BODY_BYTES
from megha.services.background import wait_event
from megha.services.client import CallError, ServiceClient
from megha.services.gm.journal import journal_lines, open_private

log = logging.getLogger("megha.gm")

RETRY_PAUSE = 2.0
"""Seconds between attempts to bring a peer's copy up to date after it could not be reached."""

KEEP_ALIVE = 2.0
"""Seconds of silence after which an empty batch goes to the peer (it answers 409 while standing in)."""


class Replicator:
    """Sends each journal line to the next GM as it is written, batching lines written meanwhile, and an empty batch
    every KEEP_ALIVE seconds when there is nothing to send: the peer refuses batches (409) while it stands in for
    this GM, which is how a GM that was stalled or cut off learns it must take its identity back. While the peer
    cannot be reached, the copy is marked behind and rebuilt from the whole journal once it can."""

    def __init__(
        self,
        url: str,
        gm: int,
        journal: Path,
        timeout: float,
        on_refused: Callable[[str], None],
        credentials: Callable[[], str] | None = None,
    ) -> None:
        """`on_refused(reason)`: the peer stands in for this GM, which must take its identity back. `credentials`:
        the Authorization header of the copies (`ServiceClient`)."""
        self.url = f"{url}/v1/peers/{gm}/journal"
        self.journal = journal
        self.on_refused = on_refused
        self._client = ServiceClient(timeout, authorization=credentials)
        self._lines: list[str] = []
        self._waiting: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self.behind = True  # the first send carries the whole journal
        self._sender: asyncio.Task[None] | None = None
        self.sent = 0

    def start(self) -> None:
        """Bring the peer's copy up to date with the whole journal now, then keep it so."""
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._run())

    def add(self, line: str) -> None:
        self._lines.append(line)
        self._wake.set()

    async def add_durably(self, line: str) -> None:
        """Add `line` and wait until the peer holds it, unless the copy is behind (the peer is unreachable: the GM's
        own journal holds every job, and the copy is rebuilt when the peer is back)."""
        self.add(line)
        if self.behind or self._sender is None:
            return
        done = asyncio.get_running_loop().create_future()
        self._waiting.append(done)
        await done

    async def _run(self) -> None:
        pause = 0.25  # after a failed send, doubling up to RETRY_PAUSE
        while True:
            if not self._lines and not self.behind:
                await wait_event(self._wake, KEEP_ALIVE)
            self._wake.clear()
            waiting, self._waiting = self._waiting, []
            reset = self.behind
            lines = journal_lines(self.journal) if reset else self._lines
            self._lines = []
            failure = await self._post(reset, lines)
            for done in waiting:
                if not done.done():
                    done.set_result(None)
            if failure is None:
                self.behind = False
                self.sent += len(lines)
                continue
            if not self.behind:
                log.warning("journal copy at %s is behind: %s", self.url, failure)
                pause = 0.25
            self.behind = True
            await asyncio.sleep(pause)
            pause = min(2 * pause, RETRY_PAUSE)

    async def _post(self, reset: bool, lines: list[str]) -> str | None:
        """None once the peer holds `lines`, else why not. In batches of at most MAX_BODY_BYTES of lines, the first
        one replacing the copy when `reset` (a journal grows past any one body's limit; a line alone may reach it)."""
        for batch in _batches(lines, MAX_BODY_BYTES):
            try:
                r = await self._client.post(self.url, to_json({"reset": reset, "lines": batch}))
            except CallError as exc:
                return str(exc)
            if r.status == 409:
                self.on_refused(r.text[:300])
            if r.status != 200:
                return f"{r.status}: {r.text[:300]}"
            reset = False
        return None

    async def close(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
        for done in self._waiting:
            if not done.done():
                done.set_result(None)
        await self._client.aclose()


def _batches(lines: list[str], size: int) -> list[list[str]]:
    """`lines` in order, in batches of at most `size` characters each (a longer line in a batch of its own); one
    empty batch for no lines (a keep-alive, or a reset to an empty journal)."""
    batches: list[list[str]] = [[]]
    held = 0
    for line in lines:
        if batches[-1] and held + len(line) > size:
            batches.append([])
            held = 0
        batches[-1].append(line)
        held += len(line)
    return batches


class ReplicaStore:
    """The copy of the previous GM's journal, one file per GM in this GM's journal folder."""

    def __init__(self, folder: Path, run_id: str) -> None:
        self.folder = folder
        self.run_id = run_id
        self._writing = asyncio.Lock()

    def path(self, gm: int) -> Path:
        return self.folder / f"{self.run_id}.gm-{gm}.copy.journal"

    async def write(self, gm: int, reset: bool, lines: list[str]) -> None:
        """Append `lines` (or replace the copy by them when `reset`), on disk before returning; one write at a
        time (batches a stalled GM sent pile up and arrive together)."""
        async with self._writing:
            await asyncio.to_thread(self._write, self.path(gm), reset, lines)

    @staticmethod
    def _write(path: Path, reset: bool, lines: list[str]) -> None:
        target = path.with_suffix(".tmp") if reset else path
        with open_private(target, "wb" if reset else "ab") as out:
            out.write("".join(line + "\n" for line in lines).encode())
            out.flush()
            os.fsync(out.fileno())
        if reset:
            target.replace(path)

    def lines(self, gm: int) -> list[str]:
        return journal_lines(self.path(gm))
