"""What the service tests share: the local RabbitMQ, and a marker that skips (with the reason) when it is down."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import pytest

AMQP = "amqp://guest:guest@127.0.0.1:5672/"


def rabbitmq_up() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError:
        return False
    return True


needs_rabbitmq = pytest.mark.skipif(not rabbitmq_up(), reason="needs RabbitMQ at 127.0.0.1:5672 (.ci/run starts it)")


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
