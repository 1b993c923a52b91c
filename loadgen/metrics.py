"""Run metrics from measurement records: allocation-time and JRT-delay summaries, counts, utilization.

Allocation time and its components follow section III of the Megha paper; JRT delay and utilization follow
section 2.4 of the constraint-aware paper. The formulas live once, as properties of `TaskRecord` and
`JobRecord`; this module applies the task formulas column-wise with numpy to the records' columns
(`TaskColumns`) so a run of millions of tasks is summarised in seconds.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from megha.loadgen.records import JobRecord, TaskColumns, TaskRecord

#: Percentiles in a Summary: median, p90, p99 and p99.99.
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 99.99)
#: Upper bound (up to rounding to a 1-2-5 step) on the utilization samples when no step is given.
MAX_UTILIZATION_SAMPLES = 2000
#: Task components of allocation time, in the paper's order; names are `TaskRecord` properties.
COMPONENTS: tuple[str, ...] = ("framework_queuing", "processing", "communication", "worker_queuing")
#: The clock a run's records were taken on: a simulation's virtual clock, or the wall clock (a real deployment,
#: or a simulation run with `--realtime`).
Clock = Literal["virtual", "wall"]
_ID_LISTS = re.compile(r"\s*\[[^\]]*\]")  # "[5, 6]" in "no node satisfies placement constraints [5, 6]"
_TIME_FIELDS: tuple[str, ...] = (
    "arrival",
    "attempt_at",
    "decided_at",
    "lm_received_at",
    "launched_at",
    "worker_received_at",
    "started_at",
    "finished_at",
)


@dataclass(frozen=True, slots=True)
class Summary:
    """Distribution of one measurement; NaN values are left out, and an empty input gives NaN statistics."""

    count: int
    median: float
    mean: float
    p90: float
    p99: float
    p9999: float
    max: float


def summarize(values: Sequence[float] | np.ndarray) -> Summary:
    """Count, mean, max and linearly interpolated percentiles of the non-NaN values."""
    data = np.asarray(values, dtype=np.float64)
    data = data[~np.isnan(data)]
    if data.size == 0:
        return Summary(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    median, p90, p99, p9999 = np.percentile(data, PERCENTILES, method="linear")
    return Summary(
        count=int(data.size),
        median=float(median),
        mean=float(data.mean()),
        p90=float(p90),
        p99=float(p99),
        p9999=float(p9999),
        max=float(data.max()),
    )


@dataclass(frozen=True, slots=True)
class UtilizationSeries:
    """Fraction of the data centre's capacity held by running tasks over the busy span, step by step.

    A task holds its request from `started_at` to `finished_at`; tasks without both times are left out. The busy
    span runs from the first start to the last finish. `fractions[name][k]` is the time-average over step k, which
    starts at `times[k]` (the last step ends at the last finish, so it may be shorter): an average, not a sample
    at an instant, so a task ending at the very instant another starts shows as no dip or spike. `mean` is the
    exact time-average over the whole span.
    """

    resource_names: tuple[str, ...]
    times: np.ndarray
    fractions: dict[str, np.ndarray]
    mean: dict[str, float]


def default_utilization_step(span: float, max_samples: int = MAX_UTILIZATION_SAMPLES) -> float:
    """The smallest 1-2-5 step (…, 0.1, 0.2, 0.5, 1, 2, …) giving at most about `max_samples` over `span`."""
    if not span > 0:
        return 1.0
    raw = span / max_samples
    decade = 10.0 ** math.floor(math.log10(raw))
    return next(m * decade for m in (1.0, 2.0, 5.0, 10.0) if m * decade >= raw)


def utilization_over_time(
    tasks: Sequence[TaskRecord] | TaskColumns,
    total_capacity: tuple[int, ...],
    resource_names: Sequence[str],
    step: float | None = None,
) -> UtilizationSeries:
    """Utilization per resource in steps of `step` seconds of the busy span (default `default_utilization_step`)."""
    tasks = TaskColumns.of(tasks)
    return _utilization(
        tasks.array("started_at", np.float64),
        tasks.array("finished_at", np.float64),
        _requests(tasks, len(resource_names)),
        total_capacity,
        tuple(resource_names),
        step,
    )


@dataclass(frozen=True, slots=True)
class RunMetrics:
    """Everything the report prints about one run. Times are seconds."""

    allocation_time: Summary
    components: dict[str, Summary]  # keyed by COMPONENTS
    jrt_delay: Summary  # jobs that finished (others have a NaN delay)
    tasks: int
    tasks_completed: int  # completions >= 1
    tasks_failed: int  # failed_reason set
    jobs: int
    jobs_rejected: int
    repartitions: int  # tasks whose (last) placement was in another GM's partition, not repartition events
    inconsistencies: int  # placements an LM rejected because the GM's view was stale
    reschedules: int  # times a task went back to its GM's queue because nothing fitted
    attempts: int  # scheduling attempts at the GMs
    preemption_attempts: int  # preemption requests GMs sent to LMs for waiting tasks
    preemptions: int  # running tasks stopped by preemption (one granted request may stop several)
    lost_cpu_seconds: float  # work thrown away by preemptions (CPU request x time run before being stopped)
    # Tasks of accepted jobs that neither completed exactly once nor failed with a reason (should be none).
    not_exactly_once: tuple[str, ...]
    span: float  # last finish - first arrival, on `clock`
    clock: Clock  # the clock every time of the records is on
    wall_seconds: float
    tasks_per_wall_second: float  # completed tasks per second of wall-clock time
    utilization: UtilizationSeries
    # (reason, count), most common first; lists of ids in brackets are left out, so one cause is counted once.
    failure_reasons: tuple[tuple[str, int], ...]  # of failed tasks
    rejection_reasons: tuple[tuple[str, int], ...]  # of rejected jobs
    # Events the task lifecycle did not allow (common/core/lifecycle.py) among those the records were taken from
    # (should be none: each is a bug, or a race the lifecycle does not know), and the first few, as logged.
    illegal_transitions: int = 0
    illegal_examples: tuple[str, ...] = ()


def compute_metrics(
    tasks: Sequence[TaskRecord] | TaskColumns,
    jobs: Sequence[JobRecord],
    total_capacity: tuple[int, ...],
    resource_names: Sequence[str],
    wall_seconds: float,
    utilization_step: float | None = None,
    clock: Clock = "wall",
) -> RunMetrics:
    """Summarise one run's records; `wall_seconds` is how long the run took on the wall clock, and `clock` the clock
    the records' times are on (the wall clock unless a simulation says otherwise). Records a recorder filled
    (`loadgen/recorder.py`, `RecordedTasks`) carry the illegal transitions it counted, which the metrics report."""
    if clock not in get_args(Clock):
        raise ValueError(f"clock must be one of {get_args(Clock)}, got {clock!r}")
    tasks = TaskColumns.of(tasks)
    times = {name: tasks.array(name, np.float64) for name in _TIME_FIELDS}
    derived = allocation_columns(times)
    completions = tasks.array("completions", np.int64)
    reasons = tasks.column("failed_reason")
    failed = np.fromiter(map(bool, reasons), dtype=bool, count=len(tasks))
    rejections = [j.rejected_reason for j in jobs if j.rejected_reason]
    completed = int(np.count_nonzero(completions >= 1))
    return RunMetrics(
        allocation_time=summarize(derived["allocation_time"]),
        components={name: summarize(derived[name]) for name in COMPONENTS},
        jrt_delay=summarize([j.jrt_delay for j in jobs]),
        tasks=len(tasks),
        tasks_completed=completed,
        tasks_failed=int(np.count_nonzero(failed)),
        jobs=len(jobs),
        jobs_rejected=len(rejections),
        repartitions=int(tasks.array("repartitioned", np.int64).sum()),
        inconsistencies=int(tasks.array("inconsistencies", np.int64).sum()),
        reschedules=int(tasks.array("reschedules", np.int64).sum()),
        attempts=int(tasks.array("attempts", np.int64).sum()),
        preemption_attempts=int(tasks.array("preemption_attempts", np.int64).sum()),
        preemptions=int(tasks.array("preemptions", np.int64).sum()),
        lost_cpu_seconds=float(tasks.array("lost_cpu_seconds", np.float64).sum()),
        not_exactly_once=_not_exactly_once(tasks, jobs, completions, failed),
        span=_nan_span(times["arrival"], times["finished_at"]),
        clock=clock,
        wall_seconds=wall_seconds,
        tasks_per_wall_second=completed / wall_seconds if wall_seconds > 0 else math.nan,
        utilization=_utilization(
            times["started_at"],
            times["finished_at"],
            _requests(tasks, len(resource_names)),
            total_capacity,
            tuple(resource_names),
            utilization_step,
        ),
        failure_reasons=_tally(r for r in reasons if r),
        rejection_reasons=_tally(rejections),
        # Counted by the recorder that filled the columns (`RecordedTasks`); records from elsewhere have none.
        illegal_transitions=getattr(tasks, "illegal_transitions", 0),
        illegal_examples=tuple(getattr(tasks, "illegal_examples", ())),
    )


def _tally(reasons: Iterable[str]) -> tuple[tuple[str, int], ...]:
    """(reason, count), most common first, each reason without its lists of ids in brackets."""
    return tuple(Counter(_ID_LISTS.sub("", reason) for reason in reasons).most_common())


def allocation_columns(times: dict[str, np.ndarray] | TaskColumns) -> dict[str, np.ndarray]:
    """Allocation time and its components (`COMPONENTS`), one value per task: the `TaskRecord` formulas applied
    to the time columns (`times`: the records, or their time columns by name)."""
    if isinstance(times, TaskColumns):
        times = {name: times.array(name, np.float64) for name in _TIME_FIELDS}
    view = _ColumnView(times)
    return {name: getattr(TaskRecord, name).fget(view) for name in ("allocation_time", *COMPONENTS)}


class _ColumnView:
    """Stands in for a `TaskRecord` whose time attributes are numpy columns, so its properties vectorise."""

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        self.__dict__.update(columns)


def _requests(tasks: TaskColumns, width: int) -> np.ndarray:
    if not tasks:
        return np.zeros((0, width), dtype=np.int64)
    try:
        requests = np.array(tasks.column("request"), dtype=np.int64)
    except ValueError as exc:
        raise ValueError(f"every task request must have {width} amounts (one per resource)") from exc
    if requests.shape != (len(tasks), width):
        raise ValueError(f"every task request must have {width} amounts (one per resource)")
    return requests


def _not_exactly_once(
    tasks: TaskColumns, jobs: Sequence[JobRecord], completions: np.ndarray, failed: np.ndarray
) -> tuple[str, ...]:
    """Tasks of accepted jobs that finished more than once, or never finished without a failure reason."""
    rejected = {j.job_id for j in jobs if j.rejected_reason}
    suspects = np.flatnonzero((completions > 1) | ((completions == 0) & ~failed))
    task_ids, job_ids = tasks.columns["task_id"], tasks.columns["job_id"]
    return tuple(task_ids[i] for i in suspects.tolist() if job_ids[i] not in rejected)


def _nan_span(starts: np.ndarray, ends: np.ndarray) -> float:
    if np.isnan(starts).all() or np.isnan(ends).all():
        return math.nan
    return float(np.nanmax(ends) - np.nanmin(starts))


def _utilization(
    starts: np.ndarray,
    ends: np.ndarray,
    requests: np.ndarray,
    total_capacity: tuple[int, ...],
    resource_names: tuple[str, ...],
    step: float | None,
) -> UtilizationSeries:
    """Event sweep: the request-seconds held up to each step's edge, differenced into each step's average."""
    if len(total_capacity) != len(resource_names):
        raise ValueError("total_capacity and resource_names must have the same length")
    if any(c <= 0 for c in total_capacity):
        raise ValueError(f"total_capacity must be positive for every resource, got {total_capacity}")
    if step is not None and not step > 0:
        raise ValueError(f"utilization step must be positive, got {step}")
    ran = np.isfinite(starts) & np.isfinite(ends)
    starts, ends, requests = starts[ran], ends[ran], requests[ran]
    capacity = np.asarray(total_capacity, dtype=np.float64)
    if starts.size == 0:
        return UtilizationSeries(
            resource_names,
            np.zeros(0),
            {name: np.zeros(0) for name in resource_names},
            dict.fromkeys(resource_names, math.nan),
        )
    first, last = float(starts.min()), float(ends.max())
    span = last - first
    step = default_utilization_step(span) if step is None else step
    steps = max(1, math.ceil(span / step - 1e-9))
    edges = np.minimum(step * np.arange(steps + 1), span)  # seconds after the first start
    held = _held_until(starts - first, requests, edges) - _held_until(ends - first, requests, edges)
    widths = np.diff(edges)[:, None]
    fractions = np.divide(
        np.diff(held, axis=0), widths * capacity, out=np.zeros((steps, len(capacity))), where=widths > 0
    )
    times = first + edges[:-1]
    busy = (requests * (ends - starts)[:, None]).sum(axis=0)
    mean = busy / (capacity * span) if span > 0 else np.full(len(resource_names), math.nan)
    return UtilizationSeries(
        resource_names,
        times,
        {name: fractions[:, i] for i, name in enumerate(resource_names)},
        {name: float(mean[i]) for i, name in enumerate(resource_names)},
    )


def _held_until(event_times: np.ndarray, amounts: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Sum over the events at or before each of `times` of amount x (time - event time): the amount-seconds
    accrued since each event, up to each time (rows: times, columns: resources)."""
    order = np.argsort(event_times, kind="stable")
    sorted_times = event_times[order]
    total = amounts[order].astype(np.float64)
    timed = total * sorted_times[:, None]
    np.cumsum(total, axis=0, out=total)
    np.cumsum(timed, axis=0, out=timed)
    k = np.searchsorted(sorted_times, times, side="right") - 1  # the last event at or before each time; -1: none
    some = (k >= 0)[:, None]
    return np.where(some, times[:, None] * total[k] - timed[k], 0.0)
