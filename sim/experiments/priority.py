"""Priority classes against fair share: a contended synthetic workload whose jobs are drawn into three classes,
replayed with fair-share queues alone and with priority classes over them; per class, the JRT delay and allocation
time each user's jobs see, and Jain's index of the users within the class (docs/priority.md).

    python -m megha.sim.experiments.priority                    # writes docs/results/priority.{csv,md,png}
    python -m megha.sim.experiments.priority --jobs 40 --seeds 0 --out /tmp/prio
"""

from __future__ import annotations

import csv
import math
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from megha.common.core.policies.priority import DEFAULT_PRIORITY_CLASSES, parse_priority_classes
from megha.common.lifecycle import exit_quietly_if_stdout_closed
from megha.common.usage import OneLineParser
from megha.loadgen.priority import draw_classes
from megha.loadgen.replay import ReplayConfig, ReplayResult, replay
from megha.sim.experiments.shares import share_series

QUEUES = "A:25%:0,B:25%:0,C:25%:1,D:25%:1"
JOB_CLASSES = "low:34%,normal:33%,high:33%"
VARIANTS = {"fair share": False, "priority + fair share": True}
RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


@dataclass(frozen=True, slots=True)
class Row:
    """One class of one variant and seed."""

    variant: str
    seed: int
    priority_class: str
    jobs: int
    jrt_delay_mean: float
    jrt_delay_p50: float
    jrt_delay_p99: float
    allocation_mean: float
    preempted_runs: int
    jain_contended: float


def config(jobs: int, seed: int, with_classes: bool) -> ReplayConfig:
    """The contended replay: `jobs` jobs of 250 tasks on 80 nodes (2 LMs x 2 GMs x 20 workers), no constraints,
    slot mode, four equal fair-share queues over two GMs."""
    return ReplayConfig(
        trace=f"syn:250:{jobs}",
        lms=2,
        gms=2,
        workers_per_partition=20,
        constraints=False,
        seed=seed,
        queues=QUEUES,
        priority_classes=DEFAULT_PRIORITY_CLASSES if with_classes else "",
        job_classes=JOB_CLASSES if with_classes else "",
    )


class _ClassView:
    """The records of one class's tasks, as `share_series` reads a recorder."""

    def __init__(self, result: ReplayResult, job_ids: set[str]) -> None:
        tasks = result.recorder.tasks
        self.tasks = {t: r for t, r in tasks.items() if r.job_id in job_ids}
        self.preempted_runs = [run for run in result.recorder.preempted_runs if run[0] in self.tasks]


def per_class(variant: str, seed: int, result: ReplayResult) -> list[Row]:
    """The class rows of one replay; the classes are drawn as the replay with classes draws them."""
    classes = parse_priority_classes(DEFAULT_PRIORITY_CLASSES)
    jobs = list(result.recorder.jobs.values())
    drawn = draw_classes(len(jobs), classes, JOB_CLASSES, seed)
    fairness = result.config.fairness()
    assert fairness is not None
    rows = []
    for name, value in classes.values:
        mine = [job for job, p in zip(jobs, drawn, strict=True) if p == value]
        ids = {job.job_id for job in mine}
        delays = np.array([job.finished_at - job.submitted_at - job.ideal_jrt for job in mine])
        view = _ClassView(result, ids)
        allocation = np.array([r.started_at - r.arrival for r in view.tasks.values()])
        series = share_series(view, fairness, result.cluster.total_capacity())  # type: ignore[arg-type]
        rows.append(
            Row(
                variant,
                seed,
                name,
                len(mine),
                float(delays.mean()) if delays.size else math.nan,
                float(np.percentile(delays, 50)) if delays.size else math.nan,
                float(np.percentile(delays, 99)) if delays.size else math.nan,
                float(allocation.mean()) if allocation.size else math.nan,
                len(view.preempted_runs),
                series.mean_jain_contended(),
            )
        )
    return rows


def run_all(jobs: int, seeds: Sequence[int]) -> list[Row]:
    rows = []
    for seed in seeds:
        for variant, with_classes in VARIANTS.items():
            result = replay(config(jobs, seed, with_classes))
            assert not result.metrics.not_exactly_once, f"{variant}, seed {seed}: a task did not end exactly once"
            rows += per_class(variant, seed, result)
    return rows


def write_csv(path: Path, rows: Sequence[Row]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([f.name for f in fields(Row)])
        for row in rows:
            writer.writerow([getattr(row, f.name) for f in fields(Row)])


def _mean(rows: Sequence[Row], variant: str, name: str, field: str) -> float:
    values = [getattr(r, field) for r in rows if r.variant == variant and r.priority_class == name]
    values = [v for v in values if v == v]
    return sum(values) / len(values) if values else math.nan


def markdown(rows: Sequence[Row], command: str, jobs: int, seeds: Sequence[int], wall: float) -> str:
    lines = [
        "# Priority classes against fair share",
        "",
        f"Produced by `{command}` in {wall:,.0f} s on {platform.platform()} (Python {platform.python_version()}).",
        "",
        f"{jobs} jobs of 250 tasks each (`syn:250:{jobs}`), slot mode, no placement constraints, on 80 nodes (2 LMs x "
        f"2 GMs x 20 workers); fair-share queues {QUEUES} (user:share:GM, jobs round-robin over them); each job drawn "
        f"into a class with `--job-classes {JOB_CLASSES}` (classes {DEFAULT_PRIORITY_CLASSES}). The fair-share run "
        "replays the same jobs without classes, grouped by the class they would have. Means over seeds "
        f"{', '.join(map(str, seeds))}. JRT delay and allocation time in seconds; Jain's index over the users' "
        "consumption / share of that class's tasks, at the sampled times some user's task of the class waited.",
        "",
        "| variant | class | jobs | JRT delay mean | JRT delay p50 | JRT delay p99 | allocation mean | preempted runs "
        "| Jain (contended) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    classes = [name for name, _ in parse_priority_classes(DEFAULT_PRIORITY_CLASSES).values]
    for variant in VARIANTS:
        for name in classes:
            cells = [
                f"{_mean(rows, variant, name, 'jobs'):.1f}",
                *(
                    f"{_mean(rows, variant, name, f):,.1f}"
                    for f in ("jrt_delay_mean", "jrt_delay_p50", "jrt_delay_p99", "allocation_mean")
                ),
                f"{_mean(rows, variant, name, 'preempted_runs'):,.1f}",
                f"{_mean(rows, variant, name, 'jain_contended'):.3f}",
            ]
            lines.append(f"| {variant} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[Row], path: Path) -> None:
    """Per class: mean JRT delay (left) and Jain's index within the class (right), each variant a bar."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    classes = [name for name, _ in parse_priority_classes(DEFAULT_PRIORITY_CLASSES).values]
    fig = Figure(figsize=(10, 3.6))
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    x = np.arange(len(classes))
    width = 0.38
    for k, variant in enumerate(VARIANTS):
        offset = (k - 0.5) * width
        left.bar(x + offset, [_mean(rows, variant, c, "jrt_delay_mean") for c in classes], width, label=variant)
        right.bar(x + offset, [_mean(rows, variant, c, "jain_contended") for c in classes], width, label=variant)
    left.set_ylabel("mean JRT delay (s)")
    right.set_ylabel("Jain's index of users (contended)")
    right.set_ylim(0, 1.05)
    for ax in (left, right):
        ax.set_xticks(x, classes)
        ax.set_xlabel("priority class")
        ax.legend(fontsize=8)
    fig.suptitle("Priority classes over fair share: per class")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m megha.sim.experiments.priority", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=150, help="jobs of the synthetic trace (250 tasks each)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of priority.csv, .md and .png")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = run_all(args.jobs, args.seeds)
    wall = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "priority.csv", rows)
    command = "python -m megha.sim.experiments.priority"
    if args.jobs != parser.get_default("jobs"):
        command += f" --jobs {args.jobs}"
    if args.seeds != parser.get_default("seeds"):
        command += f" --seeds {' '.join(map(str, args.seeds))}"
    (args.out / "priority.md").write_text(markdown(rows, command, args.jobs, args.seeds, wall))
    plot(rows, args.out / "priority.png")
    print((args.out / "priority.md").read_text())
    return 0


if __name__ == "__main__":
    exit_quietly_if_stdout_closed(main)
