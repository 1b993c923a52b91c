"""Priority classes in the simulator: `megha replay --priority-classes --job-classes` draws each job's class with the
seed, high-class jobs then wait less than low-class ones on a contended data centre, and the experiment
(`sim/experiments/priority.py`) writes its table and figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from megha import cli
from megha.common.core.policies.priority import parse_priority_classes
from megha.loadgen.priority import draw_classes, parse_job_classes
from megha.loadgen.replay import ReplayConfig, replay
from megha.sim.experiments import priority as experiment

CLASSES = parse_priority_classes("low:0,normal:100,high:1000")


def test_job_classes_parse_and_the_rest_goes_to_the_default_class() -> None:
    assert parse_job_classes("low:50%,high:0.25", CLASSES) == [("low", 0.5), ("high", 0.25), ("normal", 0.25)]
    assert parse_job_classes("", CLASSES) == [("normal", 1.0)]
    for bad, message in (("top:50%", "unknown priority class 'top'"), ("low:80%,high:30%", "must not exceed 1")):
        with pytest.raises(ValueError, match=message):
            parse_job_classes(bad, CLASSES)


def test_each_job_s_class_is_drawn_with_the_seed() -> None:
    drawn = draw_classes(200, CLASSES, "low:50%,high:50%", seed=3)
    assert drawn == draw_classes(200, CLASSES, "low:50%,high:50%", seed=3)
    assert drawn != draw_classes(200, CLASSES, "low:50%,high:50%", seed=4)
    assert set(drawn) == {0, 1000} and 60 < drawn.count(1000) < 140


def test_high_class_jobs_wait_less_than_low_class_ones_in_a_contended_replay() -> None:
    config = ReplayConfig(
        trace="syn:250:24",
        lms=2,
        gms=2,
        workers_per_partition=10,
        constraints=False,
        job_classes="low:50%,high:50%",
    )
    result = replay(config)
    assert not result.metrics.not_exactly_once
    drawn = draw_classes(24, CLASSES, config.job_classes, config.seed)
    delay = {
        p: [
            j.finished_at - j.submitted_at - j.ideal_jrt for j, q in zip(result.recorder.jobs.values(), drawn) if q == p
        ]
        for p in (0, 1000)
    }
    assert sum(delay[1000]) / len(delay[1000]) < sum(delay[0]) / len(delay[0])
    assert result.system.lms[0].preemptions + result.system.lms[1].preemptions > 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["replay", "--priority-classes", "low"], "megha replay: error: --priority-classes: priority class 0: 'low'"),
        (["replay", "--job-classes", "top:1", "--no-files"], "megha replay: error: unknown priority class 'top'"),
    ],
)
def test_bad_class_options_are_one_line_naming_them(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        status = cli.main(argv)
    except SystemExit as exc:  # a bad option stops click; a bad value the replay refuses is returned
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith(message), err


def test_the_experiment_writes_its_table_and_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert experiment.main(["--jobs", "12", "--seeds", "0", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "priority.md").read_text()
    assert "| priority + fair share | high |" in table and "--jobs 12 --seeds 0" in table
    assert (tmp_path / "priority.png").stat().st_size > 0
    assert len((tmp_path / "priority.csv").read_text().splitlines()) == 1 + 2 * 3
