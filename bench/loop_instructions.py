"""Benchmark helper: the instructions of a replay's event loop alone, counted by callgrind.

Runs one syn_250 replay in process (its first `--first-jobs` jobs on the reference cluster, rarity LM order and
node choice unless told otherwise) and enters the event loop through a ctypes callback, so that callgrind, told to
count only inside that callback, counts the loop (GMs, LMs, workers, recorder) and nothing of the imports, the
workload or the metrics. Instruction counts do not depend on the machine's load, unlike wall times:

    PYTHONHASHSEED=0 valgrind --tool=callgrind --collect-atstart=no --toggle-collect=_CallPythonObject \\
        --callgrind-out-file=/tmp/loop.%p.out <build>/.venv/bin/python bench/loop_instructions.py --first-jobs 40

Compare builds with their bytecode in the same state (both compiled, or neither: `PYTHONDONTWRITEBYTECODE=1`).
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path
from typing import Any

from megha.common.transport import inmemory
from megha.loadgen.replay import ReplayConfig, replay

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first-jobs", type=int, default=40)
    parser.add_argument("--lm-order", default="rarity")
    parser.add_argument("--matching", default="rarity")
    args = parser.parse_args()
    loop = inmemory.EventLoop._loop

    def counted_loop(self: inmemory.EventLoop, *rest: Any) -> None:
        ctypes.CFUNCTYPE(None)(lambda: loop(self, *rest))()  # callgrind counts inside _CallPythonObject only

    inmemory.EventLoop._loop = counted_loop  # type: ignore[method-assign]
    result = replay(
        ReplayConfig(
            trace=str(SHARED / "traces" / "syn_250.0.tr"),
            first_jobs=args.first_jobs,
            cluster="reference",
            lm_order=args.lm_order,
            matching=args.matching,
        )
    )
    print(f"{result.metrics.tasks_completed} tasks completed")


if __name__ == "__main__":
    main()
