"""Run report: the text table of a run's metrics and its output files (CSV, JSON, CDF plot)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Sequence
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from megha.loadgen.metrics import COMPONENTS, RunMetrics, Summary
from megha.loadgen.records import JobRecord, TaskRecord

_STAT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("median", "median"),
    ("mean", "mean"),
    ("p90", "p90"),
    ("p99", "p99"),
    ("p99.99", "p9999"),
    ("max", "max"),
)
_DERIVED_TASK_COLUMNS: tuple[str, ...] = ("allocation_time", *COMPONENTS)
_LABEL_WIDTH = 18
_CELL_WIDTH = 11
_CDF_POINTS = 4000  # a CDF of millions of values is drawn through this many of its order statistics


def format_seconds(seconds: float) -> str:
    """A duration in ms below one second ("1.50 ms") and in s from one second up ("1.003 s"); NaN is "-"."""
    if math.isnan(seconds):
        return "-"
    if abs(seconds) < 1.0:
        return f"{seconds * 1000:.2f} ms"
    return f"{seconds:.3f} s"


def _summary_rows(metrics: RunMetrics) -> list[tuple[str, Summary]]:
    rows = [("allocation time", metrics.allocation_time)]
    rows += [(name.replace("_", " "), metrics.components[name]) for name in COMPONENTS]
    rows.append(("JRT delay", metrics.jrt_delay))
    return rows


def format_table(metrics: RunMetrics, title: str) -> str:
    """A fixed-width table of the time summaries followed by counts, mean utilization and throughput."""
    header = "".ljust(_LABEL_WIDTH) + "n".rjust(9) + "".join(h.rjust(_CELL_WIDTH) for h, _ in _STAT_COLUMNS)
    lines = [title, "=" * len(title), header]
    for label, summary in _summary_rows(metrics):
        cells = "".join(format_seconds(getattr(summary, f)).rjust(_CELL_WIDTH) for _, f in _STAT_COLUMNS)
        lines.append(label.ljust(_LABEL_WIDTH) + str(summary.count).rjust(9) + cells)
    m = metrics
    utilization = "  ".join(f"{name} {100 * value:.1f} %" for name, value in m.utilization.mean.items())
    lines += [
        "",
        f"tasks: {m.tasks}  completed: {m.tasks_completed}  failed: {m.tasks_failed}  "
        f"not completed exactly once: {len(m.not_exactly_once)}",
        f"jobs: {m.jobs}  rejected: {m.jobs_rejected}",
        f"attempts: {m.attempts}  reschedules: {m.reschedules}  inconsistencies: {m.inconsistencies}  "
        f"repartitions: {m.repartitions}",
        *(
            [
                f"preemption attempts: {m.preemption_attempts}  preemptions: {m.preemptions}  "
                f"work lost to preemption: {m.lost_cpu_seconds:,.1f} CPU-seconds"
            ]
            if m.preemption_attempts
            else []
        ),
        f"mean utilization: {utilization}",
        f"throughput: {m.tasks_completed} tasks in {format_seconds(m.simulated_span)} simulated, "
        f"{format_seconds(m.wall_seconds)} wall: {m.tasks_per_wall_second:.1f} tasks per wall second",
    ]
    return "\n".join(lines) + "\n"


def write_outputs(
    metrics: RunMetrics,
    tasks: Sequence[TaskRecord],
    jobs: Sequence[JobRecord],
    out_dir: Path,
    title: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Path]:
    """Write tasks.csv, jobs.csv, summary.json, utilization.csv and cdf.png to `out_dir`; return the paths.

    `extra` (for example the run's configuration) is stored under "extra" in summary.json.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: out_dir / name for name in ("tasks.csv", "jobs.csv", "summary.json", "utilization.csv", "cdf.png")}
    _write_tasks(tasks, metrics.utilization.resource_names, paths["tasks.csv"])
    _write_jobs(jobs, paths["jobs.csv"])
    paths["summary.json"].write_text(
        json.dumps(_json_safe(_summary_document(metrics, title, extra or {})), indent=2, allow_nan=False)
    )
    _write_utilization(metrics, paths["utilization.csv"])
    _plot(metrics, tasks, jobs, title, paths["cdf.png"])
    return paths


def _write_tasks(tasks: Sequence[TaskRecord], resource_names: tuple[str, ...], path: Path) -> None:
    """One row per task: every record field (the request split per resource) plus the derived times."""
    scalar = tuple(f.name for f in dataclasses.fields(TaskRecord) if f.name != "request")
    values = attrgetter(*scalar)
    derived = attrgetter(*_DERIVED_TASK_COLUMNS)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*scalar, *(f"request_{n}" for n in resource_names), *_DERIVED_TASK_COLUMNS])
        writer.writerows((*values(t), *t.request, *derived(t)) for t in tasks)


def _write_jobs(jobs: Sequence[JobRecord], path: Path) -> None:
    names = tuple(f.name for f in dataclasses.fields(JobRecord))
    values = attrgetter(*names, "jrt", "jrt_delay")
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*names, "jrt", "jrt_delay"])
        writer.writerows(values(j) for j in jobs)


def _write_utilization(metrics: RunMetrics, path: Path) -> None:
    series = metrics.utilization
    columns = [series.times, *(series.fractions[n] for n in series.resource_names)]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["time", *series.resource_names])
        writer.writerows(np.column_stack(columns).tolist())


def _summary_document(metrics: RunMetrics, title: str, extra: dict[str, Any]) -> dict[str, Any]:
    m = metrics
    summaries = {"allocation_time": m.allocation_time, **m.components, "jrt_delay": m.jrt_delay}
    return {
        "title": title,
        "summaries": {name: dataclasses.asdict(s) for name, s in summaries.items()},
        "counts": {
            "tasks": m.tasks,
            "tasks_completed": m.tasks_completed,
            "tasks_failed": m.tasks_failed,
            "jobs": m.jobs,
            "jobs_rejected": m.jobs_rejected,
            "repartitions": m.repartitions,
            "inconsistencies": m.inconsistencies,
            "reschedules": m.reschedules,
            "attempts": m.attempts,
            "preemption_attempts": m.preemption_attempts,
            "preemptions": m.preemptions,
        },
        "lost_cpu_seconds": m.lost_cpu_seconds,
        "not_exactly_once": list(m.not_exactly_once),
        "simulated_span": m.simulated_span,
        "wall_seconds": m.wall_seconds,
        "tasks_per_wall_second": m.tasks_per_wall_second,
        "mean_utilization": m.utilization.mean,
        "extra": extra,
    }


def _json_safe(value: Any) -> Any:
    """The same document with NaN and infinities as null, since JSON has no such numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _plot(metrics: RunMetrics, tasks: Sequence[TaskRecord], jobs: Sequence[JobRecord], title: str, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(15, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(title)
    alloc_axes, jrt_axes, util_axes = figure.subplots(1, 3)
    allocation = np.fromiter((t.allocation_time for t in tasks), dtype=np.float64, count=len(tasks))
    jrt_delay = np.array([j.jrt_delay for j in jobs], dtype=np.float64)
    _plot_cdf(alloc_axes, allocation, "allocation time (s)")
    _plot_cdf(jrt_axes, jrt_delay, "JRT delay (s)")
    series = metrics.utilization
    elapsed = series.times - series.times[0] if series.times.size else series.times
    for name in series.resource_names:
        util_axes.plot(elapsed, 100 * series.fractions[name], label=name)
    util_axes.set(xlabel="time since first start (s)", ylabel="utilization (%)", ylim=(0, 105))
    util_axes.legend(loc="lower right")
    util_axes.grid(True, alpha=0.3)
    figure.savefig(path, dpi=100)


def _plot_cdf(axes: Any, values: np.ndarray, label: str) -> None:
    """Empirical CDF on a log x axis; values that are NaN or not positive cannot be shown and are counted."""
    finite = values[~np.isnan(values)]
    shown = np.sort(finite[finite > 0])
    hidden = finite.size - shown.size
    axes.set(xlabel=label, ylabel="fraction", ylim=(0, 1.02))
    axes.grid(True, which="both", alpha=0.3)
    if shown.size == 0:
        axes.text(0.5, 0.5, "no positive values", ha="center", va="center", transform=axes.transAxes)
        return
    ranks = np.unique(np.linspace(0, shown.size - 1, min(shown.size, _CDF_POINTS)).astype(np.int64))
    axes.step(shown[ranks], (hidden + ranks + 1) / finite.size, where="post")
    axes.set_xscale("log")
    if hidden:
        axes.set_title(f"{hidden} values <= 0 not shown", fontsize=9)
