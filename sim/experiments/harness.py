"""What the simulator experiments share: named workloads and data centres, one replay's figures as a CSV row,
seeds summarised as mean and spread, and the header, tables and plots of every page under `docs/results/`."""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from megha.common.usage import OneLineParser
from megha.loadgen.progress import Progress
from megha.loadgen.replay import ReplayConfig, ReplayResult, replay
from megha.loadgen.report import format_seconds
from megha.loadgen.trace import demo_trace_path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
TRACES = ROOT.parent / "shared" / "traces"
#: Short names of the shared traces.
NAMED_TRACES = {
    "syn_250": "syn_250.0.tr",
    "syn_500": "syn_500.0.tr",
    "syn_1000": "syn_1000.0.tr",
    "GOOG": "GOOG_subtrace.tr",
    "Yahoo": "YH1_sub.tr",
}


@dataclass(frozen=True, slots=True)
class DataCentre:
    """The published 10,000-node reference cluster (`reference`), or one generated as LMs x GMs x workers per
    partition (written `5x5x800`)."""

    lms: int = 5
    gms: int = 5
    workers_per_partition: int = 400
    reference: bool = False

    @classmethod
    def parse(cls, text: str) -> DataCentre:
        if text == "reference":
            return cls(reference=True)
        try:
            lms, gms, wpp = (int(part) for part in text.lower().split("x"))
        except ValueError:
            raise ValueError(f"data centre {text!r}: expected 'reference' or LMSxGMSxWORKERS, e.g. 5x5x800") from None
        if min(lms, gms, wpp) < 1:
            raise ValueError(f"data centre {text!r}: every count must be at least 1")
        return cls(lms, gms, wpp)

    @property
    def workers(self) -> int:
        return self.lms * self.gms * self.workers_per_partition

    def replay_fields(self) -> dict[str, Any]:
        if self.reference:
            return {"cluster": "reference"}
        wpp = self.workers_per_partition
        return {"cluster": "generate", "lms": self.lms, "gms": self.gms, "workers_per_partition": wpp}


@dataclass(frozen=True, slots=True)
class Workload:
    """A trace under a short name (`syn_250`, `GOOG`, a `syn:<tasks>:<jobs>` spec or a `.tr` path) on a data
    centre; written `TRACE` (its default data centre) or `TRACE@DATACENTRE`. `demo` is the shipped 100-job sample."""

    name: str
    trace: str
    centre: DataCentre

    @classmethod
    def parse(cls, spec: str, default: DataCentre | None = None) -> Workload:
        """Without `@` and `default`, the papers' data centre for the trace (`paper_centre`)."""
        name, _, centre = spec.partition("@")
        if name in NAMED_TRACES:
            trace = str(TRACES / NAMED_TRACES[name])
        else:
            trace = str(demo_trace_path()) if name == "demo" else name
        if not trace.startswith("syn:") and not Path(trace).exists():
            raise FileNotFoundError(f"trace {trace} not found (the shared traces live in ../shared/traces)")
        if centre:
            return cls(name, trace, DataCentre.parse(centre))
        return cls(name, trace, default if default is not None else paper_centre(name))

    def config(self, **fields: Any) -> ReplayConfig:
        """A replay of this workload's trace on its data centre, with `fields` (other `ReplayConfig` fields) set."""
        return ReplayConfig(trace=self.trace, **fields, **self.centre.replay_fields())


def paper_centre(name: str) -> DataCentre:
    """The constraint-aware paper's data centre for a trace: the Google sub-trace on 20,000 generated workers
    (5 LMs x 5 GMs x 800), any other trace on the published 10,000-node reference cluster."""
    return DataCentre(5, 5, 800) if name == "GOOG" else DataCentre(reference=True)


@dataclass(frozen=True, slots=True)
class Run:
    """The figures of one replay (times in seconds); one CSV row."""

    workload: str
    scheduler: str
    matching: str
    workers: int
    lms: int
    gms: int
    delta_interval: float
    seed: int
    tasks: int
    completed_once: int
    failed: int
    jobs_rejected: int
    alloc_median: float
    alloc_p90: float
    alloc_p99: float
    alloc_p9999: float
    alloc_max: float
    jrt_median: float
    jrt_p90: float
    jrt_p99: float
    jrt_max: float
    utilization: float
    inconsistencies: int
    repartitions: int
    reschedules: int
    wall_seconds: float  # the event loop's wall time
    cpu_seconds: float = math.nan  # the whole replay's CPU time (data centre, workload, run, metrics)

    @property
    def cpu_us_per_task(self) -> float:
        """The simulator's processing cost per task (every GM, LM and worker on one core), in CPU microseconds:
        less disturbed than wall time by other work on a shared machine."""
        return 1e6 * self.cpu_seconds / self.tasks if self.tasks else math.nan


def seconds(value: float) -> str:
    """A duration for a results table: "1.50 ms" below a second, "1.003 s" below 100 s, "6,050 s" above (hours-long
    waits need no millisecond digits)."""
    if not math.isnan(value) and abs(value) >= 100:
        return f"{value:,.0f} s"
    return format_seconds(value)


def run_replay(config: ReplayConfig, workload: str) -> tuple[Run, ReplayResult]:
    """Replay `config` and summarise it as a Run labelled `workload`; on a terminal, with a progress bar."""
    cpu = time.process_time()
    result = replay(config, Progress.on_terminal())
    cpu = time.process_time() - cpu
    m = result.metrics
    a, j = m.allocation_time, m.jrt_delay
    run = Run(
        workload=workload,
        scheduler=config.scheduler,
        matching=config.matching,
        workers=result.cluster.num_nodes,
        lms=result.cluster.num_lms,
        gms=result.cluster.num_gms,
        delta_interval=config.delta_interval,
        seed=config.seed,
        tasks=m.tasks,
        completed_once=m.tasks - len(m.not_exactly_once) - m.tasks_failed,
        failed=m.tasks_failed,
        jobs_rejected=m.jobs_rejected,
        alloc_median=a.median,
        alloc_p90=a.p90,
        alloc_p99=a.p99,
        alloc_p9999=a.p9999,
        alloc_max=a.max,
        jrt_median=j.median,
        jrt_p90=j.p90,
        jrt_p99=j.p99,
        jrt_max=j.max,
        utilization=next(iter(m.utilization.mean.values())),
        inconsistencies=m.inconsistencies,
        repartitions=m.repartitions,
        reschedules=m.reschedules,
        wall_seconds=result.wall_seconds,
        cpu_seconds=cpu,
    )
    progress(
        f"{workload} on {run.workers:,} workers, {config.scheduler}/{config.matching}, seed {config.seed}: "
        f"alloc p50 {seconds(a.median)} p99 {seconds(a.p99)}, JRT delay p50 "
        f"{seconds(j.median)} p99 {seconds(j.p99)}, {run.completed_once:,}/{run.tasks:,} completed "
        f"once, {run.wall_seconds:,.1f} s wall"
    )
    return run, result


def replay_each(
    workloads: Sequence[Workload], seeds: Sequence[int], first_jobs: int | None, **options: Sequence[Any]
) -> list[Run]:
    """One replay of each workload for every combination of `options` (ReplayConfig fields, each given its values)
    and seed, in that order (the last varies fastest)."""
    runs = []
    for workload in workloads:
        for *values, seed in itertools.product(*options.values(), seeds):
            chosen = dict(zip(options, values, strict=True))
            config = workload.config(first_jobs=first_jobs, seed=seed, **chosen)
            runs.append(run_replay(config, workload.name)[0])
    return runs


def allocation_times(result: ReplayResult) -> np.ndarray:
    """Every started task's allocation time, seconds."""
    values = np.fromiter((t.allocation_time for t in result.recorder.tasks.values()), dtype=np.float64)
    return values[~np.isnan(values)]


def write_runs(path: Path, runs: Sequence[Run]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([f.name for f in fields(Run)])
        writer.writerows(astuple(r) for r in runs)


def read_runs(path: Path) -> list[Run]:
    """The runs of a CSV written by `write_runs` (to redraw a page without replaying)."""
    convert = {"int": int, "float": float, "str": str}
    types = {f.name: convert[str(f.type)] for f in fields(Run)}  # absent columns (older CSVs) take their default
    with path.open(newline="") as handle:
        return [Run(**{k: types[k](v) for k, v in row.items()}) for row in csv.DictReader(handle)]


def group(runs: Iterable[Run], *keys: str) -> dict[tuple[Any, ...], list[Run]]:
    """Runs grouped by the values of `keys` (seeds of one configuration end up together), in first-seen order."""
    groups: dict[tuple[Any, ...], list[Run]] = {}
    for r in runs:
        groups.setdefault(tuple(getattr(r, k) for k in keys), []).append(r)
    return groups


@dataclass(frozen=True, slots=True)
class Spread:
    """Mean, minimum and maximum of one figure over seeds."""

    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        data = np.asarray(list(values), dtype=np.float64)
        if data.size == 0 or np.isnan(data).all():
            return cls(math.nan, math.nan, math.nan)
        return cls(float(np.nanmean(data)), float(np.nanmin(data)), float(np.nanmax(data)))

    def seconds(self) -> str:
        """The mean ("1.00 ms"), followed by "(min - max)" when the seeds differ in the digits shown."""
        return self._show(seconds)

    def percent(self) -> str:
        return self._show(lambda value: f"{100 * value:.1f}%")

    def _show(self, fmt: Callable[[float], str]) -> str:
        low, high = fmt(self.low), fmt(self.high)
        return fmt(self.mean) if low == high else f"{fmt(self.mean)} ({low} - {high})"


def spread(runs: Sequence[Run], figure: str) -> Spread:
    return Spread.of(getattr(r, figure) for r in runs)


def accounted(runs: Sequence[Run]) -> str:
    """Tasks of accepted jobs that completed exactly once, of all such tasks, summed over `runs`."""
    return f"{sum(r.completed_once for r in runs):,} / {sum(r.tasks - r.failed for r in runs):,}"


def count_range(runs: Sequence[Run], figure: str) -> str:
    """An integer figure over seeds: "11", or "11 - 22" when the seeds differ."""
    low, high = min(getattr(r, figure) for r in runs), max(getattr(r, figure) for r in runs)
    return f"{low:,}" if low == high else f"{low:,} - {high:,}"


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def machine() -> str:
    """CPU model and count, OS and Python: what a reader needs to compare wall times."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            model = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    system = f"{platform.system()} {platform.release()}"
    return f"{model}, {os.cpu_count()} CPUs, {system}, Python {platform.python_version()}"


def page(title: str, command: str, wall: float, body: Iterable[str]) -> str:
    """A results page: title, the command that wrote it, the machine and the wall time, then `body`."""
    head = [
        f"# {title}",
        "",
        f"Produced by `{command}` in {wall:,.0f} s of wall time on {machine()}. The machine is shared: wall times "
        "are indicative; every other figure is on the simulator's virtual clock and does not depend on the machine.",
        "",
    ]
    return "\n".join([*head, *body]) + "\n"


def write_page(
    args: argparse.Namespace,
    module: str,
    argv: Sequence[str] | None,
    title: str,
    start: float,
    body: Iterable[str],
    others: str = ".csv and .png",
) -> None:
    """Write the page `args.out`/`args.name`.md (see `page`) of a run begun at `start` (`time.perf_counter()`), and
    say so, with the `others` files the run wrote."""
    text = page(title, command_line(module, argv), time.perf_counter() - start, body)
    (args.out / f"{args.name}.md").write_text(text)
    progress(f"wrote {args.out}/{args.name}.md, {others}")


def parse_workloads(parser: argparse.ArgumentParser, specs: Sequence[str]) -> list[Workload]:
    """The workloads `specs` name (see `Workload.parse`); a bad one ends the program with the parser's error."""
    try:
        return [Workload.parse(spec) for spec in specs]
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))


def command_line(module: str, argv: Sequence[str] | None) -> str:
    args = list(argv) if argv is not None else sys.argv[1:]
    return " ".join([f"python -m megha.sim.experiments.{module}", *args])


def parser(module: str, name: str, description: str, seeds: Sequence[int] = (0, 1, 2)) -> argparse.ArgumentParser:
    """The options every experiment has: `--seeds`, `--out` and `--name` (the stem of the files it writes)."""
    p = OneLineParser(prog=f"python -m megha.sim.experiments.{module}", description=description)
    p.add_argument("--seeds", type=int, nargs="+", default=list(seeds), help="seeds (default: %(default)s)")
    p.add_argument("--out", type=Path, default=RESULTS, help="output directory (default: docs/results)")
    p.add_argument("--name", default=name, help="stem of the files written (default: %(default)s)")
    return p


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def figure(rows: int = 1, cols: int = 1, width: float = 11, height: float = 4) -> tuple[Any, np.ndarray]:
    """A matplotlib figure (no display backend) and its axes as a 2-D array."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=False)


def save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
