"""The output an agent keeps of the tasks it ran: stdout and stderr per task and attempt, bounded and rotated.

Layout under the folder (MEGHA_TASK_LOG_DIR): ``<task>/<attempt>/stdout`` and ``stderr``. A stream that reaches
MEGHA_TASK_LOG_BYTES is rotated once (``stdout`` becomes ``stdout.1``, replacing the one before), so at most twice
that is kept per stream and the newest output always is. Beyond MEGHA_TASK_LOGS_KEPT task folders the oldest
are deleted (never one whose task still runs, nor a folder holding anything but attempt folders: one the agent did
not make). A task id is the folder's name when it is a plain file name; any other id is percent-encoded (a long
one hashed), so no id can reach outside the folder.

Burn tasks print nothing worth keeping and get no folder. Files are written by the agent from the runs' pipes
(or the Docker engine's stream): a task never writes here itself. Everything is the agent's user's alone: the
folder is 0700 (`isolation.private_folder` refuses one another user owns or could swap), its folders 0700, its
files 0600; each is opened relative to its parent without following a link (O_NOFOLLOW), a new file only created
(O_EXCL), and anything that is not a plain file of its own (a link, a FIFO, a second hard link) is neither
written nor served.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import shutil
import stat
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

from megha.services.logroutes import Stream
from megha.services.worker.isolation import private_folder

log = logging.getLogger(__name__)

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


_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NOT_PLAIN = (errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENXIO, errno.EPERM)
"""What opening a planted link, folder, FIFO or second hard link fails with (O_NOFOLLOW, O_DIRECTORY, O_NONBLOCK,
the link count checked)."""


def _open_folder(parent: int, name: str, create: bool = False) -> int:
    """A folder in `parent` (a folder's descriptor), never through a link; made 0700 when `create` and missing."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent)
    return os.open(name, _FOLDER, dir_fd=parent)


def _open_file(folder: int, name: str, append: bool) -> BinaryIO:
    """A plain file of `folder`, never through a link: for appending (created 0600, O_EXCL, when missing), or for
    reading. Raises OSError (EPERM) for anything else there: a FIFO, a device, a file with a second hard link."""
    common = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    if append:
        try:
            fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | common, 0o600, dir_fd=folder)
        except FileExistsError:
            fd = os.open(name, os.O_WRONLY | os.O_APPEND | common, dir_fd=folder)
    else:
        fd = os.open(name, os.O_RDONLY | common, dir_fd=folder)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise OSError(errno.EPERM, f"{name} is not a plain file of its own (a link planted there?)")
    return os.fdopen(fd, "ab" if append else "rb")


class RotatingFile:
    """One stream of one run: appends to `name` in `folder`; once it holds `limit` bytes it becomes ``name.1``."""

    def __init__(self, folder: int, name: str, limit: int) -> None:
        self.folder = folder
        self.name = name
        self.limit = limit
        self._file = _open_file(folder, name, append=True)
        self._size = self._file.seek(0, os.SEEK_END)

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
        os.replace(self.name, self.name + ".1", src_dir_fd=self.folder, dst_dir_fd=self.folder)
        self._file = _open_file(self.folder, self.name, append=True)
        self._size = 0

    def close(self) -> None:
        self._file.close()


class RunLog:
    """Where one run (task and attempt) writes its stdout and stderr; remembers stderr's end for the reason.
    `folder` is the run's folder (a descriptor this log owns and closes)."""

    def __init__(self, folder: int, limit: int) -> None:
        self._folder = folder
        try:
            self._files = {stream: RotatingFile(folder, stream, limit) for stream in STREAMS}
        except BaseException:
            os.close(folder)
            raise
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
        os.close(self._folder)


class TaskLogs:
    """The kept output of this agent's tasks: a folder per task, at most `kept` of them, `limit` bytes a file."""

    def __init__(self, root: Path, limit: int, kept: int) -> None:
        self.root = root
        self.limit = limit
        self.kept = kept
        self._root: int | None = None  # the folder, opened by `prepare`
        # Task folders oldest first (what an earlier life of the agent left included), and those in use.
        self._folders: OrderedDict[str, None] = OrderedDict()
        self._open: dict[str, int] = {}

    def prepare(self) -> None:
        """Create the folder (0700) or check the one there is only this agent's user's, and learn the task folders
        an earlier life of the agent left; raises `StartupError` saying why it cannot be used. Idempotent."""
        if self._root is not None:
            return
        self._root = private_folder(self.root, "MEGHA_TASK_LOG_DIR")
        found = []
        with os.scandir(self._root) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode) and _holds_attempts(self._root, entry.name):
                        found.append((st.st_mtime, entry.name))
        self._folders = OrderedDict((name, None) for _, name in sorted(found))

    def open(self, task_id: str, attempt: int) -> RunLog:
        """A new run's log (an attempt run again, after a preemption, appends); deletes the oldest task folders
        beyond `kept`. `close(task_id, run_log)` when the run ends. Raises OSError when the run's folder or files
        cannot be made (one is a link, say)."""
        self.prepare()
        assert self._root is not None
        name = folder_name(task_id)
        task = _open_folder(self._root, name, create=True)
        try:
            run = _open_folder(task, str(attempt), create=True)
        finally:
            os.close(task)
        run_log = RunLog(run, self.limit)
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
        assert self._root is not None
        excess = len(self._folders) - self.kept
        for name in [n for n in self._folders if n not in self._open][: max(0, excess)]:
            del self._folders[name]
            try:
                if stat.S_ISDIR(os.lstat(name, dir_fd=self._root).st_mode):
                    shutil.rmtree(name, dir_fd=self._root, ignore_errors=True)
                else:  # a link or file put there: removed, never followed
                    os.unlink(name, dir_fd=self._root)
            except OSError:
                continue

    def attempts(self, task_id: str) -> list[int] | None:
        """The attempts of the task whose output is kept here, oldest first; None when there is no folder."""
        self.prepare()
        assert self._root is not None
        try:
            task = _open_folder(self._root, folder_name(task_id))
        except OSError:
            return None
        try:
            return sorted(int(name) for name in os.listdir(task) if name.isdigit())
        finally:
            os.close(task)

    def read(self, task_id: str, attempt: int, stream: Stream, tail: int | None = None) -> bytes:
        """What is kept of one stream of one run (the rotated file first), its last `tail` bytes when given. What
        is not a plain file of its own (a link planted there, say) is left out, with a warning."""
        self.prepare()
        assert self._root is not None
        parts = []
        try:
            task = _open_folder(self._root, folder_name(task_id))
            try:
                run = _open_folder(task, str(attempt))
            finally:
                os.close(task)
        except FileNotFoundError:
            return b""
        except OSError as exc:
            log.warning("task %s attempt %d: its output folder is not served: %s", task_id, attempt, exc)
            return b""
        try:
            for name in (stream + ".1", stream):
                try:
                    with _open_file(run, name, append=False) as f:
                        parts.append(_read_end(f, tail))
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    if exc.errno not in _NOT_PLAIN:
                        raise
                    log.warning("task %s attempt %d: %s is not served: %s", task_id, attempt, name, exc)
        finally:
            os.close(run)
        data = b"".join(parts)
        return data if tail is None else data[-tail:] if tail else b""


def _holds_attempts(root: int, name: str) -> bool:
    """Whether the folder `name` in `root` is a task's kept output: attempt folders (1, 2, ...) and nothing else.
    Only such folders are pruned, so that nothing else in a folder MEGHA_TASK_LOG_DIR names by mistake is deleted."""
    folder = _open_folder(root, name)
    try:
        entries = os.listdir(folder)
    finally:
        os.close(folder)
    return bool(entries) and all(entry.isdigit() for entry in entries)


def _read_end(f: BinaryIO, tail: int | None) -> bytes:
    if tail is not None:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - tail))
    return f.read()


def default_log_dir(run_id: str, worker_id: str) -> Path:
    """Where an agent keeps task output when MEGHA_TASK_LOG_DIR is not set: in a folder of its user's alone in the
    system's temp folder (``megha-<uid>``, 0700, checked at start-up), named after its deployment (MEGHA_RUN_ID) and
    itself, so that a later deployment reusing task ids starts afresh."""
    return Path(tempfile.gettempdir()) / f"megha-{os.geteuid()}" / f"{run_id}-{worker_id}-task-logs"
