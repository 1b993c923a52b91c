"""Queueable tasks (Mercury's QUEUEABLE containers, docs/queueable.md) against all-guaranteed, on contended loads:
task throughput, utilization, JRT delay, the wait of guaranteed and of queueable tasks, evictions and the work they
threw away, for a fraction of the tasks made queueable (`megha replay --queueable`), beside Mercury's published
gain (over 35% more task throughput).

A workload is `TRACE[:JOBS]@LMSxGMSxWORKERS` (a slice of a trace's first jobs on a generated data centre small
enough to be contended). Slot mode, no placement constraints (every node can run every task, so contention is the
only reason to wait), random node choice, 1 s deltas, 0.5 ms per hop.

    python -m megha.sim.experiments.queueable            # writes docs/results/queueable.csv, .md and .png
    python -m megha.sim.experiments.queueable --workloads 'syn_250[:40]@2x2x10' --fractions 0 0.5 --seeds 0 --out /tmp/q
"""

from __future__ import annotations

import csv
import math
import re
import time
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path

import numpy as np

from megha.common.core.queueable import is_marked_queueable
from megha.common.lifecycle import exit_quietly_if_stdout_closed
from megha.loadgen.replay import replay
from megha.sim.experiments import harness
from megha.sim.experiments.harness import Workload

MODULE = "queueable"
DESCRIPTION = "Queueable tasks against all-guaranteed on contended loads; writes NAME.csv, NAME.md and NAME.png."
DEFAULT_WORKLOADS = ["syn_250[:100]@5x5x10", "syn_250[:100]@5x5x20", "GOOG[:400]@5x5x8"]
DEFAULT_FRACTIONS = [0.0, 0.25, 0.5, 1.0]
MERCURY_GAIN = 0.35  # "gains of over 35% in task throughput" (Mercury, abstract and section 7.4)
SPEC = re.compile(r"^(?P<trace>[^\[@]+)(\[:(?P<jobs>\d+)\])?@(?P<centre>.+)$")


@dataclass(frozen=True, slots=True)
class QueueRun:
    """The figures of one replay (times in seconds); one CSV row."""

    workload: str
    fraction: float
    seed: int
    tasks: int
    queueable_tasks: int
    completed_once: int
    makespan: float  # from the first arrival to the last task's end
    throughput: float  # tasks completed per second of makespan
    utilization: float
    jrt_median: float
    jrt_p99: float
    wait_guaranteed_median: float  # arrival to the start of the run that completed
    wait_guaranteed_p99: float
    wait_queueable_median: float
    wait_queueable_p99: float
    evictions: int  # queueable runs stopped for guaranteed ones (each ran again)
    lost_cpu_seconds: float  # the work those runs threw away
    wall_seconds: float


def parse(spec: str) -> tuple[Workload, int | None]:
    match = SPEC.match(spec)
    if match is None:
        raise ValueError(f"workload {spec!r}: expected TRACE[:JOBS]@LMSxGMSxWORKERS, e.g. 'syn_250[:100]@5x5x10'")
    workload = Workload.parse(f"{match['trace']}@{match['centre']}")
    return Workload(spec, workload.trace, workload.centre), int(match["jobs"]) if match["jobs"] else None


def run_one(spec: str, fraction: float, seed: int) -> QueueRun:
    workload, jobs = parse(spec)
    config = workload.config(first_jobs=jobs, seed=seed, constraints=False, queueable=fraction)
    result = replay(config)
    m = result.metrics
    columns = result.recorder.tasks.columns
    arrival = np.asarray(columns["arrival"], dtype=np.float64)
    started = np.asarray(columns["started_at"], dtype=np.float64)
    finished = np.asarray(columns["finished_at"], dtype=np.float64)
    marked = np.fromiter(
        (bool(fraction) and is_marked_queueable(task_id, fraction, seed) for task_id in result.recorder.tasks.number),
        dtype=bool,
        count=len(arrival),
    )
    wait = started - arrival
    makespan = float(np.nanmax(finished) - np.nanmin(arrival))
    run = QueueRun(
        workload=spec,
        fraction=fraction,
        seed=seed,
        tasks=m.tasks,
        queueable_tasks=int(marked.sum()),
        completed_once=m.tasks - len(m.not_exactly_once) - m.tasks_failed,
        makespan=makespan,
        throughput=m.tasks_completed / makespan if makespan > 0 else math.nan,
        utilization=next(iter(m.utilization.mean.values())),
        jrt_median=m.jrt_delay.median,
        jrt_p99=m.jrt_delay.p99,
        wait_guaranteed_median=_quantile(wait[~marked], 0.5),
        wait_guaranteed_p99=_quantile(wait[~marked], 0.99),
        wait_queueable_median=_quantile(wait[marked], 0.5),
        wait_queueable_p99=_quantile(wait[marked], 0.99),
        evictions=sum(gm.preempted for gm in result.system.gms),  # type: ignore[attr-defined]
        lost_cpu_seconds=float(np.sum(columns["lost_cpu_seconds"])),
        wall_seconds=result.wall_seconds,
    )
    harness.progress(
        f"{spec} queueable {fraction:g} seed {seed}: throughput {run.throughput:,.2f} tasks/s, utilization "
        f"{run.utilization:.0%}, JRT delay p50 {harness.seconds(run.jrt_median)}, {run.evictions:,} evictions, "
        f"{run.completed_once:,}/{run.tasks:,} completed once, {run.wall_seconds:,.1f} s wall"
    )
    return run


def _quantile(values: np.ndarray, q: float) -> float:
    values = values[~np.isnan(values)]
    return float(np.quantile(values, q)) if len(values) else math.nan


def write_csv(path: Path, runs: Sequence[QueueRun]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([f.name for f in fields(QueueRun)])
        writer.writerows(astuple(run) for run in runs)


def _mean(runs: Sequence[QueueRun], figure: str) -> float:
    values = [getattr(r, figure) for r in runs if not math.isnan(getattr(r, figure))]
    return sum(values) / len(values) if values else math.nan


def _grouped(runs: Sequence[QueueRun]) -> dict[str, dict[float, list[QueueRun]]]:
    grouped: dict[str, dict[float, list[QueueRun]]] = {}
    for run in runs:
        grouped.setdefault(run.workload, {}).setdefault(run.fraction, []).append(run)
    return grouped


def gain(runs: Sequence[QueueRun], baseline: Sequence[QueueRun]) -> float:
    """Task throughput against all-guaranteed (the same seeds), as a share: +0.35 is Mercury's published gain."""
    return _mean(runs, "throughput") / _mean(baseline, "throughput") - 1 if baseline else math.nan


def markdown(runs: Sequence[QueueRun], seeds: Sequence[int], name: str) -> list[str]:
    rows = []
    for workload, by_fraction in _grouped(runs).items():
        baseline = by_fraction.get(0.0, [])
        for fraction, rs in by_fraction.items():
            rows.append(
                [
                    workload,
                    f"{fraction:.0%}",
                    f"{sum(r.completed_once for r in rs):,} / {sum(r.tasks for r in rs):,}",
                    f"{_mean(rs, 'throughput'):,.3f}",
                    "-" if fraction == 0 else f"{gain(rs, baseline):+.0%}",
                    f"{_mean(rs, 'utilization'):.0%}",
                    harness.seconds(_mean(rs, "jrt_median")),
                    harness.seconds(_mean(rs, "jrt_p99")),
                    harness.seconds(_mean(rs, "wait_guaranteed_median")),
                    harness.seconds(_mean(rs, "wait_guaranteed_p99")),
                    harness.seconds(_mean(rs, "wait_queueable_median")),
                    harness.seconds(_mean(rs, "wait_queueable_p99")),
                    f"{_mean(rs, 'evictions'):,.0f}",
                    f"{_mean(rs, 'lost_cpu_seconds') / 3600:,.1f}",
                ]
            )
    return [
        f"Each workload replayed with the given fraction of its tasks queueable (chosen per task with the seed), for "
        f"seeds {', '.join(map(str, seeds))}; figures are means over seeds. `TRACE[:JOBS]@LxGxW`: the trace's first "
        "JOBS jobs on a generated data centre of L LMs x G GMs x W workers per partition, small enough to be "
        "contended. Slot mode (one task holds one worker), no placement constraints, random node choice, 1 s delta "
        "interval, 0.5 ms per hop. Throughput: tasks completed per second from the first arrival to the last end; "
        "gain: against all-guaranteed (Mercury reports over +35%, section 7.4). Wait: from a task's arrival to the "
        "start of its run that completed (an evicted task's includes its lost runs). Evictions: queueable runs a "
        "guaranteed one stopped (each ran again); lost: the CPU-hours those runs threw away.",
        "",
        *harness.table(
            [
                "workload",
                "queueable",
                "completed once / tasks",
                "tasks/s",
                "gain",
                "utilization",
                "JRT delay p50",
                "JRT delay p99",
                "guaranteed wait p50",
                "guaranteed wait p99",
                "queueable wait p50",
                "queueable wait p99",
                "evictions",
                "lost CPU-hours",
            ],
            rows,
        ),
        "",
        f"![throughput gain and JRT delay]({name}.png)",
    ]


def plot(path: Path, runs: Sequence[QueueRun]) -> None:
    grouped = _grouped(runs)
    fig, axes = harness.figure(1, 2, width=11, height=4)
    gains, waits = axes[0]
    for workload, by_fraction in grouped.items():
        baseline = by_fraction.get(0.0, [])
        fractions = sorted(by_fraction)
        gains.plot(fractions, [100 * gain(by_fraction[f], baseline) for f in fractions], marker="o", label=workload)
        waits.plot(
            fractions,
            [_mean(by_fraction[f], "jrt_median") for f in fractions],
            marker="o",
            label=f"{workload}",
        )
    gains.axhline(100 * MERCURY_GAIN, color="grey", linestyle="--", label="Mercury: +35%")
    gains.axhline(0, color="black", linewidth=0.5)
    gains.set_xlabel("fraction of tasks queueable")
    gains.set_ylabel("task throughput gain vs all-guaranteed (%)")
    gains.legend(fontsize=8)
    waits.set_xlabel("fraction of tasks queueable")
    waits.set_ylabel("JRT delay p50 (s)")
    waits.set_yscale("symlog", linthresh=1.0)
    waits.legend(fontsize=8)
    harness.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(MODULE, "queueable", DESCRIPTION, seeds=(0, 1))
    parser.add_argument(
        "--workloads",
        nargs="+",
        default=DEFAULT_WORKLOADS,
        help="TRACE[:JOBS]@LMSxGMSxWORKERS (default: %(default)s)",
    )
    parser.add_argument(
        "--fractions",
        type=float,
        nargs="+",
        default=DEFAULT_FRACTIONS,
        help="(default: %(default)s); 0 is the baseline",
    )
    args = parser.parse_args(argv)
    try:
        for spec in args.workloads:
            parse(spec)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    if any(not 0 <= f <= 1 for f in args.fractions):
        parser.error(f"--fractions {args.fractions}: each a fraction between 0 and 1")
    fractions = sorted({0.0, *args.fractions})
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    runs = [run_one(spec, f, seed) for spec in args.workloads for f in fractions for seed in args.seeds]
    write_csv(args.out / f"{args.name}.csv", runs)
    plot(args.out / f"{args.name}.png", runs)
    body = markdown(runs, args.seeds, args.name)
    title = "Queueable tasks against all-guaranteed: throughput, waits and evictions"
    harness.write_page(args, MODULE, argv, title, start, body)
    return 0


if __name__ == "__main__":
    exit_quietly_if_stdout_closed(main)
