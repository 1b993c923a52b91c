"""The exec driver: a task's command run as an unprivileged process of its own session, held to its request.

The command (argv, no shell) runs with a minimal environment (PATH, HOME, LANG, then the task's `env`), in the
task's `workdir` or else a scratch folder of its own (deleted when the run ends), in a new session, and as
MEGHA_TASK_USER (default `nobody`) when the agent runs as root, otherwise as the agent's own user. Its CPU and
memory are enforced as `enforcement.detect` chose at start-up: cgroups v2 or rlimits.

The agent reaps the process itself (``os.wait4`` when its pidfd says it ended) to learn the CPU time it and the
children it waited for used. When it ends, whatever it left in its session (or cgroup) is killed, so its output
pipes close and nothing of it outlives the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import pwd
import re
import resource
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from megha.common.lifecycle import StartupError
from megha.services.worker import enforcement
from megha.services.worker.drivers import Driver, Exit, Limits, Run
from megha.services.worker.enforcement import MIB, Cgroups, Rlimits
from megha.services.worker.tasklogs import RunLog, Stream, folder_name

if TYPE_CHECKING:
    from megha.common.core.task import RunSpec

log = logging.getLogger(__name__)

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PIPE_DRAIN_SECONDS = 2.0
"""How long output is still read after the run's processes are gone (a process that left its session may hold
the pipes open)."""

_ALLOCATION_FAILED = re.compile(r"MemoryError|Cannot allocate memory|out of memory|bad_alloc", re.IGNORECASE)
"""Rlimits: what a program typically prints when an allocation fails at its RLIMIT_DATA."""


class ExecDriver(Driver):
    name = "exec"

    def __init__(self, worker_id: str, task_user: str, how: Cgroups | Rlimits | None = None) -> None:
        """`how`: how CPU and memory are enforced; None: as `enforcement.detect` chooses at `prepare`."""
        self._worker_id = worker_id
        self._task_user = task_user
        self._enforcement = how
        self._prepared = False
        self._ids: tuple[int, int] | None = None  # uid and gid the runs take, None: the agent's own
        self._watch = _MemoryWatch()

    @property
    def enforcement(self) -> Cgroups | Rlimits | None:
        """How CPU and memory are enforced, once `prepare` chose."""
        return self._enforcement

    async def prepare(self) -> str:
        if not self._prepared:
            if os.geteuid() == 0:
                try:
                    user = pwd.getpwnam(self._task_user)
                except KeyError:
                    raise StartupError(
                        f"MEGHA_TASK_USER={self._task_user}: no such user (exec tasks run as this user when the "
                        "agent runs as root)"
                    ) from None
                if user.pw_uid == 0:
                    raise StartupError(f"MEGHA_TASK_USER={self._task_user} is root: exec tasks never run as root")
                self._ids = (user.pw_uid, user.pw_gid)
            if self._enforcement is None:
                self._enforcement = enforcement.detect(self._worker_id)
            self._prepared = True
        assert self._enforcement is not None
        who = f"user {self._task_user}" if self._ids is not None else "the agent's own user"
        return f"exec driver: tasks run as {who}; CPU and memory enforced with {self._enforcement.describe()}"

    async def start(self, task_id: str, attempt: int, spec: RunSpec, limits: Limits, log: RunLog) -> Run:
        if not spec.command:
            raise ValueError("an exec task needs a command")
        await self.prepare()
        how = self._enforcement
        scratch = None if spec.workdir else Path(tempfile.mkdtemp(prefix=f"megha-{folder_name(task_id)}-{attempt}-"))
        cgroup = None
        try:
            if scratch is not None and self._ids is not None:
                os.chown(scratch, *self._ids)
            cwd = spec.workdir or str(scratch)
            env = {"PATH": BASE_PATH, "HOME": cwd, "LANG": "C.UTF-8"} | dict(spec.env)
            if isinstance(how, Cgroups):
                cgroup = how.create(f"{folder_name(task_id)}.{attempt}", limits)
            setup = functools.partial(
                enforcement.child_setup,
                None if cgroup is None else str(cgroup / "cgroup.procs"),
                None if cgroup is not None else limits.memory_mb * MIB,
                0 if cgroup is not None else enforcement.NICE,
                None if self._ids is None else self._ids[0],
                -1 if self._ids is None else self._ids[1],
            )
            # preexec_fn, not user=: the process joins its cgroup before it gives up the agent's privileges. It
            # calls only os and resource functions, so the agent's other threads cannot deadlock it.
            process = subprocess.Popen(
                list(spec.command),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=env,
                start_new_session=True,
                preexec_fn=setup,
            )
        except BaseException:
            _clean_up(cgroup, scratch)
            raise
        run = _ExecRun(process, log, limits, cgroup, scratch, self._watch if cgroup is None else None)
        try:
            await run.begin()
        except BaseException:
            run.kill()
            raise
        return run


class _ExecRun(Run):
    def __init__(
        self,
        process: subprocess.Popen[bytes],
        log: RunLog,
        limits: Limits,
        cgroup: Path | None,
        scratch: Path | None,
        watch: _MemoryWatch | None,
    ) -> None:
        self._process = process
        self._log = log
        self._limits = limits
        self._cgroup = cgroup
        self._scratch = scratch
        self._watch = watch
        self._over_memory_mb: float | None = None  # what the watch saw when it killed the run
        self._peak_bytes = 0
        self._pumps: list[tuple[asyncio.BaseTransport, asyncio.Future[None]]] = []
        self._exited: asyncio.Future[resource.struct_rusage] | None = None
        self._pidfd = -1

    async def begin(self) -> None:
        loop = asyncio.get_running_loop()
        process = self._process
        for stream, pipe in (("stdout", process.stdout), ("stderr", process.stderr)):
            done: asyncio.Future[None] = loop.create_future()
            transport, _ = await loop.connect_read_pipe(functools.partial(_Pump, self._log, stream, done), pipe)
            self._pumps.append((transport, done))
        self._exited = loop.create_future()
        self._pidfd = os.pidfd_open(process.pid)
        loop.add_reader(self._pidfd, self._reap)
        if self._watch is not None:
            self._watch.add(process.pid, self._seen)

    def _reap(self) -> None:
        pid, status, usage = os.wait4(self._process.pid, os.WNOHANG)
        if pid == 0:
            return
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._process.returncode = os.waitstatus_to_exitcode(status)  # so subprocess never waits for it
        assert self._exited is not None
        self._exited.set_result(usage)

    def _seen(self, resident: int) -> None:
        """The memory watch's look at the run: its processes hold `resident` bytes."""
        self._peak_bytes = max(self._peak_bytes, resident)
        if resident > self._limits.memory_mb * MIB and self._over_memory_mb is None:
            self._over_memory_mb = resident / MIB
            self.kill()

    async def wait(self) -> Exit:
        assert self._exited is not None
        try:
            usage = await self._exited
            self._signal(signal.SIGKILL)  # what it left behind
            drained = [done for _, done in self._pumps]
            await asyncio.wait(drained, timeout=PIPE_DRAIN_SECONDS)
            cpu = usage.ru_utime + usage.ru_stime
            oom_kills = 0
            if self._cgroup is not None:
                cpu = max(cpu, enforcement.cpu_seconds(self._cgroup))
                oom_kills = enforcement.oom_kills(self._cgroup)
                self._peak_bytes = enforcement.peak_bytes(self._cgroup)
        finally:
            for transport, _ in self._pumps:
                transport.close()
            if self._watch is not None:
                self._watch.forget(self._process.pid)
            await asyncio.to_thread(_clean_up, self._cgroup, self._scratch)
        exit_code = self._process.returncode
        assert exit_code is not None
        # Not ru_maxrss: it counts the agent's memory the child had between fork and exec.
        peak_mb = self._peak_bytes / MIB
        how = ""
        if oom_kills:
            how = "stopped by the kernel's OOM killer in its cgroup"
        elif self._over_memory_mb is not None:
            how = f"its processes held {self._over_memory_mb:.0f} MB"
        elif self._cgroup is None and exit_code != 0 and _ALLOCATION_FAILED.search(self._log.stderr_tail()):
            how = "an allocation failed at its data rlimit"
        return Exit(exit_code, cpu, peak_mb, memory_exceeded=bool(how), memory_how=how)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        """Signal every process of the run: its cgroup, or its session (and process group)."""
        if self._cgroup is not None:
            if signum == signal.SIGKILL:
                enforcement.kill_all(self._cgroup)
            else:
                enforcement.signal_cgroup(self._cgroup, signum)
            return
        sid = self._process.pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(sid, signum)
        for pid in enforcement.session_usage({sid}).get(sid, ([], 0))[0]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)


def _clean_up(cgroup: Path | None, scratch: Path | None) -> None:
    """Remove a run's cgroup (killing what is left in it) and its scratch folder."""
    if cgroup is not None:
        try:
            enforcement.remove(cgroup)
        except OSError as exc:
            log.warning("could not remove cgroup %s: %s", cgroup, exc)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)


class _Pump(asyncio.Protocol):
    """Copies one output pipe of a run into its log."""

    def __init__(self, log: RunLog, stream: Stream, done: asyncio.Future[None]) -> None:
        self._log = log
        self._stream = stream
        self._done = done

    def data_received(self, data: bytes) -> None:
        self._log.write(self._stream, data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._done.done():
            self._done.set_result(None)


class _MemoryWatch:
    """Rlimits: every WATCH_SECONDS, the resident memory of each exec run's session, summed, shown to the run
    (which kills itself when over its limit). One scan of /proc serves every run."""

    def __init__(self) -> None:
        self._runs: dict[int, Callable[[int], None]] = {}
        self._watching: asyncio.Task[None] | None = None

    def add(self, sid: int, seen: Callable[[int], None]) -> None:
        self._runs[sid] = seen
        if self._watching is None or self._watching.done():
            self._watching = asyncio.get_running_loop().create_task(self._watch(), name="megha-exec-memory-watch")

    def forget(self, sid: int) -> None:
        self._runs.pop(sid, None)

    async def _watch(self) -> None:
        while self._runs:
            # In a thread: reading every /proc/<pid>/stat of a busy host takes a while.
            usage = await asyncio.to_thread(enforcement.session_usage, set(self._runs))
            for sid, (_, resident) in usage.items():
                seen = self._runs.get(sid)
                if seen is not None:
                    seen(resident)
            await asyncio.sleep(enforcement.WATCH_SECONDS)
