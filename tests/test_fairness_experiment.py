"""The fairness experiment's measures (Jain's index, per-queue consumption over time) and a reduced run of the
experiment itself (the full-size run is `python -m megha.sim.experiments.fairness`)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from megha.common.core.fairness.config import parse_queues
from megha.common.core.task import JobSpec, TaskSpec
from megha.loadgen.recorder import Recorder
from megha.loadgen.trace import demo_trace_path
from megha.sim.experiments import fairness as experiment
from megha.sim.experiments.shares import jain_index, share_series


def test_jain_index_on_hand_computed_values() -> None:
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert jain_index([1.0, 3.0]) == pytest.approx(16 / 20)
    assert math.isnan(jain_index([]))


def test_share_series_counts_preempted_runs_and_final_runs() -> None:
    fairness = parse_queues("A:0.5:0,B:0.5:0")
    rec = Recorder()
    tasks = (TaskSpec("j.0", "j", "A", 10.0, (50, 50), 0), TaskSpec("j.1", "j", "B", 10.0, (50, 50), 0))
    rec.expect(0, JobSpec("j", tasks, 0.0))
    a, b = rec.tasks["j.0"], rec.tasks["j.1"]
    a.arrival, b.arrival = 0.0, 0.0
    a.started_at = 0.0
    rec.preempted([a.task_id], 4.0)  # A held half the data centre for 4 s, then lost it to B
    b.started_at, b.finished_at = 4.0, 14.0
    a.started_at, a.finished_at = 14.0, 24.0
    series = share_series(rec, fairness, (100, 100), samples=24)
    at = {round(t): k for k, t in enumerate(series.times)}
    assert series.consumption["A"][at[2]] == pytest.approx(0.5) and series.consumption["B"][at[2]] == 0
    assert series.consumption["B"][at[10]] == pytest.approx(0.5) and series.consumption["A"][at[10]] == 0
    assert series.contended[at[2]]  # B was waiting
    assert not series.contended[at[20]]
    assert a.lost_cpu_seconds == pytest.approx(4 * 50 / 1000)


def test_reduced_fairness_experiment_writes_its_table_and_plots(tmp_path: Path) -> None:
    code = experiment.main(
        [
            "--trace",
            str(demo_trace_path()),
            "--first-jobs",
            "60",
            "--sizes",
            "12",
            "--policies",
            "share",
            "drf",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    with (tmp_path / "fairness.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["policy"] for r in rows] == ["share", "drf"]
    for r in rows:
        assert int(r["completed_once"]) == int(r["tasks"]), "a task did not complete exactly once"
        assert int(r["preemptions"]) > 0 and int(r["preemption_attempts"]) > 0
        assert 0 < float(r["jain_contended"]) <= 1
    assert (tmp_path / "fairness-shares-12.png").stat().st_size > 10_000
    assert (tmp_path / "fairness-jain-12.png").stat().st_size > 10_000
    assert "| share | 12 |" in (tmp_path / "fairness.md").read_text()
