"""A run too large for the machine's memory is refused in one line before it is built (common/memory_budget.py):
`megha replay` and `megha local` sized by a typo would otherwise build for minutes and then be killed."""

from __future__ import annotations

from pathlib import Path

import pytest
from clikit import run_cli

from megha.common import memory_budget
from megha.common.memory_budget import GB, MemoryBudgetError, check_fits
from megha.loadgen import replay as replay_module
from megha.loadgen.replay import NODE_VIEW_BYTES, REPLAY_TASK_BYTES, ReplayConfig, replay


def test_a_need_over_the_room_is_refused_naming_both_and_the_advice() -> None:
    check_fits(2 * GB, "this run", "do less", available=2 * GB)  # exactly the room: it fits
    with pytest.raises(MemoryBudgetError) as caught:
        check_fits(3 * GB, "this run", "do less", available=2 * GB)
    assert str(caught.value) == (
        "this run would need about 3.0 GB of memory, more than the 2.0 GB this machine has available; do less"
    )


def test_without_a_reading_of_the_room_nothing_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: None)
    check_fits(1 << 60, "this run", "do less")


def test_the_room_is_memavailable_or_less_under_a_cgroup_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n")
    assert memory_budget._meminfo_available(meminfo) == 20000000 * 1024
    assert memory_budget._meminfo_available(tmp_path / "none") is None
    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    usage.write_text("1073741824\n")
    limit.write_text("max\n")
    assert memory_budget._cgroup_room(((limit, usage),)) is None  # v2 without a limit
    limit.write_text("9223372036854771712\n")
    assert memory_budget._cgroup_room(((limit, usage),)) is None  # v1 without a limit
    limit.write_text(f"{4 * GB}\n")
    assert memory_budget._cgroup_room(((tmp_path / "v2-missing", usage), (limit, usage))) == 3 * GB
    monkeypatch.setattr(memory_budget, "_meminfo_available", lambda: 20 * GB)
    monkeypatch.setattr(memory_budget, "_cgroup_room", lambda: 3 * GB)
    assert memory_budget.available_bytes() == 3 * GB
    monkeypatch.setattr(memory_budget, "_cgroup_room", lambda: None)
    assert memory_budget.available_bytes() == 20 * GB


def test_a_replay_is_measured_against_the_room_before_its_workload_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[int] = []
    monkeypatch.setattr(replay_module, "trace_workload", lambda *a: built.append(1) or [])
    # 100,000 tasks on 10,000 nodes with five GMs: 6 copies of each node's state
    need = 100_000 * REPLAY_TASK_BYTES + 10_000 * 6 * NODE_VIEW_BYTES
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: need - 1)
    with pytest.raises(MemoryBudgetError, match=r"this replay \(100,000 tasks on 10,000 nodes, 6 copies"):
        replay(ReplayConfig(trace="syn:1000:100"))
    assert not built
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: need)
    result = replay(ReplayConfig(trace="syn:1000:100"))  # the room it needs: it runs (with the stubbed workload)
    assert built == [1] and result.metrics.tasks == 0


def test_a_trace_file_is_counted_as_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tmp_path / "t.tr"
    trace.write_text("".join(f"{k} 3 1.0 1.0 1.0 1.0\n" for k in range(4)))  # 12 tasks
    need = 12 * REPLAY_TASK_BYTES + 10_000 * 6 * NODE_VIEW_BYTES
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: need - 1)
    with pytest.raises(MemoryBudgetError, match=r"this replay \(12 tasks on 10,000 nodes"):
        replay(ReplayConfig(trace=str(trace)))


def test_a_synthetic_trace_too_large_is_one_line_from_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: 1 * GB)
    argv = ["replay", "--quiet", "--trace", "syn:100000000:1", "--out", str(tmp_path / "out")]
    status, err = run_cli(argv, capsys)
    assert status == 2, err
    assert err.startswith("megha replay: error: this replay (100,000,000 tasks on 10,000 nodes"), err
    assert err.endswith("replay fewer jobs (--first-jobs) or a smaller data centre"), err
    assert not (tmp_path / "out").exists()


def test_megha_local_refuses_more_processes_than_the_memory_holds_before_starting_any(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["local", "--lms", "100000", "--workers-per-lm", "100", "--out", str(tmp_path / "out")]
    status, err = run_cli(argv, capsys)
    assert status == 2, err
    assert err.startswith(
        "megha local: error: --gms 2, --lms 100000 and --workers-per-lm 100 (10,100,002 service processes) would "
        "need about"
    ), err
    assert not (tmp_path / "out").exists()
