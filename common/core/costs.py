"""The decision-time model: how many seconds a GM or LM takes to handle one message, from the message alone.

In the spirit of Omega's per-job + per-task model (Konwinski's thesis, section 3.2): a GM's submission costs
`gm_per_job + gm_per_task * tasks`; an LM's launch batch `lm_per_batch + lm_per_placement * placements`; any
other message a fixed part plus a part per item it carries (node states of a delta or launch response,
completions, finished tasks, victims, runs to stop). The simulator's event loop makes each GM and LM a server
that spends this time on each message (`megha.common.transport.inmemory`); `ZERO` is today's free deciding.

CALIBRATED holds what the real cores cost on the reference machine (`bench/decision_costs.py`,
`docs/decision-time.md`): the GM's matching of tasks already queued that a delta or response lets it place is
in its per-message and per-node parts, since the message does not say how many it will place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Literal

from megha.common.core.messages import (
    Completions,
    Delta,
    DeltaTick,
    LaunchBatch,
    LaunchResponse,
    PreemptRequest,
    PreemptResponse,
    StopRequest,
    WorkerReport,
)
from megha.common.core.task import JobSpec

Kind = Literal["gm", "lm"]
Price = Callable[[Any], float]


@dataclass(frozen=True, slots=True)
class DecisionCosts:
    """Seconds of handling per message, job, task, node state, placement and item (all >= 0)."""

    gm_per_job: float = 0.0  # a submission, whatever its size: checks, job table, one matching pass
    gm_per_task: float = 0.0  # each task of a submission: queued, matched, added to a launch batch
    gm_per_message: float = 0.0  # a launch response, delta, completions or preemption response
    gm_per_node: float = 0.0  # each node state (or completion) such a message carries, applied to the view
    lm_per_batch: float = 0.0  # a launch batch, whatever its size
    lm_per_placement: float = 0.0  # each placement of a batch: validated against the node table, launched
    lm_per_message: float = 0.0  # a worker report, delta tick, preemption or stop request
    lm_per_item: float = 0.0  # each finished task, victim or run to stop such a message carries

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not value >= 0:
                raise ValueError(f"decision cost {f.name} must be >= 0, got {value}")

    @property
    def zero(self) -> bool:
        """Deciding costs nothing (the event loop then runs GMs and LMs as it always did)."""
        return not any(getattr(self, f.name) for f in fields(self))

    def cost(self, kind: Kind, msg: object) -> float:
        """Seconds a GM (`kind` "gm") or LM ("lm") takes to handle `msg`. A GM message with a `job` is a
        submission (the drivers wrap the JobSpec their load generator submits)."""
        return self.pricer(kind)(msg)

    def pricer(self, kind: Kind) -> Price:
        """`cost` for one kind of endpoint, with the message type's rule looked up once per type."""
        rules = self._gm_rules() if kind == "gm" else self._lm_rules() if kind == "lm" else None
        if rules is None:
            raise ValueError(f"no decision costs for endpoint kind {kind!r} (gm or lm)")
        by_type: dict[type, Price] = {}

        def price(msg: object) -> float:
            rule = by_type.get(type(msg))
            if rule is None:
                rule = by_type[type(msg)] = _rule_for(kind, msg, rules)
            return rule(msg)

        return price

    def _gm_rules(self) -> dict[type, Price]:
        message, node = self.gm_per_message, self.gm_per_node

        def response(m: LaunchResponse | PreemptResponse) -> float:
            return message + node * (len(m.states) + len(m.delta.nodes))

        return {
            JobSpec: lambda job: self.gm_per_job + self.gm_per_task * len(job.tasks),
            LaunchResponse: response,
            Delta: lambda m: message + node * len(m.nodes),
            Completions: lambda m: message + node * len(m.items),
            PreemptResponse: response,
        }

    def _lm_rules(self) -> dict[type, Price]:
        message, item = self.lm_per_message, self.lm_per_item
        return {
            LaunchBatch: lambda m: self.lm_per_batch + self.lm_per_placement * len(m.placements),
            WorkerReport: lambda m: message + item * len(m.finished),
            DeltaTick: lambda m: message,
            PreemptRequest: lambda m: message + item * len(m.victims),
            StopRequest: lambda m: message + item * len(m.runs),
        }


def _rule_for(kind: Kind, msg: object, rules: dict[type, Price]) -> Price:
    """The rule for `msg`'s type: its own, a submission's for a GM message wrapping a JobSpec, else free."""
    rule = rules.get(type(msg))
    if rule is not None:
        return rule
    if kind == "gm" and isinstance(getattr(msg, "job", None), JobSpec):
        submission = rules[JobSpec]
        return lambda m: submission(m.job)
    return lambda m: 0.0  # a message the model does not price (a fault injector's own)


ZERO = DecisionCosts()
"""Deciding takes no time: today's simulator, and the default of `megha replay`."""

CALIBRATED = DecisionCosts(
    gm_per_job=176e-6,
    gm_per_task=4.97e-6,
    gm_per_message=8.62e-6,
    gm_per_node=0.502e-6,
    lm_per_batch=5.82e-6,
    lm_per_placement=1.85e-6,
    lm_per_message=5.23e-6,
    lm_per_item=0.0,
)
"""This code's cores on this machine: `python bench/decision_costs.py` (GOOG_subtrace's first 300 jobs on the
reference cluster, thread CPU time, min of 3 runs), 2026-11-24 at commit 1ec235a (docs/decision-time.md)."""

PRESETS: dict[str, DecisionCosts] = {"zero": ZERO, "calibrated": CALIBRATED}
"""The models `megha replay --decision-costs` names."""
