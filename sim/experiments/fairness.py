"""The Megha paper's fairness study (section VI-E), for every share policy.

Four queues with shares 10%, 25%, 15% and 50% on three GMs (queue 1 on GM 0, queues 2 and 3 on GM 1, queue 4
on GM 2) replay the Google sub-trace on data centres of about 200, 500 and 1,500 workers (2 LMs x 3 GMs x n
workers per partition, so 198, 498 and 1,500). Jobs go to the queues round-robin; tasks get the Megha
prototype's scaled requests and, as in the paper's fairness study, no placement constraints (a 200-node data
centre cannot satisfy the rarer constraints at all). For each policy and size it records allocation time,
repartitions, preemption attempts, preemptions, work lost, and Jain's fairness index while resources are
contended; it plots each queue's share over time against its target.

    python -m megha.sim.experiments.fairness                       # writes docs/results/fairness*
    python -m megha.sim.experiments.fairness --first-jobs 100 --sizes 200 --out /tmp/fair   # a quick look
"""

from __future__ import annotations

import csv
import math
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from megha.common.argtypes import positive_int
from megha.common.core.fairness.policy import SHARE_POLICIES
from megha.common.lifecycle import exit_quietly_if_stdout_closed
from megha.common.usage import OneLineParser
from megha.loadgen.replay import ReplayConfig, replay
from megha.loadgen.report import format_seconds
from megha.sim.experiments.shares import ShareSeries, share_series

QUEUES = "q1:10%:0,q2:25%:1,q3:15%:1,q4:50%:2"
LMS, GMS = 2, 3
DEFAULT_TRACE = "../shared/traces/GOOG_subtrace.tr"
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Row:
    policy: str
    workers: int
    tasks: int
    completed_once: int
    alloc_median: float
    alloc_p99: float
    repartitions: int
    preemption_attempts: int
    preemptions: int
    lost_cpu_seconds: float
    jain_contended: float
    contended_fraction: float
    wall_seconds: float


def workers_per_partition(size: int) -> int:
    return max(1, round(size / (LMS * GMS)))


def run_one(
    trace: str, first_jobs: int, policy: str, size: int, seed: int, samples: int = 2000
) -> tuple[Row, ShareSeries]:
    config = ReplayConfig(
        trace=trace,
        first_jobs=first_jobs,
        lms=LMS,
        gms=GMS,
        workers_per_partition=workers_per_partition(size),
        node_cpu_millicores=2000,
        node_memory_mb=4096,
        mode="scaled",
        seed=seed,
        constraints=False,
        queues=QUEUES,
        share_policy=policy,
    )
    result = replay(config)
    fairness = config.fairness()
    assert fairness is not None
    series = share_series(result.recorder, fairness, result.cluster.total_capacity(), samples)
    m = result.metrics
    row = Row(
        policy=policy,
        workers=result.cluster.num_nodes,
        tasks=m.tasks,
        completed_once=m.tasks - len(m.not_exactly_once) - m.tasks_failed,
        alloc_median=m.allocation_time.median,
        alloc_p99=m.allocation_time.p99,
        repartitions=m.repartitions,
        preemption_attempts=m.preemption_attempts,
        preemptions=m.preemptions,
        lost_cpu_seconds=m.lost_cpu_seconds,
        jain_contended=series.mean_jain_contended(),
        contended_fraction=float(series.contended.mean()) if series.contended.size else math.nan,
        wall_seconds=result.wall_seconds,
    )
    return row, series


def _window(series: dict[str, ShareSeries]) -> tuple[float, float] | None:
    """Hours (since the first start) around the contended samples of any policy, with a margin; None if none."""
    spans = []
    for s in series.values():
        if s.contended.any():
            hours = (s.times - s.times[0]) / 3600
            spans.append((hours[s.contended].min(), hours[s.contended].max()))
    if not spans:
        return None
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    margin = max(0.1 * (hi - lo), 0.5)
    return max(0.0, lo - margin), hi + margin


def plot_shares(series: dict[str, ShareSeries], targets: dict[str, float], path: Path, title: str) -> None:
    """One panel per policy: each queue's consumption over time (solid) against its share (dashed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 2.6 * len(series)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(series), 1, squeeze=False)[:, 0]
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    for ax, (policy, s) in zip(axes, series.items()):
        hours = (s.times - s.times[0]) / 3600 if s.times.size else s.times
        for k, (user, values) in enumerate(s.consumption.items()):
            color = colors[k % len(colors)]
            ax.plot(hours, values, color=color, linewidth=0.9, label=f"{user} (share {targets[user]:.0%})")
            ax.axhline(targets[user], color=color, linestyle="--", linewidth=0.8)
        ax.set_title(f"{policy}: mean Jain index while contended {s.mean_jain_contended():.3f}", fontsize=9)
        ax.set_ylabel("consumption")
        ax.set_ylim(0, 1)
        if (window := _window(series)) is not None:
            ax.set_xlim(*window)
        ax.legend(fontsize=7, loc="upper right", ncol=4)
    axes[-1].set_xlabel("hours since the first task started (zoomed to the contended period)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_jain(series: dict[str, ShareSeries], path: Path, title: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 3.5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for policy, s in series.items():
        hours = (s.times - s.times[0]) / 3600 if s.times.size else s.times
        jain = s.jain.copy()
        jain[~s.contended] = float("nan")
        ax.plot(hours, jain, linewidth=0.9, label=policy)
    if (window := _window(series)) is not None:
        ax.set_xlim(*window)
    ax.set_xlabel("hours since the first task started")
    ax.set_ylabel("Jain's index (contended times)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(rows: list[Row], command: str, first_jobs: int, wall: float) -> str:
    lines = [
        "# Fairness: the Megha paper's study, for every share policy",
        "",
        f"Produced by `{command}` in {wall:,.0f} s on {platform.platform()} (Python {platform.python_version()}).",
        "",
        f"Queues {QUEUES} (user:share:GM), first {first_jobs} jobs of the Google sub-trace, scaled requests, "
        f"no placement constraints, {LMS} LMs x {GMS} GMs. Jain's index is over consumption / share of the queues "
        "with tasks waiting, averaged over the sampled times at which some task was waiting.",
        "",
        "| policy | workers | tasks | completed once | alloc p50 | alloc p99 | repartitions | preemption attempts "
        "| preemptions | work lost (CPU-s) | Jain (contended) | time contended |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.policy} | {r.workers} | {r.tasks} | {r.completed_once} | {format_seconds(r.alloc_median)} | "
            f"{format_seconds(r.alloc_p99)} | {r.repartitions} | {r.preemption_attempts} | {r.preemptions} | "
            f"{r.lost_cpu_seconds:,.0f} | {r.jain_contended:.3f} | {100 * r.contended_fraction:.0f}% |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m megha.sim.experiments.fairness",
        description="The Megha paper's fairness study (4 queues, 3 GMs, 200/500/1,500 workers) for every share "
        "policy; writes fairness.csv, fairness.md and plots.",
    )
    parser.add_argument("--trace", default=DEFAULT_TRACE, help="trace file (default: %(default)s)")
    parser.add_argument("--first-jobs", type=positive_int, default=3000, help="jobs replayed (default: 3000)")
    parser.add_argument("--sizes", type=positive_int, nargs="+", default=[200, 500, 1500], help="data-centre sizes")
    parser.add_argument(
        "--policies", nargs="+", choices=sorted(SHARE_POLICIES), default=["share", "drf", "demand", "demand-drf"]
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results", help="output directory")
    args = parser.parse_args(argv)
    if not Path(args.trace).exists():
        parser.error(f"trace {args.trace} not found (the traces live in ../shared/traces)")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows: list[Row] = []
    by_size: dict[int, dict[str, ShareSeries]] = {}
    fairness = ReplayConfig(queues=QUEUES).fairness()
    assert fairness is not None
    targets = fairness.shares()
    for size in args.sizes:
        for policy in args.policies:
            row, series = run_one(args.trace, args.first_jobs, policy, size, args.seed)
            rows.append(row)
            by_size.setdefault(size, {})[policy] = series
            print(
                f"{policy:>10} {row.workers:>5} workers: alloc p50 {format_seconds(row.alloc_median)}, "
                f"{row.preemptions} preemptions of {row.preemption_attempts} attempts, "
                f"Jain {row.jain_contended:.3f}, {row.wall_seconds:.1f}s wall",
                file=sys.stderr,
                flush=True,
            )
    with (args.out / "fairness.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(Row.__dataclass_fields__)
        writer.writerows([[getattr(r, f) for f in Row.__dataclass_fields__] for r in rows])
    for size, series in by_size.items():
        workers = LMS * GMS * workers_per_partition(size)
        plot_shares(series, targets, args.out / f"fairness-shares-{workers}.png", f"Queue shares, {workers} workers")
        plot_jain(series, args.out / f"fairness-jain-{workers}.png", f"Jain's index while contended, {workers} workers")
    command = "python -m megha.sim.experiments.fairness " + " ".join(argv if argv is not None else sys.argv[1:])
    (args.out / "fairness.md").write_text(markdown(rows, command.strip(), args.first_jobs, time.perf_counter() - start))
    print(f"wrote {args.out}/fairness.md, fairness.csv and plots", file=sys.stderr)
    return 0


if __name__ == "__main__":
    exit_quietly_if_stdout_closed(main)
