"""The simulator experiments of issue 4, each reduced to a few hundred tasks and run through its command's main():
the files it writes and the sanity of its figures (the full-size runs are the commands' defaults)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from megha.loadgen.trace import TraceJob
from megha.sim.experiments import allocation, heartbeat, scale, vs_pigeonc
from megha.sim.experiments.harness import DataCentre, Run, Workload, paper_centre, read_runs
from megha.sim.experiments.workloads import PoissonLoad, retime


def assert_every_task_accounted_for(runs: list[Run]) -> None:
    """Every task of an accepted job completed exactly once; only rejected jobs' tasks failed."""
    for r in runs:
        assert r.completed_once + r.failed == r.tasks, r
        assert r.completed_once > 0, r
        assert r.failed == 0 or r.jobs_rejected > 0, r


def assert_written(out: Path, *names: str) -> None:
    for name in names:
        assert (out / name).stat().st_size > (10_000 if name.endswith(".png") else 100), name


def test_data_centre_and_workload_specs() -> None:
    assert DataCentre.parse("5x5x800").workers == 20_000
    assert DataCentre.parse("reference").replay_fields() == {"cluster": "reference"}
    assert paper_centre("GOOG") == DataCentre(5, 5, 800) and paper_centre("syn_250").reference
    workload = Workload.parse("syn:10:2@2x3x4")
    assert (workload.trace, workload.centre.workers) == ("syn:10:2", 24)
    with pytest.raises(ValueError, match="LMSxGMSxWORKERS"):
        DataCentre.parse("5x5")
    with pytest.raises(FileNotFoundError, match="not found"):
        Workload.parse("no-such-trace.tr")


def test_poisson_load_offers_the_asked_share_of_the_workers(tmp_path: Path) -> None:
    load = PoissonLoad(load=0.5, tasks_per_job=10, seconds=200.0)
    jobs = load.write(tmp_path / "t.tr", workers=100, seed=3)
    # 0.5 x 100 workers busy with 1 s tasks = 50 tasks/s = 5 jobs/s over 200 s: 1,000 jobs, +-3 sigma.
    assert abs(jobs - 1000) < 3 * math.sqrt(1000)
    first = (tmp_path / "t.tr").read_text().splitlines()[0].split()
    assert first[1:3] == ["10", "1.000000"] and len(first) == 13
    assert load.write(tmp_path / "u.tr", workers=100, seed=3) == jobs


def test_retimed_jobs_keep_their_tasks_and_offer_the_asked_load() -> None:
    jobs = [TraceJob(0.0, (10.0, 30.0)), TraceJob(5.0, (20.0,))] * 2000  # 30 task-seconds a job on average
    retimed = retime(jobs, workers=60, load=0.5, seed=1)
    assert [j.durations for j in retimed] == [j.durations for j in jobs]
    arrivals = [j.arrival for j in retimed]
    assert arrivals[0] == 0 and arrivals == sorted(arrivals)
    # 0.5 x 60 workers / 30 task-seconds per job = 1 job a second.
    assert arrivals[-1] / (len(jobs) - 1) == pytest.approx(1.0, rel=0.1)


def test_reduced_megha_vs_pigeonc_writes_one_row_per_run(tmp_path: Path) -> None:
    argv = ["--workloads", "syn:100:6@2x2x250", "--seeds", "0", "1", "--matchings", "random", "--out", str(tmp_path)]
    assert vs_pigeonc.main(argv) == 0
    runs = read_runs(tmp_path / "megha-vs-pigeonc.csv")
    assert [(r.scheduler, r.seed) for r in runs] == [("megha", 0), ("megha", 1), ("pigeonc", 0), ("pigeonc", 1)]
    assert_every_task_accounted_for(runs)
    for r in runs:
        assert r.workers == 1000 and 0 < r.utilization <= 1
        assert r.jrt_median <= r.jrt_p99 <= r.jrt_max
    assert_written(tmp_path, "megha-vs-pigeonc.md", "megha-vs-pigeonc.png")
    text = (tmp_path / "megha-vs-pigeonc.md").read_text()
    assert "`python -m megha.sim.experiments.vs_pigeonc --workloads syn:100:6@2x2x250" in text
    assert "| syn:100:6 | random | pigeonc |" in text  # the baseline / Megha table


def test_reduced_syn_250_megha_beats_pigeonc_at_the_99th_percentile(
    tmp_path: Path, syn_250: Path, reference_cluster: Path
) -> None:
    argv = ["--workloads", "syn_250", "--first-jobs", "12", "--seeds", "0", "--out", str(tmp_path)]
    assert vs_pigeonc.main(argv) == 0
    runs = read_runs(tmp_path / "megha-vs-pigeonc.csv")
    assert len(runs) == 4 and {r.workers for r in runs} == {10_000}
    assert_every_task_accounted_for(runs)
    for matching in ("random", "min-constraints"):
        p99 = {r.scheduler: r.jrt_p99 for r in runs if r.matching == matching}
        assert p99["megha"] < p99["pigeonc"], (matching, p99)


def test_reduced_allocation_time_comparison(tmp_path: Path) -> None:
    argv = ["--workload", "demo", "--first-jobs", "20", "--centres", "2x2x150", "--out", str(tmp_path)]
    assert allocation.main([*argv, "--loads", "0.9", "trace"]) == 0
    runs = read_runs(tmp_path / "allocation-time.csv")
    scenarios = ("demo at 90% load", "demo, trace arrivals")
    schedulers = ("megha", "sparrow", "centralized")
    assert [(r.workload, r.scheduler) for r in runs] == [(w, s) for w in scenarios for s in schedulers]
    assert {r.workers for r in runs} == {600}
    assert_every_task_accounted_for(runs)
    for r in runs:
        figures = [r.alloc_median, r.alloc_p90, r.alloc_p99, r.alloc_p9999, r.alloc_max]
        assert figures == sorted(figures) and figures[0] > 0.00099  # at least two hops (GM -> LM -> worker)
    with (tmp_path / "allocation-time-cdf.csv").open() as handle:
        cdf = list(csv.DictReader(handle))
    assert list(cdf[0])[:4] == ["percent", *(f"{s} @ 600 ({scenarios[0]})" for s in schedulers)]
    for column in list(cdf[0])[1:]:
        values = [float(row[column]) for row in cdf]
        assert values == sorted(values)
    assert_written(tmp_path, "allocation-time.md", "allocation-time.png", "allocation-time-tail.png")


def test_reduced_allocation_time_without_constraints(tmp_path: Path) -> None:
    argv = ["--workload", "demo", "--first-jobs", "10", "--centres", "2x2x100", "--loads", "0.5", "--no-constraints"]
    argv += ["--delta-interval", "10", "--schedulers", "megha", "sparrow", "--out", str(tmp_path), "--name", "nc"]
    assert allocation.main(argv) == 0
    runs = read_runs(tmp_path / "nc.csv")
    assert [r.scheduler for r in runs] == ["megha", "sparrow"]
    assert all(r.delta_interval == 10 for r in runs)
    assert_every_task_accounted_for(runs)
    assert all(r.jobs_rejected == 0 for r in runs)  # without constraints every task can run somewhere
    text = (tmp_path / "nc.md").read_text()
    assert "without placement constraints" in text and "10 s delta interval" in text


def test_reduced_scale_experiment(tmp_path: Path) -> None:
    argv = ["--sizes", "200", "400", "--gms-lms", "2", "--grid-workers", "400", "--counts", "1", "2"]
    argv += ["--seconds", "3", "--tasks-per-job", "20", "--out", str(tmp_path)]
    assert scale.main(argv) == 0
    runs = read_runs(tmp_path / "scale.csv")
    sizes = [r for r in runs if r.workload == "size"]
    grid = [r for r in runs if r.workload == "grid"]
    assert [r.workers for r in sizes] == [200, 400]
    assert [(r.lms, r.gms) for r in grid] == [(1, 2), (2, 1), (2, 2)]  # one count varied, the other 2
    assert_every_task_accounted_for(runs)
    # More workers at the same offered load: about twice the tasks.
    assert 1.5 < sizes[1].tasks / sizes[0].tasks < 2.5
    assert_written(tmp_path, "scale.md", "scale.png")


def test_reduced_heartbeat_experiment(tmp_path: Path) -> None:
    argv = ["--workloads", "syn:100:20@2x2x150", "--intervals", "0.1", "10", "--out", str(tmp_path)]
    assert heartbeat.main(argv) == 0
    runs = read_runs(tmp_path / "heartbeat.csv")
    assert [r.delta_interval for r in runs] == [0.1, 10.0]
    assert_every_task_accounted_for(runs)
    fast, slow = runs
    # A task parked because its GM's view showed no free worker waits for a delta to show one: staler views
    # delay jobs at least as much.
    assert slow.jrt_p99 >= fast.jrt_p99
    assert_written(tmp_path, "heartbeat.md", "heartbeat.png")
