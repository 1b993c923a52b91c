"""Cluster files: the reference cluster, generated clusters, Megha's own format and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megha.common.clusterfile import (
    DEFAULT_NODE_CAPACITY,
    PROTOTYPE_NODE_CAPACITY,
    ClusterFileError,
    generate_cluster,
    load_cluster,
    load_cluster_file,
    load_reference_cluster,
    save_cluster,
)
from megha.common.constraint_stats import load_constraint_stats
from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.constraints import NUM_CONSTRAINTS, constraint_mask


def constraint_fractions(spec: ClusterSpec) -> list[float]:
    masks = [m for lm in range(spec.num_lms) for m in spec.lm_constraint_masks(lm)]
    return [sum(m >> k & 1 for m in masks) / len(masks) for k in range(NUM_CONSTRAINTS)]


def test_reference_cluster_shape_and_published_fractions(reference_cluster: Path) -> None:
    spec = load_reference_cluster(reference_cluster, DEFAULT_NODE_CAPACITY)
    assert (spec.num_lms, spec.num_gms) == (5, 5)
    assert all(part.size == 400 for row in spec.partitions for part in row)
    assert spec.num_nodes == 10_000
    assert set(spec.lm_capacities(3)) == {DEFAULT_NODE_CAPACITY}
    published = load_constraint_stats().machine_fraction
    assert [round(f, 4) for f in constraint_fractions(spec)] == list(published)


def test_reference_cluster_bit_order(reference_cluster: Path) -> None:
    doc = json.loads(reference_cluster.read_text())
    bits = doc["lms"]["2"]["3"]
    spec = load_reference_cluster(reference_cluster, PROTOTYPE_NODE_CAPACITY)
    part = spec.partitions[1][2]
    for node in (0, 1, 217, 399):
        assert part.constraint_masks[node] == constraint_mask(k for k in range(NUM_CONSTRAINTS) if bits[k][node] == "1")


def test_load_cluster_detects_reference_format(reference_cluster: Path) -> None:
    assert load_cluster(reference_cluster, PROTOTYPE_NODE_CAPACITY) == load_reference_cluster(
        reference_cluster, PROTOTYPE_NODE_CAPACITY
    )


def test_generated_cluster_is_reproducible_and_close_to_targets() -> None:
    spec = generate_cluster(5, 5, 400, DEFAULT_NODE_CAPACITY, seed=7)
    assert spec == generate_cluster(5, 5, 400, DEFAULT_NODE_CAPACITY, seed=7)
    assert spec != generate_cluster(5, 5, 400, DEFAULT_NODE_CAPACITY, seed=8)
    assert (spec.num_lms, spec.num_gms, spec.num_nodes) == (5, 5, 10_000)
    targets = load_constraint_stats().machine_fraction
    for k, (got, want) in enumerate(zip(constraint_fractions(spec), targets, strict=True)):
        assert got == pytest.approx(want, abs=0.02), f"constraint {k}"


def test_generated_cluster_capacity_and_resource_names() -> None:
    names = ("cpu_millicores", "memory_mb", "gpus")
    spec = generate_cluster(2, 3, 4, (1000, 2048, 1), seed=1, resource_names=names)
    assert spec.resource_names == names
    assert spec.total_capacity() == (24 * 1000, 24 * 2048, 24)
    with pytest.raises(ValueError, match="workers_per_partition"):
        generate_cluster(1, 1, 0, DEFAULT_NODE_CAPACITY, seed=1)


def test_node_capacity_constants() -> None:
    assert DEFAULT_NODE_CAPACITY == (64000, 16384)
    assert PROTOTYPE_NODE_CAPACITY == (2000, 4096)


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    names = ("cpu_millicores", "memory_mb", "gpus")
    spec = ClusterSpec(
        partitions=(
            (
                PartitionSpec(0, 0, ((2000, 4096, 1), (64000, 16384, 8)), (constraint_mask([0, 20]), 0)),
                PartitionSpec(0, 1, ((1000, 1024, 2),), (constraint_mask(range(21)),)),
            ),
            (
                PartitionSpec(1, 0, ((500, 512, 1),), (constraint_mask([5]),)),
                PartitionSpec(1, 1, ((500, 512, 1), (500, 512, 1)), (1, 2)),
            ),
        ),
        resource_names=names,
    )
    path = tmp_path / "cluster.json"
    save_cluster(spec, path)
    assert load_cluster_file(path) == spec
    assert load_cluster(path, node_capacity=(1, 1)) == spec
    assert json.loads(path.read_text())["lms"][0][0][0] == {
        "capacity": {"cpu_millicores": 2000, "memory_mb": 4096, "gpus": 1},
        "constraints": [0, 20],
    }


def test_generated_cluster_round_trip(tmp_path: Path) -> None:
    spec = generate_cluster(3, 2, 50, PROTOTYPE_NODE_CAPACITY, seed=3)
    save_cluster(spec, tmp_path / "c.json")
    assert load_cluster(tmp_path / "c.json") == spec


def own_format(**overrides: object) -> dict[str, object]:
    node = {"capacity": {"cpu_millicores": 2000, "memory_mb": 4096}, "constraints": [1]}
    doc: dict[str, object] = {
        "format": "megha-cluster",
        "version": 1,
        "resource_names": ["cpu_millicores", "memory_mb"],
        "lms": [[[node], [node]], [[node], [node]]],
    }
    doc.update(overrides)
    return doc


def bad_node(**fields: object) -> dict[str, object]:
    node: dict[str, object] = {"capacity": {"cpu_millicores": 2000, "memory_mb": 4096}, "constraints": [1]}
    node.update(fields)
    good = {"capacity": {"cpu_millicores": 2000, "memory_mb": 4096}, "constraints": []}
    return own_format(lms=[[[good], [good]], [[good], [good, node]]])


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (own_format(version=2), "format/version"),
        (own_format(resource_names=[]), "resource_names"),
        (own_format(lms=[]), "field lms must"),
        (own_format(lms=[[[]]]), r"lms\[0\]\[0\] \(LM 0 GM 0\)"),
        (own_format(lms=[[[{"capacity": {"cpu_millicores": 1, "memory_mb": 1}, "constraints": []}]], []]), r"lms\[1\]"),
        (bad_node(capacity={"cpu_millicores": 2000}), r"lms\[1\]\[1\]\[1\]\.capacity must give exactly"),
        (bad_node(capacity={"cpu_millicores": 0, "memory_mb": 1}), r"lms\[1\]\[1\]\[1\]\.capacity\.cpu_millicores"),
        (bad_node(capacity={"cpu_millicores": 1.5, "memory_mb": 1}), r"capacity\.cpu_millicores must be a positive"),
        (bad_node(constraints=[21]), r"lms\[1\]\[1\]\[1\]\.constraints: constraint id 21"),
        (bad_node(constraints="0,1"), r"lms\[1\]\[1\]\[1\]\.constraints must be a list"),
        (bad_node(constraints=[True]), r"\.constraints must be a list"),
        (bad_node(constraints=[3, 5, 3]), r"lms\[1\]\[1\]\[1\]\.constraints lists \[3\] more than once"),
        (bad_node(color="red"), r"lms\[1\]\[1\]\[1\] has fields a node has not: 'color'"),
        ({"about": "neither"}, "neither Megha's format"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_malformed_own_format_names_the_field(tmp_path: Path, doc: object, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ClusterFileError, match=message) as info:
        load_cluster(path)
    assert str(path) in str(info.value)


def reference_doc(nodes: int = 3) -> dict[str, object]:
    partition = ["1" * nodes] + ["0" * nodes] * (NUM_CONSTRAINTS - 1)
    return {"lms": {"1": {"1": partition, "2": partition}, "2": {"1": partition, "2": list(partition)}}}


def corrupt(path: list[str], value: object) -> dict[str, object]:
    doc = reference_doc()
    target: dict[str, object] = doc
    for key in path[:-1]:
        target = target[key]  # type: ignore[assignment]
    target[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (corrupt(["lms", "2", "2"], ["111"] * 20), 'lms\\["2"\\]\\["2"\\]: expected a list of 21 bit strings, got 20'),
        (corrupt(["lms", "2", "1"], ["111"] * 20 + ["11"]), 'lms\\["2"\\]\\["1"\\]: constraint 20 has 2 nodes'),
        (corrupt(["lms", "1", "2"], ["1x1"] * 21), 'lms\\["1"\\]\\["2"\\]: constraint 0 is not a string of 0s'),
        (corrupt(["lms", "1", "2"], [""] * 21), 'lms\\["1"\\]\\["2"\\]: partition has no nodes'),
        (corrupt(["lms", "2"], {"1": ["111"] * 21, "3": ["111"] * 21}), 'lms\\["2"\\] keys \\[1, 3\\] are not 1..2'),
        (corrupt(["lms", "2"], {"1": ["111"] * 21}), 'lms\\["2"\\] has 1 GM partitions, lms\\["1"\\] has 2'),
        (corrupt(["lms"], {"a": {}}), "field lms has keys that are not plain numbers"),
    ],
)
def test_malformed_reference_format_names_lm_and_gm(tmp_path: Path, doc: object, message: str) -> None:
    path = tmp_path / "bad-reference.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ClusterFileError, match=message):
        load_cluster(path)


def test_small_reference_file_maps_keys_to_zero_based_ids(tmp_path: Path) -> None:
    doc = reference_doc()
    doc["lms"]["2"]["1"] = ["010"] + ["001"] * (NUM_CONSTRAINTS - 1)  # type: ignore[index]
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(doc))
    spec = load_reference_cluster(path, (4, 4))
    assert (spec.num_lms, spec.num_gms, spec.num_nodes) == (2, 2, 12)
    assert spec.partitions[1][0].constraint_masks == (0, 1, (1 << NUM_CONSTRAINTS) - 2)
    assert spec.partitions[0][0].constraint_masks == (1, 1, 1)
