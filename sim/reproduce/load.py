"""The load a workload puts on a data centre, computed from the trace and the data centre alone (no scheduler):
constraint-aware Table 1 and Figures 2 to 4, and the worker slots of the fair paper's Fig. 5.

As in the constraint-aware paper (section 2.3), each task needs a worker from its arrival for its duration (the
ideal schedule), and load is sampled per second: at the middle of every second from the first arrival to the last
end. A workload's load is the workers needed over the workers; a constraint's load is the workers needed by tasks
requiring it over the workers having it. Task constraints are drawn exactly as a replay with the same seed draws
them (`build_workload`); the workers' constraints are those of the data centre a replay would build.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from megha.common.core.constraints import NUM_CONSTRAINTS
from megha.loadgen.replay import ReplayConfig, build_cluster
from megha.loadgen.trace import TraceJob, read_trace
from megha.loadgen.workload import WorkloadConfig, build_workload
from megha.sim.experiments import harness
from megha.sim.experiments.workloads import retime
from megha.sim.reproduce.fair import CLOUDERA_TASKS, sparrow_sample
from megha.sim.reproduce.paper import claims
from megha.sim.reproduce.result import Column, Result
from megha.sim.reproduce.setup import Setup

#: The constraint-aware paper's names of the shared traces.
PAPER_NAMES = {"syn_250": "syn_250", "syn_500": "syn_500", "syn_1000": "syn_1000", "Yahoo": "Yahoo", "GOOG": "Google"}
STATS = (("average", np.mean), ("median", np.median), ("p95", lambda x: np.percentile(x, 95)))
STATS += (("p99", lambda x: np.percentile(x, 99)),)


@dataclass(frozen=True, slots=True)
class Demand:
    """When each task would run in the ideal schedule: from `starts` to `ends` (seconds)."""

    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def of(cls, jobs: Sequence[TraceJob]) -> Demand:
        starts = np.concatenate([np.full(len(j.durations), j.arrival) for j in jobs]) if jobs else np.zeros(0)
        durations = np.concatenate([np.asarray(j.durations) for j in jobs]) if jobs else np.zeros(0)
        return cls(starts, starts + durations)

    def seconds(self) -> np.ndarray:
        """The middle of every second from the first start to the last end."""
        if not self.starts.size:
            return np.zeros(0)
        return np.arange(math.floor(self.starts.min()), math.ceil(self.ends.max())) + 0.5

    def active(self, times: np.ndarray, which: np.ndarray | None = None) -> np.ndarray:
        """How many tasks (of `which`, a boolean mask; all by default) run at each of `times`."""
        starts, ends = (self.starts, self.ends) if which is None else (self.starts[which], self.ends[which])
        started = np.searchsorted(np.sort(starts), times, side="right")
        return started - np.searchsorted(np.sort(ends), times, side="right")


def constraint_masks(jobs: Sequence[TraceJob], workload: harness.Workload, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The constraint bit-vectors of `jobs`' tasks (in `Demand.of` order) as a replay with `seed` draws them, and
    those of the workers of the data centre it builds."""
    tasks = [t for _, job in build_workload(jobs, WorkloadConfig("slot", seed, 1)) for t in job.tasks]
    masks = np.fromiter((t.constraints for t in tasks), dtype=np.int64, count=len(tasks))
    cluster = build_cluster(ReplayConfig(seed=seed, **workload.centre.replay_fields()))
    nodes = np.array([m for lm in range(cluster.num_lms) for m in cluster.lm_constraint_masks(lm)], np.int64)
    return masks, nodes


def _first_jobs(setup: Setup) -> int | None:
    return setup.pick(None, None, 50)


def _jobs_note(first: int | None) -> str:
    return "all jobs" if first is None else f"the first {first:,} jobs"


# constraint-aware Table 1


def workload_load(setup: Setup) -> Result:
    """constraint-aware Table 1: the median, average and p99 of each workload's per-second load."""
    first = _first_jobs(setup)
    rows = []
    ours = {}
    for name, paper_name in (
        ("Yahoo", "Yahoo"),
        ("GOOG", "Google"),
        *((s, s) for s in ("syn_250", "syn_500", "syn_1000")),
    ):
        workload = harness.Workload.parse(name)
        harness.progress(f"constraints-table1: load of {name}")
        demand = Demand.of(read_trace(workload.trace, first))
        load = demand.active(demand.seconds()) / workload.centre.workers
        stats = {"median": float(np.median(load)), "average": float(load.mean()), "p99": float(np.percentile(load, 99))}
        peak = float(demand.active(demand.starts).max()) / workload.centre.workers if demand.starts.size else 0.0
        rows.append([paper_name, workload.centre.workers, demand.starts.size, load.size, *stats.values(), peak])
        ours.update({f"{paper_name} {stat} load": value for stat, value in stats.items()})
    paper = {c.key: c.value for c in claims("constraints-table1")}

    def draw(path: Path) -> None:
        fig, axes = harness.figure(1, 3, width=15, height=4)
        names = [row[0] for row in rows]
        for ax, stat in zip(axes[0], ("median", "average", "p99")):
            xs = np.arange(len(names))
            ax.bar(xs - 0.2, [ours[f"{n} {stat} load"] for n in names], 0.4, label="ours")
            ax.bar(xs + 0.2, [paper[f"{n} {stat} load"] for n in names], 0.4, label="paper (Table 1)")
            ax.set_xticks(xs, names)
            ax.set(yscale="log", ylabel="load (workers needed / workers)", title=f"{stat} load")
            ax.legend(fontsize=8)
        fig.suptitle("constraint-aware Table 1: load of the workloads")
        harness.save(fig, path)

    columns = [Column("workload"), Column("workers", "count"), Column("tasks", "count"), Column("seconds", "count")]
    columns += [Column(f"{stat} load", "number") for stat in ("median", "average", "p99")]
    columns.append(Column("max load (any instant)", "number"))  # no per-second sampling exceeds it
    return Result(f"{_jobs_note(first)} of each trace", columns, rows, ours, draw)


# constraint-aware Figures 2 to 4


def _per_constraint(setup: Setup, names: Sequence[str], title: str) -> Result:
    """Per constraint id, the per-second load's average, median, p95 and p99, averaged over seeds."""
    first = _first_jobs(setup)
    rows = []
    by_workload: dict[str, np.ndarray] = {}  # workload -> constraint x statistic
    for name in names:
        workload = harness.Workload.parse(name)
        jobs = read_trace(workload.trace, first)
        demand = Demand.of(jobs)
        times = demand.seconds()
        per_seed = []
        for seed in setup.seeds:
            harness.progress(f"per-constraint load of {name}, seed {seed}")
            masks, nodes = constraint_masks(jobs, workload, seed)
            stats = np.full((NUM_CONSTRAINTS, len(STATS) + 2), np.nan)
            for k in range(NUM_CONSTRAINTS):
                needing = (masks >> k) & 1 == 1
                having = int(np.count_nonzero((nodes >> k) & 1))
                stats[k, :2] = (having, np.count_nonzero(needing))
                if having:
                    load = demand.active(times, needing) / having
                    stats[k, 2:] = [f(load) for _, f in STATS]
            per_seed.append(stats)
        by_workload[PAPER_NAMES[name]] = np.nanmean(per_seed, axis=0)
        rows += [[PAPER_NAMES[name], k, *by_workload[PAPER_NAMES[name]][k]] for k in range(NUM_CONSTRAINTS)]

    def draw(path: Path) -> None:
        fig, axes = harness.figure(len(by_workload), 1, width=13, height=3.6 * len(by_workload))
        for ax, (name, stats) in zip(axes[:, 0], by_workload.items()):
            xs = np.arange(NUM_CONSTRAINTS)
            for j, (stat, _) in enumerate(STATS):
                ax.bar(xs + (j - 1.5) * 0.2, stats[:, 2 + j], 0.2, label=stat)
            ax.set_xticks(xs, [str(k) for k in xs])
            ax.set(xlabel="constraint id", ylabel="load", title=name)
            ax.legend(fontsize=8, ncol=4)
        fig.suptitle(title)
        harness.save(fig, path)

    columns = [Column("workload"), Column("constraint", "count"), Column("workers having it", "number")]
    columns += [Column("tasks needing it", "number"), *(Column(f"{stat} load", "number") for stat, _ in STATS)]
    described = f"{_jobs_note(first)} of {', '.join(names)}, {setup.describe()} (figures: mean over seeds)"
    return Result(described, columns, rows, {}, draw)


def per_constraint_synthetic(setup: Setup) -> Result:
    """constraint-aware Figure 2."""
    names = ("syn_250", "syn_500", "syn_1000")
    return _per_constraint(setup, names, "constraint-aware Figure 2: per-constraint load, synthetic workloads")


def per_constraint_yahoo(setup: Setup) -> Result:
    """constraint-aware Figure 3."""
    return _per_constraint(setup, ("Yahoo",), "constraint-aware Figure 3: per-constraint load, Yahoo workload")


def per_constraint_google(setup: Setup) -> Result:
    """constraint-aware Figure 4."""
    return _per_constraint(setup, ("GOOG",), "constraint-aware Figure 4: per-constraint load, Google workload")


# fair Fig. 5


def sample_slots(setup: Setup) -> Result:
    """fair Fig. 5: the worker slots the Sparrow comparison's sample needs over time, as traced and re-timed."""
    workload, first = sparrow_sample(setup)
    jobs = read_trace(workload.trace, first)
    workers = workload.centre.workers
    scenarios = {"trace arrivals": jobs, "90% load (seed 0)": retime(jobs, workers, 0.9, 0)}
    curves = {}
    rows = []
    for name, scenario_jobs in scenarios.items():
        demand = Demand.of(scenario_jobs)
        times = demand.seconds()
        slots = demand.active(times)
        curves[name] = (times, slots)
        peak = int(slots.max()) if slots.size else 0
        busy = float(np.mean(slots > workers)) if slots.size else math.nan
        rows.append([name, len(scenario_jobs), demand.starts.size, times.size, peak, float(slots.mean()), busy])

    def draw(path: Path) -> None:
        fig, axes = harness.figure(1, len(curves), width=6 * len(curves), height=4)
        for ax, (name, (times, slots)) in zip(axes[0], curves.items()):
            ax.plot(times / 3600, slots, linewidth=0.8, label="slots required")
            ax.axhline(workers, color="grey", linestyle="--", linewidth=0.8, label=f"{workers:,} workers")
            ax.set(xlabel="hours", ylabel="worker slots", title=name)
            ax.legend(fontsize=8)
        fig.suptitle(f"fair Fig. 5: worker slots required by the sample (first {first:,} jobs of {workload.name})")
        harness.save(fig, path)

    columns = [Column("scenario"), Column("jobs", "count"), Column("tasks", "count"), Column("seconds", "count")]
    columns += [Column("peak slots", "count"), Column("mean slots", "number"), Column("time beyond capacity", "share")]
    described = (
        f"the first {first:,} jobs of {workload.name} (the stand-in for the {CLOUDERA_TASKS:,}-task Cloudera "
        f"sample) on {workers:,} workers, {setup.scale} scale"
    )
    return Result(described, columns, rows, {}, draw)


# constraint-aware Figure 5

CONFLICT_TRIES = 32
"""Random picks among a task's satisfying workers before a conflicted task looks at all of them for a free one."""


@dataclass(frozen=True, slots=True)
class Conflicts:
    """One workload's conflicts (constraint-aware Figure 5) under the paper's two assumptions: every task starts at
    its arrival and holds its worker for its duration (no delay carries into later seconds), and a task whose worker
    is taken switches to a free one satisfying its constraints. The count needs a rule the paper does not give;
    ours: each task, in arrival order, first picks a worker uniformly among those satisfying its constraints (the
    choice of a scheduler that sees every worker's constraints, not the others' choices); a pick of a worker held
    by another task is one conflict, and the task then takes a free satisfying worker, or, when none is free, is
    `blocked` (it would wait; under the second assumption it is not carried on). A task no worker satisfies is
    `unsatisfiable`, not a conflict."""

    per_second: np.ndarray  # conflicts among the tasks arriving in each second since the first arrival
    tasks: int
    blocked: int
    unsatisfiable: int

    @classmethod
    def count(cls, starts: np.ndarray, ends: np.ndarray, masks: np.ndarray, nodes: np.ndarray, seed: int) -> Conflicts:
        rng = np.random.default_rng(seed)
        first = math.floor(starts.min()) if starts.size else 0
        per_second = np.zeros(math.ceil(starts.max()) - first + 1 if starts.size else 0, np.int64)
        held_until = [0.0] * nodes.size
        satisfying: dict[int, list[int]] = {}
        draws = rng.random(starts.size).tolist()
        blocked = unsatisfiable = 0
        for i in np.argsort(starts, kind="stable").tolist():
            mask = int(masks[i])
            workers = satisfying.get(mask)
            if workers is None:
                workers = satisfying[mask] = np.flatnonzero((nodes & mask) == mask).tolist()
            if not workers:
                unsatisfiable += 1
                continue
            at = float(starts[i])
            node = workers[int(draws[i] * len(workers))]
            if held_until[node] > at:
                per_second[math.floor(at) - first] += 1
                node = -1
                for pick in rng.integers(len(workers), size=CONFLICT_TRIES).tolist():
                    if held_until[workers[pick]] <= at:
                        node = workers[pick]
                        break
                else:
                    free = [w for w in workers if held_until[w] <= at]
                    node = free[int(rng.integers(len(free)))] if free else -1
                if node < 0:
                    blocked += 1
                    continue
            held_until[node] = float(ends[i])
        return cls(per_second, int(starts.size), blocked, unsatisfiable)


def conflicts(setup: Setup) -> Result:
    """constraint-aware Figure 5: scheduling conflicts per second of the synthetic workloads (`Conflicts`)."""
    first = setup.pick(None, 200, 20)
    rows = []
    ours: dict[str, float] = {}
    curves: dict[str, np.ndarray] = {}
    for name in ("syn_250", "syn_500", "syn_1000"):
        workload = harness.Workload.parse(name)
        jobs = read_trace(workload.trace, first)
        demand = Demand.of(jobs)
        series = []
        for seed in setup.seeds:
            harness.progress(f"constraints-fig5: conflicts of {name}, seed {seed}")
            masks, nodes = constraint_masks(jobs, workload, seed)
            found = Conflicts.count(demand.starts, demand.ends, masks, nodes, seed)
            series.append(found.per_second)
            total = int(found.per_second.sum())
            per_s = found.per_second
            rows.append([name, seed, found.tasks, per_s.size, total, total / max(found.tasks, 1)])
            rows[-1] += [
                float(per_s.mean()),
                float(np.median(per_s)),
                float(np.percentile(per_s, 99)),
                int(per_s.max()),
            ]
            rows[-1] += [found.blocked, found.unsatisfiable]
        curves[name] = np.mean(series, axis=0)
        ours[f"{name} mean conflicts per second"] = float(np.mean([s.mean() for s in series]))
    for low, high in (("syn_250", "syn_500"), ("syn_500", "syn_1000")):
        key = f"{high} / {low} mean conflicts per second"
        ours[key] = ours[f"{high} mean conflicts per second"] / max(ours[f"{low} mean conflicts per second"], 1e-12)

    def draw(path: Path) -> None:
        fig, axes = harness.figure(1, 1, width=10, height=4)
        ax = axes[0, 0]
        for name, per_s in curves.items():
            ax.plot(np.arange(per_s.size), per_s, linewidth=0.7, label=name)
        ax.set(xlabel="seconds since the first arrival", ylabel="conflicts per second")
        ax.legend(fontsize=8)
        fig.suptitle("constraint-aware Figure 5: scheduling conflicts per second (mean over seeds)")
        harness.save(fig, path)

    columns = [Column("workload"), Column("seed", "count"), Column("tasks", "count"), Column("seconds", "count")]
    columns += [Column("conflicts", "count"), Column("conflicts per task", "share")]
    columns += [Column(f"{stat} per second", "number") for stat in ("mean", "median", "p99")]
    columns += [Column("max per second", "count"), Column("blocked", "count"), Column("unsatisfiable", "count")]
    described = f"{_jobs_note(first)} of each synthetic trace on the reference cluster, {setup.describe()}"
    return Result(described, columns, rows, ours, draw)
