"""Traces: parsing `.tr` files, their errors, first_n and time_scale, the syn generator and the demo trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from megha.loadgen.trace import (
    TraceError,
    TraceJob,
    demo_trace_path,
    read_trace,
    resolve_trace,
    synthetic_trace,
)

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture
def shared_traces() -> Path:
    traces = SHARED / "traces"
    if not traces.is_dir():
        pytest.skip(f"needs the traces in {traces} (../shared is missing)")
    return traces


def write(tmp_path: Path, text: str, name: str = "t.tr") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode())
    return path


def test_parse_shifts_arrivals_and_tolerates_whitespace(tmp_path: Path) -> None:
    path = write(tmp_path, "10 2 1.5 1 2 \n\n  \n12.5 1 3 3\r\n13 3 1 1 1 1   \n")
    assert read_trace(path) == [
        TraceJob(0.0, (1.0, 2.0)),
        TraceJob(2.5, (3.0,)),
        TraceJob(3.0, (1.0, 1.0, 1.0)),
    ]


def test_empty_trace(tmp_path: Path) -> None:
    assert read_trace(write(tmp_path, "\n\n")) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0 1 1 1\n\n5 3 1 1 1\n", r"line 3: num_tasks is 3 but the line has 2 task durations"),
        ("0 1 1 1\n1 1 1\n", r"line 2: got 3 fields"),
        ("x 1 1 1\n", r"line 1: arrival_time 'x' is not a number"),
        ("0 1.5 1 1\n", r"line 1: num_tasks '1.5' is not an integer"),
        ("0 1 mean 1\n", r"line 1: mean_task_duration 'mean' is not a number"),
        ("0 2 1 1 one\n", r"line 1: task duration 'one' is not a number"),
        ("0 1 1 -1\n", r"line 1: task duration -1 must be a finite number >= 0"),
        ("0 1 1 nan\n", r"line 1: task duration nan must be a finite number >= 0"),
        ("-1 1 1 1\n", r"line 1: arrival_time -1 must be a finite number >= 0"),
        ("0 0 0 1\n", r"line 1: num_tasks is 0"),
        ("5 1 1 1\n4 1 1 1\n", r"line 2: arrival 4 precedes the previous job's 5"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(TraceError, match=message) as info:
        read_trace(path)
    assert str(path) in str(info.value)


def test_first_n_reads_lazily(tmp_path: Path) -> None:
    path = write(tmp_path, "1 1 1 1\n2 1 2 2\nthis line is broken\n")
    assert read_trace(path, first_n=2) == [TraceJob(0.0, (1.0,)), TraceJob(1.0, (2.0,))]
    assert read_trace(path, first_n=0) == []
    with pytest.raises(TraceError, match="line 3"):
        read_trace(path)


def test_time_scale_multiplies_arrivals_and_durations(tmp_path: Path) -> None:
    path = write(tmp_path, "100 1 4 4\n102 2 3 2 4\n")
    assert read_trace(path, time_scale=0.5) == [TraceJob(0.0, (2.0,)), TraceJob(1.0, (1.0, 2.0))]
    with pytest.raises(ValueError, match="time_scale"):
        read_trace(path, time_scale=0)


def test_whole_seconds_truncates_the_files_durations_toward_zero_before_the_time_scale(tmp_path: Path) -> None:
    path = write(tmp_path, "100 3 1.4 0.4 1.9 2.0\n101 1 3.999 3.999\n")
    assert read_trace(path) == [TraceJob(0.0, (0.4, 1.9, 2.0)), TraceJob(1.0, (3.999,))]
    whole = [TraceJob(0.0, (0.0, 1.0, 2.0)), TraceJob(1.0, (3.0,))]
    assert read_trace(path, whole_seconds=True) == whole
    assert read_trace(path, time_scale=0.5, whole_seconds=True) == [
        TraceJob(0.0, (0.0, 0.5, 1.0)),
        TraceJob(0.5, (1.5,)),
    ]
    assert resolve_trace(str(path), whole_seconds=True) == whole
    assert resolve_trace("syn:3:2", whole_seconds=True) == synthetic_trace(3, 2)


def test_dephase_moves_each_later_job_of_a_shared_arrival_a_hundredth_of_a_second_on(tmp_path: Path) -> None:
    """As the constraint-aware paper's simulator reads a trace: the k-th job arriving with an earlier one comes
    k x 0.01 s after it (before the time scale); a job of its own arrival time stays where it is."""
    path = write(tmp_path, "100 1 1 1\n100 1 1 1\n100 1 1 1\n101 1 1 1\n101 1 1 1\n")
    assert [j.arrival for j in read_trace(path)] == [0.0, 0.0, 0.0, 1.0, 1.0]
    dephased = [j.arrival for j in read_trace(path, dephase=True)]
    assert dephased == pytest.approx([0.0, 0.01, 0.02, 1.0, 1.01])
    scaled = [j.arrival for j in read_trace(path, time_scale=2.0, dephase=True)]
    assert scaled == pytest.approx([0.0, 0.02, 0.04, 2.0, 2.02])
    assert [j.arrival for j in resolve_trace(str(path), dephase=True)] == pytest.approx(dephased)
    assert resolve_trace("syn:3:2", dephase=True) == synthetic_trace(3, 2)


def test_synthetic_trace_shape() -> None:
    jobs = synthetic_trace(3, 4, task_duration=2.0, interval=0.5)
    assert [job.arrival for job in jobs] == [0.0, 0.5, 1.0, 1.5]
    assert all(job.durations == (2.0, 2.0, 2.0) for job in jobs)


@pytest.mark.shared
def test_synthetic_trace_equals_shipped_syn_250(shared_traces: Path) -> None:
    shipped = read_trace(shared_traces / "syn_250.0.tr", first_n=200)
    assert shipped == synthetic_trace(250, 200)


def test_resolve_trace_synthetic_spec() -> None:
    assert resolve_trace("syn:250:200") == synthetic_trace(250, 200)
    assert resolve_trace("syn:10:200", first_n=5, time_scale=2.0) == synthetic_trace(
        10, 5, task_duration=2.0, interval=2.0
    )


def test_resolve_trace_path(tmp_path: Path) -> None:
    path = write(tmp_path, "3 1 1 1\n4 1 1 1\n5 1 1 1\n")
    assert resolve_trace(str(path), first_n=2, time_scale=3.0) == read_trace(path, first_n=2, time_scale=3.0)


@pytest.mark.parametrize("spec", ["syn:250", "syn:a:2", "syn:0:5", "syn:1:2:3", "no/such/file.tr"])
def test_resolve_trace_rejects_unknown_specs(spec: str) -> None:
    with pytest.raises(TraceError, match="syn:<tasks_per_job>:<num_jobs>"):
        resolve_trace(spec)


def test_demo_trace_is_small_and_parses() -> None:
    path = demo_trace_path()
    assert path.is_file()
    assert path.stat().st_size < 150_000
    jobs = read_trace(path)
    assert len(jobs) == 100
    assert jobs[0].arrival == 0.0
    assert sum(len(job.durations) for job in jobs) == 7823


@pytest.mark.shared
def test_demo_trace_is_the_head_of_the_google_subtrace(shared_traces: Path) -> None:
    assert read_trace(demo_trace_path()) == read_trace(shared_traces / "GOOG_subtrace.tr", first_n=100)


@pytest.mark.parametrize("data", [b"\x7fELF\x02\x01\x01\x00\x00\xf0\x9f", b"0 1 1 1\n\xff\xfe1 2 3\n"])
def test_a_binary_file_is_refused_naming_it(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "binary.tr"
    path.write_bytes(data)
    with pytest.raises(TraceError, match="not a text trace") as info:
        read_trace(path)
    assert str(path) in str(info.value)
    with pytest.raises(TraceError, match="not a text trace"):
        resolve_trace(str(path))
