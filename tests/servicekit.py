"""What the service tests share: the local RabbitMQ, a marker that skips (with the reason) when it is down, the
waits on a condition with a deadline that every test uses instead of a fixed sleep, and small local deployments."""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from megha.deploy.local import LocalDeployment

AMQP = "amqp://guest:guest@127.0.0.1:5672/"


def rabbitmq_up() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError:
        return False
    return True


needs_rabbitmq = pytest.mark.skipif(
    not rabbitmq_up(),
    reason="needs RabbitMQ at 127.0.0.1:5672: none answers, and the test run could start none (it starts one from "
    "rabbitmq-server, else from the megha-rabbitmq image on a Docker engine; .ci/run installs rabbitmq-server)",
)


class _Deadline:
    """Fails the test, saying what it saw, once `timeout` seconds have passed."""

    def __init__(self, timeout: float, saw: Callable[[], object]) -> None:
        self.timeout, self.saw, self.end = timeout, saw, time.monotonic() + timeout

    def check(self) -> None:
        if time.monotonic() > self.end:
            seen = self.saw()
            pytest.fail(f"not true after {self.timeout} s; saw {seen!r}")

    async def check_async(self) -> None:
        if time.monotonic() > self.end:
            seen = self.saw()
            if inspect.isawaitable(seen):
                seen = await seen
            pytest.fail(f"not true after {self.timeout} s; saw {seen!r}")


async def wait_for(
    condition: Callable[[], Any], timeout: float, saw: Callable[[], object] = lambda: None, every: float = 0.05
) -> Any:
    """Wait until `condition()` (a value, or a coroutine's) is true, and return it; fail after `timeout` seconds
    with what `saw()` (a value, or a coroutine's) then returns. The one way tests wait for what runs elsewhere."""
    deadline = _Deadline(timeout, saw)
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        await deadline.check_async()
        await asyncio.sleep(every)


def wait_until(
    condition: Callable[[], Any], timeout: float, saw: Callable[[], object] = lambda: None, every: float = 0.05
) -> Any:
    """`wait_for` for code outside an event loop."""
    deadline = _Deadline(timeout, saw)
    while not (value := condition()):
        deadline.check()
        time.sleep(every)
    return value


def small_deployment(log_dir: Path, **fields: Any) -> LocalDeployment:
    """A deployment on this host, its logs in `log_dir`: one GM, one LM and one agent of one node that simulates its
    tasks, unless `fields` (LocalDeployment's) say otherwise."""
    smallest = {"gms": 1, "lms": 1, "workers_per_lm": 1, "nodes_per_worker": 1, "execution": "simulated"}
    return LocalDeployment(log_dir=log_dir, **(smallest | fields))


class Operator:
    """httpx's get, post and delete with the operator's credential of the deployment last given to `use` (each
    deployment makes its own secrets: tests/test_auth.py checks what happens without them)."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}

    def use(self, deployment: object) -> None:
        self.headers = dict(deployment.headers)  # type: ignore[attr-defined]

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(url, headers=self.headers, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return httpx.post(url, headers=self.headers, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> httpx.Response:
        return httpx.delete(url, headers=self.headers, **kwargs)


api = Operator()
"""The operator of the deployment a test runs: `api.use(deployment)` once it is up, then `api.get(url)` ..."""


def task_visible_folder(prefix: str, mode: int = 0o755) -> Path:
    """A new folder (of `mode`) that exec tasks of a local deployment can reach: not under /tmp, /var/tmp, /dev/shm
    or /run/lock, which a root agent (CAP_SYS_ADMIN) covers with a tmpfs of each run's own (docs/drivers.md,
    "temporary folders"). Under /run when this user may write there (root); else in the system's temporary folder,
    which an agent that is not root shares with its tasks."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/run" if os.access("/run", os.W_OK) else None))
    folder.chmod(mode)
    return folder
