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


async def wait_for(
    condition: Callable[[], bool], timeout: float, saw: Callable[[], object] = lambda: None, every: float = 0.05
) -> None:
    """Wait until `condition()` holds; fail after `timeout` seconds with what `saw()` then returns."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not true after {timeout} s; saw {saw()!r}")
        await asyncio.sleep(every)


def wait_until(
    condition: Callable[[], bool], timeout: float, saw: Callable[[], object] = lambda: None, every: float = 0.05
) -> None:
    """`wait_for` for code outside an event loop."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not true after {timeout} s; saw {saw()!r}")
        time.sleep(every)
