"""Reading a run's output pipes into its log (`OutputPump`), with the event loop's add_reader rather than its pipe
transports.

Each descriptor is closed once, by its file object. uvloop's pipe transport, the agent's loop under uvicorn, closes a
pipe's descriptor twice (MagicStack/uvloop#763), and when another thread was given that number in between (the
/proc scan of a uid lease, a uid's lock file, a run's output folder) the second close took its file.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import IO

from megha.services.worker.tasklogs import RunLog, Stream

log = logging.getLogger(__name__)

READ_BYTES = 256 * 1024
"""The most of a task's output read from one pipe at a time (what asyncio's pipe transport reads)."""


class OutputPump:
    """Copies one output pipe of a run into its log: read when the loop says it is readable (add_reader), closed
    once, by its file object, at its end or by `close`. Not a pipe transport (module docstring: uvloop's closes the
    descriptor twice)."""

    def __init__(self, log: RunLog, stream: Stream, pipe: IO[bytes]) -> None:
        self._log = log
        self._stream = stream
        self._pipe = pipe
        self._fd = pipe.fileno()
        self._loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = self._loop.create_future()
        """Resolved when the pipe is closed: at its end (every process holding it gone) or by `close`."""
        os.set_blocking(self._fd, False)
        self._loop.add_reader(self._fd, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self._fd, READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.warning("could not read a task's %s: %s", self._stream, exc)
            data = b""
        if not data:
            self.close()
            return
        try:
            self._log.write(self._stream, data)
        except Exception:
            log.exception("could not keep a task's %s; the rest of it is not read", self._stream)
            self.close()

    def close(self) -> None:
        if self._pipe.closed:
            return
        self._loop.remove_reader(self._fd)
        self._pipe.close()
        if not self.done.done():
            self.done.set_result(None)
