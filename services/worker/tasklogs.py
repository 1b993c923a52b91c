"""The output an agent keeps of the tasks it ran: stdout and stderr per task and attempt, bounded and rotated.

Layout under the folder (MEGHA_TASK_LOG_DIR): ``<task>/<attempt>/stdout`` and ``stderr``. A stream that reaches
MEGHA_TASK_LOG_BYTES is rotated once (``stdout`` becomes ``stdout.1``, replacing the one before), so at most twice
that is kept per stream and the newest output always is. Beyond MEGHA_TASK_LOGS_KEPT task folders the oldest
are deleted (never one whose task still runs). A task id is the folder's name when it is a plain file name;
any other id is percent-encoded (a long one hashed), so no id can reach outside the folder.

Burn tasks print nothing worth keeping and get no folder. Files are written by the agent from the runs' pipes
(or the Docker engine's stream): a task never writes here itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path
from urllib.parse import quote

from megha.services.logroutes import Stream

STREAMS: tuple[Stream, ...] = ("stdout", "stderr")

TAIL_LINES = 10
TAIL_CHARS = 1000
"""What a failed run's reason quotes of its stderr at most: its last lines, and of those the last characters."""

_PLAIN = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,199}$")
_TAIL_KEPT = 8 * TAIL_CHARS  # bytes of stderr remembered in memory for the reason (multi-byte characters)


def folder_name(task_id: str) -> str:
    """The file name of a task's folder: the id itself when it is a plain name (never '.' or '..'), else its
    percent-encoding (with '.' encoded too), else a hash when that is too long. Never contains '/'."""
    if _PLAIN.match(task_id):
        return task_id
    encoded = quote(task_id, safe="").replace(".", "%2E")
    return encoded if len(encoded) <= 200 else "%" + hashlib.sha256(task_id.encode()).hexdigest()


class RotatingFile:
    """One stream of one run: appends to ``path``; once it holds `limit` bytes it becomes ``path.1``."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path = path
        self.limit = limit
        self._file = path.open("ab")
        self._size = self._file.tell()

    def write(self, data: bytes) -> None:
        while data:
            room = self.limit - self._size
            if room <= 0:
                self._rotate()
                continue
            chunk, data = data[:room], data[room:]
            self._file.write(chunk)
            self._size += len(chunk)
        self._file.flush()

    def _rotate(self) -> None:
        self._file.close()
        self.path.replace(self.path.with_name(self.path.name + ".1"))
        self._file = self.path.open("ab")
        self._size = 0

    def close(self) -> None:
        self._file.close()


class RunLog:
    """Where one run (task and attempt) writes its stdout and stderr; remembers stderr's end for the reason."""

    def __init__(self, folder: Path, limit: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self._files = {stream: RotatingFile(folder / stream, limit) for stream in STREAMS}
        self._stderr_end = b""

    def write(self, stream: Stream, data: bytes) -> None:
        self._files[stream].write(data)
        if stream == "stderr":
            self._stderr_end = (self._stderr_end + data)[-_TAIL_KEPT:]

    def stderr_tail(self) -> str:
        """The last lines of stderr (at most TAIL_LINES lines and TAIL_CHARS characters), '' if none."""
        text = self._stderr_end.decode(errors="replace").strip()
        return "\n".join(text.splitlines()[-TAIL_LINES:])[-TAIL_CHARS:]

    def close(self) -> None:
        for file in self._files.values():
            file.close()


class TaskLogs:
    """The kept output of this agent's tasks: a folder per task, at most `kept` of them, `limit` bytes a file."""

    def __init__(self, root: Path, limit: int, kept: int) -> None:
        self.root = root
        self.limit = limit
        self.kept = kept
        # Task folders oldest first (what an earlier life of the agent left included), and those in use. The
        # folder itself is made by the first run that keeps output.
        folders = sorted((p for p in root.iterdir() if p.is_dir()), key=_mtime) if root.is_dir() else []
        self._folders: OrderedDict[str, None] = OrderedDict((p.name, None) for p in folders)
        self._open: dict[str, int] = {}

    def open(self, task_id: str, attempt: int) -> RunLog:
        """A new run's log (an attempt run again, after a preemption, appends); deletes the oldest task folders
        beyond `kept`. `close(task_id, run_log)` when the run ends."""
        name = folder_name(task_id)
        run_log = RunLog(self.root / name / str(attempt), self.limit)
        self._folders[name] = None
        self._folders.move_to_end(name)
        self._open[name] = self._open.get(name, 0) + 1
        self._prune()
        return run_log

    def close(self, task_id: str, run_log: RunLog) -> None:
        run_log.close()
        name = folder_name(task_id)
        left = self._open.get(name, 1) - 1
        if left:
            self._open[name] = left
        else:
            self._open.pop(name, None)

    def _prune(self) -> None:
        excess = len(self._folders) - self.kept
        for name in [n for n in self._folders if n not in self._open][: max(0, excess)]:
            del self._folders[name]
            shutil.rmtree(self.root / name, ignore_errors=True)

    def attempts(self, task_id: str) -> list[int] | None:
        """The attempts of the task whose output is kept here, oldest first; None when there is no folder."""
        folder = self.root / folder_name(task_id)
        try:
            return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read(self, task_id: str, attempt: int, stream: Stream, tail: int | None = None) -> bytes:
        """What is kept of one stream of one run (the rotated file first), its last `tail` bytes when given."""
        path = self.root / folder_name(task_id) / str(attempt) / stream
        parts = []
        for part in (path.with_name(stream + ".1"), path):
            with contextlib.suppress(FileNotFoundError):
                parts.append(_read_end(part, tail))
        data = b"".join(parts)
        return data if tail is None else data[-tail:] if tail else b""


def _read_end(path: Path, tail: int | None) -> bytes:
    with path.open("rb") as f:
        if tail is not None:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - tail))
        return f.read()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def default_log_dir(run_id: str, worker_id: str) -> Path:
    """Where an agent keeps task output when MEGHA_TASK_LOG_DIR is not set: under the system's temp folder, named
    after its deployment (MEGHA_RUN_ID) and itself, so that a later deployment reusing task ids starts afresh."""
    return Path(tempfile.gettempdir()) / f"megha-{run_id}-{worker_id}-task-logs"
