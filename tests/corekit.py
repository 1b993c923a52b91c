"""Small builders for core tests: hand-made clusters, tasks, and a network whose deliveries the test controls."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from megha.common.core.cluster import ClusterSpec, PartitionSpec
from megha.common.core.constraints import constraint_mask
from megha.common.core.gm import GlobalMaster
from megha.common.core.lm import LocalMaster
from megha.common.core.messages import DeltaTick, Output, Send, Wake
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.core.worker import SimulatedExecution

CAP = (4000, 8192)


def cluster(layout: Sequence[Sequence[Sequence[Sequence[int]]]], capacity: tuple[int, ...] = CAP) -> ClusterSpec:
    """layout[lm][gm] = list of nodes, each given by its machine constraint ids."""
    return ClusterSpec(
        tuple(
            tuple(
                PartitionSpec(lm, gm, tuple(capacity for _ in nodes), tuple(constraint_mask(n) for n in nodes))
                for gm, nodes in enumerate(row)
            )
            for lm, row in enumerate(layout)
        )
    )


def task(
    task_id: str, constraints: Sequence[int] = (), request: tuple[int, ...] = CAP, duration: float = 1.0
) -> TaskSpec:
    return TaskSpec(task_id, task_id.split(".")[0], "user-0", duration, request, constraint_mask(constraints))


def job(job_id: str, *tasks: TaskSpec, at: float = 0.0) -> JobSpec:
    return JobSpec(job_id, tuple(tasks), at)


@dataclass
class Net:
    """Holds sent messages until the test delivers them; timers are delivered on `tick`."""

    gms: list[GlobalMaster]
    lms: list[LocalMaster]
    workers: list[SimulatedExecution]
    inbox: list[Send] = field(default_factory=list)
    timers: list[Wake] = field(default_factory=list)
    now: float = 0.0

    @classmethod
    def build(cls, spec: ClusterSpec, **gm_kwargs: object) -> Net:
        return cls(
            [GlobalMaster(g, spec, **gm_kwargs) for g in range(spec.num_gms)],  # type: ignore[arg-type]
            [LocalMaster.in_cluster(spec, lm) for lm in range(spec.num_lms)],
            [SimulatedExecution(lm) for lm in range(spec.num_lms)],
        )

    def post(self, outputs: list[Output]) -> None:
        """Queue sends and worker timers; periodic delta ticks are left to the test to fire."""
        for out in outputs:
            if isinstance(out, Send):
                self.inbox.append(out)
            elif not isinstance(out.msg, DeltaTick):
                self.timers.append(out)

    def endpoint(self, address: str):  # type: ignore[no-untyped-def]
        kind, index = address.split("/")
        return {"gm": self.gms, "lm": self.lms, "worker": self.workers}[kind][int(index)]

    def deliver(self, index: int = 0) -> Send:
        msg = self.inbox.pop(index)
        self.post(self.endpoint(msg.dest).handle(msg.msg, self.now))
        return msg

    def take(self, dest: str, kind: type) -> object:
        """Remove (without delivering) the first message of `kind` addressed to `dest`."""
        for i, m in enumerate(self.inbox):
            if m.dest == dest and isinstance(m.msg, kind):
                return self.inbox.pop(i).msg
        raise AssertionError(f"no {kind.__name__} for {dest} in {[(m.dest, type(m.msg).__name__) for m in self.inbox]}")

    def run(self) -> None:
        """Deliver everything, firing timers in time order when nothing else is pending."""
        while self.inbox or self.timers:
            if self.inbox:
                self.deliver()
                continue
            self.timers.sort(key=lambda w: w.at)
            wake = self.timers.pop(0)
            self.now = max(self.now, wake.at)
            self.post(self.endpoint(wake.dest).handle(wake.msg, self.now))
