"""Benchmark: CPU time of one placement decision (LM order and node choice), per ORDER/CHOICE, on the reference cluster.

GM 0 of the published 10,000-node reference cluster (5 LMs x 5 GMs) places the same tasks (constraints drawn from
the Sharma et al. statistics, request (1, 1)) with `Placer.match`, the call the GM makes per task: its LM order
yields partitions and its node choice picks a node in the first with room. A share `--busy` of the nodes, drawn at
random, has no free resources in the view, so an order that looks past the first partition with room (scarcity,
rarity) pays for it; the placements are not applied, so every task sees the same view. The first 2,000 tasks are the
policies' warm-up (scarcity and rarity learn their pressures from them). Process CPU time, best of `--repeat` rounds.

    python bench/placement.py
    python bench/placement.py --policies round-robin first-fit/scarcity rarity/rarity --busy 0.5
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from megha.common.constraint_stats import TaskConstraintSampler, load_constraint_stats
from megha.common.core.gm import GlobalMaster
from megha.common.core.placement.choice import make_choice
from megha.common.core.policies import gm_policies
from megha.common.core.task import TaskSpec
from megha.loadgen.replay import REFERENCE_CLUSTER, ReplayConfig, build_cluster

WARM_UP = 2_000
POLICIES = ["round-robin", "first-fit", "first-fit/scarcity", "scarcity", "rarity/rarity"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", nargs="+", default=POLICIES, help="ORDER or ORDER/CHOICE (default: %(default)s)")
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--busy", type=float, default=0.5, help="share of the nodes without room (default: 0.5)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not REFERENCE_CLUSTER.exists():
        print(f"needs the reference cluster at {REFERENCE_CLUSTER}", file=sys.stderr)
        return 2
    cluster = build_cluster(ReplayConfig(cluster="reference"))
    sample = TaskConstraintSampler(load_constraint_stats(), 0).sample
    tasks = [TaskSpec(f"t.{i}", "t", "user-0", 1.0, (1, 1), sample()) for i in range(WARM_UP + args.tasks)]
    print(f"| order / choice | µs per placement (best of {args.repeat}) | placed | tasks | busy nodes |")
    print("| --- | --- | --- | --- | --- |")
    for policy in args.policies:
        order, _, choice = policy.partition("/")
        best, placed = float("inf"), 0
        for _ in range(args.repeat):
            policies = gm_policies(0, cluster, choice=make_choice(choice or "random"), lm_order=order)
            gm = GlobalMaster(0, cluster, policies=policies)
            busy = random.Random(1)
            for view in gm.view.partitions():
                for i in range(view.size):
                    if busy.random() < args.busy:
                        view.set_free(i, tuple(0 for _ in view.capacity[i]))
            match = gm.placer.match
            for t in tasks[:WARM_UP]:
                match(t)
            start = time.process_time()
            placed = sum(match(t) is not None for t in tasks[WARM_UP:])
            best = min(best, time.process_time() - start)
        print(f"| {policy} | {best / args.tasks * 1e6:.2f} | {placed:,} | {args.tasks:,} | {args.busy:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
