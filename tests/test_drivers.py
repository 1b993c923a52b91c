"""Task drivers on the agent: exec (real processes, each as a uid of its own when the tests run as root, else as the
tests' user by MEGHA_EXEC_AS_AGENT_USER; held by cgroups v2 or rlimits - on a cgroup v1 host the rlimits),
container (the real Docker engine, images built here, never pulled, no capabilities, a pids limit),
the kept output and its route, the refusal of a driver an agent does not offer, and an agent that cannot reach
the Docker engine it was told to use.

Bounds are generous and never tight on wall-clock time: the machine is shared."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_services_http import NOWHERE, RecordingBroker, assert_error, client, placement, register_worker

from megha.common.core.task import RunSpec
from megha.common.lifecycle import StartupError
from megha.common.settings import WorkerSettings
from megha.deploy.local import free_port
from megha.services.worker import enforcement
from megha.services.worker.agent import WorkerAgent
from megha.services.worker.app import create_app as create_worker
from megha.services.worker.drivers import Driver
from megha.services.worker.exec_driver import ExecDriver
from megha.services.worker.execution import ExecutionResult
from megha.services.worker.executor import TaskExecutor
from megha.services.worker.tasklogs import TaskLogs, folder_name

from servicekit import needs_rabbitmq, wait_for, wait_until

pytestmark = pytest.mark.timeout(120)

IMAGE = "megha-base:bookworm"  # built by deploy/images/build.sh; has python3
PYTHON = "python3"  # the host's, on the minimal PATH an exec task gets, and usable by any uid
ROOT = os.geteuid() == 0
TASK_UIDS = WorkerSettings().task_uid_range()
MAX_PROCESSES = 64
MAX_FILES = 256


def exec_driver(how: enforcement.Cgroups | enforcement.Rlimits | None = None) -> ExecDriver:
    """The exec driver as an agent makes it; as the tests' own user when they do not run as root."""
    return ExecDriver("test", TASK_UIDS, MAX_PROCESSES, as_agent_user=not ROOT, how=how)


def run_exec(*argv: str, env: dict[str, str] | None = None, workdir: str = "") -> RunSpec:
    return RunSpec("exec", argv, env=tuple((env or {}).items()), workdir=workdir)


def run_container(*argv: str, env: dict[str, str] | None = None, workdir: str = "") -> RunSpec:
    return RunSpec("container", argv, image=IMAGE, env=tuple((env or {}).items()), workdir=workdir)


@asynccontextmanager
async def executing(
    tmp_path: Path, *names: str, log_bytes: int = 1 << 20, on_finished: Any = None, network: str = "bridge"
) -> AsyncIterator[tuple[TaskExecutor, TaskLogs]]:
    """A real executor offering `names` (besides burn), each driver prepared as an agent's start-up does."""
    logs = TaskLogs(tmp_path / "task-logs", log_bytes, kept=100)
    drivers: dict[str, Driver] = {}
    if "exec" in names:
        drivers["exec"] = exec_driver()
    if "container" in names:
        from megha.services.worker.container_driver import ContainerDriver

        drivers["container"] = ContainerDriver(f"test{uuid.uuid4().hex[:6]}", MAX_PROCESSES, network, MAX_FILES)
    for driver in drivers.values():
        await driver.prepare()
    executor = TaskExecutor(on_finished, drivers=drivers, logs=logs, kill_grace=2.0)
    try:
        yield executor, logs
    finally:
        await executor.shutdown()


async def run_to_end(executor: TaskExecutor, task_id: str, spec: RunSpec, **limits: Any) -> ExecutionResult:
    request = {"cpu_millicores": 500, "memory_mb": 256, "duration": 0.0} | limits
    await executor.start(task_id, request["cpu_millicores"], request["memory_mb"], request["duration"], spec)
    return await executor.wait(task_id)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != b"Z"


# ------------------------------------------------------------------------------------------------------ exec


@pytest.mark.asyncio
async def test_a_shell_command_finishes_and_its_output_is_kept(tmp_path: Path) -> None:
    async with executing(tmp_path, "exec") as (executor, logs):
        result = await run_to_end(executor, "sh.0", run_exec("sh", "-c", "echo hi; echo oops >&2; id -u; pwd"))
        assert result.succeeded and result.exit_code == 0, result
        out = logs.read("sh.0", 1, "stdout").decode().splitlines()
        assert out[0] == "hi" and logs.read("sh.0", 1, "stderr") == b"oops\n"
        # As a uid of its own when the agent is root, else as the agent's user; in a scratch folder removed after.
        assert int(out[1]) in TASK_UIDS if ROOT else int(out[1]) == os.geteuid()
        assert Path(out[2]).name.startswith("megha-run-") and "sh.0" not in out[2] and not Path(out[2]).exists()


@pytest.mark.asyncio
async def test_a_python_script_gets_its_environment_and_working_directory_only(tmp_path: Path) -> None:
    """The working folder is outside the shared temporary folders: a run that has its own (an agent as root) sees
    its own tmpfs over /tmp, where the test's tmp_path is not (tests/test_task_isolation.py, workdir)."""
    workdir = Path(tempfile.mkdtemp(prefix="megha-workdir-", dir="/run" if os.geteuid() == 0 else None))
    workdir.chmod(0o777)
    script = "import os; print(os.getcwd()); print(sorted(os.environ)); print(os.environ['GREETING'])"
    script += "; print(os.environ['HOME'] == os.environ['TMPDIR'] != os.getcwd())"
    os.environ["MEGHA_DRIVER_TEST_SECRET"] = "agent-only"  # the agent's environment never reaches a task
    try:
        async with executing(tmp_path, "exec") as (executor, logs):
            spec = run_exec(PYTHON, "-c", script, env={"GREETING": "hello"}, workdir=str(workdir))
            result = await run_to_end(executor, "py.0", spec)
    finally:
        del os.environ["MEGHA_DRIVER_TEST_SECRET"]
        shutil.rmtree(workdir, ignore_errors=True)
    assert result.succeeded, result
    cwd, names, greeting, home_is_scratch = logs.read("py.0", 1, "stdout").decode().splitlines()
    assert cwd == str(workdir) and greeting == "hello"
    # HOME is the run's scratch folder, not the workdir other users' runs share (dotfiles planted there would run)
    assert home_is_scratch == "True"
    assert set(eval(names)) == {"PATH", "HOME", "LANG", "TMPDIR", "GREETING"}, names  # nothing of the agent's
    assert result.cpu_seconds > 0  # the interpreter's start-up, reaped by the agent with its rusage


@pytest.mark.asyncio
async def test_a_non_zero_exit_fails_with_the_code_and_the_end_of_stderr(tmp_path: Path) -> None:
    script = "for i in $(seq 1 30); do echo line$i >&2; done; exit 3"
    async with executing(tmp_path, "exec") as (executor, _):
        result = await run_to_end(executor, "bad.0", run_exec("sh", "-c", script))
    assert not result.succeeded and not result.preempted and result.exit_code == 3
    assert result.task_exit_code == 3  # what a job's retry rule matches
    assert result.error.startswith("exit code 3: "), result.error
    tail = result.error.removeprefix("exit code 3: ").splitlines()
    assert tail == [f"line{i}" for i in range(21, 31)]  # the last 10 lines


@pytest.mark.asyncio
async def test_a_memory_hog_fails_with_its_memory_limit(tmp_path: Path) -> None:
    """One process allocating past its limit: stopped by cgroups v2's memory.max or, with rlimits, its
    allocation fails at RLIMIT_DATA."""
    hog = "b = bytearray(200 * 2**20); print('allocated')"
    async with executing(tmp_path, "exec") as (executor, logs):
        result = await run_to_end(executor, "hog.0", run_exec(PYTHON, "-c", hog), memory_mb=64)
    assert result.error.startswith("exceeded its memory limit of 64 MB"), result.error
    assert result.task_exit_code == 137  # an OOM kill, as Kubernetes reports it
    assert b"allocated" not in logs.read("hog.0", 1, "stdout")


@pytest.mark.asyncio
async def test_processes_that_together_hold_more_than_the_limit_are_killed(tmp_path: Path) -> None:
    """Three processes of 40 MB each fit the 64 MB limit one by one, not together: with rlimits the agent's watch
    of the session's resident memory kills them (cgroups v2 count them together too)."""
    child = f"{PYTHON} -c 'import time; b = bytearray(40 * 2**20); time.sleep(60)'"
    tree = f"{child} & {child} & {child} & wait"
    async with executing(tmp_path, "exec") as (executor, _):
        result = await run_to_end(executor, "tree.0", run_exec("sh", "-c", tree), memory_mb=64)
    assert result.error.startswith("exceeded its memory limit of 64 MB"), result.error
    assert result.wall_seconds < 50  # killed, not timed out
    driver = exec_driver()
    await driver.prepare()
    if isinstance(driver.enforcement, enforcement.Rlimits):
        assert "its processes held" in result.error and result.peak_rss_mb > 64


@pytest.mark.asyncio
async def test_the_cgroup_v2_path_writes_the_limits_joins_the_cgroup_and_reads_the_kernel_s_counts(
    tmp_path: Path,
) -> None:
    """On a stand-in tree of plain files, since this host has no cgroup v2 controllers: what the agent writes
    (cpu.max, memory.max, no swap, the whole run OOM-killed together), that the task's process joins its cgroup
    before it runs the command, and how the kernel's counts (cpu.stat, memory.events, memory.peak) make the result.
    It shows nothing of the kernel's enforcement itself (docs/drivers.md: untested here)."""
    tasks = tmp_path / "cgroup" / "megha-test-tasks"
    run = tasks / "oom.0.1"
    run.mkdir(parents=True)
    counts = {"cgroup.procs": "", "cpu.stat": "usage_usec 1500000\nuser_usec 1000000\n"}
    counts |= {"memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n", "memory.peak": str(70 * 2**20)}
    for name, text in counts.items():
        (run / name).write_text(text)
    logs = TaskLogs(tmp_path / "task-logs", 1 << 20, kept=10)
    driver = exec_driver(how=enforcement.Cgroups(tasks))
    assert "cgroups v2 under" in await driver.prepare()
    executor = TaskExecutor(drivers={"exec": driver}, logs=logs)
    try:
        result = await run_to_end(executor, "oom.0", run_exec("sh", "-c", "echo ran"), memory_mb=64)
    finally:
        await executor.shutdown()
    assert (run / "cpu.max").read_text() == "50000 100000"
    assert (run / "memory.max").read_text() == str(64 * 2**20)
    assert (run / "memory.swap.max").read_text() == "0" and (run / "memory.oom.group").read_text() == "1"
    assert (run / "cgroup.procs").read_text() == "0"  # the process wrote itself in: 0 is "the writer"
    assert logs.read("oom.0", 1, "stdout") == b"ran\n"
    assert result.error == "exceeded its memory limit of 64 MB (stopped by the kernel's OOM killer in its cgroup)"
    assert result.cpu_seconds == pytest.approx(1.5) and result.peak_rss_mb == pytest.approx(70)


@pytest.mark.asyncio
async def test_a_duration_limit_kills_a_sleep(tmp_path: Path) -> None:
    async with executing(tmp_path, "exec") as (executor, _):
        result = await run_to_end(executor, "slow.0", run_exec("sleep", "60"), duration=0.5)
    assert not result.succeeded and not result.preempted
    assert result.error == "exceeded its duration limit of 0.5 s"
    assert result.task_exit_code is None  # no exit of its own: a retry rule never matches it
    assert 0.5 <= result.wall_seconds < 30


@pytest.mark.asyncio
async def test_a_preemption_kills_an_exec_task_and_every_process_of_it(tmp_path: Path) -> None:
    recorded: list[ExecutionResult] = []
    async with executing(tmp_path, "exec", on_finished=_record(recorded)) as (executor, logs):
        await executor.start("victim.0", 500, 64, 0.0, run_exec("sh", "-c", "echo $$; sleep 60 & sleep 61 & wait"))
        await wait_for(lambda: logs.read("victim.0", 1, "stdout") != b"", 20)
        leader = int(logs.read("victim.0", 1, "stdout"))

        def members() -> list[int]:
            return enforcement.session_members(leader)

        await wait_for(lambda: len(members()) == 3, 20, members)
        tree = members()
        assert await executor.kill("victim.0") is True
        assert executor.running() == []
    assert len(recorded) == 1 and recorded[0].preempted and not recorded[0].error, recorded
    assert not [pid for pid in tree if alive(pid)]


@pytest.mark.asyncio
async def test_a_command_that_does_not_exist_cannot_start_and_says_why(tmp_path: Path) -> None:
    async with executing(tmp_path, "exec") as (executor, logs):
        with pytest.raises(FileNotFoundError):
            await executor.start("nope.0", 500, 64, 0.0, run_exec("/no/such/program"))
        assert executor.running() == []
    assert b"could not start" in logs.read("nope.0", 1, "stderr")


@pytest.mark.asyncio
async def test_output_is_rotated_once_so_each_stream_keeps_at_most_twice_the_bound(tmp_path: Path) -> None:
    lines = "for i in $(seq 1 2000); do echo line-$i; done"
    async with executing(tmp_path, "exec", log_bytes=1000) as (executor, logs):
        result = await run_to_end(executor, "chatty.0", run_exec("sh", "-c", lines))
    assert result.succeeded, result
    folder = tmp_path / "task-logs" / "chatty.0" / "1"
    assert sorted(p.name for p in folder.iterdir()) == ["stderr", "stdout", "stdout.1"]
    assert (folder / "stdout").stat().st_size <= 1000 and (folder / "stdout.1").stat().st_size == 1000
    kept = logs.read("chatty.0", 1, "stdout")
    assert 1000 < len(kept) <= 2000 and kept.endswith(b"line-2000\n")  # the newest output is what is kept
    assert logs.read("chatty.0", 1, "stdout", tail=10) == b"line-2000\n"


def test_the_oldest_task_folders_go_beyond_the_number_kept_never_a_running_one(tmp_path: Path) -> None:
    logs = TaskLogs(tmp_path, limit=100, kept=2)
    running = logs.open("a", 1)
    for task_id in ("b", "c", "d"):
        logs.close(task_id, logs.open(task_id, 1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "d"]  # "a" still runs
    logs.close("a", running)
    logs.close("e", logs.open("e", 1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "e"]
    assert TaskLogs(tmp_path, limit=100, kept=2).attempts("e") == [1]  # a restarted agent finds them again


def test_a_shared_folder_named_for_the_kept_output_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp is
    (shared / "someone-else's").write_text("theirs")
    with pytest.raises(StartupError, match="holds files already and others may enter it"):
        TaskLogs(shared, limit=100, kept=1).prepare()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o755)
    TaskLogs(empty, limit=100, kept=1).prepare()
    assert stat.S_IMODE(empty.stat().st_mode) == 0o700  # nothing in it yet: the agent's own


def test_only_task_folders_are_pruned_never_other_folders_of_the_kept_output_folder(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    for name in ("Documents", ".ssh", "1"):
        (tmp_path / name).mkdir()
    (tmp_path / "Documents" / "letter").write_text("precious")
    logs = TaskLogs(tmp_path, limit=100, kept=1)
    for task_id in ("a", "b"):
        logs.close(task_id, logs.open(task_id, 1))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ssh", "1", "Documents", "b"]


@pytest.mark.parametrize("task_id", ["..", ".", "../../etc", "a/b", "x" * 256, "job.0"])
def test_no_task_id_reaches_outside_the_log_folder(task_id: str) -> None:
    name = folder_name(task_id)
    assert "/" not in name and name not in (".", "..") and 0 < len(name) <= 200
    assert (name == task_id) == (task_id == "job.0")


def _record(into: list[ExecutionResult]) -> Any:
    async def on_finished(result: ExecutionResult) -> None:
        into.append(result)

    return on_finished


# ------------------------------------------------------------------------------------------------- container


def containers_of(task_id: str) -> list[Any]:
    import docker

    return docker.from_env().containers.list(all=True, filters={"label": f"megha.task={task_id}"})


LIMITS = """
import pathlib, resource, sys
def first(*paths):
    for p in paths:
        try:
            return pathlib.Path(p).read_text().strip()
        except OSError:
            pass
print("memory", first("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"))
print("cpu", first("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
                   "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"))
print("pids", first("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"))
print("nofile", *resource.getrlimit(resource.RLIMIT_NOFILE))
status = dict(line.split(":", 1) for line in pathlib.Path("/proc/self/status").read_text().splitlines())
print("capabilities", status["CapEff"].strip(), status["CapBnd"].strip())
print("no-new-privileges", status["NoNewPrivs"].strip())
print("greeting", __import__("os").environ["GREETING"], pathlib.Path.cwd())
print("to stderr", file=sys.stderr)
"""


@pytest.mark.docker
@pytest.mark.asyncio
async def test_a_container_runs_python_with_its_limits_and_its_output_is_kept(tmp_path: Path) -> None:
    task_id = f"box-{uuid.uuid4().hex[:8]}.0"
    spec = run_container("python3", "-c", LIMITS, env={"GREETING": "hello"}, workdir="/tmp")
    async with executing(tmp_path, "container") as (executor, logs):
        result = await run_to_end(executor, task_id, spec, cpu_millicores=500, memory_mb=64)
    assert result.succeeded, result
    out = dict(line.split(" ", 1) for line in logs.read(task_id, 1, "stdout").decode().splitlines())
    assert out["memory"] == str(64 * 2**20)
    assert out["cpu"].split()[0] == "50000"  # 500 millicores: 50 ms of every 100 ms
    assert out["pids"] == str(MAX_PROCESSES)  # MEGHA_TASK_MAX_PROCESSES
    assert out["nofile"] == f"{MAX_FILES} {MAX_FILES}"  # MEGHA_TASK_MAX_FILES, soft and hard
    assert out["capabilities"] == "0000000000000000 0000000000000000"  # every capability dropped
    assert out["no-new-privileges"] == "1"
    assert out["greeting"] == "hello /tmp"
    assert logs.read(task_id, 1, "stderr") == b"to stderr\n"
    assert containers_of(task_id) == []  # always removed


@pytest.mark.docker
@pytest.mark.asyncio
async def test_a_failing_container_and_one_over_its_memory_limit_fail_with_their_reasons(tmp_path: Path) -> None:
    bad, hog = (f"{name}-{uuid.uuid4().hex[:8]}.0" for name in ("bad", "hog"))
    fail = "import sys; print('oops', file=sys.stderr); sys.exit(4)"
    async with executing(tmp_path, "container") as (executor, _):
        failed, over = await asyncio.gather(
            run_to_end(executor, bad, run_container("python3", "-c", fail)),
            run_to_end(executor, hog, run_container("python3", "-c", "b = bytearray(300 * 2**20)"), memory_mb=64),
        )
    assert failed.exit_code == 4 and failed.error == "exit code 4: oops", failed
    assert over.error.startswith("exceeded its memory limit of 64 MB"), over
    assert containers_of(bad) == containers_of(hog) == []


@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.parametrize(("network", "interfaces"), [("bridge", ["eth0", "lo"]), ("none", ["lo"])])
async def test_a_container_joins_the_network_the_agent_names(
    tmp_path: Path, network: str, interfaces: list[str]
) -> None:
    """MEGHA_CONTAINER_NETWORK: the engine's default bridge, or none (loopback only)."""
    task_id = f"net-{uuid.uuid4().hex[:8]}.0"
    async with executing(tmp_path, "container", network=network) as (executor, logs):
        result = await run_to_end(executor, task_id, run_container("ls", "/sys/class/net"))
    assert result.succeeded, result
    assert logs.read(task_id, 1, "stdout").decode().split() == interfaces


@pytest.mark.docker
@pytest.mark.asyncio
async def test_a_preemption_and_a_duration_limit_stop_a_container(tmp_path: Path) -> None:
    victim, slow = (f"{name}-{uuid.uuid4().hex[:8]}.0" for name in ("victim", "slow"))
    async with executing(tmp_path, "container") as (executor, _):
        await executor.start(victim, 500, 64, 0.0, run_container("sleep", "60"))
        await wait_for(lambda: any(c.status == "running" for c in containers_of(victim)), 60, lambda: victim)
        timed = asyncio.ensure_future(run_to_end(executor, slow, run_container("sleep", "60"), duration=0.5))
        assert await executor.kill(victim) is True
        preempted = await executor.wait(victim)
        timed_out = await timed
    assert preempted.preempted and not preempted.error, preempted
    assert timed_out.error == "exceeded its duration limit of 0.5 s" and not timed_out.preempted
    assert timed_out.wall_seconds < 50
    assert containers_of(victim) == containers_of(slow) == []


# ----------------------------------------------------------------------------------- the agent: launch, route

FIRST = 4


@asynccontextmanager
async def agent_app(
    tmp_path: Path, drivers: str = "burn,exec", execution: str = "real"
) -> AsyncIterator[tuple[WorkerAgent, httpx.AsyncClient]]:
    """An agent registered by hand as LM 1's node FIRST, publishing to a RecordingBroker (in-process HTTP)."""
    settings = WorkerSettings(
        execution=execution, worker_id="w0", lm_url=NOWHERE, drivers=drivers, task_log_dir=str(tmp_path / "logs")
    )
    app = create_worker(settings, use_broker=False)
    app.state.agent.broker = RecordingBroker()
    register_worker(app, lm=1, first_node=FIRST, nodes=1)
    try:
        async with client(app) as c:
            yield app.state.agent, c
    finally:
        await app.state.agent.close()


def task(task_id: str, run: dict[str, Any] | None = None, **override: Any) -> dict[str, Any]:
    return placement(node=FIRST, lm=1, task_id=task_id, request=[500, 256], run=run, **override)


def reports(agent: WorkerAgent) -> dict[str, dict[str, Any]]:
    """The finished-task reports the agent published, by task id."""
    return {
        r["task_id"]: r
        for _, _, body in agent.broker.published  # type: ignore[union-attr]
        if "worker_report" in body
        for r in body["worker_report"]["finished"]
    }


@pytest.mark.parametrize(
    ("drivers", "execution", "run"),
    [
        ("burn", "real", {"driver": "exec", "command": ["true"]}),
        ("burn,exec", "real", {"driver": "container", "image": IMAGE}),
        ("burn,exec,container", "simulated", {"driver": "exec", "command": ["true"]}),
    ],
    ids=["exec-not-listed", "container-not-listed", "simulated-offers-only-burn"],
)
@pytest.mark.asyncio
async def test_a_driver_the_agent_does_not_offer_is_422_naming_the_field(
    tmp_path: Path, drivers: str, execution: str, run: dict[str, Any]
) -> None:
    async with agent_app(tmp_path, drivers, execution) as (agent, c):
        body = {"lm": 1, "launches": [task("ok.0"), task("no.0", run)]}
        r = await c.post("/v1/tasks", json=body)
        err = assert_error(r, 422, "launches.1.task.run.driver")
        assert f"the {run['driver']} driver" in err.error and "does not offer" in err.error
        assert agent.executor.running() == []  # nothing of the launch started
        offered = ["burn"] if execution == "simulated" else drivers.split(",")
        assert list(agent.drivers) == offered and agent.registration().count(b'"drivers"') == 1
        assert f'"drivers":{json.dumps(offered, separators=(",", ":"))}'.encode() in agent.registration()


@pytest.mark.asyncio
async def test_an_exec_task_launched_on_the_agent_is_reported_and_its_output_served(tmp_path: Path) -> None:
    echo = {"driver": "exec", "command": ["sh", "-c", "echo hi; echo oops >&2"]}
    fail = {"driver": "exec", "command": ["sh", "-c", "echo broken >&2; exit 7"]}
    async with agent_app(tmp_path) as (agent, c):
        launch = {"lm": 1, "launches": [task("e.0", echo), task("e.1", fail), task("b.0", duration=0.1)]}
        r = await c.post("/v1/tasks", json=launch)
        assert r.status_code == 202, r.text
        await wait_for(lambda: len(reports(agent)) == 3, 60, lambda: reports(agent))
        done = reports(agent)
        assert done["e.0"]["error"] == "" and done["b.0"]["error"] == ""
        assert done["e.1"]["error"] == "exit code 7: broken"

        r = await c.get("/v1/tasks/e.0/logs")
        assert r.status_code == 200 and r.text == "hi\n" and r.headers["x-megha-attempt"] == "1"
        assert r.headers["content-type"].startswith("text/plain")
        assert (await c.get("/v1/tasks/e.0/logs", params={"stream": "stderr", "attempt": 1})).text == "oops\n"
        assert (await c.get("/v1/tasks/e.0/logs", params={"stream": "stderr", "tail": 2})).text == "s\n"
        assert (await c.get("/v1/tasks/e.1/logs", params={"stream": "stderr"})).text == "broken\n"
        burn = await c.get("/v1/tasks/b.0/logs")  # a burn task keeps no output
        assert burn.status_code == 200 and burn.text == ""

        assert_error(await c.get("/v1/tasks/never.0/logs"), 404, "task_id")
        assert_error(await c.get("/v1/tasks/e.0/logs", params={"attempt": 2}), 404, "attempt")
        assert_error(await c.get("/v1/tasks/e.0/logs", params={"stream": "stdin"}), 422, "stream")
        assert_error(await c.get("/v1/tasks/e.0/logs", params={"tail": -1}), 422, "tail")
        assert_error(await c.get("/v1/tasks/e.0/logs", params={"attempt": "x"}), 422, "attempt")
        assert_error(await c.get("/v1/tasks/%2E%2E/logs"), 404, "task_id")


@pytest.mark.asyncio
async def test_an_exec_task_that_cannot_start_is_reported_failed_with_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The task's own failure (no such program): a WARNING line in the agent's log, not an ERROR with a traceback."""
    async with agent_app(tmp_path) as (agent, c):
        missing = {"driver": "exec", "command": ["/no/such/program"]}
        r = await c.post("/v1/tasks", json={"lm": 1, "launches": [task("m.0", missing)]})
        assert r.status_code == 202, r.text
        await wait_for(lambda: "m.0" in reports(agent), 30, lambda: agent.broker.published)  # type: ignore[union-attr]
        assert reports(agent)["m.0"]["error"].startswith("could not start: ")
        assert "/no/such/program" in (await c.get("/v1/tasks/m.0/logs", params={"stream": "stderr"})).text
    (line,) = [r for r in caplog.records if r.getMessage().startswith("could not start m.0")]
    assert line.levelname == "WARNING" and line.exc_info is None and "/no/such/program" in line.getMessage()


# ------------------------------------------------------------------------------------ real agent processes


def test_an_agent_told_to_offer_containers_without_a_docker_engine_exits_with_one_line() -> None:
    env = dict(os.environ) | {
        "MEGHA_PORT": str(free_port()),
        "MEGHA_DRIVERS": "burn,exec,container",
        "DOCKER_HOST": "unix:///nonexistent/docker.sock",
        "MEGHA_LM_URL": NOWHERE,
    }
    done = subprocess.run(
        [sys.executable, "-m", "megha.services.worker"], env=env, capture_output=True, text=True, timeout=60
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if "ERROR" in line]
    assert len(errors) == 1, output
    assert "cannot start: MEGHA_DRIVERS lists container, but the Docker engine does not answer at " in errors[0]
    assert "unix:///nonexistent/docker.sock" in errors[0]


@needs_rabbitmq
@pytest.mark.docker
def test_a_real_agent_registers_its_drivers_runs_exec_and_container_tasks_and_serves_their_output(
    tmp_path: Path,
) -> None:
    """A real LM and a real agent process (MEGHA_DRIVERS=burn,exec,container), over real HTTP; tasks launched on
    the agent directly, as the LM does."""
    run_id = f"drivers-{uuid.uuid4().hex[:8]}"
    lm_port, agent_port = free_port(), free_port()
    base = dict(os.environ) | {"MEGHA_RUN_ID": run_id, "MEGHA_LOG_LEVEL": "info"}
    lm_env = base | {"MEGHA_PORT": str(lm_port), "MEGHA_EXPECTED_NODES": "1", "MEGHA_NUM_GMS": "1"}
    worker_id = f"w{uuid.uuid4().hex[:6]}"
    agent_env = base | {
        "MEGHA_PORT": str(agent_port),
        "MEGHA_LM_URL": f"http://127.0.0.1:{lm_port}",
        "MEGHA_WORKER_ID": worker_id,
        "MEGHA_DRIVERS": "burn,exec,container",
        "MEGHA_TASK_LOG_DIR": str(tmp_path / "task-logs"),
        "MEGHA_HEARTBEAT_INTERVAL": "0.5",
    }
    agent_log = tmp_path / "agent.log"
    with (tmp_path / "lm.log").open("wb") as lm_out, agent_log.open("wb") as agent_out:
        lm = subprocess.Popen([sys.executable, "-m", "megha.services.lm"], env=lm_env, stdout=lm_out, stderr=lm_out)
        agent = subprocess.Popen(
            [sys.executable, "-m", "megha.services.worker"], env=agent_env, stdout=agent_out, stderr=agent_out
        )
        url = f"http://127.0.0.1:{agent_port}"
        try:

            def registered() -> bool:
                try:
                    return bool(httpx.get(f"{url}/healthz", timeout=2).json()["registered"])
                except httpx.HTTPError:
                    return False

            wait_until(registered, 60, agent_log.read_text)
            cluster = httpx.get(f"http://127.0.0.1:{lm_port}/v1/cluster", timeout=5).json()
            assert cluster["partitions"][0]["drivers"] == [["burn", "exec", "container"]], cluster  # registered
            log_text = agent_log.read_text()
            assert "exec driver: each task runs as a uid of its own" in log_text, log_text
            assert "container driver: Docker engine" in log_text

            script = "import sys; print('from python'); print(sum(range(10)), file=sys.stderr)"
            box = f"c-{worker_id}.0"
            launches = [
                placement(node=0, lm=0, task_id="x.0", request=[500, 128], duration=0.5),
                placement(
                    node=0,
                    lm=0,
                    task_id="x.1",
                    request=[500, 128],
                    duration=0.0,
                    run={"driver": "exec", "command": [PYTHON, "-c", script]},
                ),
                placement(
                    node=0,
                    lm=0,
                    task_id=box,
                    request=[500, 128],
                    duration=0.0,
                    run={"driver": "container", "image": IMAGE, "command": ["sh", "-c", "echo in a box"]},
                ),
            ]
            r = httpx.post(f"{url}/v1/tasks", json={"lm": 0, "launches": launches}, timeout=10)
            assert r.status_code == 202, r.text

            def output(task_id: str, stream: str = "stdout") -> str:
                return httpx.get(f"{url}/v1/tasks/{task_id}/logs", params={"stream": stream}, timeout=5).text

            wait_until(lambda: httpx.get(f"{url}/v1/state", timeout=5).json()["running"] == [], 90, agent_log.read_text)
            assert output("x.1") == "from python\n" and output("x.1", "stderr") == "45\n"
            assert output(box) == "in a box\n"
            assert containers_of(box) == []
        finally:
            for process in (agent, lm):
                process.send_signal(signal.SIGTERM)
            for process in (agent, lm):
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def test_an_agent_given_the_old_task_user_setting_says_it_is_no_longer_read(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from megha.common.settings import WorkerSettings
    from megha.services.worker.app import create_app

    monkeypatch.setenv("MEGHA_TASK_USER", "nobody")
    with caplog.at_level(logging.WARNING):
        create_app(WorkerSettings(auth="off"), use_broker=False)
    assert any("MEGHA_TASK_USER is no longer read" in r.getMessage() for r in caplog.records), caplog.text
