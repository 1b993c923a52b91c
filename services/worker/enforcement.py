"""How the exec driver holds a task to its request and apart from the agent and from other tasks: a uid of its own
per run, a process limit, CPU and memory through cgroups v2 where the agent can create child cgroups, rlimits and
the agent's own watch of the task's processes otherwise (docs/drivers.md compares them).

Isolation, a uid of its own per run, is `services/worker/isolation.py`; this module holds the limits (cgroups or
rlimits) and the scans of the host's processes both use.

`detect` chooses once, at start-up, and says why cgroups v2 could not be used:

- `Cgroups`: a cgroup per run under ``<the agent's cgroup>/megha-<worker>-tasks``, ``cpu.max`` from the CPU
  request (a hard cap), ``memory.max`` from the memory request (the kernel's OOM killer stops the run; its
  ``memory.events`` count ``oom_kill`` says so; ``memory.oom.group`` makes it stop every process of the run), swap
  off. Needs the cgroup2 file system with the cpu and memory controllers, writable by the agent. When the agent's
  own cgroup holds the agent (the no-internal-process rule forbids enabling controllers there), the agent first
  moves itself into a leaf ``megha-agent``, as Docker-in-Docker does - only when it is the only process there.
  Not run on the development machine (a cgroup v1 host): docs/drivers.md says so.
- `Rlimits`: memory is capped per process by RLIMIT_DATA (an allocation beyond it fails in the program), and the
  agent sums the resident memory of the run's processes (those of its uid, or of its session when it runs as the
  agent's user), with what its uid holds in /dev/shm and System V shared memory, every WATCH_SECONDS and kills it
  when over the request. CPU cannot be capped by an rlimit: the run is only nice'd (NICE), so it yields to the
  agent and burn tasks.

Where the agent has CAP_SYS_ADMIN, each run also has a mount namespace of its own, with a /proc that shows it its own
processes only (`private_proc`) and a tmpfs of its own over the folders every user may write to (`OwnFolders`),
which the agent counts in its memory under rlimits.

Under either, a run makes no user namespace of its own and no io_uring (`SeccompFilter`, `task_syscall_filter`): inside
a user namespace it could mount a tmpfs the memory watch does not see, a file registered with a ring is held by no
descriptor the watch sees, and both are kernel attack surface. Under rlimits the watch also counts the memfds the
run's processes hold open and what their sockets' buffers hold (`open_descriptors`, `socket_memory`).

Each of a run's processes holds at most MEGHA_TASK_MAX_FILES descriptors (RLIMIT_NOFILE), under either; the watch
also counts the descriptors of all the run's processes together and, rather than look for memfds and removed files among
more than MEGHA_TASK_MAX_FILES, says the run holds too many (`memory_usage`), which kills it. Each file a run writes is
at most MEGHA_TASK_MAX_DISK_MB (RLIMIT_FSIZE), under either, and the watch counts what its files take of the disk
(`disk_usage`), under either too.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import resource
import signal
import stat
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from megha.services.worker.disk_usage import DiskPlaces, DiskUse, WatchKey, disk_usage
from megha.services.worker.drivers import Limits
from megha.services.worker.socket_memory import socket_bytes, socket_inode

CGROUP_PERIOD_US = 100_000
"""cpu.max's period: a run of C millicores gets C * 100 microseconds of CPU in every 100 ms."""
WATCH_SECONDS = 0.25
"""Rlimits: how often the agent sums each exec run's resident memory."""
NICE = 10
"""Rlimits: the niceness exec runs get, their CPU being uncapped."""
CONTROLLERS = ("cpu", "memory")
MIB = 1024 * 1024
_PAGE = os.sysconf("SC_PAGE_SIZE")
_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_NO_NEW_PRIVS = 38
_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000
# The new mount API (Linux 5.2; its system calls have the same numbers on every architecture): a tmpfs made detached
# by the agent, then moved into a run's mount namespace by the run's process.
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_FSOPEN, _SYS_FSCONFIG, _SYS_FSMOUNT = 428, 429, 430, 431, 432
_SYSCALL_NAMES = {428: "open_tree", 429: "move_mount", 430: "fsopen", 431: "fsconfig", 432: "fsmount"}
_FSOPEN_CLOEXEC = _FSMOUNT_CLOEXEC = _OPEN_TREE_CLONE = 0x1
_FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 1, 6
_MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x2, 0x4
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_AT_FDCWD = -100
PRIVATE_PROC_OPTIONS = b"hidepid=2"
"""A run's own /proc shows the processes of its uid only (hidepid=2, "invisible"): not the command lines of the
agent's other runs nor anyone else's."""
PRIVATE_PROC_KERNEL = (5, 8)
"""From Linux 5.8 each proc mount has its options of its own; before, hidepid on one would change the host's."""


class CgroupsUnusable(Exception):
    """Why this agent cannot use cgroups v2 (one line)."""


@dataclass(frozen=True)
class Rlimits:
    """Memory through RLIMIT_DATA and the agent's watch of resident memory; CPU only nice'd."""

    why_not_cgroups: str

    def describe(self) -> str:
        return (
            f"rlimits (cgroups v2 not usable: {self.why_not_cgroups}): memory capped per process by RLIMIT_DATA "
            f"and per task by the agent's watch of its resident memory every {WATCH_SECONDS:g} s; "
            f"CPU not capped, only nice {NICE}"
        )


@dataclass(frozen=True)
class Cgroups:
    """A cgroup v2 per run under `tasks`, with cpu.max and memory.max from its request."""

    tasks: Path

    def describe(self) -> str:
        return f"cgroups v2 under {self.tasks}: cpu.max and memory.max from each task's request"

    def create(self, name: str, limits: Limits) -> Path:
        """A run's cgroup with its limits (one left by an earlier life of the agent is emptied and reused)."""
        path = self.tasks / name
        with contextlib.suppress(FileExistsError):
            path.mkdir()
        kill_all(path)
        quota = max(1000, limits.cpu_millicores * CGROUP_PERIOD_US // 1000)  # the kernel's smallest quota: 1 ms
        (path / "cpu.max").write_text(f"{quota} {CGROUP_PERIOD_US}")
        (path / "memory.max").write_text(str(limits.memory_mb * MIB))
        with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to turn off
            (path / "memory.swap.max").write_text("0")
        with contextlib.suppress(FileNotFoundError):  # kernels before 4.19 kill one process, not the whole run
            (path / "memory.oom.group").write_text("1")
        return path


def signal_cgroup(path: Path, signum: int) -> None:
    """Send `signum` to every process of a cgroup."""
    for pid in _read(path / "cgroup.procs").split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signum)


def kill_all(path: Path) -> None:
    """SIGKILL every process of a cgroup (cgroup.kill where the kernel has it: no process escapes by forking)."""
    try:
        (path / "cgroup.kill").write_text("1")
    except FileNotFoundError:
        signal_cgroup(path, signal.SIGKILL)


def oom_kills(path: Path) -> int:
    """How many processes of a cgroup the OOM killer stopped (memory.events oom_kill)."""
    for line in _read(path / "memory.events").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


def cpu_seconds(path: Path) -> float:
    """CPU time a cgroup's processes used (cpu.stat usage_usec)."""
    for line in _read(path / "cpu.stat").splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    return 0.0


def peak_bytes(path: Path) -> int:
    """The most memory a cgroup's processes held at once (memory.peak; 0 on kernels before 5.19)."""
    return int(_read(path / "memory.peak") or 0)


def remove(path: Path, within: float = 5.0) -> None:
    """Kill what is left in a run's cgroup and remove it once empty (the kernel empties it asynchronously)."""
    kill_all(path)
    deadline = time.monotonic() + within
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        time.sleep(0.01)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def cgroup2_mount(mounts: str = "/proc/self/mounts") -> Path | None:
    """Where the cgroup2 file system is mounted, None when it is not."""
    for line in Path(mounts).read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def own_cgroup() -> str:
    """This process's cgroup v2 path ('/...'), from the '0::' line of /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise CgroupsUnusable("this process is in no cgroup v2 (/proc/self/cgroup has no 0:: line)")


def set_up_cgroups(worker_id: str) -> Cgroups:
    """Create this agent's parent of task cgroups with the cpu and memory controllers enabled for its children;
    raises `CgroupsUnusable` saying why that is not possible here."""
    mount = cgroup2_mount()
    if mount is None:
        raise CgroupsUnusable("no cgroup2 file system is mounted (the host uses cgroup v1)")
    own = mount / own_cgroup().lstrip("/")
    offered = _read(own / "cgroup.controllers").split()
    missing = [c for c in CONTROLLERS if c not in offered]
    if missing:
        raise CgroupsUnusable(
            f"cgroup {own} is not offered the {' and '.join(missing)} controller(s) (bound to cgroup v1, or not "
            "delegated)"
        )
    try:
        try:
            _enable(own)
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            # The no-internal-process rule: move this agent into a leaf of its cgroup first.
            others = [p for p in _read(own / "cgroup.procs").split() if p != str(os.getpid())]
            if others:
                raise CgroupsUnusable(
                    f"cgroup {own} holds {len(others)} other process(es), so it cannot enable controllers for "
                    "child cgroups"
                ) from exc
            leaf = own / "megha-agent"
            with contextlib.suppress(FileExistsError):
                leaf.mkdir()
            (leaf / "cgroup.procs").write_text(str(os.getpid()))
            _enable(own)
        tasks = own / f"megha-{worker_id}-tasks"
        with contextlib.suppress(FileExistsError):
            tasks.mkdir()
        tasks.chmod(0o711)  # the runs' cgroups are named after their tasks: entered by path, never listed by a run
        _enable(tasks)
    except OSError as exc:
        raise CgroupsUnusable(f"cannot create child cgroups under {own}: {exc.strerror or exc}") from exc
    return Cgroups(tasks)


def _enable(cgroup: Path) -> None:
    (cgroup / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in CONTROLLERS))


def detect(worker_id: str) -> Cgroups | Rlimits:
    """Cgroups v2 when this agent can create child cgroups with the cpu and memory controllers, else rlimits."""
    try:
        return set_up_cgroups(worker_id)
    except CgroupsUnusable as exc:
        return Rlimits(str(exc))


def private_proc() -> None:
    """Give the calling process a mount namespace of its own, unshared with the host's (private propagation), whose
    /proc is a new proc mount that shows each user only its own processes (`PRIVATE_PROC_OPTIONS`). Needs
    CAP_SYS_ADMIN; raises OSError otherwise. For the time between fork and exec: libc calls only."""
    if _LIBC.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
    if _LIBC.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "making the mount namespace private failed")
    if _LIBC.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, PRIVATE_PROC_OPTIONS) != 0:
        raise OSError(ctypes.get_errno(), "mounting a private /proc failed")


OWN_FOLDERS_FILES_PER_BYTE = 1 / 16384
"""How many files and folders a run's own tmpfs holds at most per byte of the run's memory request (at least
`OWN_FOLDERS_MIN_FILES`): an empty file takes no page of it, but a kernel inode the memory watch does not see."""
OWN_FOLDERS_MIN_FILES = 1024


class OwnFolders:
    """A run's own tmpfs over the folders every user may write to (/dev/shm, /tmp, ...), a subfolder (mode 1777) over
    each, all at most `size` bytes together: what the run writes there no other run sees, and it is gone with the
    run's mount namespace when the run's last process exits.

    The agent makes the tmpfs before the run's process exists, detached from every mount namespace (`create`); the
    process, between fork and exec, moves it into its own mount namespace and binds its subfolders over the folders
    (`mount`). The agent keeps its handle on the tmpfs for the run's whole life, so it counts what the run holds in it
    (`held_bytes`) whatever the run's processes do to their mounts, and frees it (`close`) when the run is over.
    Needs CAP_SYS_ADMIN and Linux 5.2 or later."""

    def __init__(self, fd: int, binds: list[tuple[bytes, bytes]], scratch: bytes | None) -> None:
        self._fd = fd  # the detached tmpfs (fsmount), mounted over binds[0]'s target by `mount`
        self._binds = binds  # (source, target): each subfolder over its folder, the first folder's last
        self._scratch = scratch  # the run's scratch folder when it lies in one of the folders: bound at its path again

    @classmethod
    def create(cls, folders: tuple[str, ...], size: int, scratch: Path | None = None) -> OwnFolders:
        """A detached tmpfs of at most `size` bytes (nosuid, nodev) with a subfolder for each of `folders` (none a
        link, none in another), and, when the run's `scratch` folder lies in one of them, a folder at its place for
        the process to bind it on. Raises OSError (ENOSYS: a kernel before 5.2;
        EPERM: no CAP_SYS_ADMIN)."""
        fs = _syscall(_SYS_FSOPEN, b"tmpfs", _FSOPEN_CLOEXEC)
        try:
            files = max(OWN_FOLDERS_MIN_FILES, int(size * OWN_FOLDERS_FILES_PER_BYTE))
            size = max(size, _PAGE)  # 0 would be no limit
            for key, value in (
                (b"source", b"megha-run"),
                (b"size", b"%d" % size),
                (b"nr_inodes", b"%d" % files),
                (b"mode", b"700"),
            ):
                _syscall(_SYS_FSCONFIG, fs, _FSCONFIG_SET_STRING, key, value, 0)
            _syscall(_SYS_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0)
            fd = _syscall(_SYS_FSMOUNT, fs, _FSMOUNT_CLOEXEC, _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV)
        finally:
            os.close(fs)
        try:
            binds = []
            first = os.fsencode(folders[0])
            for i, folder in enumerate(folders):
                os.mkdir(str(i), 0o700, dir_fd=fd)
                os.chmod(str(i), 0o1777, dir_fd=fd)
                binds.append((b"%s/%d" % (first, i), os.fsencode(folder)))
            binds.append(binds.pop(0))  # the first folder holds the others' subfolders: covered last
            place = None
            if scratch is not None:
                real = Path(os.path.realpath(scratch))
                for i, folder in enumerate(folders):
                    if real.is_relative_to(folder):
                        at = str(i)
                        for part in real.relative_to(folder).parts:  # root's, 0711; the bound folder covers the last
                            at = f"{at}/{part}"
                            os.mkdir(at, 0o700, dir_fd=fd)
                            os.chmod(at, 0o711, dir_fd=fd)
                        place = os.fsencode(real)
                        break
            return cls(fd, binds, place)
        except BaseException:
            os.close(fd)
            raise

    def mount(self) -> None:
        """In the run's process, between fork and exec, in its own mount namespace (`private_proc`): cover each folder
        with its subfolder of the run's tmpfs, and bind the run's scratch folder at its own path again. Libc calls
        only."""
        tree = -1
        if self._scratch is not None:  # taken before it is covered
            tree = _syscall(_SYS_OPEN_TREE, _AT_FDCWD, self._scratch, _OPEN_TREE_CLONE | os.O_CLOEXEC)
        _syscall(_SYS_MOVE_MOUNT, self._fd, b"", _AT_FDCWD, self._binds[-1][1], _MOVE_MOUNT_F_EMPTY_PATH)
        for source, target in self._binds:
            if _LIBC.mount(source, target, None, _MS_BIND, None) != 0:
                raise OSError(ctypes.get_errno(), f"binding a folder of the run's own over {target.decode()} failed")
        if tree >= 0:
            try:
                _syscall(_SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, self._scratch, _MOVE_MOUNT_F_EMPTY_PATH)
            finally:
                os.close(tree)

    def device(self) -> int:
        """The tmpfs's device (`st_dev` of its files)."""
        return os.fstat(self._fd).st_dev

    def held_bytes(self) -> int:
        """What the run's files take of its tmpfs (0 once closed)."""
        if self._fd < 0:
            return 0
        st = os.fstatvfs(self._fd)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def close(self) -> None:
        """Let go of the run's tmpfs: freed once no process of the run is left in its mount namespace."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _syscall(number: int, *args: int | bytes | None) -> int:
    """A system call glibc may have no wrapper for; raises OSError when it fails."""
    result: int = _LIBC.syscall(ctypes.c_long(number), *(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    if result < 0:
        raise OSError(ctypes.get_errno(), f"{_SYSCALL_NAMES[number]} failed")
    return result


# ------------------------------------------------------------------ no user namespaces, no io_uring (seccomp)

_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_CLONE_NEWUSER = 0x10000000
# Classic BPF, as seccomp runs it: the opcodes used, and what the filter returns.
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JSET_K, _BPF_RET_K = 0x20, 0x15, 0x45, 0x06
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
# struct seccomp_data: the system call's number, its architecture (AUDIT_ARCH_*), then its arguments, 8 bytes each;
# the low 32 bits of the first at 16 on a little-endian machine (clone and unshare's flags: the kernel reads only
# those of clone's, and unshare refuses any above).
_NR, _ARCH, _ARG0_LOW = 0, 4, 16
_X32 = 0x40000000  # x86-64's x32 ABI: its system calls have this bit set in their numbers, under AUDIT_ARCH_X86_64
_IO_URING = (425, 426, 427)  # io_uring_setup, io_uring_enter, io_uring_register: the same numbers on every table
# add_key, request_key, keyctl: the kernel's keyrings, per table. A uid's keyrings outlive its runs (the persistent
# one by days), and task uids are leased to one run after another, of any user.
_KEYS_X86_64, _KEYS_I386, _KEYS_AARCH64, _KEYS_ARM = (248, 249, 250), (286, 287, 288), (217, 218, 219), (309, 310, 311)
_FILTERED_CALLS: dict[str, dict[int, tuple[tuple[int, ...], ...]]] = {
    # The host's machine (os.uname): each architecture its processes may call the kernel as (the native one, and
    # the 32-bit one it runs programs of: int 0x80 from any x86-64 process reaches the i386 table), with the
    # numbers of clone, unshare, clone3 and the io_uring calls there.
    "x86_64": {
        0xC000003E: (
            (56, 272, 435, *_IO_URING, *_KEYS_X86_64),
            (_X32 | 56, _X32 | 272, _X32 | 435, *(_X32 | nr for nr in (*_IO_URING, *_KEYS_X86_64))),
        ),  # AUDIT_ARCH_X86_64 (and x32)
        0x40000003: ((120, 310, 435, *_IO_URING, *_KEYS_I386),),  # AUDIT_ARCH_I386
    },
    "aarch64": {
        0xC00000B7: ((220, 97, 435, *_IO_URING, *_KEYS_AARCH64),),  # AUDIT_ARCH_AARCH64
        0x40000028: ((120, 337, 435, *_IO_URING, *_KEYS_ARM),),  # AUDIT_ARCH_ARM (EABI)
    },
}
"""The system calls the task filter looks at, per host machine and architecture: clone and unshare (refused with
CLONE_NEWUSER), then those refused whatever their arguments (clone3, io_uring_setup, io_uring_enter,
io_uring_register, add_key, request_key, keyctl)."""


class SeccompFilter:
    """A seccomp BPF program, built by the agent and installed by a run's process between fork and exec
    (`install`). The process and every process it makes keep it, across exec, for their whole life."""

    def __init__(self, program: bytes) -> None:
        self.program = program
        self._buffer = ctypes.create_string_buffer(program, len(program))
        self._fprog = _SockFprog(len(program) // 8, ctypes.cast(self._buffer, ctypes.c_void_p))

    def install(self) -> None:
        """Install the filter on the calling thread (prctl only: fit for the time between fork and exec). Needs no
        new privileges (PR_SET_NO_NEW_PRIVS) or CAP_SYS_ADMIN; raises OSError."""
        if _LIBC.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(self._fprog), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def task_syscall_filter(machine: str | None = None) -> SeccompFilter | None:
    """The filter a run's processes get, for this host's `machine` (os.uname's). It keeps them from making user
    namespaces: `unshare` and `clone` with CLONE_NEWUSER in their flags fail with EPERM, and `clone3` with ENOSYS
    (its flags are in memory a filter cannot read; glibc falls back to clone, as under Docker's default profile).
    And from io_uring, as Docker's default profile does: `io_uring_setup`, `io_uring_enter` and `io_uring_register`
    fail with ENOSYS, as on a kernel without it (programs fall back to plain reads and writes); a ring is kernel
    attack surface, and a file registered with one is held by no descriptor the memory watch can see. And from the
    kernel's keyrings, as Docker's default profile does: `add_key`, `request_key` and `keyctl` fail with ENOSYS, as
    on a kernel without keys (Kerberos and the like fall back to files): a uid's keyrings outlive its run, and the
    next run given that uid may be another user's. Every other call is allowed. None on a machine it does not know
    the system calls of."""
    arches = _FILTERED_CALLS.get(os.uname().machine if machine is None else machine)
    if arches is None:
        return None
    code: list[tuple[int, int | str, int | str, int | str]] = []  # (opcode, jump if true, if false, k); labels
    code.append((_BPF_LD_W_ABS, 0, 0, _ARCH))
    for arch in arches:
        code.append((_BPF_JEQ_K, f"arch{arch:x}", 0, arch))
    code.append((_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW))  # a foreign architecture: never seen on these machines
    labels: dict[str, int] = {}
    for arch, tables in arches.items():
        labels[f"arch{arch:x}"] = len(code)
        code.append((_BPF_LD_W_ABS, 0, 0, _NR))
        for clone, unshare, *refused in tables:
            code.append((_BPF_JEQ_K, "flags", 0, clone))
            code.append((_BPF_JEQ_K, "flags", 0, unshare))
            code.extend((_BPF_JEQ_K, "enosys", 0, nr) for nr in refused)
        code.append((_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW))
    labels["flags"] = len(code)
    code.append((_BPF_LD_W_ABS, 0, 0, _ARG0_LOW))
    code.append((_BPF_JSET_K, 0, "allow", _CLONE_NEWUSER))
    code.append((_BPF_RET_K, 0, 0, _SECCOMP_RET_ERRNO | errno.EPERM))
    labels["allow"] = len(code)
    code.append((_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW))
    labels["enosys"] = len(code)
    code.append((_BPF_RET_K, 0, 0, _SECCOMP_RET_ERRNO | errno.ENOSYS))

    def jump(at: int, to: int | str) -> int:  # BPF jumps are forward, relative to the next instruction
        offset = to if isinstance(to, int) else labels[to] - at - 1
        assert 0 <= offset < 256
        return offset

    program = b"".join(
        struct.pack("=HBBI", op, jump(at, jt), jump(at, jf), k) for at, (op, jt, jf, k) in enumerate(code)
    )
    return SeccompFilter(program)


def child_setup(
    cgroup_procs: str | None,
    data_bytes: int | None,
    nice: int,
    max_processes: int | None,
    uid: int | None,
    gid: int,
    own_proc: bool = False,
    own_folders: OwnFolders | None = None,
    seccomp: SeccompFilter | None = None,
    max_files: int | None = None,
    max_file_bytes: int | None = None,
    workdir: bytes | None = None,
    workdir_failure_fd: int = -1,
) -> None:
    """Run in the task's process between fork and exec (subprocess's preexec_fn): join its cgroup (as the agent's
    user still), with `own_proc` a /proc that hides other users' processes (`private_proc`) and with `own_folders`
    its own tmpfs over the folders every user may write to (`OwnFolders.mount`, in the same mount namespace), no core
    dumps, cap its data segment, its open descriptors (`max_files`, soft and hard: a process of the run cannot raise
    it), the size of each file it writes (`max_file_bytes`, soft and hard: beyond, the kernel sends SIGXFSZ, or the
    write fails with EFBIG where the program ignores that signal) and its uid's processes, lower its priority, no
    new privileges from set-user-ID programs or file capabilities, then become `uid` and `gid` with no other group,
    enter `workdir` and install the `seccomp` filter (`task_syscall_filter`, built by the agent before the fork).

    The working folder is entered last, as the run's uid and in the run's own view of the file system: subprocess
    enters its `cwd` before this runs, as the agent, in the host's mount namespace, and a run left there would keep
    a folder outside what it may reach (the host's /proc, another run's /proc/<pid>/root, the host's /tmp). When
    the run cannot enter it, the error number is written to `workdir_failure_fd` (if given) before the error is
    raised, so that the agent can say why. Uses only modules imported already and no locks, as code between fork
    and exec must."""
    if cgroup_procs is not None:
        fd = os.open(cgroup_procs, os.O_WRONLY)
        try:
            os.write(fd, b"0")  # 0: the writing process
        finally:
            os.close(fd)
    if own_proc:
        private_proc()
        if own_folders is not None:
            own_folders.mount()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if data_bytes is not None:
        resource.setrlimit(resource.RLIMIT_DATA, (data_bytes, data_bytes))
    if max_files is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max_files, max_files))
    if max_file_bytes is not None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))
    if max_processes is not None:  # counted per real uid: only meaningful for a uid of the run's own
        resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))
    if nice:
        os.nice(nice)
    if _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if uid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    if workdir is not None:
        try:
            os.chdir(workdir)
        except OSError as exc:
            if workdir_failure_fd >= 0:
                os.write(workdir_failure_fd, b"%d" % (exc.errno or 0))
            raise
    if seccomp is not None:  # last: allowed by no new privileges whoever the process is now, root or not
        seccomp.install()


# ------------------------------------------------------------------------------------------- processes, by uid


@dataclass(frozen=True)
class Process:
    """One process, as /proc/<pid>/status shows it (not `stat`: a process that made itself non-dumpable shows its
    /proc folder as root's, but its status still names its uids)."""

    pid: int
    uids: tuple[int, ...]  # real, effective, saved, file system
    sid: int  # its session, as this agent's pid namespace numbers it (-1 when the kernel does not say)
    rss: int  # resident bytes
    zombie: bool


def processes() -> Iterator[Process]:
    """Every process, from /proc (one that ends while it is read is left out)."""
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/status", "rb") as f:
                    text = f.read()
            except OSError:
                continue
            uids = status_field(text, b"Uid")
            if not uids:
                continue
            sid = status_field(text, b"NSsid")
            rss = status_field(text, b"VmRSS")
            yield Process(
                pid=int(entry.name),
                uids=tuple(int(u) for u in uids),
                sid=int(sid[0]) if sid else -1,
                rss=int(rss[0]) * 1024 if rss else 0,
                zombie=status_field(text, b"State")[:1] == [b"Z"],
            )


def status_field(text: bytes, name: bytes) -> list[bytes]:
    """The values of one line of /proc/<pid>/status ([] when it has no such line)."""
    at = text.find(b"\n" + name + b":")
    if at < 0:
        return []
    end = text.find(b"\n", at + 1)
    return text[at + len(name) + 2 : end if end >= 0 else None].split()


def live_processes(uid: int) -> list[int]:
    """The pids of the live (not zombie) processes that have `uid` as any of their uids."""
    return [p.pid for p in processes() if uid in p.uids and not p.zombie]


def session_members(sid: int) -> list[int]:
    """The pids of the live processes of session `sid` (a process that left it with setsid is not one)."""
    return [p.pid for p in processes() if p.sid == sid and not p.zombie]


class Usage(NamedTuple):
    """What the memory watch saw of one run: `held`, the bytes its processes hold (`memory_usage`), and
    `descriptors`, how many descriptors they hold open. Over `memory_usage`'s `max_files`, counted only up to the
    process that took the run over it, and `held` then leaves out the memfds (not looked for). `disk`, what its files
    take of the disk, when this look counted it (`disk_usage`; None otherwise)."""

    held: int
    descriptors: int
    disk: DiskUse | None = None


def memory_usage(
    uids: set[int],
    sessions: set[int],
    max_files: int | None = None,
    disk: Mapping[WatchKey, DiskPlaces] | None = None,
    max_disk_files: int = 0,
) -> dict[tuple[str, int], Usage]:
    """Bytes held by each of `uids` (the resident memory of its processes, what it holds in /dev/shm and System V
    shared memory no process has attached) and each of `sessions` (its processes' resident memory), keyed
    ``("uid", uid)`` and ``("sid", sid)``, with the memfds their processes hold open (`open_descriptors`, each counted
    once) and what their sockets' buffers hold (`socket_memory`, each socket once), and the descriptors their
    processes hold open. Shared pages are counted in every process that maps them, and a /dev/shm file or memfd that
    is mapped is counted twice: an over-estimate, never an under-estimate. A run with its own tmpfs (`OwnFolders`)
    adds what it holds there itself: its /dev/shm is not the host's.

    `max_files`: at most this many descriptors are looked at for memfds per uid or session. Each process's are
    counted (a listing of /proc/<pid>/fd) before they are looked at, and once a uid's or session's processes hold
    more than `max_files` together, none more of them is looked at (nor counted): its `descriptors` is then over
    `max_files`, and its memfds and sockets are not counted.

    `disk`: the runs whose disk use this look counts too, and where (`disk_usage.disk_usage`, at most
    `max_disk_files` files and folders looked at per run), with the removed files on disk their processes hold open
    (among the descriptors looked at: none of a run over `max_files`)."""
    held: dict[tuple[str, int], int] = {}
    descriptors: dict[tuple[str, int], int] = {}
    memfds: dict[tuple[str, int], dict[tuple[int, int], int]] = {}
    sockets: dict[tuple[str, int], set[int]] = {}
    removed: dict[tuple[str, int], dict[tuple[int, int], int]] = {}
    in_memory = memory_devices()
    own_tmpfs = frozenset(p.own_device for p in (disk or {}).values() if p.own_device is not None)
    for p in processes():
        if p.zombie:
            continue
        keys = []
        if p.uids[0] in uids:
            keys.append(("uid", p.uids[0]))
        if p.sid in sessions:
            keys.append(("sid", p.sid))
        if not keys:
            continue
        for key in keys:
            held[key] = held.get(key, 0) + p.rss
        # Those over `max_files` already: the process's descriptors are not even counted.
        counted = [key for key in keys if max_files is None or descriptors.get(key, 0) <= max_files]
        if not counted:
            continue
        left = None if max_files is None else max(max_files - descriptors.get(key, 0) for key in counted)
        found = open_descriptors(p.pid, left, in_memory, own_tmpfs)
        for key in counted:
            descriptors[key] = descriptors.get(key, 0) + found.count
            if found.memfds:
                memfds.setdefault(key, {}).update(found.memfds)
            if found.removed:
                removed.setdefault(key, {}).update(found.removed)
            if found.sockets:
                sockets.setdefault(key, set()).update(found.sockets)
    within = {key for key in held if max_files is None or descriptors.get(key, 0) <= max_files}
    for key, files in memfds.items():
        if key in within:
            held[key] += sum(files.values())
    if any(key in within for key in sockets):
        buffered = socket_bytes()
        for key, inodes in sockets.items():
            if key in within:
                held[key] += sum(buffered.get(inode, 0) for inode in inodes)
    # /dev/shm always (a tmpfs by convention, as before mountinfo was read); the others where they are memory.
    folders = [f for f in OWN_FOLDERS if f == "/dev/shm" or _device(f) in in_memory]
    for uid, size in shared_memory_bytes(uids, folders).items():
        held[("uid", uid)] = held.get(("uid", uid), 0) + size
    on_disk = {}
    if disk:
        shared = [f for f in OWN_FOLDERS if f != "/dev/shm" and f not in folders]
        on_disk = disk_usage(disk, removed, shared, max_disk_files)
    return {key: Usage(size, descriptors.get(key, 0), on_disk.get(key)) for key, size in held.items()}


class Descriptors(NamedTuple):
    """What one process holds open (`open_descriptors`): how many descriptors; its memfds, by (device, inode), with
    the bytes each holds; the inodes of its sockets; and the removed files on disk it holds open, by (device,
    inode), with the blocks each takes."""

    count: int
    memfds: dict[tuple[int, int], int]
    sockets: set[int]
    removed: dict[tuple[int, int], int]


def open_descriptors(
    pid: int,
    at_most: int | None = None,
    in_memory: frozenset[int] = frozenset(),
    own_tmpfs: frozenset[int] = frozenset(),
) -> Descriptors:
    """How many descriptors process `pid` holds open, the memfds among them (memory in no file system the watch
    reads, in no page of a process that does not map it), by (device, inode) so that one held by several
    descriptors or processes counts once, with what each holds (its blocks), and its sockets' inodes (what their
    buffers hold: `socket_memory`). Among the memfds are the files of a memory file system (devices `in_memory`:
    `memory_devices`) that are removed but held open, such as a file of the host's /dev/shm unlinked after it was
    written, or made with O_TMPFILE: no folder lists them. The removed files of other file systems are on disk
    (`removed`), but for those of the runs' own tmpfs (devices `own_tmpfs`), which a run counts itself. When it holds
    more than `at_most`, none is looked at: counting them (listing /proc/<pid>/fd) costs much less than looking at
    each (a readlink). Nothing when the process is gone or ends meanwhile; a descriptor closed meanwhile is left
    out."""
    memfds: dict[tuple[int, int], int] = {}
    sockets: set[int] = set()
    removed: dict[tuple[int, int], int] = {}
    try:
        folder = os.open(f"/proc/{pid}/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return Descriptors(0, memfds, sockets, removed)
    try:
        names = os.listdir(folder)
        if at_most is not None and len(names) > at_most:
            return Descriptors(len(names), memfds, sockets, removed)
        for name in names:
            try:  # relative to the folder: a third less time per descriptor than by the whole path
                link = os.readlink(name, dir_fd=folder)
                if link.startswith("socket:["):
                    if (inode := socket_inode(link)) is not None:
                        sockets.add(inode)
                    continue
                memfd = link.startswith("/memfd:")
                if not memfd and not link.endswith(" (deleted)"):
                    continue
                st = os.stat(name, dir_fd=folder)
            except OSError:
                continue
            if memfd or (st.st_nlink == 0 and st.st_dev in in_memory and stat.S_ISREG(st.st_mode)):
                memfds[(st.st_dev, st.st_ino)] = st.st_blocks * 512
            elif st.st_nlink == 0 and st.st_dev not in own_tmpfs and stat.S_ISREG(st.st_mode):
                removed[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    except OSError:
        return Descriptors(0, {}, set(), {})
    finally:
        os.close(folder)
    return Descriptors(len(names), memfds, sockets, removed)


OWN_FOLDERS = ("/dev/shm", "/tmp", "/var/tmp", "/run/lock")
"""The shared folders a run gets a tmpfs of its own over, where the agent can (`OwnFolders`; all but /dev/mqueue, whose
queues stay the host's without an IPC namespace of the run's own: docs/drivers.md, "Isolation"). Where it cannot, the
memory watch counts what a run's uid keeps in those of them that are memory file systems (`shared_memory_bytes`)."""
MEMORY_FILE_SYSTEMS = ("tmpfs", "ramfs")
"""File systems whose files are memory (`memory_devices`)."""


def memory_devices() -> frozenset[int]:
    """The devices (`st_dev`) of this mount namespace's memory file systems (tmpfs, ramfs), from /proc/self/mountinfo:
    what a file on one holds is memory, in no process's pages."""
    found = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            with contextlib.suppress(ValueError, IndexError):  # ID, parent, major:minor, ..., "-", type, source, ...
                if fields[fields.index("-") + 1] in MEMORY_FILE_SYSTEMS:
                    major, minor = fields[2].split(":")
                    found.add(os.makedev(int(major), int(minor)))
    return frozenset(found)


def _device(path: str) -> int | None:
    try:
        return os.stat(path).st_dev
    except OSError:
        return None


def shared_memory_bytes(uids: set[int], folders: Sequence[str] = ("/dev/shm",)) -> dict[int, int]:
    """What each of `uids` holds in memory outside its processes: files it owns in `folders` (memory file systems,
    such as /dev/shm: their pages are memory), with everything in folders it owns there, and System V shared memory
    segments no process has attached (an attached segment's touched pages are in its processes' resident memory)."""
    found: dict[int, int] = {}
    if not uids:
        return found
    for shm in folders:
        with contextlib.suppress(OSError), os.scandir(shm) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_uid not in uids:
                    continue
                size = st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    for folder, _, files in os.walk(entry.path):
                        for name in files:
                            with contextlib.suppress(OSError):
                                size += os.lstat(os.path.join(folder, name)).st_blocks * 512
                found[st.st_uid] = found.get(st.st_uid, 0) + size
    for row in sysvipc("shm"):
        uid = int(row["uid"])
        if uid in uids and row.get("nattch") == "0":
            found[uid] = found.get(uid, 0) + int(row.get("rss", row["size"]))
    return found


def sysvipc(kind: str) -> list[dict[str, str]]:
    """The rows of /proc/sysvipc/<kind> (shm, msg or sem) by column name; [] when the kernel has none."""
    try:
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
    except OSError:
        return []
    if not lines:
        return []
    header = lines[0].split()
    return [dict(zip(header, line.split())) for line in lines[1:]]
