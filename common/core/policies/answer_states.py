"""An LM's answer to a launch batch: whether it carries node states to the GM that sent the batch.

`always` (the default): every answer carries the current state of each node the batch touched and the GM's pending
delta, so a GM's view catches up whenever one of its batches is answered. `on-refusal` does as the constraint-aware
paper's trace-driven simulator (meghanat/megha-constraint-aware, `megha3.0/src/megha_sim/local_master/
lm_constraints.py`, `verify_requests`): a batch whose placements all launched gets an answer without states, and
the GM's pending delta stays pending for its next heartbeat; only a batch with a refused placement brings the states
and the delta (there, `BatchedInconsistencyEvent`). The GM then learns of nodes other GMs' tasks freed only from
heartbeats and refusals, and of nodes its own tasks freed from their completions, as in that simulator.
"""

from __future__ import annotations

from typing import Protocol


class AnswerStates(Protocol):
    """Whether an LM's answer to a launch batch carries node states."""

    name: str

    def carries(self, refused: bool) -> bool:
        """Whether the answer carries the touched nodes' states and the pending delta; `refused`: the batch had a
        refused placement."""


class Always:
    """Every answer carries the touched nodes' states and the pending delta. The default."""

    name = "always"

    def carries(self, refused: bool) -> bool:
        return True


class OnRefusal:
    """Only an answer that refuses a placement carries them (the authors' simulator)."""

    name = "on-refusal"

    def carries(self, refused: bool) -> bool:
        return refused
