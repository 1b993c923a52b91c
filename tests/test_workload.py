"""Workloads: the constraint statistics and sampler, and trace jobs turned into Megha jobs."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from megha.common import constraint_stats
from megha.common.clusterfile import DEFAULT_NODE_CAPACITY, PROTOTYPE_NODE_CAPACITY
from megha.common.constraint_stats import ConstraintStats, TaskConstraintSampler, load_constraint_stats
from megha.common.core.constraints import NUM_CONSTRAINTS
from megha.loadgen.trace import TraceJob, synthetic_trace
from megha.loadgen.workload import CORE_WEIGHTS, MEMORY_GB_WEIGHTS, WorkloadConfig, build_workload

SHARED_STATS = Path(__file__).resolve().parents[1].parent / "shared" / "constraints" / "sharma2011-constraints.json"
PACKAGED_STATS = Path(__file__).resolve().parents[1] / "common" / "data" / "sharma2011-constraints.json"


@pytest.fixture(scope="module")
def stats() -> ConstraintStats:
    return load_constraint_stats()


def cluster_probability(stats: ConstraintStats) -> dict[tuple[int, int], float]:
    """P(task type t and statistical cluster c) under the published procedure."""
    result = {}
    for t in (1, 2, 3, 4):
        total = sum(w[t] for w in stats.cluster_weights.values())
        for c, w in stats.cluster_weights.items():
            result[(t, c)] = 0.25 * w[t] / total
    return result


def test_sampler_frequencies_match_the_published_procedure(stats: ConstraintStats) -> None:
    sampler = TaskConstraintSampler(stats, seed=42)
    n = 100_000
    masks = [sampler.sample() for _ in range(n)]
    p = cluster_probability(stats)
    freq = stats.task_frequency_percent
    for j in range(NUM_CONSTRAINTS):
        expected = sum(pc * freq[c][j] / 100 for (_, c), pc in p.items())
        observed = sum(m >> j & 1 for m in masks) / n
        assert observed == pytest.approx(expected, abs=0.006), f"constraint {j}"
    # Constraints are independent only within a cluster: the joint frequency of two constraints is the
    # cluster mixture of products, not the product of the marginals.
    expected_pair = sum(pc * freq[c][6] / 100 * freq[c][20] / 100 for (_, c), pc in p.items())
    observed_pair = sum(1 for m in masks if m >> 6 & 1 and m >> 20 & 1) / n
    assert observed_pair == pytest.approx(expected_pair, abs=0.004)


def test_sampler_is_reproducible(stats: ConstraintStats) -> None:
    a, b, c = TaskConstraintSampler(stats, 5), TaskConstraintSampler(stats, 5), TaskConstraintSampler(stats, 6)
    draws = [a.sample() for _ in range(1000)]
    assert draws == [b.sample() for _ in range(1000)]
    assert draws != [c.sample() for _ in range(1000)]
    assert all(0 <= m < 1 << NUM_CONSTRAINTS for m in draws)


@pytest.mark.parametrize("uneven", [False, True])
def test_sampler_masks_are_the_samples_drawn_at_once(stats: ConstraintStats, uneven: bool) -> None:
    """`masks(n)` gives what `n` calls of `sample` give, and leaves the generator where they do, also when the
    clusters carry different numbers of constraints (so tasks draw different numbers of floats)."""
    if uneven:
        frequencies = dict(stats.task_frequency_percent)
        frequencies[3] = tuple(0.0 if j % 3 == 0 else p for j, p in enumerate(frequencies[3]))
        frequencies[7] = (0.0,) * NUM_CONSTRAINTS
        stats = ConstraintStats(frequencies, stats.cluster_weights, stats.machine_fraction)
    for seed in (0, 5):
        one, many = TaskConstraintSampler(stats, seed), TaskConstraintSampler(stats, seed)
        assert one.sample() == many.sample()
        for n in (0, 1, 2_000):
            assert many.masks(n) == [one.sample() for _ in range(n)]
        assert [one.sample() for _ in range(10)] == [many.sample() for _ in range(10)]


def test_sampler_masks_drawn_in_parts_are_the_samples(stats: ConstraintStats, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace longer than `MASKS_AT_ONCE` tasks is drawn in parts, which give the same masks as one draw."""
    monkeypatch.setattr(constraint_stats, "MASKS_AT_ONCE", 7)
    one, many = TaskConstraintSampler(stats, 3), TaskConstraintSampler(stats, 3)
    assert many.masks(50) == [one.sample() for _ in range(50)]
    assert one.sample() == many.sample()


def test_packaged_stats_shape(stats: ConstraintStats) -> None:
    assert sorted(stats.task_frequency_percent) == list(range(1, 11))
    assert all(len(v) == NUM_CONSTRAINTS for v in stats.task_frequency_percent.values())
    assert all(sorted(w) == [1, 2, 3, 4] for w in stats.cluster_weights.values())
    assert stats.machine_fraction[20] == 1.0


@pytest.mark.shared
def test_packaged_stats_equal_the_shared_copy(stats: ConstraintStats) -> None:
    if not SHARED_STATS.is_file():
        pytest.skip(f"needs {SHARED_STATS} (../shared is missing)")
    assert load_constraint_stats(SHARED_STATS) == stats


def set_field(section: str, key: str, value: object) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        doc[section][key] = value

    return edit


def drop_field(section: str, key: str) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        del doc[section][key]

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (set_field("machine_constraint_fraction", "fraction", [0.5] * 20), r"machine_fraction: has 20 entries"),
        (set_field("machine_constraint_fraction", "fraction", [0.5] * 20 + [1.5]), r"machine_fraction\[20\]: 1.5"),
        (
            set_field("machine_constraint_fraction", "fraction", "all"),
            r"machine_constraint_fraction.fraction: expected",
        ),
        (drop_field("machine_constraint_fraction", "fraction"), r"missing field machine_constraint_fraction.fraction"),
        (set_field("task_constraint_frequency_percent", "clusters", {"1": [1] * 21}), r"cluster_weights: clusters"),
        (set_field("task_constraint_frequency_percent", "clusters", {"x": [1] * 21}), r"key 'x' is not an integer"),
        (set_field("task_cluster_weights_by_task_type", "weights", {"1": {"1": 1}}), r"cluster_weights: clusters"),
        (set_field("task_cluster_weights_by_task_type", "weights", {"1": {"1": "a"}}), r"weights.1.1: 'a' is not"),
    ],
)
def test_malformed_stats_name_the_field(tmp_path: Path, edit: Callable[[dict[str, Any]], None], message: str) -> None:
    doc = json.loads(PACKAGED_STATS.read_text())
    edit(doc)
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=message) as info:
        load_constraint_stats(path)
    assert str(path) in str(info.value)


def test_stats_validate_weights_and_frequencies(stats: ConstraintStats) -> None:
    with pytest.raises(ValueError, match=r"task_frequency_percent\[3\]\[0\]: 101"):
        ConstraintStats(
            {**stats.task_frequency_percent, 3: (101.0,) * 21}, stats.cluster_weights, stats.machine_fraction
        )
    weights = {c: {**w, 2: 0.0} for c, w in stats.cluster_weights.items()}
    with pytest.raises(ValueError, match="task type 2 has zero total weight"):
        ConstraintStats(stats.task_frequency_percent, weights, stats.machine_fraction)
    with pytest.raises(ValueError, match=r"cluster_weights\[1\]: task types \[1, 2\]"):
        ConstraintStats(
            stats.task_frequency_percent, {**stats.cluster_weights, 1: {1: 1.0, 2: 1.0}}, stats.machine_fraction
        )


def test_slot_mode_requests_whole_nodes_and_assigns_gms_round_robin(stats: ConstraintStats) -> None:
    trace = [TraceJob(0.0, (1.0, 2.0)), TraceJob(0.5, (3.0,)), TraceJob(2.0, (1.0,) * 4), TraceJob(3.0, (5.0,))]
    config = WorkloadConfig(mode="slot", seed=1, num_gms=3, node_capacity=PROTOTYPE_NODE_CAPACITY, users=2)
    workload = build_workload(trace, config, stats)
    assert [gm for gm, _ in workload] == [0, 1, 2, 0]
    assert [job.job_id for _, job in workload] == ["j0", "j1", "j2", "j3"]
    assert [job.submitted_at for _, job in workload] == [0.0, 0.5, 2.0, 3.0]
    for (_, job), trace_job in zip(workload, trace, strict=True):
        assert [t.duration for t in job.tasks] == list(trace_job.durations)
        assert [t.task_id for t in job.tasks] == [f"{job.job_id}.{i}" for i in range(len(trace_job.durations))]
        assert all(t.job_id == job.job_id for t in job.tasks)
        assert all(t.request == PROTOTYPE_NODE_CAPACITY for t in job.tasks)
    assert [job.tasks[0].user for _, job in workload] == ["user-0", "user-1", "user-0", "user-1"]


def test_scaled_mode_requests_follow_the_documented_distribution(stats: ConstraintStats) -> None:
    config = WorkloadConfig(mode="scaled", seed=3, num_gms=2)
    tasks = [t for _, job in build_workload(synthetic_trace(1000, 20), config, stats) for t in job.tasks]
    cpu = Counter(t.request[0] for t in tasks)
    memory = Counter(t.request[1] for t in tasks)
    expected_cpu = {-(-cores * 1000 // 400): w / sum(CORE_WEIGHTS.values()) for cores, w in CORE_WEIGHTS.items()}
    expected_memory = {-(-gb * 1024 // 50): w / sum(MEMORY_GB_WEIGHTS.values()) for gb, w in MEMORY_GB_WEIGHTS.items()}
    assert set(cpu) == set(expected_cpu) == {3, 5, 10, 20, 40, 80}
    assert set(memory) == set(expected_memory) == {21, 41, 82, 164, 328}
    for amount, share in expected_cpu.items():
        assert cpu[amount] / len(tasks) == pytest.approx(share, abs=0.015)
    for amount, share in expected_memory.items():
        assert memory[amount] / len(tasks) == pytest.approx(share, abs=0.015)


def test_scaled_mode_scales_are_configurable(stats: ConstraintStats) -> None:
    config = WorkloadConfig(mode="scaled", seed=3, num_gms=1, cpu_scale=1, mem_scale=1)
    requests = {t.request for _, job in build_workload(synthetic_trace(500, 4), config, stats) for t in job.tasks}
    assert {cpu for cpu, _ in requests} <= {c * 1000 for c in CORE_WEIGHTS}
    assert {mem for _, mem in requests} <= {g * 1024 for g in MEMORY_GB_WEIGHTS}


def test_workload_is_reproducible_and_modes_share_constraints(stats: ConstraintStats) -> None:
    trace = synthetic_trace(50, 10)
    slot = build_workload(trace, WorkloadConfig("slot", seed=9, num_gms=5), stats)
    assert slot == build_workload(trace, WorkloadConfig("slot", seed=9, num_gms=5), stats)
    scaled = build_workload(trace, WorkloadConfig("scaled", seed=9, num_gms=5), stats)
    assert scaled == build_workload(trace, WorkloadConfig("scaled", seed=9, num_gms=5), stats)
    masks = [t.constraints for _, job in slot for t in job.tasks]
    assert masks == [t.constraints for _, job in scaled for t in job.tasks]
    other = build_workload(trace, WorkloadConfig("slot", seed=10, num_gms=5), stats)
    assert masks != [t.constraints for _, job in other for t in job.tasks]
    assert all(t.request == DEFAULT_NODE_CAPACITY for _, job in slot for t in job.tasks)


def test_default_stats_are_the_packaged_ones(stats: ConstraintStats) -> None:
    trace = synthetic_trace(20, 3)
    config = WorkloadConfig("slot", seed=2, num_gms=1)
    assert build_workload(trace, config) == build_workload(trace, config, stats)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "fair"}, "mode must be"),
        ({"num_gms": 0}, "num_gms must be at least 1"),
        ({"users": 0}, "users must be at least 1"),
        ({"cpu_scale": 0}, "cpu_scale must be at least 1"),
        ({"node_capacity": (0, 10)}, "node_capacity must be positive"),
    ],
)
def test_config_validation(kwargs: dict[str, object], message: str) -> None:
    config: dict[str, object] = {"mode": "slot", "seed": 1, "num_gms": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        WorkloadConfig(**config)  # type: ignore[arg-type]
