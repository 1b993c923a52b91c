"""The container driver: a task's image run through the Docker engine (Docker SDK for Python), with CPU and memory
limits from its request.

A run is one container, ``megha-<worker>-<task>-<attempt>``, labelled with the task (``megha.task``,
``megha.attempt``, ``megha.worker``): ``nano_cpus`` from the CPU request, ``mem_limit`` (and as much with swap,
so none) from the memory request, ``pids_limit`` MEGHA_TASK_MAX_PROCESSES (a fork bomb stops there), the ``nofile``
ulimit MEGHA_TASK_MAX_FILES (soft and hard: the descriptors each of its processes may hold open). It runs with
every capability dropped and no new privileges (a set-user-ID program in the image gains nothing), its own IPC
namespace (a private /dev/shm, counted in its memory limit), on the network MEGHA_CONTAINER_NETWORK names (the
engine's default bridge unless told), and with the task's `env` only: nothing of the agent's environment. It runs
as its image's user. The agent attaches to its output before starting it, copies stdout and stderr into the run's
log, waits for it, and learns from the engine whether the kernel's OOM killer stopped it. A preemption or the
duration limit sends SIGTERM, then SIGKILL; the container is always removed. An image the engine does not have is
pulled, as ``docker run`` would.

The SDK's calls block: short ones run in asyncio's default threads; the long ones (following the output,
waiting for the exit) run in a thread of their own per run, on a client with no read timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import docker
from docker.errors import DockerException, ImageNotFound, NotFound
from requests.exceptions import RequestException

from megha.common.lifecycle import StartupError
from megha.services.worker.drivers import Driver, Exit, Limits, Run
from megha.services.worker.enforcement import MIB

if TYPE_CHECKING:
    from docker.models.containers import Container

    from megha.common.core.task import RunSpec
    from megha.services.worker.tasklogs import RunLog

log = logging.getLogger(__name__)

T = TypeVar("T")

SIGKILLED = 128 + 9
"""A container's exit code when its main process was killed with SIGKILL (by the kernel's OOM killer, or by the
agent stopping it)."""
OOM_FLAG_WAIT = 1.0
"""Seconds to ask Docker again whether a container that ended by a SIGKILL the agent did not send was OOM-killed."""

_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_.-]")


def container_name(worker_id: str, task_id: str, attempt: int) -> str:
    """A Docker container name unique to the run (a task id with other characters gets a hash of it)."""
    safe = _NAME_CHARS.sub("_", task_id)[:100]
    if safe != task_id:
        safe += "-" + hashlib.sha256(task_id.encode()).hexdigest()[:12]
    return f"megha-{worker_id}-{safe}-{attempt}"


class ContainerDriver(Driver):
    name = "container"

    def __init__(self, worker_id: str, max_processes: int, network: str = "bridge", max_files: int = 4096) -> None:
        """`max_processes`: the pids limit of each container (MEGHA_TASK_MAX_PROCESSES); `network`: the Docker
        network containers join (MEGHA_CONTAINER_NETWORK); `max_files`: the nofile ulimit of its processes
        (MEGHA_TASK_MAX_FILES)."""
        self._worker_id = worker_id
        self._max_processes = max_processes
        self._max_files = max_files
        self._network = network
        self._client: docker.DockerClient | None = None  # calls that return at once (60 s timeout)
        self._follow: docker.DockerClient | None = None  # following output and waiting: no read timeout

    async def prepare(self) -> str:
        where = os.environ.get("DOCKER_HOST") or "the default socket"
        try:
            if self._client is None:
                self._client = await asyncio.to_thread(docker.from_env)
                self._follow = await asyncio.to_thread(docker.from_env, timeout=None)
            version = await asyncio.to_thread(self._client.version)
        except (DockerException, RequestException) as exc:
            self._client = self._follow = None
            raise StartupError(
                f"MEGHA_DRIVERS lists container, but the Docker engine does not answer at {where}: {_one_line(exc)}"
            ) from None
        return (
            f"container driver: Docker engine {version.get('Version', '?')} at {where}; containers run with no "
            f"capabilities, no new privileges, at most {self._max_processes} processes and {self._max_files} open "
            f"files per process, on network {self._network}"
        )

    async def start(self, task_id: str, attempt: int, spec: RunSpec, limits: Limits, log: RunLog) -> Run:
        if not spec.image:
            raise ValueError("a container task needs an image")
        await self.prepare()
        assert self._client is not None and self._follow is not None
        client, follow = self._client, self._follow
        name = container_name(self._worker_id, task_id, attempt)
        options: dict[str, Any] = {
            "command": list(spec.command) or None,
            "environment": dict(spec.env),
            "working_dir": spec.workdir or None,
            "mem_limit": limits.memory_mb * MIB,
            "memswap_limit": limits.memory_mb * MIB,
            "nano_cpus": limits.cpu_millicores * 1_000_000,
            "pids_limit": self._max_processes,
            "ulimits": [docker.types.Ulimit(name="nofile", soft=self._max_files, hard=self._max_files)],
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges:true"],
            "ipc_mode": "private",
            "network_mode": self._network,
            "labels": {"megha.task": task_id, "megha.attempt": str(attempt), "megha.worker": self._worker_id},
            "name": name,
        }

        def create() -> Container:
            with contextlib.suppress(NotFound):  # one left by an earlier life of this agent
                client.containers.get(name).remove(force=True)
            try:
                return client.containers.create(spec.image, **options)
            except ImageNotFound:
                client.images.pull(spec.image)
                return client.containers.create(spec.image, **options)

        container = await asyncio.to_thread(create)
        try:
            output = await asyncio.to_thread(
                follow.api.attach, container.id, stdout=True, stderr=True, stream=True, logs=True, demux=True
            )
            await asyncio.to_thread(container.start)
        except BaseException:
            await asyncio.to_thread(_remove, container)
            raise
        return _ContainerRun(container, follow, output, log)


class _ContainerRun(Run):
    def __init__(self, container: Container, follow: docker.DockerClient, output: Any, log: RunLog) -> None:
        self._container = container
        self._follow = follow
        self._output = output
        self._log = log
        self._signalled = False  # the agent asked the container to stop (a SIGKILL then is not the kernel's)
        self._ended = _in_own_thread(self._follow_to_end, name=f"megha-{container.name}")

    def _follow_to_end(self) -> tuple[int, bool]:
        """Copy the output into the log until the container ends; its exit code and whether Docker flagged it
        OOM-killed. The engine may flag it a moment after it reports the exit (its OOM event and the exit come
        apart), so a SIGKILL the agent did not send is asked about again for up to `OOM_FLAG_WAIT` seconds."""
        for out, err in self._output:
            if out:
                self._log.write("stdout", out)
            if err:
                self._log.write("stderr", err)
        code = int(self._follow.api.wait(self._container.id)["StatusCode"])
        deadline = time.monotonic() + OOM_FLAG_WAIT
        while True:
            oom = bool(self._follow.api.inspect_container(self._container.id)["State"].get("OOMKilled"))
            if oom or code != SIGKILLED or self._signalled or time.monotonic() >= deadline:
                return code, oom
            time.sleep(0.1)

    async def wait(self) -> Exit:
        try:
            exit_code, oom_killed = await self._ended
        finally:
            await asyncio.to_thread(_remove, self._container)
        if oom_killed:
            return Exit(
                exit_code, memory_exceeded=True, memory_how="stopped by the kernel's OOM killer in its container"
            )
        if exit_code == SIGKILLED and not self._signalled:
            # The kernel can kill a process of a memory-limited container without Docker flagging it (a known
            # gap of the engine): a SIGKILL nobody here sent is most likely its memory limit, and is said so.
            how = "most likely: SIGKILL, which the agent did not send, and Docker flagged no OOM kill"
            return Exit(exit_code, memory_exceeded=True, memory_how=how)
        return Exit(exit_code)

    def terminate(self) -> None:
        self._signalled = True
        self._signal("SIGTERM")

    def kill(self) -> None:
        self._signalled = True
        self._signal("SIGKILL")

    def _signal(self, signum: str) -> None:
        def send() -> None:
            try:
                self._container.kill(signal=signum)
            except DockerException as exc:  # it has ended already
                log.debug("container %s: %s not sent: %s", self._container.name, signum, exc)

        asyncio.get_running_loop().run_in_executor(None, send)


def _remove(container: Container) -> None:
    try:
        container.remove(force=True)
    except NotFound:
        pass
    except DockerException as exc:
        log.warning("could not remove container %s: %s", container.name, _one_line(exc))


def _in_own_thread(call: Callable[[], T], name: str) -> asyncio.Future[T]:
    """`call()` in a thread of its own (not asyncio's few default ones, which a long call would hold)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = call()
        except BaseException as exc:
            outcome: tuple[T | None, BaseException | None] = (None, exc)
        else:
            outcome = (result, None)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
