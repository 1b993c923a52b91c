"""Benchmark: wall time of Megha replaying all of GOOG_subtrace.tr on 20,000 generated workers (5 LMs x 5 GMs x 800).

Each run is a fresh process running the same replay as

    megha replay --trace ../shared/traces/GOOG_subtrace.tr --lms 5 --gms 5 --workers-per-partition 800 --no-files

and reports the event loop's wall time, the whole replay's wall time (cluster, workload, run, metrics), the
process's CPU time (less sensitive than wall time to other work on a shared machine) and its peak RSS. The target
is a whole replay under 60 s.

    python bench/goog_20k.py --repeat 3
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "GOOG_subtrace.tr"
TARGET_SECONDS = 60.0

CHILD = """
import json, resource, sys, time
from megha.loadgen.replay import ReplayConfig, replay
start = time.perf_counter()
result = replay(ReplayConfig(trace=sys.argv[1], lms=5, gms=5, workers_per_partition=800))
total = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_SELF)
m = result.metrics
print(json.dumps({"loop": result.wall_seconds, "total": total, "cpu": usage.ru_utime + usage.ru_stime,
                  "rss_mb": usage.ru_maxrss / 1024, "completed": m.tasks_completed, "tasks": m.tasks,
                  "once": m.tasks - len(m.not_exactly_once) - m.tasks_failed}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not TRACE.exists():
        print(f"needs {TRACE} (../shared/traces); not found", file=sys.stderr)
        return 2
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    print()
    print("| run | loop s | whole replay s | CPU s | peak RSS MB | completed once / tasks |")
    print("| --- | --- | --- | --- | --- | --- |")
    runs = []
    for i in range(args.repeat):
        out = subprocess.run([sys.executable, "-c", CHILD, str(TRACE)], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        runs.append(r)
        print(
            f"| {i + 1} | {r['loop']:.1f} | {r['total']:.1f} | {r['cpu']:.1f} | {r['rss_mb']:,.0f} | "
            f"{r['once']:,} / {r['tasks']:,} |",
            flush=True,
        )
    whole = [r["total"] for r in runs]
    print()
    print(
        f"whole replay: median {statistics.median(whole):.1f} s, best {min(whole):.1f} s "
        f"(target under {TARGET_SECONDS:.0f} s: {'met' if statistics.median(whole) < TARGET_SECONDS else 'not met'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
