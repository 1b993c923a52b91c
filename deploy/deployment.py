"""What the deployments (`LocalDeployment`, `ContainerDeployment`) share: their shape (how many GMs, LMs, agents and
nodes, and the intervals the services are given) and their lifetime as a context manager: up and healthy on enter,
torn down on exit, after a failed start, and when the run is terminated (SIGTERM, as after Ctrl-C)."""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import Any, Self


def as_ctrl_c(signum: int, frame: FrameType | None) -> None:
    """A signal handled as SIGINT is, by the handler SIGINT has now. Inside `asyncio.run` that is the runner's: it
    cancels the main task, whose cancellation unwinds every `finally` and `async with`, then raises KeyboardInterrupt
    from `asyncio.run`. Raising KeyboardInterrupt here instead would raise it in whichever task happened to be
    running, which then ends with it and is reported as an unhandled error while the loop shuts down."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:  # SIGINT ignored or left to the system (a process started in the background): still stop
        raise KeyboardInterrupt


@dataclass
class Deployment(ABC):
    """A deployment's shape, and its `with` block. While the block runs, SIGTERM is handled as Ctrl-C is
    (`as_ctrl_c`), so a terminated run removes what it started too; the handler before is put back after."""

    gms: int = 2
    lms: int = 2
    workers_per_lm: int = 2
    nodes_per_worker: int = 1
    delta_interval: float = 1.0
    heartbeat_interval: float = 5.0  # worker agents -> LM
    worker_timeout: float = 30.0  # an LM takes a silent agent's nodes out of service after this long
    _previous_sigterm: Any = field(default=None, init=False, repr=False, compare=False)

    @abstractmethod
    def bring_up(self) -> None:
        """Start every service and wait until each is healthy."""

    @abstractmethod
    def tear_down(self) -> None:
        """Stop every service and remove what the deployment made."""

    def __enter__(self) -> Self:
        previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, as_ctrl_c)
        self._previous_sigterm = previous
        try:
            self.bring_up()
        except BaseException:
            self.tear_down()
            signal.signal(signal.SIGTERM, previous)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.tear_down()
        signal.signal(signal.SIGTERM, self._previous_sigterm)
