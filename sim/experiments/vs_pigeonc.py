"""Megha against PigeonC (constraint-aware paper, section 6): JRT delay and utilization with Random and
Minimum-Constraints matching, on the synthetic traces and the Google sub-trace, over several seeds.

The syn_* traces run on the published 10,000-node reference cluster (5 LMs x 5 GMs x 400); the Google sub-trace on
a generated 20,000-worker data centre (5 LMs x 5 GMs x 800), as in the paper. One task holds one worker (slot
mode); constraints follow Sharma et al.; PigeonC has 10 distributors and 100 masters over the same workers. A seed
draws the task constraints, the random choices and (for generated data centres) the nodes' constraints.

    python -m megha.sim.experiments.vs_pigeonc              # the full experiment: writes docs/results/megha-vs-pigeonc*
    python -m megha.sim.experiments.vs_pigeonc --workloads syn_250 --first-jobs 200 --seeds 0 --out /tmp/vs
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

from megha.common.argtypes import positive_int
from megha.common.core.placement.choice import CHOICE_POLICIES
from megha.common.lifecycle import exit_quietly_if_stdout_closed
from megha.sim.experiments import harness
from megha.sim.experiments.harness import Run, group, spread

MODULE = "vs_pigeonc"
DESCRIPTION = (
    "Megha vs PigeonC: JRT delay and utilization with Random and Minimum-Constraints matching; writes NAME.csv, "
    "NAME.md and NAME.png."
)
DEFAULT_WORKLOADS = ["syn_250", "syn_500", "syn_1000", "GOOG"]
SCHEDULERS = ["megha", "pigeonc", "pigeonc-published"]
DEFAULT_SCHEDULERS = ["megha", "pigeonc"]


def markdown(runs: Sequence[Run], first_jobs: int | None, seeds: Sequence[int], name: str) -> list[str]:
    by_config = group(runs, "workload", "scheduler", "matching")
    rows = []
    for (workload, scheduler, matching), rs in by_config.items():
        rows.append(
            [
                workload,
                f"{rs[0].workers:,}",
                scheduler,
                matching,
                spread(rs, "jrt_median").seconds(),
                spread(rs, "jrt_p99").seconds(),
                spread(rs, "jrt_max").seconds(),
                spread(rs, "utilization").percent(),
                harness.accounted(rs),
                harness.count_range(rs, "jobs_rejected"),
                f"{sum(r.inconsistencies for r in rs) / len(rs):,.0f}",
                f"{sum(r.wall_seconds for r in rs) / len(rs):,.1f}",
            ]
        )
    ratios = []
    for (workload, matching), rs in group(runs, "workload", "matching").items():
        by_scheduler = group(rs, "scheduler")
        megha = by_scheduler.get(("megha",))
        for (baseline,), others in by_scheduler.items():
            if megha and baseline != "megha":
                m, p = spread(megha, "jrt_p99").mean, spread(others, "jrt_p99").mean
                ratios.append([workload, matching, baseline, harness.seconds(m), harness.seconds(p), _ratio(p, m)])
    jobs = "all jobs" if first_jobs is None else f"the first {first_jobs:,} jobs"
    return [
        f"Each trace ({jobs}) replayed by Megha (5 GMs, 5 LMs, 1 s delta interval) and PigeonC (10 distributors, "
        "100 masters; `pigeonc` weighs masters by the paper's count of suitable workers, `pigeonc-published` by the "
        "constraint-set tally of the authors' simulator, which reproduces their published PigeonC figures) in slot "
        "mode (one task holds one worker), with task constraints from Sharma et al. and 0.5 ms "
        f"per network hop, for seeds {', '.join(map(str, seeds))}. syn_* traces run on the published 10,000-node "
        "reference cluster, the Google sub-trace on a generated 20,000-worker data centre (5 x 5 x 800). "
        "Figures are the mean over seeds with the range (min - max) in brackets when seeds differ. JRT delay = "
        "actual JRT - the job's longest task. Utilization is the time-average share of workers busy from the first "
        "task start to the last finish. Jobs with a task no worker can ever run are rejected at submission by "
        "both schedulers ('rejected jobs': per seed, the range when seeds differ); the tasks of the other jobs are "
        "the accepted tasks, summed over seeds.",
        "",
        *harness.table(
            [
                "workload",
                "workers",
                "scheduler",
                "matching",
                "JRT delay p50",
                "JRT delay p99",
                "JRT delay max",
                "utilization",
                "completed once / accepted tasks",
                "rejected jobs",
                "inconsistencies",
                "wall s per run",
            ],
            rows,
        ),
        "",
        "## p99 JRT delay: baseline / Megha",
        "",
        *harness.table(["workload", "matching", "baseline", "Megha p99", "baseline p99", "baseline / Megha"], ratios),
        "",
        f"![JRT delay and utilization]({name}.png)",
    ]


def _ratio(numerator: float, denominator: float) -> str:
    if math.isnan(numerator) or math.isnan(denominator) or denominator <= 0:
        return "-"
    return f"{numerator / denominator:,.0f}x" if numerator / denominator >= 10 else f"{numerator / denominator:.2f}x"


def plot(runs: Sequence[Run], path: Path) -> None:
    """Grouped bars per workload (scheduler x matching): p50 and p99 JRT delay (log scale) and utilization, with
    the range over seeds as error bars."""
    configs = list(group(runs, "scheduler", "matching"))
    workloads = list(group(runs, "workload"))
    fig, axes = harness.figure(1, 3, width=15, height=4.2)
    width = 0.8 / max(len(configs), 1)
    figures = [("jrt_median", "JRT delay p50 (s)", True), ("jrt_p99", "JRT delay p99 (s)", True)]
    figures.append(("utilization", "mean utilization", False))
    by_key = group(runs, "workload", "scheduler", "matching")
    for ax, (name, label, log) in zip(axes[0], figures):
        for k, (scheduler, matching) in enumerate(configs):
            means, lows, highs = [], [], []
            for (workload,) in workloads:
                s = spread(by_key.get((workload, scheduler, matching), []), name)
                means.append(s.mean)
                lows.append(s.mean - s.low)
                highs.append(s.high - s.mean)
            xs = [i + (k - (len(configs) - 1) / 2) * width for i in range(len(workloads))]
            ax.bar(xs, means, width, yerr=[lows, highs], capsize=2, label=f"{scheduler}, {matching}")
        ax.set_xticks(range(len(workloads)), [w for (w,) in workloads])
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Megha vs PigeonC (bars: mean over seeds; whiskers: min - max)")
    harness.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(MODULE, "megha-vs-pigeonc", DESCRIPTION)
    parser.add_argument(
        "--workloads",
        nargs="+",
        default=DEFAULT_WORKLOADS,
        help="traces (syn_250, syn_500, syn_1000, GOOG, syn:<tasks>:<jobs> or a .tr path), each optionally "
        "@reference or @LMSxGMSxWORKERS (default: %(default)s)",
    )
    parser.add_argument("--first-jobs", type=positive_int, help="replay only the first N jobs (default: all)")
    parser.add_argument(
        "--schedulers",
        nargs="+",
        choices=SCHEDULERS,
        default=DEFAULT_SCHEDULERS,
        help="pigeonc-published: PigeonC with the authors' simulator's worker tally (default: %(default)s)",
    )
    parser.add_argument(
        "--matchings",
        nargs="+",
        choices=sorted(CHOICE_POLICIES),
        default=["random", "min-constraints"],
        help="the GM's node choices to compare (default: the constraint-aware paper's two, %(default)s)",
    )
    args = parser.parse_args(argv)
    workloads = harness.parse_workloads(parser, args.workloads)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    runs = harness.replay_each(
        workloads, args.seeds, args.first_jobs, scheduler=args.schedulers, matching=args.matchings
    )
    harness.write_runs(args.out / f"{args.name}.csv", runs)
    plot(runs, args.out / f"{args.name}.png")
    body = markdown(runs, args.first_jobs, args.seeds, args.name)
    harness.write_page(args, MODULE, argv, "Megha vs PigeonC: JRT delay and utilization", start, body)
    return 0


if __name__ == "__main__":
    exit_quietly_if_stdout_closed(main)
