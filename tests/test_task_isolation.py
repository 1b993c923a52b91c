"""Attacks of one exec task on the agent and on other tasks, with real processes: each running task is a uid of its
own, so a task that dumps every environment and secret file finds no secret, cannot read another task's files or
kept output, nor signal it; a fork bomb stops at the process limit and nothing of its uid outlives its run; what a
task leaves in shared memory or holds in a memfd is counted (and what it leaves removed); a task makes no user
namespace of its own; a link planted in the output folder is never followed. And an agent that cannot switch uids
does not offer exec (one line at start-up) unless told to run tasks as its own user.

The agent is this test process (a `TaskExecutor` with the exec driver an agent makes), run as root here; the
unprivileged agent is a child of it that became `nobody` before it made its agent. docs/drivers.md, "Isolation"."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import stat
import struct
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import uvloop
from test_services_http import NOWHERE

from megha.common.core.task import RunSpec
from megha.common.lifecycle import StartupError
from megha.common.settings import WorkerSettings
from megha.services.worker import disk_usage, enforcement, isolation, socket_memory
from megha.services.worker.agent import WorkerAgent
from megha.services.worker.drivers import Limits
from megha.services.worker.enforcement import MIB, Cgroups, Rlimits
from megha.services.worker.exec_driver import ExecDriver
from megha.services.worker.execution import ExecutionResult
from megha.services.worker.executor import TaskExecutor
from megha.services.worker.isolation import TaskUids, UidLease
from megha.services.worker.memory_watch import MemoryWatch
from megha.services.worker.tasklogs import TaskLogs, default_log_dir

from servicekit import wait_for

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="the agent switches uids only as root; run these tests as root"),
]

TASK_UIDS = WorkerSettings().task_uid_range()
NOBODY = 65534
PYTHON = "python3"  # the host's, on an exec task's PATH
TRUE = RunSpec("exec", ("true",))


# ------------------------------------------------------------------------------------------------------ helpers


def uid_processes(uid: int) -> list[int]:
    """Live (not zombie) processes with `uid` as any of their uids, read from /proc without the agent's code."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            lines = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if str(uid) in lines["Uid"].split() and not lines["State"].strip().startswith("Z"):
            found.append(int(status.parent.name))
    return found


@asynccontextmanager
async def agent(
    logs_root: Path,
    max_processes: int = 64,
    how: Cgroups | Rlimits | None = None,
    max_files: int = 4096,
    max_disk_mb: int = 10240,
    max_disk_files: int = 100_000,
    uids: range = TASK_UIDS,
    uid_wait: float = 0.0,
) -> AsyncIterator[tuple[TaskExecutor, TaskLogs]]:
    """An executor with the exec driver as an agent makes it from its settings, prepared as at its start-up (`how`:
    CPU and memory enforced so, rather than as the agent would choose)."""
    logs = TaskLogs(logs_root, 1 << 20, kept=100)
    logs.prepare()
    driver = ExecDriver(
        "iso",
        uids,
        max_processes,
        how=how,
        max_files=max_files,
        max_disk_mb=max_disk_mb,
        max_disk_files=max_disk_files,
        uid_wait=uid_wait,
    )
    await driver.prepare()
    assert driver.isolated
    executor = TaskExecutor(drivers={"exec": driver}, logs=logs, kill_grace=1.0)
    try:
        yield executor, logs
    finally:
        await executor.shutdown()


def sh(script: str, **env: str) -> RunSpec:
    return RunSpec("exec", ("sh", "-c", script), env=tuple(env.items()))


def python(script: str, **env: str) -> RunSpec:
    return RunSpec("exec", (PYTHON, "-c", script), env=tuple(env.items()))


async def run_to_end(executor: TaskExecutor, task_id: str, spec: RunSpec, memory_mb: int = 256) -> ExecutionResult:
    await executor.start(task_id, 500, memory_mb, 0.0, spec)
    return await executor.wait(task_id)


async def started(executor: TaskExecutor, logs: TaskLogs, task_id: str, spec: RunSpec, lines: int) -> list[str]:
    """Start a task that prints `lines` lines and then waits; those lines."""
    await executor.start(task_id, 500, 256, 0.0, spec)

    def printed() -> list[str]:
        return logs.read(task_id, 1, "stdout").decode().splitlines()

    await wait_for(lambda: len(printed()) >= lines, 30, lambda: (printed(), logs.read(task_id, 1, "stderr")))
    return printed()


@pytest.fixture
def logs_root() -> Iterator[Path]:
    """The agent's default folder of kept output (in the system's temp folder), removed afterwards."""
    root = default_log_dir(f"iso-{uuid.uuid4().hex[:8]}", "w0")
    yield root
    shutil.rmtree(root, ignore_errors=True)


# ----------------------------------------------------------------------------------------------- uids of their own


@pytest.mark.asyncio
async def test_each_running_task_has_a_uid_and_gid_of_its_own_never_the_agent_s(logs_root: Path) -> None:
    async with agent(logs_root) as (executor, logs):
        printed = [
            await started(executor, logs, f"who.{i}", sh("id -u; id -g; id -G; exec sleep 60"), 3) for i in range(3)
        ]
        for i in range(3):
            await executor.kill(f"who.{i}")
    uids = [int(uid) for uid, _, _ in printed]
    assert len(set(uids)) == 3 and all(uid in TASK_UIDS for uid in uids), printed
    assert all(gid == uid and groups == uid for uid, gid, groups in printed)  # no other group, the agent's least


# ------------------------------------------------------------------------------------------------------ secrets

DUMP = r"""
echo "== own environment"; env
for f in /proc/[0-9]*/environ; do echo "== $f"; tr '\0' '\n' < "$f" 2>&1; done
echo "== agent's environment"; tr '\0' '\n' < /proc/$AGENT/environ 2>&1
echo "== secret file"; cat "$SECRET_FILE" 2>&1
echo "== other task's file"; cat "$OTHER/secret" 2>&1
echo "== other task's kept output"; cat "$LOGS/victim.0/1/stdout" 2>&1; ls "$LOGS" 2>&1
echo "== signal the other task"; kill -TERM "$VICTIM" 2>&1 && echo "signalled"
echo "== end"
"""


@pytest.mark.asyncio
async def test_a_task_that_dumps_every_environment_and_secret_file_finds_nothing_of_the_agent_or_other_tasks(
    logs_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's environment holds a secret (as MEGHA_CREDENTIAL does), and a secret file 0600 sits in a folder
    anyone may enter (as /secrets in the image); a victim task of another user holds its token in its environment,
    its own file in its scratch folder and its output in the agent's kept output. The attacker reads none of them
    and cannot signal the victim."""
    agent_secret, file_secret, victim_token, victim_file = (secrets.token_hex(16) for _ in range(4))
    monkeypatch.setenv("MEGHA_CREDENTIAL", agent_secret)
    # Not in the system's temp folder: a task with a /tmp of its own would not even find it there.
    folder = Path(tempfile.mkdtemp(prefix="megha-secrets-", dir="/run"))
    folder.chmod(0o755)
    secret_file = folder / "credential"
    secret_file.write_text(file_secret)
    secret_file.chmod(0o600)
    victim = f"echo $$; pwd; echo {victim_file} > secret; echo output-$TOKEN; exec sleep 60"
    try:
        async with agent(logs_root) as (executor, logs):
            pid, cwd, _ = await started(executor, logs, "victim.0", sh(victim, TOKEN=victim_token), 3)
            env = {"AGENT": str(os.getpid()), "SECRET_FILE": str(secret_file), "OTHER": cwd, "LOGS": str(logs_root)}
            result = await run_to_end(executor, "attacker.0", sh(DUMP, VICTIM=pid, **env))
            dump = logs.read("attacker.0", 1, "stdout").decode() + logs.read("attacker.0", 1, "stderr").decode()
            assert executor.running() == ["victim.0"]  # still alive: the attacker's signal did not reach it
            await executor.kill("victim.0")
    finally:
        shutil.rmtree(folder)
    assert result.succeeded, result
    assert "== own environment" in dump and "== end" in dump  # it ran
    assert f"/proc/{pid}/" not in dump  # the victim's process is not even listed (its own /proc)
    assert "Permission denied" in dump and "Operation not permitted" in dump and "signalled" not in dump, dump
    for name, value in [
        ("the agent's environment", agent_secret),
        ("the agent's secret file", file_secret),
        ("the other task's environment", victim_token),
        ("the other task's file", victim_file),
        ("the other task's kept output", f"output-{victim_token}"),
    ]:
        assert value not in dump, f"the task read {name}"
    assert "MEGHA_" not in dump.partition("== /proc/")[0], "the agent's environment reached the task"


SNOOP = r"""
echo "== processes"; ls /proc
echo "== victim's command line"; tr '\0' ' ' < /proc/$VICTIM/cmdline 2>&1; echo
echo "== ps"; ps -eo user,pid,args 2>&1
echo "== temporary folder"; ls "${TMPDIR%/*}" 2>&1
echo "== end"
"""


@pytest.mark.asyncio
async def test_a_task_sees_neither_the_other_tasks_processes_nor_their_command_lines_nor_their_names(
    logs_root: Path,
) -> None:
    """A victim task holds a key in its command line (as `python -c '...KEY=...'` does); the attacker lists the
    processes (/proc, ps), reads the victim's command line and lists the temporary folder where the scratch folders
    are: it finds neither the key nor the victim's pid nor its task's name (each run has a /proc of its own showing
    its uid's processes only, and a scratch folder of a random name)."""
    key = secrets.token_hex(16)
    victim = python(f"import os, time; KEY = '{key}'; print(os.getpid(), flush=True); time.sleep(60)")
    assert "seeing only its own processes" in await ExecDriver("iso", TASK_UIDS, 64).prepare()
    async with agent(logs_root) as (executor, logs):
        (pid,) = await started(executor, logs, "victim-job.0", victim, 1)
        result = await run_to_end(executor, "attacker.0", sh(SNOOP, VICTIM=pid))
        dump = logs.read("attacker.0", 1, "stdout").decode() + logs.read("attacker.0", 1, "stderr").decode()
        await executor.kill("victim-job.0")
    assert result.succeeded and "== end" in dump, dump
    assert key not in dump and "victim-job" not in dump, dump
    listed = dump.partition("== processes")[2].partition("==")[0].split()
    assert pid not in listed and "1" not in listed and len([p for p in listed if p.isdigit()]) <= 4, listed


WORKDIR_SNOOP = r"""
echo "== here"; pwd
echo "== listed"; ls -a . 2>&1
echo "== victim's command line"; tr '\0' ' ' < "./$VICTIM/cmdline" 2>&1; echo
echo "== end"
"""


@pytest.mark.asyncio
async def test_a_workdir_is_entered_as_the_run_inside_its_own_view_so_it_leads_nowhere_else(logs_root: Path) -> None:
    """The agent does not enter a task's `workdir` for it on the host: the run enters it as its own uid inside its own
    /proc and temporary folders. So `workdir: /proc` is the run's own /proc (no victim pid, no command line), the
    victim's `/proc/<pid>/root/tmp` (another run's own /tmp) cannot be entered and the start says so, and
    `workdir: /tmp` is the run's own tmpfs, where a file of the host's /tmp is not."""
    key = secrets.token_hex(16)
    victim = python(f"import os, time; KEY = '{key}'; print(os.getpid(), flush=True); time.sleep(60)")
    planted = Path(tempfile.gettempdir(), f"megha-host-{key}")
    planted.write_text("the host's\n")
    planted.chmod(0o644)
    try:
        async with agent(logs_root) as (executor, logs):
            (pid,) = await started(executor, logs, "victim-job.0", victim, 1)
            in_proc = await run_to_end(executor, "proc.0", replace(sh(WORKDIR_SNOOP, VICTIM=pid), workdir="/proc"))
            seen_in_proc = logs.read("proc.0", 1, "stdout").decode() + logs.read("proc.0", 1, "stderr").decode()
            with pytest.raises(OSError, match="cannot enter its workdir") as refused:
                await executor.start("root.0", 500, 256, 0.0, replace(sh("ls -a ."), workdir=f"/proc/{pid}/root/tmp"))
            in_tmp = await run_to_end(executor, "tmp.0", replace(sh(WORKDIR_SNOOP, VICTIM=pid), workdir="/tmp"))
            seen_in_tmp = logs.read("tmp.0", 1, "stdout").decode()
            await executor.kill("victim-job.0")
    finally:
        planted.unlink()
    assert in_proc.succeeded and "== end" in seen_in_proc, seen_in_proc
    assert key not in seen_in_proc and "victim-job" not in seen_in_proc, seen_in_proc
    listed = seen_in_proc.partition("== listed")[2].partition("==")[0].split()
    assert pid not in listed and "1" not in listed and len([p for p in listed if p.isdigit()]) <= 4, listed
    assert refused.value.errno in (errno.ENOENT, errno.EACCES), refused.value
    assert b"cannot enter its workdir" in logs.read("root.0", 1, "stderr")
    assert in_tmp.succeeded and "== here\n/tmp\n" in seen_in_tmp, seen_in_tmp
    assert planted.name not in seen_in_tmp and key not in seen_in_tmp, seen_in_tmp


LEFT_IN_WORKDIR = r"""
id -u
umask 077
echo "secret $KEY" > private
mkdir own && echo "deep $KEY" > own/file && chmod 777 own
echo "in a shared folder $KEY" > shared/file
ln -s "$TARGET" link
cp /bin/true setuid && chmod 4755 setuid
"""

READ_WHAT_IS_LEFT = r"""
id -u
cat private own/file shared/file 2>&1
echo more >> private 2>&1 || echo "cannot change private"
rm -f shared/file 2>&1 || echo "cannot remove"
echo "== end"
"""


@pytest.fixture
def shared_workdir() -> Iterator[Path]:
    """A folder every uid may write to, on the host's disk (not in a folder the runs have a tmpfs of their own over):
    a `workdir` several users' jobs name; a subfolder `shared` in it, root's, where every user may write and remove
    only their own files (sticky, as /tmp is)."""
    folder = Path("/var/lib", f"megha-test-workdir-{uuid.uuid4().hex[:8]}")
    (folder / "shared").mkdir(parents=True)
    folder.chmod(0o777)
    (folder / "shared").chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.asyncio
async def test_what_a_run_leaves_in_its_workdir_is_handed_to_the_agent_not_to_the_next_run_of_its_uid(
    logs_root: Path, shared_workdir: Path
) -> None:
    """Task uids are leased to one run after another, of any user. A run's files in its `workdir` (a folder shared by
    several users' jobs) outlive it: when it ends they become the agent's user's, modes kept, so the next run given
    the same uid (one uid in the pool: it must be) reads, changes and removes none of them: not a private file, not
    one in a folder of its own, not one in a shared folder. A link the run left is changed itself, never its target,
    and a set-user-ID program it left loses that bit."""
    key = secrets.token_hex(8)
    target = shared_workdir / "target"
    target.write_text("another's\n")
    os.chown(target, NOBODY, NOBODY)
    one_uid = TASK_UIDS[-40:-39]
    async with agent(logs_root, uids=one_uid) as (executor, logs):
        left = await run_to_end(
            executor,
            "alice-job.0",
            replace(sh(LEFT_IN_WORKDIR, KEY=key, TARGET=str(target)), workdir=str(shared_workdir)),
        )
        reader = await run_to_end(
            executor, "mallory-job.0", replace(sh(READ_WHAT_IS_LEFT), workdir=str(shared_workdir))
        )
        writer_uid = logs.read("alice-job.0", 1, "stdout").decode().split()
        seen = logs.read("mallory-job.0", 1, "stdout").decode()
    assert left.succeeded, logs.read("alice-job.0", 1, "stderr")
    assert reader.succeeded and "== end" in seen, seen
    assert writer_uid == [str(one_uid[0])] and seen.split()[0] == str(one_uid[0]), (writer_uid, seen)
    assert key not in seen, seen
    assert "cannot change private" in seen and (shared_workdir / "shared" / "file").exists(), seen
    agent_user = os.geteuid()
    for name in ("private", "own", "own/file", "shared/file", "link", "setuid"):
        assert (shared_workdir / name).lstat().st_uid == agent_user, name
    assert stat.S_IMODE((shared_workdir / "private").stat().st_mode) == 0o600
    assert stat.S_IMODE((shared_workdir / "own").stat().st_mode) == 0o777
    assert not (shared_workdir / "setuid").stat().st_mode & stat.S_ISUID
    assert target.stat().st_uid == NOBODY  # the link's target, not the agent's


@pytest.mark.asyncio
async def test_a_uid_whose_workdir_files_could_not_all_be_handed_over_is_set_aside_and_says_why(
    logs_root: Path, shared_workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A workdir with more entries to look at than the count's bound (MEGHA_TASK_MAX_DISK_FILES) is not looked
    through to its end: the run's uid is set aside, never leased again (the next start is refused, saying so), and
    the agent logs what to do."""
    for i in range(12):
        (shared_workdir / "shared" / f"file-{i}").write_text("")
    one_uid = TASK_UIDS[-41:-40]
    marker = isolation.UID_LOCKS / f"{one_uid[0]}.aside"
    try:
        async with agent(logs_root, max_disk_files=8, uids=one_uid) as (executor, _logs):
            with caplog.at_level(logging.WARNING, logger="megha.services.worker.isolation"):
                done = await run_to_end(executor, "big.0", replace(sh("echo mine > mine"), workdir=str(shared_workdir)))
            with pytest.raises(OSError, match="1 set aside") as refused:
                await executor.start("next.0", 500, 256, 0.0, TRUE)
        assert done.succeeded
        assert refused.value.errno == errno.EAGAIN
        assert "more than 8 files and folders to look at" in marker.read_text()
        assert f"task uid {one_uid[0]} set aside" in caplog.text and str(marker) in caplog.text, caplog.text
    finally:
        marker.unlink(missing_ok=True)


@pytest.mark.asyncio
async def test_starts_with_every_uid_taken_wait_in_line_for_one_and_run_when_it_is_given_back(
    logs_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With the host's one task uid held by a running task, the next two starts wait (MEGHA_TASK_UID_WAIT) rather
    than fail, each saying so once: the first in line runs when the uid is given back, the second when that one
    ends, in the order they came."""
    one_uid = TASK_UIDS[-45:-44]
    async with agent(logs_root, uids=one_uid, uid_wait=30.0) as (executor, logs):
        await started(executor, logs, "holder.0", sh("echo up; sleep 1"), 1)
        with caplog.at_level(logging.WARNING, logger="megha.services.worker.exec_driver"):
            waiting = [asyncio.ensure_future(run_to_end(executor, "next-1.0", sh("date +%s.%N")))]
            await wait_for(lambda: "next-1.0 waits" in caplog.text, 10, lambda: caplog.text)
            waiting.append(asyncio.ensure_future(run_to_end(executor, "next-2.0", sh("date +%s.%N"))))
            done = await asyncio.wait_for(asyncio.gather(*waiting), 30)
        holder = await executor.wait("holder.0")
    assert holder.succeeded and all(d.succeeded for d in done), (holder, done)
    ran_at = [float(logs.read(f"next-{i}.0", 1, "stdout")) for i in (1, 2)]
    assert ran_at[0] < ran_at[1]  # in line: the first to wait ran first
    assert [r.getMessage().split(" waits")[0] for r in caplog.records] == ["task next-1.0", "task next-2.0"]


@pytest.mark.asyncio
async def test_a_start_that_waited_its_time_for_a_uid_fails_saying_so_and_the_holder_is_untouched(
    logs_root: Path,
) -> None:
    one_uid = TASK_UIDS[-46:-45]
    async with agent(logs_root, uids=one_uid, uid_wait=0.5) as (executor, logs):
        await started(executor, logs, "holder.0", sh("echo up; sleep 2"), 1)
        began = time.monotonic()
        with pytest.raises(OSError, match=r"is taken.*; waited 0.5 s for one \(MEGHA_TASK_UID_WAIT\)") as refused:
            await executor.start("late.0", 500, 64, 0.0, sh("true"))
        waited = time.monotonic() - began
        holder = await executor.wait("holder.0")
    assert refused.value.errno == errno.EAGAIN and 0.5 <= waited < 2, waited
    assert holder.succeeded, holder


# ----------------------------------------------------------------------------------------- processes and memory

BOMB = r"""
import os, resource, sys, time
limit = resource.getrlimit(resource.RLIMIT_NPROC)[0]
print(os.getuid(), limit, flush=True)
if limit > 64:
    sys.exit(99)  # no process limit: the bomb would take the machine down, so the test fails on this instead
if os.fork() == 0:
    os.setsid()  # out of the run's session, as an escaping process does
    while True:  # every process forks for ever; a fork refused at the limit is tried again
        try:
            os.fork()
        except OSError:
            time.sleep(0.01)

def mine():
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            uid = open(f"/proc/{pid}/status").read().split("\nUid:")[1].split()[0]
        except (OSError, IndexError):
            continue
        n += uid == str(os.getuid())
    return n

deadline = time.monotonic() + 30
while (n := mine()) < limit and time.monotonic() < deadline:
    time.sleep(0.01)
print(n, flush=True)
"""


@pytest.mark.asyncio
async def test_a_fork_bomb_stops_at_the_process_limit_and_nothing_of_its_uid_outlives_its_run(
    logs_root: Path,
) -> None:
    """The bomb leaves the run's session and forks for ever; the run's main process exits 0 once its uid holds as
    many processes as the limit allows. When the run ends, none of them is left."""
    async with agent(logs_root, max_processes=16) as (executor, logs):
        result = await run_to_end(executor, "bomb.0", python(BOMB), memory_mb=2048)
        (uid, limit), (count,) = (line.split() for line in logs.read("bomb.0", 1, "stdout").decode().splitlines())
        left = uid_processes(int(uid))
    assert result.succeeded, (result, logs.read("bomb.0", 1, "stderr"))
    assert int(limit) == 16 and int(count) == 16  # it reached the limit and went no further
    assert left == []  # the moment the run has ended


@pytest.mark.asyncio
async def test_a_preempted_task_s_processes_are_all_killed_even_those_that_left_its_session(
    logs_root: Path,
) -> None:
    escape = "id -u; setsid sleep 1000 & setsid sh -c 'sleep 1001 & wait' & echo forked; exec sleep 60"
    async with agent(logs_root) as (executor, logs):
        uid, _ = await started(executor, logs, "escape.0", sh(escape), 2)
        await wait_for(lambda: len(uid_processes(int(uid))) == 4, 20, lambda: uid_processes(int(uid)))
        assert await executor.kill("escape.0")
        assert uid_processes(int(uid)) == []


SHM_HOG = """
import os, time
print(os.getuid(), os.stat("/dev/shm").st_dev, flush=True)
written = 0
try:
    with open(f"/dev/shm/megha-hog-{os.getpid()}", "wb") as f:
        for _ in range(100):
            f.write(b"x" * 2**20)  # 100 MB in a tmpfs: memory no process of the task holds
            f.flush()
            written += 2**20
except OSError as exc:  # its own /dev/shm is full: at most its memory request
    print(exc, flush=True)
print("written", written, flush=True)
time.sleep(30)
"""

LEAVE_BEHIND = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
segment = libc.shmget(0, 2**20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
assert segment >= 0, ctypes.get_errno()
for folder in ("/dev/shm", "/tmp", "/var/tmp"):
    with open(f"{folder}/megha-left-{os.getuid()}", "w") as f:
        f.write("left behind")
print(os.getuid(), segment)
"""


@pytest.mark.asyncio
@pytest.mark.parametrize("own_folders", [True, False], ids=["own-dev-shm", "host-dev-shm"])
async def test_shared_memory_counts_against_the_task_s_memory_and_what_a_task_leaves_behind_is_removed(
    logs_root: Path, monkeypatch: pytest.MonkeyPatch, own_folders: bool
) -> None:
    """Under rlimits (the memory watch), a task that writes more than its 64 MB into /dev/shm, its own tmpfs or the
    host's shared one (an agent that cannot mount one), is killed for its memory; its own holds at most 64 MB."""
    if not own_folders:
        monkeypatch.setattr(isolation, "why_no_own_folders", lambda folders: "refused by the test")
    async with agent(logs_root, how=Rlimits("forced by the test")) as (executor, logs):
        hog = await run_to_end(executor, "shm.0", python(SHM_HOG), memory_mb=64)
        hog_uid, hog_dev = (int(n) for n in logs.read("shm.0", 1, "stdout").split()[:2])
        left = await run_to_end(executor, "left.0", python(LEAVE_BEHIND))
    assert hog.error.startswith("exceeded its memory limit of 64 MB"), hog
    assert (hog_dev != os.stat("/dev/shm").st_dev) is own_folders  # its own tmpfs, or the host's
    said = logs.read("shm.0", 1, "stdout").decode()
    if own_folders and "written" in said:  # not killed before it said: its own /dev/shm was full at 64 MB
        assert int(said.rpartition("written ")[2].split()[0]) <= 64 * MIB, said
    assert not [p for p in Path("/dev/shm").iterdir() if p.stat().st_uid == hog_uid]
    assert left.succeeded, left
    uid, segment = (int(n) for n in logs.read("left.0", 1, "stdout").split())
    for folder in ("/dev/shm", "/tmp", "/var/tmp"):
        assert not Path(f"{folder}/megha-left-{uid}").exists(), folder
    ipc = Path("/proc/sysvipc/shm").read_text().splitlines()
    assert not [row for row in ipc[1:] if row.split()[1] == str(segment)], ipc


MEMFD_HOG = """
import os, time
fd = os.memfd_create("megha-hog")  # memory in no folder the watch reads, and never mapped: in no process's pages
for _ in range(128):
    os.write(fd, b"x" * 2**20)
print("written", os.fstat(fd).st_blocks * 512, flush=True)
time.sleep(30)
"""

HELD_BY_TWO_PROCESSES = """
if os.fork() == 0:
    time.sleep(3)
    os._exit(0)
time.sleep(3)
os.wait()
print("done", flush=True)
"""
"""The end of a task's script: what its process holds open, two processes hold for 3 s; then it says "done"."""

MEMFD_SHARED = (
    """
import os, time
fd = os.memfd_create("megha-shared")
for _ in range(100):
    os.write(fd, b"x" * 2**20)
os.dup(fd)  # two descriptors of one process, and then those of two processes
"""
    + HELD_BY_TWO_PROCESSES
)


@pytest.mark.asyncio
async def test_a_memfd_a_task_holds_open_without_mapping_it_counts_against_its_memory_once(logs_root: Path) -> None:
    """Under rlimits (the memory watch), a task with a 64 MB request that writes 128 MB into a memfd it never maps
    (no process's resident memory, no folder's file) is killed for its memory. A 100 MB memfd held by two
    descriptors of each of two processes is counted once: a task with a 160 MB request holding it is not killed,
    and its peak shows the memfd once."""
    async with agent(logs_root, how=Rlimits("forced by the test")) as (executor, logs):
        hog = await run_to_end(executor, "memfd.0", python(MEMFD_HOG), memory_mb=64)
        shared = await run_to_end(executor, "memfd.1", python(MEMFD_SHARED), memory_mb=160)
    said = logs.read("memfd.0", 1, "stdout").decode()
    assert hog.error.startswith("exceeded its memory limit of 64 MB (its processes held"), (hog, said)
    if "written" in said:  # not killed before it said: the memfd held it all
        assert int(said.split()[1]) >= 128 * MIB, said
    assert shared.succeeded, (shared, logs.read("memfd.1", 1, "stderr"))
    assert 100 <= shared.peak_rss_mb < 160, shared


SOCKET_HOG = """
import socket, time
pairs, held = [], 0
while held < 160 * 2**20:  # unread data in socket buffers: kernel memory, in no page of the process
    sender, receiver = socket.socketpair()
    sender.setblocking(False)
    try:
        while True:
            held += sender.send(b"x" * 65536)
    except BlockingIOError:
        pass
    pairs.append((sender, receiver))
print("queued", held, "in", len(pairs), "pairs", flush=True)
time.sleep(30)
"""

SOCKET_FEW = """
import socket, time
sender, receiver = socket.socketpair()
sender.sendall(b"x" * 100_000)
time.sleep(1)
print("done", len(receiver.recv(200_000)), flush=True)
"""


@pytest.mark.asyncio
async def test_what_a_task_s_sockets_hold_unread_counts_against_its_memory(logs_root: Path) -> None:
    """Under rlimits, a task with a 64 MB request that queues 160 MB in Unix socket pairs it never reads (kernel
    buffers, a few MB of resident memory) is killed for its memory; one that keeps 100 KB in flight is not."""
    async with agent(logs_root, how=Rlimits("forced by the test")) as (executor, logs):
        hog = await run_to_end(executor, "sockets.0", python(SOCKET_HOG), memory_mb=64)
        few = await run_to_end(executor, "sockets.1", python(SOCKET_FEW), memory_mb=64)
    said = logs.read("sockets.0", 1, "stdout").decode()
    assert hog.error.startswith("exceeded its memory limit of 64 MB (its processes held"), (hog, said)
    assert few.succeeded and logs.read("sockets.1", 1, "stdout").decode().split() == ["done", "100000"], few


def test_the_watch_counts_a_socket_s_buffers_once_and_only_for_the_run_holding_it() -> None:
    """A process of a task uid holding both ends of 100 Unix socket pairs with their buffers full: the watch adds
    their unread bytes (about 20 MB here) to the uid's memory once, though it holds both ends, and nothing to another
    uid's."""
    uid, other = TASK_UIDS[-40], TASK_UIDS[-41]
    child, bystander = holding_full_sockets(uid, 100), holding(other, 4)

    def resident() -> dict[int, int]:
        return {p.pid: p.rss for p in enforcement.processes() if p.pid in (child, bystander)}

    try:
        # The watch's look and this one are two reads: taken while the children's resident memory held still (a
        # child just made may still fault pages in; a loaded machine once saw 64 KB more between the two).
        for _ in range(50):
            before = resident()
            usage = enforcement.memory_usage({uid, other}, set())
            rss = resident()
            if rss == before:
                break
            time.sleep(0.1)
        queued = socket_memory.socket_bytes()
        inodes = enforcement.open_descriptors(child).sockets
    finally:
        for pid in (child, bystander):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert len(inodes) == 200
    in_buffers = sum(queued.get(inode, 0) for inode in inodes)
    assert in_buffers >= 100 * 150_000, in_buffers  # at least 150 KB a pair
    assert usage[("uid", uid)].held == rss[child] + in_buffers, (usage, rss, in_buffers)
    assert usage[("uid", other)].held == rss[bystander], (usage, rss)


@pytest.mark.parametrize("how", ["unlinked", "O_TMPFILE"])
def test_a_removed_file_of_dev_shm_a_task_holds_open_counts_against_its_memory(how: str) -> None:
    """Where runs share the host's /dev/shm (no tmpfs of their own), a file a task wrote there and removed, or made
    with O_TMPFILE, is in no folder the watch lists: the watch finds it among the descriptors the uid's processes
    hold (a file of a memory file system, removed) and counts its 32 MB once, though two descriptors hold it."""
    uid = TASK_UIDS[-42]
    opened: list[int] = []

    def write() -> None:
        if how == "O_TMPFILE":
            fd = os.open("/dev/shm", os.O_TMPFILE | os.O_RDWR, 0o600)
        else:
            path = f"/dev/shm/megha-removed-{uid}"
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.unlink(path)
        for _ in range(32):
            os.write(fd, b"x" * 2**20)
        opened.extend((fd, os.dup(fd)))

    child = as_uid(uid, write)
    try:
        usage = enforcement.memory_usage({uid}, set())[("uid", uid)]
        rss = next(p.rss for p in enforcement.processes() if p.pid == child)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    assert not [p for p in Path("/dev/shm").iterdir() if p.stat().st_uid == uid]  # in no folder
    assert 32 * MIB <= usage.held - rss < 33 * MIB, (usage, rss)


def test_the_memory_file_systems_are_known_and_a_uid_s_files_in_any_of_them_count() -> None:
    """`memory_devices` names /dev/shm's tmpfs and not the root's disk; `shared_memory_bytes` counts a uid's files
    in each folder it is given (those of the shared folders that are memory file systems, where runs have no tmpfs
    of their own: /tmp is one on some hosts)."""
    devices = enforcement.memory_devices()
    assert os.stat("/dev/shm").st_dev in devices and os.stat("/").st_dev not in devices
    uid = TASK_UIDS[-43]
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "a").write_bytes(b"x" * 2**20)
        os.chown(Path(folder, "a"), uid, uid)
        Path(folder, "b").write_bytes(b"x" * 2**20)  # root's
        assert enforcement.shared_memory_bytes({uid}, [folder]) == {uid: os.stat(Path(folder, "a")).st_blocks * 512}
        assert enforcement.shared_memory_bytes({uid}, []) == {}


def holding_full_sockets(uid: int, pairs: int) -> int:
    """A child process that became `uid` holding both ends of `pairs` Unix socket pairs, each sender's buffer full
    and nothing read, waiting for a signal; its pid once they are full."""
    held = []

    def fill() -> None:
        for _ in range(pairs):
            sender, receiver = socket.socketpair()
            sender.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                while True:
                    sender.send(b"x" * 65536)
            held.append((sender, receiver))

    return as_uid(uid, fill)


# ----------------------------------------------------------------------------------------------- open descriptors

FILES = r"""
import errno, os, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
print("limit", soft, hard)
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard + 1, hard + 1))
    print("raise", resource.getrlimit(resource.RLIMIT_NOFILE)[1])
except (ValueError, OSError):
    print("raise refused")
opened = []
try:
    while len(opened) < 100_000:
        opened.append(os.open("/dev/null", os.O_RDONLY))
    print("open", "never refused")
except OSError as exc:
    print("open", errno.errorcode[exc.errno], max(opened))
"""


def test_a_task_holds_at_most_max_files_descriptors_per_process_and_cannot_raise_that(tmp_path: Path) -> None:
    """An agent started with MEGHA_TASK_MAX_FILES=128: an exec task's descriptor limit is 128, soft and hard; it
    cannot raise it, and its 129th descriptor (number 128) fails with EMFILE."""
    settings = {"drivers": "burn,exec", "task_max_files": 128, "task_log_dir": str(tmp_path / "logs")}
    started = in_child(lambda: None, lambda: start_agent((PYTHON, "-c", FILES), **settings))
    assert "error" not in started, started
    said = dict(line.split(" ", 1) for line in started["task_uid"].splitlines())
    assert said == {"limit": "128 128", "raise": "refused", "open": "EMFILE 127"}, said
    assert any("processes and 128 open files" in line for line in started["lines"]), started["lines"]


SPREAD = """
import os, sys, time
for _ in range(3):  # four processes
    if os.fork() == 0:
        break
held = [os.open("/dev/null", os.O_RDONLY) for _ in range(int(sys.argv[1]))]
print("holding", len(held), flush=True)
time.sleep(float(sys.argv[2]))
"""


@pytest.mark.asyncio
async def test_a_task_whose_processes_together_hold_more_than_max_files_descriptors_is_killed_promptly(
    logs_root: Path,
) -> None:
    """Under rlimits (the memory watch), with MEGHA_TASK_MAX_FILES=128: four processes each holding 60 descriptors
    (under 128 each) are killed within a few looks of the watch, for their descriptors; four holding 20 each are
    not."""
    async with agent(logs_root, how=Rlimits("forced by the test"), max_files=128) as (executor, logs):
        begun = asyncio.get_running_loop().time()
        spread = await run_to_end(executor, "files.0", RunSpec("exec", (PYTHON, "-c", SPREAD, "60", "10")))
        took = asyncio.get_running_loop().time() - begun
        few = await run_to_end(executor, "files.1", RunSpec("exec", (PYTHON, "-c", SPREAD, "20", "1")))
    said = logs.read("files.0", 1, "stdout").decode()
    assert spread.error == "held more than 128 open descriptors across its processes (MEGHA_TASK_MAX_FILES)", (
        spread,
        said,
        logs.read("files.0", 1, "stderr"),
    )
    assert said.count("holding 60") == 4, said  # each process under the limit: none refused a descriptor
    assert took < 5, took
    assert few.succeeded, (few, logs.read("files.1", 1, "stderr"))
    assert logs.read("files.1", 1, "stdout").decode().count("holding 20") == 4


def holding(uid: int, descriptors: int) -> int:
    """A child process that became `uid` holding `descriptors` open (its stdin, stdout and stderr among them, no
    other of this process's), waiting for a signal; its pid once it holds them."""
    ready, tell = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setresuid(uid, uid, uid)
            os.closerange(3, tell)
            os.closerange(tell + 1, 1 << 16)
            opened = [os.open("/dev/null", os.O_RDONLY) for _ in range(descriptors - 4)]
            os.write(tell, b"!")
            os.close(tell)
            os.open("/dev/null", os.O_RDONLY)
            assert len(os.listdir("/proc/self/fd")) - 1 == descriptors, opened  # less the listing's own
            signal.pause()
        finally:
            os._exit(0)
    os.close(tell)
    try:
        assert os.read(ready, 1) == b"!"
    finally:
        os.close(ready)
    return pid


def test_the_memory_watch_looks_at_no_more_than_max_files_descriptors_of_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes of a uid, each holding 100 descriptors: with a bound of 128, the watch's scan looks at (reads
    the link of) at most 128 of them and says the uid holds more than 128; unbounded, it looks at all 200."""
    uid = TASK_UIDS[-30]
    children = [holding(uid, 100) for _ in range(2)]
    looked: list[str] = []
    readlink = os.readlink

    def counting(path: str, *, dir_fd: int | None = None) -> str:
        looked.append(path)
        return readlink(path, dir_fd=dir_fd)

    try:
        monkeypatch.setattr(os, "readlink", counting)
        bounded = enforcement.memory_usage({uid}, set(), 128)[("uid", uid)]
        bounded_looks = len(looked)
        looked.clear()
        unbounded = enforcement.memory_usage({uid}, set())[("uid", uid)]
        monkeypatch.undo()
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert bounded.descriptors > 128 and bounded_looks <= 128, (bounded, bounded_looks)
    assert unbounded.descriptors == 200 and len(looked) == 200, (unbounded, len(looked))
    assert bounded.held > 0


# ---------------------------------------------------------------------------------------------------------- disk

DISK_MB = 8
"""The disk limit of the tests' agent (MEGHA_TASK_MAX_DISK_MB)."""

ONE_FILE = {
    "dd": ("dd", "if=/dev/zero", "of=big", "bs=1M", "count=20"),  # killed by SIGXFSZ, or by the watch first
    "python": (PYTHON, "-c", "open('big', 'wb').write(b'x' * 20 * 2**20)"),  # ignores SIGXFSZ: EFBIG
    "dd-dev-shm": ("dd", "if=/dev/zero", "of=/dev/shm/big", "bs=1M", "count=20"),  # memory, no disk counted
    # dash prints nothing when SIGXFSZ kills a command; its exit code says so (128 + 25)
    "sh-dev-shm": ("sh", "-c", "dd if=/dev/zero of=/dev/shm/big bs=1M count=20 2>/dev/null; exit $?"),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("how", list(ONE_FILE))
async def test_a_task_that_writes_one_file_past_the_disk_limit_fails_with_the_disk_reason(
    logs_root: Path, how: str
) -> None:
    """MEGHA_TASK_MAX_DISK_MB=8: a task writing one 20 MB file in its scratch folder fails over its disk limit, whether
    the kernel's SIGXFSZ or the watch stopped it (dd), or the write failed with EFBIG (Python ignores SIGXFSZ); in
    /dev/shm (a tmpfs: memory, no disk the watch counts) the file is still cut at 8 MB, and SIGXFSZ is reported as
    the disk limit, not as a signal, also when it killed a command of a shell that then exited (with 153)."""
    async with agent(logs_root, max_disk_mb=DISK_MB) as (executor, logs):
        result = await run_to_end(executor, "one.0", RunSpec("exec", ONE_FILE[how]))
    assert result.error.startswith(f"exceeded its disk limit of {DISK_MB} MB ("), (
        result,
        logs.read("one.0", 1, "stderr"),
    )
    if how == "python":
        assert "(a write failed at its file size rlimit): exit code 1:" in result.error, result
        assert "File too large" in result.error, result
    if how == "dd-dev-shm":
        assert result.error == f"exceeded its disk limit of {DISK_MB} MB (a file reached it: killed by SIGXFSZ)", result
    if how == "sh-dev-shm":
        assert result.error == (
            f"exceeded its disk limit of {DISK_MB} MB (most likely: exit code 153, a shell's when SIGXFSZ killed a "
            "command of it)"
        ), result


MANY_FILES = """
echo "$TMPDIR"
mkdir -p "$PLACE"
for i in 1 2 3 4 5 6; do head -c 3000000 /dev/zero > "$PLACE/f$i"; done
echo written
sleep 10
"""


@pytest.mark.asyncio
@pytest.mark.parametrize("place", ["scratch", "/tmp", "/var/tmp"])
async def test_many_files_each_under_the_disk_limit_but_together_over_it_fail_the_task(
    logs_root: Path, monkeypatch: pytest.MonkeyPatch, place: str
) -> None:
    """Six 3 MB files (each under the 8 MB limit, 18 MB together) in the task's scratch folder, or, where runs share
    the host's /tmp and /var/tmp (an agent that cannot mount a tmpfs of a run's own) and they are on disk, in a
    folder of its own there: the watch kills it within a few looks, with the disk reason; its scratch folder and what
    it left in the shared folder are gone after its run."""
    if place != "scratch":
        if os.stat(place).st_dev in enforcement.memory_devices():
            pytest.fail(f"{place} is a memory file system here: its files count as memory, not disk")
        monkeypatch.setattr(isolation, "why_no_own_folders", lambda folders: "refused by the test")
    folder = "$TMPDIR/files" if place == "scratch" else f"{place}/megha-disk-{uuid.uuid4().hex[:8]}"
    async with agent(logs_root, max_disk_mb=DISK_MB) as (executor, logs):
        begun = asyncio.get_running_loop().time()
        result = await run_to_end(executor, "many.0", RunSpec("exec", ("sh", "-c", f'PLACE="{folder}"; {MANY_FILES}')))
        took = asyncio.get_running_loop().time() - begun
    said = logs.read("many.0", 1, "stdout").decode().split()
    assert result.error.startswith(f"exceeded its disk limit of {DISK_MB} MB (its files took "), (result, said)
    assert took < 8, took  # not its 10 s sleep
    assert not Path(said[0]).exists()  # its scratch folder
    if place != "scratch":
        assert not Path(folder).exists(), folder


REMOVED = (
    """
import os, sys, time
def removed_file(mb):
    fd = os.open("removed", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.unlink("removed")
    os.write(fd, b"x" * mb * 2**20)
    return fd
fd = removed_file(5)
os.dup(fd)  # two descriptors of one process, then of two processes
os.link(open("linked", "wb").name, "link")  # an empty file, two names
with open("linked", "ab") as f:
    f.write(b"y" * 2 * 2**20)  # 5 + 2 MB, each once: under 8 MB
if sys.argv[1] == "two":
    removed_file(5)  # 12 MB
"""
    + HELD_BY_TWO_PROCESSES
)


@pytest.mark.asyncio
async def test_a_removed_file_a_task_holds_open_counts_against_its_disk_once(logs_root: Path) -> None:
    """A 5 MB file the task removed while two descriptors of each of two processes hold it, and a 2 MB file with two
    names (a hard link), in its scratch folder: 7 MB counted once each, so under 8 MB the task is untouched for 3 s
    (three looks at its disk). A second 5 MB removed file takes it over: it fails with the disk reason."""
    async with agent(logs_root, max_disk_mb=DISK_MB) as (executor, logs):
        once = await run_to_end(executor, "removed.0", RunSpec("exec", (PYTHON, "-c", REMOVED, "one")))
        two = await run_to_end(executor, "removed.1", RunSpec("exec", (PYTHON, "-c", REMOVED, "two")))
    assert once.succeeded and logs.read("removed.0", 1, "stdout") == b"done\n", (
        once,
        logs.read("removed.0", 1, "stderr"),
    )
    assert two.error.startswith(f"exceeded its disk limit of {DISK_MB} MB (its files took 1"), two


@pytest.mark.asyncio
async def test_a_task_over_its_count_of_files_and_folders_fails_and_one_well_under_its_limits_is_untouched(
    logs_root: Path,
) -> None:
    """MEGHA_TASK_MAX_DISK_FILES=2000: a task making 3,000 empty files (no block, so no byte of its disk limit) fails
    for them; one writing 4 MB in 100 files and folders runs its 2 s to the end."""
    many = "mkdir d; cd d; i=0; while [ $i -lt 3000 ]; do : > f$i; i=$((i+1)); done; sleep 10"
    few = "for i in $(seq 50); do mkdir d$i; head -c 80000 /dev/zero > d$i/f; done; sleep 2; echo done"
    async with agent(logs_root, max_disk_mb=DISK_MB, max_disk_files=2000) as (executor, logs):
        files = await run_to_end(executor, "files.0", sh(many))
        under = await run_to_end(executor, "files.1", sh(few))
    expected = f"exceeded its disk limit of {DISK_MB} MB (more than 2000 files and folders: MEGHA_TASK_MAX_DISK_FILES)"
    assert files.error == expected, files
    assert under.succeeded and logs.read("files.1", 1, "stdout") == b"done\n", (
        under,
        logs.read("files.1", 1, "stderr"),
    )


DEEP = """
import os, time
print(os.getcwd(), flush=True)
for _ in range(25):  # 25 x 201 characters: past PATH_MAX (4096), reached by relative paths
    os.mkdir("d" * 200)
    os.chdir("d" * 200)
open("hidden", "wb").write(b"x" * 2**20)
time.sleep(10)
"""


@pytest.mark.asyncio
async def test_a_task_that_nests_folders_past_the_longest_path_fails_with_the_disk_reason(logs_root: Path) -> None:
    """Files in folders nested past PATH_MAX cannot be reached by their path: the count does not let them go
    uncounted, the task fails with the disk reason, and its scratch folder is still removed after its run."""
    async with agent(logs_root, max_disk_mb=DISK_MB) as (executor, logs):
        result = await run_to_end(executor, "deep.0", python(DEEP))
    expected = "folders nested past the longest path the agent counts files in (PATH_MAX)"
    assert result.error == f"exceeded its disk limit of {DISK_MB} MB ({expected})", (
        result,
        logs.read("deep.0", 1, "stderr"),
    )
    assert not Path(logs.read("deep.0", 1, "stdout").decode().strip()).exists()


def test_the_disk_count_takes_blocks_each_file_once_and_looks_at_no_more_than_its_bound(tmp_path: Path) -> None:
    """`disk_usage` over a scratch folder of a task uid's: a 1 MB file with a second name is counted once (its
    blocks), a sparse 1 GB file by its blocks, a root's file not at all; with a bound of 100 files and folders the
    count stops at 101 of the 303."""
    uid = TASK_UIDS[-44]
    scratch = tmp_path / "scratch"
    (scratch / "d").mkdir(parents=True)
    (scratch / "a").write_bytes(b"x" * 2**20)
    os.link(scratch / "a", scratch / "d" / "b")
    with open(scratch / "sparse", "wb") as f:
        f.truncate(2**30)
        f.write(b"x")
    for i in range(297):
        (scratch / "d" / f"e{i}").touch()
    for path in [scratch, *scratch.rglob("*")]:
        os.chown(path, uid, uid)
    (scratch / "root's").write_bytes(b"x" * 2**20)
    places = {("uid", uid): disk_usage.DiskPlaces(uid, str(scratch), shared=False)}
    blocks = sum(os.lstat(p).st_blocks * 512 for p in (scratch, scratch / "d", scratch / "a", scratch / "sparse"))
    whole = disk_usage.disk_usage(places, {}, [], 1000)[("uid", uid)]
    bounded = disk_usage.disk_usage(places, {}, [], 100)[("uid", uid)]
    assert whole == disk_usage.DiskUse(blocks, 303), (whole, blocks)  # 301 of the uid's, the scratch folder, root's
    assert blocks < 2 * 2**20 and bounded.entries == 101, bounded


def test_an_agent_s_disk_limit_is_each_file_s_size_limit_for_its_tasks(tmp_path: Path) -> None:
    """An agent started with MEGHA_TASK_MAX_DISK_MB=64 gives its exec tasks RLIMIT_FSIZE 64 MB, soft and hard, and
    says so at start-up."""
    settings = {"drivers": "burn,exec", "task_max_disk_mb": 64, "task_log_dir": str(tmp_path / "logs")}
    limit = "import resource; print(*resource.getrlimit(resource.RLIMIT_FSIZE))"
    started = in_child(lambda: None, lambda: start_agent((PYTHON, "-c", limit), **settings))
    assert started["task_uid"] == f"{64 * MIB} {64 * MIB}", started
    assert any("filling at most 64 MB of disk in 100000 files" in line for line in started["lines"]), started["lines"]


# ------------------------------------------------------------------------------------------ no user namespaces

NAMESPACES = r"""
import ctypes, errno, mmap, os, platform, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
NEWUSER = 0x10000000

def said(result):
    return "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]

# What every program does, first: threads, a new program, a fork.
done = []
threads = [threading.Thread(target=done.append, args=(i,)) for i in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("threads", len(done))
print("subprocess", subprocess.run(["sh", "-c", "echo $((6 * 7))"], capture_output=True, text=True).stdout.strip())
if (pid := os.fork()) == 0:
    os._exit(7)
print("fork", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
# clone(CLONE_NEWUSER | SIGCHLD): where allowed, a child as fork's, which exits at once.
clone = {"x86_64": 56, "aarch64": 220}[platform.machine()]
pid = libc.syscall(ctypes.c_long(clone), ctypes.c_long(NEWUSER | 17), None, None, None, None)
if pid == 0:
    os._exit(0)
if pid > 0:
    os.waitpid(pid, 0)
print("clone", said(pid))
print("clone3", said(libc.syscall(ctypes.c_long(435), None, ctypes.c_long(0))))  # allowed: EINVAL (no arguments)
# io_uring_setup(1, NULL), io_uring_enter(-1, ...), io_uring_register(-1, 0, ...): allowed, EFAULT, EBADF, EINVAL
print("io_uring_setup", said(libc.syscall(ctypes.c_long(425), ctypes.c_long(1), None)))
print("io_uring_enter", said(libc.syscall(ctypes.c_long(426), ctypes.c_long(-1), 0, 0, 0, None, 0)))
print("io_uring_register", said(libc.syscall(ctypes.c_long(427), ctypes.c_long(-1), 0, None, 0)))
# keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 1): allowed, the id of this uid's keyring (made if need be)
keyctl = {"x86_64": 250, "aarch64": 219}[platform.machine()]
print("keyctl", said(libc.syscall(ctypes.c_long(keyctl), ctypes.c_long(0), ctypes.c_long(-4), ctypes.c_long(1))))
if platform.machine() == "x86_64":  # unshare(CLONE_NEWUSER) through the i386 table (int 0x80), from this process
    code = bytes.fromhex("53" "b836010000" "bb00000010" "cd80" "5b" "c3")  # push rbx; eax=310; ebx=flags; int 0x80
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    result = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
    print("i386 unshare", "ok" if result >= 0 else errno.errorcode[-result])
print("unshare", said(libc.unshare(NEWUSER)))  # last: where allowed, this process is in a user namespace now
"""


@pytest.mark.asyncio
async def test_a_task_makes_no_user_namespace_nor_io_uring_but_still_starts_threads_programs_and_forks(
    logs_root: Path,
) -> None:
    """A user namespace of its own would let a task mount a tmpfs the memory watch does not see, and is kernel attack
    surface, as io_uring is. unshare and clone with CLONE_NEWUSER fail with EPERM (through the i386 system call
    table too, on x86-64: no other door), clone3 with ENOSYS (glibc then uses clone), the three io_uring calls with
    ENOSYS (as on a kernel without it), and threads, a new program and a fork still work."""
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip(f"the filter knows the system calls of x86_64 and aarch64 only, not {os.uname().machine}'s")
    assert "making no user namespace and no io_uring" in await ExecDriver("iso", TASK_UIDS, 64).prepare()
    async with agent(logs_root) as (executor, logs):
        result = await run_to_end(executor, "userns.0", python(NAMESPACES))
    said = dict(line.rsplit(" ", 1) for line in logs.read("userns.0", 1, "stdout").decode().splitlines())
    assert result.succeeded, (result, said, logs.read("userns.0", 1, "stderr"))
    assert said.pop("threads") == "4" and said.pop("subprocess") == "42" and said.pop("fork") == "7", said
    if said.get("i386 unshare") == "ENOSYS":  # a kernel without i386 programs: no such door
        said.pop("i386 unshare")
    expected = {"clone": "EPERM", "clone3": "ENOSYS", "unshare": "EPERM"}
    expected |= {"io_uring_setup": "ENOSYS", "io_uring_enter": "ENOSYS", "io_uring_register": "ENOSYS"}
    expected["keyctl"] = "ENOSYS"  # a uid's keyrings outlive its run: the next run of that uid may be another user's
    if os.uname().machine == "x86_64":
        expected["i386 unshare"] = "EPERM"
    assert said == expected


def test_on_a_machine_the_filter_does_not_know_tasks_may_make_user_namespaces_and_the_agent_says_so(
    logs_root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No filter rather than a wrong one: on another machine the agent installs none, says so in one line at
    start-up, and runs its tasks."""
    real = os.uname()
    monkeypatch.setattr(os, "uname", lambda: os.uname_result((*real[:4], "riscv64")))
    assert enforcement.task_syscall_filter() is None

    async def start() -> tuple[str, ExecutionResult]:
        async with agent(logs_root) as (executor, _):
            line = await ExecDriver("iso", TASK_UIDS, 64).prepare()
            return line, await run_to_end(executor, "plain.0", TRUE)

    with caplog.at_level(logging.WARNING):
        line, result = asyncio.run(start())
    assert "making no user namespace" not in line and result.succeeded, (line, result)
    said = [r.getMessage() for r in caplog.records if "user namespaces" in r.getMessage()]
    assert len(said) == 2, caplog.text  # one per driver prepared
    assert said[0].startswith("exec tasks may make user namespaces of their own") and "(riscv64)" in said[0], said


def test_the_filter_refuses_user_namespaces_and_io_uring_for_the_native_and_the_32_bit_system_calls() -> None:
    """The filter, read back: for each architecture the machine's processes may call the kernel as, clone and
    unshare with CLONE_NEWUSER are refused (EPERM), clone3 and the three io_uring calls always (ENOSYS), and nothing
    else."""
    numbers = {
        0xC000003E: (56, 272, 435),
        0x40000003: (120, 310, 435),
        0xC00000B7: (220, 97, 435),
        0x40000028: (120, 337, 435),
    }
    keys = {0xC000003E: (248, 249, 250), 0x40000003: (286, 287, 288), 0xC00000B7: (217, 218, 219)}
    keys[0x40000028] = (309, 310, 311)  # add_key, request_key, keyctl
    for machine, arches in {"x86_64": (0xC000003E, 0x40000003), "aarch64": (0xC00000B7, 0x40000028)}.items():
        seccomp = enforcement.task_syscall_filter(machine)
        assert seccomp is not None
        for arch in arches:
            clone, unshare, clone3 = numbers[arch]
            for nr, flags, refused in [
                (clone, 0x10000000 | 17, errno.EPERM),
                (clone, 0x00020000 | 17, None),  # CLONE_NEWNS alone: the kernel decides
                (unshare, 0x10000000, errno.EPERM),
                (unshare, 0x10000000 | 0x00020000, errno.EPERM),
                (unshare, 0x00020000, None),
                (clone3, 0, errno.ENOSYS),
                (425, 1, errno.ENOSYS),  # io_uring_setup, io_uring_enter, io_uring_register
                (426, 0, errno.ENOSYS),
                (427, 0, errno.ENOSYS),
                (424, 0, None),  # pidfd_send_signal and io_uring's other neighbour: allowed
                (428, 0, None),
                (57, 0x10000000, None),  # any other call, whatever its arguments
                *((nr, 0, errno.ENOSYS) for nr in keys[arch]),  # the kernel's keyrings
            ]:
                assert run_filter(seccomp.program, nr, arch, flags) == refused, (machine, hex(arch), nr, hex(flags))
        assert run_filter(seccomp.program, 272, 0xC000003F, 0x10000000) is None  # an architecture it knows not
    x86 = enforcement.task_syscall_filter("x86_64")
    assert x86 is not None and run_filter(x86.program, 0x40000000 | 272, 0xC000003E, 0x10000000) == errno.EPERM  # x32
    assert run_filter(x86.program, 0x40000000 | 425, 0xC000003E, 1) == errno.ENOSYS  # x32's io_uring_setup
    assert run_filter(x86.program, 0x40000000 | 250, 0xC000003E, 0) == errno.ENOSYS  # x32's keyctl
    assert enforcement.task_syscall_filter("riscv64") is None


def run_filter(program: bytes, nr: int, arch: int, arg0: int) -> int | None:
    """What a classic BPF seccomp program answers for a system call: the errno it fails with, None when allowed
    (an interpreter of the few instructions such a filter uses)."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    code = [struct.unpack_from("=HBBI", program, at) for at in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        if op == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            (acc,) = struct.unpack_from("=I", data, k)
            pc += 1
        elif op in (0x15, 0x45):  # BPF_JMP | BPF_JEQ / BPF_JSET | BPF_K
            taken = acc == k if op == 0x15 else bool(acc & k)
            pc += 1 + (jt if taken else jf)
        elif op == 0x06:  # BPF_RET | BPF_K
            if k == 0x7FFF0000:
                return None
            assert k & 0xFFFF0000 == 0x00050000, hex(k)  # SECCOMP_RET_ERRNO, never a kill
            return k & 0xFFFF
        else:
            raise AssertionError(f"unexpected BPF instruction {op:#x}")


OWNER = r"""
id -u; pwd
for folder in /dev/shm /tmp /var/tmp "$OPEN"; do (umask 022; echo "$TOKEN" > "$folder/megha-own-$TOKEN"); done
echo scratch > "$TMPDIR/scratch-file" && mktemp > /dev/null && echo "scratch works"
stat -c '%a %n' /dev/shm /tmp /var/tmp
cat /proc/self/mounts
echo ready; exec sleep 60
"""

OTHER = r"""
ls -a /dev/shm /tmp /var/tmp "$OPEN"
for folder in /dev/shm /tmp /var/tmp; do cat "$folder/megha-own-$TOKEN"; done
echo end
"""


def owned_by(uid: int, *folders: Path) -> list[Path]:
    """What `uid` owns at the top of `folders`."""
    found = []
    for folder in folders:
        for path in folder.iterdir():
            with contextlib.suppress(FileNotFoundError):  # another test's, gone meanwhile
                if path.lstat().st_uid == uid:
                    found.append(path)
    return found


@pytest.mark.asyncio
async def test_a_task_s_dev_shm_and_tmp_are_its_own_unseen_by_another_task_and_gone_with_it(logs_root: Path) -> None:
    """Two tasks at once, of two uids: the owner writes a file anyone may read (0644) in /dev/shm, /tmp and /var/tmp,
    and in a folder of /tmp anyone may write to that is not its own (as /tmp/.X11-unix, which no end of a run looks
    into); the other lists those folders and reads the files. It finds neither names nor contents: each sees its own
    tmpfs (1777, nosuid, nodev, at most its memory request) there, and nothing of the owner's reaches the host's
    folders, where nothing of it is left after its run. Its TMPDIR, its scratch folder on the host, still works."""
    token = secrets.token_hex(8)
    open_folder = Path(tempfile.mkdtemp(prefix="megha-open-"))
    open_folder.chmod(0o1777)
    env = {"TOKEN": token, "OPEN": str(open_folder)}
    try:
        async with agent(logs_root) as (executor, logs):
            printed = await started(executor, logs, "owner.0", sh(OWNER, **env), 1)
            await wait_for(lambda: "ready" in logs.read("owner.0", 1, "stdout").decode(), 20)
            uid, scratch = printed[0], Path(logs.read("owner.0", 1, "stdout").decode().splitlines()[1])
            on_host = [
                p
                for f in ("/dev/shm", "/tmp", "/var/tmp", open_folder)
                if (p := Path(f, f"megha-own-{token}")).exists()
            ]
            scratch_on_host = (scratch / "scratch-file").read_text()
            other = await run_to_end(executor, "other.0", sh(OTHER, **env))
            owner = logs.read("owner.0", 1, "stdout").decode()
            seen, errors = (logs.read("other.0", 1, stream).decode() for stream in ("stdout", "stderr"))
            await executor.kill("owner.0")
        left = owned_by(int(uid), Path("/dev/shm"), Path("/tmp"), Path("/var/tmp"), open_folder)
    finally:
        shutil.rmtree(open_folder)
    assert other.succeeded and "end" in seen, (other, seen, errors)
    assert token not in seen, seen  # neither a name nor a content of the owner's
    assert errors.count("No such file or directory") >= 3, errors
    assert on_host == [], on_host
    assert "scratch works" in owner and scratch_on_host == "scratch\n", owner
    assert [line for line in owner.splitlines() if line.endswith((" /dev/shm", " /tmp", " /var/tmp"))] == [
        f"1777 {folder}" for folder in ("/dev/shm", "/tmp", "/var/tmp")
    ], owner
    mounts = {fields[1]: fields for line in owner.splitlines() if len(fields := line.split()) == 6}  # the last: on top
    for folder in ("/dev/shm", "/tmp", "/var/tmp", "/run/lock"):
        _, _, kind, options, _, _ = mounts[folder]
        size = next(o for o in options.split(",") if o.startswith("size="))
        assert kind == "tmpfs" and {"nosuid", "nodev"} <= set(options.split(",")), mounts[folder]
        assert size == f"size={256 * 1024}k", mounts[folder]  # the task's memory request: 256 MB
    assert left == [] and not scratch.exists(), left  # its scratch folder is gone too


# ------------------------------------------------------------------------------------------- many runs at once

MANY = 80
NEIGHBOURS = 8


def neighbour(stop: threading.Event, wronged: list[str]) -> None:
    """What the agent's other threads do while runs start and end (scan /proc, open uid lock files, remove what a
    uid left), only faster: open /dev/null, check each descriptor is /dev/null still, close it. A descriptor closed
    or replaced under this thread is one the driver closed that was not its own (as a pipe closed twice is)."""
    null = os.stat("/dev/null")
    while not stop.is_set():
        for fd in [os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC) for _ in range(8)]:
            try:
                st = os.fstat(fd)
                os.close(fd)
            except OSError as exc:
                wronged.append(f"descriptor {fd}: {exc}")
                continue
            if (st.st_dev, st.st_ino) != (null.st_dev, null.st_ino):
                wronged.append(f"descriptor {fd} was no longer /dev/null")


def test_many_tasks_started_at_once_under_uvloop_all_start_and_finish_and_no_other_descriptor_is_closed(
    logs_root: Path,
) -> None:
    """An agent's loop is uvloop (uvicorn's), and a big batch starts MANY short runs at once, while threads open
    and close files as the agent's do. Every run starts and finishes, and no descriptor of another thread is closed
    under it: uvloop's pipe transport closed each output pipe twice (MagicStack/uvloop#763), and the second close
    took whatever another thread had just opened with that number (the /proc scan of a uid lease, a uid's lock
    file, a run's output folder or its next pipe). Under asyncio's own loop every other test here runs."""

    async def many() -> list[ExecutionResult]:
        async with agent(logs_root) as (executor, _):
            return list(await asyncio.gather(*(run_to_end(executor, f"many.{i}", TRUE) for i in range(MANY))))

    stop, wronged = threading.Event(), []
    beside = [threading.Thread(target=neighbour, args=(stop, wronged), daemon=True) for _ in range(NEIGHBOURS)]
    for thread in beside:
        thread.start()
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            results = runner.run(many())
    finally:
        stop.set()
        for thread in beside:
            thread.join()
    failed = [(r.task_id, r.error) for r in results if not r.succeeded]
    assert not failed, f"{len(failed)} of {MANY} runs failed: {failed[:5]}"
    assert not wronged, wronged[:5]


# -------------------------------------------------------------------------------------------- leases of uids


def as_uid(uid: int, then: Callable[[], None] | None = None) -> int:
    """A child process that became `uid` (and waits for a signal), having run `then` as `uid` when given; its pid once
    it is `uid` and `then` has returned."""
    ready, tell = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setresuid(uid, uid, uid)
            if then is not None:
                then()
            os.write(tell, b"!")
            signal.pause()
        finally:
            os._exit(0)
    os.close(tell)
    try:
        assert os.read(ready, 1) == b"!"
    finally:
        os.close(ready)
    return pid


def test_leases_taken_at_once_by_threads_of_two_agents_never_share_a_uid(tmp_path: Path) -> None:
    """24 leases at once, from the threads of two agents of one host, of 6 uids: each uid is leased once, the
    other leases are refused (EAGAIN)."""
    uids = TASK_UIDS[-20:-14]
    agents = [TaskUids(uids, tmp_path / "locks") for _ in range(2)]
    at_once = threading.Barrier(24)

    def take(pool: TaskUids) -> UidLease | None:
        at_once.wait()
        try:
            return pool.lease()
        except OSError as exc:
            assert exc.errno == errno.EAGAIN, exc
            return None

    with ThreadPoolExecutor(24) as threads:
        leases = list(threads.map(take, [agents[i % 2] for i in range(24)]))
    try:
        assert sorted(lease.uid for lease in leases if lease is not None) == list(uids)
    finally:
        for i, lease in enumerate(leases):
            if lease is not None:
                agents[i % 2].release(lease)


def test_a_uid_a_process_still_has_is_not_leased_again_until_it_is_gone(tmp_path: Path) -> None:
    """A run's end gives its uid back even when a process of it would not die (stuck in the kernel): the uid is
    not leased again while that process lives, and is once it is gone."""
    pool = TaskUids(TASK_UIDS[-24:-22], tmp_path / "locks")
    first = pool.lease()
    left = as_uid(first.uid)
    try:
        pool.release(first)
        second = pool.lease()
        assert second.uid != first.uid
        with pytest.raises(OSError) as refused:
            pool.lease()
        assert refused.value.errno == errno.EAGAIN
    finally:
        os.kill(left, signal.SIGKILL)
        os.waitpid(left, 0)
    third = pool.lease()
    assert third.uid == first.uid
    pool.release(second)
    pool.release(third)


def test_what_a_run_left_in_its_workdir_is_handed_over_at_the_next_lease_when_its_agent_died_first(
    tmp_path: Path, shared_workdir: Path
) -> None:
    """An agent killed while its run had a workdir never handed over what the run left there; the workdir noted in
    the uid's lock file lets the next lease of the uid, by any agent of the host, do it before the uid is taken."""
    pool = TaskUids(TASK_UIDS[-42:-41], tmp_path / "locks")
    first = pool.lease()
    pool.note_workdir(first, str(shared_workdir))
    left = shared_workdir / "shared" / "private"
    left.write_text("secret\n")
    left.chmod(0o600)
    os.chown(left, first.uid, first.gid)
    os.close(first.lock)  # the agent died: its lock went with it, nothing was handed over
    after = TaskUids(TASK_UIDS[-42:-41], tmp_path / "locks").lease()
    try:
        assert after.uid == first.uid
        assert left.stat().st_uid == os.geteuid() and stat.S_IMODE(left.stat().st_mode) == 0o600
        assert os.pread(after.lock, 16, 0) == b""  # handed over: the note is gone
    finally:
        os.close(after.lock)


def test_the_hand_over_looks_into_no_folder_the_run_saw_its_own_of(tmp_path: Path) -> None:
    """A run with its own /tmp saw that, not the host's: a `workdir` of `/` is looked through without going into
    the host's /tmp (what the uid has there is the shared folders' purge's), and a `workdir` inside it not at all."""
    uid = TASK_UIDS[-43]
    for name in ("seen", "own"):
        (tmp_path / name).mkdir(mode=0o777)
        (tmp_path / name).chmod(0o777)
        (tmp_path / name / "file").write_text("")
        os.chown(tmp_path / name / "file", uid, uid)
    assert isolation.disown(str(tmp_path), uid, 100, frozenset({str(tmp_path / "own")})) is None
    assert (tmp_path / "seen" / "file").stat().st_uid == os.geteuid()
    assert (tmp_path / "own" / "file").stat().st_uid == uid


@pytest.fixture
def leases(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """The uids the exec driver leases and gives back, as they happen."""
    seen: dict[str, list[int]] = {"leased": [], "released": []}
    lease, release = TaskUids.lease, TaskUids.release

    def leasing(self: TaskUids) -> UidLease:
        taken = lease(self)
        seen["leased"].append(taken.uid)
        return taken

    def releasing(self: TaskUids, taken: UidLease) -> None:
        seen["released"].append(taken.uid)
        release(self, taken)

    monkeypatch.setattr(TaskUids, "lease", leasing)
    monkeypatch.setattr(TaskUids, "release", releasing)
    return seen


def open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def uid_processes_and_zombies(uid: int) -> list[enforcement.Process]:
    return [p for p in enforcement.processes() if uid in p.uids]


@pytest.mark.asyncio
async def test_a_start_that_fails_once_its_process_exists_kills_and_reaps_it_and_gives_its_uid_back(
    logs_root: Path, leases: dict[str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process is made, then the driver cannot watch it (no pidfd: out of descriptors): the start fails, and
    nothing of the run is left: no process of its uid (not even a zombie), no descriptor, and the uid is free."""

    def no_pidfd(pid: int) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    async with agent(logs_root) as (executor, _):
        before = open_descriptors()
        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
        with pytest.raises(OSError, match="Too many open files"):
            await executor.start("doomed.0", 500, 256, 0.0, sh("exec sleep 60"))
        monkeypatch.undo()
        after = open_descriptors()
    (uid,) = leases["leased"]
    assert leases["released"] == [uid]
    assert uid_processes_and_zombies(uid) == []
    assert after == before


@pytest.mark.asyncio
async def test_a_run_whose_wait_is_cancelled_is_killed_before_its_uid_is_given_back(
    logs_root: Path, leases: dict[str, list[int]]
) -> None:
    logs = TaskLogs(logs_root, 1 << 20, kept=10)
    logs.prepare()
    driver = ExecDriver("iso", TASK_UIDS, 64)
    await driver.prepare()
    run_log = logs.open("cancelled.0", 1)
    try:
        run = await driver.start("cancelled.0", 1, sh("id -u; exec sleep 60"), Limits(500, 256), run_log)
        await wait_for(lambda: b"\n" in logs.read("cancelled.0", 1, "stdout"), 20)
        uid = int(logs.read("cancelled.0", 1, "stdout"))
        waiting = asyncio.ensure_future(run.wait())
        await asyncio.sleep(0)  # one turn of the loop: the wait is under way, waiting for the run's end
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    finally:
        logs.close("cancelled.0", run_log)
    assert leases["leased"] == leases["released"] == [uid]
    assert uid_processes_and_zombies(uid) == []


@pytest.mark.asyncio
async def test_what_the_memory_watch_saw_of_a_uid_is_not_shown_to_the_next_run_of_that_uid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watch's scan takes a while (in a thread); a run ends and its uid is leased again meanwhile. What the
    scan saw of the uid (the ended run's processes) is not shown to the new run, which it could kill."""
    scanning, swapped = threading.Event(), threading.Event()
    scans = iter([10**12, 1])  # the ended run's memory, then the new run's

    def memory_usage(
        uids: set[int], sessions: set[int], max_files: int | None = None, disk: object = None, max_disk_files: int = 0
    ) -> dict[tuple[str, int], enforcement.Usage]:
        scanning.set()
        swapped.wait(10)
        return {("uid", 7): enforcement.Usage(next(scans, 1), 3)}

    monkeypatch.setattr(enforcement, "memory_usage", memory_usage)
    ended: list[enforcement.Usage] = []
    new: list[enforcement.Usage] = []
    watch = MemoryWatch()
    watch.add(("uid", 7), ended.append)
    await asyncio.to_thread(scanning.wait, 10)
    watch.forget(("uid", 7))  # the run ends, its uid is given back and leased again
    watch.add(("uid", 7), new.append)
    swapped.set()
    await wait_for(lambda: bool(new), 10)  # the next scan's is the new run's
    assert ended == [] and new[0].held == 1
    watch.forget(("uid", 7))


# --------------------------------------------------------------------------------------------------- kept output


@pytest.mark.asyncio
async def test_the_kept_output_is_the_agent_s_alone(logs_root: Path) -> None:
    async with agent(logs_root) as (executor, _):
        assert (await run_to_end(executor, "out.0", sh("echo hi"))).succeeded
    assert logs_root.parent.name == f"megha-{os.geteuid()}"  # not a name any user could take first
    for path, mode in [(logs_root.parent, 0o700), (logs_root, 0o700), (logs_root / "out.0" / "1", 0o700)]:
        st = path.lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == mode, path
    assert stat.S_IMODE((logs_root / "out.0" / "1" / "stdout").stat().st_mode) == 0o600


def test_a_kept_output_folder_another_user_owns_or_could_swap_is_refused_at_start_up(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(StartupError, match="belongs to uid 65534"):
        TaskLogs(theirs, 100, 10).prepare()
    open_to_all = tmp_path / "open"
    open_to_all.mkdir(mode=0o777)
    open_to_all.chmod(0o777)
    with pytest.raises(StartupError, match="others may write to it"):
        TaskLogs(open_to_all / "logs", 100, 10).prepare()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(StartupError, match="is a link"):
        TaskLogs(tmp_path / "link", 100, 10).prepare()


@pytest.mark.asyncio
async def test_a_link_planted_in_the_output_folder_is_not_followed(logs_root: Path, tmp_path: Path) -> None:
    """Links planted where a run's output goes (a run's file, a task's folder) are not written through, and links
    or hard links put in place of kept output are not served: the files they point at stay as they were."""
    precious = tmp_path / "precious"
    precious.write_text("precious")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    async with agent(logs_root) as (executor, logs):
        (logs_root / "planted.0" / "1").mkdir(parents=True)
        (logs_root / "planted.0" / "1" / "stdout").symlink_to(precious)
        (logs_root / "folder.0").symlink_to(elsewhere, target_is_directory=True)
        for task_id in ("planted.0", "folder.0"):
            with pytest.raises(OSError):
                await executor.start(task_id, 500, 64, 0.0, sh("echo overwritten"))
        assert executor.running() == []

        assert (await run_to_end(executor, "done.0", sh("echo mine"))).succeeded
        assert (await run_to_end(executor, "done.1", sh("echo mine"))).succeeded
    assert precious.read_text() == "precious" and list(elsewhere.iterdir()) == []
    stdout = logs_root / "done.0" / "1" / "stdout"
    stdout.unlink()
    stdout.symlink_to(precious)
    hard = logs_root / "done.1" / "1" / "stdout"
    hard.unlink()
    hard.hardlink_to(precious)
    assert logs.read("done.0", 1, "stdout") == b"" and logs.read("done.1", 1, "stdout") == b""


# ---------------------------------------------------------------------------------------- an unprivileged agent


def in_child(become: Callable[[], None], call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`call()` in a child of this process that first ran `become()` (gave up its privileges), its result through a
    pipe as JSON. A child, not a new program: this interpreter may sit where an unprivileged user cannot reach."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read)
            try:
                become()
                result = call()
            except BaseException:
                result = {"error": traceback.format_exc()}
            with os.fdopen(write, "wb") as out:
                out.write(json.dumps(result).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        body = answer.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and body, body
    result: dict[str, Any] = json.loads(body)
    assert "error" not in result, result["error"]
    return result


def become_nobody() -> None:
    """uid and gid `nobody`, no other group: no capability left."""
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)


def drop_capabilities() -> None:
    """Still uid 0, but with no capability at all, as in a container started with `--cap-drop ALL`."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words, all 0
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


CAP_SYS_ADMIN = 21


def drop_sys_admin() -> None:
    """Still root with every capability it had but CAP_SYS_ADMIN, as a container's root by default: it can switch
    uids, not make mount namespaces."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(0x20080522, 0), (Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    data[0].effective &= ~(1 << CAP_SYS_ADMIN)
    data[0].permitted &= ~(1 << CAP_SYS_ADMIN)
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def start_agent(command: tuple[str, ...] = ("id", "-u"), **settings: Any) -> dict[str, Any]:
    """An agent made and started (`prepare`, as its app's start-up does): what it logged, the drivers it offers and
    registers, and, when it offers exec, what an exec task running `command` printed (`task_uid`: by default, the
    uid it ran as)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{record.levelname} {record.getMessage()}")

    megha = logging.getLogger("megha")
    megha.addHandler(Keep())
    megha.setLevel(logging.INFO)

    async def start() -> dict[str, Any]:
        worker = WorkerAgent(WorkerSettings(worker_id="w0", lm_url=NOWHERE, **settings), None)
        await worker.prepare()
        found: dict[str, Any] = {
            "drivers": list(worker.drivers),
            "registered": json.loads(worker.registration())["drivers"],
        }
        if "exec" in worker.drivers:
            assert isinstance(worker.executor, TaskExecutor) and worker.logs is not None
            await worker.executor.start("who.0", 500, 64, 0.0, RunSpec("exec", command))
            found["error"] = (await worker.executor.wait("who.0")).error or None
            found["task_uid"] = worker.logs.read("who.0", 1, "stdout").decode().strip()
            if found["error"] is None:
                del found["error"]
        await worker.close()
        return found

    return asyncio.run(start()) | {"lines": lines}


@pytest.fixture
def run_id() -> Iterator[str]:
    """A deployment name for an agent running as `nobody`; its kept output's folder is removed afterwards."""
    run_id = f"iso-{uuid.uuid4().hex[:8]}"
    yield run_id
    shutil.rmtree(Path(tempfile.gettempdir()) / f"megha-{NOBODY}" / f"{run_id}-w0-task-logs", ignore_errors=True)


def test_an_agent_that_cannot_switch_uids_does_not_offer_exec_and_says_so_in_one_line(run_id: str) -> None:
    started = in_child(become_nobody, lambda: start_agent(drivers="burn,exec", run_id=run_id))
    assert started["drivers"] == started["registered"] == ["burn"]  # what its LM, and so the GMs, learn
    about_exec = [line for line in started["lines"] if "exec" in line]
    assert len(about_exec) == 1, started["lines"]
    assert about_exec[0].startswith("WARNING exec driver not offered: this agent cannot give each task a uid of its")
    assert "uid 65534 without CAP_CHOWN" in about_exec[0] and "MEGHA_EXEC_AS_AGENT_USER=true" in about_exec[0]


def test_the_opt_in_runs_exec_tasks_as_the_agent_s_own_user_and_says_so_loudly(run_id: str) -> None:
    settings = {"drivers": "burn,exec", "exec_as_agent_user": True, "run_id": run_id}
    started = in_child(become_nobody, lambda: start_agent(**settings))
    assert started["drivers"] == started["registered"] == ["burn", "exec"]
    assert started["task_uid"] == str(NOBODY)
    warnings = [line for line in started["lines"] if line.startswith("WARNING")]
    assert len(warnings) == 1 and "EVERY TASK CAN READ THE AGENT'S SECRETS" in warnings[0], started["lines"]
    assert any("exec driver: each task runs as this agent's own user (uid 65534" in line for line in started["lines"])
    assert any("making no user namespace and no io_uring" in line for line in started["lines"]), started["lines"]


def test_root_without_the_capabilities_to_switch_uids_does_not_offer_exec_never_running_tasks_as_root(
    tmp_path: Path,
) -> None:
    settings = {"drivers": "burn,exec", "exec_as_agent_user": True, "task_log_dir": str(tmp_path / "logs")}
    started = in_child(drop_capabilities, lambda: start_agent(**settings))
    assert started["drivers"] == started["registered"] == ["burn"]
    about_exec = [line for line in started["lines"] if "exec" in line]
    assert len(about_exec) == 1, started["lines"]
    assert "exec driver not offered: this agent runs as root but cannot give each task a uid" in about_exec[0]
    assert about_exec[0].endswith("exec tasks never run as root")


def test_signalling_a_uid_reaches_only_that_uid() -> None:
    """The kill(-1) the agent sends as a run's uid: the processes of another task uid, and the agent, stay."""
    target, bystander = TASK_UIDS[-1], TASK_UIDS[-2]
    children = [as_uid(uid) for uid in (target, bystander)]
    try:
        isolation.signal_uid(target, signal.SIGTERM)
        _, status = os.waitpid(children[0], 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
        assert os.waitpid(children[1], os.WNOHANG) == (0, 0)  # the other uid's process still runs
    finally:
        os.kill(children[1], signal.SIGKILL)
        os.waitpid(children[1], 0)
    with pytest.raises(ValueError):
        isolation.signal_uid(0, signal.SIGTERM)


@pytest.mark.asyncio
async def test_a_look_at_a_uid_the_agent_signalled_meanwhile_is_not_shown_to_its_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the agent signals a run's uid, its child (a copy of the agent that became the uid, `signal_uid`) is a
    process of the uid that holds the agent's memory and descriptors, and a look of the memory watch meanwhile counts
    them as the run's: an exec task of 32 MB that had just exited was reported over its limit so ("its processes held
    51 MB", the agent's size) while the machine was loaded. Such a look is not shown to the run; the next one is.
    The look that overlaps the real `signal_uid` (fork, setresuid, kill(-1)) is made to see 64 MB."""
    uid = TASK_UIDS[-3]
    looks: list[int] = []

    def look(uids: set[int], sessions: set[int], *rest: Any) -> dict[tuple[str, int], enforcement.Usage]:
        assert uid in uids
        if not looks:
            isolation.signal_uid(uid, 0)  # signal 0: no process of the uid is touched, the child is as ever
        looks.append(1)
        return {("uid", uid): enforcement.Usage((64 if len(looks) == 1 else 1) * MIB, 3)}

    monkeypatch.setattr(enforcement, "memory_usage", look)
    watch = MemoryWatch(max_files=100)
    seen: list[enforcement.Usage] = []
    watch.add(("uid", uid), seen.append)
    try:
        await wait_for(lambda: seen, 10, lambda: looks)
    finally:
        watch.forget(("uid", uid))
    assert seen[0] == enforcement.Usage(MIB, 3), seen
    assert len(looks) >= 2
    assert not isolation.signalled_since(isolation.signalling_marks([uid]))  # no signalling left half done


def test_root_without_cap_sys_admin_runs_exec_tasks_as_their_own_uids_and_says_they_can_see_every_process(
    tmp_path: Path,
) -> None:
    """A container's root by default: the uids are still the runs' own, but no run can have a /proc of its own, so
    the agent says in one line at start-up that tasks can list every process and read their command lines."""
    settings = {"drivers": "burn,exec", "task_log_dir": str(tmp_path / "logs")}
    started = in_child(drop_sys_admin, lambda: start_agent(**settings))
    assert started["drivers"] == started["registered"] == ["burn", "exec"]
    assert int(started["task_uid"]) in TASK_UIDS
    warnings = [line for line in started["lines"] if line.startswith("WARNING")]
    assert len(warnings) == 1, started["lines"]
    assert "exec tasks can list every process of this host" in warnings[0] and "CAP_SYS_ADMIN" in warnings[0]
    assert "share /dev/shm, /tmp, /var/tmp" in warnings[0], warnings
    assert not any("seeing only its own processes" in line for line in started["lines"]), started["lines"]


def test_an_agent_running_tasks_as_its_own_user_holds_them_to_the_disk_limit(run_id: str) -> None:
    """As `nobody` with MEGHA_EXEC_AS_AGENT_USER: no uid of the run's own, but two files each under the limit and
    over it together end the run with the disk reason (the watch counts the agent's user's files in the scratch
    folder), well before its 10 s."""
    write = ("sh", "-c", 'for f in a b; do head -c 5000000 /dev/zero > "$TMPDIR/$f"; done; sleep 10')
    settings = {"drivers": "burn,exec", "exec_as_agent_user": True, "run_id": run_id, "task_max_disk_mb": 8}

    def start() -> dict[str, Any]:  # the run's error under a key of its own: in_child's "error" is a traceback
        found = start_agent(write, **settings)
        return {"drivers": found["drivers"], "run_error": found.get("error")}

    started = in_child(become_nobody, start)
    assert started["drivers"] == ["burn", "exec"]
    assert "exceeded its disk limit of 8 MB" in (started["run_error"] or ""), started
