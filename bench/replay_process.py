"""Benchmark: the wall time of the whole `megha replay` process (start-up, imports, replay, report files, exit).

Each run is a fresh process of `megha replay --quiet --out <tmp>` on the syn_250 experiment (its first 200 jobs on
the reference cluster) unless told otherwise. With `--against`, another build's `megha` (a checkout with its own
venv, say the code before a change) runs too, in interleaved rounds, since the machine's speed drifts between
minutes; every run's report files must then be the same as the first run's (summary.json without its wall-clock
figures and its command line), so a speed-up that changes a result is caught. `--breakdown` times the phases of
runs of this tree's code in process instead (wrapping the functions each phase calls), and the interpreter's
start-up and exit as the rest of the process's wall time.

    python bench/replay_process.py --repeat 7
    python bench/replay_process.py --repeat 7 --against ../before/.venv/bin/megha
    python bench/replay_process.py --breakdown --repeat 5
    python bench/replay_process.py --breakdown --python ../before/.venv/bin/python    # another build's phases
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
EXPERIMENT = [
    "--trace",
    str(SHARED / "traces" / "syn_250.0.tr"),
    "--first-jobs",
    "200",
    "--cluster",
    str(SHARED / "constraints" / "reference-cluster-10000-nodes.json"),
]
THIS_BUILD = str(Path(sys.executable).with_name("megha"))
VARYING = ("wall_seconds", "tasks_per_wall_second")  # summary.json's figures of the machine, not of the run
REPORT_FILES = ("tasks.csv", "jobs.csv", "utilization.csv", "cdf.png")

# The phases --breakdown times: label, then the functions (module:qualified name) whose calls it sums. Each is
# patched where the replay looks it up, so the command runs exactly as it does from the shell.
PHASES = (
    ("cluster file", ["megha.loadgen.replay:build_cluster"]),
    ("trace", ["megha.loadgen.replay:resolve_trace"]),
    ("GM, LM and worker cores", ["megha.loadgen.replay:build_system"]),
    ("workload (tasks, constraints)", ["megha.loadgen.replay:build_workload"]),
    (
        "records and submissions",
        ["megha.loadgen.recorder:Recorder.expect", "megha.embedded.wiring:SimulatedSystem.submit"],
    ),
    ("event loop", ["megha.embedded.system:EmbeddedSystem.run"]),
    ("metrics", ["megha.loadgen.replay:compute_metrics"]),
    ("tasks.csv", ["megha.loadgen.report:_write_tasks"]),
    ("jobs.csv", ["megha.loadgen.report:_write_jobs"]),
    ("utilization.csv", ["megha.loadgen.report:_write_utilization"]),
    ("report files", ["megha.loadgen.report:write_outputs"]),
)
BREAKDOWN_CHILD = """
import atexit, gc, importlib, json, sys, time
(module, attr), phases, spent_file = sys.argv[1].split(":"), json.loads(sys.argv[2]), sys.argv[3]
sys.argv[1:] = sys.argv[4:]
start = time.perf_counter()
command = getattr(importlib.import_module(module), attr)  # as the `megha` executable does
spent = {"imports": time.perf_counter() - start, "garbage collection (in process)": 0.0}
collection_began = [0.0]

def collections(phase, info):
    if phase == "start":
        collection_began[0] = time.perf_counter()
    else:
        spent["garbage collection (in process)"] += time.perf_counter() - collection_began[0]

def timed(function, label):
    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - began
    return wrapper

@atexit.register
def done():
    spent["in process"] = time.perf_counter() - start
    with open(spent_file, "w") as handle:
        json.dump(spent, handle)

for label, targets in phases:
    for target in targets:
        module, _, path = target.partition(":")
        owner = importlib.import_module(module)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        setattr(owner, name, timed(getattr(owner, name), label))
gc.callbacks.append(collections)
sys.exit(command())
"""


def run_command(megha: str, out: Path, extra: list[str]) -> dict[str, float]:
    """One fresh `megha replay` process: its wall time, CPU time and peak RSS."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [megha, "replay", *EXPERIMENT, *extra, "--quiet", "--out", str(out)], check=True, stdout=subprocess.DEVNULL
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"wall": wall, "cpu": cpu, "rss_mb": after.ru_maxrss / 1024}


def report_of(out: Path) -> dict[str, object]:
    """What must not change between builds: the files' bytes, summary.json but for its wall-clock figures, and the
    replay's options (summary.json's `config`, apart: see `same_report`)."""
    summary = json.loads((out / "summary.json").read_text())
    for key in VARYING:
        summary.pop(key)
    summary["extra"].pop("command")  # names the --out folder
    options = summary["extra"].pop("config", {})
    files = {name: (out / name).read_bytes() for name in REPORT_FILES if name != "cdf.png"}
    return {"summary": summary, "options": options, **files}


def same_report(a: dict[str, object], b: dict[str, object]) -> bool:
    """Two builds' reports are the same: the same files and summary, and the same replay options but for those only
    one build has (a newer build's new option, at a default that changes nothing, as the files then show)."""
    options: list[dict[str, object]] = [a["options"], b["options"]]  # type: ignore[list-item]
    shared = options[0].keys() & options[1].keys()
    return {**a, "options": None} == {**b, "options": None} and all(options[0][k] == options[1][k] for k in shared)


def compare(args: argparse.Namespace) -> int:
    builds = {"this tree": THIS_BUILD, **{f"against {i + 1}": path for i, path in enumerate(args.against)}}
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in builds}
    reference: dict[str, object] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeat):
            order = list(builds.items())
            if round_ % 2:
                order.reverse()  # neither build always runs first
            for label, megha in order:
                out = Path(tmp) / f"{label}-{round_}"
                runs[label].append(run_command(megha, out, args.extra))
                report = report_of(out)
                if reference is None:
                    reference = report
                elif not same_report(report, reference):
                    differing = [key for key in report if report[key] != reference[key]]
                    print(f"{label}, round {round_ + 1}: the report differs in {differing}", file=sys.stderr)
                    return 1
                shutil.rmtree(out)
                print(f"  round {round_ + 1} {label}: {runs[label][-1]['wall']:.2f} s", file=sys.stderr)
    print(machine())
    print()
    print("| build | runs | wall s (median) | wall s (best) | CPU s (median) | peak RSS MB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, megha in builds.items():
        walls = [r["wall"] for r in runs[label]]
        print(
            f"| {label} (`{megha}`) | {len(walls)} | {statistics.median(walls):.2f} | {min(walls):.2f} | "
            f"{statistics.median(r['cpu'] for r in runs[label]):.2f} | {max(r['rss_mb'] for r in runs[label]):.0f} |"
        )
    print()
    print("every run's report files are the same (summary.json but for its wall-clock figures)")
    return 0


def breakdown(args: argparse.Namespace) -> int:
    phases = json.dumps(PHASES)
    look_up = "from importlib.metadata import entry_points; print(entry_points(group='console_scripts')['megha'].value)"
    samples: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        # Children run in `tmp`: `python -c` puts its working directory first on sys.path, and a checkout's
        # megha/ or megha.egg-info there would shadow the build being timed.
        found = subprocess.run([args.python, "-c", look_up], capture_output=True, text=True, check=True, cwd=tmp)
        script = found.stdout.strip()
        for i in range(args.repeat):
            spent_file, out = Path(tmp) / f"spent-{i}.json", Path(tmp) / f"out-{i}"
            command = [args.python, "-c", BREAKDOWN_CHILD, script, phases, str(spent_file), "replay", *EXPERIMENT]
            command += [*args.extra, "--quiet", "--out", str(out)]
            start = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=tmp)
            spent = json.loads(spent_file.read_text())
            spent["wall"] = time.perf_counter() - start
            samples.append(spent)
            print(f"  run {i + 1}: {spent['wall']:.2f} s", file=sys.stderr)
    median = {key: statistics.median(s.get(key, 0.0) for s in samples) for key in samples[0]}
    files = [label for label, _ in PHASES if label.endswith(".csv")]
    rows = [("interpreter start-up and exit", median["wall"] - median["in process"]), ("imports", median["imports"])]
    rows += [(label, median.get(label, 0.0)) for label, _ in PHASES if label != "report files"]
    rows.append(("cdf.png and summary.json", median["report files"] - sum(median.get(label, 0.0) for label in files)))
    rows.append(("the rest (command line, report table)", median["wall"] - sum(seconds for _, seconds in rows)))
    print(machine() + f", `{args.python}`, median of {len(samples)} runs")
    print()
    print("| phase | s | share |")
    print("| --- | --- | --- |")
    for label, seconds in rows:
        print(f"| {label} | {seconds:.3f} | {100 * seconds / median['wall']:.0f}% |")
    print(f"| **whole process** | **{median['wall']:.3f}** | |")
    print(f"| of which garbage collection (in process) | {median['garbage collection (in process)']:.3f} | |")
    return 0


def machine() -> str:
    return (
        f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="runs (rounds with --against)")
    parser.add_argument("--against", action="append", default=[], metavar="MEGHA", help="another build's megha")
    parser.add_argument("--breakdown", action="store_true", help="time the phases of this tree's runs")
    parser.add_argument("--python", default=sys.executable, help="with --breakdown: the Python of the build to time")
    parser.add_argument("extra", nargs="*", help="more `megha replay` options, after --")
    args = parser.parse_args()
    if not Path(EXPERIMENT[1]).exists():
        print(f"needs ../shared (traces and reference cluster); missing {EXPERIMENT[1]}", file=sys.stderr)
        return 2
    return breakdown(args) if args.breakdown else compare(args)


if __name__ == "__main__":
    sys.exit(main())
