"""Benchmark: what signing costs on the broker (docs/security.md, "Broker reports"): an LM's Ed25519 signature of
a message to a GM and the GM's check of it, beside a worker agent's HMAC-SHA256 of a report and its LM's check.

    python bench/broker_signatures.py --repeat 7

Prints the best of `--repeat` timeit rounds per operation, in microseconds per message, for completions of 1, 10
and 100 tasks (the GM's check with the LM's certificate already checked once, as every message but an LM's first
costs), and the first check of a certificate.
"""

from __future__ import annotations

import argparse
import platform
import timeit
from collections.abc import Callable
from functools import partial

from megha.common.auth import Credential, MessageSigner, MessageVerifier, root_public
from megha.common.core.messages import Completion, Completions, FinishedTask, NodeState, WorkerReport
from megha.common.models import BrokerMessage
from megha.common.transport.rabbit import (
    lm_report_headers,
    lm_report_signer,
    report_headers,
    report_key,
    report_signed_by,
)

SECRET = "broker-signatures-benchmark-secret"


def completions(tasks: int) -> bytes:
    """An LM's completions of `tasks` tasks for GM 0, as it publishes them."""
    items = [Completion(f"job-{i // 10}.{i % 10}", NodeState(i, (3500, 7168), 100 + i)) for i in range(tasks)]
    return BrokerMessage.core_json(Completions(1, 0, 42, items))


def worker_report(tasks: int) -> bytes:
    """A worker agent's report of `tasks` finished tasks to LM 0, as it publishes it."""
    items = [FinishedTask(f"job-{i // 10}.{i % 10}", i, gm=0, finished_at=1.7e9, cpu_seconds=0.5) for i in range(tasks)]
    return BrokerMessage.core_json(WorkerReport(0, items))


def best(repeat: int, number: int, run: Callable[[], object]) -> float:
    """Microseconds per call of `run`, the best of `repeat` rounds of `number` calls."""
    return min(timeit.repeat(run, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    signer = MessageSigner(Credential.issue(SECRET, "lm", "1"))
    root = root_public(SECRET)
    key = report_key(b"r" * 32, "worker-0-0")
    print(f"Python {platform.python_version()} on {platform.machine()}; best of {args.repeat} x {args.number} calls")
    print(f"{'message':<24}{'bytes':>8}{'LM signs':>12}{'GM checks':>12}{'agent signs':>14}{'LM checks':>12}")
    for tasks in (1, 10, 100):
        body = completions(tasks)
        headers = lm_report_headers(signer, 0, body)
        verifier = MessageVerifier(root, "lm")
        assert lm_report_signer(verifier, 0, body, headers) == "1"
        report = worker_report(tasks)
        signed = report_headers(key, 0, "worker-0-0", report)
        assert report_signed_by(key, 0, "worker-0-0", report, signed)
        times = [
            best(args.repeat, args.number, call)
            for call in (
                partial(lm_report_headers, signer, 0, body),
                partial(lm_report_signer, verifier, 0, body, headers),
                partial(report_headers, key, 0, "worker-0-0", report),
                partial(report_signed_by, key, 0, "worker-0-0", report, signed),
            )
        ]
        name = f"completions of {tasks}"
        print(f"{name:<24}{len(body):>8}" + "".join(f"{t:>{w}.1f}" for t, w in zip(times, (12, 12, 14, 12))))
    body = completions(1)
    headers = lm_report_headers(signer, 0, body)

    def first_check() -> str:
        return lm_report_signer(MessageVerifier(root, "lm"), 0, body, headers)

    first = best(args.repeat, args.number // 10, first_check)
    print(f"a GM's first check of an LM's message (its certificate too): {first:.1f} us")


if __name__ == "__main__":
    main()
