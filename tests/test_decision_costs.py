"""The decision-time model: what a message costs a GM or LM, GMs and LMs as FIFO servers on the virtual clock, and
allocation time's processing and framework queuing under it (virtual-clock results only, never machine timings)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from megha.cli import main
from megha.common.clusterfile import generate_cluster
from megha.common.core.costs import CALIBRATED, ZERO, DecisionCosts
from megha.common.core.messages import Delta, DeltaTick, LaunchBatch, NodeState, Placement, Send, WorkerReport
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.transport.inmemory import EventLoop
from megha.embedded.faults import parse_faults
from megha.embedded.system import EmbeddedConfig, EmbeddedSystem
from megha.loadgen.recorder import Recorder
from megha.loadgen.replay import ReplayConfig, replay
from megha.loadgen.trace import synthetic_trace
from megha.loadgen.workload import WorkloadConfig, build_workload

NODE = (64000, 16384)


def _task(k: int) -> TaskSpec:
    return TaskSpec(f"t{k}", "j", "u", 1.0, (1000, 100), 0)


@dataclass(slots=True)
class _Wrapped:
    job: JobSpec


def test_each_message_costs_its_fixed_part_plus_its_part_per_item() -> None:
    costs = DecisionCosts(
        gm_per_job=1.0, gm_per_task=0.1, gm_per_message=2.0, gm_per_node=0.01, lm_per_batch=3.0, lm_per_placement=0.5
    )
    job = JobSpec("j", tuple(_task(k) for k in range(4)), 0.0)
    assert costs.cost("gm", job) == pytest.approx(1.4)
    assert costs.cost("gm", _Wrapped(job)) == pytest.approx(1.4)  # a driver's submission wrapping the job
    nodes = [NodeState(n, (1, 1), 1) for n in range(3)]
    assert costs.cost("gm", Delta(0, 0, 0, nodes)) == pytest.approx(2.03)
    batch = LaunchBatch(0, 0, 1, [Placement(_task(k), 0, k, False) for k in range(2)])
    assert costs.cost("lm", batch) == pytest.approx(4.0)
    assert costs.cost("lm", WorkerReport(0, [])) == 0.0  # lm_per_message left at 0
    assert ZERO.zero and not costs.zero and not CALIBRATED.zero


def test_a_negative_cost_or_an_unknown_endpoint_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="gm_per_task must be >= 0"):
        DecisionCosts(gm_per_task=-1.0)
    with pytest.raises(ValueError, match="endpoint kind 'worker'"):
        DecisionCosts().cost("worker", DeltaTick())  # type: ignore[arg-type]


def test_a_server_handles_messages_one_at_a_time_in_arrival_order_and_sends_when_done() -> None:
    loop = EventLoop(hop_delay=0.5, costs=DecisionCosts(lm_per_message=2.0))
    handled: list[float] = []
    received: list[tuple[float, object]] = []

    def lm(msg: object, now: float) -> list[Send]:
        handled.append(now)
        return [Send("sink", now)]

    loop.register("lm/0", lm, "lm")
    loop.register("sink", lambda msg, now: received.append((now, msg)) or [])
    for at in (1.0, 1.0, 2.0, 9.0):
        loop.post(at, "lm/0", DeltaTick())
    loop.run(lambda: False)
    assert handled == [1.0, 3.0, 5.0, 9.0]  # the 2nd and 3rd waited for the LM; the 4th found it idle
    assert received == [(3.5, 1.0), (5.5, 3.0), (7.5, 5.0), (11.5, 9.0)]  # sent when each handling ended


def test_without_a_model_and_for_other_endpoints_handling_takes_no_time() -> None:
    for loop, kind in ((EventLoop(hop_delay=0.5, costs=ZERO), "lm"), (EventLoop(0.5, costs=CALIBRATED), None)):
        received: list[float] = []
        loop.register("lm/0", lambda msg, now: [Send("sink", now)], kind)
        loop.register("sink", lambda msg, now, received=received: received.append(now) or [])
        loop.post(1.0, "lm/0", DeltaTick())
        loop.post(1.0, "lm/0", DeltaTick())
        loop.run(lambda: False)
        assert received == [1.5, 1.5]


def _burst(gms: int, costs: DecisionCosts | None, lms: int = 2) -> Recorder:
    """20 jobs of 50 tasks, one every millisecond, on 400 nodes split over `gms` GMs and `lms` LMs."""
    cluster = generate_cluster(lms, gms, 400 // (lms * gms), NODE, 0)
    recorder = Recorder()
    system = EmbeddedSystem(cluster, EmbeddedConfig(costs=costs), recorder)
    trace = synthetic_trace(50, 20, task_duration=0.001, interval=0.001)
    for gm, job in build_workload(trace, WorkloadConfig("slot", 0, gms, NODE, constraints=False)):
        recorder.expect(gm, job)
        system.submit(gm, job)
    system.run()
    assert all(r.completions == 1 for r in recorder.tasks.values())
    return recorder


def _column(recorder: Recorder, name: str) -> np.ndarray:
    return np.array([getattr(r, name) for r in recorder.tasks.values()])


BURST_COSTS = DecisionCosts(gm_per_job=0.001, gm_per_task=0.0001, lm_per_batch=0.0001, lm_per_placement=0.00001)


def test_with_decision_costs_more_gms_place_an_overloaded_burst_sooner() -> None:
    one, four = _burst(1, BURST_COSTS), _burst(4, BURST_COSTS)
    p99 = {n: float(np.percentile(_column(r, "allocation_time"), 99)) for n, r in ((1, one), (4, four))}
    # One GM needs 20 x 6 ms = 120 ms for what arrives in 20 ms; four GMs share it.
    assert p99[1] > 0.1
    assert p99[4] < p99[1] / 2
    for recorder in (one, four):
        queuing, processing = _column(recorder, "framework_queuing"), _column(recorder, "processing")
        assert queuing.max() > 0 and processing.max() >= 0.006  # a task placed at submission waits for it all
        assert processing.min() > 0  # every launch batch takes the LM time
        parts = queuing + processing + _column(recorder, "communication") + _column(recorder, "worker_queuing")
        assert np.allclose(parts, _column(recorder, "allocation_time"))
    assert np.percentile(_column(one, "framework_queuing"), 99) > 0.09


def test_with_decision_costs_more_lms_validate_an_overloaded_burst_sooner() -> None:
    costs = DecisionCosts(lm_per_batch=0.001, lm_per_placement=0.0005)
    one, four = _burst(1, costs, lms=1), _burst(1, costs, lms=4)
    p99 = {n: float(np.percentile(_column(r, "allocation_time"), 99)) for n, r in ((1, one), (4, four))}
    # One LM needs 20 x 26 ms for the batches of what arrives in 20 ms; four LMs validate a quarter each.
    assert p99[1] > 0.4
    assert p99[4] < p99[1] / 2
    # The LM's wait and validation count as processing: a batch alone takes 26 ms.
    assert np.percentile(_column(one, "processing"), 99) > 0.1


def test_with_zero_cost_deciding_adds_nothing_to_allocation_time() -> None:
    for costs in (None, ZERO):
        recorder = _burst(1, costs)
        assert not _column(recorder, "framework_queuing").any()
        assert not _column(recorder, "processing").any()
        assert np.allclose(_column(recorder, "communication"), 0.001)


def test_replay_takes_the_calibrated_model_by_name() -> None:
    config = ReplayConfig(trace="syn:40:10", lms=2, gms=2, workers_per_partition=30, constraints=False)
    zero, calibrated = replay(config), replay(ReplayConfig(**{**_fields(config), "decision_costs": "calibrated"}))
    assert zero.metrics.components["processing"].max == 0.0
    assert calibrated.metrics.components["processing"].median > 0.0
    assert calibrated.metrics.allocation_time.median > zero.metrics.allocation_time.median
    assert calibrated.metrics.tasks_completed == zero.metrics.tasks_completed == 400
    with pytest.raises(ValueError, match="decision costs 'fast': choose from zero, calibrated"):
        replay(ReplayConfig(**{**_fields(config), "decision_costs": "fast"}))
    with pytest.raises(ValueError, match="--realtime"):
        replay(ReplayConfig(**{**_fields(config), "decision_costs": "calibrated", "realtime": True}))


def test_with_decision_costs_gm_lm_and_worker_crashes_lose_no_task() -> None:
    faults = parse_faults(["gm:at=5,gm=1,down=3", "lm:at=8,lm=0,down=3", "worker:rate=50"], 2.0, 4.0, 0)
    config = ReplayConfig(
        trace="syn:20:30", lms=2, gms=2, workers_per_partition=10, constraints=False, faults=faults, seed=1
    )
    result = replay(ReplayConfig(**{**_fields(config), "decision_costs": "calibrated"}))
    m = result.metrics
    assert m.tasks_completed == m.tasks == 600 and m.not_exactly_once == ()
    assert result.system.counters()["gm_crashes"] == 1 and result.system.counters()["lm_crashes"] == 1
    assert m.components["processing"].median > 0.0


def _fields(config: ReplayConfig) -> dict[str, object]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


def test_cli_replay_option_names_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["replay", "--trace", "syn:10:4", "--lms", "1", "--gms", "1", "--workers-per-partition", "10"]
    assert main([*args, "--no-constraints", "--no-files", "--quiet", "--decision-costs", "calibrated"]) == 0
    assert "(rarity LM order, rarity matching, slot mode, calibrated decision costs)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        main([*args, "--decision-costs", "slow"])
    assert exited.value.code == 2
    assert "--decision-costs: invalid choice: 'slow' (choose from calibrated, zero)" in capsys.readouterr().err
