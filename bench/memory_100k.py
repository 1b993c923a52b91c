"""Benchmark: peak memory of a replay on 100,000 generated workers (twice the papers' largest data centre).

Each scenario runs in a fresh process that builds the data centre (10 LMs x 10 GMs x 1,000 workers: every GM
holds a view of all 100,000 workers), the workload and the system, replays the workload, computes the metrics,
and reports its peak resident set size (`resource.getrusage`, ru_maxrss). The target is under 8 GB.

Scenarios:
* `poisson`: jobs of 100 one-second tasks arriving as a Poisson process that offers 80% of the workers for 10
  simulated seconds (about 800,000 tasks; the scale experiment's workload, `megha.sim.experiments.scale`);
* `goog`: all of GOOG_subtrace.tr (312,558 tasks, mostly long ones), when ../shared is present.

    python bench/memory_100k.py                       # both scenarios
    python bench/memory_100k.py --scenario poisson --seconds 5
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

GOOG = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "GOOG_subtrace.tr"
LMS, GMS, WORKERS_PER_PARTITION = 10, 10, 1000
TARGET_MB = 8 * 1024

CHILD = """
import json, resource, sys, tempfile, time
from pathlib import Path
from megha.loadgen.replay import ReplayConfig, replay
from megha.sim.experiments.workloads import PoissonLoad
scenario, trace, seconds, lms, gms, wpp = sys.argv[1], sys.argv[2], float(sys.argv[3]), *map(int, sys.argv[4:7])
with tempfile.TemporaryDirectory() as tmp:
    if scenario == "poisson":
        trace = str(Path(tmp) / "poisson.tr")
        PoissonLoad(seconds=seconds).write(Path(trace), lms * gms * wpp, seed=0)
    start = time.perf_counter()
    result = replay(ReplayConfig(trace=trace, lms=lms, gms=gms, workers_per_partition=wpp))
    total = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_SELF)
m = result.metrics
print(json.dumps({"workers": result.cluster.num_nodes, "tasks": m.tasks, "loop": result.wall_seconds,
                  "total": total, "rss_mb": usage.ru_maxrss / 1024,
                  "once": m.tasks - len(m.not_exactly_once) - m.tasks_failed, "alloc_p99": m.allocation_time.p99}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=["poisson", "goog"], action="append", help="default: both")
    parser.add_argument("--seconds", type=float, default=10.0, help="simulated seconds of Poisson arrivals")
    args = parser.parse_args()
    scenarios = args.scenario or ["poisson", "goog"]
    if "goog" in scenarios and not GOOG.exists():
        print(f"skipping goog: {GOOG} (../shared/traces) not found", file=sys.stderr)
        scenarios.remove("goog")
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    print()
    print("| scenario | workers | tasks | completed once | loop s | whole replay s | peak RSS MB | alloc p99 s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    worst = 0.0
    for scenario in scenarios:
        argv = [scenario, str(GOOG), str(args.seconds), str(LMS), str(GMS), str(WORKERS_PER_PARTITION)]
        out = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        worst = max(worst, r["rss_mb"])
        print(
            f"| {scenario} | {r['workers']:,} | {r['tasks']:,} | {r['once']:,} | {r['loop']:.1f} | {r['total']:.1f} "
            f"| {r['rss_mb']:,.0f} | {r['alloc_p99']:.3f} |",
            flush=True,
        )
    print()
    print(
        f"largest peak RSS {worst:,.0f} MB (target under {TARGET_MB:,} MB: {'met' if worst < TARGET_MB else 'not met'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
