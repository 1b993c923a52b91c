"""Benchmark: the services' send path, `core_json` of a LaunchBatch of 1,000 placements, and its receive path
(validating that JSON into the wire model and converting it back to core objects).

    python bench/wire_encode.py --placements 1000 --repeat 7
    python bench/wire_encode.py --before 4bd298c    # also the common/models.py of that commit, alternately

Prints the best of `--repeat` timeit rounds per operation, in microseconds per batch. With `--before`, the
`common/models.py` of that commit is loaded beside the current one (it must write the same bytes) and both are
timed in turn, twice, so that other load on the machine falls on both.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from types import ModuleType

from megha.common import models
from megha.common.core.constraints import constraint_mask
from megha.common.core.messages import LaunchBatch, Placement
from megha.common.core.task import TaskSpec


def batch(placements: int) -> LaunchBatch:
    """A batch as a GM sends it: burn tasks with a few constraints each, on distinct nodes of one LM."""
    tasks = (
        TaskSpec(f"job-{i // 10}.{i % 10}", f"job-{i // 10}", "alice", 12.5, (500, 1024), constraint_mask([1, 4, 7]))
        for i in range(placements)
    )
    return LaunchBatch(0, 1, 42, [Placement(t, 1, i, i % 5 == 0, 0) for i, t in enumerate(tasks)])


def models_at(rev: str) -> ModuleType:
    """The `common/models.py` of commit `rev`, imported under another name."""
    root = Path(__file__).resolve().parents[1]
    source = subprocess.run(["git", "show", f"{rev}:common/models.py"], cwd=root, check=True, capture_output=True)
    path = Path(tempfile.mkdtemp()) / f"models_{rev}.py"
    path.write_bytes(source.stdout)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--placements", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=50)
    parser.add_argument("--before", metavar="REV", help="also time the common/models.py of this commit")
    args = parser.parse_args()
    obj = batch(args.placements)
    raw = models.core_json(obj)
    versions = {"now": models}
    if args.before:
        versions = {args.before: models_at(args.before), "now": models}
        assert versions[args.before].core_json(obj) == raw, "the two versions write different JSON"
    print(f"LaunchBatch of {args.placements} placements, {len(raw):,} bytes; python {platform.python_version()}")
    for _ in range(2 if args.before else 1):
        for version, m in versions.items():
            operations = {
                "core_json (send)": lambda m=m: m.core_json(obj),
                "validate + to_core (receive)": lambda m=m: m.LaunchBatchModel.model_validate_json(raw).to_core(),
            }
            for name, op in operations.items():
                best = min(timeit.repeat(op, number=args.number, repeat=args.repeat)) / args.number
                print(f"{version:>8}  {name:30} {best * 1e6:10.0f} us")


if __name__ == "__main__":
    main()
