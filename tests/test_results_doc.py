"""docs/results.md names, for each experiment and each reproduced figure of the papers, the command that produced
its page: they must agree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results.md"


def experiment_rows() -> list[tuple[str, Path]]:
    """(command, page) from the table of experiments at the top of docs/results.md (an experiment module, or
    `megha reproduce` for a figure of the papers)."""
    rows = []
    for line in RESULTS.read_text().splitlines():
        command = r"`(python -m megha\.sim\.experiments\.[^`]+|megha reproduce [^`]+)`"
        match = re.match(r"\| [^|]+ \| " + command + r" \| \[[^]]+\]\(([^)]+)\) \|", line)
        if match:
            rows.append((match.group(1), RESULTS.parent / match.group(2)))
    return rows


def test_every_experiment_page_was_produced_by_the_command_results_md_names() -> None:
    rows = experiment_rows()
    assert len(rows) >= 6
    for command, page in rows:
        assert page.exists(), page
        produced = re.search(r"Produced by `([^`]+)`", page.read_text())
        assert produced is not None, page
        assert produced.group(1) == command, (page.name, produced.group(1), command)


def test_every_results_page_is_summarised_in_results_md() -> None:
    linked = {page.name for _, page in experiment_rows()}
    pages = {p.name for p in (RESULTS.parent / "results").glob("*.md")}
    assert pages <= linked, pages - linked
