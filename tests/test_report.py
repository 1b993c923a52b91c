"""The run report: time formatting, the text table, and the files written for a run."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from megha.loadgen.metrics import RunMetrics, compute_metrics
from megha.loadgen.records import JobRecord, TaskRecord
from megha.loadgen.report import format_seconds, format_table, write_outputs

NAMES = ("cpu", "mem")
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
    return tasks, jobs, compute_metrics(tasks, jobs, CAPACITY, NAMES, wall_seconds=1.003, utilization_step=1.0)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0015, "1.50 ms"),
        (0.0, "0.00 ms"),
        (0.99999, "999.99 ms"),
        (1.0, "1.000 s"),
        (1.003, "1.003 s"),
        (125.5, "125.500 s"),
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
    rows = {line[:18].strip(): line[18:].split() for line in lines[3:9]}
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
    assert "2 tasks in 5.010 s simulated, 1.003 s wall: 2.0 tasks per wall second" in table


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
    # Samples every second from the first start (t2 at 1.5 ms): t2 alone, both (t1 from 3.5 ms), t1 alone (from 2.5 s).
    assert [float(r["time"]) for r in utilization] == metrics.utilization.times.tolist()
    assert [float(r["cpu"]) for r in utilization] == [0.5, 0.75, 0.75, 0.25, 0.25, 0.25]
    assert [float(r["mem"]) for r in utilization] == [0.5, 0.75, 0.75, 0.25, 0.25, 0.25]

    assert paths["cdf.png"].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert paths["cdf.png"].stat().st_size > 10_000


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
