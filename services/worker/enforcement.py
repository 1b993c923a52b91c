"""How the exec driver holds a task to its CPU and memory request: cgroups v2 where the agent can create child
cgroups, rlimits and the agent's own watch of the task's processes otherwise (docs/drivers.md compares them).

`detect` chooses once, at start-up, and says why cgroups v2 could not be used:

- `Cgroups`: a cgroup per run under ``<the agent's cgroup>/megha-<worker>-tasks``, ``cpu.max`` from the CPU
  request (a hard cap), ``memory.max`` from the memory request (the kernel's OOM killer stops the run; its
  ``memory.events`` count ``oom_kill`` says so; ``memory.oom.group`` makes it stop every process of the run), swap
  off. Needs the cgroup2 file system with the cpu and memory controllers, writable by the agent. When the agent's
  own cgroup holds the agent (the no-internal-process rule forbids enabling controllers there), the agent first
  moves itself into a leaf ``megha-agent``, as Docker-in-Docker does - only when it is the only process there.
  Not run on the development machine (a cgroup v1 host): docs/drivers.md says so.
- `Rlimits`: memory is capped per process by RLIMIT_DATA (an allocation beyond it fails in the program), and the
  agent sums the resident memory of the run's session every WATCH_SECONDS and kills it when over the request. CPU
  cannot be capped by an rlimit: the run is only nice'd (NICE), so it yields to the agent and burn tasks.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from megha.services.worker.drivers import Limits

CGROUP_PERIOD_US = 100_000
"""cpu.max's period: a run of C millicores gets C * 100 microseconds of CPU in every 100 ms."""
WATCH_SECONDS = 0.25
"""Rlimits: how often the agent sums each exec run's resident memory."""
NICE = 10
"""Rlimits: the niceness exec runs get, their CPU being uncapped."""
CONTROLLERS = ("cpu", "memory")
MIB = 1024 * 1024
_PAGE = os.sysconf("SC_PAGE_SIZE")


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


def child_setup(cgroup_procs: str | None, data_bytes: int | None, nice: int, uid: int | None, gid: int) -> None:
    """Run in the task's process between fork and exec (subprocess's preexec_fn): join its cgroup (as the agent's
    user still), no core dumps, cap its data segment, lower its priority, then become `uid`. Uses only modules
    imported already and no locks, as code between fork and exec must."""
    if cgroup_procs is not None:
        fd = os.open(cgroup_procs, os.O_WRONLY)
        try:
            os.write(fd, b"0")  # 0: the writing process
        finally:
            os.close(fd)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if data_bytes is not None:
        resource.setrlimit(resource.RLIMIT_DATA, (data_bytes, data_bytes))
    if nice:
        os.nice(nice)
    if uid is not None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)


def session_usage(sessions: set[int]) -> dict[int, tuple[list[int], int]]:
    """For each of `sessions` (by session id), its live processes and their resident memory in bytes, from /proc
    (a process that left the session with setsid is not counted)."""
    found: dict[int, tuple[list[int], int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except OSError:
            continue  # it ended while we looked
        sid = int(fields[3])
        if sid in sessions and fields[0] != b"Z":
            pids, rss = found.get(sid, ([], 0))
            pids.append(int(entry.name))
            found[sid] = (pids, rss + int(fields[21]) * _PAGE)
    return found
