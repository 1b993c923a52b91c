"""Rlimits' memory enforcement for exec runs (`MemoryWatch`): one periodic scan of /proc shows each run what its
processes hold, and a run over its limit kills itself."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from megha.services.worker import enforcement

WatchKey = tuple[str, int]
"""What the memory watch sums for a run: ("uid", its uid), or ("sid", its session) when it runs as the agent's user."""


class MemoryWatch:
    """Rlimits: every WATCH_SECONDS, what each exec run holds (its uid's processes, the memfds they hold open and its
    shared memory, or its session's processes and their memfds: `enforcement.memory_usage`), shown to the run, which
    kills itself when over its limit. One scan of /proc serves every run."""

    def __init__(self) -> None:
        self._runs: dict[WatchKey, Callable[[int], None]] = {}
        self._watching: asyncio.Task[None] | None = None

    def add(self, key: WatchKey, seen: Callable[[int], None]) -> None:
        self._runs[key] = seen
        if self._watching is None or self._watching.done():
            self._watching = asyncio.get_running_loop().create_task(self._watch(), name="megha-exec-memory-watch")

    def forget(self, key: WatchKey) -> None:
        self._runs.pop(key, None)

    async def _watch(self) -> None:
        while self._runs:
            runs = dict(self._runs)
            uids = {n for kind, n in runs if kind == "uid"}
            sessions = {n for kind, n in runs if kind == "sid"}
            # In a thread: reading every /proc/<pid>/status of a busy host takes a while.
            held = await asyncio.to_thread(enforcement.memory_usage, uids, sessions)
            for key, resident in held.items():
                seen = runs.get(key)
                # Only to a run watched through the whole scan: a uid given back and leased again meanwhile is
                # another run's now, and what the scan saw of it was the ended run's.
                if seen is not None and self._runs.get(key) is seen:
                    seen(resident)
            await asyncio.sleep(enforcement.WATCH_SECONDS)
