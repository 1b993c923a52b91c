"""Benchmark: what the watch pays to count one exec run's disk (`disk_usage.disk_usage`), by the files and folders
the run keeps.

Makes a scratch folder of `--files` empty files in folders of 1,000 (in the system's temp folder, removed after),
then times a count of it `--repeat` times with the agent's bound (`--bound`, MEGHA_TASK_MAX_DISK_FILES): the cost
grows with the entries looked at, up to the bound. Results in docs/benchmarks.md.

    python bench/disk_watch.py --files 100000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from megha.services.worker.disk_usage import DiskPlaces, disk_usage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000, help="empty files in the scratch folder")
    parser.add_argument("--bound", type=int, default=100_000, help="files and folders looked at (default: 100000)")
    parser.add_argument("--repeat", type=int, default=10, help="timed counts (default: 10)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="megha-bench-disk-"))
    try:
        for i in range(args.files):
            folder = scratch / f"d{i // 1000}"
            if i % 1000 == 0:
                folder.mkdir()
            (folder / f"f{i}").touch()
        places = {("uid", os.geteuid()): DiskPlaces(os.geteuid(), str(scratch), shared=False)}
        times = []
        for _ in range(args.repeat):
            began = time.perf_counter()
            use = disk_usage(places, {}, [], args.bound)[("uid", os.geteuid())]
            times.append(time.perf_counter() - began)
    finally:
        shutil.rmtree(scratch)
    print(
        f"{args.files} files: one count {statistics.median(times) * 1000:.2f} ms (median of {args.repeat}), "
        f"{use.entries} entries looked at, {use.bytes / 2**20:.1f} MB"
    )


if __name__ == "__main__":
    main()
