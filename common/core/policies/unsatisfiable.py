"""Unsatisfiable tasks at submission: what a GM does with a job holding tasks that no node of the data centre could
ever run (no node passes the feasibility filters: constraints, capacity, driver, even when idle).

`reject` (the default) refuses the whole job, naming the first such task: a service answers 422, a replay records
the job as rejected. `drop` does what the constraint-aware paper's simulator does: the job is accepted, each such
task is failed at once with its reason and counted (`GlobalMaster.dropped`), and the job's other tasks are queued.
Either way every task of an accepted job ends exactly once or fails with a reason. A malformed request, or a user
this GM holds no queue for, is bad input and refuses the job under both policies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from megha.common.core.task import TaskSpec


@dataclass(frozen=True, slots=True)
class Unsatisfiable:
    """A task of a submitted job that no node could ever run: its position in the job, the reason and the field of
    the submission to blame ("" for the request)."""

    index: int
    task: TaskSpec
    reason: str
    field: str


class UnsatisfiablePolicy(Protocol):
    """Decides, at submission, the fate of each unsatisfiable task of a job, in job order."""

    name: str

    def drops(self, task: Unsatisfiable) -> bool:
        """Whether `task` fails while the rest of its job is queued (else the job is refused)."""


class RejectJob:
    """The job is refused at submission, naming its first unsatisfiable task. The default."""

    name = "reject"

    def drops(self, task: Unsatisfiable) -> bool:
        return False


class DropTasks:
    """The job is accepted; its unsatisfiable tasks fail at once with their reasons (the authors' simulator)."""

    name = "drop"

    def drops(self, task: Unsatisfiable) -> bool:
        return True
