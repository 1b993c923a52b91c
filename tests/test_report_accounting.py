"""What a replay's records count (docs/report.md): every completed task's four components of allocation time are
stamps of one placement, its last, and add up to its allocation time, also when it was placed more than once; a
job keeps its trace's task count when its GM drops tasks of it at submission, and one that lost them all says why;
Sparrow's reservation wait is documented where the components are defined."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from megha.common.clusterfile import save_cluster
from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.messages import Placement
from megha.common.core.task import JobSpec, TaskSpec
from megha.loadgen.metrics import COMPONENTS, allocation_columns
from megha.loadgen.recorder import Recorder
from megha.loadgen.replay import ReplayConfig, ReplayResult, replay
from megha.loadgen.trace import demo_trace_path

REPORT_DOC = Path(__file__).resolve().parents[1] / "docs" / "report.md"

# Queueable tasks on a small data centre: guaranteed tasks evict them from their nodes and their GM places them
# again, some of them while tasks of their shape wait parked (the audit's `--queueable 0.5` reproduction).
QUEUEABLE = ReplayConfig(
    trace="syn:50:10", lms=1, gms=1, workers_per_partition=10, constraints=False, queueable=0.5, seed=0
)
# The README's fair-scheduling example: preemption requests an LM refuses are sent to the next LM.
FAIR = ReplayConfig(
    trace=str(demo_trace_path()),
    mode="scaled",
    constraints=False,
    lms=2,
    gms=3,
    workers_per_partition=2,
    node_cpu_millicores=2000,
    node_memory_mb=4096,
    queues="q1:10%:0,q2:25%:1,q3:15%:1,q4:50%:2",
    share_policy="drf",
)


def _completed_components(result: ReplayResult) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Allocation time and its components of the tasks that finished."""
    tasks = result.recorder.tasks
    done = ~np.isnan(tasks.array("finished_at", np.float64))
    columns = allocation_columns(tasks)
    return columns["allocation_time"][done], {name: columns[name][done] for name in COMPONENTS}


def _assert_components_add_up(result: ReplayResult) -> dict[str, np.ndarray]:
    allocation, components = _completed_components(result)
    assert allocation.size == result.metrics.tasks_completed > 0
    for name, values in components.items():
        assert not np.isnan(values).any(), f"{name} undefined for {np.isnan(values).sum()} completed tasks"
        assert (values >= -1e-9).all(), f"{name} negative for {(values < -1e-9).sum()} completed tasks"
    total = sum(components.values())
    assert np.allclose(total, allocation, rtol=0, atol=1e-9)
    m = result.metrics
    assert all(m.components[name].count == m.allocation_time.count for name in COMPONENTS)
    done = ~np.isnan(result.recorder.tasks.array("finished_at", np.float64))
    assert (result.recorder.tasks.array("attempts", np.int64)[done] >= 1).all()
    return components


# ------------------------------------------------------------------------ A: a task placed more than once


def test_a_decision_the_gm_reported_no_attempt_for_is_an_attempt_started_as_it_was_decided() -> None:
    a, b = (TaskSpec(f"j.{i}", "j", "user-0", 1.0, (1000, 100), 0) for i in range(2))
    recorder = Recorder()
    recorder.expect(0, JobSpec("j", (a, b), 0.0))
    recorder.job_arrived(JobSpec("j", (a, b), 0.0), 0, 0.0)
    first = Placement(a, 0, 0, False)
    recorder.decided([first], 3.0)  # no attempt reported for it
    recorder.attempt(b, 1.0)
    recorder.rescheduled(b, 1.0)  # nothing fitted: that attempt ended without a placement
    recorder.decided([Placement(b, 0, 1, False)], 5.0)
    rows = recorder.tasks
    assert (rows["j.0"].attempt_at, rows["j.0"].attempts) == (3.0, 1)
    assert (rows["j.1"].attempt_at, rows["j.1"].attempts) == (5.0, 2)
    recorder.inconsistency(first, 4.0)  # its LM refused it: placed again, the GM reporting its attempt
    recorder.attempt(a, 6.0)
    recorder.decided([Placement(a, 0, 2, False)], 6.5)
    assert (rows["j.0"].attempt_at, rows["j.0"].decided_at, rows["j.0"].attempts) == (6.0, 6.5, 2)
    assert recorder.illegal == 0


def test_queueable_tasks_placed_again_after_an_eviction_have_components_of_their_last_placement() -> None:
    result = replay(QUEUEABLE)
    assert int(result.recorder.tasks.array("preemptions", np.int64).sum()) > 0  # evictions happened
    components = _assert_components_add_up(result)
    assert (components["processing"] == 0).all()  # zero decision costs: deciding takes no time
    assert result.metrics.components["processing"].max == 0


def test_preemption_requests_sent_again_after_a_refusal_take_no_processing_time() -> None:
    result = replay(FAIR)
    assert result.metrics.preemption_attempts > 0
    components = _assert_components_add_up(result)
    assert (components["processing"] == 0).all()


def test_with_decision_costs_processing_is_the_deciding_of_the_last_placement_only() -> None:
    result = replay(replace(QUEUEABLE, decision_costs="calibrated"))
    components = _assert_components_add_up(result)
    tasks = result.recorder.tasks
    done = ~np.isnan(tasks.array("finished_at", np.float64))
    attempt_at, decided_at = (tasks.array(name, np.float64)[done] for name in ("attempt_at", "decided_at"))
    assert (attempt_at <= decided_at).all()
    # A GM's and an LM's handling take milliseconds; an earlier placement's attempt would add seconds.
    assert components["processing"].max() < 0.1


# ------------------------------------------------------------ B: tasks dropped at submission (drop mode)


def _unconstrained_cluster(path: Path, nodes: int) -> str:
    """One LM, one GM, `nodes` nodes with no machine constraints: every constrained task is unsatisfiable."""
    node = (64000, 16384)
    save_cluster(ClusterSpec(((PartitionSpec(0, 0, (node,) * nodes, (0,) * nodes),),)), path)
    return str(path)


def test_a_job_keeps_its_trace_task_count_when_tasks_are_dropped_and_one_that_lost_all_says_why(
    tmp_path: Path,
) -> None:
    cluster = _unconstrained_cluster(tmp_path / "c.json", 20)
    result = replay(ReplayConfig(trace="syn:10:20", cluster=cluster, unsatisfiable="drop", seed=0))
    tasks, jobs = result.recorder.tasks, result.recorder.jobs
    dropped: dict[str, int] = dict.fromkeys(jobs, 0)
    for job_id, reason in zip(tasks.column("job_id"), tasks.column("failed_reason"), strict=True):
        if reason.startswith("dropped at submission: "):
            dropped[job_id] += 1
    assert sum(dropped.values()) == result.system.counters()["dropped"] > 0
    lost_all = [j for j in jobs.values() if dropped[j.job_id] == j.num_tasks]
    ran = [j for j in jobs.values() if dropped[j.job_id] < j.num_tasks]
    assert lost_all and any(dropped[j.job_id] for j in ran)  # both cases happened
    assert all(j.num_tasks == 10 and j.dropped_tasks == dropped[j.job_id] for j in jobs.values())
    for j in ran:
        assert j.finished_tasks == j.num_tasks - j.dropped_tasks and math.isfinite(j.jrt_delay), j
        assert not j.rejected_reason
    for j in lost_all:
        assert j.rejected_reason.startswith("dropped at submission: no node satisfies placement constraints"), j
        assert (j.finished_tasks, math.isnan(j.finished_at)) == (0, True)
    m = result.metrics
    assert (m.jobs, m.jobs_rejected, m.jrt_delay.count) == (20, len(lost_all), len(ran))
    assert m.tasks_failed == sum(dropped.values()) and m.not_exactly_once == ()
    reason = "dropped at submission: no node satisfies placement constraints"  # tallied without the ids
    assert dict(m.rejection_reasons) == {reason: len(lost_all)}


# --------------------------------------------------------------- C: Sparrow's wait for a worker, documented


def test_sparrows_reservation_wait_is_processing_and_the_report_says_so() -> None:
    config = ReplayConfig(trace="syn:20:10", lms=1, gms=1, workers_per_partition=10, constraints=False)
    result = replay(replace(config, scheduler="sparrow"))
    components = _assert_components_add_up(result)
    assert (components["worker_queuing"] == 0).all() and (components["framework_queuing"] == 0).all()
    assert components["processing"].max() > 1.0  # tasks waited behind one-second tasks, as reservations
    paragraph = next(
        (p for p in REPORT_DOC.read_text().split("\n\n") if "--scheduler sparrow" in p and "processing" in p), ""
    )
    assert re.search(r"reservation.{0,80}wait", paragraph) and "worker queuing" in paragraph, paragraph


@pytest.mark.parametrize("scheduler", ["pigeonc", "centralized"])
def test_the_baselines_components_add_up_too(scheduler: str) -> None:
    config = ReplayConfig(trace="syn:20:10", lms=1, gms=1, workers_per_partition=10, constraints=False)
    result = replay(replace(config, scheduler=scheduler, **({"pigeonc_masters": 2} if scheduler == "pigeonc" else {})))
    components = _assert_components_add_up(result)
    assert (components["processing"] == 0).all()
