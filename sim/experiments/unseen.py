"""`megha replay`'s default placement (the rarity LM order and node choice) against the paper's (round-robin, random
choice) and the authors' simulator's (first-fit, random choice) on set-ups none of them was designed or measured on:
scaled-down resource requests, machine constraints per LM, arrivals compressed to a higher load, small overloaded
data centres, later slices of the Google and Yahoo traces, no constraints. p50 and p99 JRT delay per seed, the
mean over seeds, and how many seeds rarity wins and loses against the better baseline.

Every run is a `megha replay` process with the command-line options its set-up names (the public interface, as a
user would run it), `--lm-order` and `--matching` for the policy, and `--seed`. A set-up whose trace is a slice of a
shared trace, or has its arrivals compressed (durations unchanged, so more tasks run at once; `--time-scale`
scales both), replays a copy written to a temporary folder.

    python -m megha.sim.experiments.unseen          # every set-up, seeds 0-4: docs/results/lm-order-unseen.*
    python -m megha.sim.experiments.unseen --setups C5 --seeds 0 --out /tmp/unseen
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from megha.common.lifecycle import exit_quietly_if_stdout_closed
from megha.loadgen.trace import TraceJob, read_trace
from megha.sim.experiments import harness
from megha.sim.experiments.workloads import write_trace

MODULE = "unseen"
DESCRIPTION = "The rarity order and node choice against round-robin and first-fit on set-ups none was measured on."
POLICIES = {
    "rarity": ("rarity", "rarity"),
    "round-robin": ("round-robin", "random"),
    "first-fit": ("first-fit", "random"),
}
CANDIDATE = "rarity"
TIE = 0.01  # a seed's p99 within 1% of the better baseline's is neither a win nor a loss
SMALL_NODES = ["--node-cpu", "80", "--node-mem", "330"]  # the largest scaled-down request of the traces still fits


@dataclass(frozen=True, slots=True)
class Derived:
    """Jobs `start` to `end` - 1 of a shared trace, re-based to arrive from 0, arrivals multiplied by `arrivals`."""

    trace: str  # a name of `harness.NAMED_TRACES`
    start: int
    end: int
    arrivals: float = 1.0

    def write(self, folder: Path) -> Path:
        jobs = read_trace(harness.TRACES / harness.NAMED_TRACES[self.trace], self.end)[self.start :]
        first = jobs[0].arrival
        path = folder / f"{self.trace}-{self.start}-{self.end}-x{self.arrivals}.tr"
        write_trace(path, [TraceJob((j.arrival - first) * self.arrivals, j.durations) for j in jobs])
        return path


@dataclass(frozen=True, slots=True)
class Setup:
    name: str
    what: str
    options: tuple[str, ...]  # `megha replay` options; "{trace}" stands for the derived trace's path
    derived: Derived | None = None


def _shared(name: str) -> str:
    return str(harness.TRACES / harness.NAMED_TRACES[name])


def _on_reference(name: str, what: str, derived: Derived, *options: str) -> Setup:
    """A set-up replaying a derived trace on the reference cluster."""
    return Setup(name, what, ("--trace", "{trace}", "--cluster", "reference", *options), derived)


SETUPS = [
    Setup(
        "A1",
        "scaled requests, GOOG[:300], 5 x 5 x 200 nodes of 80 mc / 330 MB",
        (
            "--trace",
            _shared("GOOG"),
            "--first-jobs",
            "300",
            "--mode",
            "scaled",
            "--workers-per-partition",
            "200",
            *SMALL_NODES,
        ),
    ),
    Setup(
        "A2",
        "scaled requests, Yahoo[:1000], 5 x 5 x 100 nodes of 80 mc / 330 MB",
        (
            "--trace",
            _shared("Yahoo"),
            "--first-jobs",
            "1000",
            "--mode",
            "scaled",
            "--workers-per-partition",
            "100",
            *SMALL_NODES,
        ),
    ),
    Setup(
        "A3",
        "scaled requests, syn_500[:200], 5 x 5 x 40 nodes of 80 mc / 330 MB, unsatisfiable tasks dropped",
        (
            "--trace",
            _shared("syn_500"),
            "--first-jobs",
            "200",
            "--mode",
            "scaled",
            "--workers-per-partition",
            "40",
            *SMALL_NODES,
            "--unsatisfiable",
            "drop",
        ),
    ),
    Setup(
        "B1",
        "machine constraints per LM, syn_1000[:150], unsatisfiable tasks dropped",
        (
            "--trace",
            _shared("syn_1000"),
            "--first-jobs",
            "150",
            "--machine-constraints",
            "per-lm",
            "--unsatisfiable",
            "drop",
        ),
    ),
    Setup(
        "B2",
        "machine constraints per LM, Yahoo[:1000], 10 x 5 x 200, unsatisfiable tasks dropped",
        (
            "--trace",
            _shared("Yahoo"),
            "--first-jobs",
            "1000",
            "--machine-constraints",
            "per-lm",
            "--lms",
            "10",
            "--workers-per-partition",
            "200",
            "--unsatisfiable",
            "drop",
        ),
    ),
    _on_reference("C1", "Yahoo[:1000], arrivals x 0.5, reference cluster", Derived("Yahoo", 0, 1000, 0.5)),
    _on_reference("C2", "Yahoo[:1000], arrivals x 0.3, reference cluster", Derived("Yahoo", 0, 1000, 0.3)),
    Setup(
        "C3",
        "Yahoo[:1000], --time-scale 0.3 (arrivals and durations), reference cluster",
        ("--trace", _shared("Yahoo"), "--first-jobs", "1000", "--time-scale", "0.3", "--cluster", "reference"),
    ),
    Setup(
        "C4",
        "GOOG[:300] on the reference cluster (10,000 nodes)",
        ("--trace", _shared("GOOG"), "--first-jobs", "300", "--cluster", "reference"),
    ),
    Setup(
        "C5",
        "small overloaded data centre: syn:500:100 on 3 LMs x 2 GMs x 100, unsatisfiable tasks dropped",
        (
            "--trace",
            "syn:500:100",
            "--lms",
            "3",
            "--gms",
            "2",
            "--workers-per-partition",
            "100",
            "--unsatisfiable",
            "drop",
        ),
    ),
    Setup(
        "C6",
        "small data centre without constraints: syn:400:100 on 3 LMs x 2 GMs x 100",
        ("--trace", "syn:400:100", "--lms", "3", "--gms", "2", "--workers-per-partition", "100", "--no-constraints"),
    ),
    _on_reference("D1", "GOOG[7000:7600], reference cluster", Derived("GOOG", 7000, 7600)),
    _on_reference("D2", "GOOG[9000:10000], reference cluster", Derived("GOOG", 9000, 10000)),
    _on_reference("D3", "Yahoo[1000:2000], arrivals x 0.25, reference cluster", Derived("Yahoo", 1000, 2000, 0.25)),
    _on_reference(
        "E1",
        "no constraints, Yahoo[:1000], arrivals x 0.3, reference cluster",
        Derived("Yahoo", 0, 1000, 0.3),
        "--no-constraints",
    ),
    Setup(
        "E2",
        "no constraints, GOOG[:300], reference cluster",
        ("--trace", _shared("GOOG"), "--first-jobs", "300", "--cluster", "reference", "--no-constraints"),
    ),
]
BY_NAME = {s.name: s for s in SETUPS}


@dataclass(frozen=True, slots=True)
class UnseenRun:
    setup: str
    policy: str
    seed: int
    p50: float  # JRT delay, seconds
    p99: float
    jobs: int
    jobs_rejected: int


def replay(options: Sequence[str], policy: str, seed: int, out: Path) -> dict[str, object]:
    """One `megha replay` process; its summary.json."""
    order, matching = POLICIES[policy]
    command = [str(Path(sys.executable).with_name("megha")), "replay", *options, "--lm-order", order, "--matching"]
    command += [matching, "--seed", str(seed), "--quiet", "--out", str(out), "--overwrite"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode not in (0, 3):  # 3: the run's warning (most tasks failed or jobs rejected), still reported
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return json.loads((out / "summary.json").read_text())


def run_all(setups: Sequence[Setup], seeds: Sequence[int]) -> list[UnseenRun]:
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for setup in setups:
            trace = str(setup.derived.write(folder)) if setup.derived else ""
            options = [trace if o == "{trace}" else o for o in setup.options]
            for seed in seeds:
                for policy in POLICIES:
                    summary = replay(options, policy, seed, folder / "out")
                    jrt, counts = summary["summaries"]["jrt_delay"], summary["counts"]  # type: ignore[index]
                    run = UnseenRun(
                        setup.name, policy, seed, jrt["median"], jrt["p99"], counts["jobs"], counts["jobs_rejected"]
                    )
                    harness.progress(
                        f"{setup.name} {policy} seed {seed}: JRT delay p50 {run.p50:.4g} s p99 {run.p99:.4g} s"
                    )
                    runs.append(run)
    return runs


def markdown(runs: Sequence[UnseenRun], setups: Sequence[Setup]) -> list[str]:
    """Per set-up: each policy's mean p50 and p99 over seeds, rarity's p99 over the better baseline's, and the
    seeds on which rarity is more than `TIE` below (won) or above (lost) the better baseline."""
    lines = [
        "| set-up | seeds | "
        + " | ".join(f"{p} p99 (p50), mean" for p in POLICIES)
        + " | rarity / better baseline, p99 | seeds won / lost |",
        "| --- | --- | " + " | ".join("---" for _ in POLICIES) + " | --- | --- |",
    ]
    for setup in setups:
        mine = [r for r in runs if r.setup == setup.name]
        if not mine:
            continue
        by = {p: sorted((r for r in mine if r.policy == p), key=lambda r: r.seed) for p in POLICIES}
        means = {p: (statistics.fmean(r.p99 for r in rs), statistics.fmean(r.p50 for r in rs)) for p, rs in by.items()}
        better = min(means[p][0] for p in POLICIES if p != CANDIDATE)
        won = lost = 0
        for i, run in enumerate(by[CANDIDATE]):
            best = min(by[p][i].p99 for p in POLICIES if p != CANDIDATE)
            won += run.p99 < best * (1 - TIE)
            lost += run.p99 > best * (1 + TIE)
        cells = " | ".join(f"{_seconds(p99)} ({_seconds(p50)})" for p99, p50 in means.values())
        ratio = f"{means[CANDIDATE][0] / better:.0%}" if better else "-"
        lines.append(f"| {setup.name}: {setup.what} | {len(by[CANDIDATE])} | {cells} | {ratio} | {won} / {lost} |")
    return lines


def _seconds(value: float) -> str:
    return f"{value * 1000:.2f} ms" if value < 1 else f"{value:,.0f} s" if value >= 100 else f"{value:.2f} s"


def write_csv(path: Path, runs: Sequence[UnseenRun]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["setup", "policy", "seed", "jrt_delay_p50", "jrt_delay_p99", "jobs", "jobs_rejected"])
        for r in runs:
            writer.writerow([r.setup, r.policy, r.seed, round(r.p50, 6), round(r.p99, 6), r.jobs, r.jobs_rejected])


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(MODULE, "lm-order-unseen", DESCRIPTION, seeds=(0, 1, 2, 3, 4))
    parser.add_argument("--setups", nargs="+", choices=sorted(BY_NAME), default=sorted(BY_NAME), help="(default: all)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    setups = [BY_NAME[name] for name in args.setups]
    runs = run_all(setups, args.seeds)
    write_csv(args.out / f"{args.name}.csv", runs)
    body = markdown(runs, setups)
    harness.write_page(args, MODULE, argv, "The rarity order and node choice on unseen set-ups", start, body, ".csv")
    return 0


if __name__ == "__main__":
    exit_quietly_if_stdout_closed(main)
