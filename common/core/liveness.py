"""Worker membership and liveness at an LM: which agents are members, which have gone silent, which were taken out
of service, and when one comes back; decisions only, from heartbeats, health-check answers and `now`.

An agent is a member from its registration. Silent for more than `timeout` seconds, it is a suspect: the LM asks
its health check, and an agent that answers is kept (its heartbeats are only late), one that does not is lost (its
nodes go out of service and its tasks are reported lost). A lost agent heard from again is back once it runs
nothing; while it still runs tasks (it was cut off, not dead), the LM asks it once per heartbeat round to stop the
tasks that were reported lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Heard(Enum):
    """What the LM does on a member's heartbeat."""

    NOTHING = "nothing"
    BRING_BACK = "bring back"  # it was lost and runs nothing: its nodes return to service
    STOP_LOST = "stop lost"  # it was lost and still runs tasks: ask it to stop those reported lost


@dataclass
class WorkerLiveness:
    """The LM's membership table: last sign of life per agent, and the lost agents with their lost tasks."""

    timeout: float
    last_seen: dict[str, float] = field(default_factory=dict)
    lost: dict[str, list[str]] = field(default_factory=dict)  # worker id -> tasks reported lost when taken down
    stopping: set[str] = field(default_factory=set)  # lost agents asked to stop those tasks, not yet answered

    def joined(self, worker: str, now: float) -> None:
        """A registration (first, or again after the agent restarted) is a sign of life."""
        self.last_seen[worker] = now

    def heard(self, worker: str, running: int, now: float) -> Heard:
        """A heartbeat from a member running `running` tasks."""
        self.last_seen[worker] = now
        if worker not in self.lost:
            return Heard.NOTHING
        if running == 0:
            return Heard.BRING_BACK
        if worker in self.stopping:
            return Heard.NOTHING
        self.stopping.add(worker)
        return Heard.STOP_LOST

    def suspects(self, now: float) -> list[tuple[str, float]]:
        """Members silent for more than `timeout` seconds and not already lost, with how long: ask their health
        check, then call `answered` or `taken_down`."""
        return [
            (worker, now - seen)
            for worker, seen in self.last_seen.items()
            if worker not in self.lost and now - seen > self.timeout
        ]

    def answered(self, worker: str, now: float) -> None:
        """A suspect answered its health check: kept, its silence starts over."""
        self.last_seen[worker] = now

    def taken_down(self, worker: str, task_ids: list[str]) -> None:
        """A suspect did not answer: its nodes are out of service and `task_ids` were reported lost."""
        self.lost[worker] = task_ids

    def asked_to_stop(self, worker: str) -> None:
        """The request to stop a lost agent's tasks ended (either way): the next heartbeat that still shows
        tasks asks again."""
        self.stopping.discard(worker)

    def brought_back(self, worker: str) -> None:
        self.lost.pop(worker, None)
        self.stopping.discard(worker)
