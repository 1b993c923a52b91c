"""Benchmark helper: how many node states the GMs' views take in during a replay.

Runs one syn_250 replay in process (its first `--first-jobs` jobs on the reference cluster, `megha replay`'s
defaults: rarity LM order and node choice) and counts, over every GM, the LM messages whose node states a view
holds (`GlobalView.hold_states`), the states held, the syncs that adopt them into the partition views
(`GlobalView.sync`) and the states adopted (a held state overtaken by a newer one of the same node before a sync is
adopted once). What each costs is in docs/benchmarks.md ("Where the loop's time goes").

    python bench/view_states.py --first-jobs 200
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from megha.common.core.global_view import GlobalView
from megha.common.core.messages import NodeState
from megha.loadgen.replay import ReplayConfig, replay

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first-jobs", type=int, default=200)
    args = parser.parse_args()
    counts: Counter[str] = Counter()
    hold, sync = GlobalView.hold_states, GlobalView.sync

    def counted_hold(self: GlobalView, lm: int, states: Iterable[NodeState], applied_through: int) -> None:
        states = list(states)
        counts["messages held"] += 1
        counts["states held"] += len(states)
        hold(self, lm, states, applied_through)

    def counted_sync(self: GlobalView) -> None:
        counts["syncs"] += 1
        counts["states adopted"] += sum(map(len, self._unapplied_states))
        sync(self)

    GlobalView.hold_states = counted_hold  # type: ignore[method-assign]
    GlobalView.sync = counted_sync  # type: ignore[method-assign]
    result = replay(ReplayConfig(trace=str(SHARED / "traces" / "syn_250.0.tr"), first_jobs=args.first_jobs,
                                 cluster="reference", lm_order="rarity", matching="rarity"))  # fmt: skip
    tasks = result.metrics.tasks_completed
    print(f"{tasks:,} tasks completed")
    for name, n in counts.items():
        print(f"{name}: {n:,}" + (f" ({n / tasks:.1f} a task)" if "states" in name and tasks else ""))


if __name__ == "__main__":
    main()
