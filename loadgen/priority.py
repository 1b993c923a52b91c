"""Priority classes in a replay: which class each job of a workload gets (`megha replay --priority-classes
--job-classes`, docs/priority.md).

`--job-classes low:50%,high:25%` draws each job's class independently with those probabilities, from the replay's
seed (the same seed gives every job the same class); the probability left over (here 25%) goes to the default
class (`normal` when the classes name one, else the lowest).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from megha.common.core.policies.priority import PriorityClasses
from megha.common.core.task import JobSpec


def parse_job_classes(text: str, classes: PriorityClasses) -> list[tuple[str, float]]:
    """(class name, probability) from 'name:fraction,...' (fractions or percentages, adding up to at most 1), the
    default class taking what is left; ValueError naming an unknown class or a bad fraction."""
    mix: dict[str, float] = {}
    for k, item in enumerate(x.strip() for x in text.split(",") if x.strip()):
        name, sep, amount = item.partition(":")
        if not sep:
            raise ValueError(f"job class {k}: {item!r} is not class:fraction")
        try:
            classes.value(name)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
        try:
            fraction = float(amount.rstrip("%")) / (100 if amount.endswith("%") else 1)
        except ValueError as exc:
            raise ValueError(f"job class {k}: {item!r}: the fraction must be a number") from exc
        if not 0 <= fraction <= 1:
            raise ValueError(f"job class {k}: {item!r}: the fraction must be in [0, 1]")
        mix[name] = mix.get(name, 0.0) + fraction
    total = sum(mix.values())
    if total > 1 + 1e-9:
        raise ValueError(f"job class fractions add up to {total:.3f}; they must not exceed 1")
    if total < 1 - 1e-9:
        mix[classes.default] = mix.get(classes.default, 0.0) + 1 - total
    return list(mix.items())


def draw_classes(jobs: int, classes: PriorityClasses, job_classes: str, seed: int) -> list[int]:
    """The priority value of each of `jobs` jobs, in order, drawn from `job_classes` with `seed` (every job in the
    default class when it is empty)."""
    mix = parse_job_classes(job_classes, classes)
    names = [name for name, _ in mix]
    weights = [fraction for _, fraction in mix]
    rng = random.Random(f"job-classes:{seed}")
    return [classes.value(rng.choices(names, weights)[0]) for _ in range(jobs)]


def assign_classes(
    workload: Sequence[tuple[int, JobSpec]], classes: PriorityClasses, job_classes: str, seed: int
) -> list[tuple[int, JobSpec]]:
    """`workload` with each job's tasks in the class `draw_classes` gives it."""
    drawn = draw_classes(len(workload), classes, job_classes, seed)
    return [
        (gm, replace(job, tasks=tuple(replace(t, priority=priority) for t in job.tasks)))
        for (gm, job), priority in zip(workload, drawn, strict=True)
    ]
