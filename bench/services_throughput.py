"""Benchmark: task launches per second through the real services (separate processes, RabbitMQ), with simulated
execution, and allocation time at 50% and 90% of the highest sustained rate.

A worker agent in simulated-execution mode stands for `--nodes` nodes; the load generator submits jobs of
`--tasks-per-job` one-slot tasks in open loop at a stepped offered rate. A rate is sustained when the tasks
started at least at 90% of the offered rate and every task completed. With `--repeat N` every point is run N
times: each column is the median of the N runs, and "completed" the worst run's. Prints a markdown table.

    python bench/services_throughput.py                         # 1 GM + 1 LM, then 3 GMs + 3 LMs
    python bench/services_throughput.py --pairs 1 --rates 250 500 1000 --repeat 3

On a machine shared with other CPU-bound work, `--autogroup-nice -15` (Linux, as root) gives the benchmark's
processes (the generator and every service, each in its own session and so its own scheduling autogroup)
priority over the other sessions, so the figures approach those of a quiet machine. RabbitMQ keeps its own
priority.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from megha.common.settings import LoadgenSettings
from megha.deploy.local import LocalDeployment
from megha.loadgen.services import replay_services


def measure(deployment: LocalDeployment, rate: float, seconds: float, tasks_per_job: int) -> dict[str, float]:
    """Offer `rate` tasks/s for about `seconds`; report started-task rate and allocation time."""
    jobs = max(2, round(rate * seconds / tasks_per_job))
    interval = tasks_per_job / rate  # syn traces: one job a second, so time_scale = interval
    settings = LoadgenSettings(
        trace=f"syn:{tasks_per_job}:{jobs}",
        time_scale=interval,
        mode="slot",
        node_cpu_millicores=1000,
        node_memory_mb=1024,
        timeout=60.0,
        auth="off",  # replaced by the deployment's own
    )
    run = asyncio.run(replay_services(deployment.loadgen(settings)))
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


def measure_median(
    deployment: LocalDeployment, rate: float, seconds: float, tasks_per_job: int, repeat: int
) -> dict[str, float]:
    """Each figure is the median over `repeat` runs at `rate`, except the completed share: the worst run's."""
    runs = [measure(deployment, rate, seconds, tasks_per_job) for _ in range(repeat)]
    medians = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    return {**medians, "completed": min(r["completed"] for r in runs)}


def set_autogroup_nice(pids: list[int], nice: int) -> None:
    """Linux's scheduler shares the CPU between sessions (autogroups) before processes: a process's own nice
    value counts only within its session. This sets the nice value of each pid's autogroup."""
    for pid in pids:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def row(label: str, r: dict[str, float]) -> str:
    return (
        f"| {label} | {r['offered']:.0f} | {r['achieved']:.0f} | {r['completed']:.0%} | "
        f"{r['p50'] * 1000:.1f} ms | {r['p99'] * 1000:.1f} ms |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, nargs="+", default=[1, 3], help="GM/LM pairs to test")
    parser.add_argument("--rates", type=float, nargs="+", default=[250, 500, 1000, 1500, 2000, 3000])
    parser.add_argument("--seconds", type=float, default=6.0, help="offered load per step")
    parser.add_argument("--tasks-per-job", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=2000, help="simulated nodes per LM")
    parser.add_argument("--repeat", type=int, default=1, help="runs per point; figures are their medians")
    parser.add_argument(
        "--autogroup-nice", type=int, help="scheduling priority of the benchmark's processes over other sessions"
    )
    args = parser.parse_args()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, ", end="")
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, load average before: {load}, {args.repeat} run(s) per point", end="")
    print("" if args.autogroup_nice is None else f", autogroup nice {args.autogroup_nice}")
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
            if args.autogroup_nice is not None:
                set_autogroup_nice([os.getpid(), *(p.popen.pid for p in deployment.processes)], args.autogroup_nice)
            best = 0.0
            for rate in args.rates:
                r = measure_median(deployment, rate, args.seconds, args.tasks_per_job, args.repeat)
                print(row(f"{pairs} x {pairs}", r), flush=True)
                if r["completed"] < 1 or r["achieved"] < 0.9 * rate:
                    break
                best = rate
            if best:
                for share in (0.5, 0.9):
                    r = measure_median(deployment, best * share, args.seconds, args.tasks_per_job, args.repeat)
                    print(row(f"{pairs} x {pairs} ({share:.0%} of {best:.0f})", r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
