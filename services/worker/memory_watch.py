"""The agent's watch of its exec runs (`MemoryWatch`): one periodic scan of /proc shows each run what its processes
hold (memory, and how many descriptors) and, every few looks, what its files take of the disk, and a run over a limit
kills itself."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from megha.services.worker import enforcement, isolation
from megha.services.worker.disk_usage import DiskPlaces, WatchKey
from megha.services.worker.enforcement import Usage

DISK_LOOKS = 4
"""The watch counts the runs' disk at every this many looks (every second): a count walks their folders."""


class MemoryWatch:
    """Every WATCH_SECONDS, what each exec run holds (its uid's processes, the memfds they hold open and its shared
    memory, or its session's processes and their memfds: `enforcement.memory_usage`), and how many descriptors its
    processes hold open, and every DISK_LOOKS looks what its files take of the disk (`disk_usage`), shown to the run,
    which kills itself when over a limit. One scan of /proc serves every run; `max_files` (MEGHA_TASK_MAX_FILES)
    bounds the descriptors it looks at per run: a run found holding more is shown a count over `max_files` and no
    memfd; `max_disk_files` (MEGHA_TASK_MAX_DISK_FILES) the files and folders it looks at per run for its disk."""

    def __init__(self, max_files: int | None = None, max_disk_files: int = 0) -> None:
        self._max_files = max_files
        self._max_disk_files = max_disk_files
        self._runs: dict[WatchKey, Callable[[Usage], None]] = {}
        self._disk: dict[WatchKey, DiskPlaces] = {}
        self._watching: asyncio.Task[None] | None = None

    def add(self, key: WatchKey, seen: Callable[[Usage], None], disk: DiskPlaces | None = None) -> None:
        """Watch a run; `disk`: where its disk use is counted (None: it is not)."""
        self._runs[key] = seen
        if disk is not None:
            self._disk[key] = disk
        if self._watching is None or self._watching.done():
            self._watching = asyncio.get_running_loop().create_task(self._watch(), name="megha-exec-memory-watch")

    def forget(self, key: WatchKey) -> None:
        self._runs.pop(key, None)
        self._disk.pop(key, None)

    async def _watch(self) -> None:
        looks = 0
        while self._runs:
            runs = dict(self._runs)
            uids = {n for kind, n in runs if kind == "uid"}
            sessions = {n for kind, n in runs if kind == "sid"}
            disk = dict(self._disk) if looks % DISK_LOOKS == 0 else None
            looks += 1
            marks = isolation.signalling_marks(uids)
            # In a thread: reading every /proc/<pid>/status of a busy host takes a while.
            held = await asyncio.to_thread(
                enforcement.memory_usage, uids, sessions, self._max_files, disk, self._max_disk_files
            )
            # Not to a run whose uid the agent signalled meanwhile: the scan may have counted the signalling child,
            # a copy of the agent, as the run's (the agent's memory and descriptors: a run that has just exited
            # would be reported over its memory limit so).
            disturbed = isolation.signalled_since(marks)
            for key, usage in held.items():
                seen = runs.get(key)
                # Only to a run watched through the whole scan: a uid given back and leased again meanwhile is
                # another run's now, and what the scan saw of it was the ended run's.
                if seen is not None and self._runs.get(key) is seen and not (key[0] == "uid" and key[1] in disturbed):
                    seen(usage)
            await asyncio.sleep(enforcement.WATCH_SECONDS)
