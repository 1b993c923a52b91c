"""Worker task execution: real burn processes consume CPU time and touched memory, die on kill, report once.

Bounds are on CPU time (what the burn process guarantees), never tight wall-clock upper bounds: these tests may
share a 2-core machine with other load.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from megha.services.worker.execution import ExecutionResult
from megha.services.worker.executor import TaskExecutor
from megha.services.worker.simulated import SimulatedExecutor

from servicekit import wait_for

pytestmark = pytest.mark.asyncio

LONG = 60.0  # duration of tasks that are meant to be killed long before they end


def group_members(pgid: int) -> set[int]:
    """Pids of live (non-zombie) processes in process group `pgid`, read from /proc."""
    members = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # the process ended while we looked
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state != "Z":
            members.add(int(stat.parent.name))
    return members


def alive(pid: int) -> bool:
    """True while `pid` runs. A zombie does not: it holds no CPU or memory, and on a busy host the process that
    inherits it (PID 1) may take a moment to reap it."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"


async def wait_for_members(pgid: int, count: int, timeout: float = 10.0) -> set[int]:
    return await wait_for(  # type: ignore[no-any-return]
        lambda: len(members := group_members(pgid)) >= count and members, timeout, lambda: group_members(pgid), 0.02
    )


class Recorder:
    def __init__(self) -> None:
        self.results: list[ExecutionResult] = []

    async def __call__(self, result: ExecutionResult) -> None:
        self.results.append(result)


@asynccontextmanager
async def executing(executor_type: type[TaskExecutor] | type[SimulatedExecutor], **kwargs) -> AsyncIterator:
    executor = executor_type(**kwargs)
    try:
        yield executor
    finally:
        await executor.shutdown()


async def test_task_burns_its_cpu_seconds_over_its_duration() -> None:
    async with executing(TaskExecutor) as executor:
        before = time.time()
        await executor.start("t1", cpu_millicores=300, memory_mb=0, duration=1.0)
        assert executor.running() == ["t1"]
        result = await executor.wait("t1")
    assert result.succeeded, result
    assert result.exit_code == 0
    assert result.cpu_seconds >= 0.3 * 0.9
    assert result.wall_seconds >= 0.95
    assert result.execution_delay == pytest.approx(result.wall_seconds - 1.0)
    # The interpreter's start alone takes tens of milliseconds, outside the process's own clock; the rest of the
    # delay is the process running past its duration (its own wall time is at least the duration).
    assert 0.005 < result.process_overhead <= result.execution_delay + 1e-3
    assert before <= result.started_at <= result.finished_at <= time.time()
    assert executor.running() == []


async def test_more_than_one_core_burns_in_several_processes() -> None:
    async with executing(TaskExecutor) as executor:
        await executor.start("wide", cpu_millicores=1500, memory_mb=0, duration=0.5)
        pid = executor.pid("wide")
        assert pid is not None
        burning = asyncio.create_task(wait_for_members(pid, 2))
        result = await executor.wait("wide")
        await burning  # two processes were seen burning at once
    assert result.succeeded, result
    assert result.cpu_seconds >= 1.5 * 0.5 * 0.9


async def test_memory_is_allocated_and_touched() -> None:
    async with executing(TaskExecutor) as executor:
        await executor.start("mem", cpu_millicores=100, memory_mb=64, duration=0.2)
        result = await executor.wait("mem")
    assert result.succeeded, result
    assert result.memory_mb_touched == 64
    assert result.peak_rss_mb >= 64


async def test_kill_preempts_the_task_and_leaves_no_process() -> None:
    recorder = Recorder()
    async with executing(TaskExecutor, on_finished=recorder) as executor:
        await executor.start("victim", cpu_millicores=2000, memory_mb=8, duration=LONG)
        pid = executor.pid("victim")
        assert pid is not None
        members = await wait_for_members(pid, 2)
        assert await executor.kill("victim") is True
        assert executor.running() == []
        assert not group_members(pid)
        assert not any(alive(member) for member in members)
        result = await executor.wait("victim")
        assert await executor.kill("victim") is False
    assert result.preempted and not result.succeeded
    assert result.error == ""
    assert result.exit_code == 143  # the burn process reported what it had consumed, then exited
    assert result.cpu_seconds > 0
    assert recorder.results == [result]


async def test_on_finished_is_called_once_per_task_however_it_ends() -> None:
    recorder = Recorder()
    async with executing(TaskExecutor, on_finished=recorder) as executor:
        await executor.start("done", cpu_millicores=100, memory_mb=0, duration=0.2)
        await executor.start("killed", cpu_millicores=100, memory_mb=0, duration=LONG)
        await executor.start("crashed", cpu_millicores=100, memory_mb=0, duration=LONG)
        crashed_pid = executor.pid("crashed")
        assert crashed_pid is not None
        os.killpg(crashed_pid, signal.SIGKILL)  # dies under the executor, as under the OOM killer
        await executor.kill("killed")
        results = {task_id: await executor.wait(task_id) for task_id in ("done", "killed", "crashed")}
        await asyncio.sleep(0.1)  # an absence: no second call for any task meanwhile
    assert Counter(r.task_id for r in recorder.results) == {"done": 1, "killed": 1, "crashed": 1}
    assert results["done"].succeeded
    assert results["killed"].preempted
    crashed = results["crashed"]
    assert not crashed.preempted and crashed.exit_code == -signal.SIGKILL
    assert "signal 9" in crashed.error
    assert not group_members(crashed_pid)


async def test_duplicate_start_of_a_running_task_is_rejected() -> None:
    async with executing(TaskExecutor) as executor:
        await executor.start("dup", cpu_millicores=100, memory_mb=0, duration=LONG)
        with pytest.raises(ValueError, match="dup"):
            await executor.start("dup", cpu_millicores=100, memory_mb=0, duration=1.0)
        assert executor.running() == ["dup"]


async def test_bad_requests_are_rejected_naming_the_field() -> None:
    async with executing(TaskExecutor) as executor:
        with pytest.raises(ValueError, match="memory_mb"):
            await executor.start("bad", cpu_millicores=100, memory_mb=-1, duration=1.0)
        with pytest.raises(ValueError, match="duration"):
            await executor.start("bad", cpu_millicores=100, memory_mb=0, duration=float("inf"))
        assert executor.running() == []
        with pytest.raises(KeyError):
            await executor.wait("bad")


async def test_shutdown_kills_everything_and_refuses_new_tasks() -> None:
    recorder = Recorder()
    executor = TaskExecutor(on_finished=recorder)
    await executor.start("a", cpu_millicores=1200, memory_mb=0, duration=LONG)
    await executor.start("b", cpu_millicores=100, memory_mb=0, duration=LONG)
    pids = [executor.pid("a"), executor.pid("b")]
    await wait_for_members(pids[0], 2)
    await executor.shutdown()
    assert executor.running() == []
    assert all(not group_members(pid) for pid in pids)
    assert sorted(r.task_id for r in recorder.results) == ["a", "b"]
    assert all(r.preempted for r in recorder.results)
    with pytest.raises(RuntimeError):
        await executor.start("c", cpu_millicores=100, memory_mb=0, duration=0.1)


async def test_simulated_executor_sleeps_and_burns_nothing() -> None:
    recorder = Recorder()
    async with executing(SimulatedExecutor, on_finished=recorder) as executor:
        await executor.start("sim", cpu_millicores=4000, memory_mb=1024, duration=0.2)
        await executor.start("sim-killed", cpu_millicores=1000, memory_mb=0, duration=LONG)
        with pytest.raises(ValueError, match="sim"):
            await executor.start("sim", cpu_millicores=1, memory_mb=0, duration=0.1)
        result = await executor.wait("sim")
        assert await executor.kill("sim-killed") is True
        killed = await executor.wait("sim-killed")
    assert result.succeeded and result.cpu_seconds == 0.0 and result.memory_mb_touched == 0
    assert result.wall_seconds >= 0.19
    assert killed.preempted and killed.cpu_seconds == 0.0
    assert Counter(r.task_id for r in recorder.results) == {"sim": 1, "sim-killed": 1}


@pytest.mark.parametrize("executor_type", [TaskExecutor, SimulatedExecutor])
async def test_a_task_of_zero_seconds_finishes(executor_type: type[TaskExecutor] | type[SimulatedExecutor]) -> None:
    """Traces hold tasks that last 0 s: they run (a burn process that burns nothing) and finish normally."""
    recorder = Recorder()
    async with executing(executor_type, on_finished=recorder) as executor:
        await executor.start("zero", cpu_millicores=1000, memory_mb=1, duration=0.0)
        result = await executor.wait("zero")
    assert result.succeeded and result.exit_code == 0 and result.error == "", result
    assert result.wall_seconds >= 0.0 and result.execution_delay == result.wall_seconds
    assert [r.task_id for r in recorder.results] == ["zero"]


async def test_simulated_executor_shutdown_reports_every_running_task_preempted() -> None:
    recorder = Recorder()
    async with executing(SimulatedExecutor, on_finished=recorder) as executor:
        for k in range(3):
            await executor.start(f"sim-{k}", cpu_millicores=1000, memory_mb=0, duration=LONG)
        assert executor.running() == ["sim-0", "sim-1", "sim-2"]
    assert sorted((r.task_id, r.preempted, r.exit_code) for r in recorder.results) == [
        (f"sim-{k}", True, -signal.SIGTERM) for k in range(3)
    ]
    assert executor.running() == []
