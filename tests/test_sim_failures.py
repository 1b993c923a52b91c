"""Worker failures in the simulator: the services' recovery path on the virtual clock. Under any schedule of
crashes and repairs, every accepted task ends exactly once (finished, or failed after its attempts), and every
node ends in service at full capacity."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megha.common.clusterfile import generate_cluster
from megha.common.core.task import JobSpec, TaskSpec
from megha.embedded.faults import WorkerFaults, parse_faults
from megha.embedded.system import EmbeddedConfig, EmbeddedSystem
from megha.loadgen.recorder import Recorder

CAP = (4000, 8192)


def _run(faults: WorkerFaults, jobs: int, tasks: int, duration: float, max_attempts: int = 3):  # type: ignore[no-untyped-def]
    cluster = generate_cluster(2, 2, 2, CAP, 0)  # 2 LMs x 2 GMs x 2 nodes: 8 nodes
    recorder = Recorder()
    system = EmbeddedSystem(
        cluster, EmbeddedConfig(worker_faults=faults, max_attempts=max_attempts, hop_delay=0.001), recorder
    )
    for j in range(jobs):
        job = JobSpec(
            f"j{j}",
            tuple(TaskSpec(f"j{j}.{k}", f"j{j}", "u", duration, (1000, 1024), 0) for k in range(tasks)),
            float(j),
        )
        recorder.expect(j % 2, job)
        system.submit(j % 2, job)
    system.run()
    return system, recorder


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    crashes=st.lists(st.tuples(st.floats(0.0, 30.0), st.integers(0, 1), st.integers(0, 3)), min_size=0, max_size=12),
    detect=st.floats(0.5, 5.0),
    repair_after=st.floats(0.0, 10.0),
    duration=st.floats(0.5, 6.0),
)
def test_any_crash_schedule_ends_every_task_once_and_every_node_at_full_capacity(  # type: ignore[no-untyped-def]
    crashes, detect, repair_after, duration
) -> None:
    faults = WorkerFaults(at=tuple(crashes), detect=detect, repair=detect + repair_after)
    system, recorder = _run(faults, jobs=6, tasks=5, duration=duration)
    for rec in recorder.tasks.values():
        assert rec.completions <= 1, rec
        assert rec.completions == 1 or "MEGHA_MAX_ATTEMPTS=3" in rec.failed_reason, rec
        assert rec.retries <= 2
    for lm in system.lms:
        assert lm.is_idle(), (lm.lm_id, lm.running, lm.down, lm.free, lm.capacity)
    assert all(not gm.running and not gm.queue and not gm.waiting for gm in system.gms)


def test_random_crashes_are_retried_and_counted() -> None:
    faults = WorkerFaults(rate=400.0, detect=2.0, repair=4.0, seed=3)
    system, recorder = _run(faults, jobs=20, tasks=8, duration=3.0)
    counters = system.counters()
    assert counters["worker_crashes"] > 0 and counters["retries"] > 0
    assert sum(r.retries for r in recorder.tasks.values()) == counters["retries"]
    assert sum(r.lost_cpu_seconds for r in recorder.tasks.values()) > 0
    assert all(r.completions == 1 or r.failed_reason for r in recorder.tasks.values())
    assert all(lm.is_idle() for lm in system.lms)


def test_fail_specs_parse_and_bad_ones_say_why() -> None:
    faults = parse_faults(["worker:rate=2", "worker:at=10,lm=1,node=3"], 30.0, 60.0, 7)
    assert faults == WorkerFaults(2.0, ((10.0, 1, 3),), 30.0, 60.0, 7)
    assert parse_faults([], 30.0, 60.0, 0) is None
    for bad, why in (
        ("gm:rate=1", "only worker failures"),
        ("worker", "expected worker:rate=R"),
        ("worker:rate=x", "could not convert"),
        ("worker:at=1,lm=0", "unknown fields"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_faults([bad], 30.0, 60.0, 0)
    with pytest.raises(ValueError, match="repair >= detect"):
        WorkerFaults(detect=10.0, repair=5.0)


def test_the_failure_experiment_runs_reduced_and_writes_its_page(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from megha.sim.experiments import failures

    assert failures.main(["--rates", "0", "30", "--first-jobs", "20", "--out", str(tmp_path)]) == 0
    page = (tmp_path / "failures.md").read_text()
    assert "Produced by `python -m megha.sim.experiments.failures`" in page
    rows = (tmp_path / "failures.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[1].startswith("0.0,0,5000,5000,0,0")
