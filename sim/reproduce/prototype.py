"""The Megha paper's prototype experiment (fair Fig. 12, section VI-F) on this host: the real services beside the
simulator, on the same data centre and the same task set.

The prototype run is `megha local`'s: GM, LM and worker-agent processes talking REST and RabbitMQ, each task
burning its CPU and touching its memory in an OS process of its own, the load generator submitting the trace at
its (scaled) arrival times and measuring allocation time from the GMs' arrivals and the task events. The simulator
run is `megha replay`'s core on the virtual clock, deciding at the calibrated costs as in the paper's other
figures.

The paper ran 3 GMs and 3 LMs of 40 nodes (2 vCPUs, 4 GB each) on 128 Linode VMs. Here every process shares this
machine's cores: 3 GMs x 3 LMs with one node a GM partition, so 9 nodes, each a worker agent of its own holding a
ninth of two cores (222 millicores) and 454 MB (the paper's 4 GB per 2 vCPUs). Requests are scaled down by
division, as the prototype's were, but by 200 for CPU and for memory, not by 400 and 50: the data centre then
holds about 100 tasks, each a process, which is what two cores run beside the services, and CPU, whose
interference the paper measures, binds before memory. Both workloads are prefixes of the Google sub-trace (the
shipped demo trace is its first 100 jobs) with its own arrivals, scaled in time; the heavier holds the lighter and
nine jobs more.

Execution delay is the paper's: a task's wall time on its worker, from the agent starting the task's process to
that process's end, minus the duration the task asked for (`ExecutionResult.execution_delay`, carried by the
task's `finished` event). It includes starting the task's Python process. The simulator runs every task for
exactly its duration.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import numpy as np

from megha.common.settings import LoadgenSettings
from megha.common.transport.rabbit import BrokerUnavailable, safe_url
from megha.deploy.local import LocalDeployment
from megha.loadgen.metrics import RunMetrics, allocation_columns
from megha.loadgen.progress import Progress
from megha.loadgen.replay import ReplayConfig
from megha.loadgen.services import ServicesRun, replay_services
from megha.loadgen.trace import demo_trace_path, resolve_trace
from megha.loadgen.workload import WorkloadConfig, build_workload
from megha.sim.experiments import harness
from megha.sim.experiments.allocation import CDF_PERCENTS
from megha.sim.experiments.harness import DataCentre
from megha.sim.reproduce.fair import COSTS, HEARTBEAT
from megha.sim.reproduce.outcome import Outcome, outcome
from megha.sim.reproduce.result import Column, Result
from megha.sim.reproduce.setup import Setup
from megha.sim.reproduce.summary import mean, ratio

HOST_CORES = 2  # the cores the data centre's nodes stand for: this project's machine
CPU_SCALE = 200  # scaled mode: drawn CPU requests divided by this (the paper's prototype: 400)
MEM_SCALE = 200  # and memory (the paper's prototype: 50)
MB_PER_CORE = 2048  # the paper's nodes: 4 GB for 2 vCPUs
BROKER_WAIT = 5.0  # seconds RabbitMQ has to answer before the id gives up
SYSTEMS = ("prototype", "simulator")


@dataclass(frozen=True, slots=True)
class Sample:
    """One workload: the first `first_jobs` jobs of the Google sub-trace, in the `role` the paper's `paper` had."""

    role: str  # "heavier" or "lighter"
    paper: str  # the paper's workload in that role
    first_jobs: int

    @property
    def name(self) -> str:
        return f"GOOG[:{self.first_jobs}]"

    @property
    def label(self) -> str:
        return f"{self.role}, {self.name}"


@dataclass(frozen=True, slots=True)
class Experiment:
    """The data centre both systems run on, the time scale and the workloads."""

    centre: DataCentre
    time_scale: float
    samples: tuple[Sample, ...]

    @property
    def node_cpu(self) -> int:
        """Millicores of each node: the host's cores split evenly over the nodes."""
        return 1000 * HOST_CORES // self.centre.workers

    @property
    def node_memory(self) -> int:
        return self.node_cpu * MB_PER_CORE // 1000

    def describe(self) -> str:
        c = self.centre
        jobs = " and ".join(f"first {s.first_jobs} job{'s' * (s.first_jobs > 1)} ({s.role})" for s in self.samples)
        return (
            f"a {c.lms}x{c.gms}x{c.workers_per_partition} data centre (LMs x GMs x nodes a partition: {c.workers} "
            f"nodes of {self.node_cpu} millicores and {self.node_memory} MB), the Google sub-trace's {jobs} scaled "
            f"{1 / self.time_scale:,.0f}x down in time, requests divided by {CPU_SCALE} (CPU) and {MEM_SCALE} (memory)"
        )


def experiment(setup: Setup) -> Experiment:
    samples = (Sample("heavier", "google_19", 20), Sample("lighter", "alibaba", 11))
    tiny = (Sample("heavier", "google_19", 2), Sample("lighter", "alibaba", 1))
    return setup.pick(
        Experiment(DataCentre(3, 3, 1), 0.0005, samples),
        Experiment(DataCentre(3, 3, 1), 0.00025, samples),
        Experiment(DataCentre(1, 1, 2), 0.00005, tiny),
    )


def broker_url() -> str:
    """The broker the deployment uses: MEGHA_AMQP_URL (or MEGHA_AMQP_URL_FILE), else RabbitMQ's guest account on
    this machine, as for `megha local`."""
    return LoadgenSettings(auth="off").amqp_url


class PrototypeFailed(RuntimeError):
    """The real services did not run a sample to the end: a service did not start, or tasks were not completed
    exactly once. The message is one line: what failed, the failing service's own last log line when there is one,
    and the folder where the services' logs are kept."""


def _one_line(exc: BaseException) -> str:
    """`exc`'s first line and, when it goes on (a service's log tail), its last non-empty line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    return lines[0] if len(lines) == 1 else f"{lines[0]} {lines[-1]}"


def require_broker() -> None:
    """Return when RabbitMQ answers at `broker_url()`; else raise BrokerUnavailable, one line saying where and why."""
    url = broker_url()

    async def connect() -> None:
        connection = await aio_pika.connect(url, timeout=BROKER_WAIT)
        await connection.close()

    quiet = logging.getLogger("aiormq")  # it logs a failed connection too; the one line below says where and why
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        asyncio.run(connect())
    except Exception as exc:  # aiormq raises a variety of socket and AMQP errors
        reason = " ".join((str(exc) or type(exc).__name__).split())
        raise BrokerUnavailable(
            f"fair-fig12 runs the real services and needs RabbitMQ at {safe_url(url)} (MEGHA_AMQP_URL), which did "
            f"not answer: {reason}"
        ) from None
    finally:
        quiet.setLevel(level)


@dataclass(frozen=True, slots=True)
class CpuShare:
    """How busy the machine's CPUs were over an interval (`host`), and the part of it that this process and the
    children it waited for took (`own`: the load generator, the services and their tasks), as shares of all its
    CPUs' time."""

    host: float
    own: float


class CpuWatch:
    """Measures a `CpuShare` from its creation to `stop()` (NaN where /proc/stat is missing)."""

    def __init__(self) -> None:
        self._host = self._host_ticks()
        self._own = self._own_seconds()
        self._start = time.monotonic()

    @staticmethod
    def _host_ticks() -> tuple[int, int] | None:
        """(busy, total) clock ticks of the machine's CPUs since boot."""
        try:
            ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle, and waiting for I/O
        return sum(ticks) - idle, sum(ticks)

    @staticmethod
    def _own_seconds() -> float:
        return sum(
            usage.ru_utime + usage.ru_stime
            for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
        )

    def stop(self) -> CpuShare:
        host = self._host_ticks()
        elapsed = time.monotonic() - self._start
        own = (self._own_seconds() - self._own) / (elapsed * (os.cpu_count() or 1)) if elapsed > 0 else math.nan
        if host is None or self._host is None or host[1] == self._host[1]:
            return CpuShare(math.nan, own)
        return CpuShare((host[0] - self._host[0]) / (host[1] - self._host[1]), own)


@dataclass(frozen=True, slots=True)
class PrototypeRun:
    """What one replay through the real services measured: every started task's allocation time, every finished
    task's execution delay and duration, the CPU held while each task ran, the run's metrics, and the machine's CPU
    from the deployment's start to its stop."""

    allocation: np.ndarray
    delays: np.ndarray
    overheads: np.ndarray  # of each delay, the part outside the task's own process (its start, exit and reaping)
    durations: np.ndarray  # of the same tasks, as `starts`
    starts: np.ndarray
    held: np.ndarray  # `cpu_held_during_runs`
    metrics: RunMetrics
    cpu: CpuShare


def run_prototype(exp: Experiment, sample: Sample, seed: int) -> PrototypeRun:
    """Start the deployment, replay `sample` through it, stop it. The services' logs are removed after a complete
    run and kept, and named, after a failed one."""
    folder = Path(tempfile.mkdtemp(prefix="megha-fig12-"))
    c = exp.centre
    deployment = LocalDeployment(
        gms=c.gms,
        lms=c.lms,
        workers_per_lm=c.gms * c.workers_per_partition,
        execution="real",
        node_cpu_millicores=exp.node_cpu,
        node_memory_mb=exp.node_memory,
        delta_interval=HEARTBEAT,
        amqp_url=broker_url(),
        log_dir=folder / "logs",
    )
    settings = LoadgenSettings(
        auth="off",  # the deployment's operator token replaces it (`LocalDeployment.loadgen`)
        out=str(folder),
        **task_set(exp, sample, seed),
    )
    watch = CpuWatch()
    try:
        with deployment:
            run = asyncio.run(replay_services(deployment.loadgen(settings), Progress.on_terminal()))
    except BrokerUnavailable:
        raise
    except (RuntimeError, TimeoutError, OSError) as exc:
        raise PrototypeFailed(
            f"the real services did not run {sample.name} (seed {seed}): {_one_line(exc)}; the services' logs are "
            f"in {folder / 'logs'}"
        ) from exc
    cpu = watch.stop()
    metrics = run.metrics
    assert metrics is not None
    incomplete = len(metrics.not_exactly_once) + metrics.tasks_failed  # tasks given up on (timed out) failed
    if incomplete:
        reasons = "; ".join(f"{reason} ({n})" for reason, n in metrics.failure_reasons[:3])
        raise PrototypeFailed(
            f"the prototype run of {sample.name} (seed {seed}) left {incomplete} tasks not completed exactly once "
            f"({reasons or 'no reason recorded'}); the services' logs are in {folder / 'logs'}"
        )
    shutil.rmtree(folder, ignore_errors=True)
    allocation = allocation_columns(run.tasks)["allocation_time"]
    delays, overheads, durations, starts = execution_delays(run)
    held = cpu_held_during_runs(run, exp.node_cpu * c.workers)
    return PrototypeRun(allocation[~np.isnan(allocation)], delays, overheads, durations, starts, held, metrics, cpu)


def execution_delays(run: ServicesRun) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each finished task's execution delay as its worker measured it (its last run's `finished` event), the part
    of it outside the task's own process (`process_overhead`), the duration it asked for and its start (seconds
    since the replay began)."""
    measured = []
    for task_id, events in run.events.items():
        finished = [e for e in events if e.kind == "finished"]
        if finished:
            task = run.tasks[task_id]
            end = finished[-1]
            measured.append((end.execution_delay, end.process_overhead, task.duration, task.started_at))
    delays, overheads, durations, starts = np.array(measured, dtype=np.float64).reshape(-1, 4).T
    return delays, overheads, durations, starts


def starts_nearby(starts: np.ndarray, within: float = 1.0) -> np.ndarray:
    """For each start, how many tasks (itself among them) started no more than `within` seconds before or after."""
    ordered = np.sort(starts)
    return np.searchsorted(ordered, starts + within, side="right") - np.searchsorted(ordered, starts - within)


def rank_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation of `x` and `y` (tied values share their mean rank); NaN for fewer than 3 pairs
    or a constant series."""
    if x.size < 3:
        return math.nan

    def ranks(values: np.ndarray) -> np.ndarray:
        order = np.empty(values.size)
        order[np.argsort(values, kind="stable")] = np.arange(values.size)
        _, tie, counts = np.unique(values, return_inverse=True, return_counts=True)
        return (np.bincount(tie, order) / counts)[tie]

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def cpu_held_during_runs(run: ServicesRun, capacity: int) -> np.ndarray:
    """For each task that started and finished, the CPU that running tasks (itself among them) asked for, averaged
    over its run, as a share of the data centre's `capacity`: how much the scheduler co-located with it."""
    starts, ends = (run.tasks.array(name, np.float64) for name in ("started_at", "finished_at"))
    cpu = np.array([request[0] for request in run.tasks.column("request")], dtype=np.float64)
    ran = ~np.isnan(starts) & ~np.isnan(ends) & (ends > starts)
    starts, ends, cpu = starts[ran], ends[ran], cpu[ran]
    overlap = np.clip(np.minimum(ends[:, None], ends[None, :]) - np.maximum(starts[:, None], starts[None, :]), 0, None)
    return (overlap @ cpu) / (ends - starts) / capacity


def task_set(exp: Experiment, sample: Sample, seed: int) -> dict[str, Any]:
    """The fields that give the prototype's load generator and the simulator the same tasks: `sample` of the Google
    sub-trace, time-scaled, with scaled-mode requests drawn with `seed`."""
    return {
        "trace": str(demo_trace_path()),
        "first_jobs": sample.first_jobs,
        "time_scale": exp.time_scale,
        "mode": "scaled",
        "cpu_scale": CPU_SCALE,
        "mem_scale": MEM_SCALE,
        "seed": seed,
    }


def simulator_config(exp: Experiment, sample: Sample, seed: int) -> ReplayConfig:
    """The simulator's replay of `sample`: the prototype's data centre, task set and heartbeat."""
    return ReplayConfig(
        **task_set(exp, sample, seed),
        node_cpu_millicores=exp.node_cpu,
        node_memory_mb=exp.node_memory,
        constraints=False,
        delta_interval=HEARTBEAT,
        decision_costs=COSTS,
        **exp.centre.replay_fields(),
    )


def offered_load(exp: Experiment, sample: Sample, seed: int) -> float:
    """CPU the tasks ask for over the data centre's, averaged from the first arrival to the last end of the ideal
    schedule (every task starting on arrival)."""
    jobs = resolve_trace(str(demo_trace_path()), sample.first_jobs, exp.time_scale)
    config = WorkloadConfig("scaled", seed, exp.centre.gms, cpu_scale=CPU_SCALE, mem_scale=MEM_SCALE)
    tasks = [(job.submitted_at, t.duration, t.request[0]) for _, job in build_workload(jobs, config) for t in job.tasks]
    starts, durations, cpu = (np.array(column, dtype=np.float64) for column in zip(*tasks, strict=True))
    span = float((starts + durations).max() - starts.min())
    capacity = exp.node_cpu * exp.centre.workers
    return float((durations * cpu).sum() / (capacity * span)) if span > 0 else math.nan


def _quantiles(values: np.ndarray) -> np.ndarray:
    return np.percentile(values, CDF_PERCENTS) if values.size else np.full(CDF_PERCENTS.size, np.nan)


@dataclass(frozen=True, slots=True)
class Measured:
    """One system's run of one sample with one seed, as the table and the figure show it."""

    tasks: int
    allocation: np.ndarray  # quantiles at CDF_PERCENTS
    allocation_stats: tuple[float, ...]  # p50, mean, p90, p99, max
    delays: np.ndarray  # quantiles at CDF_PERCENTS (zeros for the simulator)
    delay_median: float
    delay_p90: float
    relative_delay_median: float  # median of execution delay / duration
    delay_by_duration: float  # rank correlation of execution delay with duration
    delay_by_starts: float  # rank correlation of execution delay with the tasks starting within 1 s
    overhead_median: float  # median of the delay's part outside the task's process (start, exit, reaping)
    overhead_share: float  # that part's share of all the execution delay (summed over tasks)
    overhead_by_starts: float  # rank correlation of that part with the tasks starting within 1 s
    held_median: float  # median over tasks of the data centre's CPU held while the task ran
    cpu: CpuShare

    @classmethod
    def of_prototype(cls, run: PrototypeRun) -> Measured:
        a = run.metrics.allocation_time
        relative = run.delays / np.maximum(run.durations, 1e-9)
        total = float(run.delays.sum())
        return cls(
            run.metrics.tasks,
            _quantiles(run.allocation),
            (a.median, a.mean, a.p90, a.p99, a.max),
            _quantiles(run.delays),
            float(np.median(run.delays)) if run.delays.size else math.nan,
            float(np.percentile(run.delays, 90)) if run.delays.size else math.nan,
            float(np.median(relative)) if relative.size else math.nan,
            rank_correlation(run.delays, run.durations),
            rank_correlation(run.delays, starts_nearby(run.starts)),
            float(np.median(run.overheads)) if run.overheads.size else math.nan,
            float(run.overheads.sum()) / total if total > 0 else math.nan,
            rank_correlation(run.overheads, starts_nearby(run.starts)),
            float(np.median(run.held)) if run.held.size else math.nan,
            run.cpu,
        )

    @classmethod
    def of_simulator(cls, done: Outcome) -> Measured:
        a = done.metrics.allocation_time
        return cls(
            done.metrics.tasks,
            done.allocation_quantiles,
            (a.median, a.mean, a.p90, a.p99, a.max),
            np.zeros(CDF_PERCENTS.size),
            0.0,
            0.0,
            0.0,
            math.nan,
            math.nan,
            0.0,
            math.nan,
            math.nan,
            math.nan,
            CpuShare(math.nan, math.nan),
        )


Runs = dict[tuple[Sample, str], list[Measured]]


def _seed_mean(runs: Sequence[Measured], figure: str) -> float:
    return mean(getattr(r, figure) for r in runs)


def _stat_mean(runs: Sequence[Measured], index: int) -> float:
    return mean(r.allocation_stats[index] for r in runs)


def prototype_allocation(setup: Setup) -> Result:
    """fair Fig. 12: allocation time of the prototype (the real services on this host) and of the simulator on the
    same data centre and task set, and the prototype's execution delays."""
    require_broker()
    exp = experiment(setup)
    runs: Runs = {}
    loads: dict[tuple[Sample, int], float] = {}
    for sample in exp.samples:
        for seed in setup.seeds:
            loads[(sample, seed)] = offered_load(exp, sample, seed)
            simulated = Measured.of_simulator(outcome(simulator_config(exp, sample, seed), f"{sample.name} fig12"))
            run = run_prototype(exp, sample, seed)
            measured = Measured.of_prototype(run)
            alloc, simulator = (harness.seconds(m.allocation_stats[0]) for m in (measured, simulated))
            harness.progress(
                f"{sample.name} through the real services, seed {seed}: alloc p50 {alloc} (simulator {simulator}), "
                f"execution delay p50 {harness.seconds(measured.delay_median)}, the machine's CPU "
                f"{measured.cpu.host:.0%} busy ({measured.cpu.own:.0%} this run's), {run.metrics.wall_seconds:,.0f} s"
            )
            runs.setdefault((sample, "prototype"), []).append(measured)
            runs.setdefault((sample, "simulator"), []).append(simulated)
    rows = []
    for (sample, system), measured in runs.items():
        for seed, m in zip(setup.seeds, measured, strict=True):
            rows.append(
                [
                    sample.label,
                    system,
                    seed,
                    m.tasks,
                    loads[(sample, seed)],
                    *m.allocation_stats,
                    m.delay_median,
                    m.delay_p90,
                    m.relative_delay_median,
                    m.delay_by_duration,
                    m.delay_by_starts,
                    m.overhead_median,
                    m.overhead_share,
                    m.overhead_by_starts,
                    m.held_median,
                    m.cpu.host,
                    m.cpu.own,
                ]
            )
    ours: dict[str, float] = {}
    for sample in exp.samples:
        proto, sim = runs[(sample, "prototype")], runs[(sample, "simulator")]
        for name, index in (("p50", 0), ("mean", 1), ("p99", 3)):
            key = f"prototype / simulator allocation time ({name}, {sample.label})"
            ours[key] = ratio(_stat_mean(proto, index), _stat_mean(sim, index))
        ours[f"median execution delay, {sample.paper} ({sample.label})"] = _seed_mean(proto, "delay_median")
    heavier, lighter = (runs[(s, "prototype")] for s in exp.samples)
    ours["heavier / lighter workload median execution delay"] = ratio(
        _seed_mean(heavier, "delay_median"), _seed_mean(lighter, "delay_median")
    )

    def draw(path: Path) -> None:
        fig, axes = harness.figure(1, len(exp.samples) + 1, width=5.5 * (len(exp.samples) + 1), height=4.2)
        for ax, sample in zip(axes[0], exp.samples):
            for system in SYSTEMS:
                quantiles = np.mean([m.allocation for m in runs[(sample, system)]], axis=0)
                ax.plot(np.maximum(quantiles, 1e-3), CDF_PERCENTS / 100, label=system)
            ax.set(xscale="log", xlabel="allocation time (s)", ylabel="fraction of tasks", title=sample.label)
            ax.grid(True, linewidth=0.4)
            ax.legend(fontsize=8)
        ax = axes[0][-1]
        for sample in exp.samples:
            quantiles = np.mean([m.delays for m in runs[(sample, "prototype")]], axis=0)
            ax.plot(np.maximum(quantiles, 1e-3), CDF_PERCENTS / 100, label=f"{sample.label} (paper: {sample.paper})")
        ax.set(xscale="log", xlabel="execution delay (s)", ylabel="fraction of tasks", title="prototype")
        ax.grid(True, linewidth=0.4)
        ax.legend(fontsize=8)
        fig.suptitle(
            f"fair Fig. 12: allocation time, the real services on {os.cpu_count()} cores vs the simulator; "
            "execution delay"
        )
        harness.save(fig, path)

    columns = [Column("workload"), Column("system"), Column("seed", "count"), Column("tasks", "count")]
    columns += [Column("offered CPU load", "number")]
    columns += [Column(f"alloc {name}", "seconds") for name in ("p50", "mean", "p90", "p99", "max")]
    columns += [Column("exec delay p50", "seconds"), Column("exec delay p90", "seconds")]
    columns += [Column("exec delay / duration p50", "number"), Column("delay ~ duration", "number")]
    columns += [Column("delay ~ starts within 1 s", "number"), Column("process start/end p50", "seconds")]
    columns += [Column("process start/end / delay", "share"), Column("start/end ~ starts within 1 s", "number")]
    columns += [Column("CPU held during a run p50", "share")]
    columns += [Column("machine CPU busy", "share"), Column("of it, this run's", "share")]
    notes = [
        "Execution delay: the worker's measure, from starting the task's process to its end, minus the duration the "
        "task asked for; the simulator runs each task for exactly its duration (0). Offered CPU load: the CPU the "
        "tasks ask for over the data centre's, from the first arrival to the last end with every task starting on "
        "arrival. Delay ~ duration, delay ~ starts within 1 s: Spearman's rank correlation over the tasks of their "
        "execution delay with the duration they asked for, and with how many tasks started within a second of "
        "them. Process start/end: the part of a task's execution delay outside its own process's clock (its "
        "interpreter starting, its exit and reaping; `process_overhead` of its `finished` event), the median over "
        "tasks and, summed over tasks, its share of all the delay; the rest of the delay is the process running "
        "past its duration, short of CPU (the paper's mechanism); start/end ~ starts within 1 s: the rank "
        "correlation of the part outside with how many tasks started within a second. CPU held during a run: the "
        "CPU the running tasks asked for, averaged over a task's run, as a share of the data centre's (the median "
        "over tasks): what the scheduler co-located with it. Machine CPU busy: the "
        "share of the machine's CPU time that was busy from the deployment's start to its stop; of it, this run's: "
        "the part its load generator, services and tasks took (the rest is the broker and whatever else ran on the "
        "machine)."
    ]
    return Result(f"{exp.describe()}, {setup.describe()}", columns, rows, ours, draw, notes)
