"""The Megha paper's simulation results (fair Figs. 3, 4 and 6 to 11) on our simulator.

Every scenario uses the paper's 10 s heartbeat (fair V: 'In all the scenarios, the heartbeat period is set to 10
seconds'), and Megha (and its centralized configuration) decides at the calibrated costs of docs/decision-time.md:
the paper's Megha simulator ran the prototype's code, so its processing counted (V-B), where its Sparrow simulator
counted network delays only (our Sparrow decides for free). The paper's workload samples (Cloudera, alibaba,
google_19) are not shared; each figure's stand-in is the prefix of a shared trace holding as many tasks
(`first_jobs_holding`), and the catalogue says so.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from megha.loadgen.metrics import COMPONENTS
from megha.loadgen.replay import ReplayConfig
from megha.loadgen.trace import read_trace
from megha.sim.experiments import allocation, fairness, harness
from megha.sim.experiments.allocation import CDF_PERCENTS
from megha.sim.experiments.harness import DataCentre, Workload
from megha.sim.experiments.workloads import PoissonLoad
from megha.sim.reproduce.outcome import Outcome, outcome, scratch
from megha.sim.reproduce.result import Column, Result
from megha.sim.reproduce.setup import Setup
from megha.sim.reproduce.summary import mean, ratio, summary_mean

HEARTBEAT = 10.0
COSTS = "calibrated"  # Megha's decision costs in every figure of this module
CLOUDERA_TASKS = 10_173  # fair V-A: the Cloudera sample of the Sparrow comparison
ALIBABA_TASKS = 8_000  # fair V-A: the alibaba sample
GOOGLE19_TASKS = 4_550  # fair V-A: the google_19 sample of the fairness study
UNPLACEABLE = "requeue-back"  # fair IV-B5: a task that fits nowhere goes to the back of its queue (Figs. 10-11)
MEGHA_BOUND = 1.5  # fair VI-A: Megha's allocation time 'consistently less than 1.5s'
NAMES = {"megha": "Megha", "sparrow": "Sparrow", "centralized": "centralized"}
SAMPLE_COSTS = {"megha": COSTS, "sparrow": "zero"}  # decision costs in the Sparrow comparison
STATISTICS = (("p50", "median"), ("mean", "mean"), ("p90", "p90"), ("p99", "p99"), ("p99.99", "p9999"))
Runs = dict[tuple[object, ...], list[Outcome]]


@functools.cache
def first_jobs_holding(trace: str, tasks: int) -> int:
    """The fewest first jobs of `trace` that hold at least `tasks` tasks (all its jobs if it holds fewer)."""
    jobs = read_trace(trace)
    held = np.cumsum([len(job.durations) for job in jobs])
    return min(int(np.searchsorted(held, tasks)) + 1, len(jobs))


# Megha vs Sparrow (Figs. 3 and 4) and the component delays (Fig. 7)


def sparrow_sample(setup: Setup) -> tuple[Workload, int]:
    """The stand-in for the Cloudera sample: the Yahoo trace's first jobs holding as many tasks."""
    centre = setup.pick(DataCentre(5, 5, 400), DataCentre(5, 5, 400), DataCentre(2, 2, 50))
    workload = Workload.parse("Yahoo", centre)
    return workload, first_jobs_holding(workload.trace, setup.pick(CLOUDERA_TASKS, CLOUDERA_TASKS, 300))


def _loads(setup: Setup) -> tuple[str, ...]:
    return setup.pick(("trace", "0.9"), ("trace", "0.9"), ("trace",))


def scenario(load: str) -> str:
    return "trace arrivals" if load == allocation.TRACE_ARRIVALS else f"{float(load):.0%} load"


def sample_config(trace: str, first: int, scheduler: str, centre: DataCentre, seed: int) -> ReplayConfig:
    """One replay of the Sparrow comparison's sample: no constraints, its heartbeat, the scheduler's sample costs."""
    return ReplayConfig(
        trace=trace,
        first_jobs=first,
        scheduler=scheduler,
        seed=seed,
        constraints=False,
        delta_interval=HEARTBEAT,
        decision_costs=SAMPLE_COSTS[scheduler],
        **centre.replay_fields(),
    )


def sample_runs(setup: Setup, schedulers: Sequence[str], loads: Sequence[str]) -> Runs:
    """The Sparrow comparison's replays, by (load, scheduler), one outcome per seed."""
    workload, first = sparrow_sample(setup)
    runs: Runs = {}
    for load in loads:
        for scheduler in schedulers:
            for seed in setup.seeds:
                trace = allocation.scenario_trace(workload, load, first, workload.centre.workers, seed, scratch())
                config = sample_config(trace, first, scheduler, workload.centre, seed)
                label = f"{workload.name} sample, {scenario(load)}"
                runs.setdefault((load, scheduler), []).append(outcome(config, label))
    return runs


def _sample_setup(setup: Setup, loads: Sequence[str]) -> str:
    workload, first = sparrow_sample(setup)
    return (
        f"the first {first:,} jobs of {workload.name} on {workload.centre.workers:,} workers, "
        f"{', '.join(scenario(load) for load in loads)}, {setup.describe()}"
    )


def sparrow_distribution(setup: Setup) -> Result:
    """fair Fig. 3: the CDF of allocation time under Megha and Sparrow."""
    loads = _loads(setup)
    runs = sample_runs(setup, ("megha", "sparrow"), loads)
    rows = []
    ours = {}
    for (load, scheduler), outcomes in runs.items():
        stats = [summary_mean(outcomes, field) for field in ("median", "p90", "p99", "p9999", "max")]
        rows.append([scenario(load), NAMES[scheduler], outcomes[0].metrics.tasks, *stats])
    for load in loads:
        megha, sparrow = runs[(load, "megha")], runs[(load, "sparrow")]
        ours[f"Megha max allocation time ({scenario(load)})"] = summary_mean(megha, "max")
        ours[f"Sparrow max allocation time ({scenario(load)})"] = summary_mean(sparrow, "max")
        ours[f"Sparrow / Megha median allocation time ({scenario(load)})"] = ratio(
            summary_mean(sparrow, "median"), summary_mean(megha, "median")
        )

    def draw(path: Path) -> None:
        fig, axes = harness.figure(1, len(loads), width=6 * len(loads), height=4.2)
        for ax, load in zip(axes[0], loads):
            for scheduler in ("megha", "sparrow"):
                quantiles = np.mean([o.allocation_quantiles for o in runs[(load, scheduler)]], axis=0)
                ax.plot(np.maximum(quantiles, 1e-4), CDF_PERCENTS / 100, label=NAMES[scheduler])
            ax.axvline(MEGHA_BOUND, color="grey", linestyle="--", linewidth=0.8, label="1.5 s (the paper's bound)")
            ax.set(xscale="log", xlabel="allocation time (s)", ylabel="fraction of tasks", title=scenario(load))
            ax.grid(True, linewidth=0.4)
            ax.legend(fontsize=8)
        fig.suptitle("fair Fig. 3: allocation time, Megha vs Sparrow (10,000 workers)")
        harness.save(fig, path)

    columns = [Column("scenario"), Column("scheduler"), Column("tasks", "count")]
    columns += [Column(f"alloc {name}", "seconds") for name in ("p50", "p90", "p99", "p99.99", "max")]
    return Result(_sample_setup(setup, loads), columns, rows, ours, draw)


def sparrow_statistics(setup: Setup) -> Result:
    """fair Fig. 4: median, mean, p90, p99 and p99.99 allocation time under Megha and Sparrow."""
    loads = _loads(setup)
    runs = sample_runs(setup, ("megha", "sparrow"), loads)
    rows = [
        [scenario(load), NAMES[scheduler], *(summary_mean(outcomes, field) for _, field in STATISTICS)]
        for (load, scheduler), outcomes in runs.items()
    ]
    ours = {}
    for load in loads:
        megha, sparrow = runs[(load, "megha")], runs[(load, "sparrow")]
        ours[f"Megha p99 allocation time ({scenario(load)})"] = summary_mean(megha, "p99")
        ours[f"Megha median allocation time ({scenario(load)})"] = summary_mean(megha, "median")
        ours[f"Sparrow / Megha p99 allocation time ({scenario(load)})"] = ratio(
            summary_mean(sparrow, "p99"), summary_mean(megha, "p99")
        )

    def draw(path: Path) -> None:
        fig, axes = harness.figure(1, len(loads), width=6 * len(loads), height=4.2)
        for ax, load in zip(axes[0], loads):
            for k, scheduler in enumerate(("megha", "sparrow")):
                values = [max(summary_mean(runs[(load, scheduler)], f), 1e-4) for _, f in STATISTICS]
                xs = np.arange(len(STATISTICS)) + (k - 0.5) * 0.4
                ax.bar(xs, values, 0.4, label=NAMES[scheduler])
            ax.set_xticks(range(len(STATISTICS)), [name for name, _ in STATISTICS])
            ax.set(yscale="log", ylabel="allocation time (s)", title=scenario(load))
            ax.legend(fontsize=8)
        fig.suptitle("fair Fig. 4: allocation-time statistics, Megha vs Sparrow")
        harness.save(fig, path)

    columns = [Column("scenario"), Column("scheduler")]
    columns += [Column(f"alloc {name}", "seconds") for name, _ in STATISTICS]
    return Result(_sample_setup(setup, loads), columns, rows, ours, draw)


def components(setup: Setup) -> Result:
    """fair Fig. 7: the median of each component of Megha's allocation time and its share of their sum."""
    runs = sample_runs(setup, ("megha",), ("trace",))[("trace", "megha")]
    medians = {c: mean(o.metrics.components[c].median for o in runs) for c in COMPONENTS}
    total = sum(medians.values())
    shares = {c: ratio(medians[c], total) for c in COMPONENTS}
    rows = [
        [c.replace("_", " "), medians[c], mean(o.metrics.components[c].mean for o in runs), shares[c]]
        for c in COMPONENTS
    ]
    ours = {f"{c.replace('_', ' ')} share": shares[c] for c in COMPONENTS}
    paper = {"framework_queuing": 0.07, "processing": 0.03, "communication": 0.90}

    def draw(path: Path) -> None:
        fig, axes = harness.figure(1, 1, width=7, height=4)
        ax = axes[0][0]
        xs = np.arange(len(COMPONENTS))
        ax.bar(xs - 0.2, [shares[c] for c in COMPONENTS], 0.4, label="ours")
        ax.bar(xs + 0.2, [paper.get(c, 0.0) for c in COMPONENTS], 0.4, label="paper (about: >90%, <3%, ~7%)")
        ax.set_xticks(xs, [c.replace("_", " ") for c in COMPONENTS])
        ax.set(ylabel="share of the sum of the medians", ylim=(0, 1))
        ax.legend(fontsize=8)
        fig.suptitle("fair Fig. 7: contributions of the component delays (Megha, medians)")
        harness.save(fig, path)

    columns = [Column("component"), Column("median", "seconds"), Column("mean", "seconds"), Column("share", "share")]
    return Result(f"Megha only, {_sample_setup(setup, ('trace',))}", columns, rows, ours, draw)


# Centralized vs decentralized (Fig. 6)


def _cdf_panels(path: Path, panels: dict[str, dict[str, list[Outcome]]], title: str) -> None:
    """One panel per key of `panels`, one CDF of allocation time (quantiles averaged over seeds) per line."""
    fig, axes = harness.figure(1, len(panels), width=6 * len(panels), height=4.2)
    for ax, (name, lines) in zip(axes[0], panels.items()):
        for label, outcomes in lines.items():
            quantiles = np.mean([o.allocation_quantiles for o in outcomes], axis=0)
            ax.plot(np.maximum(quantiles, 1e-4), CDF_PERCENTS / 100, label=label)
        ax.set(xscale="log", xlabel="allocation time (s)", ylabel="fraction of tasks", title=name)
        ax.grid(True, linewidth=0.4)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    harness.save(fig, path)


def centralized(setup: Setup) -> Result:
    """fair Fig. 6: Megha against its centralized configuration at 10,000 and 20,000 workers."""
    centres = setup.pick(
        (DataCentre(5, 5, 400), DataCentre(5, 5, 800)),
        (DataCentre(5, 5, 400), DataCentre(5, 5, 800)),
        (DataCentre(5, 5, 20), DataCentre(5, 5, 40)),
    )
    trace = Workload.parse("GOOG", centres[0]).trace
    first = first_jobs_holding(trace, setup.pick(ALIBABA_TASKS, ALIBABA_TASKS, 300))
    runs: Runs = {}
    for centre in centres:
        for scheduler in ("megha", "centralized"):
            for seed in setup.seeds:
                config = ReplayConfig(
                    trace=trace,
                    first_jobs=first,
                    scheduler=scheduler,
                    seed=seed,
                    delta_interval=HEARTBEAT,
                    decision_costs=COSTS,
                    **centre.replay_fields(),
                )
                runs.setdefault((centre.workers, scheduler), []).append(outcome(config, f"GOOG[:{first}]"))
    rows = [
        [workers, NAMES[scheduler], outcomes[0].metrics.tasks]
        + [summary_mean(outcomes, field) for field in ("median", "mean", "p90", "p99", "max")]
        for (workers, scheduler), outcomes in runs.items()
    ]
    ours = {}
    for centre in centres:
        megha, central = runs[(centre.workers, "megha")], runs[(centre.workers, "centralized")]
        for name, field in (("p50", "median"), ("mean", "mean"), ("p99", "p99")):
            key = f"centralized / Megha allocation time ({name}, {centre.workers:,} workers)"
            ours[key] = ratio(summary_mean(central, field), summary_mean(megha, field))

    def draw(path: Path) -> None:
        panels = {
            f"{centre.workers:,} workers": {NAMES[s]: runs[(centre.workers, s)] for s in ("megha", "centralized")}
            for centre in centres
        }
        _cdf_panels(path, panels, "fair Fig. 6: allocation time, centralized vs decentralized (Megha)")

    columns = [Column("workers", "count"), Column("scheduler"), Column("tasks", "count")]
    columns += [Column(f"alloc {name}", "seconds") for name in ("p50", "mean", "p90", "p99", "max")]
    described = (
        f"the first {first:,} jobs of GOOG on {' and '.join(f'{c.workers:,}' for c in centres)} workers, "
        f"calibrated decision costs, {setup.describe()}"
    )
    return Result(described, columns, rows, ours, draw)


# Data-centre size and the numbers of GMs and LMs (Figs. 8 and 9)


def poisson_replay(
    folder: Path,
    load: PoissonLoad,
    workers: int,
    lms: int,
    gms: int,
    seed: int,
    heartbeat: float = HEARTBEAT,
    **fields: bool,
) -> ReplayConfig:
    """The replay of `load` on `workers` generated workers under `lms` LMs x `gms` GMs at Megha's decision costs
    (`fields`: more ReplayConfig fields); its trace is written to `folder` once per load, size and seed."""
    path = folder / f"poisson-{load.load}-{load.tasks_per_job}-{load.seconds}-{load.duration}-{workers}-{seed}.tr"
    if not path.exists():
        load.write(path, workers, seed)
    return ReplayConfig(
        trace=str(path),
        lms=lms,
        gms=gms,
        workers_per_partition=workers // (lms * gms),
        seed=seed,
        delta_interval=heartbeat,
        decision_costs=COSTS,
        **fields,  # type: ignore[arg-type]
    )


def _poisson_run(load: PoissonLoad, workers: int, lms: int, gms: int, seed: int) -> Outcome:
    """One replay of `load` on `workers` generated workers under `lms` LMs x `gms` GMs."""
    config = poisson_replay(scratch(), load, workers, lms, gms, seed)
    return outcome(config, f"Poisson {workers:,} workers, {lms} LMs x {gms} GMs")


_MASTER_COLUMNS = [
    Column("tasks", "count"),
    Column("alloc p50", "seconds"),
    Column("alloc mean", "seconds"),
    Column("alloc p99", "seconds"),
    Column("framework queuing p50", "seconds"),
    Column("framework queuing p99", "seconds"),
    Column("processing p50", "seconds"),
    Column("inconsistencies", "count"),
    Column("CPU µs per task", "number"),
]


def _master_cells(outcomes: Sequence[Outcome]) -> list[object]:
    queuing = [o.metrics.components["framework_queuing"] for o in outcomes]
    return [
        outcomes[0].metrics.tasks,
        summary_mean(outcomes, "median"),
        summary_mean(outcomes, "mean"),
        summary_mean(outcomes, "p99"),
        mean(q.median for q in queuing),
        mean(q.p99 for q in queuing),
        mean(o.metrics.components["processing"].median for o in outcomes),
        mean(o.metrics.inconsistencies for o in outcomes),
        mean(o.run.cpu_us_per_task for o in outcomes),
    ]


_TREND = (("p50", "median"), ("mean", "mean"), ("p99", "p99"))


def cluster_size(setup: Setup) -> Result:
    """fair Fig. 8: allocation time against data-centre size under 10 GMs x 10 LMs."""
    sizes = setup.pick((1000, 2000, 5000, 10000, 20000, 30000, 50000), (1000, 2000, 5000, 10000), (200, 400))
    load = PoissonLoad(0.8, 100, setup.pick(10.0, 5.0, 1.0), 1.0)
    runs = {w: [_poisson_run(load, w, 10, 10, seed) for seed in setup.seeds] for w in sizes}
    rows = [[workers, *_master_cells(outcomes)] for workers, outcomes in runs.items()]
    smallest, largest = runs[sizes[0]], runs[sizes[-1]]
    ours = {
        f"allocation time, largest / smallest data centre ({name})": ratio(
            summary_mean(largest, field), summary_mean(smallest, field)
        )
        for name, field in _TREND
    }

    def draw(path: Path) -> None:
        fig, axes = harness.figure(1, 1, width=7, height=4.2)
        ax = axes[0][0]
        for name, field in _TREND:
            ax.plot(sizes, [summary_mean(runs[w], field) for w in sizes], marker="o", label=name)
        ax.set(xscale="log", yscale="log", xlabel="workers", ylabel="allocation time (s)")
        ax.grid(True, linewidth=0.4)
        ax.legend(fontsize=8)
        fig.suptitle("fair Fig. 8: allocation time against data-centre size, 10 GMs x 10 LMs")
        harness.save(fig, path)

    described = (
        f"{', '.join(f'{w:,}' for w in sizes)} workers, Poisson arrivals of {load.tasks_per_job}-task jobs of "
        f"{load.duration:g} s tasks at {load.load:.0%} load for {load.seconds:g} s, {setup.describe()}"
    )
    return Result(described, [Column("workers", "count"), *_MASTER_COLUMNS], rows, ours, draw)


def masters(setup: Setup) -> Result:
    """fair Fig. 9: allocation time against the number of GMs (LMs fixed) and of LMs (GMs fixed)."""
    workers = setup.pick(30000, 10000, 400)
    rate = setup.pick(2000, 2000, 100)  # jobs a second
    load = PoissonLoad(0.6, 100, setup.pick(2.0, 0.3, 0.5), 0.6 * workers / (rate * 100))
    gm_counts = setup.pick((1, 2, 5, 10, 20), (1, 2, 5, 10, 20), (1, 2, 4))
    lm_counts = setup.pick((1, 2, 5, 10, 20), (1, 2, 5, 10), (1, 2))
    fixed = setup.pick(10, 10, 2)
    shapes = dict.fromkeys([*((fixed, c) for c in gm_counts), *((c, fixed) for c in lm_counts)])
    runs = {
        (lms, gms): [_poisson_run(load, workers, lms, gms, seed) for seed in setup.seeds]
        for lms, gms in shapes
        if workers % (lms * gms) == 0
    }
    rows = [[lms, gms, *_master_cells(outcomes)] for (lms, gms), outcomes in runs.items()]
    ours = {}
    fewer_gms = max(c for c in gm_counts if c <= fixed)
    more_gms = [c for c in gm_counts if c > fixed]
    for name, field in _TREND:
        at = {shape: summary_mean(outcomes, field) for shape, outcomes in runs.items()}
        ours[f"allocation time, 1 GM / most GMs up to the LMs ({name})"] = ratio(at[(fixed, 1)], at[(fixed, fewer_gms)])
        ours[f"allocation time, 1 LM / most LMs ({name})"] = ratio(at[(1, fixed)], at[(max(lm_counts), fixed)])
        if more_gms:
            key = f"allocation time, more GMs than LMs / as many GMs as LMs ({name}, {max(more_gms)} GMs)"
            ours[key] = ratio(at[(fixed, max(more_gms))], at[(fixed, fixed)])

    def draw(path: Path) -> None:
        fig, axes = harness.figure(1, 2, width=12, height=4.2)
        for ax, (varied, title) in zip(axes[0], ((1, f"GMs varied, {fixed} LMs"), (0, f"LMs varied, {fixed} GMs"))):
            series = sorted((shape, o) for shape, o in runs.items() if shape[1 - varied] == fixed)
            xs = [shape[varied] for shape, _ in series]
            for name, field in _TREND:
                ax.plot(xs, [summary_mean(o, field) for _, o in series], marker="o", label=name)
            ax.set(xscale="log", yscale="log", xlabel="count", ylabel="allocation time (s)", title=title)
            ax.grid(True, linewidth=0.4)
            ax.legend(fontsize=8)
        fig.suptitle(f"fair Fig. 9: allocation time against the numbers of GMs and LMs, {workers:,} workers")
        harness.save(fig, path)

    described = (
        f"{workers:,} workers, Poisson arrivals of {rate:,} jobs/s of {load.tasks_per_job} tasks of "
        f"{load.duration:.3g} s ({load.load:.0%} load) for {load.seconds:g} s, {', '.join(map(str, gm_counts))} GMs "
        f"under {fixed} LMs and {', '.join(map(str, lm_counts))} LMs under {fixed} GMs, {setup.describe()}"
    )
    columns = [Column("LMs", "count"), Column("GMs", "count"), *_MASTER_COLUMNS]
    return Result(described, columns, rows, ours, draw)


# Fairness (Figs. 10 and 11)


def fairness_replay(trace: str, first: int, wpp: int, seed: int, unplaceable: str) -> ReplayConfig:
    """The replay of the fairness study (fair Figs. 10-11): the first `first` jobs of `trace` on the study's LMs and
    GMs of `wpp` workers per partition, its queues, no constraints, the paper's heartbeat and decision costs."""
    return ReplayConfig(
        trace=trace,
        first_jobs=first,
        lms=fairness.LMS,
        gms=fairness.GMS,
        workers_per_partition=wpp,
        seed=seed,
        constraints=False,
        queues=fairness.QUEUES,
        delta_interval=HEARTBEAT,
        decision_costs=COSTS,
        unplaceable=unplaceable,
    )


def fairness_runs(setup: Setup) -> tuple[dict[int, list[Outcome]], str]:
    """The fairness study's replays by data-centre size (workers), and what they are in words."""
    trace = Workload.parse("GOOG", DataCentre()).trace
    first = first_jobs_holding(trace, setup.pick(GOOGLE19_TASKS, GOOGLE19_TASKS, 300))
    runs: dict[int, list[Outcome]] = {}
    for size in setup.pick((200, 500, 1500), (200, 500, 1500), (200, 500)):
        wpp = fairness.workers_per_partition(size)
        for seed in setup.seeds:
            config = fairness_replay(trace, first, wpp, seed, UNPLACEABLE)
            workers = fairness.LMS * fairness.GMS * wpp
            runs.setdefault(workers, []).append(outcome(config, f"GOOG[:{first}] fair, {workers} workers"))
    described = (
        f"the first {first:,} jobs of GOOG, queues {fairness.QUEUES} (user:share:GM), {fairness.LMS} LMs x "
        f"{fairness.GMS} GMs of {', '.join(f'{w:,}' for w in runs)} workers, a task that fits nowhere re-inserted at "
        f"the back of its queue, {setup.describe()}"
    )
    return runs, described


def fairness_allocation(setup: Setup) -> Result:
    """fair Fig. 10: allocation time with fair scheduling at each data-centre size."""
    runs, described = fairness_runs(setup)
    rows = [
        [workers, outcomes[0].metrics.tasks]
        + [summary_mean(outcomes, field) for field in ("median", "mean", "p90", "p99", "max")]
        for workers, outcomes in runs.items()
    ]
    smallest, largest = runs[min(runs)], runs[max(runs)]
    ours = {
        f"allocation time, smallest / largest data centre ({name})": ratio(
            summary_mean(smallest, field), summary_mean(largest, field)
        )
        for name, field in _TREND
    }

    def draw(path: Path) -> None:
        lines = {f"{workers:,} workers": outcomes for workers, outcomes in runs.items()}
        _cdf_panels(path, {"fair scheduling": lines}, "fair Fig. 10: allocation time with fairness")

    columns = [Column("workers", "count"), Column("tasks", "count")]
    columns += [Column(f"alloc {name}", "seconds") for name in ("p50", "mean", "p90", "p99", "max")]
    return Result(described, columns, rows, ours, draw)


_COUNTS = (("preemptions", "preemptions"), ("preemption attempts", "preemption_attempts"))
_COUNTS += (("repartitions", "repartitions"),)


def fairness_counts(setup: Setup) -> Result:
    """fair Fig. 11: preemptions, preemption attempts and repartitions at each data-centre size."""
    runs, described = fairness_runs(setup)
    counts = {
        w: {name: mean(getattr(o.metrics, f) for o in outcomes) for name, f in _COUNTS} for w, outcomes in runs.items()
    }
    rows = [[workers, *by_name.values()] for workers, by_name in counts.items()]
    smallest, largest = counts[min(counts)], counts[max(counts)]
    ours = {f"{name}, smallest / largest data centre": ratio(smallest[name], largest[name]) for name, _ in _COUNTS}

    def draw(path: Path) -> None:
        fig, axes = harness.figure(1, 1, width=7, height=4.2)
        ax = axes[0][0]
        sizes = list(counts)
        for k, (name, _) in enumerate(_COUNTS):
            xs = np.arange(len(sizes)) + (k - 1) * 0.27
            ax.bar(xs, [counts[w][name] for w in sizes], 0.27, label=name)
        ax.set_xticks(range(len(sizes)), [f"{w:,} workers" for w in sizes])
        ax.set(ylabel="count (mean over seeds)")
        ax.legend(fontsize=8)
        fig.suptitle("fair Fig. 11: preemptions, preemption attempts and repartitions")
        harness.save(fig, path)

    columns = [Column("workers", "count"), *(Column(name, "number") for name, _ in _COUNTS)]
    return Result(described, columns, rows, ours, draw)
