"""The centralized baseline (the Megha paper's comparison): Megha with one GM and one LM over the same workers."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.task import JobSpec, TaskSpec
from megha.embedded.system import EmbeddedConfig
from megha.loadgen.recorder import Recorder
from megha.loadgen.replay import ReplayConfig, replay
from megha.sim.system import build_system, centralized_cluster

HOP = 0.0005
NODE = (64000, 16384)


def _cluster(lms: int, gms: int, workers: int, masks: Sequence[int] | None = None) -> ClusterSpec:
    """`lms` x `gms` partitions of `workers` nodes; node k of the data centre gets machine constraints masks[k]."""
    rows = []
    for lm in range(lms):
        row = []
        for gm in range(gms):
            first = (lm * gms + gm) * workers
            node_masks = tuple(masks[first : first + workers]) if masks else (0,) * workers
            row.append(PartitionSpec(lm, gm, (NODE,) * workers, node_masks))
        rows.append(tuple(row))
    return ClusterSpec(tuple(rows))


def _job(job_id: str, durations: Sequence[float], constraints: int = 0) -> JobSpec:
    tasks = tuple(TaskSpec(f"{job_id}.{i}", job_id, "u", d, NODE, constraints) for i, d in enumerate(durations))
    return JobSpec(job_id, tasks, 0.0)


def test_centralized_cluster_is_every_node_in_one_partition_of_one_lm() -> None:
    cluster = _cluster(2, 3, 2, masks=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    merged = centralized_cluster(cluster)
    assert (merged.num_lms, merged.num_gms, merged.num_nodes) == (1, 1, 12)
    assert merged.partitions[0][0].constraint_masks == tuple(range(1, 13))  # LM by LM, partition by partition
    assert merged.total_capacity() == cluster.total_capacity()


def test_hand_checked_job_larger_than_the_data_centre() -> None:
    # Five one-second tasks on four workers (2 LMs x 2 GMs x 1, merged into one LM and one GM). Four start two
    # hops after reaching the GM (GM -> LM -> worker). The fifth waits for the first completion to come back to
    # the GM (worker -> LM -> GM, two hops) and then takes the same two hops to start.
    recorder = Recorder()
    system = build_system("centralized", _cluster(2, 2, 1), EmbeddedConfig(hop_delay=HOP), recorder)
    job = _job("j", [1.0] * 5)
    recorder.expect(0, job)
    system.submit(0, job)
    system.run()
    tasks = sorted(recorder.tasks.values(), key=lambda t: t.started_at)
    arrival = tasks[0].arrival
    assert [t.allocation_time for t in tasks[:4]] == pytest.approx([2 * HOP] * 4)
    first_end = tasks[0].finished_at
    assert first_end == pytest.approx(arrival + 2 * HOP + 1.0)
    assert tasks[4].started_at == pytest.approx(first_end + 4 * HOP)
    assert tasks[4].allocation_time == pytest.approx(1.0 + 6 * HOP)
    assert len({t.node for t in tasks[:4]}) == 4 and tasks[4].node in {t.node for t in tasks[:4]}
    assert all(t.completions == 1 for t in tasks)
    gm = system.gms[0]  # type: ignore[attr-defined]
    assert len(system.gms) == 1 and len(system.lms) == 1  # type: ignore[attr-defined]
    assert gm.repartitions == 0 and gm.inconsistencies == 0 and gm.reschedules == 1


@pytest.mark.parametrize("trace", ["syn:100:30", "syn:170:20"])
def test_centralized_never_repartitions_where_megha_does(trace: str) -> None:
    fields = dict(trace=trace, lms=3, gms=3, workers_per_partition=20, seed=2)
    megha = replay(ReplayConfig(**fields))  # type: ignore[arg-type]
    centralized = replay(ReplayConfig(scheduler="centralized", **fields))  # type: ignore[arg-type]
    assert megha.metrics.repartitions > 0  # the same load makes Megha's GMs borrow partitions
    assert centralized.metrics.repartitions == 0
    assert sum(gm.repartitions for gm in centralized.system.gms) == 0  # type: ignore[attr-defined]
    for result in (megha, centralized):
        m = result.metrics
        assert m.tasks_completed > 0 and not m.not_exactly_once and m.tasks_completed + m.tasks_failed == m.tasks
