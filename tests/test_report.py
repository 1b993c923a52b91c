"""The run report: time formatting, the text table, and the files written for a run."""

from __future__ import annotations

import concurrent.futures
import csv
import io
import json
import math
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from megha.loadgen import report
from megha.loadgen.figure_process import FigureProcess
from megha.loadgen.metrics import RunMetrics, compute_metrics
from megha.loadgen.records import JobRecord, TaskRecord
from megha.loadgen.report import (
    FigureData,
    cdf_figure,
    forget_report_dir,
    format_counters,
    format_seconds,
    format_table,
    report_dir,
    run_warnings,
    write_outputs,
)

NAMES = ("cpu", "mem")
ON_LINUX = pytest.mark.skipif(sys.platform != "linux", reason="the figure process is forked on Linux only")
CAPACITY = (4000, 8000)
# Busy span 1.5 ms .. 5.01 s, in which t1 holds 1000 cpu for 5.0065 s and t2 holds 2000 cpu for 2.4985 s.
CPU_MEAN = (1000 * 5.0065 + 2000 * 2.4985) / (4000 * 5.0085)


def task(task_id: str, arrival: float, started: float, finished: float, request: tuple[int, int]) -> TaskRecord:
    """A task whose allocation time splits 1 ms queuing, 0.5 ms processing, rest communication, 0 worker queuing."""
    return TaskRecord(
        task_id,
        "j1",
        0,
        "alice",
        finished - started,
        request,
        arrival=arrival,
        attempt_at=arrival + 0.001,
        decided_at=arrival + 0.0015,
        lm_received_at=arrival + 0.0015,
        launched_at=arrival + 0.0015,
        worker_received_at=started,
        started_at=started,
        finished_at=finished,
        attempts=1,
        completions=1,
        lm=2,
        node=7,
    )


def run() -> tuple[list[TaskRecord], list[JobRecord], RunMetrics]:
    tasks = [
        task("t1", 0.0, 0.0035, 5.01, (1000, 2000)),
        task("t2", 0.0, 0.0015, 2.5, (2000, 4000)),
        TaskRecord("t3", "j2", 0, "bob", 1.0, (1, 1), arrival=0.5, failed_reason="no node satisfies the constraints"),
    ]
    jobs = [
        JobRecord("j1", 0, submitted_at=0.0, num_tasks=2, ideal_jrt=5.0, finished_tasks=2, finished_at=5.0015),
        JobRecord("j2", 0, submitted_at=0.5, num_tasks=1, ideal_jrt=1.0),
        JobRecord("j3", 0, submitted_at=0.7, num_tasks=4, ideal_jrt=2.0, rejected_reason="unknown user"),
    ]
    # 1.003 s of wall time, so throughput (2 completed tasks) is printed from a known figure.
    return (
        tasks,
        jobs,
        compute_metrics(tasks, jobs, CAPACITY, NAMES, wall_seconds=1.003, utilization_step=1.0, clock="virtual"),
    )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0015, "1.50 ms"),
        (0.0, "0.00 ms"),
        (0.99999, "999.99 ms"),
        (1.0, "1.000 s"),
        (1.003, "1.003 s"),
        (99.9994, "99.999 s"),
        (125.5, "125.5 s"),
        (32521.209, "32,521.2 s"),
    ],
)
def test_format_seconds(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


def test_format_seconds_of_nan_is_a_dash() -> None:
    assert format_seconds(math.nan) == "-"


def test_table_rows_and_totals() -> None:
    _, _, metrics = run()
    table = format_table(metrics, "replay of a test trace")
    lines = table.splitlines()
    assert lines[0] == "replay of a test trace"
    header = next(line for line in lines if "median" in line).split()
    assert header == ["n", "median", "mean", "p90", "p99", "p99.99", "max"]
    rows = {label: cells for label, *cells in (re.split(r"\s{2,}", line.strip()) for line in lines[3:9])}
    # Allocation times 3.5 ms and 1.5 ms: median = mean = 2.5 ms, p90 = 1.5 + 0.9 * 2 = 3.3 ms, p99 = 3.48 ms.
    assert " ".join(rows["allocation time"]) == "2 2.50 ms 2.50 ms 3.30 ms 3.48 ms 3.50 ms 3.50 ms"
    assert " ".join(rows["framework queuing"]) == "2 1.00 ms 1.00 ms 1.00 ms 1.00 ms 1.00 ms 1.00 ms"
    assert " ".join(rows["processing"]) == "2 0.50 ms 0.50 ms 0.50 ms 0.50 ms 0.50 ms 0.50 ms"
    assert " ".join(rows["worker queuing"]) == "2 0.00 ms 0.00 ms 0.00 ms 0.00 ms 0.00 ms 0.00 ms"
    # j1 took 5.0015 s for an ideal 5 s; j2 never finished and j3 was rejected.
    assert " ".join(rows["JRT delay"]) == "1 1.50 ms 1.50 ms 1.50 ms 1.50 ms 1.50 ms 1.50 ms"
    assert "tasks: 3  completed: 2  failed: 1  not completed exactly once: 0" in table
    assert "jobs: 3  rejected: 1" in table
    assert f"cpu {100 * CPU_MEAN:.1f} %" in table
    assert (
        "throughput: 2 tasks in 5.010 s of simulated time, replayed in 1.003 s of wall time: 2.0 tasks per wall second"
        in table
    )


def test_table_shows_dashes_without_data() -> None:
    metrics = compute_metrics([], [], CAPACITY, NAMES, wall_seconds=1.0)
    row = next(line for line in format_table(metrics, "empty").splitlines() if line.startswith("JRT delay"))
    assert row.split()[2:] == ["0", "-", "-", "-", "-", "-", "-"]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_write_outputs_files_match_the_records(tmp_path: Path) -> None:
    tasks, jobs, metrics = run()
    paths = write_outputs(metrics, tasks, jobs, tmp_path / "out", "test run", extra={"seed": 7, "gms": 2})
    assert set(paths) == {"tasks.csv", "jobs.csv", "summary.json", "utilization.csv", "cdf.png"}
    assert all(p.parent == tmp_path / "out" and p.exists() for p in paths.values())

    rows = read_csv(paths["tasks.csv"])
    assert [r["task_id"] for r in rows] == ["t1", "t2", "t3"]
    for row, record in zip(rows, tasks, strict=True):
        assert (row["job_id"], row["user"], int(row["lm"]), int(row["node"])) == (
            record.job_id,
            record.user,
            record.lm,
            record.node,
        )
        assert (int(row["request_cpu"]), int(row["request_mem"])) == record.request
        assert row["failed_reason"] == record.failed_reason
        for name in ("arrival", "started_at", "finished_at", "allocation_time", "communication", "worker_queuing"):
            value = float(row[name])
            assert value == getattr(record, name) or (math.isnan(value) and math.isnan(getattr(record, name)))
    assert float(rows[0]["allocation_time"]) == 0.0035
    assert math.isnan(float(rows[2]["allocation_time"]))

    job_rows = read_csv(paths["jobs.csv"])
    assert [r["job_id"] for r in job_rows] == ["j1", "j2", "j3"]
    assert float(job_rows[0]["jrt"]) == 5.0015
    assert float(job_rows[0]["jrt_delay"]) == pytest.approx(0.0015)
    assert job_rows[2]["rejected_reason"] == "unknown user"

    summary = json.loads(paths["summary.json"].read_text())
    assert summary["title"] == "test run"
    assert summary["extra"] == {"seed": 7, "gms": 2}
    assert summary["counts"]["tasks_failed"] == 1
    assert summary["counts"]["jobs_rejected"] == 1
    assert summary["summaries"]["allocation_time"]["median"] == pytest.approx(0.0025)
    assert summary["summaries"]["jrt_delay"]["count"] == 1
    assert summary["not_exactly_once"] == []
    assert summary["mean_utilization"]["cpu"] == pytest.approx(CPU_MEAN)

    utilization = read_csv(paths["utilization.csv"])
    # Averages over each second from the first start (t2 at 1.5 ms): t2, with t1 from 3.5 ms; both; t2 until 2.5 s,
    # t1 throughout; t1 alone, to its finish at 5.01 s.
    assert [float(r["time"]) for r in utilization] == pytest.approx(metrics.utilization.times.tolist(), abs=1e-6)
    fractions = [0.7495, 0.75, 0.49925, 0.25, 0.25, 0.25]
    assert [float(r["cpu_used_fraction"]) for r in utilization] == pytest.approx(fractions)
    assert [float(r["mem_used_fraction"]) for r in utilization] == pytest.approx(fractions)

    assert paths["cdf.png"].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert paths["cdf.png"].stat().st_size > 10_000


def _as_if_no_other_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The drawing child is forked only by a process of one thread (`megha replay`); an earlier test of this
    session may have left a thread (a library's idle worker) that the two tests below do not touch."""
    import threading

    monkeypatch.setattr(threading, "active_count", lambda: 1)


@ON_LINUX
def test_a_figure_process_writes_the_same_files_as_drawing_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks, jobs, metrics = run()
    in_process = write_outputs(metrics, tasks, jobs, tmp_path / "in", "test run")
    _as_if_no_other_threads(monkeypatch)
    drawer = FigureProcess.start()
    assert drawer is not None
    try:
        for seed in (1, 2):  # one child draws every figure of a command (`megha replay --seeds`)
            drawn = write_outputs(metrics, tasks, jobs, tmp_path / f"drawn-{seed}", "test run", drawer=drawer)
            for name, path in in_process.items():
                assert drawn[name].read_bytes() == path.read_bytes(), name
    finally:
        drawer.close()


@ON_LINUX
def test_a_figure_the_child_cannot_draw_fails_in_the_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks, jobs, metrics = run()
    _as_if_no_other_threads(monkeypatch)
    drawer = FigureProcess.start()
    assert drawer is not None
    try:
        drawer.draw(FigureData.of(metrics, tasks, jobs, "test run"), tmp_path / "no such folder" / "cdf.png")
        with pytest.raises(RuntimeError, match=r"drawing cdf\.png failed"):
            drawer.wait()
    finally:
        drawer.close()


def test_write_outputs_of_a_run_with_zero_and_missing_times(tmp_path: Path) -> None:
    tasks = [task("z", 1.0, 1.0, 2.0, (1, 1)), TaskRecord("q", "j1", 0, "u", 1.0, (1, 1), arrival=0.0)]
    metrics = compute_metrics(tasks, [], CAPACITY, NAMES, wall_seconds=0.0)
    paths = write_outputs(metrics, tasks, [], tmp_path, "zeros")
    summary = json.loads(paths["summary.json"].read_text())  # strict JSON: NaN is written as null
    assert summary["summaries"]["jrt_delay"] == {
        "count": 0,
        "median": None,
        "mean": None,
        "p90": None,
        "p99": None,
        "p9999": None,
        "max": None,
    }
    assert summary["tasks_per_wall_second"] is None
    assert summary["extra"] == {}
    assert paths["cdf.png"].stat().st_size > 0


def test_importing_the_report_does_not_import_matplotlib() -> None:
    code = "import sys, megha.loadgen.report; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_table_columns_stay_apart_when_times_reach_hours() -> None:
    # 7,823 tasks waiting from 0 to 26 hours (the scale of the README's fair-scheduling example).
    tasks = [task(f"t{i}", 0.0, 93_600.0 * i / 7822, 93_600.0 * i / 7822 + 10.0, (1, 1)) for i in range(7823)]
    metrics = compute_metrics(tasks, [], CAPACITY, NAMES, wall_seconds=1.0, clock="virtual")
    lines = format_table(metrics, "hours").splitlines()
    header, row = lines[2], next(line for line in lines if line.startswith("allocation time"))
    cells = re.split(r"\s{2,}", row.strip())
    assert cells[:3] == ["allocation time", "7,823", "46,800.0 s"]
    assert cells[-1] == "93,600.0 s"
    assert len(cells) == 8
    # Every cell ends where its column's heading ends.
    ends = [m.end() for m in re.finditer(r"\S+", header)]
    assert [m.end() for m in re.finditer(r"\S+(?: \S+)?", row)][1:] == ends


def test_counts_say_what_they_count() -> None:
    tasks, jobs, _ = run()
    tasks[0].repartitioned = True
    tasks[0].preemption_attempts, tasks[0].preemptions = 1, 3  # one request stopped three runs
    metrics = compute_metrics(tasks, jobs, CAPACITY, NAMES, wall_seconds=1.0, clock="virtual")
    table = format_table(metrics, "counts")
    assert "tasks placed by repartition: 1" in table
    assert "preemption requests: 1  runs stopped by preemption: 3" in table
    assert not re.search(r"(?<!by )(repartitions|preemptions):", table)
    counters = format_counters(
        "megha", {"repartitions": 6438, "inconsistencies": 950, "preemption_attempts": 1160, "preemptions": 1288}
    )
    assert "repartitioned placements: 6,438" in counters
    assert "inconsistencies: 950" in counters
    assert "preemption requests: 1,160  runs stopped by preemption: 1,288" in counters
    assert not re.search(r"(repartitions|preemptions):", counters)


def test_an_empty_run_shows_dashes_not_nan() -> None:
    table = format_table(compute_metrics([], [], CAPACITY, NAMES, wall_seconds=1.0), "empty")
    assert "nan" not in table.lower()
    assert "mean utilization: cpu -  mem -" in table


def test_a_wall_clock_run_is_not_called_simulated() -> None:
    tasks, jobs, _ = run()
    metrics = compute_metrics(tasks, jobs, CAPACITY, NAMES, wall_seconds=8.0, clock="wall")
    table = format_table(metrics, "a real deployment")
    assert "simulated" not in table
    assert "throughput: 2 tasks completed in 8.000 s of wall time: 0.2 tasks per second" in table
    assert "(first arrival to last finish: 5.010 s)" in table


def test_no_warning_for_a_run_that_mostly_worked() -> None:
    assert run_warnings(run()[2]) == []  # 1 of 3 tasks failed, 1 of 3 jobs rejected


def test_warnings_when_most_tasks_fail_or_most_jobs_are_rejected() -> None:
    tasks, jobs, _ = run()
    for i, constraints in enumerate(("[5, 6]", "[1, 2, 3]", "[5, 6]")):
        tasks.append(
            TaskRecord(
                f"r{i}",
                "j3",
                0,
                "bob",
                1.0,
                (1, 1),
                failed_reason=f"rejected at submission: no node satisfies placement constraints {constraints}",
            )
        )
    jobs[1].rejected_reason = "no node satisfies placement constraints [5, 6]"
    metrics = compute_metrics(tasks, jobs, CAPACITY, NAMES, wall_seconds=1.0)
    warnings = run_warnings(metrics)
    assert len(warnings) == 2
    tasks_warning, jobs_warning = warnings
    assert tasks_warning.startswith("4 of 6 tasks failed (66.7 %)")
    assert "rejected at submission: no node satisfies placement constraints (3 tasks)" in tasks_warning
    assert "no node satisfies the constraints (1 task)" in tasks_warning
    assert "--no-constraints" in tasks_warning
    assert jobs_warning.startswith("2 of 3 jobs were rejected (66.7 %)")
    assert "no node satisfies placement constraints (1 job); unknown user (1 job)" in jobs_warning


def test_warning_for_a_run_without_jobs() -> None:
    metrics = compute_metrics([], [], CAPACITY, NAMES, wall_seconds=1.0)
    assert run_warnings(metrics) == ["the trace held no jobs: nothing was measured"]


def test_csv_files_hold_rounded_numbers_under_names_that_say_what_they_are(tmp_path: Path) -> None:
    t = task("t", 0.9005, 0.9014999999999999, 1.0014999999999998, (3, 5))
    t.launched_at = 0.9009999999999999
    jobs = [JobRecord("j1", 0, 0.9005, 1, 0.1, finished_tasks=1, finished_at=1.0014999999999998)]
    metrics = compute_metrics([t], jobs, (3000, 7000), NAMES, wall_seconds=1.0, utilization_step=0.0301)
    paths = write_outputs(metrics, [t], jobs, tmp_path, "rounding")
    texts = {name: paths[name].read_text() for name in ("tasks.csv", "jobs.csv", "utilization.csv")}
    for name, text in texts.items():
        assert not re.search(r"\.\d{7,}", text), (name, text)
    assert read_csv(paths["tasks.csv"])[0]["launched_at"] == "0.901"
    assert texts["utilization.csv"].splitlines()[0] == "time,cpu_used_fraction,mem_used_fraction"
    assert read_csv(paths["utilization.csv"])[0]["cpu_used_fraction"] == "0.001"


def test_csv_files_are_written_as_the_csv_module_writes_them(tmp_path: Path) -> None:
    quoted = task('t,"1"', 0.0, 0.0035, 5.01, (1000, 2000))
    quoted.failed_reason = 'lost: "worker 3", then\nrestarted'
    quoted.decided_at = quoted.attempt_at - 1e-9  # processing rounds to -0.0
    quoted.repartitioned = True
    never = TaskRecord("t2", "j,1", 1, "bob", 2.5, (1, 1), failed_reason="plain")  # NaN times
    zero = task("t3", 0.0, 0.0035, 5.01, (1000, 2000))
    zero.decided_at = zero.attempt_at  # processing 0.0, not to be written as the -0.0 above
    jobs = [JobRecord("j,1", 1, 0.0, 3, 5.0065)]
    metrics = compute_metrics([quoted, never, zero], jobs, CAPACITY, NAMES, wall_seconds=1.0)
    paths = write_outputs(metrics, [quoted, never, zero], jobs, tmp_path, "quoting")
    for name in ("tasks.csv", "jobs.csv", "utilization.csv"):
        with paths[name].open(newline="") as handle:
            text = handle.read()
        rewritten = io.StringIO()
        csv.writer(rewritten).writerows(csv.reader(io.StringIO(text)))
        assert text == rewritten.getvalue(), name
    first, second, third = read_csv(paths["tasks.csv"])
    assert (first["task_id"], first["failed_reason"]) == (quoted.task_id, quoted.failed_reason)
    assert (first["processing"], third["processing"]) == ("-0.0", "0.0")
    assert (first["repartitioned"], first["finished_at"]) == ("True", "5.01")
    assert (second["job_id"], second["started_at"], second["node"], second["repartitioned"]) == (
        "j,1",
        "nan",
        "-1",
        "False",
    )
    assert read_csv(paths["jobs.csv"])[0]["job_id"] == "j,1"


def test_a_report_folder_is_never_overwritten_silently(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "mine"
    assert report_dir(out, tmp_path / "default", overwrite=False) == out  # new: fine
    tasks, jobs, metrics = run()
    write_outputs(metrics, tasks, jobs, out, "first")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(out))} already holds a report.*--overwrite") as info:
        report_dir(out, tmp_path / "default", overwrite=False)
    assert "\n" not in str(info.value)
    assert report_dir(out, tmp_path / "default", overwrite=True) == out
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert report_dir(tmp_path / "other", tmp_path / "default", overwrite=False) == tmp_path / "other"


def test_without_a_folder_each_report_gets_a_new_one(tmp_path: Path) -> None:
    root = tmp_path / "out" / "replay"
    first = report_dir(None, root, overwrite=False)
    assert first.parent == root and re.fullmatch(r"\d{8}-\d{6}", first.name) and first.is_dir()
    second = report_dir(None, root, overwrite=False)
    assert second != first and second.parent == root and second.is_dir()
    # A run that ends before writing its report leaves no empty folder behind, nor the folders made above it.
    forget_report_dir(second)
    assert not second.exists() and first.is_dir()
    forget_report_dir(first)
    assert not (tmp_path / "out").exists()


def test_runs_started_together_without_a_folder_each_get_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs that pick their folder at the same time (the same second) never share one: each makes its own."""
    monkeypatch.setattr(report.time, "strftime", lambda _: "20261201-000000")
    root = tmp_path / "out" / "replay"
    start = threading.Barrier(8)

    def claim() -> Path:
        start.wait()
        return report_dir(None, root, overwrite=False)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        folders = list(pool.map(lambda _: claim(), range(8)))
    assert len(set(folders)) == 8 and all(f.is_dir() for f in folders)


@pytest.mark.parametrize("drawn_by", ["this process", "a child"])
def test_a_report_stopped_while_written_leaves_the_folder_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, drawn_by: str
) -> None:
    """Ctrl-C while the files are written: the old report stays whole (no mix of old and new files) and no
    partial file is left."""
    out = tmp_path / "out"
    tasks, jobs, metrics = run()
    write_outputs(metrics, tasks, jobs, out, "first")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "_write_utilization", interrupted)  # after tasks.csv, jobs.csv and summary.json
    drawer = None
    if drawn_by == "a child":
        if sys.platform != "linux":
            pytest.skip("the figure process is forked on Linux only")
        _as_if_no_other_threads(monkeypatch)
        drawer = FigureProcess.start()
        assert drawer is not None
    try:
        with pytest.raises(KeyboardInterrupt):
            write_outputs(metrics, tasks[:1], jobs[:1], out, "second", drawer=drawer)
    finally:
        if drawer is not None:
            drawer.close()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


TINY_REPLAY = ("--trace", "syn:3:3", "--lms", "1", "--gms", "1", "--workers-per-partition", "4", "--no-constraints")


def test_a_replay_piped_into_a_reader_that_stops_exits_quietly(tmp_path: Path) -> None:
    """`megha replay | head`: the reader going away is no usage error (status 2) and prints no error line."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "megha.cli", "replay", *TINY_REPLAY, "--quiet", "--out", str(tmp_path / "out")],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 1 and "error" not in done.stderr, done.stderr


def _spread_run(allocations: list[float], request: tuple[int, int]) -> tuple[list[TaskRecord], list[JobRecord]]:
    tasks = [task(f"t{i}", 0.0, a, a + 1.0 + i % 7, request) for i, a in enumerate(allocations)]
    jobs = [JobRecord("j1", 0, 0.0, len(tasks), 1.0, len(tasks), max((t.finished_at for t in tasks), default=0.0))]
    return tasks, jobs


PLOT_CAPACITY = (1_204_000, 2_408_000)
PLOT_SCALES = {
    # The default run: every allocation 1 ms but one of 2 ms; CPU and memory held alike, 2.5 % of the data centre.
    "milliseconds, nearly all equal": _spread_run([0.001] * 300 + [0.002], (100, 200)),
    "milliseconds to a day": _spread_run([0.001 * 10 ** (i / 40) for i in range(321)], (900, 500)),
    "all zero": _spread_run([0.0] * 50, (4000, 8000)),
    "nothing ran": ([], []),
}


def _overlaps(boxes: list[object]) -> list[tuple[object, object]]:
    return [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if a.overlaps(b)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("scale", sorted(PLOT_SCALES))
def test_plots_are_readable_at_every_scale(scale: str) -> None:
    tasks, jobs = PLOT_SCALES[scale]
    metrics = compute_metrics(tasks, jobs, PLOT_CAPACITY, NAMES, wall_seconds=1.0)
    figure = cdf_figure(metrics, tasks, jobs, f"plot at the scale of {scale}")
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    for axes in figure.axes:
        for ticks in (axes.get_xticklabels(), axes.get_yticklabels()):
            boxes = [t.get_window_extent(renderer) for t in ticks if t.get_visible() and t.get_text()]
            assert not _overlaps(boxes), (axes.get_xlabel(), [t.get_text() for t in ticks])
        legend = axes.get_legend()
        if legend is not None:  # beside the data, never over it
            box = legend.get_window_extent(renderer)
            for line in axes.get_lines():
                points = line.get_transform().transform(line.get_xydata())
                assert not any(box.contains(x, y) for x, y in points), f"the legend covers {line.get_label()}"
    util = figure.axes[2]
    lines = [line for line in util.get_lines() if line.get_label() and not line.get_label().startswith("_")]
    styles = [line.get_linestyle() for line in lines]
    assert len(set(styles)) == len(styles), "one line would hide another"
    if tasks:
        peak = max(max(line.get_ydata()) for line in lines)
        assert peak > 0 and util.get_ylim()[1] <= max(2 * peak, 2.0), "the data uses the height of the plot"
    for axes in figure.axes[:2]:  # every CDF is drawn, even of a single value
        assert all(len(line.get_xdata()) >= 2 for line in axes.get_lines())


def test_no_drawing_child_is_forked_while_other_threads_run() -> None:
    """A fork copies only the forking thread; a lock another thread held (the import lock, say) would stay held in
    the child for ever, so with other threads running the figure is drawn in process."""
    import threading

    from megha.loadgen.figure_process import FigureProcess

    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert FigureProcess.start() is None
    finally:
        release.set()
        other.join()
