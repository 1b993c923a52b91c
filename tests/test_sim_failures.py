"""Failures in the simulator: the services' recovery paths on the virtual clock. Under any schedule of worker, LM
and GM crashes, restarts and partitions, every accepted task ends exactly once (finished, or failed after its
attempts), and every node ends in service at full capacity."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megha.common.clusterfile import generate_cluster
from megha.common.core.task import JobSpec, TaskSpec
from megha.embedded.faults import Fault, Faults, parse_faults
from megha.embedded.system import EmbeddedConfig, EmbeddedSystem
from megha.loadgen.recorder import Recorder

CAP = (4000, 8192)
HOP = 0.001
DETECT = 2.0


def _run(faults: Faults, jobs: int = 6, tasks: int = 5, duration: float = 3.0, max_attempts: int = 3):  # type: ignore[no-untyped-def]
    cluster = generate_cluster(2, 2, 2, CAP, 0)  # 2 LMs x 2 GMs x 2 nodes: 8 nodes of 4 slots
    recorder = Recorder()
    system = EmbeddedSystem(cluster, EmbeddedConfig(faults=faults, max_attempts=max_attempts, hop_delay=HOP), recorder)
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


def _check_every_task_ended_once_and_every_node_is_free(system, recorder, max_attempts: int = 3) -> None:  # type: ignore[no-untyped-def]
    for rec in recorder.tasks.values():
        assert rec.completions <= 1, rec
        assert rec.completions == 1 or f"MEGHA_MAX_ATTEMPTS={max_attempts}" in rec.failed_reason, rec
        assert rec.retries < max_attempts
    for lm in system.lms:
        assert lm.is_idle(), (lm.lm_id, lm.running, lm.down, lm.free, lm.capacity)
    assert all(not gm.running and not gm.queue and not gm.waiting for gm in system.gms)


_times = st.floats(0.0, 30.0)
_downs = st.floats(0.05, 10.0)
_faults = st.one_of(
    st.builds(
        lambda at, lm, node, after: Fault("worker", at, lm, node, DETECT + after),
        _times,
        st.integers(0, 1),
        st.integers(0, 3),
        st.floats(0.01, 10.0),
    ),
    st.builds(lambda at, lm, down: Fault("lm", at, lm, down=down), _times, st.integers(0, 1), _downs),
    st.builds(lambda at, gm, down: Fault("gm", at, gm, down=down), _times, st.integers(0, 1), _downs),
    st.builds(
        lambda at, kind, index, down: Fault(kind, at, index, down=down, partition=True),
        _times,
        st.sampled_from(["lm", "gm"]),
        st.integers(0, 1),
        _downs,
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faults=st.lists(_faults, max_size=10), duration=st.floats(0.5, 6.0))
def test_any_crash_restart_and_partition_schedule_ends_every_task_once_and_frees_every_node(  # type: ignore[no-untyped-def]
    faults, duration
) -> None:
    system, recorder = _run(Faults(at=tuple(faults), detect=DETECT, repair=5.0), duration=duration)
    _check_every_task_ended_once_and_every_node_is_free(system, recorder)


def test_a_gm_crash_relaunches_nothing_and_its_submissions_and_completions_wait_for_its_restart() -> None:
    system, recorder = _run(Faults(at=(Fault("gm", 2.5, 0, down=10.0),)))
    _check_every_task_ended_once_and_every_node_is_free(system, recorder)
    counters = system.counters()
    assert counters["gm_crashes"] == 1 and counters["retries"] == 0
    gm0 = [r for r in recorder.tasks.values() if r.gm == 0]
    assert all(r.attempts == 1 for r in gm0)  # nothing that ran or was placed before the crash was placed again
    late = [r for r in gm0 if r.job_id == "j4"]  # submitted at 4 s, while GM 0 was down
    assert late and all(r.arrival >= 12.5 for r in late)
    assert all(r.completions == 1 and r.finished_at == r.started_at + 3.0 for r in gm0 if r.started_at < 2.5)


def test_an_lm_crash_keeps_its_tasks_running_and_its_launches_wait_for_its_next_incarnation() -> None:
    system, recorder = _run(Faults(at=(Fault("lm", 2.5, 1, down=10.0),)))
    _check_every_task_ended_once_and_every_node_is_free(system, recorder)
    counters = system.counters()
    assert counters["lm_crashes"] == 1 and counters["retries"] == 0
    assert system.lms[1].incarnation == 1 and system.lms[0].incarnation == 0
    on_lm1 = [r for r in recorder.tasks.values() if r.lm == 1]
    assert any(r.started_at < 2.5 < r.finished_at for r in on_lm1)  # ran on through the outage
    assert all(r.finished_at == r.started_at + 3.0 for r in on_lm1)
    assert all(r.started_at >= 12.5 for r in on_lm1 if r.lm_received_at > 2.5)  # launched by the new one


def test_a_worker_lost_while_its_lm_is_down_has_its_runs_run_again() -> None:
    faults = Faults(at=(Fault("lm", 0.5, 0, down=5.0), Fault("worker", 1.0, 0, 0, down=20.0)), detect=2.0)
    system, recorder = _run(faults, jobs=2)
    _check_every_task_ended_once_and_every_node_is_free(system, recorder)
    retried = [r for r in recorder.tasks.values() if r.retries]
    assert retried and all(r.completions == 1 and r.lost_cpu_seconds > 0 for r in retried)
    assert system.counters()["retries"] == len(retried)


def test_a_worker_lost_while_its_gm_is_down_has_its_runs_run_again_after_the_gm_restarts() -> None:
    faults = Faults(at=(Fault("gm", 0.5, 0, down=10.0), Fault("worker", 1.0, 0, 0, down=20.0)), detect=2.0)
    system, recorder = _run(faults, jobs=2)
    _check_every_task_ended_once_and_every_node_is_free(system, recorder)
    retried = [r for r in recorder.tasks.values() if r.retries and r.gm == 0]
    assert retried and all(r.attempt_at >= 10.5 for r in retried)  # the loss waited for its GM


def test_gm_and_lm_crashes_at_random_with_worker_crashes_are_counted_and_lose_nothing() -> None:
    faults = Faults(worker_rate=200.0, lm_rate=300.0, gm_rate=300.0, detect=2.0, repair=4.0, seed=3)
    system, recorder = _run(faults, jobs=20, tasks=8)
    _check_every_task_ended_once_and_every_node_is_free(system, recorder)
    counters = system.counters()
    assert counters["worker_crashes"] and counters["lm_crashes"] and counters["gm_crashes"]
    assert sum(r.retries for r in recorder.tasks.values()) == counters["retries"]


def test_a_partition_delays_messages_and_loses_nothing() -> None:
    faults = Faults(at=(Fault("lm", 1.5, 0, down=6.0, partition=True), Fault("gm", 2.0, 1, down=4.0, partition=True)))
    system, recorder = _run(faults)
    _check_every_task_ended_once_and_every_node_is_free(system, recorder)
    assert system.counters()["partitions"] == 2 and system.lms[0].incarnation == 0
    cut_off = [r for r in recorder.tasks.values() if r.lm == 0 and 1.5 < r.decided_at < 7.5]
    assert cut_off and all(r.started_at >= 7.5 for r in cut_off)  # launched once the partition healed


def test_fail_specs_parse_and_bad_ones_say_why_in_one_line() -> None:
    specs = [
        "worker:rate=2",
        "worker:at=10,lm=1,node=3",
        "lm:rate=0.5",
        "lm:at=5,lm=1,down=12",
        "gm:at=7,gm=0",
        "gm:rate=1",
        "partition:at=3,gm=1,down=2",
    ]
    faults = parse_faults(specs, 30.0, 60.0, 7)
    assert faults == Faults(
        2.0,
        0.5,
        1.0,
        (
            Fault("worker", 10.0, 1, 3),
            Fault("lm", 5.0, 1, down=12.0),
            Fault("gm", 7.0, 0),
            Fault("gm", 3.0, 1, down=2.0, partition=True),
        ),
        30.0,
        60.0,
        7,
    )
    assert faults.down(faults.at[2]) == 60.0
    assert parse_faults([], 30.0, 60.0, 0) is None
    for bad, why in (
        ("disk:rate=1", "unknown component 'disk'"),
        ("worker", "no fields"),
        ("worker:rate=x", "rate='x' is not a number"),
        ("lm:rate=-1", "rate=-1 must be >= 0"),
        ("worker:at=1,lm=0", "missing field 'node'"),
        ("lm:at=1,lm=0,node=2", "unknown field 'node'"),
        ("gm:at=1,gm=1.5", "gm='1.5' is not a whole number"),
        ("gm:at=1,gm=0,down=0", "down=0 must be > 0"),
        ("gm:rate=1,at=2", "rate= goes alone"),
        ("lm:at=1,at=2,lm=0", "field 'at' given twice"),
        ("lm:at,lm=0", "field 'at' has no value"),
        ("partition:at=1,lm=0,gm=1", "name one of lm= or gm="),
        ("worker:at=1,lm=0,node=0,down=10", "down=10 must be > the detection time 30"),
    ):
        with pytest.raises(ValueError, match=why) as caught:
            parse_faults([bad], 30.0, 60.0, 0)
        message = str(caught.value)
        assert "\n" not in message and message.startswith(("--fail ", "crash of")), message
    with pytest.raises(ValueError, match="worker crashes need repair > detect"):
        Faults(worker_rate=1.0, detect=10.0, repair=10.0)
    assert Faults(lm_rate=1.0, detect=30.0, repair=10.0).repair == 10.0  # no worker is repaired
    with pytest.raises(ValueError, match="this system has 2 GMs"):
        _run(Faults(at=(Fault("gm", 1.0, 2),)))
    with pytest.raises(ValueError, match="LM 1 has no node 9"):
        _run(Faults(at=(Fault("worker", 1.0, 1, 9),)))


def test_the_failure_experiment_runs_reduced_and_writes_its_page(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from megha.sim.experiments import failures

    argv = ["--rates", "0", "30", "--lm-rates", "20", "--gm-rates", "20", "--first-jobs", "20", "--out", str(tmp_path)]
    assert failures.main(argv) == 0
    page = (tmp_path / "failures.md").read_text()
    assert "Produced by `python -m megha.sim.experiments.failures`" in page
    rows = (tmp_path / "failures.csv").read_text().splitlines()
    assert len(rows) == 5 and rows[1].startswith("none,0.0,0,5000,5000,0,0")
    assert [r.split(",")[0] for r in rows[1:]] == ["none", "worker", "lm", "gm"]
