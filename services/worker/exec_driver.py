"""The exec driver: a task's command run as a uid of its own, in a session of its own, held to its request.

Each run leases a uid (and the gid of the same number) from MEGHA_TASK_UIDS that no other process has
(`isolation.TaskUids`): it cannot read, signal or ptrace the agent or another run, and the agent's environment
(/proc/<pid>/environ) and its secret files are closed to it. The command (argv, no shell) runs with a minimal
environment (PATH, HOME, LANG, TMPDIR, then the task's `env`: nothing of the agent's), umask 077, in the task's
`workdir` or else its scratch folder (0700 and the run's uid's, in the system's temp folder under a random name,
deleted when the run ends; also its TMPDIR), with no new privileges (a set-user-ID program does not make it root),
no user namespace of its own and no io_uring (a seccomp filter, `enforcement.task_syscall_filter`, on x86-64 and
arm64), at most MEGHA_TASK_MAX_PROCESSES processes and threads (RLIMIT_NPROC, counted per uid), at most
MEGHA_TASK_MAX_FILES open descriptors per process (RLIMIT_NOFILE), and its CPU and memory enforced as
`enforcement.detect` chose at start-up: cgroups v2 or rlimits. Where the agent has CAP_SYS_ADMIN, the run
has a mount namespace of its own with a /proc that shows it only its own processes and a tmpfs of its own, at most
its memory request, over /dev/shm, /tmp, /var/tmp and /run/lock (`enforcement.OwnFolders`; its scratch folder, on
the host, bound at its path again), counted in its memory under rlimits.

An agent that cannot switch uids (not root, or root without the capabilities for it) does not offer exec
(`DriverUnavailable`, one line at start-up), unless MEGHA_EXEC_AS_AGENT_USER: then runs take the agent's own uid,
as a warning at start-up says, with no process limit (it would count the agent's own) and found by their session.

The agent reaps the process itself (``os.wait4`` when its pidfd says it ended) to learn the CPU time it and the
children it waited for used. It reads the output pipes itself too (`output_pump.OutputPump`), not through the
loop's pipe transports. `memory_watch.MemoryWatch` shows each run what its processes hold and what its files take of
the disk, and a run over its memory (under rlimits), over its disk limit (MEGHA_TASK_MAX_DISK_MB, each file also held
to it by RLIMIT_FSIZE; MEGHA_TASK_MAX_DISK_FILES), or whose processes hold more than MEGHA_TASK_MAX_FILES descriptors
together, kills itself.

When the run ends, every process of its uid (or what it left in its session or cgroup) is killed, so its output
pipes close and nothing of it outlives the run, even a process that left the session; what the uid left in the
shared temporary folders and System V IPC is removed, and only then is the uid free again. A start that fails
after the process was made does the same.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import functools
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from megha.services.worker import enforcement, isolation
from megha.services.worker.disk_usage import DiskLimit, DiskPlaces, DiskUse
from megha.services.worker.drivers import Driver, DriverUnavailable, Exit, Limits, Run
from megha.services.worker.enforcement import MIB, Cgroups, OwnFolders, Rlimits, SeccompFilter, Usage
from megha.services.worker.isolation import TaskUids, UidLease, describe_range
from megha.services.worker.memory_watch import MemoryWatch, WatchKey
from megha.services.worker.output_pump import OutputPump
from megha.services.worker.tasklogs import RunLog, folder_name

if TYPE_CHECKING:
    from megha.common.core.task import RunSpec

log = logging.getLogger(__name__)

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TASK_UMASK = 0o077
"""What a task creates is its own uid's alone unless it says otherwise."""
UID_RECHECK = 2.0
"""Seconds between two looks for a free task uid by the start first in line for one, besides a look each time a run
of this agent gives its uid back (another agent of the host may give one back, or a run's last process be gone)."""

PIPE_DRAIN_SECONDS = 2.0
"""How long output is still read after the run's processes are gone (a process that left its session may hold
the pipes open)."""

_ALLOCATION_FAILED = re.compile(r"MemoryError|Cannot allocate memory|out of memory|bad_alloc", re.IGNORECASE)
"""Rlimits: what a program typically prints when an allocation fails at its RLIMIT_DATA."""
SHELL_SIGNAL_BASE = 128
"""A shell's exit code for a command a signal killed is this plus the signal's number."""
_FILE_TOO_LARGE = re.compile(r"File too large|File size limit exceeded")
"""What a program prints when a write fails at its RLIMIT_FSIZE (EFBIG, when it ignores SIGXFSZ, as Python does), or
a shell when SIGXFSZ killed a command of it."""


class ExecDriver(Driver):
    name = "exec"

    def __init__(
        self,
        worker_id: str,
        task_uids: range,
        max_processes: int,
        as_agent_user: bool = False,
        how: Cgroups | Rlimits | None = None,
        max_files: int = 4096,
        max_disk_mb: int = 10240,
        max_disk_files: int = 100_000,
        uid_wait: float = 60.0,
    ) -> None:
        """`task_uids`: the uids runs take, one each (MEGHA_TASK_UIDS); `max_processes`: the processes and threads
        a run may have (MEGHA_TASK_MAX_PROCESSES); `as_agent_user`: when the agent cannot switch uids, run tasks as
        its own user rather than not offer exec (MEGHA_EXEC_AS_AGENT_USER); `how`: how CPU and memory are enforced,
        None: as `enforcement.detect` chooses at `prepare`; `max_files`: the descriptors each process of a run may
        hold open, and under rlimits all of them together (MEGHA_TASK_MAX_FILES); `max_disk_mb`: the disk a run may
        fill, each file and all together (MEGHA_TASK_MAX_DISK_MB); `max_disk_files`: the files and folders it may keep
        where its disk is counted (MEGHA_TASK_MAX_DISK_FILES); `uid_wait`: how long a start waits for a task uid when
        every one is taken (MEGHA_TASK_UID_WAIT), in line with the others waiting."""
        self._worker_id = worker_id
        self._uids = TaskUids(task_uids, disown_limit=max_disk_files)
        self._uids.given_back = self._uid_given_back
        self._uid_wait = uid_wait
        self._uid_line: collections.deque[asyncio.Future[None]] = collections.deque()  # starts waiting for a uid
        self._uid_free = asyncio.Event()  # a run of this agent gave its uid back since the first in line looked
        self._loop: asyncio.AbstractEventLoop | None = None
        self._max_processes = max_processes
        self._max_files = max_files
        self._disk = DiskLimit(max_disk_mb, max_disk_files)
        self._as_agent_user = as_agent_user
        self._enforcement = how
        self._isolated: bool | None = None  # runs take uids of their own; None: not prepared yet
        self._own_proc = False  # each run has a /proc of its own that hides the other runs (`isolation`)
        self._own_folders: tuple[str, ...] = ()  # the shared folders each run has a tmpfs of its own over
        self._seccomp: SeccompFilter | None = None  # no user namespaces, no io_uring (`isolation`)
        self._watch = MemoryWatch(max_files, max_disk_files)

    @property
    def enforcement(self) -> Cgroups | Rlimits | None:
        """How CPU and memory are enforced, once `prepare` chose."""
        return self._enforcement

    @property
    def isolated(self) -> bool | None:
        """Whether runs take uids of their own (False: the agent's, by MEGHA_EXEC_AS_AGENT_USER), once prepared."""
        return self._isolated

    async def prepare(self) -> str:
        if self._isolated is None:
            uids = describe_range(self._uids.uids)
            problem = isolation.why_no_uid_switch(self._uids.uids)
            if problem is None:
                self._uids.prepare()
                self._isolated = True
                folders = isolation.shared_folders()
                hidden = await asyncio.to_thread(isolation.why_no_private_proc)
                self._own_proc = hidden is None
                if hidden is not None:
                    log.warning(
                        "exec tasks can list every process of this host, the other tasks' command lines included "
                        "(/proc), and share %s with the other tasks: %s; give the agent CAP_SYS_ADMIN, or for /proc "
                        "alone mount it with hidepid=2 (docs/drivers.md)",
                        ", ".join(folders),
                        hidden,
                    )
                elif folders and (shared := await asyncio.to_thread(isolation.why_no_own_folders, folders)):
                    log.warning(
                        "exec tasks share %s with the other tasks (they list their files' names there): %s "
                        "(docs/drivers.md)",
                        ", ".join(folders),
                        shared,
                    )
                else:
                    self._own_folders = folders
            elif os.geteuid() == 0:
                raise DriverUnavailable(
                    f"exec driver not offered: this agent runs as root but cannot give each task a uid of its own "
                    f"({problem}), and exec tasks never run as root"
                )
            elif not self._as_agent_user:
                raise DriverUnavailable(
                    f"exec driver not offered: this agent cannot give each task a uid of its own from "
                    f"MEGHA_TASK_UIDS={uids} ({problem}), and exec tasks do not run as the agent's user; run the "
                    "agent as root, or set MEGHA_EXEC_AS_AGENT_USER=true to run them as its user anyway (every task "
                    "can then read the agent's secrets)"
                )
            else:
                log.warning(
                    "MEGHA_EXEC_AS_AGENT_USER=true: exec tasks run as this agent's own user (uid %d), so EVERY TASK "
                    "CAN READ THE AGENT'S SECRETS (its environment: credential, API tokens; its secret files), read "
                    "and signal the other tasks, and outlive its run; run the agent as root to give each task a uid "
                    "of its own (docs/drivers.md)",
                    os.geteuid(),
                )
                self._isolated = False
            if self._enforcement is None:
                self._enforcement = enforcement.detect(self._worker_id)
            seccomp = enforcement.task_syscall_filter()
            if why := await asyncio.to_thread(isolation.why_no_syscall_filter, seccomp):
                log.warning(
                    "exec tasks may make user namespaces of their own where this host lets unprivileged users, and "
                    "use io_uring (kernel attack surface; under rlimits, memory in a tmpfs mounted in such a namespace "
                    "or in a file registered with a ring is not counted): %s (docs/drivers.md)",
                    why,
                )
            else:
                self._seccomp = seccomp
        assert self._enforcement is not None
        if self._isolated:
            who = (
                f"a uid of its own from {describe_range(self._uids.uids)}, at most {self._max_processes} processes "
                f"and {self._max_files} open files"
            )
            if self._own_proc:
                who += ", seeing only its own processes"
            if self._own_folders:
                who += f", with its own {', '.join(self._own_folders)} (a tmpfs of at most its memory request)"
        else:
            who = (
                f"this agent's own user (uid {os.geteuid()}: MEGHA_EXEC_AS_AGENT_USER), no process limit, at most "
                f"{self._max_files} open files"
            )
        if self._seccomp is not None:
            who += ", making no user namespace and no io_uring"
        who += f", {self._disk.describe()}"
        return f"exec driver: each task runs as {who}; CPU and memory enforced with {self._enforcement.describe()}"

    async def start(self, task_id: str, attempt: int, spec: RunSpec, limits: Limits, log: RunLog) -> Run:
        if not spec.command:
            raise ValueError("an exec task needs a command")
        await self.prepare()
        how = self._enforcement
        held = _Held(self._uids, await self._lease(task_id) if self._isolated else None)
        lease = held.lease
        try:
            # A random name only: the system's temp folder is listed by every user, the other runs included.
            scratch = held.scratch = Path(tempfile.mkdtemp(prefix="megha-run-"))
            if lease is not None:
                os.chown(scratch, lease.uid, lease.gid)
            cwd = spec.workdir or str(scratch)
            # HOME is the run's scratch folder, not its workdir: a workdir is shared by the runs of every user, and
            # another user's dotfiles planted there (a usercustomize.py, a .gitconfig) would run as this one.
            home = str(scratch)
            env = {"PATH": BASE_PATH, "HOME": home, "LANG": "C.UTF-8", "TMPDIR": str(scratch)} | dict(spec.env)
            cgroup = None
            if isinstance(how, Cgroups):
                cgroup = held.cgroup = how.create(f"{folder_name(task_id)}.{attempt}", limits)
            folders = None
            if lease is not None and self._own_proc and self._own_folders:
                folders = held.folders = OwnFolders.create(self._own_folders, limits.memory_mb * MIB, scratch)
            own = self._own_view(folders is not None)
            if lease is not None and spec.workdir and not _inside(spec.workdir, own):
                held.workdir, held.own_folders = spec.workdir, own
                self._uids.note_workdir(lease, spec.workdir)
            setup = functools.partial(
                enforcement.child_setup,
                None if cgroup is None else str(cgroup / "cgroup.procs"),
                None if cgroup is not None else limits.memory_mb * MIB,
                0 if cgroup is not None else enforcement.NICE,
                None if lease is None else self._max_processes,
                None if lease is None else lease.uid,
                -1 if lease is None else lease.gid,
                lease is not None and self._own_proc,
                folders,
                self._seccomp,
                _files_per_process(self._max_files),
                self._disk.max_mb * MIB,
                os.fsencode(cwd),
            )
            # preexec_fn, not user=: the process joins its cgroup before it gives up the agent's privileges. It
            # calls only os, resource and libc functions, so the agent's other threads cannot deadlock it.
            process = _popen_entering(list(spec.command), cwd, env, setup)
        except BaseException:
            # Popen may fail after its child became the uid: the uid is killed before it is given back.
            await asyncio.to_thread(held.give_back, kill=True)
            raise
        run = _ExecRun(process, log, limits, held, self._watch, self._max_files, self._disk)
        try:
            run.begin()
        except BaseException:
            await run.abandon()
            raise
        return run

    def _own_view(self, own_folders: bool) -> frozenset[str]:
        """The folders a run sees its own of (gone with it), not the host's: /proc, and its temporary folders."""
        return frozenset([*(self._own_folders if own_folders else ()), *(("/proc",) if self._own_proc else ())])

    async def _lease(self, task_id: str) -> UidLease:
        """A uid for run `task_id`. When every uid is taken (by running tasks, or processes they left), the start
        waits for one in line, up to `uid_wait` seconds: the first in line looks again whenever a run gives its uid
        back (and every UID_RECHECK seconds), the others wait for their turn. Raises OSError (EAGAIN) when none came."""
        if self._uid_wait <= 0:
            return await self._lease_now()
        self._loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self._uid_wait
        # Nobody waits: starts at once lease at once, in threads of their own; a start joins the line only once it
        # found no uid itself, or when others wait already.
        got = await self._try_lease(task_id, warn=True) if not self._uid_line else None
        if isinstance(got, UidLease):
            return got
        why, warned = got or "every task uid was taken by running tasks or by the starts before it", got is not None
        turn: asyncio.Future[None] = self._loop.create_future()
        self._uid_line.append(turn)  # in the order they came; the first in line looks at once
        if self._uid_line[0] is turn:
            turn.set_result(None)
        try:
            while True:
                if turn.done():
                    self._uid_free.clear()
                    got = await self._try_lease(task_id, warn=not warned)
                    if isinstance(got, UidLease):
                        return got
                    why, warned = got, True
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OSError(errno.EAGAIN, f"{why}; waited {self._uid_wait:g} s for one (MEGHA_TASK_UID_WAIT)")
                with contextlib.suppress(TimeoutError):
                    if not turn.done():
                        await asyncio.wait_for(asyncio.shield(turn), left)  # its turn: it looks at once
                    else:
                        await asyncio.wait_for(self._uid_free.wait(), min(left, UID_RECHECK))
        finally:
            self._uid_line.remove(turn)
            if self._uid_line and not self._uid_line[0].done():
                self._uid_line[0].set_result(None)  # the next in line looks at once

    async def _try_lease(self, task_id: str, warn: bool) -> UidLease | str:
        """A uid for run `task_id`, or why there is none (every uid taken: with `warn`, the start says once that it
        waits). Raises any other OSError."""
        try:
            return await self._lease_now()
        except OSError as exc:
            if exc.errno != errno.EAGAIN:
                raise
            why = exc.strerror or "every task uid is taken"
        if warn:
            log.warning(
                "task %s waits up to %g s for a task uid (MEGHA_TASK_UID_WAIT): %s", task_id, self._uid_wait, why
            )
        return why

    def _uid_given_back(self) -> None:
        """A run gave its uid back (in any thread): the start first in line for one looks again."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._uid_free.set)

    async def _lease_now(self) -> UidLease:
        """A uid for a run, leased in a thread (it reads /proc); given back when it comes should the start be
        cancelled meanwhile, not held for ever."""
        leasing = asyncio.ensure_future(asyncio.to_thread(self._uids.lease))
        try:
            return await asyncio.shield(leasing)
        except asyncio.CancelledError:
            leasing.add_done_callback(self._unwanted)
            raise

    def _unwanted(self, leasing: asyncio.Future[UidLease]) -> None:
        if not leasing.cancelled() and leasing.exception() is None:
            self._uids.release(leasing.result())


class _ExecRun(Run):
    def __init__(
        self,
        process: subprocess.Popen[bytes],
        log: RunLog,
        limits: Limits,
        held: _Held,
        watch: MemoryWatch,
        max_files: int,
        disk: DiskLimit,
    ) -> None:
        self._process = process
        self._log = log
        self._limits = limits
        self._held = held
        self._cgroup = held.cgroup
        self._lease = held.lease
        self._watch = watch
        self._key: WatchKey = ("uid", held.lease.uid) if held.lease is not None else ("sid", process.pid)
        self._released = False  # the uid went back to the pool: signalling it would reach another run
        self._max_files = max_files
        self._over_memory_mb: float | None = None  # what the watch saw when it killed the run
        self._over_files = False  # the watch killed the run: its processes held more than max_files descriptors
        self._disk = disk
        self._over_disk: DiskUse | None = None  # what the watch saw when it killed the run for its disk
        self._peak_bytes = 0
        self._pumps: list[OutputPump] = []
        self._exited: asyncio.Future[resource.struct_rusage] | None = None
        self._pidfd = -1

    def begin(self) -> None:
        loop = asyncio.get_running_loop()
        process = self._process
        for stream, pipe in (("stdout", process.stdout), ("stderr", process.stderr)):
            assert pipe is not None
            self._pumps.append(OutputPump(self._log, stream, pipe))
        self._exited = loop.create_future()
        self._pidfd = os.pidfd_open(process.pid)
        loop.add_reader(self._pidfd, self._reap)
        self._watch.add(self._key, self._seen, self._disk_places())

    def _disk_places(self) -> DiskPlaces:
        """Where the watch counts the run's disk: its uid's (or, as the agent's user, the agent's) files in its
        scratch folder, in the host's shared folders on disk when the uid is its own, and its removed files on disk
        that are not in its own tmpfs."""
        lease, folders = self._lease, self._held.folders
        return DiskPlaces(
            owner=os.geteuid() if lease is None else lease.uid,
            scratch=None if self._held.scratch is None else str(self._held.scratch),
            shared=lease is not None,
            own_device=None if folders is None else folders.device(),
        )

    def _reap(self) -> None:
        pid, status, usage = os.wait4(self._process.pid, os.WNOHANG)
        if pid == 0:
            return
        self._close_pidfd()
        self._process.returncode = os.waitstatus_to_exitcode(status)  # so subprocess never waits for it
        assert self._exited is not None
        self._exited.set_result(usage)

    def _close_pidfd(self) -> None:
        if self._pidfd >= 0:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1

    async def abandon(self) -> None:
        """Undo a start that failed once the process was made (`begin` could not watch it all): kill every process
        of the run, reap it, close its pipes and give back what it held."""
        await self._give_back(killed=False)

    async def _give_back(self, killed: bool) -> None:
        """Stop watching the run and give back what it held: its pipes, its cgroup and scratch folder, its uid.
        Unless `killed` (every process of the run was killed after it ended), they are killed first and its own
        process is reaped (a start that failed, a wait cancelled): a uid is never given back with a process of the
        run left, nor is a process left for no one to watch."""
        if not killed:
            self.kill()
            self._close_pidfd()
        for pump in self._pumps:
            pump.close()
        for pipe in (self._process.stdout, self._process.stderr):  # one `begin` made no pump for yet
            if pipe is not None and not pipe.closed:
                pipe.close()
        self._watch.forget(self._key)
        self._released = True
        process = None if killed or self._process.returncode is not None else self._process
        await asyncio.to_thread(self._held.give_back, process, kill=not killed)

    def _seen(self, usage: Usage) -> None:
        """The watch's look at the run: its processes (and its uid's shared memory) hold `usage.held` bytes, and its
        own tmpfs what it holds (counted under rlimits only: a cgroup's memory is the kernel's); its processes hold
        `usage.descriptors` open (more than `max_files`: the watch looked for no memfd nor removed file, and the run
        is killed for its descriptors, under cgroups too: its disk cannot be counted); its files take `usage.disk`
        of the disk, when the look counted it."""
        killed = self._over_memory_mb is not None or self._over_files or self._over_disk is not None
        if killed:
            return
        if usage.descriptors > self._max_files:
            self._over_files = True
            self.kill()
        elif usage.disk is not None and self._disk.exceeded(usage.disk):
            self._over_disk = usage.disk
            self.kill()
        elif self._cgroup is None:
            self._check_memory(usage)

    def _check_memory(self, usage: Usage) -> None:
        """Rlimits: kill the run when what it holds is over its memory request."""
        resident = usage.held
        if self._held.folders is not None:
            resident += self._held.folders.held_bytes()
        self._peak_bytes = max(self._peak_bytes, resident)
        if resident > self._limits.memory_mb * MIB:
            self._over_memory_mb = resident / MIB
            self.kill()

    async def wait(self) -> Exit:
        assert self._exited is not None
        killed = False
        try:
            usage = await self._exited
            if self._lease is not None:  # every process of its uid, wherever it went
                _warn_left(self._lease.uid, await asyncio.to_thread(isolation.kill_uid, self._lease.uid))
            else:
                self._signal(signal.SIGKILL)  # what it left behind
            killed = True
            await asyncio.wait([pump.done for pump in self._pumps], timeout=PIPE_DRAIN_SECONDS)
            cpu = usage.ru_utime + usage.ru_stime
            oom_kills = 0
            if self._cgroup is not None:
                cpu = max(cpu, enforcement.cpu_seconds(self._cgroup))
                oom_kills = enforcement.oom_kills(self._cgroup)
                self._peak_bytes = enforcement.peak_bytes(self._cgroup)
        finally:
            await self._give_back(killed)
        exit_code = self._process.returncode
        assert exit_code is not None
        # Not ru_maxrss: it counts the agent's memory the child had between fork and exec.
        peak_mb = self._peak_bytes / MIB
        how, over = self._limit_reached(exit_code, oom_kills)
        return Exit(exit_code, cpu, peak_mb, memory_exceeded=bool(how), memory_how=how, limit_exceeded=over)

    def _limit_reached(self, exit_code: int, oom_kills: int) -> tuple[str, str]:
        """Which limit stopped the run, as (how it went over its memory, or the reason another limit stopped it):
        first what the watch or the kernel saw, then what its exit and stderr suggest."""
        disk = f"exceeded its disk limit of {self._disk.max_mb} MB"
        tail = self._log.stderr_tail() if exit_code != 0 else ""
        if self._over_files:
            return "", f"held more than {self._max_files} open descriptors across its processes (MEGHA_TASK_MAX_FILES)"
        if self._over_disk is not None:
            return "", f"{disk} ({self._disk.how_exceeded(self._over_disk)})"
        if oom_kills:
            return "stopped by the kernel's OOM killer in its cgroup", ""
        if self._over_memory_mb is not None:
            return f"its processes held {self._over_memory_mb:.0f} MB", ""
        if exit_code == -signal.SIGXFSZ:
            return "", f"{disk} (a file reached it: killed by SIGXFSZ)"
        if exit_code == SHELL_SIGNAL_BASE + signal.SIGXFSZ:
            return "", f"{disk} (most likely: exit code {exit_code}, a shell's when SIGXFSZ killed a command of it)"
        if self._cgroup is None and _ALLOCATION_FAILED.search(tail):
            return "an allocation failed at its data rlimit", ""
        if _FILE_TOO_LARGE.search(tail):
            return "", f"{disk} (a write failed at its file size rlimit): exit code {exit_code}: {tail}"
        return "", ""

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        """Signal every process of the run: its uid's, or its cgroup's, or its session's (and process group's)."""
        if self._released:
            return
        if self._lease is not None:
            isolation.signal_uid(self._lease.uid, signum)
            return
        if self._cgroup is not None:
            if signum == signal.SIGKILL:
                enforcement.kill_all(self._cgroup)
            else:
                enforcement.signal_cgroup(self._cgroup, signum)
            return
        sid = self._process.pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(sid, signum)
        for pid in enforcement.session_members(sid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)


@dataclass
class _Held:
    """What an exec run holds until it is over: its uid (leased from `uids`), its scratch folder, its cgroup, its own
    tmpfs."""

    uids: TaskUids
    lease: UidLease | None
    scratch: Path | None = None
    cgroup: Path | None = None
    folders: OwnFolders | None = None
    workdir: str | None = None  # where what the uid leaves outlives the run (`isolation.disown`)
    own_folders: frozenset[str] = frozenset()  # the run's own /proc and temporary folders: not the host's

    def give_back(self, process: subprocess.Popen[bytes] | None = None, *, kill: bool = False) -> None:
        """Let go of the run's own tmpfs, remove the cgroup (killing what is left in it) and the scratch folder,
        remove what the uid left in the shared folders, and give the uid back. `kill`: kill every process of the uid
        first (a start that failed, a wait cancelled; a run's own end killed them already), and reap `process`, the
        run's own, when given. One call, so that a cancelled caller never leaves it half done."""
        if kill and self.lease is not None:
            _warn_left(self.lease.uid, isolation.kill_uid(self.lease.uid))
        if process is not None:
            process.wait()
        if self.folders is not None:  # freed now: its processes, and so its mount namespace, are gone
            self.folders.close()
        if self.cgroup is not None:
            try:
                enforcement.remove(self.cgroup)
            except OSError as exc:
                log.warning("could not remove cgroup %s: %s", self.cgroup, exc)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        if self.lease is not None:
            # What the uid left in its workdir is handed over before the uid is free again, or the uid is set aside.
            why = None if self.workdir is None else f"its workdir {self.workdir} was not looked through"
            try:
                isolation.purge_uid(self.lease.uid)
                if self.workdir is not None:
                    why = isolation.disown(self.workdir, self.lease.uid, self.uids.disown_limit, self.own_folders)
                    if why is None:
                        self.uids.workdir_handed_over(self.lease)
            finally:
                try:
                    if why is not None:
                        self.uids.set_aside(self.lease.uid, why)
                finally:
                    self.uids.release(self.lease)


def _popen_entering(
    command: list[str], cwd: str, env: dict[str, str], setup: functools.partial[None]
) -> subprocess.Popen[bytes]:
    """Start the run's process in `cwd`. subprocess enters `cwd` first, as the agent: a folder that does not exist
    fails there, with its own error. `setup` (`enforcement.child_setup`) then enters it again as the run's uid, in
    the run's own mount namespace; when that fails (a folder the run may not enter, or one its own /proc and
    temporary folders do not show it), the error says so rather than subprocess's "Exception occurred in
    preexec_fn"."""
    failure_read, failure_write = os.pipe2(os.O_CLOEXEC)
    try:
        try:
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=env,
                umask=TASK_UMASK,
                start_new_session=True,
                preexec_fn=functools.partial(setup, workdir_failure_fd=failure_write),
            )
        except subprocess.SubprocessError:
            os.close(failure_write)
            failure_write = -1
            errno_text = os.read(failure_read, 16)
            if not errno_text:
                raise
            number = int(errno_text)
            raise OSError(
                number,
                f"the run's user cannot enter its workdir {cwd} ({os.strerror(number)}; the run sees its own "
                "/proc and temporary folders)",
            ) from None
    finally:
        os.close(failure_read)
        if failure_write >= 0:
            os.close(failure_write)


def _inside(path: str, folders: frozenset[str]) -> bool:
    """Whether `path` is one of `folders` or lies in one."""
    path = os.path.normpath(path)
    return any(path == folder or path.startswith(folder + "/") for folder in folders)


def _files_per_process(max_files: int) -> int:
    """RLIMIT_NOFILE of a run's processes: `max_files`, or the agent's own hard limit when that is lower (a process
    not privileged cannot raise its hard limit, and one that is cannot go over the kernel's fs.nr_open)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return max_files if hard == resource.RLIM_INFINITY else min(max_files, hard)


def _warn_left(uid: int, left: list[int]) -> None:
    if left:
        log.warning(
            "exec run of uid %d: processes %s still alive %g s after SIGKILL; the uid is not taken again until they "
            "are gone",
            uid,
            left,
            isolation.KILL_WAIT_SECONDS,
        )
