"""The constraint-aware paper's comparison of Megha and PigeonC (Figures 6 to 10) on our simulator.

The paper's set-up (sections 5 and 6): each trace replayed by Megha and PigeonC with Random and Minimum-Constraints
matching, three seeds, one task per worker (slot), Sharma et al. constraints; the synthetic and Yahoo traces on the
10,000-node reference cluster, the Google sub-trace on 20,000 workers; PigeonC with 10 distributors, 100 masters
and FQW 20. PigeonC runs twice: with the authors' simulator's tally of constraint sets (`pigeonc-published`, the
code behind the paper's figures) and with the paper's own rule (`pigeonc`); docs/results.md explains the difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from megha.sim.experiments import harness
from megha.sim.experiments.harness import Workload
from megha.sim.reproduce.load import PAPER_NAMES
from megha.sim.reproduce.outcome import Outcome, outcome
from megha.sim.reproduce.result import Column, Result
from megha.sim.reproduce.setup import Setup
from megha.sim.reproduce.summary import mean, ratio, summary_mean

MATCHINGS = ("random", "min-constraints")
PIGEONC = {"pigeonc-published": "authors' tally", "pigeonc": "paper's rule"}
SCHEDULERS = ("megha", *PIGEONC)
SYNTHETIC = ("syn_250", "syn_500", "syn_1000")
README_JOBS = 200  # ../shared/README.md's published reference: the first 200 jobs of syn_250
Runs = dict[tuple[str, str, str], list[Outcome]]  # (workload, scheduler, matching) -> one outcome per seed


def label(scheduler: str) -> str:
    return "Megha" if scheduler == "megha" else f"PigeonC ({PIGEONC[scheduler]})"


def first_jobs(name: str, setup: Setup) -> int | None:
    """All jobs at full scale; at quick scale the first 200 of a synthetic trace (the published reference's
    prefix) and the first 3,000 of the Google sub-trace (Yahoo runs whole); a few at tiny scale."""
    if name in SYNTHETIC:
        return setup.pick(None, README_JOBS, 5)
    return setup.pick(None, 3000 if name == "GOOG" else None, 20)


def delay_runs(
    setup: Setup, names: Sequence[str], matchings: Sequence[str] = MATCHINGS, seeds: Sequence[int] | None = None
) -> Runs:
    """Every scheduler on each workload with each matching and seed."""
    runs: Runs = {}
    for name in names:
        workload = Workload.parse(name)
        first = first_jobs(name, setup)
        for scheduler in SCHEDULERS:
            for matching in matchings:
                for seed in setup.seeds if seeds is None else seeds:
                    config = workload.config(first_jobs=first, scheduler=scheduler, matching=matching, seed=seed)
                    shown = name if first is None else f"{name}[:{first}]"
                    runs.setdefault((name, scheduler, matching), []).append(outcome(config, shown))
    return runs


def _jobs_note(names: Sequence[str], setup: Setup) -> str:
    parts = [
        f"{n}: {'all jobs' if first_jobs(n, setup) is None else f'first {first_jobs(n, setup):,} jobs'}" for n in names
    ]
    return f"{'; '.join(parts)}; {setup.describe()}"


_DELAY_COLUMNS = [
    Column("workload"),
    Column("scheduler"),
    Column("matching"),
    Column("jobs", "count"),
    Column("JRT delay p50", "seconds"),
    Column("JRT delay p90", "seconds"),
    Column("JRT delay p99", "seconds"),
    Column("JRT delay max", "seconds"),
    Column("mean utilization", "share"),
    Column("rejected jobs", "number"),
    Column("inconsistencies", "number"),
    Column("completed once / accepted tasks"),
]


def _delay_figures(runs: Runs, setup: Setup) -> dict[str, float]:
    """Our figures for the claims of Figures 6 to 8 (see `paper.py`): medians, p99 ratios, matchings compared."""
    ours: dict[str, float] = {}
    names = dict.fromkeys(name for name, _, _ in runs)
    for name in names:
        paper = PAPER_NAMES[name]
        p99 = {(s, m): summary_mean(runs[(name, s, m)], "p99", "jrt_delay") for s in SCHEDULERS for m in MATCHINGS}
        p50 = {(s, m): summary_mean(runs[(name, s, m)], "median", "jrt_delay") for s in SCHEDULERS for m in MATCHINGS}
        for matching in MATCHINGS:
            ours[f"Megha {matching} {paper} JRT delay p50"] = p50[("megha", matching)]
            ours[f"Megha {paper} JRT delay max ({matching})"] = summary_mean(
                runs[(name, "megha", matching)], "max", "jrt_delay"
            )
            for scheduler, variant in PIGEONC.items():
                ours[f"PigeonC {matching} {paper} JRT delay p50 ({variant})"] = p50[(scheduler, matching)]
                for stat, values in (("p99", p99), ("p50", p50)):
                    key = f"PigeonC / Megha {paper} JRT delay {stat} ({matching}, {variant})"
                    ours[key] = ratio(values[(scheduler, matching)], values[("megha", matching)])
        ours[f"Megha {paper} JRT delay p99 difference, random vs min-constraints"] = abs(
            p99[("megha", "random")] - p99[("megha", "min-constraints")]
        )
        ours[f"Megha {paper} JRT delay p99, min-constraints / random"] = ratio(
            p99[("megha", "min-constraints")], p99[("megha", "random")]
        )
        for scheduler, variant in PIGEONC.items():
            key = f"PigeonC {paper} JRT delay p99, random / min-constraints ({variant})"
            ours[key] = ratio(p99[(scheduler, "random")], p99[(scheduler, "min-constraints")])
        if name == "syn_250" and first_jobs(name, setup) == README_JOBS:
            for scheduler in SCHEDULERS:
                who = "Megha" if scheduler == "megha" else "PigeonC"
                variant = "" if scheduler == "megha" else f" ({PIGEONC[scheduler]})"
                for stat, field in (("p50", "median"), ("p99", "p99"), ("max", "max")):
                    key = f"{who} random syn_250, first {README_JOBS} jobs, JRT delay {stat}{variant}"
                    ours[key] = summary_mean(runs[(name, scheduler, "random")], field, "jrt_delay")
    return ours


def _delays(setup: Setup, names: Sequence[str], title: str) -> Result:
    """Figures 6 to 8: JRT delay of each workload under Megha and PigeonC with both matchings."""
    runs = delay_runs(setup, names)
    rows = []
    for (name, scheduler, matching), outcomes in runs.items():
        rows.append(
            [
                PAPER_NAMES[name],
                label(scheduler),
                matching,
                outcomes[0].metrics.jobs,
                *(summary_mean(outcomes, f, "jrt_delay") for f in ("median", "p90", "p99", "max")),
                mean(o.run.utilization for o in outcomes),
                mean(o.metrics.jobs_rejected for o in outcomes),
                mean(o.metrics.inconsistencies for o in outcomes),
                harness.accounted([o.run for o in outcomes]),
            ]
        )

    def draw(path: Path) -> None:
        fig, axes = harness.figure(1, len(names), width=6 * len(names), height=4.5)
        for ax, name in zip(axes[0], names):
            for color, scheduler in enumerate(SCHEDULERS):
                for matching, style in zip(MATCHINGS, ("-", "--")):
                    delays = np.sort(np.concatenate([o.jrt_delays for o in runs[(name, scheduler, matching)]]))
                    if delays.size:
                        fraction = np.arange(1, delays.size + 1) / delays.size
                        short = "rand" if matching == "random" else "min"
                        shown = f"{label(scheduler)}_{short}"
                        ax.step(np.maximum(delays, 1e-4), fraction, style, color=f"C{color}", where="post", label=shown)
            ax.set(xscale="log", xlabel="JRT delay (s)", ylabel="fraction of jobs", title=PAPER_NAMES[name])
            ax.grid(True, linewidth=0.4)
            ax.legend(fontsize=7)
        fig.suptitle(title)
        harness.save(fig, path)

    return Result(_jobs_note(names, setup), _DELAY_COLUMNS, rows, _delay_figures(runs, setup), draw)


def synthetic_delays(setup: Setup) -> Result:
    """constraint-aware Figure 6."""
    return _delays(setup, SYNTHETIC, "constraint-aware Figure 6: JRT delay, synthetic workloads")


def yahoo_delays(setup: Setup) -> Result:
    """constraint-aware Figure 7."""
    return _delays(setup, ("Yahoo",), "constraint-aware Figure 7: JRT delay, Yahoo workload")


def google_delays(setup: Setup) -> Result:
    """constraint-aware Figure 8."""
    return _delays(setup, ("GOOG",), "constraint-aware Figure 8: JRT delay, Google workload")


def utilization_ratio(setup: Setup) -> Result:
    """constraint-aware Figure 9: PigeonC's mean utilization over Megha's, per workload (averaged over matchings and
    seeds; at quick and tiny scale Random matching only)."""
    names = (*SYNTHETIC, "Yahoo", "GOOG")
    matchings = setup.pick(MATCHINGS, ("random",), ("random",))
    runs = delay_runs(setup, names, matchings)
    util = {
        (name, scheduler): mean(o.run.utilization for m in matchings for o in runs[(name, scheduler, m)])
        for name in names
        for scheduler in SCHEDULERS
    }
    rows = []
    ours = {}
    for name in names:
        megha = util[(name, "megha")]
        cells: list[object] = [PAPER_NAMES[name], megha]
        for scheduler, variant in PIGEONC.items():
            normalized = ratio(util[(name, scheduler)], megha)
            cells += [util[(name, scheduler)], normalized]
            ours[f"PigeonC / Megha mean utilization, {PAPER_NAMES[name]} ({variant})"] = normalized
        rows.append(cells)

    def draw(path: Path) -> None:
        fig, axes = harness.figure(1, 1, width=8, height=4)
        ax = axes[0][0]
        xs = np.arange(len(names))
        for k, (scheduler, variant) in enumerate(PIGEONC.items()):
            values = [ratio(util[(n, scheduler)], util[(n, "megha")]) for n in names]
            ax.bar(xs + (k - 0.5) * 0.4, values, 0.4, label=f"PigeonC ({variant})")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(xs, [PAPER_NAMES[n] for n in names])
        ax.set(ylabel="PigeonC / Megha mean utilization")
        ax.legend(fontsize=8)
        fig.suptitle("constraint-aware Figure 9: PigeonC's utilization normalized to Megha's")
        harness.save(fig, path)

    columns = [Column("workload"), Column("Megha utilization", "share")]
    for variant in PIGEONC.values():
        columns += [Column(f"PigeonC ({variant}) utilization", "share"), Column(f"({variant}) / Megha", "ratio")]
    described = f"{_jobs_note(names, setup)}, matchings {', '.join(matchings)}"
    return Result(described, columns, rows, ours, draw)


def utilization_cdf(setup: Setup) -> Result:
    """constraint-aware Figure 10: the distribution of utilization over the busy span, synthetic workloads, the
    first seed, Random matching."""
    seed = setup.seeds[0]
    runs = delay_runs(setup, SYNTHETIC, ("random",), (seed,))
    rows = []
    for (name, scheduler, _), (o,) in runs.items():
        steps = o.utilization
        stats = [float(np.percentile(steps, q)) if steps.size else np.nan for q in (10, 50, 90)]
        rows.append(
            [PAPER_NAMES[name], label(scheduler), steps.size, stats[0], stats[1], float(steps.mean()), stats[2]]
        )

    def draw(path: Path) -> None:
        fig, axes = harness.figure(1, len(SYNTHETIC), width=6 * len(SYNTHETIC), height=4)
        for ax, name in zip(axes[0], SYNTHETIC):
            for scheduler in SCHEDULERS:
                steps = np.sort(runs[(name, scheduler, "random")][0].utilization)
                ax.step(steps, np.arange(1, steps.size + 1) / max(steps.size, 1), where="post", label=label(scheduler))
            ax.set(xlabel="utilization", ylabel="fraction of the busy span", title=PAPER_NAMES[name])
            ax.grid(True, linewidth=0.4)
            ax.legend(fontsize=8)
        fig.suptitle("constraint-aware Figure 10: utilization, synthetic workloads (Random matching)")
        harness.save(fig, path)

    columns = [Column("workload"), Column("scheduler"), Column("steps", "count")]
    columns += [Column(f"utilization {s}", "share") for s in ("p10", "p50", "mean", "p90")]
    described = f"{_jobs_note(SYNTHETIC, Setup(setup.scale, (seed,)))}, Random matching"
    return Result(described, columns, rows, {}, draw)
