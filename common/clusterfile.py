"""Cluster files: generating `ClusterSpec`s from the constraint statistics, and reading and writing them.

Two file formats are read:

* the reference format of `../shared/constraints/reference-cluster-10000-nodes.json`: `lms[lm][gm]` is a
  list of 21 bit strings, character i of string k being "1" when node i of that partition satisfies
  constraint k; keys are 1-based strings and map, sorted numerically, to 0-based core ids. It carries no
  capacities, so every node gets the `node_capacity` passed in;
* Megha's own format (`save_cluster` / `load_cluster_file`), for arbitrary clusters:

      {"format": "megha-cluster", "version": 1,
       "resource_names": ["cpu_millicores", "memory_mb"],
       "lms": [[[{"capacity": {"cpu_millicores": 64000, "memory_mb": 16384}, "constraints": [0, 4, 20]}, ...],
                ...],   # one list of nodes per GM partition
               ...]}    # one list of partitions per LM

`load_cluster` tells the two apart by the `format` field.
"""

from __future__ import annotations

import json
import random
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

from megha.common.constraint_stats import ConstraintStats, load_constraint_stats
from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.constraints import NUM_CONSTRAINTS, constraint_ids, constraint_mask
from megha.common.core.resources import DEFAULT_RESOURCE_NAMES, Resources
from megha.common.jsonkeys import KeyTwiceError, unique_keys
from megha.common.machine_classes import MACHINE_DRAWS

MAX_NODE_CAPACITY = 2**40
"""The most CPU (millicores) or memory (MB) one node may have: a thousand times any machine built, and small enough
that a data centre's total of millions of such nodes, and its use over a replay, stay exact in a float."""

MAX_LM_NODES = 1_000_000
"""The most nodes one LM (and so one agent) may have: a hundred times the papers' whole 10,000-node data centre,
and few enough that an LM's tables of them fit in memory."""

DEFAULT_NODE_CAPACITY: Resources = (64000, 16384)
"""The Megha paper's simulated node: 64 cores (millicores) and 16 GB (MB)."""

PROTOTYPE_NODE_CAPACITY: Resources = (2000, 4096)
"""The Megha prototype's node: 2 vCPUs (millicores) and 4 GB (MB)."""

FORMAT_NAME = "megha-cluster"
FORMAT_VERSION = 1


class ClusterFileError(ValueError):
    """A cluster file is malformed; the message names the file and the offending field, LM or GM."""


def generate_cluster(
    num_lms: int,
    num_gms: int,
    workers_per_partition: int,
    node_capacity: Resources,
    seed: int,
    stats: ConstraintStats | None = None,
    resource_names: tuple[str, ...] = DEFAULT_RESOURCE_NAMES,
    machine_constraints: str = "per-node",
) -> ClusterSpec:
    """A cluster of identical nodes whose machine constraints are drawn, seeded and reproducibly, with the
    fractions `stats.machine_fraction`: per node (a node satisfies constraint k with probability
    `machine_fraction[k]`) or per LM (each LM one machine class); see `megha.common.machine_classes`."""
    for name, value in (
        ("num_lms", num_lms),
        ("num_gms", num_gms),
        ("workers_per_partition", workers_per_partition),
    ):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    draw = MACHINE_DRAWS.get(machine_constraints)
    if draw is None:
        raise ValueError(f"unknown machine constraints {machine_constraints!r}; choose one of {sorted(MACHINE_DRAWS)}")
    fractions = (stats if stats is not None else load_constraint_stats()).machine_fraction
    rng = random.Random(seed)
    capacities = (tuple(node_capacity),) * workers_per_partition
    n = workers_per_partition
    rows = []
    for lm in range(num_lms):
        masks = draw(fractions, num_gms * n, rng)  # the LM's nodes, partition by partition
        rows.append(
            tuple(PartitionSpec(lm, gm, capacities, tuple(masks[gm * n : (gm + 1) * n])) for gm in range(num_gms))
        )
    return ClusterSpec(partitions=tuple(rows), resource_names=resource_names)


def load_cluster(
    path: str | Path,
    node_capacity: Resources = DEFAULT_NODE_CAPACITY,
    resource_names: tuple[str, ...] = DEFAULT_RESOURCE_NAMES,
) -> ClusterSpec:
    """Read a cluster file of either format; `node_capacity` and `resource_names` apply to the reference
    format only (Megha's own format carries its capacities and resource names)."""
    doc = _read_json(path)
    if "format" in doc:
        return _parse_megha_cluster(path, doc)
    if isinstance(doc.get("lms"), dict):
        return _parse_reference_cluster(path, doc, node_capacity, resource_names)
    raise ClusterFileError(
        f"cluster file {path}: neither Megha's format (no field format) "
        "nor the reference format (field lms is not an object keyed by LM)"
    )


def load_reference_cluster(
    path: str | Path,
    node_capacity: Resources = DEFAULT_NODE_CAPACITY,
    resource_names: tuple[str, ...] = DEFAULT_RESOURCE_NAMES,
) -> ClusterSpec:
    """Read a reference-format cluster file; every node gets `node_capacity`."""
    return _parse_reference_cluster(path, _read_json(path), node_capacity, resource_names)


def load_cluster_file(path: str | Path) -> ClusterSpec:
    """Read a cluster file in Megha's own format."""
    return _parse_megha_cluster(path, _read_json(path))


def in_resource_order(spec: ClusterSpec, resource_names: tuple[str, ...], path: str | Path) -> ClusterSpec:
    """`spec`, read from the cluster file at `path`, with each node's capacity in the order of `resource_names`; a
    file that names other resources (tasks would ask for ones its nodes lack) is refused naming the field."""
    if spec.resource_names == resource_names:
        return spec
    if sorted(spec.resource_names) != sorted(resource_names):
        raise ClusterFileError(
            f"cluster file {path}: field resource_names is {list(spec.resource_names)}; the tasks request "
            f"{list(resource_names)}, so its nodes must give exactly those"
        )
    order = [spec.resource_names.index(name) for name in resource_names]
    rows = tuple(
        tuple(replace(part, capacities=tuple(tuple(c[i] for i in order) for c in part.capacities)) for part in row)
        for row in spec.partitions
    )
    return ClusterSpec(partitions=rows, resource_names=resource_names)


def save_cluster(spec: ClusterSpec, path: str | Path) -> None:
    """Write `spec` in Megha's own format, one node per line."""

    def node(capacity: Resources, mask: int) -> str:
        return json.dumps(
            {
                "capacity": dict(zip(spec.resource_names, capacity, strict=True)),
                "constraints": constraint_ids(mask),
            }
        )

    def partition(part: PartitionSpec) -> str:
        return _json_lines([node(c, m) for c, m in zip(part.capacities, part.constraint_masks, strict=True)], 3)

    lms = [_json_lines([partition(part) for part in row], depth=2) for row in spec.partitions]
    header = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "resource_names": list(spec.resource_names)}
    fields = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in header.items()]
    fields.append(f'"lms": {_json_lines(lms, depth=1)}')
    Path(path).write_text(_json_lines(fields, depth=0, brackets="{}") + "\n", encoding="utf-8")


def _json_lines(items: list[str], depth: int, brackets: str = "[]") -> str:
    """`items` (already JSON) as a JSON list or object body, one item a line, indented one space per level."""
    pad = " " * (depth + 1)
    return brackets[0] + "\n" + ",\n".join(pad + item for item in items) + "\n" + " " * depth + brackets[1]


def _read_json(path: str | Path) -> dict[str, Any]:
    """The JSON object of the file at `path` (a UTF-8 byte order mark at the start is skipped); a directory, a FIFO
    or device (whose read could block for ever), an unreadable file, invalid or too deeply nested JSON, a number
    too long to read and a key given twice in one object (the last would silently win) are refused, naming the
    file."""
    try:
        mode = Path(path).stat().st_mode
        if stat.S_ISDIR(mode):
            raise ClusterFileError(f"cluster file {path}: is a directory, not a file")
        if not stat.S_ISREG(mode):
            raise ClusterFileError(f"cluster file {path}: not a regular file")
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ClusterFileError(f"cluster file {path}: cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ClusterFileError(f"cluster file {path}: not UTF-8 text") from None

    try:
        doc = json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        raise ClusterFileError(f"cluster file {path}: not valid JSON: {exc}") from exc
    except KeyTwiceError as exc:
        raise ClusterFileError(f"cluster file {path}: {exc}") from None
    except ValueError:  # an integer of more digits than Python reads
        raise ClusterFileError(f"cluster file {path}: holds a number too long to read (over 4,300 digits)") from None
    except RecursionError:
        raise ClusterFileError(f"cluster file {path}: JSON nested too deeply to read") from None
    if not isinstance(doc, dict):
        raise ClusterFileError(f"cluster file {path}: expected a JSON object at the top, got {type(doc).__name__}")
    return doc


def _parse_reference_cluster(
    path: str | Path, doc: dict[str, Any], node_capacity: Resources, resource_names: tuple[str, ...]
) -> ClusterSpec:
    where = f"reference cluster file {path}"
    lms = _numbered(where, "lms", doc.get("lms"))
    rows = []
    for lm, (lm_key, gms_doc) in enumerate(lms):
        gms = _numbered(where, f'lms["{lm_key}"]', gms_doc)
        if len(gms) != len(lms[0][1]):
            raise ClusterFileError(
                f'{where}: field lms["{lm_key}"] has {len(gms)} GM partitions, '
                f'lms["{lms[0][0]}"] has {len(lms[0][1])}; every LM needs one per GM'
            )
        row = []
        for gm, (gm_key, bit_strings) in enumerate(gms):
            masks = _masks_from_bit_strings(f'{where}: field lms["{lm_key}"]["{gm_key}"]', bit_strings)
            row.append(PartitionSpec(lm, gm, (tuple(node_capacity),) * len(masks), masks))
        rows.append(tuple(row))
    return _cluster(where, tuple(rows), resource_names)


def _numbered(where: str, field: str, value: Any) -> list[tuple[str, Any]]:
    """The items of a {"1": ..., "2": ...} object in numeric key order; keys must be exactly 1..n."""
    if not isinstance(value, dict) or not value:
        raise ClusterFileError(f"{where}: field {field} must be a non-empty object keyed '1', '2', ...")
    odd = sorted(key for key in value if not (key.isascii() and key.isdigit() and key == str(int(key))))
    if odd:  # int() would also read " 1", "+1", "01" and "1_0"
        shown = ", ".join(repr(key[:20]) for key in odd[:5]) + (", ..." if len(odd) > 5 else "")
        raise ClusterFileError(f"{where}: field {field} has keys that are not plain numbers: {shown}")
    items = sorted(value.items(), key=lambda kv: int(kv[0]))
    keys = [int(k) for k, _ in items]
    if keys != list(range(1, len(keys) + 1)):
        raise ClusterFileError(f"{where}: field {field} keys {keys} are not 1..{len(keys)}")
    return items


def _masks_from_bit_strings(label: str, bit_strings: Any) -> tuple[int, ...]:
    if not isinstance(bit_strings, list) or len(bit_strings) != NUM_CONSTRAINTS:
        got = len(bit_strings) if isinstance(bit_strings, list) else type(bit_strings).__name__
        raise ClusterFileError(f"{label}: expected a list of {NUM_CONSTRAINTS} bit strings, got {got}")
    width = None
    for k, bits in enumerate(bit_strings):
        if not isinstance(bits, str) or bits.strip("01"):
            raise ClusterFileError(f"{label}: constraint {k} is not a string of 0s and 1s")
        if width is None:
            width = len(bits)
        elif len(bits) != width:
            raise ClusterFileError(f"{label}: constraint {k} has {len(bits)} nodes, constraint 0 has {width}")
    if not width:
        raise ClusterFileError(f"{label}: partition has no nodes")
    masks = [0] * width
    for k, bits in enumerate(bit_strings):
        bit = 1 << k
        for i, c in enumerate(bits):
            if c == "1":
                masks[i] |= bit
    return tuple(masks)


def _parse_megha_cluster(path: str | Path, doc: dict[str, Any]) -> ClusterSpec:
    where = f"cluster file {path}"
    version = doc.get("version")
    if doc.get("format") != FORMAT_NAME or type(version) is not int or version != FORMAT_VERSION:
        raise ClusterFileError(
            f"{where}: fields format/version are {doc.get('format')!r}/{doc.get('version')!r}, "
            f"expected {FORMAT_NAME!r}/{FORMAT_VERSION}"
        )
    names = doc.get("resource_names")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ClusterFileError(f"{where}: field resource_names must be a non-empty list of strings")
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ClusterFileError(f"{where}: field resource_names names {', '.join(map(repr, twice))} more than once")
    lms = doc.get("lms")
    if not isinstance(lms, list) or not lms:
        raise ClusterFileError(f"{where}: field lms must be a non-empty list (one list of partitions per LM)")
    rows = []
    for lm, gms in enumerate(lms):
        if not isinstance(gms, list) or not gms:
            raise ClusterFileError(f"{where}: field lms[{lm}] must be a non-empty list (one list of nodes per GM)")
        row = []
        for gm, nodes in enumerate(gms):
            field = f"lms[{lm}][{gm}]"
            if not isinstance(nodes, list) or not nodes:
                raise ClusterFileError(f"{where}: field {field} (LM {lm} GM {gm}) must be a non-empty list of nodes")
            parsed = [_node(where, f"{field}[{i}]", node, names) for i, node in enumerate(nodes)]
            row.append(PartitionSpec(lm, gm, tuple(c for c, _ in parsed), tuple(m for _, m in parsed)))
        rows.append(tuple(row))
    return _cluster(where, tuple(rows), tuple(names))


def _node(where: str, field: str, node: Any, names: list[str]) -> tuple[Resources, int]:
    if not isinstance(node, dict):
        raise ClusterFileError(f"{where}: field {field} must be an object with capacity and constraints")
    if unknown := sorted(set(node) - {"capacity", "constraints"}):  # a misspelt field would be ignored
        shown = ", ".join(repr(key[:40]) for key in unknown[:5])
        message = f"field {field} has fields a node has not: {shown} (a node has capacity and constraints)"
        raise ClusterFileError(f"{where}: {message}")
    capacity = node.get("capacity")
    if not isinstance(capacity, dict) or set(capacity) != set(names):
        got = sorted(capacity) if isinstance(capacity, dict) else capacity
        raise ClusterFileError(f"{where}: field {field}.capacity must give exactly {names}, got {got}")
    for name in names:
        value = capacity[name]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_NODE_CAPACITY:
            raise ClusterFileError(
                f"{where}: field {field}.capacity.{name} must be a positive integer of at most 2**40, got {value!r}"
            )
    ids = node.get("constraints")
    if not isinstance(ids, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in ids):
        raise ClusterFileError(f"{where}: field {field}.constraints must be a list of constraint ids, got {ids!r}")
    if len(set(ids)) != len(ids):
        twice = sorted({c for c in ids if ids.count(c) > 1})
        raise ClusterFileError(f"{where}: field {field}.constraints lists {twice} more than once: list each once")
    try:
        mask = constraint_mask(ids)
    except ValueError as exc:
        raise ClusterFileError(f"{where}: field {field}.constraints: {exc}") from None
    return tuple(capacity[name] for name in names), mask


def _cluster(
    where: str, partitions: tuple[tuple[PartitionSpec, ...], ...], resource_names: tuple[str, ...]
) -> ClusterSpec:
    try:
        return ClusterSpec(partitions=partitions, resource_names=resource_names)
    except ValueError as exc:
        raise ClusterFileError(f"{where}: {exc}") from exc
