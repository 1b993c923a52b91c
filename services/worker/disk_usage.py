"""What an exec run's files take of the disk, for the agent's watch (`memory_watch.MemoryWatch`): the blocks of its
scratch folder, of its uid's files at the top of the host's shared folders that are on disk (where runs share them),
and of the removed files on disk its processes hold open (found among their descriptors by
`enforcement.open_descriptors`), each file counted once however many names it has.

A count looks at no more than a run's `max_entries` files and folders: past them it stops, and says it found more
(`DiskUse.entries`), which is what the run's limit on files and folders holds it to."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Mapping, Sequence
from typing import NamedTuple

MIB = 1024 * 1024
WatchKey = tuple[str, int]
"""A watched run: ("uid", its uid), or ("sid", its session) when it runs as the agent's user."""


class DiskPlaces(NamedTuple):
    """Where one run's disk use is counted: the files `owner` owns in its `scratch` folder and, when `shared`, at the
    top of the host's shared folders on disk (the owner is a uid of the run's own); `own_device`, the device of the
    run's own tmpfs, whose removed files are memory the run counts itself, not disk."""

    owner: int
    scratch: str | None
    shared: bool
    own_device: int | None = None


class DiskUse(NamedTuple):
    """One run's disk: the `bytes` its files take (allocated blocks), and the files and folders looked at to find
    them (`entries`; over the count's `max_entries`, it stopped there and `bytes` is only what it found so far);
    `too_deep`: it met a folder nested past the longest path (PATH_MAX) and stopped, not knowing what it holds."""

    bytes: int
    entries: int
    too_deep: bool = False


class DiskLimit(NamedTuple):
    """The disk an exec run may fill: `max_mb` (MEGHA_TASK_MAX_DISK_MB), each file (RLIMIT_FSIZE) and all its files
    together, in at most `max_files` files and folders (MEGHA_TASK_MAX_DISK_FILES)."""

    max_mb: int
    max_files: int

    def describe(self) -> str:
        return f"filling at most {self.max_mb} MB of disk in {self.max_files} files and folders"

    def exceeded(self, use: DiskUse) -> bool:
        return use.bytes > self.max_mb * MIB or use.entries > self.max_files or use.too_deep

    def how_exceeded(self, use: DiskUse) -> str:
        """How `use` is over the limit, for the run's failure reason."""
        if use.too_deep:
            return "folders nested past the longest path the agent counts files in (PATH_MAX)"
        if use.entries > self.max_files:
            return f"more than {self.max_files} files and folders: MEGHA_TASK_MAX_DISK_FILES"
        return f"its files took {use.bytes / MIB:.0f} MB"


class _Tally:
    """The blocks of one owner's files, each file once, looked for among at most `max_entries` files and folders."""

    def __init__(self, owner: int, max_entries: int) -> None:
        self.owner = owner
        self.max_entries = max_entries
        self.entries = 0
        self.too_deep = False
        self.bytes = 0
        self.linked: dict[tuple[int, int], int] = {}  # files with several names (hard links): each counted once
        self.seen_tops: set[tuple[int, int]] = set()  # folders walked already (the scratch folder is in /tmp)

    @property
    def full(self) -> bool:
        return self.entries > self.max_entries or self.too_deep

    def total(self, removed: Mapping[tuple[int, int], int]) -> DiskUse:
        return DiskUse(self.bytes + sum(self.linked.values()) + sum(removed.values()), self.entries, self.too_deep)

    def add(self, st: os.stat_result) -> bool:
        """Count one file or folder (the owner's only); whether it was counted."""
        self.entries += 1
        if st.st_uid != self.owner:
            return False
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            self.linked[(st.st_dev, st.st_ino)] = st.st_blocks * 512
        else:
            self.bytes += st.st_blocks * 512
        return True

    def walk(self, top: str) -> None:
        """Count `top` and, when it is a folder of the owner's, everything of the owner's in it, never following a
        link; a folder that vanishes or is replaced meanwhile is passed over."""
        try:
            st = os.lstat(top)
        except OSError:
            return
        if (st.st_dev, st.st_ino) in self.seen_tops or self.full:
            return
        self.seen_tops.add((st.st_dev, st.st_ino))
        if not self.add(st) or not stat.S_ISDIR(st.st_mode):
            return
        folders = [top]
        while folders and not self.full:
            folders.extend(self._list(folders.pop()))

    def _list(self, folder: str) -> list[str]:
        """Count what `folder` holds; its subfolders of the owner's."""
        found: list[str] = []
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:  # gone or replaced meanwhile, but for a path too long to follow
            self.too_deep = exc.errno == errno.ENAMETOOLONG
            return found
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    if self.full:
                        break
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if self.add(st) and stat.S_ISDIR(st.st_mode):
                        found.append(f"{folder}/{entry.name}")
        finally:
            os.close(fd)
        return found


def disk_usage(
    places: Mapping[WatchKey, DiskPlaces],
    removed: Mapping[WatchKey, Mapping[tuple[int, int], int]],
    folders: Sequence[str],
    max_entries: int,
) -> dict[WatchKey, DiskUse]:
    """What each run of `places` takes of the disk: its scratch folder, its owner's entries at the top of `folders`
    (the host's shared folders on disk) when its places say so, and the `removed` files on disk its processes hold
    open (by (device, inode): blocks), each file once; at most `max_entries` files and folders looked at per run."""
    tops = _owned_tops({p.owner for p in places.values() if p.shared}, folders)
    found = {}
    for key, where in places.items():
        tally = _Tally(where.owner, max_entries)
        if where.scratch is not None:
            tally.walk(where.scratch)
        for top in tops.get(where.owner, []) if where.shared else []:
            tally.walk(top)
        found[key] = tally.total(removed.get(key, {}))
    return found


def _owned_tops(owners: set[int], folders: Sequence[str]) -> dict[int, list[str]]:
    """The entries at the top of `folders` that each of `owners` owns (one listing of each folder serves them all)."""
    tops: dict[int, list[str]] = {}
    if not owners:
        return tops
    for folder in folders:
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    owner = entry.stat(follow_symlinks=False).st_uid
                    if owner in owners:
                        tops.setdefault(owner, []).append(entry.path)
    return tops
