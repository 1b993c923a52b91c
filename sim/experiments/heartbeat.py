"""Sensitivity to the heartbeat period: the interval of the LMs' delta updates to the GMs, from 0.1 s to 10 s
(the Megha paper's future work; its experiments used 10 s, ours default to 1 s).

Between deltas a GM's view misses what the other GMs placed and what their tasks freed (its own placements and
completions reach it at once, with the launch response and the completion). A longer period therefore means more
placements on workers that are no longer free (inconsistencies, each costing a round trip and a retry) and
tasks parked longer for workers that are already free. By default the syn_1000 trace runs on the reference
cluster and the Google sub-trace on 20,000 generated workers (5 GMs x 5 LMs, slot mode, Random matching).

    python -m megha.sim.experiments.heartbeat            # the full experiment: writes docs/results/heartbeat*
    python -m megha.sim.experiments.heartbeat --workloads syn_1000 --first-jobs 300 --out /tmp/hb
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from megha.common.argtypes import positive_int
from megha.common.core.placement.choice import CHOICE_POLICIES
from megha.common.lifecycle import exit_quietly_if_stdout_closed
from megha.sim.experiments import harness
from megha.sim.experiments.harness import Run, group, spread

MODULE = "heartbeat"
TITLE = "Heartbeat period (LM delta interval) sensitivity"
DESCRIPTION = (
    "Heartbeat-period (LM delta interval) sensitivity: JRT delay, allocation time and inconsistencies; writes "
    "NAME.csv, NAME.md and NAME.png."
)
DEFAULT_INTERVALS = [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0]
DEFAULT_WORKLOADS = ["syn_1000", "GOOG"]


def markdown(runs: Sequence[Run], first_jobs: int | None, stem: str) -> list[str]:
    jobs = "all jobs" if first_jobs is None else f"the first {first_jobs:,} jobs"
    seeds = ", ".join(map(str, sorted({r.seed for r in runs})))
    rows = []
    for (workload, interval), rs in group(runs, "workload", "delta_interval").items():
        rows.append(
            [
                workload,
                f"{rs[0].workers:,}",
                f"{interval:g} s",
                *(spread(rs, f).seconds() for f in ("jrt_median", "jrt_p99", "alloc_median", "alloc_p99", "alloc_max")),
                f"{sum(r.inconsistencies for r in rs) / len(rs):,.0f}",
                f"{sum(r.inconsistencies for r in rs) / max(sum(r.tasks - r.failed for r in rs), 1):.2%}",
                f"{sum(r.reschedules for r in rs) / len(rs):,.0f}",
                harness.accounted(rs),
                f"{sum(r.wall_seconds for r in rs) / len(rs):,.1f}",
            ]
        )
    intro = (
        f"Megha (5 GMs x 5 LMs) on {jobs} of each trace, slot mode, Sharma et al. constraints, {runs[0].matching} "
        f"matching, 0.5 ms per hop, seeds {seeds} (mean over seeds, range in brackets when they differ). syn_* "
        "traces run on the reference cluster, the Google sub-trace on 20,000 generated workers. An inconsistency is "
        "a placement the LM refused because the GM's view was stale."
    )
    table = harness.table(
        [
            "workload",
            "workers",
            "delta interval",
            "JRT delay p50",
            "JRT delay p99",
            "alloc p50",
            "alloc p99",
            "alloc max",
            "inconsistencies",
            "per accepted task",
            "reschedules",
            "completed once / accepted tasks",
            "wall s per run",
        ],
        rows,
    )
    return [intro, "", *table, "", f"![heartbeat sensitivity]({stem}.png)"]


def plot(runs: Sequence[Run], path: Path) -> None:
    fig, axes = harness.figure(1, 3, width=15, height=4.2)
    for (workload,), rs in group(runs, "workload").items():
        by_interval = group(rs, "delta_interval")
        xs = [interval for (interval,) in by_interval]
        for ax, figures in zip(axes[0][:2], (("jrt_median", "jrt_p99"), ("alloc_median", "alloc_p99"))):
            for figure, style in zip(figures, ("--", "-")):
                ys = [spread(g, figure).mean for g in by_interval.values()]
                ax.plot(xs, ys, style, marker="o", label=f"{workload} {figure.split('_')[1]}")
        axes[0][2].plot(
            xs, [sum(r.inconsistencies for r in g) / len(g) for g in by_interval.values()], marker="o", label=workload
        )
    for ax, title in zip(axes[0], ("JRT delay (s)", "allocation time (s)", "inconsistencies per run")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("delta interval (s)")
        ax.set_title(title)
        ax.legend(fontsize=8)
    harness.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(MODULE, "heartbeat", DESCRIPTION, seeds=(0,))
    parser.add_argument(
        "--workloads", nargs="+", default=DEFAULT_WORKLOADS, help="as for vs_pigeonc (default: %(default)s)"
    )
    parser.add_argument("--intervals", type=float, nargs="+", default=DEFAULT_INTERVALS, help="seconds")
    parser.add_argument("--first-jobs", type=positive_int, help="replay only the first N jobs (default: all)")
    parser.add_argument("--matching", choices=sorted(CHOICE_POLICIES), default="random")
    args = parser.parse_args(argv)
    if any(not i > 0 for i in args.intervals):
        parser.error("--intervals must be positive")
    workloads = harness.parse_workloads(parser, args.workloads)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    runs = harness.replay_each(
        workloads, args.seeds, args.first_jobs, delta_interval=args.intervals, matching=[args.matching]
    )
    harness.write_runs(args.out / f"{args.name}.csv", runs)
    plot(runs, args.out / f"{args.name}.png")
    harness.write_page(args, MODULE, argv, TITLE, start, markdown(runs, args.first_jobs, args.name))
    return 0


if __name__ == "__main__":
    exit_quietly_if_stdout_closed(main)
