"""What one reproduced id produced and how it is written: its table as CSV and markdown, its figure as PNG, and
the paper's numbers beside ours (printed, and in the markdown page)."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from megha.sim.experiments import harness
from megha.sim.reproduce.catalogue import PAPERS, Entry
from megha.sim.reproduce.paper import Claim, claims

Kind = Literal["text", "seconds", "count", "share", "ratio", "number"]
COMPARISON_HEADER = ("what", "paper", "ours", "ours / paper", "holds", "where")


@dataclass(frozen=True, slots=True)
class Column:
    """A column of an id's table: its heading and how its values are shown in markdown."""

    name: str
    kind: Kind = "text"


@dataclass(slots=True)
class Result:
    """One id's outcome: `setup` (what ran, at this scale), its table, our figures keyed as the paper's claims
    (`paper.Claim.key`, optionally `key (variant)`), and `draw(path)`, which writes the figure."""

    setup: str
    columns: Sequence[Column]
    rows: list[Sequence[object]]
    ours: dict[str, float]
    draw: Callable[[Path], None]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Comparison:
    """A claim of the paper and our figure for it (NaN when this run did not measure it)."""

    claim: Claim
    variant: str
    ours: float

    @property
    def what(self) -> str:
        return f"{self.claim.key} ({self.variant})" if self.variant else self.claim.key

    @property
    def ratio(self) -> float:
        value = self.claim.value
        return self.ours / value if value and not math.isnan(self.ours) else math.nan

    def cells(self) -> tuple[str, ...]:
        holds = self.claim.holds(self.ours)
        shown = "" if holds is None else "yes" if holds else "no"
        paper = show(self.claim.value, self.claim.unit)
        paper = paper if self.claim.relation == "=" else f"{self.claim.relation} {paper}"
        ratio = "-" if math.isnan(self.ratio) else f"{self.ratio:.3g}"
        return (self.what, paper, show(self.ours, self.claim.unit), ratio, shown, self.claim.where)


def compare(figure: str, ours: dict[str, float]) -> list[Comparison]:
    """Each claim about `figure` with each of our figures for it (its variants), in the claims' order."""
    rows = []
    for claim in claims(figure):
        matched = [(k, v) for k, v in ours.items() if k == claim.key or k.startswith(f"{claim.key} (")]
        if not matched:
            rows.append(Comparison(claim, "", math.nan))
        rows += [Comparison(claim, key[len(claim.key) :].strip(" ()"), value) for key, value in matched]
    return rows


def show(value: object, kind: str) -> str:
    """A value as the tables show it: seconds as the experiments' pages do, shares as percents."""
    if isinstance(value, str):
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    number = float(value)  # type: ignore[arg-type]
    if kind in ("seconds", "s"):
        return harness.seconds(number)
    if kind == "share":
        return f"{100 * number:.1f}%"
    if kind == "count":
        return f"{number:,.0f}"
    if kind in ("ratio", "load", "number"):
        return f"{number:.4g}"
    return str(value)


def comparison_lines(comparisons: Sequence[Comparison]) -> list[str]:
    """The paper's numbers beside ours as a markdown table."""
    if not comparisons:
        return ["The paper's text states no number for this figure."]
    return harness.table(COMPARISON_HEADER, [c.cells() for c in comparisons])


def print_comparison(entry: Entry, comparisons: Sequence[Comparison], scale: str) -> None:
    """The paper's numbers beside ours on stdout, as aligned columns."""
    print(f"{entry.id}: {entry.caption} ({entry.label}, {scale})")
    if not comparisons:
        print("  the paper's text states no number for this figure; see the table written beside the figure")
        return
    cells = [COMPARISON_HEADER, *(c.cells() for c in comparisons)]
    widths = [max(len(row[k]) for row in cells) for k in range(len(COMPARISON_HEADER) - 1)]
    for row in cells:
        print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])


def write(
    entry: Entry,
    result: Result,
    comparisons: Sequence[Comparison],
    out: Path,
    command: str,
    provenance: str,
) -> list[Path]:
    """Write `out`/<id>.png, .csv (our table, raw values), -vs-paper.csv and .md; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    png, table, versus, page = (out / f"{entry.id}{suffix}" for suffix in (".png", ".csv", "-vs-paper.csv", ".md"))
    result.draw(png)
    with table.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([c.name for c in result.columns])
        writer.writerows(result.rows)
    with versus.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["what", "relation", "paper", "unit", "ours", "ours / paper", "holds"])
        for c in comparisons:
            holds = c.claim.holds(c.ours)
            verdict = "" if holds is None else holds
            writer.writerow([c.what, c.claim.relation, c.claim.value, c.claim.unit, c.ours, c.ratio, verdict])
    shown = [[show(value, column.kind) for value, column in zip(row, result.columns)] for row in result.rows]
    lines = [
        f"# {entry.id}: {entry.caption}",
        "",
        f"{PAPERS[entry.paper]}, {entry.label}. Produced by `{command}` {provenance}.",
        "",
        "## Set-up",
        "",
        entry.setup + ".",
        "",
        f"This run: {result.setup}.",
        "",
        *([f"Differs from the paper: {entry.differs}.", ""] if entry.differs else []),
        "## The paper's numbers beside ours",
        "",
        *comparison_lines(comparisons),
        "",
        *(line for note in result.notes for line in (note, "")),
        "## Our figures",
        "",
        *harness.table([c.name for c in result.columns], shown),
        "",
        f"![{entry.id}]({png.name})",
    ]
    page.write_text("\n".join(lines) + "\n")
    return [png, table, versus, page]
