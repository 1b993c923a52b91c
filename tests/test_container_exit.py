"""How the container driver reads a container's end (`_ContainerRun`), against a stand-in for the Docker engine's
API: Docker's OOM flag can come after the exit, or not at all (no engine needed)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from megha.services.worker import container_driver
from megha.services.worker.container_driver import SIGKILLED, _ContainerRun


class Engine:
    """The calls `_ContainerRun` makes: `wait` blocks until `exit` is set; the `OOMKilled` flag reads False
    `unflagged_reads` times, then `flag`."""

    def __init__(self, code: int, flag: bool, unflagged_reads: int = 0) -> None:
        self.code, self.flag, self.unflagged_reads = code, flag, unflagged_reads
        self.exit = threading.Event()
        self.reads = 0
        self.signals: list[str] = []
        self.api = SimpleNamespace(wait=self._wait, inspect_container=self._inspect)

    def _wait(self, container_id: str) -> dict[str, Any]:
        self.exit.wait(10)
        return {"StatusCode": self.code}

    def _inspect(self, container_id: str) -> dict[str, Any]:
        self.reads += 1
        return {"State": {"OOMKilled": self.flag and self.reads > self.unflagged_reads}}

    def container(self) -> SimpleNamespace:
        return SimpleNamespace(
            id="c1", name="megha-c1", remove=lambda force: None, kill=lambda signal: self.signals.append(signal)
        )


async def ended(engine: Engine, before_exit: Any = None) -> Any:
    run = _ContainerRun(engine.container(), engine, iter(()), SimpleNamespace(write=lambda *a: None))  # type: ignore[arg-type]
    if before_exit is not None:
        before_exit(run)
        await asyncio.sleep(0.05)
    engine.exit.set()
    return await run.wait()


@pytest.mark.asyncio
async def test_an_oom_flag_set_after_the_exit_is_still_read() -> None:
    end = await ended(Engine(SIGKILLED, flag=True, unflagged_reads=3))
    assert end.memory_exceeded and end.memory_how == "stopped by the kernel's OOM killer in its container", end


@pytest.mark.asyncio
async def test_a_sigkill_the_agent_did_not_send_is_the_memory_limit_most_likely(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(container_driver, "OOM_FLAG_WAIT", 0.3)
    engine = Engine(SIGKILLED, flag=False)
    end = await ended(engine)
    assert end.memory_exceeded and end.memory_how.startswith("most likely: SIGKILL"), end
    assert engine.reads > 1  # asked again before concluding


@pytest.mark.asyncio
async def test_a_sigkill_the_agent_sent_or_another_exit_code_is_not_the_memory_limit() -> None:
    engine = Engine(SIGKILLED, flag=False)
    end = await ended(engine, before_exit=lambda run: run.kill())
    assert engine.signals == ["SIGKILL"]
    assert not end.memory_exceeded and end.exit_code == SIGKILLED and engine.reads == 1, end
    engine = Engine(1, flag=False)
    end = await ended(engine)
    assert not end.memory_exceeded and end.exit_code == 1 and engine.reads == 1, end
