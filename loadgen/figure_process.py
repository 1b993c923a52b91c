"""Draws the report's figure (cdf.png) in a child process forked before a replay runs.

Importing matplotlib takes about a fifth of a second and drawing the figure about a tenth; both are the same work
whoever does it. The child imports matplotlib while the parent replays, and draws while the parent writes the CSV
files and summary.json, so on a machine with a core to spare the figure costs the command no time. It is forked
(not started afresh), so it inherits the imported modules instead of importing Python's, numpy's and the report's
again. Only on Linux: elsewhere `start` gives None and the parent draws in process, as `write_outputs` does without
a `FigureProcess` (Windows has no fork, and on macOS a forked child must not call into system frameworks, which
numpy's linear algebra may use there).
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import traceback
from pathlib import Path

from megha.loadgen.report import FigureData, draw_figure


class FigureProcess:
    """The child that draws; `draw` sends it one figure to write, `wait` returns once the file is written (or
    raises the child's error), `close` ends the child. One child draws any number of figures in turn."""

    def __init__(self, pid: int, jobs: int, answers: int) -> None:
        self.pid = pid
        self._jobs = os.fdopen(jobs, "wb")  # pickled (FigureData, path) to the child
        self._answers = os.fdopen(answers, "rb")  # one pickled answer per figure: None, or the child's traceback
        self._drawing = 0  # figures sent and not waited for

    @classmethod
    def start(cls) -> FigureProcess | None:
        """Fork the child, which imports matplotlib at once and then waits for figures (None: not on Linux, or the
        process runs other threads: one of them could hold a lock the child then needs, the import lock say, and the
        child would wait for it for ever; `megha replay` runs none, a test calling `main` may)."""
        if sys.platform != "linux" or threading.active_count() > 1:
            return None
        from_parent, to_child = os.pipe()
        from_child, to_parent = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(to_child)
            os.close(from_child)
            _draw_figures(from_parent, to_parent)
        os.close(from_parent)
        os.close(to_parent)
        return cls(pid, to_child, from_child)

    def draw(self, data: FigureData, path: Path) -> None:
        """Have the child draw `data` into `path` (a PNG, whatever its name ends in)."""
        pickle.dump((data, path), self._jobs, protocol=pickle.HIGHEST_PROTOCOL)
        self._jobs.flush()
        self._drawing += 1

    def wait(self) -> None:
        """Return once every figure sent is written; RuntimeError with the child's traceback if one failed."""
        while self._drawing:
            self._drawing -= 1
            try:
                failure = pickle.load(self._answers)
            except EOFError:
                raise RuntimeError("the process drawing cdf.png ended before it drew it") from None
            if failure is not None:
                raise RuntimeError(f"drawing cdf.png failed:\n{failure}")

    def close(self) -> None:
        """End the child (it stops when its pipe closes) and reap it."""
        self._jobs.close()
        self._answers.close()
        os.waitpid(self.pid, 0)


def _draw_figures(jobs_fd: int, answers_fd: int) -> None:
    """The child's life: import what drawing needs, then draw each figure the parent sends until its pipe closes;
    leave with `os._exit`, so that nothing of the parent's (atexit handlers, buffered output) runs twice."""
    status = 1
    try:
        # Imported now, while the parent replays.
        import matplotlib.backends.backend_agg
        import matplotlib.figure
        import matplotlib.ticker  # noqa: F401

        with os.fdopen(jobs_fd, "rb") as jobs, os.fdopen(answers_fd, "wb") as answers:
            while True:
                try:
                    data, path = pickle.load(jobs)
                except EOFError:
                    break
                try:
                    draw_figure(data).savefig(path, dpi=100, format="png")  # the name need not end in .png
                    failure = None
                except Exception:
                    failure = traceback.format_exc()
                pickle.dump(failure, answers)
                answers.flush()
        status = 0
    finally:
        os._exit(status)
