"""An LM's layout as a GM learns it (`GET /v1/cluster`: its partitions, one per GM, with each node's capacity,
machine constraints and drivers), and how an LM that restarted with other settings differs from the GM's view of
it (docs/reliability.md, "An LM restarted with other settings")."""

from __future__ import annotations

import json
from typing import Any

from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.constraints import constraint_mask


def partitions_of(doc: dict[str, Any], lm: int) -> tuple[PartitionSpec, ...]:
    """LM `lm`'s partitions from its `GET /v1/cluster` document."""
    return tuple(
        PartitionSpec(
            lm,
            p["gm"],
            tuple(tuple(c) for c in p["capacities"]),
            tuple(constraint_mask(ids) for ids in p["constraints"]),
            tuple(tuple(d) for d in p.get("drivers", ())),  # an LM from before drivers: burn only
        )
        for p in doc["partitions"]
    )


def difference(cluster: ClusterSpec, lm: int, body: bytes) -> str | None:
    """How LM `lm`'s `GET /v1/cluster` answer `body` differs from `cluster`, the layout this GM placed by (None:
    the same): the settings to look at are named."""
    doc = json.loads(body)
    if doc.get("lm") != lm:
        return f"it says it is LM {doc.get('lm')}"
    if tuple(doc["resource_names"]) != cluster.resource_names:
        return f"its resources are {doc['resource_names']}, this GM's view {list(cluster.resource_names)}"
    known = cluster.partitions[lm]
    found = partitions_of(doc, lm)
    if len(found) != len(known):
        return f"it has a partition for {len(found)} GMs (its MEGHA_NUM_GMS), this GM's view of it {len(known)}"
    for was, now in zip(known, found, strict=True):
        where = f"its partition for GM {was.gm}"
        if len(now.capacities) != len(was.capacities):
            return (
                f"{where} has {len(now.capacities)} nodes, this GM's view of it {len(was.capacities)} "
                "(its MEGHA_EXPECTED_NODES, or its agents' nodes)"
            )
        for what, before, after in (
            ("capacities", was.capacities, now.capacities),
            ("machine constraints", was.constraint_masks, now.constraint_masks),
            ("drivers", was.drivers or ((),) * len(was.capacities), now.drivers or ((),) * len(now.capacities)),
        ):
            changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
            if changed:
                first = cluster.partition_start(lm, was.gm)
                nodes = ", ".join(str(first + i) for i in changed[:5]) + (", ..." if len(changed) > 5 else "")
                return f"{where}: the {what} of nodes {nodes} differ from this GM's view (its agents' settings)"
    return None
