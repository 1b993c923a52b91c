"""`megha reproduce`: a figure or table of the two Megha papers, run on the simulator (fair-fig12: the real services
on this machine beside it) with the paper's set-up as closely as the shared data allow, written under
docs/results/<id>.* and compared with the paper's numbers.

The ids, their set-ups and the papers' numbers live in megha.sim.reproduce (imported when an id runs).
docs/reproduce.md describes the command, the quick scale and how long each id takes.
"""

from __future__ import annotations

from pathlib import Path

import click

from megha.sim.reproduce.catalogue import BY_ID, ENTRIES
from megha.sim.reproduce.setup import SCALES, Setup

EPILOG = """\b
examples:
  megha reproduce list                      # every id, its set-up and how it differs from the paper's
  megha reproduce fair-fig3 --quick         # one id at the reduced scale (each under 5 minutes)
  megha reproduce constraints-fig6 --seeds 3 --out /tmp/repro
  megha reproduce all --quick               # every id, in turn

\b
output:
  <id>.png (the figure), <id>.csv and <id>.md (our table; the page also holds the paper's numbers beside ours),
  <id>-vs-paper.csv, in docs/results or --out; the paper's numbers beside ours, with the ratio, on stdout;
  progress on stderr.

\b
exit status: 0 done; 1 fair-fig12 (the real services) did not run: RabbitMQ did not answer at MEGHA_AMQP_URL,
  a service did not start, or tasks were not completed exactly once (one line says where and why, and where the
  services' logs are kept); 2 bad usage, an unknown id (the known ids are named) or an --out folder that
  cannot be made
"""


def listing() -> str:
    """Every id: the paper's caption, the set-up we run, what --quick cuts, and how it differs from the paper."""
    lines = []
    for entry in ENTRIES:
        lines += [f"{entry.id} ({entry.label}): {entry.caption}", f"    set-up: {entry.setup}"]
        if entry.quick:
            lines.append(f"    --quick: {entry.quick}")
        lines += [f"    reproduced: {entry.status}", ""]
    return "\n".join(lines).rstrip()


@click.command(
    short_help="run a figure or table of the Megha papers on the simulator, beside the paper's numbers", epilog=EPILOG
)
@click.argument("what", metavar="ID|list|all")
@click.option("--quick", is_flag=True, help="the reduced scale (docs/reproduce.md): each id in under 5 minutes")
@click.option(
    "--scale",
    type=click.Choice(SCALES),
    help="full (the paper's set-up, the default), quick (as --quick) or tiny (seconds; for tests: its figures mean "
    "nothing)",
)
@click.option("--seeds", type=click.IntRange(min=1), help="run seeds 0 .. N-1 (default: 3 at full scale, 1 otherwise)")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="folder for <id>.png, .csv, .md and -vs-paper.csv (default: docs/results)",
)
def reproduce(what: str, quick: bool, scale: str | None, seeds: int | None, out: Path | None) -> int:
    """Run ID (e.g. fair-fig3, constraints-table1) as the paper set it up, as closely as the shared traces and
    data allow, and print the paper's numbers beside ours; `list` names every id, `all` runs each in turn."""
    if what == "list":
        click.echo(listing())
        return 0
    if what != "all" and what not in BY_ID:
        return _error(f"unknown id {what!r}; known ids: {', '.join(BY_ID)} (or list, all)")
    if quick and scale not in (None, "quick"):
        return _error(f"--quick and --scale {scale} disagree; give one")
    setup = Setup.of("quick" if quick else scale or "full", seeds)
    from megha.common.transport.rabbit import BrokerUnavailable
    from megha.sim.experiments.harness import RESULTS
    from megha.sim.reproduce.runner import reproduce as run
    from megha.sim.reproduce.runner import reproduce_all

    command = " ".join(
        ["megha reproduce", what]
        + (["--quick"] if setup.scale == "quick" else [] if setup.scale == "full" else ["--scale", setup.scale])
        + ([] if seeds is None else ["--seeds", str(seeds)])
        + ([] if out is None else ["--out", str(out)])
    )
    folder = RESULTS if out is None else out
    try:  # made before the runs, so a folder that cannot be made is said at once, not after hours of replays
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return _error(f"--out {folder}: cannot make the folder: {exc.strerror}")
    if what == "all":
        return 1 if reproduce_all(setup, folder, command) else 0
    from megha.sim.reproduce.prototype import PrototypeFailed

    try:
        run(what, setup, folder, command)
    except (BrokerUnavailable, PrototypeFailed) as exc:
        return _error(str(exc), 1)
    return 0


def _error(message: str, status: int = 2) -> int:
    click.echo(f"megha reproduce: error: {message}", err=True)
    return status
