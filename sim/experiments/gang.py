"""Gang scheduling experiment: MPI-like jobs (every rank as long as the others) in a Poisson load of mixed job
sizes, placed as gangs (every task of a job starts or none does) against the same tasks placed independently:
job wait, the spread of a job's task starts, the node time an MPI job's early ranks would idle waiting for their
peers, and utilization (docs/gang.md).

    python -m megha.sim.experiments.gang                      # 3 seeds, gang fractions 0, 0.5, 1
    python -m megha.sim.experiments.gang --seeds 0 --jobs 2000 --load 0.8
    python -m megha.sim.experiments.gang --reserve-after 120 --name gang-reserve   # GMs hold LMs for starving gangs
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path

import numpy as np

from megha.common.lifecycle import exit_quietly_if_stdout_closed
from megha.loadgen.replay import ReplayConfig, replay
from megha.sim.experiments.harness import figure, parser, progress, save, seconds, table, write_page

SIZES = (1, 2, 4, 8, 16, 32, 64)
"""Ranks per job; drawn with WEIGHTS (most jobs small, as in the Google trace, some wide MPI jobs)."""
WEIGHTS = (0.40, 0.15, 0.15, 0.12, 0.10, 0.05, 0.03)
MEAN_DURATION = 100.0  # seconds, lognormal (sigma 1) per job; every rank of a job runs that long


@dataclass(frozen=True, slots=True)
class GangRun:
    """The figures of one replay (times in seconds); one CSV row. `multi_*` are over the jobs of two or more tasks
    (the ones that may be gangs)."""

    gangs: float
    seed: int
    reserve_after: float | None  # seconds a gang waits before its GM holds LMs for it (None: never)
    jobs: int
    tasks: int
    completed: int
    jrt_median: float
    jrt_p99: float
    multi_wait_median: float  # arrival to the last task's start
    multi_wait_p99: float
    multi_skew_mean: float  # first to last task start
    widest_wait_mean: float  # arrival to the last task's start, of the jobs of the widest size (SIZES[-1] ranks)
    widest_wait_max: float  # the longest of those waits
    idle_fraction: float  # rank time between a rank's start and its last peer's start, of all busy rank time
    utilization: float
    inconsistencies: int
    wall_seconds: float


def write_trace(path: Path, jobs: int, nodes: int, load: float, seed: int) -> None:
    """An MPI-like trace (the shared .tr format): Poisson arrivals at offered load `load` on `nodes` one-task
    nodes, job sizes from SIZES, each job's ranks equally long."""
    rng = random.Random(seed)
    mean_size = sum(s * w for s, w in zip(SIZES, WEIGHTS, strict=True))
    rate = load * nodes / (mean_size * MEAN_DURATION)  # jobs per second
    at = 1.0
    with path.open("w") as out:
        for _ in range(jobs):
            at += rng.expovariate(rate)
            size = rng.choices(SIZES, WEIGHTS)[0]
            duration = MEAN_DURATION * rng.lognormvariate(-0.5, 1.0)
            out.write(f"{at:.3f} {size} {duration:.3f} " + " ".join([f"{duration:.3f}"] * size) + "\n")


def run(
    trace: Path, gangs: float, seed: int, centre: tuple[int, int, int], reserve_after: float | None = None
) -> GangRun:
    lms, gms, wpp = centre
    config = ReplayConfig(
        trace=str(trace),
        lms=lms,
        gms=gms,
        workers_per_partition=wpp,
        constraints=False,
        seed=seed,
        gangs=gangs,
        gang_sizes=(2, max(SIZES)),
        gang_reserve_after=reserve_after,
    )
    result = replay(config)
    m = result.metrics
    tasks = result.recorder.tasks
    job_of = tasks.column("job_id")
    arrival = tasks.array("arrival", np.float64)
    started = tasks.array("started_at", np.float64)
    finished = tasks.array("finished_at", np.float64)
    rows: defaultdict[str, list[int]] = defaultdict(list)
    for row, job in enumerate(job_of):
        rows[job].append(row)
    waits, skews, widest = [], [], []
    idle = 0.0
    for members in rows.values():
        if len(members) < 2:
            continue
        starts = started[members]
        last = float(np.max(starts))
        waits.append(last - float(arrival[members[0]]))
        skews.append(last - float(np.min(starts)))
        idle += float(np.sum(last - starts))
        if len(members) == max(SIZES):
            widest.append(waits[-1])
    busy = float(np.nansum(finished - started))
    return GangRun(
        gangs=gangs,
        seed=seed,
        reserve_after=reserve_after,
        jobs=len(rows),
        tasks=m.tasks,
        completed=m.tasks_completed,
        jrt_median=m.jrt_delay.median,
        jrt_p99=m.jrt_delay.p99,
        multi_wait_median=float(np.median(waits)),
        multi_wait_p99=float(np.percentile(waits, 99)),
        multi_skew_mean=float(np.mean(skews)),
        widest_wait_mean=float(np.mean(widest)) if widest else math.nan,
        widest_wait_max=max(widest, default=math.nan),
        idle_fraction=idle / busy if busy else math.nan,
        utilization=next(iter(m.utilization.mean.values())),
        inconsistencies=m.inconsistencies,
        wall_seconds=result.wall_seconds,
    )


def plot(runs: Sequence[GangRun], path: Path) -> None:
    fig, axes = figure(1, 3, width=13, height=3.8)
    fractions = sorted({r.gangs for r in runs})

    def mean(attr: str, f: float) -> float:
        return float(np.mean([getattr(r, attr) for r in runs if r.gangs == f]))

    ax = axes[0][0]
    ax.plot(fractions, [mean("multi_wait_median", f) for f in fractions], "o-", label="median")
    ax.plot(fractions, [mean("multi_wait_p99", f) for f in fractions], "s--", label="p99")
    ax.set(xlabel="fraction of multi-task jobs that are gangs", ylabel="s", title="wait until the last rank starts")
    ax.legend()
    ax = axes[0][1]
    ax.plot(fractions, [mean("multi_skew_mean", f) for f in fractions], "o-")
    ax.set(xlabel="fraction of multi-task jobs that are gangs", ylabel="s", title="mean spread of a job's starts")
    ax = axes[0][2]
    ax.plot(fractions, [100 * mean("utilization", f) for f in fractions], "o-", label="busy nodes")
    useful = [100 * mean("utilization", f) * (1 - mean("idle_fraction", f)) for f in fractions]
    ax.plot(fractions, useful, "s--", label="minus ranks waiting for peers")
    ax.set(xlabel="fraction of multi-task jobs that are gangs", ylabel="% of nodes", title="utilization")
    ax.legend()
    save(fig, path)


def main(argv: Sequence[str] | None = None) -> None:
    p: argparse.ArgumentParser = parser("gang", "gang", __doc__.splitlines()[0], seeds=(0, 1, 2))
    p.add_argument("--jobs", type=int, default=1500, help="jobs per replay (default: %(default)s)")
    p.add_argument("--load", type=float, default=0.7, help="offered load, of the nodes (default: %(default)s)")
    p.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.5, 1.0], help="gang fractions")
    p.add_argument("--centre", default="4x2x32", help="LMs x GMs x workers per partition (default: %(default)s)")
    p.add_argument(
        "--reserve-after",
        type=float,
        default=None,
        help="seconds a gang waits before its GM holds LMs for it (megha replay --gang-reserve-after; default: never)",
    )
    args = p.parse_args(argv)
    lms, gms, wpp = (int(x) for x in args.centre.split("x"))
    start = time.perf_counter()
    runs: list[GangRun] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            trace = Path(tmp) / f"mpi-{seed}.tr"
            write_trace(trace, args.jobs, lms * gms * wpp, args.load, seed)
            for fraction in args.fractions:
                r = run(trace, fraction, seed, (lms, gms, wpp), args.reserve_after)
                progress(
                    f"seed {seed} gangs {fraction}: wait p50 {seconds(r.multi_wait_median)} p99 "
                    f"{seconds(r.multi_wait_p99)}, widest mean {seconds(r.widest_wait_mean)} max "
                    f"{seconds(r.widest_wait_max)}, skew {seconds(r.multi_skew_mean)}, idle {r.idle_fraction:.1%}, "
                    f"util {r.utilization:.1%}, {r.completed}/{r.tasks} done, {r.wall_seconds:.1f} s wall"
                )
                runs.append(r)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / f"{args.name}.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow([f.name for f in fields(GangRun)])
        writer.writerows(astuple(r) for r in runs)
    plot(runs, args.out / f"{args.name}.png")
    body = [
        f"{args.jobs} MPI-like jobs per seed (sizes {', '.join(map(str, SIZES))} ranks, most small; every rank of "
        f"a job as long as the others, lognormal mean {MEAN_DURATION:.0f} s; Poisson arrivals at offered load "
        f"{args.load:.0%}) on {lms * gms * wpp} one-task nodes ({lms} LMs x {gms} GMs x {wpp}), seeds "
        f"{', '.join(map(str, args.seeds))}. `gangs` is the fraction of multi-task jobs submitted as gangs; 0 places "
        "the same tasks independently. Wait: from a job's arrival to its last rank's start. Spread: first to last "
        "rank start. Idle: rank time between a rank's start and its last peer's start (what an MPI job's early "
        "ranks spend blocked in MPI_Init; the simulator runs them anyway), as a share of all busy rank time. "
        f"Widest: the wait of the jobs of {max(SIZES)} ranks. "
        + (
            "GMs never hold LMs for a gang."
            if args.reserve_after is None
            else f"A gang that has waited {args.reserve_after:g} s has its GM hold LMs for it (--reserve-after)."
        ),
        "",
        f"![gangs against independent placement]({args.name}.png)",
        "",
        *table(
            [
                "gangs",
                "seed",
                "wait p50",
                "wait p99",
                "widest wait mean",
                "widest wait max",
                "spread (mean)",
                "idle",
                "utilization",
                "JRT delay p99",
                "done",
            ],
            [
                (
                    r.gangs,
                    r.seed,
                    seconds(r.multi_wait_median),
                    seconds(r.multi_wait_p99),
                    seconds(r.widest_wait_mean),
                    seconds(r.widest_wait_max),
                    seconds(r.multi_skew_mean),
                    f"{r.idle_fraction:.1%}",
                    f"{r.utilization:.1%}",
                    seconds(r.jrt_p99),
                    f"{r.completed}/{r.tasks}",
                )
                for r in runs
            ],
        ),
    ]
    write_page(args, "gang", argv, "Gang scheduling: gangs against independent placement", start, body)


if __name__ == "__main__":
    exit_quietly_if_stdout_closed(main)
