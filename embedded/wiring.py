"""What every simulated system shares: its event loop, the entry points jobs are submitted to, and the jobs refused.

Megha (`megha.embedded.system`), PigeonC (`megha.sim.pigeonc`) and Sparrow (`megha.sim.sparrow`) each build their
cores on a `SimulatedSystem`: it makes the in-memory event loop, delivers a submitted job to an entry point (a GM,
a distributor, a scheduler) one hop after its submission time, and keeps the jobs an entry point refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from megha.common.core.cluster import ClusterSpec
from megha.common.core.gm import Unschedulable
from megha.common.core.messages import Output
from megha.common.core.observer import CoreObserver
from megha.common.core.task import JobSpec
from megha.common.transport.inmemory import EVENT_ORDERS, EventLoop

if TYPE_CHECKING:
    from megha.embedded.system import EmbeddedConfig


@dataclass(slots=True)
class Submit:
    """A job from the load generator, as it arrives at an entry point."""

    job: JobSpec


class SimulatedSystem:
    """A scheduler's cores joined by one EventLoop, with `entry_points` entry points (`entry_kind` 0, 1, ... at
    `entry_address(i)`) that jobs are submitted to. A subclass registers its cores on `loop` and hands each `Submit`
    an entry point gets to `accept`."""

    def __init__(
        self,
        cluster: ClusterSpec,
        config: EmbeddedConfig,
        observer: CoreObserver | None,
        entry_points: int,
        entry_kind: str,
        entry_address: Callable[[int], str],
    ) -> None:
        self.cluster = cluster
        self.config = config
        self.observer = observer or CoreObserver()
        # GM and LM endpoints registered as servers take `config.costs` to handle each message (none: no time).
        if config.event_order not in EVENT_ORDERS:
            raise ValueError(f"unknown event order {config.event_order!r}; choose one of {list(EVENT_ORDERS)}")
        ties_seed = None if config.event_order == "fifo" else config.seed
        self.loop = EventLoop(config.hop_delay, config.realtime, config.costs, ties_seed)
        self.rejected: list[tuple[JobSpec, str]] = []  # jobs refused at submission, with the reason
        self.entry_points = entry_points
        self.entry_kind = entry_kind  # what an entry point is called in errors: "GM", "distributor", "scheduler"
        self.entry_address = entry_address

    def submit(self, entry: int, job: JobSpec) -> None:
        """The load generator submits `job` to entry point `entry` at its submission time; it arrives one hop later."""
        if not 0 <= entry < self.entry_points:
            raise ValueError(f"no {self.entry_kind} {entry}; this system has {self.entry_points}")
        self.loop.post(job.submitted_at + self.config.hop_delay, self.entry_address(entry), Submit(job))

    def accept(self, submit: Callable[[JobSpec, float], list[Output]], job: JobSpec, now: float) -> list[Output]:
        """`submit(job, now)` at an entry point; a job it refuses as unschedulable is kept in `rejected`."""
        try:
            return submit(job, now)
        except Unschedulable as exc:
            self.rejected.append((job, str(exc)))
            return []

    def run(self, on_event: Callable[[float], None] | None = None) -> None:
        """Run until nothing more can happen (a system with periodic timers says when to stop)."""
        self.loop.run(lambda: False, on_event)
