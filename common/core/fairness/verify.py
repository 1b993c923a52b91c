"""An LM's side of fair scheduling: exact per-user usage of its cluster (reported to every GM in deltas), and
the verification and choice of preemption victims (Megha paper, section IV-C)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from megha.common.core.constraints import constraint_ids
from megha.common.core.fairness.config import FairnessConfig
from megha.common.core.fairness.policy import SharePolicy
from megha.common.core.messages import Victim
from megha.common.core.resources import Resources
from megha.common.core.task import TaskSpec


@dataclass(frozen=True, slots=True)
class VictimPlan:
    """Run the task on `node` after preempting `task_ids` (all of one user, newest first)."""

    node: int
    user: str
    task_ids: tuple[str, ...]


class LocalShares:
    """Usage per user of one LM's cluster and the running tasks of each user, by node."""

    def __init__(self, config: FairnessConfig, width: int, policy: SharePolicy) -> None:
        """`width`: how many resource types a request has."""
        self.shares = config.shares()
        self.width = width
        self.policy = policy
        self._usage: dict[str, list[int]] = {}
        # user -> node -> task id -> task, in launch order (newest last)
        self._tasks: dict[str, dict[int, dict[str, TaskSpec]]] = {}

    def started(self, task: TaskSpec, node: int) -> None:
        usage = self._usage.get(task.user)
        if usage is None:
            usage = self._usage[task.user] = [0] * self.width
            self._tasks[task.user] = {}
        for k, v in enumerate(task.request):
            usage[k] += v
        self._tasks[task.user].setdefault(node, {})[task.task_id] = task

    def ended(self, task: TaskSpec, node: int) -> None:
        usage = self._usage[task.user]
        for k, v in enumerate(task.request):
            usage[k] -= v
        on_node = self._tasks[task.user][node]
        del on_node[task.task_id]
        if not on_node:
            del self._tasks[task.user][node]

    def snapshot(self) -> dict[str, Resources]:
        """Usage of every user holding something here (what the LM reports to GMs)."""
        return {u: tuple(v) for u, v in self._usage.items() if any(v)}

    def _total(self, victim: Victim) -> list[int]:
        local = self._usage.get(victim.user, [0] * self.width)
        return [a + b for a, b in zip(victim.usage_elsewhere, local, strict=True)]

    def over_share(self, victim: Victim, total: Resources) -> bool:
        """Is `victim.user` above its share of `total`, by the GM's view of the rest of the data centre plus this
        LM's exact part?"""
        share = self.shares.get(victim.user)
        return share is not None and self.policy.consumption(tuple(self._total(victim)), total) > share

    def plan(
        self,
        task: TaskSpec,
        victims: Sequence[Victim],
        free: Sequence[Resources],
        masks: Sequence[int],
        total: Resources,
        drivers: Sequence[Collection[str]] = (),
    ) -> VictimPlan | str:
        """The first victim (in the GM's order) that is verified over its share and whose newest tasks on one
        node satisfying `task`'s constraints (and offering its driver, when `drivers` gives each node's) free
        enough room for it, without taking the victim below its own
        share (so the victim cannot preempt back: no ping-pong) and never taking a task of a higher priority class
        than `task`'s (docs/priority.md); otherwise why none could be used."""
        reasons = []
        for victim in victims:
            if victim.user == task.user:
                reasons.append(f"{victim.user}: a task never preempts its own user's tasks")
                continue
            if not self.over_share(victim, total):
                reasons.append(f"{victim.user}: not over its share")
                continue
            share = self.shares[victim.user]
            usage = self._total(victim)
            by_node = self._tasks.get(victim.user, {})
            for node in sorted(by_node):
                if task.constraints & ~masks[node] or (drivers and task.driver not in drivers[node]):
                    continue
                room = list(free[node])
                left = list(usage)
                chosen = []
                for task_id, running in reversed(by_node[node].items()):
                    if all(r >= q for r, q in zip(room, task.request)):
                        break
                    if running.priority > task.priority:
                        continue
                    request = running.request
                    left = [a - v for a, v in zip(left, request)]
                    if self.policy.consumption(tuple(left), total) < share:
                        break
                    chosen.append(task_id)
                    room = [r + v for r, v in zip(room, request)]
                if all(r >= q for r, q in zip(room, task.request)):
                    return VictimPlan(node, victim.user, tuple(chosen))  # no victim needed if it already fits
            reasons.append(
                f"{victim.user}: no node satisfying placement constraints {constraint_ids(task.constraints)} "
                "frees enough by preempting its tasks without taking it below its share"
            )
        return "; ".join(reasons) or "no victims named"


class NoLocalShares:
    """An LM without fair scheduling: it keeps no usage per user and refuses every preemption request. The
    default."""

    def __init__(self, lm: int) -> None:
        self.lm = lm

    def started(self, task: TaskSpec, node: int) -> None: ...

    def ended(self, task: TaskSpec, node: int) -> None: ...

    def snapshot(self) -> None:
        return None

    def plan(self, task: TaskSpec, *state: object) -> str:
        """Refuse, whatever the victims and the LM's state (`LocalShares.plan`'s other arguments)."""
        return f"LM {self.lm} is not configured for fair scheduling"
