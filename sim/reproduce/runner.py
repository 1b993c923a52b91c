"""Running ids: one (`reproduce`), each runnable one in turn (`reproduce_all`), and the commit a page names."""

from __future__ import annotations

import importlib
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from megha.sim.experiments import harness
from megha.sim.reproduce.catalogue import ENTRIES, Entry, entry
from megha.sim.reproduce.result import Comparison, Result, compare, print_comparison, write
from megha.sim.reproduce.setup import Setup


def runner_of(item: Entry) -> Callable[[Setup], Result]:
    module, function = item.runner.split(".")
    return getattr(importlib.import_module(f"megha.sim.reproduce.{module}"), function)


def reproduce(figure: str, setup: Setup, out: Path, command: str) -> list[Comparison]:
    """Run `figure`'s set-up at `setup`'s scale, write its files to `out`, print the paper's numbers beside ours.
    KeyError for an unknown id (naming the known ones); BrokerUnavailable, before anything runs, for an id of the
    real services when RabbitMQ does not answer."""
    item = entry(figure)
    if item.real_services:
        from megha.sim.reproduce.prototype import require_broker

        require_broker()
    harness.progress(f"{figure}: {item.caption} ({setup.describe()})")
    start = time.perf_counter()
    result = runner_of(item)(setup)
    comparisons = compare(figure, result.ours)
    wall = time.perf_counter() - start
    provenance = (
        f"at commit {commit()} ({setup.describe()}) in {wall:,.0f} s of wall time on {harness.machine()}; replays "
        "an earlier id of the same command had run are not run again nor counted"
    )
    paths = write(item, result, comparisons, out, command, provenance)
    print_comparison(item, comparisons, setup.describe())
    harness.progress(f"{figure}: {wall:,.0f} s; wrote {', '.join(str(p) for p in paths)}")
    return comparisons


def reproduce_all(setup: Setup, out: Path, command: str) -> list[str]:
    """Every id, in catalogue order (replays shared by several ids run once); returns the ids of the real services
    that did not run, because RabbitMQ did not answer or the services failed (each said so on stderr)."""
    from megha.common.transport.rabbit import BrokerUnavailable
    from megha.sim.reproduce.prototype import PrototypeFailed

    start = time.perf_counter()
    missed = []
    for item in ENTRIES:
        try:
            reproduce(item.id, setup, out, command)
        except (BrokerUnavailable, PrototypeFailed) as exc:
            harness.progress(f"{item.id}: not run: {exc}")
            missed.append(item.id)
            continue
        print()
    not_run = f"; not run: {', '.join(missed)}" if missed else ""
    harness.progress(f"all: {time.perf_counter() - start:,.0f} s of wall time{not_run}")
    return missed


def commit() -> str:
    """The repository's commit, with "+changes" when tracked files differ from it; "unknown" outside git."""
    root = harness.ROOT
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}+changes" if changed else head
