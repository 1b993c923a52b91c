"""Per-queue share of the data centre over time, and Jain's fairness index while resources are contended,
computed from a replay's records (every run of every task, including runs cut short by preemption)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from megha.common.core.fairness.config import FairnessConfig
from megha.common.core.fairness.policy import make_share_policy
from megha.common.core.resources import Resources
from megha.loadgen.recorder import Recorder


@dataclass(frozen=True, slots=True)
class ShareSeries:
    """`consumption[user][i]`: the user's consumption (by the share policy's measure) at `times[i]`;
    `contended[i]`: some task was waiting for resources then (a task counts as waiting from its arrival to its
    last start, so a preempted task also while its first run lasted); `jain[i]`: Jain's index of consumption / share
    over the queues with tasks waiting (backlogged) at that time."""

    times: np.ndarray
    consumption: dict[str, np.ndarray]
    contended: np.ndarray
    jain: np.ndarray

    def mean_jain_contended(self) -> float:
        values = self.jain[self.contended & ~np.isnan(self.jain)]
        return float(values.mean()) if values.size else float("nan")


def jain_index(values: Sequence[float] | np.ndarray) -> float:
    """(sum x)^2 / (n * sum x^2): 1 when all equal, 1/n when one holds everything; NaN for no values."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0 or not np.any(x):
        return float("nan")
    return float(x.sum() ** 2 / (x.size * np.square(x).sum()))


def _level(starts: np.ndarray, ends: np.ndarray, amounts: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Sum of `amounts` over intervals [start, end) that contain each of `times` (amounts: n x k)."""
    k = amounts.shape[1] if amounts.ndim == 2 else 1
    out = np.zeros((times.size, k))
    if starts.size == 0:
        return out
    order_s, order_e = np.argsort(starts), np.argsort(ends)
    cum_s = np.vstack([np.zeros(k), np.cumsum(amounts[order_s], axis=0)])
    cum_e = np.vstack([np.zeros(k), np.cumsum(amounts[order_e], axis=0)])
    started = np.searchsorted(starts[order_s], times, side="right")
    ended = np.searchsorted(ends[order_e], times, side="right")
    return cum_s[started] - cum_e[ended]


def share_series(recorder: Recorder, fairness: FairnessConfig, total: Resources, samples: int = 400) -> ShareSeries:
    """Sample each queue's consumption, contention and Jain's index at `samples` times over the busy span."""
    policy = make_share_policy(fairness.policy)
    tasks = recorder.tasks
    runs: list[tuple[str, float, float, Resources]] = [
        (r.user, r.started_at, r.finished_at, r.request) for r in tasks.values() if r.finished_at == r.finished_at
    ]
    runs += [(tasks[t].user, start, end, tasks[t].request) for t, start, end in recorder.preempted_runs]
    placed = [r for r in tasks.values() if r.started_at == r.started_at]
    arrivals = np.array([r.arrival for r in placed])
    first_starts = np.array([r.started_at for r in placed])
    if not runs:
        empty = np.zeros(0)
        return ShareSeries(empty, {q.user: empty for q in fairness.queues}, empty.astype(bool), empty)
    t0 = min(start for _, start, _, _ in runs)
    t1 = max(end for _, _, end, _ in runs)
    times = np.linspace(t0, t1, samples, endpoint=False)
    waiting = _level(arrivals, first_starts, np.ones((arrivals.size, 1)), times)[:, 0]
    consumption: dict[str, np.ndarray] = {}
    busy: dict[str, np.ndarray] = {}
    for q in fairness.queues:
        mine = [(s, e, req) for user, s, e, req in runs if user == q.user]
        starts = np.array([s for s, _, _ in mine])
        ends = np.array([e for _, e, _ in mine])
        amounts = np.array([req for _, _, req in mine], dtype=np.float64).reshape(len(mine), len(total))
        held = _level(starts, ends, amounts, times)
        consumption[q.user] = np.array([policy.consumption(tuple(row), total) for row in held])
        mine_arrivals = np.array([r.arrival for r in placed if r.user == q.user])
        mine_starts = np.array([r.started_at for r in placed if r.user == q.user])
        pending = _level(mine_arrivals, mine_starts, np.ones((mine_arrivals.size, 1)), times)[:, 0]
        busy[q.user] = pending > 0
    shares = fairness.shares()
    jain = np.array(
        [jain_index([consumption[u][i] / shares[u] for u in consumption if busy[u][i]]) for i in range(times.size)]
    )
    return ShareSeries(times, consumption, waiting > 0, jain)
