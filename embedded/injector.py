"""Drives `Faults` through an embedded system's event loop: when each fault strikes, and worker crashes with their
detection and repair; GM and LM outages are `megha.embedded.outages`'."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from megha.common.core.lm import LocalMaster
from megha.common.core.messages import Output, Send, WorkerPreempt, worker_address
from megha.embedded.faults import Fault, Faults, Kind
from megha.embedded.outages import Later, LMAction, Outages

if TYPE_CHECKING:
    from megha.embedded.system import EmbeddedSystem

FAULTS = "faults"
SEED_OFFSETS: dict[Kind, int] = {"worker": 17, "lm": 29, "gm": 43}


def _take_down(node: int, silent: float, lm: LocalMaster, now: float) -> list[Output]:
    """LM `lm` takes a silent node out of service and reports its runs lost; it also tells the node's worker to stop
    them, as the services' LM does when a worker it found silent is heard from again (a launch sent before the
    crash was noticed may reach the node after its repair)."""
    lost = [p.task.task_id for p in lm.tasks_on([node])]
    reason = f"worker of LM {lm.lm_id} node {node} silent for {silent:g} s"
    out = lm.take_down([node], reason, now)
    if lost:
        out.append(Send(worker_address(lm.lm_id), WorkerPreempt(lm.lm_id, lost)))
    return out


class FaultInjector:
    """Strikes each fault of `faults` at its time, and draws random ones while there is work."""

    def __init__(self, system: EmbeddedSystem, faults: Faults) -> None:
        self.system = system
        self.faults = faults
        cluster = system.cluster
        sizes = [sum(p.size for p in row) for row in cluster.partitions]
        self.nodes = [(lm, n) for lm, size in enumerate(sizes) for n in range(size)]
        counts = {"worker": len(self.nodes), "lm": cluster.num_lms, "gm": cluster.num_gms}
        self._count: Callable[[Kind], int] = counts.__getitem__
        for f in faults.at:
            if f.kind == "worker" and (f.index, f.node) not in self.nodes:
                raise ValueError(f"{f.describe()}: LM {f.index} has no node {f.node}")
            if f.kind != "worker" and f.index >= counts[f.kind]:
                raise ValueError(f"{f.describe()}: this system has {counts[f.kind]} {f.kind.upper()}s")
            if f.kind != "worker" and not f.partition and faults.down(f) <= system.config.hop_delay:
                raise ValueError(f"{f.describe()}: down={faults.down(f):g} must exceed the hop delay")
        if (faults.lm_rate or faults.gm_rate) and faults.repair <= system.config.hop_delay:
            raise ValueError(f"repair={faults.repair:g} must exceed the hop delay for LM and GM crashes")
        rates: tuple[tuple[Kind, float], ...] = (
            ("worker", faults.worker_rate),
            ("lm", faults.lm_rate),
            ("gm", faults.gm_rate),
        )
        self.per_second = {kind: rate * counts[kind] / 3600.0 for kind, rate in rates if rate > 0 and counts[kind]}
        self.rngs = {kind: random.Random(faults.seed * 7919 + SEED_OFFSETS[kind]) for kind in self.per_second}
        self.failed: set[tuple[int, int]] = set()
        self.crashes: Counter[str] = Counter()
        self._own_pending = 0  # this injector's events still to come
        self.outages = Outages(system, faults, self._post) if Outages.needed(faults) else None
        system.loop.register(FAULTS, self.handle)

    def start(self, now: float) -> None:
        for fault in self.faults.at:
            self._post(fault.at, Later(partial(self._strike, fault, False)))
        for kind in self.per_second:
            self._draw_next(kind, now)

    def _post(self, at: float, msg: Later) -> None:
        self._own_pending += 1
        self.system.loop.post(at, FAULTS, msg)

    def _draw_next(self, kind: Kind, now: float) -> None:
        rng = self.rngs[kind]
        index, node = rng.choice(self.nodes) if kind == "worker" else (rng.randrange(self._count(kind)), -1)
        at = now + rng.expovariate(self.per_second[kind])
        self._post(at, Later(partial(self._strike, Fault(kind, at, index, node), True)))

    def _work_left(self) -> bool:
        """Tasks still queued, waiting or running anywhere (a crashed GM's count as they were), or jobs still to
        arrive (this injector's own events do not count: they would keep drawing crashes forever)."""
        system = self.system
        return (
            any(gm.queue or gm.waiting or gm.running for gm in system.gms)
            or any(lm.running for lm in system.lms)
            or system.loop.pending_work > self._own_pending
        )

    def settled(self) -> bool:
        """The work is over for good: none is left (`_work_left`), no gang waits, and no GM that is down or cut off
        holds back a job or a retry. What is left then is this injector's own events (a crash drawn while there was
        work, repairs, restarts and recoveries), which change no task: a real-time run does not wait for them."""
        return (
            not self._work_left()
            and not any(gm.gangs.waiting for gm in self.system.gms)
            and (self.outages is None or not self.outages.work_held_back())
        )

    def handle(self, msg: object, now: float) -> list[Output]:
        self._own_pending -= 1
        if not isinstance(msg, Later):
            raise TypeError(f"fault injector cannot handle {type(msg).__name__}")
        return msg.act(now)

    def _strike(self, fault: Fault, scheduled: bool, now: float) -> list[Output]:
        """`fault` strikes; one `scheduled` (drawn from the random process) draws the next while there is work."""
        self._apply(fault, now)
        if scheduled and self._work_left():
            self._draw_next(fault.kind, now)
        return []

    def _repair(self, lm: int, node: int, now: float) -> list[Output]:
        self.failed.discard((lm, node))
        self.system.workers[lm].repair({node})
        return self._at_lm(lm, lambda core, at: core.bring_up([node], at), now)

    def _apply(self, fault: Fault, now: float) -> None:
        down = self.faults.down(fault)
        if fault.kind == "worker":
            key = (fault.index, fault.node)
            if key in self.failed:
                return
            self.failed.add(key)
            self.crashes["worker"] += 1
            self.system.workers[fault.index].crash({fault.node})
            if self.outages is not None:
                self.outages.worker_crashed(fault.index, {fault.node})
            detect = partial(_take_down, fault.node, self.faults.detect)
            self._post(now + self.faults.detect, Later(partial(self._at_lm, fault.index, detect)))
            self._post(now + down, Later(partial(self._repair, fault.index, fault.node)))
            return
        assert self.outages is not None
        if self.outages.strike(fault.kind, fault.index, fault.partition, now, down):
            self.crashes["partition" if fault.partition else fault.kind] += 1

    def _at_lm(self, lm: int, act: LMAction, now: float) -> list[Output]:
        """Apply a worker-liveness change to LM `lm` (as the outages allow)."""
        if self.outages is not None:
            return self.outages.at_lm(lm, act, now)
        return act(self.system.lms[lm], now)
