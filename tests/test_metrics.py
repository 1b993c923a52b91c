"""Run metrics against hand-computed examples: allocation-time components, JRT delay, counts, utilization."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from megha.loadgen.metrics import (
    MAX_UTILIZATION_SAMPLES,
    compute_metrics,
    default_utilization_step,
    summarize,
    utilization_over_time,
)
from megha.loadgen.records import JobRecord, TaskRecord

NAMES = ("cpu", "mem")
CAPACITY = (4000, 8000)


def placed(task_id: str, job_id: str, times: tuple[float, ...], **kwargs: object) -> TaskRecord:
    """A task with its eight timestamps: arrival, attempt, decided, LM received, launched, worker, start, end."""
    arrival, attempt, decided, lm_received, launched, worker, started, finished = times
    fields = {"duration": 1.0, "request": (1000, 2000), "attempts": 1, "completions": 1, **kwargs}
    return TaskRecord(
        task_id,
        job_id,
        0,
        "u",
        arrival=arrival,
        attempt_at=attempt,
        decided_at=decided,
        lm_received_at=lm_received,
        launched_at=launched,
        worker_received_at=worker,
        started_at=started,
        finished_at=finished,
        **fields,  # type: ignore[arg-type]
    )


def three_tasks() -> list[TaskRecord]:
    # Component times (framework queuing, processing, communication, worker queuing), allocation time:
    # a: 1, 2+1, 1+2, 1 ms -> 8 ms;  b: 2, 1+1, 2+2, 0 ms -> 8 ms;  c: 10, 5+5, 3+3, 4 ms -> 30 ms.
    return [
        placed("a", "j", (0.000, 0.001, 0.003, 0.004, 0.005, 0.007, 0.008, 1.008)),
        placed("b", "j", (1.000, 1.002, 1.003, 1.005, 1.006, 1.008, 1.008, 2.008)),
        placed("c", "j", (2.000, 2.010, 2.015, 2.018, 2.023, 2.026, 2.030, 3.030)),
    ]


def test_summarize_uses_linear_interpolation() -> None:
    s = summarize([4.0, 1.0, 3.0, 2.0])
    # Sorted 1..4; percentile p sits at rank 3 * p / 100 between neighbours.
    assert s.count == 4
    assert s.median == pytest.approx(2.5)
    assert s.mean == pytest.approx(2.5)
    assert s.p90 == pytest.approx(3.7)
    assert s.p99 == pytest.approx(3.97)
    assert s.p9999 == pytest.approx(3.9997)
    assert s.max == 4.0


def test_summarize_leaves_out_nan() -> None:
    assert summarize([math.nan, 4.0, 1.0, math.nan, 3.0, 2.0]) == summarize([1.0, 2.0, 3.0, 4.0])


@pytest.mark.parametrize("values", [[], [math.nan, math.nan]])
def test_summarize_of_nothing_is_nan(values: list[float]) -> None:
    s = summarize(values)
    assert s.count == 0
    assert all(math.isnan(v) for v in (s.median, s.mean, s.p90, s.p99, s.p9999, s.max))


def test_allocation_time_and_components_of_three_tasks() -> None:
    m = compute_metrics(three_tasks(), [], CAPACITY, NAMES, wall_seconds=1.0)
    assert m.allocation_time.count == 3
    assert m.allocation_time.median == pytest.approx(0.008, abs=1e-12)
    assert m.allocation_time.mean == pytest.approx((0.008 + 0.008 + 0.030) / 3, abs=1e-12)
    assert m.allocation_time.p90 == pytest.approx(0.008 + 0.8 * 0.022, abs=1e-12)
    assert m.allocation_time.max == pytest.approx(0.030, abs=1e-12)
    expected_means = {
        "framework_queuing": (0.001 + 0.002 + 0.010) / 3,
        "processing": (0.003 + 0.002 + 0.010) / 3,
        "communication": (0.003 + 0.004 + 0.006) / 3,
        "worker_queuing": (0.001 + 0.000 + 0.004) / 3,
    }
    expected_max = {"framework_queuing": 0.010, "processing": 0.010, "communication": 0.006, "worker_queuing": 0.004}
    for name, mean in expected_means.items():
        assert m.components[name].mean == pytest.approx(mean, abs=1e-12), name
        assert m.components[name].max == pytest.approx(expected_max[name], abs=1e-12), name
    assert sum(s.mean for s in m.components.values()) == pytest.approx(m.allocation_time.mean, abs=1e-12)


def test_unplaced_task_is_left_out_of_allocation_time() -> None:
    waiting = TaskRecord("w", "j", 0, "u", 1.0, (1, 1), arrival=0.5, attempts=3, reschedules=3)
    m = compute_metrics([*three_tasks(), waiting], [], CAPACITY, NAMES, wall_seconds=1.0)
    assert m.allocation_time.count == 3
    assert m.components["framework_queuing"].count == 3
    assert m.not_exactly_once == ("w",)


def test_jrt_delay_counts_finished_jobs_only() -> None:
    jobs = [
        JobRecord("done", 0, submitted_at=10.0, num_tasks=2, ideal_jrt=5.0, finished_tasks=2, finished_at=15.0015),
        JobRecord("running", 0, submitted_at=11.0, num_tasks=1, ideal_jrt=1.0),
        JobRecord("refused", 0, submitted_at=12.0, num_tasks=1, ideal_jrt=1.0, rejected_reason="bad request"),
    ]
    m = compute_metrics([], jobs, CAPACITY, NAMES, wall_seconds=1.0)
    assert m.jrt_delay.count == 1
    assert m.jrt_delay.median == pytest.approx(0.0015, abs=1e-9)
    assert m.jobs == 3
    assert m.jobs_rejected == 1


def test_counts_and_exactly_once_check() -> None:
    times = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
    tasks = [
        placed("ok", "j1", times, attempts=2, reschedules=1, inconsistencies=1, repartitioned=True),
        placed("twice", "j1", times, completions=2, inconsistencies=2),
        placed("lost", "j1", times, completions=0),
        placed("failed", "j1", times, completions=0, failed_reason="worker lost"),
        placed("refused", "j2", times, completions=0, attempts=0),
    ]
    jobs = [JobRecord("j1", 0, 0.0, 4, 1.0), JobRecord("j2", 0, 0.0, 1, 1.0, rejected_reason="no such user")]
    m = compute_metrics(tasks, jobs, CAPACITY, NAMES, wall_seconds=4.0)
    assert (m.tasks, m.tasks_completed, m.tasks_failed) == (5, 2, 1)
    assert (m.repartitions, m.inconsistencies, m.reschedules, m.attempts) == (1, 3, 1, 5)
    assert m.not_exactly_once == ("twice", "lost")
    assert m.wall_seconds == 4.0
    assert m.tasks_per_wall_second == pytest.approx(0.5)


def test_span_is_last_finish_minus_first_arrival_on_the_clock_named() -> None:
    m = compute_metrics(three_tasks(), [], CAPACITY, NAMES, wall_seconds=0.0, clock="virtual")
    assert m.span == pytest.approx(3.030)
    assert m.clock == "virtual"
    assert math.isnan(m.tasks_per_wall_second)
    # A real deployment's records are on the wall clock, which is what the services' load generator records.
    assert compute_metrics(three_tasks(), [], CAPACITY, NAMES, wall_seconds=0.0).clock == "wall"
    with pytest.raises(ValueError, match="clock"):
        compute_metrics(three_tasks(), [], CAPACITY, NAMES, wall_seconds=0.0, clock="simulated")  # type: ignore[arg-type]


def test_failure_and_rejection_reasons_are_tallied_most_common_first() -> None:
    times = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
    tasks = [
        placed("ok", "j1", times),
        placed("a", "j2", times, completions=0, failed_reason="rejected at submission: no node satisfies [5, 6]"),
        placed("b", "j2", times, completions=0, failed_reason="rejected at submission: no node satisfies [1]"),
        placed("c", "j1", times, completions=0, failed_reason="worker lost 3 times"),
    ]
    jobs = [
        JobRecord("j1", 0, 0.0, 2, 1.0),
        JobRecord("j2", 0, 0.0, 2, 1.0, rejected_reason="no node satisfies [5, 6]"),
        JobRecord("j3", 0, 0.0, 2, 1.0, rejected_reason="no node satisfies [2]"),
    ]
    m = compute_metrics(tasks, jobs, CAPACITY, NAMES, wall_seconds=1.0)
    # Lists of constraint ids are left out, so the same cause is counted once.
    assert m.failure_reasons == (("rejected at submission: no node satisfies", 2), ("worker lost 3 times", 1))
    assert m.rejection_reasons == (("no node satisfies", 2),)


def running(start: float, end: float, request: tuple[int, int]) -> TaskRecord:
    return TaskRecord("t", "j", 0, "u", end - start, request, started_at=start, finished_at=end)


def test_utilization_of_two_overlapping_tasks() -> None:
    tasks = [
        running(0.0, 10.0, (1000, 2000)),
        running(5.0, 15.0, (2000, 2000)),
        TaskRecord("never", "j", 0, "u", 1.0, (4000, 8000), arrival=1.0),
        TaskRecord("no-end", "j", 0, "u", 1.0, (4000, 8000), started_at=2.0),
    ]
    series = utilization_over_time(tasks, CAPACITY, NAMES, step=2.5)
    # Steps of 2.5 s from the first start to the last finish, each the average over the step.
    assert series.times.tolist() == [0.0, 2.5, 5.0, 7.5, 10.0, 12.5]
    assert series.fractions["cpu"].tolist() == [0.25, 0.25, 0.75, 0.75, 0.5, 0.5]
    assert series.fractions["mem"].tolist() == [0.25, 0.25, 0.5, 0.5, 0.25, 0.25]
    # Exact time-average over the busy span 0..15 s: (1000*10 + 2000*10) / (4000*15), (2000*10 * 2) / (8000*15).
    assert series.mean["cpu"] == pytest.approx(0.5)
    assert series.mean["mem"] == pytest.approx(1 / 3)


def test_utilization_matches_a_direct_count() -> None:
    rng = random.Random(7)
    tasks = []
    for _ in range(300):
        start = rng.uniform(0.0, 100.0)
        tasks.append(running(start, start + rng.expovariate(0.1), (rng.randint(1, 50), rng.randint(1, 90))))
    series = utilization_over_time(tasks, (1000, 2000), NAMES, step=0.7)
    last = max(task.finished_at for task in tasks)
    for i, t in enumerate(series.times.tolist()):
        end = min(t + 0.7, last)
        overlaps = [max(0.0, min(end, task.finished_at) - max(t, task.started_at)) for task in tasks]
        held = [sum(task.request[r] * o for task, o in zip(tasks, overlaps)) / (end - t) for r in (0, 1)]
        assert series.fractions["cpu"][i] == pytest.approx(held[0] / 1000)
        assert series.fractions["mem"][i] == pytest.approx(held[1] / 2000)
    assert series.times[-1] < last <= series.times[-1] + 0.7


def test_back_to_back_tasks_show_no_dip_or_spike() -> None:
    # Each task starts as the previous one ends; the float sums make some end a hair before or after the next
    # start, which an instant's sample would show as utilization dropping to 0 or doubling.
    tasks = [running(k + 0.0015, (k + 0.0015) + 1.0, (1000, 2000)) for k in range(200)]
    series = utilization_over_time(tasks, CAPACITY, NAMES)
    assert series.fractions["cpu"] == pytest.approx(np.full(series.times.size, 0.25))


def test_utilization_of_no_running_task_is_empty() -> None:
    series = utilization_over_time([TaskRecord("t", "j", 0, "u", 1.0, (1, 1))], CAPACITY, NAMES)
    assert series.times.size == 0
    assert all(math.isnan(v) for v in series.mean.values())


def test_utilization_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="2 amounts"):
        utilization_over_time([running(0.0, 1.0, (1, 2, 3))], CAPACITY, NAMES)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        utilization_over_time([running(0.0, 1.0, (1, 2))], (0, 8000), NAMES)


@pytest.mark.parametrize(("span", "step"), [(1000.0, 0.5), (3000.0, 2.0), (7.0, 0.005), (0.0, 1.0)])
def test_default_step_is_a_1_2_5_value_within_the_sample_budget(span: float, step: float) -> None:
    assert default_utilization_step(span) == pytest.approx(step)
    assert span / default_utilization_step(span) <= MAX_UTILIZATION_SAMPLES


def test_compute_metrics_keeps_utilization_within_the_sample_budget() -> None:
    tasks = [running(0.0, 12345.0, (1000, 2000)), running(100.0, 200.0, (3000, 6000))]
    m = compute_metrics(tasks, [], CAPACITY, NAMES, wall_seconds=1.0)
    assert 1000 < m.utilization.times.size <= MAX_UTILIZATION_SAMPLES + 1
    assert np.allclose(np.diff(m.utilization.times), 10.0)
    assert m.utilization.mean["cpu"] == pytest.approx((1000 * 12345 + 3000 * 100) / (4000 * 12345))
