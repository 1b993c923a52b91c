"""Job traces: parsing `.tr` files, generating the syn_<N> traces, and the demo trace shipped with Megha.

A `.tr` file holds one job a line: `arrival_time num_tasks mean_task_duration d1 ... dn` (seconds; the format is
docs/traces.md). `#` starts a comment to the end of the line; blank lines are skipped; arrivals must not go
backwards. Jobs are returned with arrivals relative to the first job (the first job arrives at 0), so a replay
starts at t=0 whatever the trace's own epoch.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TextIO

DEMO_TRACE = "demo_goog_100.tr"
"""The first 100 jobs of `../shared/traces/GOOG_subtrace.tr` (7,823 tasks; 200 jobs would be 275 KB)."""

SYNTHETIC_PREFIX = "syn:"
FIELDS = "arrival_time num_tasks mean_task_duration d1 ... dn"
MAX_SECONDS = 1e12
"""The largest arrival (after the first job's) and task duration a replay accepts, in seconds after the time scale
(about 31,700 years): far beyond any trace, and small enough that a float time keeps better than millisecond
precision (2**-13 s at 1e12 s), so no arrival or end of a task rounds onto another's or overflows to infinity."""
MAX_SYNTHETIC_TASKS = 10**8
"""The most tasks a `syn:<tasks_per_job>:<num_jobs>` spec (after --first-jobs) makes, and a trace file's jobs read
(after --first-jobs) hold: a replay holds about 1 KB per task, so more would exhaust any machine's memory before it
began."""
SHOWN_CHARS = 40
"""The most characters of a trace's field an error message quotes (a field of a hostile trace can be megabytes)."""
COMMENT = "#"
"""Starts a comment, which runs to the end of its line."""
MAX_LINE_CHARS = 2**28
"""The longest line a trace may have (268 million characters: a job of tens of millions of tasks, whose replay would
take tens of GB): a longer one, a file of no line ends say, is refused before it fills the memory."""
_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)", re.I)
_INT = re.compile(r"[+-]?[0-9]+")
_SYN_NUMBER = re.compile(r"[0-9]+")
_TOKEN = re.compile(r"\S+")


class TraceError(ValueError):
    """A trace is malformed or a trace spec is not understood; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace: its arrival (seconds after the first job) and each task's duration (seconds)."""

    arrival: float
    durations: tuple[float, ...]


DEPHASE_STEP = 0.01
"""Seconds by which the constraint-aware paper's simulator moves a job that arrives when an earlier job did
(`dephase`)."""


def read_trace(
    path: str | Path,
    first_n: int | None = None,
    time_scale: float = 1.0,
    *,
    whole_seconds: bool = False,
    dephase: bool = False,
) -> list[TraceJob]:
    """The first `first_n` jobs (all when None) of the trace at `path`, read lazily (only the lines needed).

    Arrivals are shifted so the first job arrives at 0, then arrivals and durations are multiplied by
    `time_scale`. With `whole_seconds`, each task's duration as the file gives it is first truncated to whole
    seconds (toward zero: a task under 1 s lasts 0), as the constraint-aware paper's simulator reads a trace. With
    `dephase`, as that simulator does too (`job.py`), the k-th job to arrive at a time an earlier job arrived at
    arrives `k * DEPHASE_STEP` seconds after it, before the time scale (so later in the list than a job of the
    next arrival time when more than 1 / `DEPHASE_STEP` jobs share one).
    """
    _check_options(first_n, time_scale)
    numbered = list(itertools.islice(_parse_lines(Path(path)), None if first_n is None else min(first_n, sys.maxsize)))
    if not numbered:
        return []
    jobs = [job for _, job in numbered]
    origin = jobs[0].arrival
    arrivals = [job.arrival for job in jobs]
    if dephase:
        seen: dict[float, int] = {}
        for i, arrival in enumerate(arrivals):
            k = seen[arrival] = seen.get(arrival, -1) + 1
            arrivals[i] = arrival + k * DEPHASE_STEP
    scaled = [
        TraceJob(
            (arrival - origin) * time_scale,
            tuple((math.trunc(d) if whole_seconds else d) * time_scale for d in job.durations)
            if whole_seconds or time_scale != 1
            else job.durations,  # d * 1 is d
        )
        for arrival, job in zip(arrivals, jobs, strict=True)
    ]
    for (number, _), job in zip(numbered, scaled, strict=True):
        _check_scaled(job, f"{path}, line {number}", time_scale)
    return scaled


def _check_scaled(job: TraceJob, where: str, time_scale: float) -> None:
    """A job whose arrival or a task's duration, after the time scale, is beyond `MAX_SECONDS`, refused naming it."""
    scale = "" if time_scale == 1 else f" (after --time-scale {time_scale:g})"
    if not job.arrival <= MAX_SECONDS:
        raise TraceError(
            f"{where}: arrival_time is {job.arrival!r} s after the first job's{scale}; at most {MAX_SECONDS:g} s"
        )
    longest = max(job.durations)
    if not longest <= MAX_SECONDS:
        raise TraceError(f"{where}: task duration {longest!r} s{scale} is over the maximum, {MAX_SECONDS:g} s")


def synthetic_trace(
    tasks_per_job: int, num_jobs: int, task_duration: float = 1.0, interval: float = 1.0
) -> list[TraceJob]:
    """A syn_<tasks_per_job> trace: job k arrives at k * interval with `tasks_per_job` tasks of
    `task_duration` each. Equals the shipped `syn_<N>.0.tr` files read with `read_trace` (which shifts their
    first arrival, 1 s, to 0).
    """
    if tasks_per_job < 1 or num_jobs < 0:
        raise ValueError(f"synthetic trace needs tasks_per_job >= 1 and num_jobs >= 0, got {tasks_per_job}, {num_jobs}")
    durations = (float(task_duration),) * tasks_per_job
    return [TraceJob(k * interval, durations) for k in range(num_jobs)]


def resolve_trace(
    spec: str,
    first_n: int | None = None,
    time_scale: float = 1.0,
    *,
    whole_seconds: bool = False,
    dephase: bool = False,
) -> list[TraceJob]:
    """Jobs from a trace spec: a `.tr` file path, or `syn:<tasks_per_job>:<num_jobs>` (e.g. `syn:250:200`).

    `first_n`, `time_scale`, `whole_seconds` and `dephase` apply to both, as in `read_trace` (a synthetic trace's
    tasks last a whole second already and its jobs arrive a second apart).
    """
    _check_options(first_n, time_scale)
    if spec.startswith(SYNTHETIC_PREFIX):
        tasks_per_job, num_jobs = _synthetic_size(spec, first_n)
        if time_scale > MAX_SECONDS or max(num_jobs - 1, 0) * time_scale > MAX_SECONDS:
            raise TraceError(
                f"trace spec {spec!r}: its tasks' durations or last arrival would be over {MAX_SECONDS:g} s at "
                f"time scale {time_scale:g}"
            )
        return synthetic_trace(tasks_per_job, num_jobs, task_duration=time_scale, interval=time_scale)
    try:
        mode = Path(spec).stat().st_mode
    except FileNotFoundError:
        raise TraceError(
            f"trace spec {spec!r}: no such file, and not of the form syn:<tasks_per_job>:<num_jobs>"
        ) from None
    except OSError as exc:
        raise TraceError(f"trace {spec}: cannot read it: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise TraceError(f"trace {spec}: is a directory, not a trace file")
    if not stat.S_ISREG(mode):
        raise TraceError(f"trace {spec}: not a regular file (a trace is read from a file)")
    return read_trace(spec, first_n, time_scale, whole_seconds=whole_seconds, dephase=dephase)


def synthetic_tasks(spec: str, first_n: int | None = None) -> int | None:
    """How many tasks the synthetic trace `spec` makes (after `first_n`), known before it is made; None for a
    trace file (or a spec `resolve_trace` will refuse)."""
    if not spec.startswith(SYNTHETIC_PREFIX):
        return None
    try:
        tasks_per_job, num_jobs = _synthetic_size(spec, first_n)
    except TraceError:
        return None
    return tasks_per_job * num_jobs


def _synthetic_size(spec: str, first_n: int | None) -> tuple[int, int]:
    """(tasks per job, jobs) of `syn:<tasks_per_job>:<num_jobs>` after `first_n`; TraceError naming what is wrong."""
    parts = spec[len(SYNTHETIC_PREFIX) :].split(":")
    expected = "expected syn:<tasks_per_job>:<num_jobs>, e.g. syn:250:200"
    if len(parts) != 2:
        raise TraceError(f"trace spec {spec!r}: {expected}")
    for field, part in zip(("tasks_per_job", "num_jobs"), parts, strict=True):
        if not _SYN_NUMBER.fullmatch(part):
            raise TraceError(f"trace spec {spec!r}: {field} {part!r} is not a whole number (0-9); {expected}")
    tasks_per_job = int(parts[0])
    if tasks_per_job < 1:
        raise TraceError(f"trace spec {spec!r}: tasks_per_job must be at least 1; {expected}")
    num_jobs = int(parts[1]) if first_n is None else min(int(parts[1]), first_n)
    if tasks_per_job * num_jobs > MAX_SYNTHETIC_TASKS:
        raise TraceError(
            f"trace spec {spec!r}: {tasks_per_job * num_jobs:,} tasks is over the most a synthetic trace makes, "
            f"{MAX_SYNTHETIC_TASKS:,} (about 1 KB of memory each in a replay)"
        )
    return tasks_per_job, num_jobs


def demo_trace_path() -> Path:
    """Path of the demo trace shipped with the package (the first 100 jobs of the Google sub-trace)."""
    return Path(str(resources.files("megha.loadgen").joinpath(DEMO_TRACE)))


def _check_options(first_n: int | None, time_scale: float) -> None:
    if first_n is not None and first_n < 0:
        raise ValueError(f"first_n must be >= 0, got {first_n}")
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"time_scale must be a positive number, got {time_scale}")


def _parse_lines(path: Path) -> Iterator[tuple[int, TraceJob]]:
    """Jobs of the trace with their raw arrivals and line numbers, parsed one line at a time (a UTF-8 byte order
    mark at the start is skipped, and so are comments and blank lines)."""
    previous = -math.inf
    tasks = 0
    try:
        opened = path.open(encoding="utf-8-sig")
    except OSError as exc:
        raise TraceError(f"trace {path}: cannot read it: {exc.strerror}") from None
    with opened as lines:
        for number, line in enumerate(_text_lines(lines, path), start=1):
            text = line.partition(COMMENT)[0] if COMMENT in line else line
            if not text or text.isspace():
                continue
            job = _parse_job(text, f"{path}, line {number}", MAX_SYNTHETIC_TASKS - tasks)
            if job.arrival < previous:
                raise TraceError(
                    f"{path}, line {number}: arrival {job.arrival:g} precedes the previous job's {previous:g} "
                    "(a trace lists its jobs in arrival order)"
                )
            previous = job.arrival
            tasks += len(job.durations)
            yield number, job


def _text_lines(lines: TextIO, path: Path) -> Iterator[str]:
    """The lines of a text file, each read only up to `MAX_LINE_CHARS` characters; a file that is not UTF-8 text (a
    binary file, say) or has a longer line is refused naming it."""
    try:
        for number, line in enumerate(iter(functools.partial(lines.readline, MAX_LINE_CHARS + 1), ""), start=1):
            if len(line) > MAX_LINE_CHARS:
                raise TraceError(
                    f"{path}, line {number}: over {MAX_LINE_CHARS:,} characters long; expected a line of {FIELDS}"
                )
            yield line
    except UnicodeDecodeError:
        raise TraceError(
            f"{path}: not a text trace (it holds bytes that are not UTF-8); expected lines of {FIELDS}"
        ) from None


def _parse_job(text: str, where: str, most_tasks: int) -> TraceJob:
    """The job of one line of a trace (`text`, without its comment), of at most `most_tasks` tasks. The durations
    are split off only up to the number of tasks the line declares, so a line's memory is bounded by it."""
    head = text.split(None, 3)
    if len(head) < 3:
        raise TraceError(f"{where}: got {len(head)} fields, expected {FIELDS}")
    if not _is_float(head[0]):
        raise TraceError(f"{where}: arrival_time {_clip(head[0])!r} is not a number")
    arrival = float(head[0])
    if not _INT.fullmatch(head[1]):
        raise TraceError(f"{where}: num_tasks {_clip(head[1])!r} is not an integer")
    try:
        num_tasks = int(head[1])
    except ValueError:  # over 4,300 digits, Python's bound on reading an int: more tasks than a replay reads
        num_tasks = -sys.maxsize if head[1].startswith("-") else sys.maxsize
    if not _is_float(head[2]):
        raise TraceError(f"{where}: mean_task_duration {_clip(head[2])!r} is not a number")
    if not math.isfinite(arrival) or arrival < 0:
        raise TraceError(f"{where}: arrival_time {_clip(head[0])} must be a finite number >= 0")
    if not 0 <= float(head[2]) < math.inf:
        raise TraceError(f"{where}: mean_task_duration {_clip(head[2])} must be a finite number >= 0")
    if num_tasks < 1:
        raise TraceError(f"{where}: num_tasks is {_clip(head[1])}; a job needs at least one task")
    if len(head) < 4:
        raise TraceError(f"{where}: got 3 fields, expected {FIELDS}")
    if num_tasks > most_tasks:
        raise TraceError(
            f"{where}: num_tasks {_clip(head[1])} takes the trace over the most tasks a replay reads, "
            f"{MAX_SYNTHETIC_TASKS:,} (about 1 KB of memory each); replay fewer jobs"
        )
    texts = head[3].split(None, num_tasks)  # one more piece (the rest of the line) when there are too many
    if len(texts) != num_tasks:
        count = len(texts) if len(texts) < num_tasks else num_tasks + sum(1 for _ in _TOKEN.finditer(texts[-1]))
        raise TraceError(f"{where}: num_tasks is {num_tasks} but the line has {count} task durations")
    if not all(map(_FLOAT.fullmatch, set(texts))):  # each distinct text checked once, then the first named
        bad = next(f for f in texts if not _is_float(f))
        raise TraceError(f"{where}: task duration {_clip(bad)!r} is not a number")
    durations = tuple(map(float, texts))
    if not all(0 <= d < math.inf for d in set(durations)):
        bad = next(f for f, d in zip(texts, durations, strict=True) if not 0 <= d < math.inf)
        raise TraceError(f"{where}: task duration {_clip(bad)} must be a finite number >= 0")
    return TraceJob(arrival, durations)


def _clip(text: str) -> str:
    """`text` for an error message: its first `SHOWN_CHARS` characters, then `...` if it is longer."""
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _is_float(text: str) -> bool:
    """Whether `text` is a number written in ASCII (Python's float() also takes other scripts' digits and
    underscores, which no trace writes)."""
    return _FLOAT.fullmatch(text) is not None
