"""Benchmark: simulated tasks per second of wall time, and peak memory, of embedded-mode trace replays.

Runs each scenario in a fresh subprocess (so peak RSS is the run's own) `--repeat` times and prints a markdown
table: the wall time of the event loop alone (GMs, LMs, workers, recorder) and of the whole replay (cluster,
workload, run, metrics), simulated tasks per wall second of the event loop (median and best), and peak RSS.

    python bench/replay_throughput.py                    # syn_250 (200 jobs) and GOOG_subtrace, reference cluster
    python bench/replay_throughput.py --scenario syn250 --repeat 5
    python bench/replay_throughput.py --scenario syn250 --decision-costs calibrated
    python bench/replay_throughput.py --scenario syn250 --repeat 1 --lm-order scarcity   # interleave with first-fit
    python bench/replay_throughput.py --scenario syn250 --repeat 1 --lm-order first-fit --matching scarcity
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

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
SCENARIOS = {
    "syn250": {"trace": str(SHARED / "traces" / "syn_250.0.tr"), "first_jobs": 200, "cluster": "reference"},
    "goog": {"trace": str(SHARED / "traces" / "GOOG_subtrace.tr"), "first_jobs": None, "cluster": "reference"},
}

CHILD = """
import json, resource, sys, time
from megha.loadgen.replay import ReplayConfig, replay
start = time.perf_counter()
result = replay(ReplayConfig(**json.loads(sys.argv[1])))
total = time.perf_counter() - start
m = result.metrics
print(json.dumps({"loop_seconds": result.wall_seconds, "total_seconds": total, "tasks": m.tasks_completed,
                  "jrt_median": m.jrt_delay.median, "jrt_p99": m.jrt_delay.p99,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_once(config: dict[str, object]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(config)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), action="append", help="default: all")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--decision-costs", default="zero", help="zero or calibrated (docs/decision-time.md)")
    parser.add_argument("--lm-order", default="round-robin", help="the GMs' LM order (an LM_ORDERS name)")
    parser.add_argument("--matching", default="random", help="the GMs' node choice (a CHOICE_POLICIES name)")
    args = parser.parse_args()
    names = args.scenario or sorted(SCENARIOS, reverse=True)
    missing = [n for n in names if not Path(str(SCENARIOS[n]["trace"])).exists()]
    if missing:
        print(f"needs ../shared (traces and reference cluster); missing for {missing}", file=sys.stderr)
        return 2
    print(
        f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}"
    )
    print()
    print(
        "| scenario | tasks | loop s (median) | tasks/s (median) | tasks/s (best) | whole replay s | peak RSS MB |"
        " JRT delay p50 / p99 |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in names:
        runs = []
        for i in range(args.repeat):
            policies = {"decision_costs": args.decision_costs, "lm_order": args.lm_order, "matching": args.matching}
            runs.append(run_once({**SCENARIOS[name], **policies}))
            print(f"  {name} run {i + 1}: {runs[-1]['loop_seconds']:.2f} s", file=sys.stderr)
        loops = [r["loop_seconds"] for r in runs]
        tasks = runs[0]["tasks"]
        print(
            f"| {name} | {tasks:,.0f} | {statistics.median(loops):.2f} | {tasks / statistics.median(loops):,.0f} | "
            f"{tasks / min(loops):,.0f} | {statistics.median(r['total_seconds'] for r in runs):.2f} | "
            f"{max(r['peak_rss_mb'] for r in runs):,.0f} | "
            f"{runs[0]['jrt_median'] * 1000:.2f} ms / {runs[0]['jrt_p99']:.3f} s |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
