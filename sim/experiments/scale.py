"""Megha's allocation time as the data centre grows (Megha paper, sections VI-C and VI-D): 1,000 to 50,000 workers
under 10 GMs and 10 LMs; and at 30,000 workers, 1 to 20 GMs under 10 LMs and 1 to 20 LMs under 10 GMs.

The workload grows with the data centre: jobs of 100 one-second tasks arrive as a Poisson process at a rate that
offers 80% of the workers (a fixed trace would leave the large data centres idle and only measure the small
ones' queues), for 10 simulated seconds (ten task lifetimes: long enough for a steady state, short enough to run
50,000 workers); tasks hold one worker (slot mode) and carry Sharma et al. constraints. A generated trace file is
written to a temporary directory (seeded, so a run is reproducible).

On the simulator's virtual clock, deciding costs no time: the allocation time shows network hops, inconsistencies
and waiting for workers, not processing. What a bigger state costs the GMs and LMs shows instead in the CPU
time per task, the simulator's own processing cost (every GM, LM and worker on one core).

    python -m megha.sim.experiments.scale                # the full experiment: writes docs/results/scale*
    python -m megha.sim.experiments.scale --sizes 1000 5000 --grid-workers 5000 --counts 1 5 --out /tmp/scale
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from megha.common.argtypes import positive_int
from megha.common.lifecycle import exit_quietly_if_stdout_closed
from megha.loadgen.replay import ReplayConfig
from megha.sim.experiments import harness
from megha.sim.experiments.harness import Run, group, spread
from megha.sim.experiments.workloads import PoissonLoad

MODULE = "scale"
DESCRIPTION = (
    "Allocation time against data-centre size (10 GMs x 10 LMs) and against the numbers of GMs and LMs; writes "
    "NAME.csv, NAME.md and NAME.png."
)
DEFAULT_SIZES = [1000, 2000, 5000, 10000, 20000, 30000, 50000]
DEFAULT_COUNTS = [1, 2, 5, 10, 20]


def run_one(workers: int, lms: int, gms: int, load: PoissonLoad, seed: int, tmp: Path, label: str) -> Run | None:
    if workers % (lms * gms):
        harness.progress(f"skipping {lms} LMs x {gms} GMs: {workers} workers do not split into equal partitions")
        return None
    trace = tmp / f"poisson-{workers}-{seed}.tr"
    if not trace.exists():
        load.write(trace, workers, seed)
    config = ReplayConfig(
        trace=str(trace),
        cluster="generate",
        lms=lms,
        gms=gms,
        workers_per_partition=workers // (lms * gms),
        seed=seed,
    )
    return harness.run_replay(config, label)[0]


def size_rows(runs: Sequence[Run]) -> list[list[str]]:
    rows = []
    for (workers, lms, gms), rs in group(runs, "workers", "lms", "gms").items():
        rows.append(
            [
                f"{workers:,}",
                f"{lms}",
                f"{gms}",
                f"{sum(r.tasks for r in rs) // len(rs):,}",
                *(spread(rs, f).seconds() for f in ("alloc_median", "alloc_p99", "alloc_p9999", "alloc_max")),
                f"{sum(r.inconsistencies for r in rs) / len(rs):,.0f}",
                f"{sum(r.repartitions for r in rs) / len(rs):,.0f}",
                f"{sum(r.jobs_rejected for r in rs) / len(rs):,.0f}",
                harness.accounted(rs),
                f"{_cost(rs):,.0f}",
            ]
        )
    return rows


HEADER = [
    "workers",
    "LMs",
    "GMs",
    "tasks",
    "alloc p50",
    "alloc p99",
    "alloc p99.99",
    "alloc max",
    "inconsistencies",
    "repartitions",
    "jobs rejected",
    "completed once / accepted tasks",
    "CPU µs per task",
]


def plot(sizes: Sequence[Run], grid: Sequence[Run], fixed: int, path: Path) -> None:
    """Top: allocation time and the simulator's cost per task against workers. Bottom: the same against the
    number of GMs (LMs fixed) and of LMs (GMs fixed)."""
    fig, axes = harness.figure(2, 2, width=13, height=8)
    by_size = group(sizes, "workers")
    xs = [workers for (workers,) in by_size]
    for figure, label in (("alloc_median", "p50"), ("alloc_p99", "p99"), ("alloc_p9999", "p99.99")):
        axes[0][0].plot(xs, [spread(rs, figure).mean for rs in by_size.values()], marker="o", label=label)
    axes[0][0].set_title(f"allocation time, {fixed} GMs x {fixed} LMs")
    axes[0][1].plot(xs, [_cost(rs) for rs in by_size.values()], marker="o")
    axes[0][1].set_title(f"simulator CPU time per task, {fixed} GMs x {fixed} LMs")
    for ax in axes[0]:
        ax.set_xlabel("workers")
    for varied, other in (("gms", "lms"), ("lms", "gms")):
        series = group([r for r in grid if getattr(r, other) == fixed], varied)
        counts = [count for (count,) in series]
        label = f"{varied.upper()} varied, {fixed} {other.upper()}"
        axes[1][0].plot(counts, [spread(rs, "alloc_p99").mean for rs in series.values()], marker="o", label=label)
        axes[1][1].plot(counts, [_cost(rs) for rs in series.values()], marker="o", label=label)
    if grid:
        axes[1][0].set_title(f"p99 allocation time, {grid[0].workers:,} workers")
        axes[1][1].set_title(f"simulator CPU time per task, {grid[0].workers:,} workers")
    for ax in axes[1]:
        ax.set_xlabel("GMs or LMs")
    for row in axes:
        row[0].set_yscale("log")
        row[0].set_ylabel("seconds")
        row[1].set_ylabel("µs per task")
        for ax in row:
            ax.set_xscale("log")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
    harness.save(fig, path)


def _cost(runs: Sequence[Run]) -> float:
    return sum(r.cpu_us_per_task for r in runs) / len(runs)


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(MODULE, "scale", DESCRIPTION, seeds=(0,))
    parser.add_argument("--sizes", type=positive_int, nargs="+", default=DEFAULT_SIZES, help="default: %(default)s")
    parser.add_argument(
        "--gms-lms",
        type=positive_int,
        default=10,
        help="GMs and LMs for --sizes, and the count held fixed while the other varies (default: 10)",
    )
    parser.add_argument("--grid-workers", type=positive_int, default=30000, help="default: %(default)s")
    parser.add_argument(
        "--counts", type=positive_int, nargs="*", default=DEFAULT_COUNTS, help="GM and LM counts (default: %(default)s)"
    )
    parser.add_argument("--load", type=float, default=0.8, help="offered share of the workers (default: 0.8)")
    parser.add_argument("--tasks-per-job", type=positive_int, default=100)
    parser.add_argument("--seconds", type=float, default=10.0, help="simulated seconds of arrivals (default: 10)")
    args = parser.parse_args(argv)
    if not 0 < args.load <= 2:
        parser.error("--load must be in (0, 2]")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    sizes: list[Run] = []
    grid: list[Run] = []
    n = args.gms_lms
    configs = list(dict.fromkeys([*((n, gms) for gms in args.counts), *((lms, n) for lms in args.counts)]))
    load = PoissonLoad(args.load, args.tasks_per_job, args.seconds)
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for workers in args.sizes:
                run = run_one(workers, n, n, load, seed, Path(tmp), "size")
                if run is not None:
                    sizes.append(run)
            for lms, gms in sorted(configs):
                run = run_one(args.grid_workers, lms, gms, load, seed, Path(tmp), "grid")
                if run is not None:
                    grid.append(run)
    harness.write_runs(args.out / f"{args.name}.csv", [*sizes, *grid])
    plot(sizes, grid, n, args.out / f"{args.name}.png")
    body = [
        f"Poisson arrivals of {args.tasks_per_job}-task jobs of one-second tasks offering {args.load:.0%} of the "
        f"workers for {args.seconds:g} simulated seconds; slot mode, Sharma et al. constraints, 0.5 ms per hop, 1 s "
        f"delta interval, seeds {', '.join(map(str, args.seeds))}. Allocation times are on the virtual clock "
        "(deciding costs no time there); 'CPU µs per task' is the simulator's processing cost per task (CPU time of "
        "the whole replay over its tasks), every GM, LM and worker sharing one core. See `sim/experiments/scale.py` "
        "for why the load grows with the size. 'jobs rejected': jobs refused at submission because no node of the "
        "generated data centre has one of their tasks' constraints (small data centres lack the rare ones); their "
        "tasks are in 'tasks' but not among the accepted tasks, and no allocation time counts them.",
        "",
        f"## Data-centre size ({n} GMs x {n} LMs)",
        "",
        *harness.table(HEADER, size_rows(sizes)),
        "",
        f"## GMs and LMs at {args.grid_workers:,} workers (one varied, the other {n})",
        "",
        *harness.table(HEADER, size_rows(grid)),
        "",
        f"![scale]({args.name}.png)",
    ]
    title = "Scale: allocation time against data-centre size and the numbers of GMs and LMs"
    harness.write_page(args, MODULE, argv, title, start, body)
    return 0


if __name__ == "__main__":
    exit_quietly_if_stdout_closed(main)
