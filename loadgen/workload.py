"""Workload shaping: turning trace jobs into `JobSpec`s with resource requests, constraints, users and GMs.

Two request modes:

* `slot` (the constraint-aware study): every task requests exactly `node_capacity`, so one task holds a whole
  worker for its duration;
* `scaled` (the Megha prototype): every task draws an original, unscaled request from `CORE_WEIGHTS` and
  `MEMORY_GB_WEIGHTS` (independently), then CPU is divided by `cpu_scale` (400) and memory by `mem_scale`
  (50), rounding up, giving (`cpu_millicores`, `memory_mb`). The two distributions are an assumption, not a
  fit: the traces carry no sizes, so they only mimic the Google trace's skew towards small tasks.

Task placement constraints come from `TaskConstraintSampler` seeded with `seed`; requests use their own stream
(seeded from `seed` too), so both modes give the same constraints for the same seed. Job k of the trace gets id
`j<k>`, GM k % num_gms and user `user-<k % users>`; its task i gets id `j<k>.<i>`. Under fair scheduling
(`queues` given) job k goes instead to queue k % len(queues): that queue's user and GM.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from megha.common.clusterfile import DEFAULT_NODE_CAPACITY
from megha.common.constraint_stats import ConstraintStats, TaskConstraintSampler, load_constraint_stats
from megha.common.core.fairness.config import QueueSpec
from megha.common.core.resources import Resources
from megha.common.core.task import JobSpec, TaskSpec
from megha.loadgen.trace import TraceJob

CORE_WEIGHTS: dict[int, float] = {1: 40, 2: 25, 4: 18, 8: 10, 16: 5, 32: 2}
"""Unscaled CPU request (cores) -> percent of tasks, in scaled mode."""

MEMORY_GB_WEIGHTS: dict[int, float] = {1: 35, 2: 25, 4: 20, 8: 13, 16: 7}
"""Unscaled memory request (GB) -> percent of tasks, in scaled mode."""


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """How trace jobs become Megha jobs: request mode, seed, number of GMs and users, and mode parameters."""

    mode: Literal["slot", "scaled"]
    seed: int
    num_gms: int
    node_capacity: Resources = DEFAULT_NODE_CAPACITY
    users: int = 1
    cpu_scale: int = 400
    mem_scale: int = 50
    job_prefix: str = ""  # job k is f"{job_prefix}j{k}": replays against long-running services need fresh ids
    queues: tuple[QueueSpec, ...] = ()  # fair scheduling: jobs go round-robin to these users' queues
    constraints: bool = True  # False: tasks carry no placement constraints

    def __post_init__(self) -> None:
        if self.mode not in ("slot", "scaled"):
            raise ValueError(f"mode must be 'slot' or 'scaled', got {self.mode!r}")
        for name in ("num_gms", "users", "cpu_scale", "mem_scale"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.node_capacity or any(v <= 0 for v in self.node_capacity):
            raise ValueError(f"node_capacity must be positive amounts, got {self.node_capacity}")


def build_workload(
    trace_jobs: Sequence[TraceJob], config: WorkloadConfig, stats: ConstraintStats | None = None
) -> list[tuple[int, JobSpec]]:
    """(GM, job) for every trace job, in trace order; `submitted_at` is the trace arrival."""
    n = sum(len(trace_job.durations) for trace_job in trace_jobs)
    masks: Iterator[int] = (
        iter(TaskConstraintSampler(stats if stats is not None else load_constraint_stats(), config.seed).masks(n))
        if config.constraints
        else itertools.repeat(0)
    )
    draw_request = _request_drawer(config)
    workload = []
    for k, trace_job in enumerate(trace_jobs):
        job_id = f"{config.job_prefix}j{k}"
        if config.queues:
            queue = config.queues[k % len(config.queues)]
            user, gm = queue.user, queue.gm
        else:
            user, gm = f"user-{k % config.users}", k % config.num_gms
        tasks = tuple(
            TaskSpec(f"{job_id}.{i}", job_id, user, duration, draw_request(), mask)
            for i, (duration, mask) in enumerate(zip(trace_job.durations, masks))
        )
        workload.append((gm, JobSpec(job_id, tasks, trace_job.arrival)))
    return workload


def mark_gangs(
    workload: list[tuple[int, JobSpec]], fraction: float, seed: int, sizes: tuple[int, int] = (1, 1 << 30)
) -> list[tuple[int, JobSpec]]:
    """`workload` with each job of `sizes[0]`..`sizes[1]` tasks made a gang (no timeout) with probability
    `fraction`, drawn with `seed` (one draw per job, whatever its size, so a fraction's gangs include a smaller
    fraction's)."""
    rng = random.Random(seed * 7_919 + 24)
    low, high = sizes
    return [
        (gm, replace(job, gang=math.inf) if rng.random() < fraction and low <= len(job.tasks) <= high else job)
        for gm, job in workload
    ]


def _request_drawer(config: WorkloadConfig) -> Callable[[], Resources]:
    if config.mode == "slot":
        request = tuple(config.node_capacity)
        return lambda: request
    rand = random.Random(f"requests:{config.seed}").random
    cpus = _scaled_choices(CORE_WEIGHTS, 1000, config.cpu_scale)
    memories = _scaled_choices(MEMORY_GB_WEIGHTS, 1024, config.mem_scale)

    def draw() -> Resources:
        return (_pick(cpus, rand()), _pick(memories, rand()))

    return draw


def _scaled_choices(weights: dict[int, float], unit: int, scale: int) -> tuple[tuple[int, ...], list[float]]:
    """Scaled amounts (amount * unit / scale, rounded up) and their cumulative probabilities."""
    total = sum(weights.values())
    amounts = tuple(-(-amount * unit // scale) for amount in weights)
    return amounts, list(itertools.accumulate(w / total for w in weights.values()))


def _pick(choices: tuple[tuple[int, ...], list[float]], u: float) -> int:
    amounts, cumulative = choices
    return amounts[bisect.bisect(cumulative, u, 0, len(amounts) - 1)]
