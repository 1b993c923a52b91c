"""The program one task runs: hold M MB of touched memory and burn C/1000 x D CPU-seconds, then report as JSON.

    python -m megha.services.worker.burn --cpu-millicores C --memory-mb M --duration D

This is the prototype's task model from the Megha paper (section VI-F): a task has finished only once it has
consumed the resources it asked for, so a task asking 500 millicores for 2 s is done after 1 CPU-second, and
interference from co-located tasks makes it run longer than its duration (the "execution delay").

- Memory: M MB are allocated (a bytearray) and every page is written before any CPU is burnt, and held to the end.
- CPU is measured as process CPU time (user + system, children included), never wall time. Each burning process
  spins in ~10 ms slices and sleeps while it is ahead of an even spread of its share over the duration; when it
  is slowed down it never sleeps and simply keeps going until its share is consumed. The process also stays
  alive (holding its memory) until the duration has passed.
- Above 1000 millicores, ceil(C/1000) processes burn (this one plus forked children, which do not share a GIL),
  each an equal share of the CPU-seconds; the report includes the children's CPU time.
- The last line on stdout is one JSON object: cpu_seconds, wall_seconds, memory_mb_touched, peak_rss_mb
  (peak resident set of this process). Exit code 0.
- SIGTERM (preemption) stops the children, prints the report of what was consumed so far and exits with 143.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import resource
import signal
import sys
import time
from collections.abc import Sequence

from megha.common.argtypes import non_negative_float, non_negative_int
from megha.common.usage import OneLineParser

SLICE_SECONDS = 0.01
SPIN_STEPS = 1000
SIGTERM_EXIT_CODE = 128 + signal.SIGTERM


class Preempted(Exception):
    """Raised in the main process when SIGTERM arrives."""


def _raise_preempted(signum: int, frame: object) -> None:
    raise Preempted


def touch_memory(megabytes: int) -> bytearray:
    """Allocate `megabytes` MB and write one byte in every page so that all of it is resident."""
    buffer = bytearray(megabytes * 1024 * 1024)
    buffer[:: mmap.PAGESIZE] = b"\x01" * len(range(0, len(buffer), mmap.PAGESIZE))
    return buffer


def _spin() -> int:
    """Some tens of microseconds of user-space work between reads of the CPU clock (itself a system call)."""
    total = 0
    for i in range(SPIN_STEPS):
        total += i
    return total


def burn(cpu_seconds: float, deadline: float) -> None:
    """Spin until this process's CPU time reaches `cpu_seconds`, spread evenly until the monotonic `deadline`.

    The process sleeps while it is ahead of the even spread; behind it (slowed down by other load, or past the
    deadline) it burns flat out until the CPU time is reached.
    """
    cpu_start = time.process_time()
    wall_start = time.monotonic()
    span = deadline - wall_start
    budget = cpu_seconds - cpu_start
    while (used := time.process_time()) < cpu_seconds:
        if span > 0:
            allowed = cpu_start + budget * min(1.0, (time.monotonic() - wall_start) / span)
            if used > allowed:
                time.sleep((used - allowed) * span / budget)
                continue
        slice_end = min(used + SLICE_SECONDS, cpu_seconds)
        while time.process_time() < slice_end:
            _spin()


def _fork_burner(cpu_seconds: float, deadline: float) -> int:
    """Fork a child that burns `cpu_seconds` of its own CPU time by `deadline`; return its pid."""
    # SIGTERM stays blocked across the fork so the parent records the pid and the child restores the default
    # action before either can be interrupted.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    pid = os.fork()
    if pid == 0:
        exit_code = 1
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            burn(cpu_seconds, deadline)
            exit_code = 0
        finally:
            os._exit(exit_code)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    return pid


def _reap(children: set[int]) -> list[int]:
    """Wait for every child; return the exit codes of those that failed (negative: killed by that signal)."""
    failures = []
    for pid in sorted(children):
        _, status = os.waitpid(pid, 0)
        children.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            failures.append(code)
    return failures


def _stop(children: set[int]) -> None:
    """Kill and reap the children (not reaped yet, so their pids are still theirs)."""
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    for pid in sorted(children):
        os.waitpid(pid, 0)
    children.clear()


def _report(wall_start: float, memory_mb: int) -> dict[str, float | int]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss_unit = 1024 * 1024 if sys.platform == "darwin" else 1024  # ru_maxrss is in bytes on macOS, KiB on Linux
    return {
        "cpu_seconds": round(own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime, 4),
        "wall_seconds": round(time.monotonic() - wall_start, 4),
        "memory_mb_touched": memory_mb,
        "peak_rss_mb": round(own.ru_maxrss / rss_unit, 1),
    }


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m megha.services.worker.burn", description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-millicores", type=non_negative_int, required=True)
    parser.add_argument("--memory-mb", type=non_negative_int, required=True)
    parser.add_argument("--duration", type=non_negative_float, required=True, help="seconds")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    wall_start = time.monotonic()
    deadline = wall_start + args.duration
    signal.signal(signal.SIGTERM, _raise_preempted)
    children: set[int] = set()
    memory_mb = 0
    try:
        memory = touch_memory(args.memory_mb)
        memory_mb = args.memory_mb
        burners = max(1, math.ceil(args.cpu_millicores / 1000))
        share = args.cpu_millicores / 1000 * args.duration / burners
        for _ in range(burners - 1):
            children.add(_fork_burner(share, deadline))
        burn(share, deadline)
        failures = _reap(children)
        time.sleep(max(0.0, deadline - time.monotonic()))
        exit_code = 0
        if failures:
            print(f"burn: {len(failures)} burning child process(es) failed: {failures}", file=sys.stderr)
            exit_code = 1
        del memory
    except Preempted:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _stop(children)
        exit_code = SIGTERM_EXIT_CODE
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(json.dumps(_report(wall_start, memory_mb)), flush=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
