"""The Sharma et al. constraint statistics: loading and validating them, and sampling task constraint masks.

The statistics (Sharma et al., SoCC 2011, as used in section 2.3 of the constraint-aware Megha study) give,
for each of 10 statistical task clusters, the percent chance that a task carries each of the 21 constraints;
for each cluster and task type 1-4, the weight of picking that cluster; and the fraction of machines
satisfying each constraint. The package ships them (`megha.common.data`), so no `../shared` is needed.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from megha.common.core.constraints import NUM_CONSTRAINTS

DEFAULT_STATS_FILE = "sharma2011-constraints.json"
TASK_TYPES: tuple[int, ...] = (1, 2, 3, 4)


@dataclass(frozen=True)
class ConstraintStats:
    """Validated constraint statistics.

    `task_frequency_percent[cluster][j]` is the percent chance (0-100) that a task of statistical cluster
    `cluster` carries constraint j; `cluster_weights[cluster][task_type]` is the relative weight of picking
    `cluster` for a task of type 1-4; `machine_fraction[j]` is the fraction (0-1) of machines satisfying j.
    """

    task_frequency_percent: dict[int, tuple[float, ...]]
    cluster_weights: dict[int, dict[int, float]]
    machine_fraction: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.task_frequency_percent:
            raise ValueError("task_frequency_percent: needs at least one cluster")
        for cluster, freqs in self.task_frequency_percent.items():
            field = f"task_frequency_percent[{cluster}]"
            _check_vector(field, freqs, upper=100.0)
        if set(self.cluster_weights) != set(self.task_frequency_percent):
            raise ValueError(
                f"cluster_weights: clusters {sorted(self.cluster_weights)} differ from "
                f"task_frequency_percent clusters {sorted(self.task_frequency_percent)}"
            )
        for cluster, by_type in self.cluster_weights.items():
            if set(by_type) != set(TASK_TYPES):
                raise ValueError(f"cluster_weights[{cluster}]: task types {sorted(by_type)}, expected 1-4")
            for task_type, weight in by_type.items():
                if not (math.isfinite(weight) and weight >= 0):
                    raise ValueError(f"cluster_weights[{cluster}][{task_type}]: {weight} is not >= 0")
        for task_type in TASK_TYPES:
            if sum(by_type[task_type] for by_type in self.cluster_weights.values()) <= 0:
                raise ValueError(f"cluster_weights: task type {task_type} has zero total weight")
        _check_vector("machine_fraction", self.machine_fraction, upper=1.0)


def _check_vector(field: str, values: tuple[float, ...], upper: float) -> None:
    if len(values) != NUM_CONSTRAINTS:
        raise ValueError(f"{field}: has {len(values)} entries, expected {NUM_CONSTRAINTS}")
    for j, v in enumerate(values):
        if not (math.isfinite(v) and 0 <= v <= upper):
            raise ValueError(f"{field}[{j}]: {v} is outside 0..{upper:g}")


def load_constraint_stats(path: str | Path | None = None) -> ConstraintStats:
    """Read the statistics from `path`, or from the copy shipped with the package when `path` is None."""
    if path is None:
        text = resources.files("megha.common.data").joinpath(DEFAULT_STATS_FILE).read_text(encoding="utf-8")
        source = f"package data {DEFAULT_STATS_FILE}"
    else:
        text = Path(path).read_text(encoding="utf-8")
        source = str(path)
    try:
        return _parse_stats(json.loads(text))
    except ValueError as exc:
        raise ValueError(f"constraint statistics {source}: {exc}") from exc


FREQUENCY_FIELD = "task_constraint_frequency_percent.clusters"
WEIGHTS_FIELD = "task_cluster_weights_by_task_type.weights"
FRACTION_FIELD = "machine_constraint_fraction.fraction"


def _parse_stats(doc: Any) -> ConstraintStats:
    if not isinstance(doc, dict):
        raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
    if doc.get("num_constraints", NUM_CONSTRAINTS) != NUM_CONSTRAINTS:
        raise ValueError(f"num_constraints: {doc['num_constraints']}, expected {NUM_CONSTRAINTS}")
    frequencies = _mapping(FREQUENCY_FIELD, _member(doc, FREQUENCY_FIELD))
    weights = _mapping(WEIGHTS_FIELD, _member(doc, WEIGHTS_FIELD))
    return ConstraintStats(
        task_frequency_percent={
            _int_key(FREQUENCY_FIELD, c): _numbers(f"{FREQUENCY_FIELD}.{c}", v) for c, v in frequencies.items()
        },
        cluster_weights={
            _int_key(WEIGHTS_FIELD, c): _weights_by_type(f"{WEIGHTS_FIELD}.{c}", v) for c, v in weights.items()
        },
        machine_fraction=_numbers(FRACTION_FIELD, _member(doc, FRACTION_FIELD)),
    )


def _member(doc: dict[str, Any], dotted: str) -> Any:
    value: Any = doc
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            raise ValueError(f"missing field {dotted}")
        value = value[key]
    return value


def _weights_by_type(field: str, value: Any) -> dict[int, float]:
    return {_int_key(field, t): _number(f"{field}.{t}", w) for t, w in _mapping(field, value).items()}


def _mapping(field: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{field}: expected an object, got {type(value).__name__}")
    return value


def _int_key(field: str, key: str) -> int:
    try:
        return int(key)
    except ValueError:
        raise ValueError(f"{field}: key {key!r} is not an integer") from None


def _number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{field}: {value!r} is not a number")
    return float(value)


def _numbers(field: str, values: Any) -> tuple[float, ...]:
    if not isinstance(values, list):
        raise ValueError(f"{field}: expected a list, got {type(values).__name__}")
    return tuple(_number(f"{field}[{i}]", v) for i, v in enumerate(values))


class TaskConstraintSampler:
    """Draws task constraint masks (bit k = constraint k) by the published procedure, seeded.

    Per task: pick a task type uniformly from 1-4; pick a statistical cluster with weights
    `cluster_weights[cluster][type]`; include each constraint j independently with probability
    `task_frequency_percent[cluster][j] / 100`.
    """

    def __init__(self, stats: ConstraintStats, seed: int) -> None:
        self._rng = random.Random(seed)
        clusters = sorted(stats.task_frequency_percent)
        self._cumulative = [
            list(itertools.accumulate(stats.cluster_weights[c][t] for c in clusters)) for t in TASK_TYPES
        ]
        self._bit_probabilities = [
            tuple((1 << j, p / 100.0) for j, p in enumerate(stats.task_frequency_percent[c]) if p > 0) for c in clusters
        ]
        self._last = len(clusters) - 1

    def sample(self) -> int:
        rand = self._rng.random
        cumulative = self._cumulative[int(rand() * len(TASK_TYPES))]
        cluster = bisect.bisect(cumulative, rand() * cumulative[-1], 0, self._last)
        mask = 0
        for bit, probability in self._bit_probabilities[cluster]:
            if rand() < probability:
                mask |= bit
        return mask

    def masks(self, n: int) -> list[int]:
        """The next `n` masks, as `n` calls of `sample` give them (the same draws of the same generator, which is
        then where those calls leave it), drawn MASKS_AT_ONCE at a time, so that a trace of millions of tasks
        holds a few megabytes of draws at once, not hundreds of bytes per task."""
        masks: list[int] = []
        for start in range(0, n, MASKS_AT_ONCE):
            masks += self._masks(min(MASKS_AT_ONCE, n - start))
        return masks

    def _masks(self, n: int) -> list[int]:
        """The next `n` (> 0) masks at once: each task draws a type, a cluster and one number per constraint its
        cluster may carry; when every cluster may carry as many, each task's draws are a row of one table."""
        import numpy as np

        sizes = [len(bits) for bits in self._bit_probabilities]
        stride = 2 + max(sizes)
        state = self._rng.getstate()
        draws = _floats(self._rng, n * stride)
        if min(sizes) == max(sizes):
            table = draws.reshape(n, stride)
            types = (table[:, 0] * len(TASK_TYPES)).astype(np.intp)
            cumulative = np.array(self._cumulative)
            picks = table[:, 1] * cumulative[types, -1]
            clusters = np.empty(n, dtype=np.intp)
            for t in range(len(TASK_TYPES)):
                chosen = types == t
                clusters[chosen] = np.searchsorted(cumulative[t, : self._last], picks[chosen], side="right")

            def drawn(chosen: np.ndarray, size: int) -> np.ndarray:
                return table[chosen, 2 : 2 + size]

        else:  # where each task's draws start depends on the clusters before it
            starts, clusters = np.empty(n, dtype=np.intp), np.empty(n, dtype=np.intp)
            at = 0
            for k in range(n):
                row = self._cumulative[int(draws[at] * len(TASK_TYPES))]
                cluster = bisect.bisect(row, draws[at + 1] * row[-1], 0, self._last)
                starts[k], clusters[k] = at, cluster
                at += 2 + sizes[cluster]
            self._rng.setstate(state)
            _floats(self._rng, at)  # where `n` calls of `sample` leave the generator

            def drawn(chosen: np.ndarray, size: int) -> np.ndarray:
                return draws[starts[chosen, None] + 2 + np.arange(size)]

        masks = np.zeros(n, dtype=np.int64)
        for cluster, bit_probabilities in enumerate(self._bit_probabilities):
            chosen = np.flatnonzero(clusters == cluster)
            if chosen.size and bit_probabilities:
                bits, probabilities = (np.array(column) for column in zip(*bit_probabilities))
                taken = drawn(chosen, len(bits)) < probabilities
                masks[chosen] = taken.astype(np.int64) @ bits.astype(np.int64)
        return masks.tolist()


MASKS_AT_ONCE = 1 << 14
"""Tasks whose constraint draws `TaskConstraintSampler.masks` makes at once (about 3 MB of floats, and as much of
the generator's bits while they are converted)."""


def _floats(rng: random.Random, n: int) -> Any:
    """The next `n` floats of `rng` as a numpy array: what `n` calls of `rng.random()` return, from one call of
    `getrandbits`. Each float is made of two 32-bit outputs of the Mersenne Twister, a and b, as (a >> 5) * 2**26 +
    (b >> 6) over 2**53; `getrandbits(32 * k)` holds k outputs, the first in the lowest bits."""
    import numpy as np

    words = np.frombuffer(rng.getrandbits(64 * n).to_bytes(8 * n, "little"), dtype="<u4").reshape(n, 2)
    return ((words[:, 0] >> 5) * 67108864.0 + (words[:, 1] >> 6)) / 9007199254740992.0
