"""End-to-end replays through the embedded system, and the `megha replay` command line."""

from __future__ import annotations

import csv
import json
import math
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from megha.cli import main
from megha.common.clusterfile import save_cluster
from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.constraints import ALL_CONSTRAINTS_MASK
from megha.embedded import faults as faults_module
from megha.embedded.faults import Fault, Faults
from megha.loadgen.replay import ReplayConfig, replay


def _assert_nothing_lost(result) -> None:  # type: ignore[no-untyped-def]
    m = result.metrics
    assert m.not_exactly_once == ()
    assert m.tasks_completed + m.tasks_failed == m.tasks
    assert all(rec.completions == 1 for rec in result.recorder.tasks.values() if not rec.failed_reason)
    assert all(lm.is_idle() for lm in result.system.lms), "some LM did not get all its resources back"


def test_small_generated_replay_completes_every_task_once_with_three_hops_of_delay() -> None:
    result = replay(ReplayConfig(trace="syn:40:30", lms=2, gms=3, workers_per_partition=30))
    _assert_nothing_lost(result)
    m = result.metrics
    assert m.tasks == 1200 and m.jobs == 30
    # Submit -> GM -> LM -> worker is three hops of 0.5 ms: no job can beat 1.5 ms of JRT delay.
    assert m.jrt_delay.count + m.jobs_rejected == 30
    assert m.jrt_delay.median >= 0.0015 - 1e-9
    assert m.allocation_time.median >= 0.001 - 1e-9
    assert math.isclose(m.components["communication"].median, 0.001, rel_tol=1e-6)


def _versatile_cluster(
    path: Path, lms: int, gms: int, per_partition: int, node: tuple[int, int] = (64000, 16384)
) -> str:
    """A cluster file whose nodes satisfy every constraint, so no job is rejected."""
    spec = ClusterSpec(
        tuple(
            tuple(
                PartitionSpec(lm, gm, (node,) * per_partition, (ALL_CONSTRAINTS_MASK,) * per_partition)
                for gm in range(gms)
            )
            for lm in range(lms)
        )
    )
    save_cluster(spec, path)
    return str(path)


def test_overloaded_cluster_queues_tasks_and_still_completes_every_one(tmp_path: Path) -> None:
    # 2 LMs x 2 GMs x 2 workers = 8 slots for 60 one-second tasks arriving at once.
    cluster = _versatile_cluster(tmp_path / "c.json", 2, 2, 2)
    result = replay(ReplayConfig(trace="syn:20:3", cluster=cluster, seed=3))
    _assert_nothing_lost(result)
    m = result.metrics
    assert m.jobs_rejected == 0 and m.tasks_completed == 60
    assert m.reschedules > 0 and m.repartitions > 0
    assert m.allocation_time.max > 1.0  # some task waited for a whole task to finish


def test_scaled_mode_shares_workers_between_tasks(tmp_path: Path) -> None:
    cluster = _versatile_cluster(tmp_path / "c.json", 1, 2, 2, node=(2000, 4096))
    result = replay(ReplayConfig(trace="syn:50:5", mode="scaled", cluster=cluster))
    _assert_nothing_lost(result)
    m = result.metrics
    assert m.jobs_rejected == 0 and m.tasks_completed == 250
    assert len({(rec.lm, rec.node) for rec in result.recorder.tasks.values()}) <= 4


def test_min_constraints_matching_runs_the_same_workload() -> None:
    result = replay(ReplayConfig(trace="syn:40:10", lms=2, gms=2, workers_per_partition=20, matching="min-constraints"))
    _assert_nothing_lost(result)


def test_realtime_mode_runs_on_the_wall_clock() -> None:
    result = replay(
        ReplayConfig(trace="syn:5:3", time_scale=0.1, lms=1, gms=1, workers_per_partition=10, realtime=True)
    )
    _assert_nothing_lost(result)
    # Sleeping until each event is due means the run cannot take less wall time than it simulates.
    assert result.wall_seconds >= result.metrics.span * 0.99


def test_reference_replay_of_syn_250_meets_the_published_delays(syn_250: Path, reference_cluster: Path) -> None:
    result = replay(ReplayConfig(trace=str(syn_250), first_jobs=200, cluster=str(reference_cluster)))
    _assert_nothing_lost(result)
    m = result.metrics
    assert m.jobs == 200
    assert m.jrt_delay.median < 0.010, m.jrt_delay
    assert m.jrt_delay.p99 < 2.0, m.jrt_delay
    # Jobs holding a task no node of the reference cluster satisfies are rejected at submission, not lost.
    for job in result.recorder.jobs.values():
        if job.rejected_reason:
            assert "no node satisfies placement constraints" in job.rejected_reason


# 50 tasks on 20 nodes that satisfy every constraint: a healthy run, done in a fraction of a second.
SMALL_REPLAY = ["replay", "--trace", "syn:10:5", "--lms", "1", "--gms", "2", "--workers-per-partition", "10"]
SMALL_REPLAY += ["--no-constraints", "--quiet"]


def test_cli_replay_prints_the_report_and_writes_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*SMALL_REPLAY, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "allocation time" in out and "JRT delay" in out and "tasks: 50  completed: 50  failed: 0" in out
    for name in ("tasks.csv", "jobs.csv", "summary.json", "utilization.csv", "cdf.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_cli_truncate_durations_runs_each_task_for_its_whole_seconds_and_a_task_under_1_s_for_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "short.tr"
    trace.write_text("5 2 1.55 0.4 2.7\n6 1 0.6 0.6\n")
    argv = [*SMALL_REPLAY, "--trace", str(trace), "--no-files"]
    assert main(argv) == 0
    assert "tasks: 3  completed: 3  failed: 0" in capsys.readouterr().out
    out = tmp_path / "report"
    assert main([*argv[:-1], "--truncate-durations", "--out", str(out)]) == 0
    assert "tasks: 3  completed: 3  failed: 0" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["extra"]["config"]["truncate_durations"] is True
    tasks = {row["task_id"]: row for row in csv.DictReader((out / "tasks.csv").open())}
    ran = {task: float(row["finished_at"]) - float(row["started_at"]) for task, row in tasks.items()}
    assert {task: float(row["duration"]) for task, row in tasks.items()} == {"j0.0": 0.0, "j0.1": 2.0, "j1.0": 0.0}
    assert ran == pytest.approx({"j0.0": 0.0, "j0.1": 2.0, "j1.0": 0.0})
    jobs = {row["job_id"]: row for row in csv.DictReader((out / "jobs.csv").open())}
    assert [float(jobs[j]["ideal_jrt"]) for j in ("j0", "j1")] == [2.0, 0.0]
    assert all(0 < float(jobs[j]["jrt_delay"]) < 0.01 for j in ("j0", "j1"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lms", "0"], "--lms: must be at least 1"),
        (["--hop-delay", "-1"], "--hop-delay: must be >= 0"),
        (["--matching", "best"], "--matching: invalid choice"),
        (["--mode", "big"], "--mode: invalid choice"),
        (["--retry", "1100:0"], "max_attempts is 1..100"),  # 2.0 ** 1100 overflowed mid-run
        (["--out", ""], "--out: is empty: name a folder"),  # it wrote the report into the current folder
    ],
)
def test_cli_rejects_bad_options_naming_them(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["replay", *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_reports_a_missing_trace_file_as_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--trace", "no/such/file.tr", "--no-files", "--quiet"]) == 2
    assert "no/such/file.tr" in capsys.readouterr().err


def test_realtime_mode_records_wall_clock_times() -> None:
    config = ReplayConfig(trace="syn:5:3", time_scale=0.1, lms=1, gms=1, workers_per_partition=10)
    virtual, real = replay(config), replay(replace(config, realtime=True))
    assert (virtual.metrics.clock, real.metrics.clock) == ("virtual", "wall")
    # Deciding takes no time on the virtual clock, and the CPU time it takes on the wall clock.
    assert virtual.metrics.components["processing"].max == 0.0
    assert real.metrics.components["processing"].median > 0.0
    assert real.metrics.span <= real.wall_seconds


def test_replay_takes_faults_under_their_own_name() -> None:
    faults = Faults(at=(Fault("worker", 1.0, 0, 0, down=20.0),), detect=2.0)
    result = replay(ReplayConfig(trace="syn:10:5", lms=1, gms=1, workers_per_partition=10, faults=faults))
    _assert_nothing_lost(result)
    assert result.system.counters()["worker_crashes"] == 1
    assert not hasattr(faults_module, "WorkerFaults")


def _readme_replays(needle: str) -> list[list[str]]:
    """The `megha replay` examples of the README that contain `needle`, as argument lists."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text().replace("\\\n", " ")
    return [
        shlex.split(line.split("#")[0])[1:]
        for line in text.splitlines()
        if line.startswith(".venv/bin/megha replay") and needle in line
    ]


@pytest.mark.parametrize("example", _readme_replays("--trace demo"), ids=lambda argv: " ".join(argv[2:8]))
def test_readme_demo_examples_run_without_warnings(
    example: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*example, "--out", str(tmp_path / "out"), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "WARNING" not in err, err
    assert "failed: 0" in out, out


def test_readme_has_the_scaled_demo_example() -> None:
    assert any("--mode scaled" in " ".join(argv) and "--queues" not in argv for argv in _readme_replays("demo"))


SCALED_DEMO_ON_80_NODES = ["replay", "--trace", "demo", "--mode", "scaled", "--lms", "2", "--gms", "2"]
SCALED_DEMO_ON_80_NODES += ["--workers-per-partition", "20", "--node-cpu", "2000", "--node-mem", "4096", "--quiet"]


def test_cli_warns_loudly_and_fails_when_most_tasks_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The README's old example: 80 nodes cannot satisfy most of the demo trace's placement constraints.
    assert main([*SCALED_DEMO_ON_80_NODES, "--out", str(tmp_path / "out")]) == 3
    err = capsys.readouterr().err
    assert "WARNING: 7,720 of 7,823 tasks failed (98.7 %)" in err
    assert "WARNING: 34 of 100 jobs were rejected (34.0 %)" not in err  # a third is not most
    assert "--no-constraints" in err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["warnings"] and summary["warnings"][0].startswith("7,720 of 7,823 tasks failed")


def test_cli_refuses_to_overwrite_a_report_unless_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = SMALL_REPLAY
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 0
    first = (out / "tasks.csv").stat().st_mtime_ns
    capsys.readouterr()
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out) in err and "--overwrite" in err
    assert (out / "tasks.csv").stat().st_mtime_ns == first
    assert main([*argv, "--out", str(out), "--overwrite"]) == 0
    assert (out / "tasks.csv").stat().st_mtime_ns != first


def test_cli_without_out_writes_each_report_to_a_new_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = SMALL_REPLAY
    assert main(argv) == 0
    (first,) = (tmp_path / "out" / "replay").iterdir()
    assert str(first.relative_to(tmp_path)) in capsys.readouterr().out
    assert main(argv) == 0
    assert len(list((tmp_path / "out" / "replay").iterdir())) == 2


def test_cli_help_explains_output_folders_and_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--overwrite" in text and "out/replay/<date>-<time>" in text
    assert "exit status: 0" in text and "3 most tasks failed or most jobs were rejected" in text


def test_cli_names_the_two_repartition_counts_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = _versatile_cluster(tmp_path / "c.json", 2, 2, 2)
    assert main(["replay", "--trace", "syn:20:3", "--cluster", cluster, "--no-files", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "tasks placed by repartition: " in out and "repartitioned placements: " in out
    assert not re.search(r"(?<!by )(repartitions|preemptions):", out)


def test_cli_dephase_arrivals_submits_a_job_sharing_an_arrival_a_hundredth_of_a_second_later(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "together.tr"
    trace.write_text("5 1 1 1\n5 1 1 1\n5 1 1 1\n")
    out = tmp_path / "report"
    assert main([*SMALL_REPLAY, "--trace", str(trace), "--dephase-arrivals", "--out", str(out)]) == 0
    assert "tasks: 3  completed: 3  failed: 0" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["extra"]["config"]["dephase_arrivals"] is True
    jobs = {row["job_id"]: float(row["submitted_at"]) for row in csv.DictReader((out / "jobs.csv").open())}
    assert jobs == pytest.approx({"j0": 0.0, "j1": 0.01, "j2": 0.02})


@pytest.mark.parametrize("seed", [0, 2])
@pytest.mark.parametrize("crashes", [False, True])
def test_gangs_with_a_retry_rule_end_each_task_once_with_no_illegal_event(
    seed: int, crashes: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Gang jobs whose members fail and are retried by their job's rule, with workers crashing or not (an outside
    audit: the members a worker had stopped for the gang's retry were then told RETRIED while queued, illegal; and
    a finished member held under the rule, run again with its gang after a lost member, was not taken back: it
    was decided while completed, and ended twice)."""
    trace = tmp_path / "gangs.tr"
    trace.write_text("0 3 20 10 20 30\n1 3 20 10 20 30\n2 3 20 10 20 30\n")
    argv = ["replay", "--trace", str(trace), "--lms", "1", "--gms", "1", "--workers-per-partition", "6"]
    argv += ["--no-constraints", "--quiet", "--no-files", "--gangs", "1", "--retry", "3:1", "--seed", str(seed)]
    argv += ["--fail-fraction", "0.2", "--fail", "worker:rate=60"] if crashes else ["--fail-fraction", "0.5"]
    main(argv)
    out = capsys.readouterr().out
    found = re.search(
        r"tasks: 9  completed: (\d+)  failed: (\d+)  not completed exactly once: 0  illegal transitions: 0", out
    )
    assert found and int(found[1]) + int(found[2]) == 9, out


def test_in_slot_mode_a_task_holds_a_whole_node_of_a_cluster_file_s_own_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One node of 128 cores in Megha's format, two 10 s tasks arriving together: the second waits for the first
    (before, each asked for --node-cpu / --node-mem, half the node, and both ran at once)."""
    cluster = tmp_path / "big.json"
    node = {"capacity": {"cpu_millicores": 128000, "memory_mb": 32768}, "constraints": []}
    doc = {"format": "megha-cluster", "version": 1, "resource_names": ["cpu_millicores", "memory_mb"]}
    cluster.write_text(json.dumps(doc | {"lms": [[[node]]]}))
    trace = tmp_path / "two.tr"
    trace.write_text("0 2 10 10 10\n")
    out = tmp_path / "report"
    argv = [
        "replay",
        "--trace",
        str(trace),
        "--cluster",
        str(cluster),
        "--no-constraints",
        "--quiet",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    capsys.readouterr()
    tasks = list(csv.DictReader((out / "tasks.csv").open()))
    assert [int(t["request_cpu_millicores"]) for t in tasks] == [128000, 128000]
    assert sorted(round(float(t["started_at"])) for t in tasks) == [0, 10]
