"""Job traces: parsing `.tr` files, generating the syn_<N> traces, and the demo trace shipped with Megha.

A `.tr` file holds one job a line: `arrival_time num_tasks mean_task_duration d1 ... dn` (seconds). Blank
lines are skipped; arrivals must not go backwards. Jobs are returned with arrivals relative to the first job
(the first job arrives at 0), so a replay starts at t=0 whatever the trace's own epoch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

DEMO_TRACE = "demo_goog_100.tr"
"""The first 100 jobs of `../shared/traces/GOOG_subtrace.tr` (7,823 tasks; 200 jobs would be 275 KB)."""

SYNTHETIC_PREFIX = "syn:"
FIELDS = "arrival_time num_tasks mean_task_duration d1 ... dn"


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
    jobs = list(itertools.islice(_parse_lines(Path(path)), first_n))
    if not jobs:
        return []
    origin = jobs[0].arrival
    arrivals = [job.arrival for job in jobs]
    if dephase:
        seen: dict[float, int] = {}
        for i, arrival in enumerate(arrivals):
            k = seen[arrival] = seen.get(arrival, -1) + 1
            arrivals[i] = arrival + k * DEPHASE_STEP
    return [
        TraceJob(
            (arrival - origin) * time_scale,
            tuple((math.trunc(d) if whole_seconds else d) * time_scale for d in job.durations),
        )
        for arrival, job in zip(arrivals, jobs, strict=True)
    ]


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
        parts = spec[len(SYNTHETIC_PREFIX) :].split(":")
        if len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[0]) < 1:
            raise TraceError(f"trace spec {spec!r}: expected syn:<tasks_per_job>:<num_jobs>, e.g. syn:250:200")
        num_jobs = int(parts[1]) if first_n is None else min(int(parts[1]), first_n)
        return synthetic_trace(int(parts[0]), num_jobs, task_duration=time_scale, interval=time_scale)
    if not Path(spec).is_file():
        raise TraceError(f"trace spec {spec!r}: no such file, and not of the form syn:<tasks_per_job>:<num_jobs>")
    return read_trace(spec, first_n, time_scale, whole_seconds=whole_seconds, dephase=dephase)


def demo_trace_path() -> Path:
    """Path of the demo trace shipped with the package (the first 100 jobs of the Google sub-trace)."""
    return Path(str(resources.files("megha.loadgen").joinpath(DEMO_TRACE)))


def _check_options(first_n: int | None, time_scale: float) -> None:
    if first_n is not None and first_n < 0:
        raise ValueError(f"first_n must be >= 0, got {first_n}")
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"time_scale must be a positive number, got {time_scale}")


def _parse_lines(path: Path) -> Iterator[TraceJob]:
    """Jobs of the trace with their raw arrivals, parsed one line at a time."""
    previous = -math.inf
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(_text_lines(lines, path), start=1):
            fields = line.split()
            if not fields:
                continue
            job = _parse_job(fields, f"{path}, line {number}")
            if job.arrival < previous:
                raise TraceError(
                    f"{path}, line {number}: arrival {job.arrival:g} precedes the previous job's {previous:g}"
                )
            previous = job.arrival
            yield job


def _text_lines(lines: Iterator[str], path: Path) -> Iterator[str]:
    """The lines of a text file; a file that is not UTF-8 text (a binary file, say) is refused naming it."""
    try:
        yield from lines
    except UnicodeDecodeError:
        raise TraceError(
            f"{path}: not a text trace (it holds bytes that are not UTF-8); expected lines of {FIELDS}"
        ) from None


def _parse_job(fields: list[str], where: str) -> TraceJob:
    if len(fields) < 4:
        raise TraceError(f"{where}: got {len(fields)} fields, expected {FIELDS}")
    try:
        arrival = float(fields[0])
    except ValueError:
        raise TraceError(f"{where}: arrival_time {fields[0]!r} is not a number") from None
    try:
        num_tasks = int(fields[1])
    except ValueError:
        raise TraceError(f"{where}: num_tasks {fields[1]!r} is not an integer") from None
    if not _is_float(fields[2]):
        raise TraceError(f"{where}: mean_task_duration {fields[2]!r} is not a number")
    try:
        durations = tuple(map(float, fields[3:]))
    except ValueError:
        bad = next(f for f in fields[3:] if not _is_float(f))
        raise TraceError(f"{where}: task duration {bad!r} is not a number") from None
    if not math.isfinite(arrival) or arrival < 0:
        raise TraceError(f"{where}: arrival_time {fields[0]} must be a finite number >= 0")
    if num_tasks < 1:
        raise TraceError(f"{where}: num_tasks is {num_tasks}; a job needs at least one task")
    if num_tasks != len(durations):
        raise TraceError(f"{where}: num_tasks is {num_tasks} but the line has {len(durations)} task durations")
    if not all(0 <= d < math.inf for d in durations):
        bad = next(f for f, d in zip(fields[3:], durations, strict=True) if not 0 <= d < math.inf)
        raise TraceError(f"{where}: task duration {bad} must be a finite number >= 0")
    return TraceJob(arrival, durations)


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
