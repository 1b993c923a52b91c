"""Benchmark: what the rlimits memory watch pays to ask the kernel what sockets hold (`socket_memory.socket_bytes`).

Holds `--pairs` Unix socket pairs open in this process (`--full`: each sender's buffer filled and nothing read), then
times `socket_bytes()` (one sock_diag dump of Unix sockets, and of TCP and UDP over IPv4 and IPv6) `--repeat` times:
the cost grows with the sockets of the host's network namespace that hold data. Results in docs/benchmarks.md.

    python bench/socket_watch.py --pairs 2500 --full
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import socket
import statistics
import time

from megha.services.worker.socket_memory import socket_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=2500, help="Unix socket pairs to hold (default: 2500)")
    parser.add_argument("--full", action="store_true", help="fill each sender's buffer (nothing read)")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls (default: 20)")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * args.pairs + 100)), hard))
    pairs = []
    for _ in range(args.pairs):
        sender, receiver = socket.socketpair()
        if args.full:
            sender.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                while True:
                    sender.send(b"x" * 65536)
        pairs.append((sender, receiver))
    times, held = [], {}
    for _ in range(args.repeat):
        start = time.perf_counter()
        held = socket_bytes()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(
        f"{args.pairs:,} pairs{' (full)' if args.full else ''}: socket_bytes() {median * 1e3:.2f} ms (median of "
        f"{args.repeat}); {len(held):,} sockets of the host hold {sum(held.values()) / 2**20:,.1f} MB"
    )


if __name__ == "__main__":
    main()
