"""One replay under several seeds, as the papers report a mean over three: each seed's headline figures (p50 and p99
JRT delay, p99 allocation time), their mean and their range."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from megha.loadgen.metrics import RunMetrics
from megha.loadgen.report import format_seconds

HEADLINES: dict[str, Callable[[RunMetrics], float]] = {
    "JRT delay p50": lambda m: m.jrt_delay.median,
    "JRT delay p99": lambda m: m.jrt_delay.p99,
    "allocation time p99": lambda m: m.allocation_time.p99,
}
"""The figures compared across seeds, in seconds, by name."""


@dataclass(frozen=True, slots=True)
class SeedFigures:
    """The headline figures of one replay per seed: `values[name][i]` is figure `name` of seed `seeds[i]`."""

    seeds: tuple[int, ...]
    values: dict[str, tuple[float, ...]]

    @classmethod
    def of(cls, runs: Sequence[tuple[int, RunMetrics]]) -> SeedFigures:
        """The figures of `runs`, (seed, metrics) each."""
        return cls(
            tuple(seed for seed, _ in runs),
            {name: tuple(figure(m) for _, m in runs) for name, figure in HEADLINES.items()},
        )

    def mean(self, name: str) -> float:
        """The mean over the seeds that measured the figure (NaN when none did)."""
        measured = [v for v in self.values[name] if not math.isnan(v)]
        return statistics.fmean(measured) if measured else math.nan

    def range(self, name: str) -> tuple[float, float]:
        """(min, max) over the seeds that measured the figure (NaNs when none did)."""
        measured = [v for v in self.values[name] if not math.isnan(v)]
        return (min(measured), max(measured)) if measured else (math.nan, math.nan)

    def table(self) -> str:
        """A row per seed, then the mean and the min - max of each figure."""
        names = list(HEADLINES)
        rows = [[f"seed {s}", *(format_seconds(self.values[n][i]) for n in names)] for i, s in enumerate(self.seeds)]
        rows.append(["mean", *(format_seconds(self.mean(n)) for n in names)])
        rows.append(["min - max", *(_span(*self.range(n)) for n in names)])
        header = ["", *names]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        lines = [
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
            for row in [header, *rows]
        ]
        title = f"{len(self.seeds)} seeds"
        return "\n".join([title, "=" * len(title), *lines]) + "\n"

    def document(self) -> dict[str, object]:
        """The figures as JSON-ready data (seeds.json): per figure, each seed's value, the mean, min and max (null:
        not measured)."""
        return {
            "seeds": list(self.seeds),
            "figures_seconds": {
                name: {
                    "by_seed": [_number(v) for v in self.values[name]],
                    "mean": _number(self.mean(name)),
                    "min": _number(self.range(name)[0]),
                    "max": _number(self.range(name)[1]),
                }
                for name in HEADLINES
            },
        }


def _span(low: float, high: float) -> str:
    return "-" if math.isnan(low) else f"{format_seconds(low)} - {format_seconds(high)}"


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value
