"""Progress of long runs on stderr: one-line notes, and on a terminal a bar with the share done and the time left.

Off a terminal (a pipe, a log file, a test) there is no bar, so logs hold only the notes; `--quiet` passes no
`Progress` at all. The bar is drawn by `rich`, imported only when a bar is shown.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol, TextIO

if TYPE_CHECKING:
    from rich.console import Console


class Advance(Protocol):
    """advance(done, detail, total): `done` units are finished; `detail` is shown after the bar; `total`, when
    given, is the new whole (a run that learns it as it goes: tasks accepted so far)."""

    def __call__(self, done: int, detail: str, total: int | None = None) -> None: ...


class Progress:
    """Where a long run says how far it got. `bar` defaults to whether `stream` (stderr) is a terminal."""

    def __init__(self, stream: TextIO | None = None, bar: bool | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.bar = self.stream.isatty() if bar is None else bar
        self._console: Console | None = None  # the bar's, while one is shown

    @classmethod
    def on_terminal(cls) -> Progress | None:
        """A Progress when stderr is a terminal, else None: for runs whose logs should stay as they were."""
        return cls() if sys.stderr.isatty() else None

    def note(self, line: str) -> None:
        """A line on the stream; while a bar is shown, above the bar."""
        if self._console is not None:
            self._console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=self.stream, flush=True)

    @contextmanager
    def track(self, description: str, total: int, unit: str) -> Iterator[Advance]:
        """Yields `advance`; on a terminal, a bar of `total` `unit`s with an estimate of the time left (from the
        recent pace), erased when the block ends."""
        if not self.bar:
            yield _ignore
            return
        from rich.console import Console
        from rich.progress import BarColumn, TaskProgressColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as Bar

        columns = (  # the most telling first: a narrow terminal cuts the line short at its end
            TextColumn("{task.description}"),
            BarColumn(bar_width=20),
            TaskProgressColumn(),
            TimeRemainingColumn(),
            TextColumn("left"),
            TextColumn(f"{{task.completed:,.0f}}/{{task.total:,.0f}} {unit}"),
            TextColumn("{task.fields[detail]}"),
        )
        console = Console(file=self.stream, force_terminal=True)
        with Bar(*columns, console=console, transient=True, redirect_stdout=False, redirect_stderr=False) as bar:
            task = bar.add_task(description, total=total, detail="")
            whole = total

            def advance(done: int, detail: str, total: int | None = None) -> None:
                nonlocal whole
                whole = whole if total is None else total
                bar.update(task, total=whole, completed=min(done, whole), detail=detail)

            self._console = console
            try:
                yield advance
            finally:
                self._console = None


def _ignore(done: int, detail: str, total: int | None = None) -> None:
    """No bar: nothing to draw."""
