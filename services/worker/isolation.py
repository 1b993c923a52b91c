"""A uid of its own for each exec run: leased host-wide from MEGHA_TASK_UIDS with a lock file (so several agents of
one host never share one) and only when no process of that uid is left (`TaskUids`). The run's processes are
signalled all at once with kill(-1) from a child that became the uid, so one that left the session is still
reached (`signal_uid`); when the run ends every process of the uid is killed (`kill_uid`) and what it left in the
shared temporary folders and System V IPC is removed (`purge_uid`), before the uid is free again. Where the agent
may make mount namespaces, a run has a /proc and temporary folders of its own instead of the host's
(`why_no_private_proc`, `why_no_own_folders`), and on the machines the filter knows, no run makes a user namespace
(`why_no_syscall_filter`). The agent's own folders are private to it (`private_folder`)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import logging
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from megha.common.lifecycle import StartupError
from megha.services.worker import enforcement
from megha.services.worker.enforcement import live_processes, processes, status_field, sysvipc

log = logging.getLogger(__name__)

KILL_WAIT_SECONDS = 10.0
"""How long the end of a run waits for the processes of its uid to be gone after SIGKILL (one stuck in the kernel
may take a while); a uid with a process left is not leased again until it is gone."""
UID_LOCKS = Path("/run/megha-task-uids")
"""Where agents of one host lease task uids: a lock file per uid, held (flock) while a run has it."""
SHARED_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
"""Folders every uid may write to: what a run's uid left at their top level is removed when the run ends."""
OWN_FOLDERS = enforcement.OWN_FOLDERS
SETUID_CAPABILITIES = {"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3, "CAP_SETGID": 6, "CAP_SETUID": 7}
"""What the agent needs to give runs uids of their own: switch to the uid, hand it its scratch folder, and remove
what the uid left behind (root has them all, unless they were dropped)."""
_LIBC = ctypes.CDLL(None, use_errno=True)
_IPC_RMID = 0
_PR_SET_NO_NEW_PRIVS = 38
_CLONE_NEWUSER = 0x10000000
_SYS_CLONE3 = 435  # the same on every architecture
_SYS_IO_URING_SETUP = 425  # the same on every architecture


@dataclass(frozen=True)
class UidLease:
    """A uid (and the gid of the same number) one run holds; `lock` is the open lock file that holds it."""

    uid: int
    lock: int

    @property
    def gid(self) -> int:
        return self.uid


class TaskUids:
    """The uids runs take, one each (MEGHA_TASK_UIDS), leased host-wide: a uid is taken only when no agent of the
    host holds its lock file and no live process has it. A uid that zombies still hold (killed, not yet reaped by
    the host's init) is taken only when no other is free: zombies count against the uid's process limit.

    Leases are taken at once by an agent's threads and by the agents of a host: the lock decides. Each lease
    opens the lock file anew, and flock's locks belong to open files, not processes, so two threads of one agent
    exclude each other as two agents do. A lease is released (its descriptor closed) when its run's processes are
    all killed; one left alive (stuck in the kernel) keeps its uid from being leased again until it is gone.

    A run with a `workdir` notes it in its lock file (`note_workdir`) until what it left there is handed over
    (`disown`): should its agent die first, the next lease of the uid hands it over before the uid is taken
    (`disown_limit`: the entries one look through may take, MEGHA_TASK_MAX_DISK_FILES)."""

    def __init__(self, uids: range, locks: Path = UID_LOCKS, disown_limit: int = 100_000) -> None:
        self.uids = uids
        self.disown_limit = disown_limit
        self.given_back: Callable[[], None] | None = None  # told of every release (from any thread): a start may wait
        self._locks_path = locks
        self._locks: int | None = None  # the lock folder, opened by `prepare`
        self._next = 0  # where the next lease starts looking, so that uids are reused as late as possible

    def prepare(self) -> None:
        """Check the range is usable here (raises `StartupError` saying why not) and open the lock folder."""
        if self._locks is not None:
            return
        taken = sorted(f"{u.pw_name} ({u.pw_uid})" for u in pwd.getpwall() if u.pw_uid in self.uids)
        if taken:
            raise StartupError(
                f"MEGHA_TASK_UIDS={describe_range(self.uids)} holds the uids of users of this host ({', '.join(taken)}"
                "): tasks would act as them; choose a range no user, group or program uses"
            )
        locks = self._locks_path
        if not locks.parent.is_dir():  # no /run: a private folder in the system's temp folder instead
            locks = Path(tempfile.gettempdir()) / "megha-task-uids"
        self._locks = private_folder(locks, "the task uids' lock folder")
        self._locks_path = locks

    def lease(self) -> UidLease:
        """A uid for a new run; raises `OSError` (EAGAIN) when every uid of the range is held or has processes."""
        self.prepare()
        assert self._locks is not None
        live: set[int] = set()
        zombies: set[int] = set()
        for p in processes():
            (zombies if p.zombie else live).update(uid for uid in p.uids if uid in self.uids)
        count = len(self.uids)
        aside = 0
        for i in range(2 * count):  # the second round takes uids only zombies hold
            uid = self.uids[(self._next + i) % count]
            if uid in live or (uid in zombies and i < count):
                continue
            if self.is_set_aside(uid):
                aside += i < count
                continue
            fd = os.open(str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self._locks)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    free = True
                except BlockingIOError:
                    free = False
                # Not free after all when a process has it: one the run that released it a moment ago left.
                free = free and not live_processes(uid)
                if free:
                    purge_uid(uid)  # what an earlier run left, should its agent have died before removing it
                    if why := self._disown_noted(fd, uid):
                        self.set_aside(uid, why)
                        free = False
            except BaseException:  # the lock goes with its descriptor: never held for a lease not made
                os.close(fd)
                raise
            if not free:
                os.close(fd)
                continue
            self._next = (self._next + i + 1) % count
            return UidLease(uid, fd)
        raise OSError(
            errno.EAGAIN,
            f"every task uid of MEGHA_TASK_UIDS={describe_range(self.uids)} is taken, by running tasks or processes "
            "they left (see them with ps -eo uid,pid,stat,cmd)"
            + (f"; {aside} set aside (their runs' files in a workdir could not all be handed over)" if aside else ""),
        )

    def release(self, lease: UidLease) -> None:
        os.close(lease.lock)
        if self.given_back is not None:
            self.given_back()

    def note_workdir(self, lease: UidLease, workdir: str) -> None:
        """The run holding `lease` works in `workdir`: what it leaves there must be handed over before the uid is
        leased again, even if this agent dies first."""
        os.ftruncate(lease.lock, 0)
        os.pwrite(lease.lock, os.fsencode(workdir), 0)

    def workdir_handed_over(self, lease: UidLease) -> None:
        os.ftruncate(lease.lock, 0)

    def _disown_noted(self, lock: int, uid: int) -> str | None:
        """Hand over what a run of `uid` whose agent died left in the workdir noted in its lock file."""
        noted = os.pread(lock, os.fstat(lock).st_size, 0)
        if not noted:
            return None
        why = disown(os.fsdecode(noted), uid, self.disown_limit)
        if why is None:
            os.ftruncate(lock, 0)
        return why

    def set_aside(self, uid: int, why: str) -> None:
        """Keep `uid` from being leased again: what a run of it left in its workdir could not all be handed over
        (`disown`: `why`), and the next run given the uid would read and change it. A file `<uid>.aside` beside the
        uid's lock file says so until an operator removes it (the host's restart does, emptying /run)."""
        assert self._locks is not None
        name = f"{uid}.aside"
        fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self._locks
        )
        with os.fdopen(fd, "w") as marker:
            marker.write(why + "\n")
        log.warning(
            "task uid %d set aside, not leased again: %s; once the files of uid %d there are handed over or removed, "
            "remove %s/%s to lease it again",
            uid,
            why,
            uid,
            self._locks_path,
            name,
        )

    def is_set_aside(self, uid: int) -> bool:
        assert self._locks is not None
        try:
            os.stat(f"{uid}.aside", dir_fd=self._locks, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True


def describe_range(uids: range) -> str:
    return f"{uids.start}-{uids.stop - 1}"


_SIGNALLING: dict[int, int] = {}
"""Per uid, how many times `signal_uid` began or ended signalling it: odd while its child, a copy of the agent that
became the uid, may be alive (`signalling_marks`)."""
_SIGNALLING_LOCK = threading.Lock()


def _mark_signalling(uid: int) -> None:
    with _SIGNALLING_LOCK:
        _SIGNALLING[uid] = _SIGNALLING.get(uid, 0) + 1


def signalling_marks(uids: Iterable[int]) -> dict[int, int]:
    """Where `signal_uid` stands for each of `uids`, to be given to `signalled_since` after a look at their
    processes."""
    return {uid: _SIGNALLING.get(uid, 0) for uid in uids}


def signalled_since(marks: dict[int, int]) -> set[int]:
    """The uids of `marks` whose `signal_uid` child may have been alive since the marks were taken: a look at their
    processes meanwhile may have counted that copy of the agent (its memory, its descriptors) as theirs."""
    return {uid for uid, mark in marks.items() if mark % 2 or _SIGNALLING.get(uid, 0) != mark}


def signal_uid(uid: int, signum: int) -> None:
    """Send `signum` to every process of `uid` at once: kill(-1) from a child process that became `uid`. The kernel
    signals every process that child may signal in one pass that no fork can slip through, so a fork bomb cannot
    outrun it, and a process that left its session is reached. The child does not run a new program, so it works
    when the uid is at its process limit. Needs CAP_SETUID. Until it is reaped, the child is a process of the uid
    that holds the agent's memory and descriptors: `signalled_since` tells the memory watch so."""
    if uid <= 0:
        raise ValueError(f"uid {uid}: only a task's uid is signalled this way")
    _mark_signalling(uid)
    try:
        with warnings.catch_warnings():  # Python 3.12+ warns of fork() in a process with threads
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setresuid(uid, uid, uid)
                if os.getresuid() == (uid, uid, uid):  # never kill(-1) as anyone else
                    os.kill(-1, signum)
                    code = 0
            except BaseException:
                pass
            finally:
                os._exit(code)
        os.waitpid(pid, 0)
    finally:
        _mark_signalling(uid)


def kill_uid(uid: int, within: float = KILL_WAIT_SECONDS) -> list[int]:
    """SIGKILL every process of `uid` and wait until none is alive; returns those still alive after `within`
    seconds (none, unless one is stuck in the kernel)."""
    deadline = time.monotonic() + within
    while True:
        signal_uid(uid, signal.SIGKILL)
        left = live_processes(uid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.01)


def purge_uid(uid: int) -> None:
    """Remove what `uid` left where every uid may write: its entries at the top of SHARED_FOLDERS (and of the
    system's temp folder) and its System V shared memory segments, message queues and semaphore sets. Called when
    none of its processes is left, so nothing of it adds more meanwhile."""
    if uid <= 0:
        raise ValueError(f"uid {uid}: only what a task's uid left is removed")
    for path in {*SHARED_FOLDERS, tempfile.gettempdir()}:
        try:
            folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            with os.scandir(folder) as entries:
                left = [e for e in entries if _owner(e) == uid]
            for entry in left:
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.name, dir_fd=folder, ignore_errors=True)
                    else:
                        os.unlink(entry.name, dir_fd=folder)
        finally:
            os.close(folder)
    for kind, key, remove in (("shm", "shmid", _LIBC.shmctl), ("msg", "msqid", _LIBC.msgctl)):
        for row in sysvipc(kind):
            if uid in (int(row["uid"]), int(row["cuid"])):
                remove(int(row[key]), _IPC_RMID, None)
    for row in sysvipc("sem"):
        if uid in (int(row["uid"]), int(row["cuid"])):
            _LIBC.semctl(int(row["semid"]), 0, _IPC_RMID)


DISOWN_MAX_DEPTH = 256
"""How deep `disown` follows the folders a run could write to below its workdir (one open descriptor a level)."""
_AT_EMPTY_PATH = 0x1000


def disown(folder: str, uid: int, limit: int, skip: frozenset[str] = frozenset()) -> str | None:
    """Hand what `uid` left in `folder` (its run's `workdir`) to the agent's user, so that the next run given the uid,
    of whichever user, reads and changes none of it: every file, folder and link the uid owns there, and in the
    folders below it the uid could have written to (its own, and those every user may write to), becomes the
    agent's user's and group's, its mode kept (the kernel drops set-user-ID and set-group-ID bits). What every user
    may read stays readable; what was the run's alone (a task's files are, by default) is then the host's root's.

    Called when no process of the uid is left, so nothing of it changes meanwhile; each entry is opened without
    following links (O_PATH) and changed through that descriptor, so another run renaming entries in a shared
    folder meanwhile cannot make it change a file the uid does not own. Returns None when done, or why not: more than
    `limit` entries looked at, folders nested deeper than DISOWN_MAX_DEPTH, or a change refused (a network file
    system that maps root to nobody, say). The caller then sets the uid aside rather than lease it again. Folders in
    `skip` (the run's own /proc and temporary folders, which it saw instead of the host's) are not looked into."""
    try:
        top = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None  # gone (or never a folder): nothing of the run's is left there
        return f"could not open {folder}: {exc.strerror}"
    owner, group = os.geteuid(), os.getegid()
    looked = 0
    # A stack of the folders being listed: (its descriptor, its entries' iterator, its path for messages).
    stack: list[tuple[int, Iterator[os.DirEntry[str]], str]] = []
    try:
        stack.append((top, os.scandir(top), folder))
        if os.fstat(top).st_uid == uid and not _chown_fd(top, owner, group):
            return f"could not give {folder} to uid {owner}: {os.strerror(ctypes.get_errno())}"
        while stack:
            fd, entries, path = stack[-1]
            entry = next(entries, None)
            if entry is None:
                entries.close()  # type: ignore[attr-defined]
                os.close(fd)
                stack.pop()
                continue
            looked += 1
            if looked > limit:
                return f"more than {limit} files and folders to look at in {folder}"
            try:
                seen = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # removed meanwhile
            folder_below = stat.S_ISDIR(seen.st_mode)
            writable = folder_below and (seen.st_uid == uid or seen.st_mode & stat.S_IWOTH)
            if seen.st_uid != uid and not writable:
                continue
            try:
                handle = os.open(entry.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                continue  # removed or renamed meanwhile
            try:
                now = os.fstat(handle)
                if now.st_uid == uid and not _chown_fd(handle, owner, group):
                    where = os.path.join(path, entry.name)
                    return f"could not give {where} to uid {owner}: {os.strerror(ctypes.get_errno())}"
                if not stat.S_ISDIR(now.st_mode) or not (now.st_uid == uid or now.st_mode & stat.S_IWOTH):
                    continue
                if os.path.join(path, entry.name) in skip:
                    continue
                if len(stack) >= DISOWN_MAX_DEPTH:
                    return f"folders nested deeper than {DISOWN_MAX_DEPTH} in {folder}"
                below = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=handle)
            except OSError:
                continue
            finally:
                os.close(handle)
            try:
                stack.append((below, os.scandir(below), os.path.join(path, entry.name)))
            except OSError:
                os.close(below)
        return None
    except OSError as exc:
        return f"could not look through {folder}: {exc.strerror}"
    finally:
        for fd, entries, _ in stack:
            entries.close()  # type: ignore[attr-defined]
            os.close(fd)


def _chown_fd(fd: int, owner: int, group: int) -> bool:
    """Change the owner of what `fd` (possibly an O_PATH descriptor of a link) refers to, itself, not a link's
    target. False when refused (the errno is ctypes')."""
    return _LIBC.fchownat(fd, b"", owner, group, _AT_EMPTY_PATH) == 0


def _owner(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_uid
    except OSError:
        return -1


def why_no_uid_switch(uids: range) -> str | None:
    """Why this agent cannot give runs the uids of `uids` (None: it can): the capabilities it lacks, or a range its
    user namespace does not map."""
    try:
        effective = int(status_field(Path("/proc/self/status").read_bytes(), b"CapEff")[0], 16)
    except (OSError, IndexError, ValueError):
        effective = 0
    missing = [name for name, bit in SETUID_CAPABILITIES.items() if not effective >> bit & 1]
    if missing:
        return f"it runs as uid {os.geteuid()} without {', '.join(missing)}"
    for kind in ("uid", "gid"):
        try:
            extents = [
                tuple(map(int, line.split())) for line in Path(f"/proc/self/{kind}_map").read_text().splitlines()
            ]
        except OSError:
            continue
        if not any(inside <= uids.start and uids.stop <= inside + count for inside, _, count in extents):
            mapped = "; ".join(f"{inside}-{inside + count - 1}" for inside, _, count in extents)
            return (
                f"its user namespace maps {kind}s {mapped} only, not MEGHA_TASK_UIDS={describe_range(uids)} "
                f"(/proc/self/{kind}_map)"
            )
    return None


def why_no_private_proc() -> str | None:
    """Why a run cannot have a /proc of its own that hides the other runs' processes (None: it can): a kernel
    before 5.8, or an agent not allowed to make mount namespaces (no CAP_SYS_ADMIN, as in a container by default).
    Tried once, on a child process that exits at once."""
    release = re.match(r"(\d+)\.(\d+)", os.uname().release)
    if release is None or tuple(map(int, release.groups())) < enforcement.PRIVATE_PROC_KERNEL:
        return f"kernel {os.uname().release} shares one set of /proc options between all its mounts (before 5.8)"
    try:
        subprocess.run(
            [sys.executable, "-c", ""], preexec_fn=enforcement.private_proc, check=True, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"it may not mount a /proc of a run's own ({exc})"
    return None


def why_no_syscall_filter(seccomp: enforcement.SeccompFilter | None) -> str | None:
    """Why runs cannot be kept from making user namespaces of their own and from io_uring (None: they can, with
    `seccomp`, the filter `enforcement.task_syscall_filter` built for this host): a machine it knows no system call
    numbers of, or a kernel that refuses the filter (one without seccomp filters) or does not apply it. Tried once,
    on a child process that installs it, checks that unshare(CLONE_NEWUSER) fails with EPERM and clone3 and
    io_uring_setup with ENOSYS, and exits at once."""
    if seccomp is None:
        return f"this host's machine ({os.uname().machine}) is none the filter knows the system calls of"
    with warnings.catch_warnings():  # Python 3.12+ warns of fork() in a process with threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # libc calls only, as between fork and exec
        code = 1
        try:
            if _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                code = 2
            else:
                try:
                    seccomp.install()
                except OSError as exc:
                    code = 100 + min(exc.errno or 0, 150)
                else:
                    code = 0
                    if _LIBC.unshare(_CLONE_NEWUSER) == 0 or ctypes.get_errno() != errno.EPERM:
                        code = 3
                    elif _LIBC.syscall(ctypes.c_long(_SYS_CLONE3), None, ctypes.c_long(0)) == 0 or (
                        ctypes.get_errno() != errno.ENOSYS
                    ):
                        code = 4
                    elif _LIBC.syscall(ctypes.c_long(_SYS_IO_URING_SETUP), ctypes.c_long(1), None) >= 0 or (
                        ctypes.get_errno() != errno.ENOSYS
                    ):
                        code = 5
        except BaseException:
            pass
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return None
    if code >= 100:
        return f"the kernel refused the seccomp filter ({os.strerror(code - 100)})"
    if code in (3, 4, 5):
        call = {3: "unshare(CLONE_NEWUSER)", 4: "clone3", 5: "io_uring_setup"}[code]
        return f"the kernel took the seccomp filter but {call} did not fail as it should"
    return f"a child process could not try the seccomp filter (exit status {code})"


def shared_folders(candidates: tuple[str, ...] = OWN_FOLDERS) -> tuple[str, ...]:
    """Those of `candidates` that are folders every user may write to here (not links: /var/tmp may link to /tmp)."""
    found = []
    for folder in candidates:
        with contextlib.suppress(OSError):
            st = os.lstat(folder)
            if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o002:
                found.append(folder)
    return tuple(found)


def why_no_own_folders(folders: tuple[str, ...]) -> str | None:
    """Why a run cannot have its own tmpfs over `folders` (one at least; None: it can), where it can have a /proc of
    its own (`why_no_private_proc`): a kernel without the new mount API (before 5.2), or a system call filter that
    refuses it. Tried once, on a child process that exits at once."""
    try:
        own = enforcement.OwnFolders.create(folders, enforcement.MIB)
    except OSError as exc:
        return f"it may not make a tmpfs of a run's own ({exc})"
    setup = functools.partial(enforcement.child_setup, None, None, 0, None, None, -1, True, own)
    try:
        subprocess.run([sys.executable, "-c", ""], preexec_fn=setup, check=True, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"it may not mount a tmpfs of a run's own ({exc})"
    finally:
        own.close()
    return None


def private_folder(path: Path, what: str) -> int:
    """Open `path` (O_NOFOLLOW), a folder only this agent's user may enter, creating it and missing parents 0700;
    tightens one it owns to 0700 while it is empty. Raises `StartupError` for a link, a file, a folder of another
    user, one in a folder another user may write to (unless sticky, as /tmp is): it could be swapped for another,
    and a folder that others may enter and that holds files already (a shared one such as /tmp, /var/log or a
    project's folder): tightening it would lock its other users out."""
    euid = os.geteuid()
    missing = []
    at = path
    while not os.path.lexists(at) and at != at.parent:
        missing.append(at)
        at = at.parent
    try:
        for folder in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o700)
        parent = os.stat(path.parent)
        if parent.st_uid not in (0, euid) or (parent.st_mode & 0o022 and not parent.st_mode & stat.S_ISVTX):
            raise StartupError(
                f"{what} {path}: its parent folder belongs to uid {parent.st_uid} or others may write to it "
                f"(mode {stat.S_IMODE(parent.st_mode):o})"
            )
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        how = "is a link or not a folder" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else exc.strerror or str(exc)
        raise StartupError(f"{what} {path}: {how}") from None
    st = os.fstat(fd)
    if st.st_uid != euid:
        os.close(fd)
        raise StartupError(f"{what} {path} belongs to uid {st.st_uid}, not to this agent's user (uid {euid})")
    if stat.S_IMODE(st.st_mode) != 0o700:
        if os.listdir(fd):
            os.close(fd)
            raise StartupError(
                f"{what} {path} holds files already and others may enter it (mode {stat.S_IMODE(st.st_mode):o}): "
                "name a folder of this agent's own, missing or empty (it is made 0700)"
            )
        os.fchmod(fd, 0o700)
    return fd
