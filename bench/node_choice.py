"""Benchmark: CPU time of one node choice, per CHOICE_POLICIES name, on a partition of the reference cluster.

Each policy picks a node for the same tasks (constraints drawn from the Sharma et al. statistics, the first 2,000
counted as its warm-up) among their feasible nodes in partition (LM 0, GM 0), every node free. Process CPU time,
not wall time, so other work on a shared machine weighs less; the best of `--repeat` rounds is printed.

    python bench/node_choice.py
    python bench/node_choice.py --tasks 50000 --repeat 5
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from megha.common.constraint_stats import TaskConstraintSampler, load_constraint_stats
from megha.common.core.placement.choice import CHOICE_POLICIES
from megha.common.core.task import TaskSpec
from megha.common.core.view import PartitionView
from megha.loadgen.replay import REFERENCE_CLUSTER, ReplayConfig, build_cluster

WARM_UP = 2_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not REFERENCE_CLUSTER.exists():
        print(f"needs the reference cluster at {REFERENCE_CLUSTER}", file=sys.stderr)
        return 2
    view = PartitionView(build_cluster(ReplayConfig(cluster="reference")).partitions[0][0], 0)
    sample = TaskConstraintSampler(load_constraint_stats(), 0).sample
    tasks = [TaskSpec(f"t.{i}", "t", "user-0", 1.0, (1, 1), sample()) for i in range(WARM_UP + args.tasks)]
    work = [(t, view.feasible(t)) for t in tasks]
    work = [(t, c) for t, c in work if c]
    print(f"| node choice | µs per choice (best of {args.repeat}) | partition nodes | tasks |")
    print("| --- | --- | --- | --- |")
    for name, policy in sorted(CHOICE_POLICIES.items()):
        best = float("inf")
        for _ in range(args.repeat):
            choice, rng = policy(), random.Random(0)
            for t, candidates in work[:WARM_UP]:
                choice.choose(view, candidates, rng, t)
            start = time.process_time()
            for t, candidates in work[WARM_UP:]:
                choice.choose(view, candidates, rng, t)
            best = min(best, time.process_time() - start)
        print(f"| {name} | {best / len(work[WARM_UP:]) * 1e6:.2f} | {view.size:,} | {len(work[WARM_UP:]):,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
