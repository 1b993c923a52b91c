"""Benchmark: what the end of an exec run with a `workdir` pays to hand what its uid left there to the agent's
user (`isolation.disown`), by the entries it looks at.

Makes a workdir (in the system's temp folder, removed after) of `--files` empty files in folders of 1,000 that every
user may write to, a `--mine` share of them owned by a task uid, then times one hand-over of it `--repeat` times
(each time the files are given back to the uid first, not timed). Needs root (it changes owners). Results in
docs/benchmarks.md.

    python bench/workdir_handover.py --files 100000 --mine 0.1
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from megha.services.worker.isolation import disown

UID = 900_000_999  # the last of MEGHA_TASK_UIDS' default range


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000, help="empty files in the workdir")
    parser.add_argument("--mine", type=float, default=0.1, help="share of them the run's uid owns (default 0.1)")
    parser.add_argument("--repeat", type=int, default=5, help="timed hand-overs (default: 5)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/workdir_handover.py: run it as root (it changes the owner of files)")
    workdir = Path(tempfile.mkdtemp(prefix="megha-bench-workdir-"))
    try:
        folders = []
        for i in range(args.files):
            if i % 1000 == 0:
                folders.append(workdir / f"d{i // 1000}")
                folders[-1].mkdir(mode=0o777)
                folders[-1].chmod(0o777)
            (folders[-1] / f"f{i}").touch()
        step = max(1, round(1 / args.mine)) if args.mine > 0 else 0
        mine = [folders[i // 1000] / f"f{i}" for i in range(0, args.files, step)] if step else []
        times = []
        for _ in range(args.repeat):
            for path in mine:
                os.chown(path, UID, UID)
            began = time.perf_counter()
            why = disown(str(workdir), UID, args.files + len(folders) + 1)
            times.append(time.perf_counter() - began)
            assert why is None, why
        entries = args.files + len(folders)
        median = statistics.median(times)
        print(
            f"{entries} entries looked at, {len(mine)} handed over: median {median * 1000:.1f} ms of {args.repeat} "
            f"(best {min(times) * 1000:.1f} ms), {median / entries * 1e6:.2f} us per entry"
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
