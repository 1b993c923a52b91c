"""Megha against Sparrow and a centralized scheduler (Megha paper, section VI-A): the distribution of allocation
time (median, p90, p99, p99.99, max and its CDF) at 10,000 and 20,000 workers.

The jobs are a prefix of the Google sub-trace, by default its first 3,000 (174,459 tasks, most of them long: the
median task runs 5 minutes, the 99th percentile 5 hours), in three scenarios:

* re-timed to 50% and 90% load (`--loads 0.5 0.9`): the same jobs, in order, arriving as a Poisson process whose
  rate offers that share of the data centre's workers on average. Most of the time there are free workers, as in
  the paper's comparison (where Megha's allocation time stays under 1.5 s): whether a task starts at once then
  depends on the scheduler finding them, which is what the tail measures. The trace's job sizes are heavy-tailed
  (one job of the prefix holds a third of its work, three have more than 4,000 tasks), so even re-timed there
  are bursts beyond 10,000 workers (for about 3,000 s at 50% load, 5,800 s at 90%);
* the trace's own arrivals (`--loads trace`): those jobs arrive in a burst. Had every task started on arrival,
  22,727 workers would have been busy at the peak (66,213 s into the trace), and more than 10,000 for most of the
  hour after it. So this loads 10,000 workers far beyond capacity (tasks wait for workers under any scheduler,
  and the allocation time measures the order in which schedulers serve a backlog) and 20,000 just beyond it.

One task holds one worker (slot mode), tasks carry Sharma et al. constraints, 0.5 ms per hop. Megha runs 5 GMs x 5
LMs; the centralized scheduler is one GM and one LM over the same workers; Sparrow has 10 schedulers probing d = 2
workers per task.

    python -m megha.sim.experiments.allocation         # the full experiment: writes docs/results/allocation-time*
    python -m megha.sim.experiments.allocation --first-jobs 500 --centres 5x5x400 --loads 0.9 --out /tmp/alloc
    # closer to the Megha paper's Sparrow comparison: no placement constraints, 10 s heartbeats
    python -m megha.sim.experiments.allocation --no-constraints --delta-interval 10 --loads 0.5 0.9 \
        --name allocation-time-no-constraints
"""

from __future__ import annotations

import csv
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from megha.common.argtypes import positive_float, positive_int
from megha.common.lifecycle import exit_quietly_if_stdout_closed
from megha.loadgen.replay import ReplayConfig
from megha.loadgen.trace import read_trace
from megha.sim.experiments import harness
from megha.sim.experiments.harness import DataCentre, Run, Workload, group, spread
from megha.sim.experiments.workloads import retime, write_trace

MODULE = "allocation"
DESCRIPTION = (
    "Megha vs Sparrow vs centralized: allocation-time distribution at 10,000 and 20,000 workers; writes NAME.csv, "
    "NAME-cdf.csv, NAME.md, NAME.png and NAME-tail.png."
)
SCHEDULERS = ["megha", "sparrow", "centralized"]
DEFAULT_CENTRES = ["5x5x400", "5x5x800"]
DEFAULT_FIRST_JOBS = 3000
DEFAULT_LOADS = ["0.5", "0.9", "trace"]
TRACE_ARRIVALS = "trace"
#: Quantiles (in percent) written to the CDF file: a fine grid, denser in the tail.
CDF_PERCENTS = np.unique(np.concatenate([np.linspace(0, 99, 199), np.linspace(99, 100, 201)]))
Key = tuple[str, int, str]  # (scenario, workers, scheduler)
#: The Megha paper's bound on Megha's allocation time at 10,000 workers (seconds).
FAST = 1.5


def scenario_name(workload: Workload, load: str) -> str:
    return (
        f"{workload.name}, trace arrivals" if load == TRACE_ARRIVALS else f"{workload.name} at {float(load):.0%} load"
    )


def scenario_trace(workload: Workload, load: str, first_jobs: int, workers: int, seed: int, tmp: Path) -> str:
    """The trace file of one scenario: the trace itself, or its first jobs re-timed for `workers`."""
    if load == TRACE_ARRIVALS:
        return workload.trace
    path = tmp / f"retimed-{load}-{workers}-{seed}.tr"
    write_trace(path, retime(read_trace(workload.trace, first_jobs), workers, float(load), seed))
    return str(path)


def run_all(
    workload: Workload,
    loads: Sequence[str],
    centres: Sequence[DataCentre],
    schedulers: Sequence[str],
    seeds: Sequence[int],
    first_jobs: int,
    constraints: bool = True,
    delta_interval: float = 1.0,
) -> tuple[list[Run], dict[Key, np.ndarray], dict[Key, float]]:
    """Every run, and per (scenario, workers, scheduler), pooled over seeds: the allocation-time quantiles of
    CDF_PERCENTS and the share of tasks allocated within FAST seconds."""
    runs = []
    quantiles = {}
    within = {}
    with tempfile.TemporaryDirectory() as tmp:
        for load in loads:
            name = scenario_name(workload, load)
            for centre in centres:
                for scheduler in schedulers:
                    samples = []
                    for seed in seeds:
                        config = ReplayConfig(
                            trace=scenario_trace(workload, load, first_jobs, centre.workers, seed, Path(tmp)),
                            first_jobs=first_jobs,
                            scheduler=scheduler,
                            seed=seed,
                            constraints=constraints,
                            delta_interval=delta_interval,
                            **centre.replay_fields(),
                        )
                        run, result = harness.run_replay(config, name)
                        runs.append(run)
                        samples.append(harness.allocation_times(result))
                        del result
                    pooled = np.concatenate(samples)
                    key = (name, centre.workers, scheduler)
                    quantiles[key] = (
                        np.percentile(pooled, CDF_PERCENTS) if pooled.size else np.full(CDF_PERCENTS.size, np.nan)
                    )
                    within[key] = float(np.mean(pooled <= FAST)) if pooled.size else np.nan
    return runs, quantiles, within


def write_cdf(path: Path, quantiles: dict[Key, np.ndarray]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["percent", *(f"{scheduler} @ {workers} ({name})" for name, workers, scheduler in quantiles)])
        for k, percent in enumerate(CDF_PERCENTS):
            writer.writerow([f"{percent:.3f}", *(f"{q[k]:.6f}" for q in quantiles.values())])


def plot(quantiles: dict[Key, np.ndarray], path: Path, tail: bool) -> None:
    """One panel per scenario (rows) and data-centre size (columns): the CDF of allocation time on a log time
    axis, or with `tail` the fraction of tasks slower than each time (1 - CDF, log-log)."""
    names = list(dict.fromkeys(name for name, _, _ in quantiles))
    sizes = sorted({workers for _, workers, _ in quantiles})
    fig, axes = harness.figure(len(names), len(sizes), width=6 * len(sizes), height=4 * len(names))
    fraction = CDF_PERCENTS / 100
    for (name, workers, scheduler), q in quantiles.items():
        ax = axes[names.index(name)][sizes.index(workers)]
        ax.plot(q, np.clip(1 - fraction, 1e-5, None) if tail else fraction, label=scheduler)
        ax.set_title(f"{name}, {workers:,} workers", fontsize=10)
    for ax in axes.flat:
        ax.set_xscale("log")
        ax.set_xlabel("allocation time (s)")
        ax.set_ylabel("fraction of tasks slower" if tail else "fraction of tasks (CDF)")
        if tail:
            ax.set_yscale("log")
        ax.grid(True, which="major", linewidth=0.4)
        ax.legend(fontsize=8)
    harness.save(fig, path)


def markdown(
    runs: Sequence[Run],
    within: dict[Key, float],
    workload: Workload,
    first_jobs: int,
    seeds: Sequence[int],
    stem: str,
    constraints: bool = True,
    delta_interval: float = 1.0,
) -> list[str]:
    rows = []
    for key, rs in group(runs, "workload", "workers", "scheduler").items():
        scenario, workers, scheduler = key
        rows.append(
            [
                scenario,
                f"{workers:,}",
                scheduler,
                f"{within[key]:.2%}",
                *(spread(rs, f).seconds() for f in ("alloc_median", "alloc_p90", "alloc_p99", "alloc_p9999")),
                spread(rs, "alloc_max").seconds(),
                spread(rs, "jrt_p99").seconds(),
                spread(rs, "utilization").percent(),
                harness.accounted(rs),
                f"{sum(r.wall_seconds for r in rs) / len(rs):,.1f}",
            ]
        )
    return [
        f"The first {first_jobs:,} jobs of `{workload.name}`, re-timed to a load or with the trace's own arrivals (see "
        "the module docstring, `sim/experiments/allocation.py`, for why), in slot mode (one task holds one worker) "
        f"{'with Sharma et al. constraints' if constraints else 'without placement constraints'} and 0.5 ms per hop, "
        f"seeds {', '.join(map(str, seeds))} (figures: mean over seeds, range in brackets when they differ; the CDF "
        f"pools the seeds). Megha: 5 GMs x 5 LMs, {delta_interval:g} s delta interval. Centralized: one GM and one LM "
        "over the same workers. Sparrow: 10 schedulers, 2 probes per task, "
        "late binding, FIFO worker queues. Allocation time = task start - arrival at the scheduler; 'within "
        f"{FAST:g} s' is the share of tasks allocated within {FAST:g} s (the Megha paper's bound for Megha).",
        "",
        *harness.table(
            [
                "scenario",
                "workers",
                "scheduler",
                f"within {FAST:g} s",
                "alloc p50",
                "alloc p90",
                "alloc p99",
                "alloc p99.99",
                "alloc max",
                "JRT delay p99",
                "utilization",
                "completed once / accepted tasks",
                "wall s per run",
            ],
            rows,
        ),
        "",
        f"![allocation-time CDF]({stem}.png)",
        "",
        f"![allocation-time tail]({stem}-tail.png)",
        "",
        f"`{stem}-cdf.csv` holds the plotted quantiles.",
    ]


def load_value(text: str) -> str:
    if text != TRACE_ARRIVALS:
        try:
            if not 0 < float(text) <= 2:
                raise ValueError
        except ValueError:
            raise ValueError(f"load {text!r}: expected '{TRACE_ARRIVALS}' or a share in (0, 2]") from None
    return text


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(MODULE, "allocation-time", DESCRIPTION, seeds=(0,))
    parser.add_argument("--workload", default="GOOG", help="trace (default: %(default)s, the Google sub-trace)")
    parser.add_argument("--first-jobs", type=positive_int, default=DEFAULT_FIRST_JOBS, help="default: %(default)s")
    parser.add_argument(
        "--loads",
        nargs="+",
        default=DEFAULT_LOADS,
        help="scenarios: a share of the workers to re-time the jobs to, or 'trace' (default: %(default)s)",
    )
    parser.add_argument("--centres", nargs="+", default=DEFAULT_CENTRES, help="LMSxGMSxWORKERS (default: %(default)s)")
    parser.add_argument("--schedulers", nargs="+", choices=SCHEDULERS, default=SCHEDULERS)
    parser.add_argument(
        "--no-constraints",
        dest="constraints",
        action="store_false",
        help="tasks carry no placement constraints (as in the Megha paper's Sparrow comparison)",
    )
    parser.add_argument(
        "--delta-interval",
        type=positive_float,
        default=1.0,
        help="seconds between an LM's delta heartbeats (default: %(default)s; the Megha paper used 10)",
    )
    args = parser.parse_args(argv)
    try:
        workload = Workload.parse(args.workload, DataCentre())
        centres = [DataCentre.parse(c) for c in args.centres]
        loads = [load_value(text) for text in args.loads]
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    runs, quantiles, within = run_all(
        workload, loads, centres, args.schedulers, args.seeds, args.first_jobs, args.constraints, args.delta_interval
    )
    harness.write_runs(args.out / f"{args.name}.csv", runs)
    write_cdf(args.out / f"{args.name}-cdf.csv", quantiles)
    plot(quantiles, args.out / f"{args.name}.png", tail=False)
    plot(quantiles, args.out / f"{args.name}-tail.png", tail=True)
    body = markdown(
        runs, within, workload, args.first_jobs, args.seeds, args.name, args.constraints, args.delta_interval
    )
    title = "Allocation time: Megha vs Sparrow vs centralized"
    harness.write_page(args, MODULE, argv, title, start, body, ".csv, -cdf.csv and the two plots")
    return 0


if __name__ == "__main__":
    exit_quietly_if_stdout_closed(main)
