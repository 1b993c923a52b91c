"""Retry policies by exit code: a job's `RetryRule`, which failed runs it matches, the jittered exponential backoff
before the next run, and a GM's book of the tasks waiting out their backoff (docs/retry.md).

A run counts as a failure only when it ended on its own with an error and an exit code: preemptions and lost
workers are not failures (the GM queues those again as before, MEGHA_MAX_ATTEMPTS bounding lost runs), and a run
with no exit code (a burn task, a run that could not start or exceeded its duration limit) never matches a rule.
The core never sleeps: a retried task waits in `RetryBook.backing_off` for the `Wake` that carries its `RetryDue`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from megha.common.core.task import JobSpec, TaskSpec

MAX_BACKOFF_S = 3600.0
"""The longest wait before a retry, jitter aside: the doubling stops there."""

MAX_ATTEMPTS = 100
"""The most runs of a task a retry rule may let fail (the REST model's bound, and `megha replay --retry`'s)."""

JITTER = (0.5, 1.5)
"""The backoff is multiplied by a factor drawn uniformly from [0.5, 1.5) (the GM's seeded rng)."""


@dataclass(frozen=True, slots=True)
class RetryRule:
    """A job's retry rule. `max_attempts` is the number of runs of a task that may fail: a task is retried for
    failures at most `max_attempts - 1` times (1: never), whatever its preemptions and lost workers. The k-th retry
    of a task waits `backoff_s * 2**(k-1)` seconds (at most MAX_BACKOFF_S) times a jitter in [0.5, 1.5).
    `on_exit_codes`: the exit codes retried; empty: any non-zero one."""

    max_attempts: int
    backoff_s: float
    on_exit_codes: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if not self.backoff_s >= 0:
            raise ValueError(f"backoff_s must be at least 0, got {self.backoff_s}")

    def matches(self, exit_code: int | None) -> bool:
        """Whether a run that ended with `exit_code` (None: it has none) is a failure this rule retries."""
        if exit_code is None or exit_code == 0:
            return False
        return not self.on_exit_codes or exit_code in self.on_exit_codes

    def backoff(self, retry: int, jitter: float) -> float:
        """Seconds to wait before retry number `retry` (1 for the first), given a jitter factor in [0.5, 1.5)."""
        return min(self.backoff_s * 2.0 ** min(retry - 1, 1000), MAX_BACKOFF_S) * jitter  # 2.0 ** 1024 overflows


@dataclass(frozen=True, slots=True)
class RetryDue:
    """Timer message (a GM's `Wake` to itself): task `task_id`'s backoff is over; its run `attempt` may start."""

    task_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Retry:
    """A failed run that runs again: `task` is its next run (attempt + 1), due at `at` (its `retry`-th retry)."""

    task: TaskSpec
    at: float
    retry: int
    reason: str


@dataclass(frozen=True, slots=True)
class GangRetryDecision:
    """A gang member's failed run that the rule retries: the whole gang runs again (its `retry`-th retry) `backoff`
    seconds after its last member stopped; `reason` says why (without the time, known only then)."""

    retry: int
    backoff: float
    reason: str


class RetryBook:
    """A GM's retry state: the rule of each open job that has one (with how many of its tasks are still open, so
    the entry goes when they have all ended), how many times each task was retried for failures, and the tasks
    waiting out their backoff. Empty (and never consulted on the hot path) when no job has a rule."""

    __slots__ = ("backing_off", "failures", "rng", "rules")

    def __init__(self, rng: random.Random) -> None:
        self.rules: dict[str, _JobRule] = {}  # job id -> its rule and how many of its tasks have not ended
        self.failures: dict[str, int] = {}  # task id -> times retried for failures (tasks retried at least once)
        self.backing_off: dict[str, TaskSpec] = {}  # task id -> its next run, until its RetryDue
        self.rng = rng

    def admit(self, job: JobSpec) -> None:
        """Keep `job`'s rule (if it has one) while its tasks are open."""
        if job.retry is not None and job.tasks:
            self.rules[job.job_id] = _JobRule(job.retry, len(job.tasks))

    def restore(self, job: JobSpec, open_tasks: int, failures: dict[str, int]) -> None:
        """After a GM restart: `job`'s rule with `open_tasks` of its tasks not ended, and each task's failures
        retried so far (from the driver's durable records)."""
        if job.retry is not None and open_tasks > 0:
            self.rules[job.job_id] = _JobRule(job.retry, open_tasks)
            self.failures.update(failures)

    def failed(self, task: TaskSpec, error: str, exit_code: int | None, now: float) -> Retry | str:
        """A run of `task` failed with `error`: its `Retry`, or the reason it fails for good ("" when its job has
        no rule)."""
        entry = self.rules.get(task.job_id)
        if entry is None:
            return ""
        rule = entry.rule
        done = self.failures.get(task.task_id, 0)
        code = "no exit code" if exit_code is None else f"exit code {exit_code}"
        if not rule.matches(exit_code):
            return f"{error} ({code} not retried by the job's rule; failure {done + 1} of at most {rule.max_attempts})"
        if done + 1 >= rule.max_attempts:
            return f"{error} ({code}; failure {done + 1} of at most {rule.max_attempts}: retries used up)"
        retry = done + 1
        self.failures[task.task_id] = retry
        at = now + rule.backoff(retry, self.rng.uniform(*JITTER))
        following = replace(task, attempt=task.attempt + 1)
        self.backing_off[task.task_id] = following
        reason = f"{error} ({code}; failure {retry} of at most {rule.max_attempts}: retry {retry} at {at:.3f})"
        return Retry(following, at, retry, reason)

    def gang_failed(
        self, tasks: Sequence[TaskSpec], task: TaskSpec, error: str, exit_code: int | None
    ) -> GangRetryDecision | str:
        """A run of `task`, a member of the gang whose current attempt is `tasks`, failed with `error`: the gang's
        `GangRetryDecision` (every member runs again), or the reason `task` fails for good ("" when the job has no
        rule). Failures count per gang: one failed member is one failure of the gang, kept under every member's
        task id (so a restart restores it from any member's record, and lost runs are bounded as for other tasks).
        The backoff is drawn now; the gang waits it out once every member has stopped."""
        entry = self.rules.get(task.job_id)
        if entry is None:
            return ""
        rule = entry.rule
        done = max((self.failures.get(t.task_id, 0) for t in tasks), default=0)
        code = "no exit code" if exit_code is None else f"exit code {exit_code}"
        if not rule.matches(exit_code):
            failure = f"gang failure {done + 1} of at most {rule.max_attempts}"
            return f"{error} ({code} not retried by the job's rule; {failure})"
        if done + 1 >= rule.max_attempts:
            return f"{error} ({code}; gang failure {done + 1} of at most {rule.max_attempts}: retries used up)"
        retry = done + 1
        for t in tasks:
            self.failures[t.task_id] = retry
        backoff = rule.backoff(retry, self.rng.uniform(*JITTER))
        reason = (
            f"{error} ({code} of gang member {task.task_id}; gang failure {retry} of at most {rule.max_attempts}: "
            f"every member runs again, retry {retry}"
        )
        return GangRetryDecision(retry, backoff, reason)

    def due(self, msg: RetryDue) -> TaskSpec | None:
        """The task whose backoff `msg` ends, or None when it no longer waits (cancelled, or a stale timer)."""
        task = self.backing_off.get(msg.task_id)
        if task is None or task.attempt != msg.attempt:
            return None
        del self.backing_off[msg.task_id]
        return task

    def withdraw(self, task_ids: set[str]) -> list[TaskSpec]:
        """Take out the tasks of `task_ids` waiting out their backoff (their job was cancelled); returns them."""
        return [self.backing_off.pop(tid) for tid in list(self.backing_off) if tid in task_ids]

    def ended(self, task: TaskSpec) -> None:
        """`task` ended for good (finished, failed, cancelled): forget it, and its job's rule after its last task."""
        entry = self.rules.get(task.job_id)
        if entry is None:
            return
        self.failures.pop(task.task_id, None)
        entry.left -= 1
        if entry.left <= 0:
            del self.rules[task.job_id]


@dataclass(slots=True)
class _JobRule:
    """An open job's rule, and how many of its tasks have not ended."""

    rule: RetryRule
    left: int


def parse_rule(text: str) -> RetryRule:
    """A rule from `max_attempts:backoff_s[:code,code...]` (`megha replay --retry`): "3:10" retries any non-zero
    exit code twice, 10 s then 20 s apart (jitter aside); "4:1:3,137" only exit codes 3 and 137."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"retry rule {text!r}: expected max_attempts:backoff_s[:codes], e.g. 3:10 or 4:1:3,137")
    try:
        attempts, backoff = int(parts[0]), float(parts[1])
        codes = frozenset(int(c) for c in parts[2].split(",") if c) if len(parts) == 3 else frozenset()
    except ValueError:
        raise ValueError(f"retry rule {text!r}: max_attempts and codes are integers, backoff_s a number") from None
    if any(not 1 <= c <= 255 for c in codes):
        raise ValueError(f"retry rule {text!r}: exit codes are 1..255")
    if not 0 <= backoff <= MAX_BACKOFF_S:
        raise ValueError(f"retry rule {text!r}: backoff_s is 0..{MAX_BACKOFF_S:g}")
    if not 1 <= attempts <= MAX_ATTEMPTS:
        raise ValueError(f"retry rule {text!r}: max_attempts is 1..{MAX_ATTEMPTS}")
    return RetryRule(attempts, backoff, codes)


class SimulatedFailures:
    """Which simulated runs fail (`megha replay --fail-fraction`): each run, independently, with probability
    `fraction`, ending with `exit_code` when its duration is over; drawn from a generator seeded per LM so that a
    replay repeats."""

    __slots__ = ("exit_code", "fraction", "rng")

    def __init__(self, fraction: float, exit_code: int, seed: int, lm: int) -> None:
        if not 0 <= fraction <= 1:
            raise ValueError(f"fail fraction must be within 0..1, got {fraction}")
        if not 1 <= exit_code <= 255:
            raise ValueError(f"fail exit code must be within 1..255, got {exit_code}")
        self.fraction = fraction
        self.exit_code = exit_code
        self.rng = random.Random(f"fail/{seed}/{lm}")

    def __call__(self) -> int | None:
        """The exit code of a run that fails, None for one that runs to completion."""
        return self.exit_code if self.rng.random() < self.fraction else None
