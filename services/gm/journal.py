"""The GM's write-ahead journal: every accepted job is on disk (fsync) before its submission is answered 2xx,
and every task end is appended after it, so that a GM killed at any moment comes back with its job table and
queue (docs/architecture.md says why a GM-local journal and not a broker queue; docs/reliability.md its limits).

One file per (run, GM), JSON lines:

    {"job": {<JobSubmission with its job_id>}, "at": <unix time it arrived>}
    {"end": "<task id>", "state": "finished" | "failed" | "cancelled", "reason": "...", "at": <unix time or null>}
    {"cancel": "<job id>", "at": <unix time>}
    {"retry": "<task id>", "attempt": <its next attempt>, "failures": <failed runs retried so far>}

A retry record says a task's run failed and its job's retry rule runs it again (docs/retry.md): a restarted GM
queues the task as that attempt (an LM's memory of the failed run is of an earlier attempt, so it does not end the
task) and counts the failures already retried against the rule.

An end record's `at` is the task's finish time in the job table (null when it has none, as for a task this GM
failed): a restarted GM restores it, so a finish time never changes once reported.

A cancel record is durable before DELETE /v1/jobs/{id} is answered: a GM that restarts before the job's placed
tasks were stopped stops them then.

Job records are made durable in groups: submissions that arrive while an fsync runs share the next one. End
records are only written through to the operating system (they survive a process crash, not a machine crash):
an end a GM did not record is learnt again from its LMs, which remember the runs they ended recently.

Journals and their copies are private to the GM's user (files 0600, a folder made here 0700): they hold every
user's submissions, commands and task environments, and an exec task on the same host runs as another user.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal, NamedTuple

log = logging.getLogger("megha.gm")


class End(NamedTuple):
    """A task end as journaled."""

    state: str
    reason: str
    at: float | None = None  # its finish time in the job table (None: none, or not journaled)


@dataclass
class Replayed:
    """What a journal held: each job's submission (in arrival order) with its arrival time, and each task end."""

    jobs: list[tuple[dict[str, object], float]] = field(default_factory=list)
    ends: dict[str, End] = field(default_factory=dict)  # task id -> its end
    cancels: set[str] = field(default_factory=set)  # jobs cancelled (DELETE /v1/jobs/{id})
    retries: dict[str, tuple[int, int]] = field(default_factory=dict)  # task id -> (next attempt, failures retried)
    damaged: int = 0  # lines that could not be read (a write cut short by a crash)


class NotWritten(RuntimeError):
    """A record could not be written to the journal at all (closed, or the write failed)."""


def open_private(path: Path, mode: Literal["ab", "wb"], buffering: int = -1) -> BinaryIO:
    """Open journal file `path` to append to ("ab") or replace ("wb"), readable by this service's user only (0600,
    also a file an older version made; its folder, when made here, 0700); `buffering` as `open`'s."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if mode == "ab" else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, mode, buffering)


class Journal:
    """An append-only journal file with group commit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open_private(path, "ab", buffering=0)
        # Records written and not synced yet: (where the record starts in the file, who waits for its sync).
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []
        self._syncer: asyncio.Task[None] | None = None
        # Why the last write or sync failed (a full or read-only disk), until one succeeds again: the GM's health
        # check and metrics say so, since every submission is refused meanwhile.
        self.failing: str | None = None

    @staticmethod
    def replay(path: Path) -> Replayed:
        """Read a journal (missing: empty). A damaged line, the tail of a write a crash cut short, is skipped."""
        found = Replayed()
        if not path.exists():
            return found
        for number, record in _records(path, found):
            try:
                _replay_record(record, found)
            except (KeyError, TypeError, ValueError) as exc:  # JSON, but not a record this GM writes
                found.damaged += 1
                log.warning(
                    "journal %s, line %d: not a record (%s: %s): skipped", path, number, type(exc).__name__, exc
                )
        return found

    async def append_durably(self, record: dict[str, object]) -> str:
        """Append `record` and return its line once it is on disk. NotWritten when it could not even be written
        (nothing of it is in the journal); OSError or ValueError (the journal closed meanwhile) when it was written
        but its sync failed."""
        line = json.dumps(record, separators=(",", ":"))
        try:
            start = self._write(line.encode() + b"\n")
        except (OSError, ValueError) as exc:
            raise NotWritten(str(exc)) from exc
        done = asyncio.get_running_loop().create_future()
        self._waiting.append((start, done))
        if self._syncer is None or self._syncer.done():
            self._syncer = asyncio.get_running_loop().create_task(self._sync())
        await done
        return line

    def append(self, record: dict[str, object]) -> str:
        """Append `record`, written through to the operating system but not synced; returns its line. OSError (and
        nothing of it in the journal) when it could not be written."""
        line = json.dumps(record, separators=(",", ":"))
        self._write(line.encode() + b"\n")
        self.failing = None
        return line

    def _write(self, data: bytes) -> int:
        """Write `data` at the journal's end, straight to the operating system (no buffer that a failed write would
        leave to a later one: a refused job's line written once the disk has room again ran after a restart);
        where it starts. On a failure, what was written of it is cut off again, and the OSError raised."""
        fd = self._file.fileno()
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            self.failing = f"a write failed: {exc}"
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
        return start

    async def _sync(self) -> None:
        while self._waiting:
            waiting, self._waiting = self._waiting, []
            try:
                await asyncio.to_thread(os.fsync, self._file.fileno())
            except ValueError as exc:  # closed meanwhile (the GM was fenced and resets): written, not refused
                for _, done in waiting:
                    done.set_exception(exc)
            except OSError as exc:
                # Not on disk: the jobs are refused, so their lines must not stay (a restart would run them), and
                # nor may those written since, whose sync would follow the failure. End and retry lines among them
                # go too; a restarted GM learns those ends again from its LMs.
                waiting += self._waiting
                self._waiting = []
                self.failing = f"a sync failed: {exc}"
                with contextlib.suppress(OSError):
                    os.ftruncate(self._file.fileno(), min(start for start, _ in waiting))
                log.error(
                    "journal %s: a sync failed (%s): the %d records written since are cut off again",
                    self.path,
                    exc,
                    len(waiting),
                )
                for _, done in waiting:
                    done.set_exception(exc)
            else:
                self.failing = None
                for _, done in waiting:
                    done.set_result(None)

    def rewrite(self, records: list[dict[str, object]]) -> None:
        """Replace the journal by `records` (what is still worth keeping), atomically."""
        self._file.close()
        tmp = self.path.with_suffix(".tmp")
        with open_private(tmp, "wb") as out:
            for record in records:
                out.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(self.path)
        self._file = open_private(self.path, "ab", buffering=0)

    def close(self) -> None:
        self._file.close()


def journal_lines(path: Path) -> list[str]:
    """A journal's lines as written (missing: none), for the peer that stands in for this GM."""
    if not path.exists():
        return []
    return [line for line in path.read_text(errors="replace").splitlines() if line]


def merge_lines(path: Path, lines: list[str]) -> int:
    """Append to the journal at `path` the records among `lines` it lacks (jobs it does not hold, ends it did not
    record), durably; returns how many. This is how a GM takes back what a peer standing in for it accepted."""
    held = Journal.replay(path)
    jobs = {str(record.get("job_id")) for record, _ in held.jobs}
    added: list[str] = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if "job" in record and isinstance(record["job"], dict) and str(record["job"].get("job_id")) not in jobs:
            jobs.add(str(record["job"].get("job_id")))
        elif "end" in record and str(record["end"]) not in held.ends:
            held.ends[str(record["end"])] = End("", "")
        elif "cancel" in record and str(record["cancel"]) not in held.cancels:
            held.cancels.add(str(record["cancel"]))
        elif "retry" in record and held.retries.get(str(record["retry"]), (0, 0))[0] < int(record.get("attempt", 0)):
            held.retries[str(record["retry"])] = (int(record["attempt"]), int(record.get("failures", 0)))
        else:
            continue
        added.append(line)
    if added:
        torn = path.exists() and path.stat().st_size > 0 and path.read_bytes()[-1:] != b"\n"
        with open_private(path, "ab") as out:  # after a line a crash cut short, start a new one
            out.write(b"\n" * torn + "".join(line + "\n" for line in added).encode())
            out.flush()
            os.fsync(out.fileno())
    return len(added)


def _replay_record(record: dict[str, object], found: Replayed) -> None:
    """Add one journal record to `found`; KeyError, TypeError or ValueError when it lacks a field or holds a value
    of the wrong kind."""
    if "job" in record:
        found.jobs.append((record["job"], float(record["at"])))  # type: ignore[arg-type]
    elif "end" in record:
        at = record.get("at")
        at = float(at) if isinstance(at, int | float) else None
        found.ends[str(record["end"])] = End(str(record["state"]), str(record.get("reason", "")), at)
    elif "cancel" in record:
        found.cancels.add(str(record["cancel"]))
    elif "retry" in record:
        retried = (int(record["attempt"]), int(record["failures"]))  # type: ignore[call-overload]
        found.retries[str(record["retry"])] = max(found.retries.get(str(record["retry"]), retried), retried)


def _records(path: Path, found: Replayed) -> Iterator[tuple[int, dict[str, object]]]:
    """Each line of the journal that is a JSON object, with its line number."""
    with path.open("rb") as lines:
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except ValueError:
                found.damaged += 1
                continue
            if isinstance(record, dict):
                yield number, record
            else:
                found.damaged += 1
