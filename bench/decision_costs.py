"""Benchmark: what the real GM and LM cores cost per job, task, message, node state, placement and item.

Replays a trace in embedded mode (zero decision costs) and times (thread CPU time), in-process, every call of
GlobalMaster.submit / handle and LocalMaster.handle on the messages the run produces. The run is deterministic, so
each message is the same in every repeat: its time is its minimum over `--repeat` runs (the machine is shared).
Each field of `DecisionCosts` is then fitted by least squares (no negative coefficient), a GM's and an LM's
separately, using as features what the model counts in each message, and the fit is printed as the `CALIBRATED`
to paste into common/core/costs.py.

    python bench/decision_costs.py                                  # GOOG_subtrace, first 300 jobs, reference
    python bench/decision_costs.py --trace syn:250:100 --repeat 5
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import time
from dataclasses import fields
from pathlib import Path

import numpy as np

import megha.embedded.system as embedded_system
from megha.common.core.costs import DecisionCosts, Kind
from megha.common.core.messages import Output
from megha.common.transport.inmemory import EventLoop, Handler
from megha.loadgen.replay import ReplayConfig, replay

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
FIELDS: dict[Kind, list[str]] = {
    kind: [f.name for f in fields(DecisionCosts) if f.name.startswith(kind)] for kind in ("gm", "lm")
}


class TimedLoop(EventLoop):
    """An event loop that times every handling of a message by a GM or LM core (and what the model counts in it)."""

    samples: list[tuple[Kind, object, float]] = []  # (kind, message, seconds), in handling order

    def register(self, address: str, handler: Handler, kind: Kind | None = None) -> None:
        super().register(address, handler if kind is None else _timed(handler, kind, self.samples), kind)


def _timed(handler: Handler, kind: Kind, samples: list[tuple[Kind, object, float]]) -> Handler:
    clock = time.thread_time  # CPU time: a shared machine's other work does not count

    def timed(msg: object, now: float) -> list[Output]:
        start = clock()
        outputs = handler(msg, now)
        samples.append((kind, msg, clock() - start))
        return outputs

    return timed


def features(kind: Kind, msg: object) -> list[float]:
    """What the model counts in `msg`: the cost under each field of `kind` set to 1 alone."""
    return [DecisionCosts(**{name: 1.0}).cost(kind, msg) for name in FIELDS[kind]]


def fit(kind: Kind, rows: list[list[float]], seconds: list[float]) -> dict[str, float]:
    """Least squares without negative coefficients: a field fitted below 0 is set to 0 and the rest fitted again."""
    x, y = np.array(rows), np.array(seconds)
    active = [i for i in range(x.shape[1]) if x[:, i].any()]
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        negative = [active[i] for i, c in enumerate(coef) if c < 0]
        if not negative:
            break
        active = [i for i in active if i not in negative]
    fitted = dict.fromkeys(FIELDS[kind], 0.0)
    fitted.update({FIELDS[kind][i]: float(c) for i, c in zip(active, coef, strict=True)})
    return fitted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=str(SHARED / "traces" / "GOOG_subtrace.tr"))
    parser.add_argument("--first-jobs", type=int, default=300)
    parser.add_argument("--cluster", default="reference")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    config = ReplayConfig(trace=args.trace, first_jobs=args.first_jobs, cluster=args.cluster)
    embedded_system.EventLoop = TimedLoop  # type: ignore[misc]  # the system builds its loop by this name
    best: list[float] = []
    messages: list[tuple[Kind, object]] = []
    for _ in range(args.repeat):
        TimedLoop.samples = []
        replay(config)
        run = TimedLoop.samples
        if not best:
            messages = [(kind, msg) for kind, msg, _ in run]
            best = [s for *_, s in run]
        elif len(run) != len(best):
            raise SystemExit("the runs handled different messages: the replay is not deterministic")
        else:
            best = [min(a, s) for a, (*_, s) in zip(best, run, strict=True)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(
        f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}, commit {commit}; {args.trace} (first {args.first_jobs} jobs) on "
        f"{args.cluster}, min of {args.repeat} runs"
    )
    fitted: dict[str, float] = {}
    for kind in ("gm", "lm"):
        picked = [(features(kind, m), s) for (k, m), s in zip(messages, best, strict=True) if k == kind]
        rows, seconds = [r for r, _ in picked], [s for _, s in picked]
        fitted |= fit(kind, rows, seconds)
        print(f"{kind}: {len(picked):,} messages, {sum(seconds):.3f} s handling in all")
    print("\n| field | microseconds |\n| --- | --- |")
    for name, value in fitted.items():
        print(f"| {name} | {value * 1e6:.2f} |")
    print("\nCALIBRATED = DecisionCosts(" + ", ".join(f"{k}={v:.3g}" for k, v in fitted.items()) + ")")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
