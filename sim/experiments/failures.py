"""Failures against JRT delay and lost work: the same replay at rising crash rates of worker nodes, LMs and GMs.

Worker nodes crash at random (a Poisson process, `rate` crashes per node per hour); an LM notices a crash after
30 s (the services' default MEGHA_WORKER_TIMEOUT) and reports the node's tasks lost; their GMs run them again
as their next attempt (at most 3); the node is back 60 s after it crashed. LMs and GMs crash at random too
(`rate` per LM or GM per hour) and restart `--down` seconds later (10 s): an LM's tasks run on and its launches
wait for it; a GM's submissions and completions wait for it, and it rebuilds from the LMs and its journal
(`megha.embedded.outages`). By default the first 1,000 jobs of syn_250 (250,000 one-second tasks, one job a
second) run on 1,000 generated nodes (5 GMs x 5 LMs, slot mode, Random matching, no constraints), about 25%
loaded.

    python -m megha.sim.experiments.failures                 # writes docs/results/failures.md and .csv
    python -m megha.sim.experiments.failures --rates 0 10 --lm-rates 20 --gm-rates --first-jobs 200 --out /tmp/f
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

from megha.common.lifecycle import exit_quietly_if_stdout_closed
from megha.common.usage import OneLineParser
from megha.embedded.faults import Faults
from megha.loadgen.replay import ReplayConfig, replay

COMMAND = "python -m megha.sim.experiments.failures"
DEFAULT_RATES = [0.0, 0.1, 0.5, 2.0, 10.0]
DEFAULT_MASTER_RATES = [1.0, 5.0, 20.0]
DETECT, REPAIR, DOWN = 30.0, 60.0, 10.0
FIELDS = [
    "component",
    "rate_per_hour",
    "crashes",
    "tasks",
    "completed_once",
    "failed",
    "retries",
    "lost_cpu_seconds",
    "jrt_delay_median_s",
    "jrt_delay_p99_s",
    "jrt_delay_max_s",
]


def run(component: str, rate: float, first_jobs: int, seed: int, down: float) -> dict[str, object]:
    """One replay with `component` ("worker", "lm" or "gm") crashing at `rate` per component per hour ("none":
    no failures)."""
    if component == "none":
        faults = None
    elif component == "worker":
        faults = Faults(worker_rate=rate, detect=DETECT, repair=REPAIR, seed=seed)
    else:  # crashed at random, they restart after the repair time
        rates = {"lm_rate": rate} if component == "lm" else {"gm_rate": rate}
        faults = Faults(**rates, repair=down, seed=seed)
    config = ReplayConfig(
        trace="syn:250:2000",
        first_jobs=first_jobs,
        lms=5,
        gms=5,
        workers_per_partition=40,
        constraints=False,
        seed=seed,
        faults=faults,
    )
    result = replay(config)
    m = result.metrics
    tasks = list(result.recorder.tasks.values())
    counters = result.system.counters()
    return {
        "component": component,
        "rate_per_hour": rate,
        "crashes": counters.get(f"{component}_crashes", 0),
        "tasks": m.tasks,
        "completed_once": sum(t.completions == 1 for t in tasks),
        "failed": sum(t.completions == 0 and bool(t.failed_reason) for t in tasks),
        "retries": counters.get("retries", 0),
        "lost_cpu_seconds": round(sum(t.lost_cpu_seconds for t in tasks), 1),
        "jrt_delay_median_s": round(m.jrt_delay.median, 4),
        "jrt_delay_p99_s": round(m.jrt_delay.p99, 3),
        "jrt_delay_max_s": round(m.jrt_delay.max, 3),
    }


TITLES = {
    "none": "no failures",
    "worker": "worker nodes (crashes per node per hour)",
    "lm": "LMs (crashes per LM per hour)",
    "gm": "GMs (crashes per GM per hour)",
}


def markdown(rows: list[dict[str, object]], first_jobs: int, seed: int, down: float, seconds: float) -> str:
    lines = [
        "# Failures: JRT delay and lost work against the crash rate of workers, LMs and GMs",
        "",
        f"Produced by `{COMMAND}` ({seconds:.0f} s on a 2-core VM). The first {first_jobs:,} jobs of syn_250 on "
        "1,000 generated nodes (5 GMs x 5 LMs x 40 nodes per partition, slot mode, Random matching, no "
        f"constraints, seed {seed}). Each row crashes one kind of component at random at the given rate. Worker "
        f"nodes: an LM notices after {DETECT:g} s and reports the node's tasks lost, their GMs run them again (at "
        f"most 3 attempts), and the node is back {REPAIR:g} s after the crash. LMs and GMs restart {down:g} s after "
        "a crash: an LM's tasks run on, launches wait for it and its next incarnation adopts what its workers run; "
        "a GM's submissions and completions wait for it, and it rebuilds from every LM's report and its journal "
        "without launching again what runs or ended (`megha.embedded.outages`). Lost work is the CPU-seconds of "
        "the lost runs (their CPU request for as long as they had run, at most their duration).",
        "",
        "| crashes of | rate / hour | crashes | tasks | completed once | failed | retries | lost CPU-s | "
        "JRT delay median | p99 | max |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {TITLES[str(r['component'])]} | {r['rate_per_hour']:g} | {r['crashes']} | {r['tasks']:,} | "
            f"{r['completed_once']:,} | {r['failed']} | {r['retries']} | {r['lost_cpu_seconds']:,} | "
            f"{r['jrt_delay_median_s']} s | {r['jrt_delay_p99_s']} s | {r['jrt_delay_max_s']} s |"
        )
    lines += [
        "",
        "Every task completed exactly once or failed with a reason in every run. A lost task's job waits for the "
        f"crash to be noticed ({DETECT:g} s) and the task to run again, so a worker crash adds about {DETECT:g} s "
        f"to its job's JRT ({2 * DETECT:g} s when a job is hit twice in a row): the p99 rises to that as soon as 1% "
        "of the jobs are hit, and the median once half of them are. The detection time, not the scheduler, sets "
        "the cost of a worker crash: a shorter MEGHA_WORKER_TIMEOUT lowers it in proportion, at the price of "
        "taking slow agents for dead.",
        "",
        "An LM or GM crash loses no work: the tasks running on its workers run on, and nothing is launched twice. "
        f"It delays the tasks it would have launched or placed while it was down, by up to its {down:g} s: an LM's "
        "launches wait (its GMs keep placing tasks on its nodes, which look free), and so do a GM's submissions "
        "and the tasks it had queued. The p99 rises to the down time once about 1% of the jobs meet an outage.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m megha.sim.experiments.failures", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rates", type=float, nargs="*", default=DEFAULT_RATES, help="worker crashes per node per hour (0: none)"
    )
    parser.add_argument("--lm-rates", type=float, nargs="*", default=DEFAULT_MASTER_RATES, help="per LM per hour")
    parser.add_argument("--gm-rates", type=float, nargs="*", default=DEFAULT_MASTER_RATES, help="per GM per hour")
    parser.add_argument("--down", type=float, default=DOWN, help="seconds until a crashed LM or GM restarts")
    parser.add_argument("--first-jobs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "docs" / "results")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    runs = [("worker" if rate > 0 else "none", rate) for rate in args.rates]
    runs += [("lm", rate) for rate in args.lm_rates] + [("gm", rate) for rate in args.gm_rates]
    rows = []
    for component, rate in runs:
        rows.append(run(component, rate, args.first_jobs, args.seed, args.down))
        print(rows[-1], file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "failures.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    page = markdown(rows, args.first_jobs, args.seed, args.down, time.perf_counter() - start)
    (args.out / "failures.md").write_text(page)
    print(f"wrote {args.out / 'failures.md'}")
    return 0


if __name__ == "__main__":
    exit_quietly_if_stdout_closed(main)
