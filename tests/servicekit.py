"""What the service tests share: the local RabbitMQ, and a marker that skips (with the reason) when it is down."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

AMQP = "amqp://guest:guest@127.0.0.1:5672/"


def rabbitmq_up() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError:
        return False
    return True


needs_rabbitmq = pytest.mark.skipif(
    not rabbitmq_up(),
    reason="needs RabbitMQ at 127.0.0.1:5672: none answers and rabbitmq-server is not installed (with it, the test "
    "run starts a node of its own; .ci/run installs it)",
)


class _Deadline:
    """Fails the test, saying what it saw, once `timeout` seconds have passed."""

    def __init__(self, timeout: float, saw: Callable[[], object]) -> None:
        self.timeout, self.saw, self.end = timeout, saw, time.monotonic() + timeout

    def check(self) -> None:
        if time.monotonic() > self.end:
            pytest.fail(f"not true after {self.timeout} s; saw {self.saw()!r}")


async def wait_for(
    condition: Callable[[], bool], timeout: float, saw: Callable[[], object] = lambda: None, every: float = 0.05
) -> None:
    """Wait until `condition()` holds; fail after `timeout` seconds with what `saw()` then returns."""
    deadline = _Deadline(timeout, saw)
    while not condition():
        deadline.check()
        await asyncio.sleep(every)


def wait_until(
    condition: Callable[[], bool], timeout: float, saw: Callable[[], object] = lambda: None, every: float = 0.05
) -> None:
    """`wait_for` for code outside an event loop."""
    deadline = _Deadline(timeout, saw)
    while not condition():
        deadline.check()
        time.sleep(every)


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
