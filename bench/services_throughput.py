"""Benchmark: task launches per second through the real services (separate processes, RabbitMQ), with simulated
execution, and allocation time at 50% and 90% of the highest sustained rate.

A worker agent in simulated-execution mode stands for `--nodes` nodes; the load generator submits jobs of
`--tasks-per-job` one-slot tasks in open loop at a stepped offered rate. A rate is sustained when the tasks
started at least at 90% of the offered rate and every task completed. Prints a markdown table.

    python bench/services_throughput.py                         # 1 GM + 1 LM, then 3 GMs + 3 LMs
    python bench/services_throughput.py --pairs 1 --rates 250 500 1000
"""

from __future__ import annotations

import argparse
import asyncio
import math
import platform
import sys
import time

from megha.common.settings import LoadgenSettings
from megha.deploy.local import LocalDeployment
from megha.loadgen.services import replay_services

TASK_SECONDS = 0.05


def measure(deployment: LocalDeployment, rate: float, seconds: float, tasks_per_job: int) -> dict[str, float]:
    """Offer `rate` tasks/s for about `seconds`; report started-task rate and allocation time."""
    jobs = max(2, round(rate * seconds / tasks_per_job))
    interval = tasks_per_job / rate  # syn traces: one job a second, so time_scale = interval
    settings = LoadgenSettings(
        gm_urls=deployment.gm_urls,
        run_id=deployment.run_id,
        trace=f"syn:{tasks_per_job}:{jobs}",
        time_scale=interval,
        mode="slot",
        node_cpu_millicores=1000,
        node_memory_mb=1024,
        timeout=60.0,
    )
    run = asyncio.run(replay_services(settings))
    starts = sorted(r.started_at for r in run.tasks.values() if not math.isnan(r.started_at))
    span = starts[-1] - starts[0] if len(starts) > 1 else math.nan
    m = run.metrics
    assert m is not None
    return {
        "offered": rate,
        "achieved": (len(starts) - 1) / span if span > 0 else math.nan,
        "completed": m.tasks_completed / max(m.tasks, 1),
        "p50": m.allocation_time.median,
        "p99": m.allocation_time.p99,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, nargs="+", default=[1, 3], help="GM/LM pairs to test")
    parser.add_argument("--rates", type=float, nargs="+", default=[250, 500, 1000, 1500, 2000, 3000])
    parser.add_argument("--seconds", type=float, default=6.0, help="offered load per step")
    parser.add_argument("--tasks-per-job", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=2000, help="simulated nodes per LM")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    print()
    print("| GMs x LMs | offered tasks/s | started tasks/s | completed | alloc p50 | alloc p99 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for pairs in args.pairs:
        deployment = LocalDeployment(
            gms=pairs,
            lms=pairs,
            workers_per_lm=1,
            nodes_per_worker=args.nodes,
            execution="simulated",
            node_cpu_millicores=1000,
            node_memory_mb=1024,
        )
        with deployment:
            best = 0.0
            for rate in args.rates:
                r = measure(deployment, rate, args.seconds, args.tasks_per_job)
                print(
                    f"| {pairs} x {pairs} | {r['offered']:.0f} | {r['achieved']:.0f} | {r['completed']:.0%} | "
                    f"{r['p50'] * 1000:.1f} ms | {r['p99'] * 1000:.1f} ms |",
                    flush=True,
                )
                if r["completed"] < 1 or r["achieved"] < 0.9 * rate:
                    break
                best = rate
            if best:
                for share in (0.5, 0.9):
                    r = measure(deployment, best * share, args.seconds, args.tasks_per_job)
                    print(
                        f"| {pairs} x {pairs} ({share:.0%} of {best:.0f}) | {r['offered']:.0f} | {r['achieved']:.0f} "
                        f"| {r['completed']:.0%} | {r['p50'] * 1000:.1f} ms | {r['p99'] * 1000:.1f} ms |",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
