"""The Sparrow baseline: batch sampling with late binding, worker-side reservation queues, constraint-aware probes."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Sequence

import pytest

from megha.common.core.baselines.sparrow import EligibleNodes, Probe, SparrowScheduler
from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.constraints import ALL_CONSTRAINTS_MASK, NUM_CONSTRAINTS
from megha.common.core.fairness.config import FairnessConfig, QueueSpec
from megha.common.core.messages import Placement, Send
from megha.common.core.task import JobSpec, TaskSpec
from megha.embedded.system import EmbeddedConfig
from megha.loadgen.recorder import Recorder
from megha.loadgen.replay import ReplayConfig, replay
from megha.sim.sparrow import SparrowConfig, SparrowSystem
from megha.sim.system import SCHEDULERS

HOP = 0.0005
NODE = (64000, 16384)


def _cluster(masks_per_lm: Sequence[Sequence[int]], capacity: tuple[int, int] = NODE) -> ClusterSpec:
    return ClusterSpec(
        tuple((PartitionSpec(lm, 0, (capacity,) * len(masks), tuple(masks)),) for lm, masks in enumerate(masks_per_lm))
    )


def _job(job_id: str, durations: Sequence[float], at: float = 0.0, request=NODE, constraints=0) -> JobSpec:  # type: ignore[no-untyped-def]
    return JobSpec(
        job_id,
        tuple(TaskSpec(f"{job_id}.{i}", job_id, "u", d, request, constraints) for i, d in enumerate(durations)),
        at,
    )


class _Counting(Recorder):
    """A recorder that also counts starts per task and keeps every placement."""

    def __init__(self) -> None:
        super().__init__()
        self.starts: Counter[str] = Counter()
        self.placements: list[Placement] = []

    def started(self, placements: Sequence[Placement], now: float) -> None:
        super().started(placements, now)
        self.starts.update(p.task.task_id for p in placements)
        self.placements.extend(placements)


def _run(cluster: ClusterSpec, jobs: Sequence[JobSpec], schedulers: int = 1, seed: int = 0):  # type: ignore[no-untyped-def]
    recorder = _Counting()
    system = SparrowSystem(cluster, EmbeddedConfig(hop_delay=HOP, seed=seed), recorder, SparrowConfig(schedulers))
    for k, job in enumerate(jobs):
        recorder.expect(k % schedulers, job)
        system.submit(k % schedulers, job)
    system.run()
    return system, recorder


def _assert_clean_end(system: SparrowSystem, recorder: _Counting) -> None:
    accepted = [t for t in recorder.tasks.values() if not t.failed_reason]
    assert all(recorder.starts[t.task_id] == 1 and t.completions == 1 for t in accepted), "a task ran twice or never"
    assert system.stranded_tasks() == []
    assert system.queued_reservations() == 0
    assert all(w.is_idle() for w in system.workers)
    c = system.counters()
    assert c["get_task_requests"] == c["probes"], "every reservation is answered exactly once"
    assert c["get_task_requests"] - c["noops"] == len(accepted)


# ------------------------------------------------------------------- hand-checked scenarios


def test_two_task_job_on_four_idle_workers() -> None:
    system, rec = _run(_cluster([[0, 0, 0, 0]]), [_job("j", [1.0, 1.0])])
    # Probe ratio 2: 2 x 2 = 4 reservations, one on each worker; all four ask, two get tasks, two get no-ops.
    assert system.counters() == {"probes": 4, "get_task_requests": 4, "noops": 2}
    for t in rec.tasks.values():
        assert t.arrival == pytest.approx(HOP)  # loadgen -> scheduler
        assert t.attempt_at == pytest.approx(HOP)  # probes sent at once
        assert t.decided_at == pytest.approx(3 * HOP)  # probe hop + getTask hop
        assert t.launched_at == t.worker_received_at == pytest.approx(4 * HOP)  # task hop
        assert t.started_at == pytest.approx(4 * HOP)
        assert t.finished_at == pytest.approx(1.0 + 4 * HOP)
        assert t.allocation_time == pytest.approx(3 * HOP)
    assert len({t.node for t in rec.tasks.values()}) == 2
    assert rec.jobs["j"].jrt_delay == pytest.approx(4 * HOP)
    _assert_clean_end(system, rec)


def test_reservation_waits_at_the_head_of_a_busy_worker_queue() -> None:
    # One worker; two one-task jobs at t=0. Each job probes its only eligible worker once (never twice: a
    # second reservation of the same job on the same worker could only be a no-op).
    system, rec = _run(_cluster([[0]]), [_job("a", [1.0]), _job("b", [1.0])])
    assert system.counters() == {"probes": 2, "get_task_requests": 2, "noops": 0}
    a, b = rec.tasks["a.0"], rec.tasks["b.0"]
    assert a.started_at == pytest.approx(4 * HOP)
    assert a.finished_at == pytest.approx(1.0 + 4 * HOP)
    # b's reservation reaches the head when a finishes; getTask and the task take one hop each.
    assert b.decided_at == pytest.approx(1.0 + 5 * HOP)
    assert b.started_at == pytest.approx(1.0 + 6 * HOP)
    assert b.allocation_time == pytest.approx(1.0 + 5 * HOP)
    _assert_clean_end(system, rec)


def test_fewer_eligible_workers_than_tasks_spreads_one_reservation_per_task() -> None:
    system, rec = _run(_cluster([[0]]), [_job("j", [1.0, 1.0, 1.0])])
    assert system.counters() == {"probes": 3, "get_task_requests": 3, "noops": 0}
    starts = sorted(t.started_at for t in rec.tasks.values())
    assert starts == pytest.approx([4 * HOP, 1.0 + 6 * HOP, 2.0 + 8 * HOP])
    _assert_clean_end(system, rec)


def test_scaled_requests_share_a_node_and_wait_when_it_is_full() -> None:
    half = (NODE[0] // 2, NODE[1] // 2)
    # One node: three half-node tasks of one job; two run at once, the third waits for a slot.
    system, rec = _run(_cluster([[0]]), [_job("j", [1.0, 1.0, 1.0], request=half)])
    starts = sorted(t.started_at for t in rec.tasks.values())
    assert starts == pytest.approx([4 * HOP, 4 * HOP, 1.0 + 6 * HOP])
    _assert_clean_end(system, rec)


# ------------------------------------------------------------------- constraints and admission


def test_probes_only_go_to_workers_satisfying_the_constraints() -> None:
    rng = random.Random(7)
    masks = [[rng.getrandbits(NUM_CONSTRAINTS) for _ in range(40)] for _ in range(3)]
    eligible = EligibleNodes(_cluster(masks))
    scheduler = SparrowScheduler(0, eligible, probe_ratio=2.0, seed=3)
    for k in range(200):
        node_mask = masks[rng.randrange(3)][rng.randrange(40)]
        constraints = node_mask & rng.getrandbits(NUM_CONSTRAINTS) & rng.getrandbits(NUM_CONSTRAINTS)
        tasks = rng.randint(1, 30)
        out = scheduler.submit(_job(f"j{k}", [1.0] * tasks, constraints=constraints), 0.0)
        probes = [o.msg for o in out if isinstance(o, Send) and isinstance(o.msg, Probe)]
        assert len(probes) == len(out)
        placed = [(p.lm, node, res) for p in probes for node, res in p.reservations]
        assert all(not res.constraints & ~masks[lm][node] for lm, node, res in placed)
        n = sum(1 for row in masks for m in row if not constraints & ~m)
        assert len(placed) == min(math.ceil(2 * tasks), max(tasks, n))
        if len(placed) <= n:
            assert len({(lm, node) for lm, node, _ in placed}) == len(placed), "one reservation per worker"


def test_constrained_run_places_every_task_on_a_worker_satisfying_it() -> None:
    rng = random.Random(11)
    masks = [[rng.getrandbits(NUM_CONSTRAINTS) | 1 for _ in range(15)] for _ in range(2)]
    flat = [m for row in masks for m in row]
    jobs = []
    for k in range(40):
        tasks = tuple(
            TaskSpec(
                f"j{k}.{i}", f"j{k}", "u", rng.choice([0.5, 1.0, 2.0]), NODE, rng.choice(flat) & rng.getrandbits(4)
            )
            for i in range(rng.randint(1, 12))
        )
        jobs.append(JobSpec(f"j{k}", tasks, rng.uniform(0, 5)))
    jobs.sort(key=lambda j: j.submitted_at)
    system, rec = _run(_cluster(masks), jobs, schedulers=3, seed=5)
    assert system.rejected == []
    assert len(rec.placements) == sum(len(j.tasks) for j in jobs)
    assert all(not p.task.constraints & ~masks[p.lm][p.node] and not p.repartition for p in rec.placements)
    # One task per node at a time in slot mode.
    by_node: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for t in rec.tasks.values():
        by_node.setdefault((t.lm, t.node), []).append((t.started_at, t.finished_at))
    for spans in by_node.values():
        spans.sort()
        assert all(prev[1] <= nxt[0] + 1e-12 for prev, nxt in itertools.pairwise(spans))
    _assert_clean_end(system, rec)


def test_scaled_run_never_overcommits_a_node() -> None:
    rng = random.Random(2)
    sizes = [(NODE[0] // d, NODE[1] // d) for d in (1, 2, 4, 8)]
    jobs = [
        JobSpec(
            f"j{k}",
            tuple(TaskSpec(f"j{k}.{i}", f"j{k}", "u", rng.uniform(0.1, 2), rng.choice(sizes), 0) for i in range(8)),
            k * 0.05,
        )
        for k in range(60)
    ]
    system, rec = _run(_cluster([[0] * 4, [0] * 4]), jobs, schedulers=2)
    events: dict[tuple[int, int], list[tuple[float, int, tuple[int, ...]]]] = {}
    for t in rec.tasks.values():
        events.setdefault((t.lm, t.node), []).extend([(t.started_at, 1, t.request), (t.finished_at, 0, t.request)])
    for evs in events.values():
        used = [0, 0]
        for _, starting, req in sorted(evs):  # finishes (0) before starts (1) at equal times
            used = [u + (r if starting else -r) for u, r in zip(used, req)]
            assert all(u <= c for u, c in zip(used, NODE))
    _assert_clean_end(system, rec)


def test_jobs_no_worker_could_run_are_rejected_with_the_reason() -> None:
    cluster = _cluster([[0b1, 0b11]], capacity=(1000, 1000))
    system, rec = _run(
        cluster,
        [
            _job("ok", [1.0], request=(1000, 1000), constraints=0b10),
            _job("constraint", [1.0, 1.0], request=(1000, 1000), constraints=0b100),
            _job("too-big", [1.0], request=(1000, 2000), constraints=0b1),
        ],
    )
    reasons = {job.job_id: reason for job, reason in system.rejected}
    assert set(reasons) == {"constraint", "too-big"}
    assert "task constraint.0: no node satisfies placement constraints [2]" in reasons["constraint"]
    assert "no node has capacity for cpu_millicores=1000" in reasons["too-big"]
    assert rec.jobs["constraint"].rejected_reason and rec.jobs["too-big"].rejected_reason
    assert system.counters()["probes"] == 1  # only the 0b11 worker satisfies "ok"'s constraint 1
    _assert_clean_end(system, rec)


def test_config_is_validated_and_registered() -> None:
    assert type(SCHEDULERS["sparrow"](_cluster([[0b11]]), EmbeddedConfig(), None)) is SparrowSystem  # built on demand
    with pytest.raises(ValueError, match="probe_ratio"):
        SparrowConfig(probe_ratio=0.5)
    with pytest.raises(ValueError, match="schedulers"):
        SparrowConfig(schedulers=0)
    with pytest.raises(ValueError, match="no fairness policy"):
        SparrowSystem(_cluster([[0]]), EmbeddedConfig(fairness=FairnessConfig((QueueSpec("u", 1.0, 0),))))
    system = SparrowSystem(_cluster([[ALL_CONSTRAINTS_MASK]]), EmbeddedConfig())
    assert system.entry_points == 10
    with pytest.raises(ValueError, match="no scheduler 10"):
        system.submit(10, _job("j", [1.0]))


# ------------------------------------------------------------------- replay


@pytest.mark.parametrize("mode", ["slot", "scaled"])
def test_reduced_replay_completes_every_accepted_task_once(mode: str) -> None:
    result = replay(
        ReplayConfig(trace="syn:50:20", lms=2, gms=2, workers_per_partition=25, scheduler="sparrow", mode=mode)
    )
    m = result.metrics
    system = result.system
    assert isinstance(system, SparrowSystem)
    assert m.tasks == 1000 and m.not_exactly_once == ()
    assert m.tasks_completed + m.tasks_failed == m.tasks
    rejected = {job.job_id for job, _ in system.rejected}
    assert all((t.completions == 1) != (t.job_id in rejected) for t in result.recorder.tasks.values()), (
        "accepted tasks complete once; rejected ones never run"
    )
    assert m.tasks_completed > 0
    assert system.queued_reservations() == 0 and system.stranded_tasks() == []
    # Three hops from scheduler to start at best (probe, getTask, task).
    assert m.allocation_time.median >= 3 * HOP - 1e-9
