"""What runs beside a service's requests: background steps (logged when they fail), and the garbage collector's
settings while it serves."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

from megha.common.transport.inmemory import fewer_gc_pauses


def spawn(tasks: set[asyncio.Task[Any]], coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Run `coro` in the background, held in `tasks` until it ends; an exception it raises is logged (a
    background step never fails silently)."""
    task = asyncio.get_running_loop().create_task(coro)
    tasks.add(task)
    task.add_done_callback(_forget_and_log(tasks))
    return task


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait until `event` is set (True) or `timeout` seconds pass (False).

    Not `asyncio.wait_for(event.wait(), timeout)`: on Python 3.11 that swallows a cancellation that arrives just
    after the event was set, so a background loop cancelled at shutdown went on forever and the service's
    shutdown waited for it (a GM's lifespan hung in CI). `asyncio.timeout` always delivers the cancellation."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


def _forget_and_log(tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logging.getLogger("megha").error("background step failed", exc_info=task.exception())

    return done


@contextmanager
def serving_gc() -> Iterator[None]:
    """The cyclic garbage collector's settings while a service serves (enter it once start-up is done).

    With the defaults, each service process spent about 5% of a run in collections, and a full collection
    stopped it for 60-80 ms in the middle of a 10-s benchmark run (measured with gc.callbacks). What start-up
    built (the app, the cluster, registrations) is frozen out of every later collection, and young objects are
    collected far less often: almost all of a request's objects are freed by reference counting."""
    gc.collect()
    gc.freeze()
    try:
        with fewer_gc_pauses():
            yield
    finally:
        gc.unfreeze()
