"""A service process's start-up: why it cannot start, one clear line instead of a traceback, and SIGTERM or
Ctrl-C honoured while it still waits for a dependency (the broker, its LMs, its LM)."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

stop_requested = threading.Event()
"""Set by the server's signal handler (SIGTERM, SIGINT): start-up waits give up at once."""


class StartupError(RuntimeError):
    """A service cannot start (a dependency stayed unreachable, a peer refused it); the message says why."""


class Stopped(StartupError):
    """A signal asked the service to stop while it was still starting."""


def check_stop(waiting_for: str) -> None:
    """Raise Stopped if a signal asked to stop while waiting for `waiting_for`."""
    if stop_requested.is_set():
        raise Stopped(f"stopped by a signal while waiting for {waiting_for}")


def exit_on_startup_error(exc: Exception) -> NoReturn:
    """End a service that cannot start with one clear line (status 2; 0 when a signal stopped it), not a
    traceback: the ASGI server would print the lifespan's traceback for any exception, SystemExit included."""
    stopped = isinstance(exc, Stopped)
    logging.getLogger("megha").log(logging.INFO if stopped else logging.ERROR, "cannot start: %s", exc)
    sys.stderr.flush()
    os._exit(0 if stopped else 2)


def exit_quietly_if_stdout_closed(run: Callable[[], int | None]) -> NoReturn:
    """Exit with `run()`'s status; when whoever reads standard output stops reading (`megha ... | head`), exit
    with status 1 and no traceback, as a Unix tool does on a closed pipe. Standard output is then pointed at
    /dev/null so that flushing it at exit cannot fail again."""
    try:
        status = run()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    sys.exit(status)
