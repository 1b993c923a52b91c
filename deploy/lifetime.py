"""A deployment's lifetime as a context manager (`Deployment`): up and healthy on enter, torn down on exit, after a
failed start, and when the run is terminated (SIGTERM, as after Ctrl-C)."""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from types import FrameType, TracebackType
from typing import Any, Self


class Deployment(ABC):
    """The `with` block of a deployment (`LocalDeployment`, `ContainerDeployment`). While it runs, SIGTERM raises
    KeyboardInterrupt, so a terminated run removes what it started too; the handler before is put back after."""

    _previous_sigterm: Any = None

    @abstractmethod
    def bring_up(self) -> None:
        """Start every service and wait until each is healthy."""

    @abstractmethod
    def tear_down(self) -> None:
        """Stop every service and remove what the deployment made."""

    def __enter__(self) -> Self:
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum: int, frame: FrameType | None) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, on_term)
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
