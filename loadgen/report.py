"""Run report: the text table of a run's metrics, its warnings, and its output files (CSV, JSON, CDF plot).

docs/report.md says what every line of the table and every column of the files holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import time
from collections.abc import Sequence
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from megha.loadgen.metrics import COMPONENTS, RunMetrics, Summary, UtilizationSeries, allocation_columns
from megha.loadgen.records import JobRecord, TaskColumns, TaskRecord

if TYPE_CHECKING:
    from megha.loadgen.figure_process import FigureProcess

_STAT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("median", "median"),
    ("mean", "mean"),
    ("p90", "p90"),
    ("p99", "p99"),
    ("p99.99", "p9999"),
    ("max", "max"),
)
_DERIVED_TASK_COLUMNS: tuple[str, ...] = ("allocation_time", *COMPONENTS)
_CELL_WIDTH = 9  # "999.99 ms": wider values widen their column
_GAP = "  "
# Where the three plots sit, as fractions of the 15 x 4.8 inch figure: room for tick labels, axis labels, a title of
# two lines over each plot and the figure's title. Fixed rather than fitted by matplotlib's constrained layout,
# which gives the same look for a third more drawing time.
_MARGINS = {"left": 0.042, "right": 0.99, "bottom": 0.105, "top": 0.85, "wspace": 0.19}
_CDF_POINTS = 4000  # a CDF of millions of values is drawn through this many of its order statistics
_CSV_DECIMALS = 6  # times to the microsecond, fractions to a millionth
_CSV_QUOTED = ',"\r\n'  # a field holding one of these is quoted (csv.QUOTE_MINIMAL, the csv module's default)
_CSV_LINE_END = "\r\n"  # the csv module's default line terminator
_NUMPY_TYPES: dict[str, type[np.generic]] = {"int": np.int64, "bool": np.bool_}  # a record field's type -> dtype
REPORT_FILES = ("tasks.csv", "jobs.csv", "summary.json", "utilization.csv", "cdf.png")
#: What the scheduler counters printed after the table count, where their names alone could mislead.
COUNTER_LABELS = {
    "repartitions": "repartitioned placements",
    "preemption_attempts": "preemption requests",
    "preemptions": "runs stopped by preemption",
    "dropped": "tasks dropped at submission",
}


def format_seconds(seconds: float) -> str:
    """A duration: "1.50 ms" below a second, "1.003 s" below 100 s, "32,521.2 s" from 100 s up; NaN is "-"."""
    if math.isnan(seconds):
        return "-"
    if abs(seconds) < 1.0:
        return f"{seconds * 1000:.2f} ms"
    if abs(seconds) < 100.0:
        return f"{seconds:.3f} s"
    return f"{seconds:,.1f} s"


def _percent(fraction: float) -> str:
    return "-" if math.isnan(fraction) else f"{100 * fraction:.1f} %"


def _summary_rows(metrics: RunMetrics) -> list[tuple[str, Summary]]:
    rows = [("allocation time", metrics.allocation_time)]
    rows += [(name.replace("_", " "), metrics.components[name]) for name in COMPONENTS]
    rows.append(("JRT delay", metrics.jrt_delay))
    return rows


def format_table(metrics: RunMetrics, title: str) -> str:
    """The time summaries as a table whose columns fit their widest value, then counts, mean utilization and
    throughput."""
    rows = [
        [label, f"{summary.count:,}", *(format_seconds(getattr(summary, f)) for _, f in _STAT_COLUMNS)]
        for label, summary in _summary_rows(metrics)
    ]
    header = ["", "n", *(h for h, _ in _STAT_COLUMNS)]
    widths = [max(_CELL_WIDTH, *(len(row[i]) for row in [header, *rows])) for i in range(len(header))]
    widths[0] = max(len(row[0]) for row in rows)

    def line(cells: list[str]) -> str:
        return cells[0].ljust(widths[0]) + "".join(_GAP + c.rjust(w) for c, w in zip(cells[1:], widths[1:]))

    m = metrics
    utilization = "  ".join(f"{name} {_percent(value)}" for name, value in m.utilization.mean.items())
    lines = [title, "=" * len(title), line(header), *map(line, rows)]
    lines += [
        "",
        f"tasks: {m.tasks:,}  completed: {m.tasks_completed:,}  failed: {m.tasks_failed:,}  "
        f"not completed exactly once: {len(m.not_exactly_once):,}  illegal transitions: {m.illegal_transitions:,}",
        f"jobs: {m.jobs:,}  rejected: {m.jobs_rejected:,}",
        f"attempts: {m.attempts:,}  reschedules: {m.reschedules:,}  inconsistencies: {m.inconsistencies:,}  "
        f"tasks placed by repartition: {m.repartitions:,}",
        *(
            [
                f"preemption requests: {m.preemption_attempts:,}  runs stopped by preemption: {m.preemptions:,}  "
                f"work lost to preemption: {m.lost_cpu_seconds:,.1f} CPU-seconds"
            ]
            if m.preemption_attempts
            else []
        ),
        f"mean utilization: {utilization}",
        _throughput(m),
    ]
    return "\n".join(lines) + "\n"


def _throughput(m: RunMetrics) -> str:
    if m.clock == "virtual":
        return (
            f"throughput: {m.tasks_completed:,} tasks in {format_seconds(m.span)} of simulated time, replayed in "
            f"{format_seconds(m.wall_seconds)} of wall time: {m.tasks_per_wall_second:,.1f} tasks per wall second"
        )
    return (
        f"throughput: {m.tasks_completed:,} tasks completed in {format_seconds(m.wall_seconds)} of wall time: "
        f"{m.tasks_per_wall_second:,.1f} tasks per second (first arrival to last finish: {format_seconds(m.span)})"
    )


def format_counters(scheduler: str, counters: dict[str, int]) -> str:
    """The scheduler's own event counters on one line, each under a name that says what it counts."""
    counts = "  ".join(f"{COUNTER_LABELS.get(k, k.replace('_', ' '))}: {v:,}" for k, v in counters.items())
    return f"{scheduler} counters: {counts}"


def run_warnings(metrics: RunMetrics, files: bool | None = None) -> list[str]:
    """What makes a run's figures mean little: no job at all, most tasks failed, or most jobs rejected, each with
    its most common reasons (`files`: whether tasks.csv and jobs.csv, which list every reason, are written; None:
    not known, so the warning says where they would be); and what makes them suspect: events the task lifecycle
    did not allow."""
    m = metrics
    warnings = []
    if m.illegal_transitions:
        examples = "; ".join(m.illegal_examples)
        more = len(m.illegal_examples) < m.illegal_transitions
        warnings.append(
            f"{m.illegal_transitions:,} illegal task transition{'s' if m.illegal_transitions != 1 else ''} (events the "
            f"task lifecycle does not allow: a bug; the records keep what the events reported): {examples}"
            + ("; the others are logged" if more else "")
        )
    if m.jobs == 0:
        return [*warnings, "the trace held no jobs: nothing was measured"]
    if 2 * m.tasks_failed > m.tasks:
        warnings.append(
            f"{m.tasks_failed:,} of {m.tasks:,} tasks failed ({100 * m.tasks_failed / m.tasks:.1f} %): "
            + _reasons(m.failure_reasons, "task", files)
        )
    if 2 * m.jobs_rejected > m.jobs:
        warnings.append(
            f"{m.jobs_rejected:,} of {m.jobs:,} jobs were rejected ({100 * m.jobs_rejected / m.jobs:.1f} %): "
            + _reasons(m.rejection_reasons, "job", files)
        )
    return warnings


def _reasons(reasons: tuple[tuple[str, int], ...], unit: str, files: bool | None = None, shown: int = 3) -> str:
    text = "; ".join(f"{reason} ({count:,} {unit}{'s' if count != 1 else ''})" for reason, count in reasons[:shown])
    if len(reasons) > shown:
        more = f"{len(reasons) - shown} more reason{'s' if len(reasons) - shown != 1 else ''}"
        if files is None:
            text += f"; {more} in {unit}s.csv (not written with --no-files)"
        elif files:
            text += f"; {more} in {unit}s.csv"
        else:
            text += f"; {more} not shown (--no-files: no {unit}s.csv was written)"
    if any("satisfies" in reason for reason, _ in reasons):
        text += (
            ". Too few nodes satisfy the trace's placement constraints: give the data centre more nodes, or "
            "replay with --no-constraints"
        )
    return text


def report_dir(out: Path | None, default_root: Path, overwrite: bool) -> Path:
    """The folder a run's report goes to. `out` is refused (ValueError, one line) when it already holds a report,
    unless `overwrite`; without `out`, a new folder under `default_root` named after the time, e.g.
    20261123-142501 (a second run within the same second gets 20261123-142501-2), made here: runs started
    together each make one of their own (`forget_report_dir` removes it again, and the folders made above it,
    when the run ends before writing its report)."""
    if out is None:
        made = [folder for folder in (default_root, *default_root.parents) if not folder.exists()]
        default_root.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        folder, n = default_root / stamp, 1
        while True:
            try:
                folder.mkdir()
            except FileExistsError:
                n += 1
                folder = default_root / f"{stamp}-{n}"
                continue
            except FileNotFoundError:  # a run beside this one, ended before its report, removed the empty root
                default_root.mkdir(parents=True, exist_ok=True)
                continue
            _MADE[folder] = [folder, *made]
            return folder
    held = [name for name in REPORT_FILES if (out / name).exists()]
    if held and not overwrite:
        raise ValueError(
            f"{out} already holds a report ({', '.join(held)}): pass --overwrite to replace it, or another --out"
        )
    return out


_MADE: dict[Path, list[Path]] = {}
"""The folders `report_dir` made for a report folder of its own naming: that folder, then those above it."""


def forget_report_dir(folder: Path | None) -> None:
    """Remove a folder `report_dir` made, and the folders it made above it, as far as they are still empty (a run
    that ended before writing its report leaves no empty folder behind; one that wrote it keeps its folder)."""
    for made in _MADE.pop(folder, []) if folder is not None else []:
        try:
            made.rmdir()
        except OSError:  # not empty (a report, or another run's folder), or gone
            return


def write_outputs(
    metrics: RunMetrics,
    tasks: Sequence[TaskRecord] | TaskColumns,
    jobs: Sequence[JobRecord],
    out_dir: Path,
    title: str,
    extra: dict[str, Any] | None = None,
    drawer: FigureProcess | None = None,
) -> dict[str, Path]:
    """Write tasks.csv, jobs.csv, summary.json, utilization.csv and cdf.png to `out_dir`; return the paths.

    `extra` (for example the run's configuration) is stored under "extra" in summary.json. With a `drawer`, that
    process draws cdf.png while the other files are written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: out_dir / name for name in REPORT_FILES}
    # Each file is written under a name of its own first and renamed into place once all are written, so that a
    # run stopped meanwhile (Ctrl-C) leaves the folder as it was: no partial report, and with --overwrite no mix of
    # the old report's files and the new one's.
    partial = {name: out_dir / f".{name}.partial-{os.getpid()}" for name in REPORT_FILES}
    try:
        tasks = TaskColumns.of(tasks)
        figure = FigureData.of(metrics, tasks, jobs, title)
        if drawer is not None:
            drawer.draw(figure, partial["cdf.png"])
        _write_tasks(tasks, partial["tasks.csv"], metrics.utilization.resource_names)
        _write_jobs(jobs, partial["jobs.csv"])
        partial["summary.json"].write_text(
            json.dumps(_json_safe(_summary_document(metrics, title, extra or {})), indent=2, allow_nan=False)
        )
        _write_utilization(metrics.utilization, partial["utilization.csv"])
        if drawer is None:
            draw_figure(figure).savefig(partial["cdf.png"], dpi=100, format="png")
        else:
            drawer.wait()
        for name in REPORT_FILES:
            partial[name].replace(paths[name])
    except BaseException:
        if drawer is not None:
            with contextlib.suppress(Exception):
                drawer.wait()  # the child is done with its file (or gone) before that file is removed
        for path in partial.values():
            path.unlink(missing_ok=True)
        raise
    return paths


def _write_tasks(tasks: TaskColumns, path: Path, resource_names: tuple[str, ...]) -> None:
    """One row per task: every field of `TaskRecord` (its request split per resource, as request_<resource>), then
    allocation time and its components; numbers of seconds rounded to the microsecond."""
    scalar = [f for f in dataclasses.fields(TaskRecord) if f.name != "request"]
    header = [f.name for f in scalar]
    columns = [_task_column(tasks, f.name, str(f.type)) for f in scalar]
    if resource_names:
        header += [f"request_{name}" for name in resource_names]
        amounts = itertools.chain.from_iterable(tasks.column("request"))
        requests = np.fromiter(amounts, dtype=np.int64, count=len(tasks) * len(resource_names))
        requests = requests.reshape(len(tasks), len(resource_names))
        columns += list(requests.T)
    derived = allocation_columns(tasks)
    header += _DERIVED_TASK_COLUMNS
    columns += [_round(derived[name]) for name in _DERIVED_TASK_COLUMNS]
    _write_csv(path, header, columns)


def _task_column(tasks: TaskColumns, name: str, kind: str) -> np.ndarray | list[Any]:
    """A field's column for the CSV: numbers as a numpy array (times rounded), strings as a list."""
    if kind == "float":
        return _round(tasks.array(name, np.float64))
    return tasks.array(name, _NUMPY_TYPES[kind]) if kind in _NUMPY_TYPES else tasks.column(name)


def _write_jobs(jobs: Sequence[JobRecord], path: Path) -> None:
    """One row per job: every field of `JobRecord`, then JRT and JRT delay; seconds rounded to the microsecond."""
    fields = dataclasses.fields(JobRecord)
    header = [f.name for f in fields] + ["jrt", "jrt_delay"]
    columns = [_values(jobs, f.name, rounded=f.type == "float") for f in fields]
    columns += [_values(jobs, name, rounded=True) for name in ("jrt", "jrt_delay")]
    _write_csv(path, header, columns)


def _write_csv(path: Path, header: list[str], columns: list[np.ndarray | list[Any]]) -> None:
    """`columns` under `header`, in the bytes `csv.writer` writes, but formatted a column at a time."""
    rows = list(map(",".join, zip(*map(_csv_cells, columns))))
    with path.open("w", newline="") as handle:
        handle.write(",".join(_csv_cells(header)) + _CSV_LINE_END)
        if rows:
            handle.write(_CSV_LINE_END.join(rows) + _CSV_LINE_END)


def _csv_cells(column: np.ndarray | Sequence[Any]) -> list[str]:
    """A column's fields as `csv.writer` writes them: a float as its repr, an int or a bool as its str, a string
    in quotes (doubled inside) when it holds a comma, a quote or a line break. A numeric column's distinct values
    are formatted once each: a run's times take few distinct values, and formatting floats is most of the cost."""
    if isinstance(column, np.ndarray):
        keys = column.view(np.int64) if column.dtype == np.float64 else column  # by bits, so -0.0 stays "-0.0"
        distinct, rows = np.unique(keys, return_inverse=True)
        texts = np.array([str(v) for v in distinct.view(column.dtype).tolist()], dtype=object)
        return texts[rows].tolist()
    cells = list(map(str, column))
    joined = "".join(cells)
    if not any(c in joined for c in _CSV_QUOTED):
        return cells
    quoted = {cell: '"' + cell.replace('"', '""') + '"' for cell in set(cells) if any(c in cell for c in _CSV_QUOTED)}
    return list(map(quoted.get, cells, cells))  # a distinct string is checked, and quoted, once


def _values(records: Sequence[Any], name: str, rounded: bool) -> np.ndarray | list[Any]:
    values = map(attrgetter(name), records)
    if not rounded:
        return list(values)
    return _round(np.fromiter(values, dtype=np.float64, count=len(records)))


def _round(values: np.ndarray) -> np.ndarray:
    """To `_CSV_DECIMALS` places, so a CSV holds 0.3015 rather than 0.30150000000000005."""
    return np.round(values, _CSV_DECIMALS)


def _write_utilization(series: UtilizationSeries, path: Path) -> None:
    """Time (seconds on the run's clock) and, per resource, the fraction of the data centre's capacity held."""
    header = ["time", *(f"{name}_used_fraction" for name in series.resource_names)]
    _write_csv(path, header, [_round(series.times), *(_round(series.fractions[n]) for n in series.resource_names)])


def _summary_document(metrics: RunMetrics, title: str, extra: dict[str, Any]) -> dict[str, Any]:
    m = metrics
    summaries = {"allocation_time": m.allocation_time, **m.components, "jrt_delay": m.jrt_delay}
    return {
        "title": title,
        "warnings": run_warnings(m, files=True),
        "summaries": {name: dataclasses.asdict(s) for name, s in summaries.items()},
        "counts": {
            "tasks": m.tasks,
            "tasks_completed": m.tasks_completed,
            "tasks_failed": m.tasks_failed,
            "jobs": m.jobs,
            "jobs_rejected": m.jobs_rejected,
            "tasks_placed_by_repartition": m.repartitions,
            "inconsistencies": m.inconsistencies,
            "reschedules": m.reschedules,
            "attempts": m.attempts,
            "preemption_requests": m.preemption_attempts,
            "runs_stopped_by_preemption": m.preemptions,
            "illegal_transitions": m.illegal_transitions,
        },
        "failure_reasons": dict(m.failure_reasons),
        "rejection_reasons": dict(m.rejection_reasons),
        "lost_cpu_seconds": m.lost_cpu_seconds,
        "not_exactly_once": list(m.not_exactly_once),
        "clock": m.clock,
        "span": m.span,
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


def cdf_figure(
    metrics: RunMetrics, tasks: Sequence[TaskRecord] | TaskColumns, jobs: Sequence[JobRecord], title: str
) -> Any:
    """The report's figure (a matplotlib Figure, drawn without a display): the CDFs of allocation time and JRT
    delay, and utilization over time. Axes fit the data at any scale, from microseconds to days."""
    return draw_figure(FigureData.of(metrics, tasks, jobs, title))


@dataclasses.dataclass(frozen=True, slots=True)
class FigureData:
    """What the report's figure shows: each task's allocation time, each job's JRT delay, the utilization series."""

    allocation: np.ndarray
    jrt_delay: np.ndarray
    utilization: UtilizationSeries
    title: str

    @classmethod
    def of(
        cls, metrics: RunMetrics, tasks: Sequence[TaskRecord] | TaskColumns, jobs: Sequence[JobRecord], title: str
    ) -> FigureData:
        allocation = allocation_columns(TaskColumns.of(tasks))["allocation_time"]
        jrt_delay = np.array([j.jrt_delay for j in jobs], dtype=np.float64)
        return cls(allocation, jrt_delay, metrics.utilization, title)


def draw_figure(data: FigureData) -> Any:
    """`cdf_figure` of the figure's data."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(15, 4.8))
    FigureCanvasAgg(figure)
    figure.subplots_adjust(**_MARGINS)
    figure.suptitle(data.title)
    alloc_axes, jrt_axes, util_axes = figure.subplots(1, 3)
    _plot_cdf(alloc_axes, data.allocation, "allocation time", "tasks")
    _plot_cdf(jrt_axes, data.jrt_delay, "JRT delay", "jobs")
    _plot_utilization(util_axes, data.utilization)
    return figure


def _plot_cdf(axes: Any, values: np.ndarray, what: str, unit: str) -> None:
    """Empirical CDF, on a log axis when the values span more than a factor of 20 (then values <= 0, which it
    cannot show, are counted in the title), else on a linear axis; the title gives median, p99 and max."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    finite = np.sort(values[~np.isnan(values)])
    axes.set(xlabel=what, ylabel=f"fraction of {unit}", ylim=(0, 1.02))
    axes.grid(True, which="major", alpha=0.3)
    if finite.size == 0:
        axes.text(0.5, 0.5, f"no {unit} to show", ha="center", va="center", transform=axes.transAxes)
        return
    positive = finite[finite > 0]
    log = positive.size > 0 and positive[-1] > 20 * positive[0]
    shown = positive if log else finite
    hidden = finite.size - shown.size
    ranks = np.unique(np.linspace(0, shown.size - 1, min(shown.size, _CDF_POINTS)).astype(np.int64))
    x = np.concatenate(([shown[0]], shown[ranks]))  # from the first value's foot, so one value is a rise too
    y = np.concatenate(([hidden], hidden + ranks + 1)) / finite.size
    axes.step(x, y, where="post", linewidth=1.5)
    median, p99 = np.percentile(finite, (50, 99))
    stats = f"median {format_seconds(median)}   p99 {format_seconds(p99)}   max {format_seconds(finite[-1])}"
    axes.set_title(stats + (f"\n{hidden:,} {unit} at 0 s not shown on the log axis" if hidden else ""), fontsize=9)
    if log:
        axes.set_xscale("log")
        axes.xaxis.set_major_locator(LogLocator(base=10, numticks=5))
        axes.xaxis.set_minor_formatter(NullFormatter())
    else:
        low, high = float(shown[0]), float(shown[-1])
        pad = max(0.05 * (high - low), 0.1 * abs(high), 1e-6)
        axes.set_xlim(low - pad, high + pad)
        axes.xaxis.set_major_locator(MaxNLocator(nbins=4))
    axes.xaxis.set_major_formatter(FuncFormatter(_tick_seconds))


def _tick_seconds(seconds: float, _position: object = None) -> str:
    """A short tick label: "500 us", "1.5 ms", "20 s", "100,000 s"."""
    size = abs(seconds)
    if size < 1e-12:
        return "0"
    if size < 1e-3:
        return f"{seconds * 1e6:.3g} \N{GREEK SMALL LETTER MU}s"
    if size < 1:
        return f"{seconds * 1e3:.3g} ms"
    if size < 1000:
        return f"{seconds:.3g} s"
    return f"{seconds:,.0f} s"


_LINE_STYLES = ("-", "--", ":", "-.")


def _plot_utilization(axes: Any, series: UtilizationSeries) -> None:
    """Utilization per resource over the busy span. Resources with the same series share one line (so none hides
    another); the others differ in line style. The y axis is fitted to the peak, leaving the legend room above the
    data, never over it."""
    axes.set(ylabel="utilization (% of capacity)")
    axes.grid(True, alpha=0.3)
    if series.times.size == 0:
        axes.set_xlabel("time since the first start")
        axes.text(0.5, 0.5, "no task ran", ha="center", va="center", transform=axes.transAxes)
        return
    elapsed = series.times - series.times[0]
    unit, scale = _time_unit(float(elapsed[-1]))
    axes.set_xlabel(f"time since the first start ({unit})")
    alike: dict[bytes, list[str]] = {}
    for name in series.resource_names:
        alike.setdefault(series.fractions[name].tobytes(), []).append(name)
    peak = 0.0
    for style, names in zip(_LINE_STYLES * len(alike), alike.values()):
        percent = 100 * series.fractions[names[0]]
        peak = max(peak, float(percent.max()))
        label = f"{' = '.join(names)} (mean {_percent(series.mean[names[0]])})"
        axes.plot(elapsed / scale, percent, linestyle=style, linewidth=1.2, label=label)
    legend_share = 0.07 * (len(alike) + 1)  # of the plot's height, at the top
    axes.set_ylim(0, (peak if peak > 0 else 1.0) / (1 - legend_share))
    axes.set_xlim(0, max(float(elapsed[-1]) / scale, 1e-9))
    axes.legend(loc="upper right", fontsize=9, framealpha=0.9)


def _time_unit(span: float) -> tuple[str, float]:
    """Hours for spans of two hours and more, minutes from five minutes, else seconds."""
    if span >= 7200:
        return "h", 3600.0
    if span >= 300:
        return "min", 60.0
    return "s", 1.0
