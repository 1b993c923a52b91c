"""Job dependencies for a replay (`megha replay --dependencies`): a trace's jobs turned into chains, each job (or a
fraction of them) depending on the job K places before it in the trace (docs/dependencies.md)."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from megha.common.core.task import JobSpec

USAGE = "chain:K or chain:K:FRACTION (K >= 1; 0 < FRACTION <= 1), or none"


@dataclass(frozen=True, slots=True)
class Chains:
    """Job k depends on job k - `step` of the trace, for a `fraction` of the jobs (drawn with the replay's seed)."""

    step: int
    fraction: float = 1.0


def parse_dependencies(spec: str) -> Chains | None:
    """The dependencies `spec` names (None for "" or "none"); ValueError saying the syntax otherwise."""
    if spec in ("", "none"):
        return None
    kind, _, rest = spec.partition(":")
    parts = rest.split(":")
    try:
        if kind != "chain" or not 1 <= len(parts) <= 2:
            raise ValueError
        chains = Chains(int(parts[0]), float(parts[1]) if len(parts) == 2 else 1.0)
    except ValueError:
        raise ValueError(f"dependencies {spec!r}: expected {USAGE}") from None
    if chains.step < 1 or not 0 < chains.fraction <= 1:
        raise ValueError(f"dependencies {spec!r}: expected {USAGE}")
    return chains


def with_dependencies(workload: list[tuple[int, JobSpec]], chains: Chains, seed: int) -> list[tuple[int, JobSpec]]:
    """`workload` (GM, job) in trace order, with job k depending on job k - step for a fraction of the jobs."""
    rng = random.Random(seed * 7_919 + chains.step)
    out = []
    for k, (gm, job) in enumerate(workload):
        if k >= chains.step and (chains.fraction >= 1 or rng.random() < chains.fraction):
            job = replace(job, depends_on=(workload[k - chains.step][1].job_id,))
        out.append((gm, job))
    return out
