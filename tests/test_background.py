"""Background loops (services/background.py): waiting for an event with a timeout never swallows the
cancellation that stops a loop at shutdown."""

from __future__ import annotations

import asyncio

import pytest

from megha.services.background import wait_event

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]


async def test_wait_event_says_whether_the_event_was_set_or_the_time_ran_out() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 5) is True


async def test_a_loop_cancelled_just_after_its_event_was_set_stops() -> None:
    # The GM's dependency watch and journal sender loop like this. With asyncio.wait_for (Python 3.11) the cancel
    # was swallowed because the event had been set, the loop went on, and the GM's shutdown waited for it forever.
    event = asyncio.Event()
    rounds = 0

    async def loop() -> None:
        nonlocal rounds
        while True:
            await wait_event(event, 5)
            event.clear()
            rounds += 1

    runner = asyncio.get_running_loop().create_task(loop())
    await asyncio.sleep(0.01)  # the loop waits
    event.set()
    runner.cancel()  # in the same step: the wait is done but has not resumed yet
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(runner), 2)
    assert runner.cancelled() and rounds == 0
