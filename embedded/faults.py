"""Worker-node failures in a simulation: the same recovery path as the services, on the virtual clock.

A crashed node's worker stops its tasks and reports nothing (`SimulatedExecution.crash`); its LM notices after
`detect` seconds (the services' MEGHA_WORKER_TIMEOUT) and takes the node out of service, reporting its tasks
lost (`LocalMaster.take_down`), so their GMs run them again as their next attempt; the node is repaired
`repair` seconds after the crash and comes back into service (`LocalMaster.bring_up`).

Crashes come at given times, or at random: a Poisson process of `rate` crashes per node per hour over the whole
data centre, drawn from its own seeded generator (a run is reproducible), scheduled only while there is work.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from megha.common.core.messages import Output

if TYPE_CHECKING:
    from megha.embedded.system import EmbeddedSystem

FAULTS = "faults"


@dataclass(frozen=True, slots=True)
class WorkerFaults:
    """Worker-node crashes: at fixed `(time, lm, node)`s and/or at random, `rate` per node per hour."""

    rate: float = 0.0
    at: tuple[tuple[float, int, int], ...] = ()
    detect: float = 30.0
    repair: float = 60.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate < 0 or self.detect <= 0 or self.repair < self.detect:
            raise ValueError(
                f"worker faults need rate >= 0, detect > 0 and repair >= detect; got rate={self.rate}, "
                f"detect={self.detect}, repair={self.repair}"
            )


def parse_faults(specs: list[str], detect: float, repair: float, seed: int) -> WorkerFaults | None:
    """`--fail` specs: `worker:rate=R` (crashes per node per hour) or `worker:at=T,lm=L,node=N`; None for none."""
    if not specs:
        return None
    rate, at = 0.0, []
    for spec in specs:
        kind, _, rest = spec.partition(":")
        if kind in ("gm", "lm"):
            raise ValueError(
                f"--fail {spec}: only worker failures are simulated so far (GM and LM crashes are "
                "exercised through the services: megha chaos)"
            )
        if kind != "worker" or not rest:
            raise ValueError(f"--fail {spec}: expected worker:rate=R or worker:at=T,lm=L,node=N")
        fields = dict(item.partition("=")[::2] for item in rest.split(","))
        try:
            if set(fields) == {"rate"}:
                rate += float(fields["rate"])
            elif set(fields) == {"at", "lm", "node"}:
                at.append((float(fields["at"]), int(fields["lm"]), int(fields["node"])))
            else:
                raise ValueError(f"unknown fields {sorted(fields)}")
        except ValueError as exc:
            raise ValueError(f"--fail {spec}: {exc} (expected worker:rate=R or worker:at=T,lm=L,node=N)") from None
    return WorkerFaults(rate, tuple(at), detect, repair, seed)


@dataclass(frozen=True, slots=True)
class _Crash:
    lm: int
    node: int
    scheduled: bool  # drawn from the random process (which then draws the next one)


@dataclass(frozen=True, slots=True)
class _Detect:
    lm: int
    node: int
    silent: float


@dataclass(frozen=True, slots=True)
class _Repair:
    lm: int
    node: int


class FaultInjector:
    """Drives `WorkerFaults` through an embedded system's event loop."""

    def __init__(self, system: EmbeddedSystem, faults: WorkerFaults) -> None:
        self.system = system
        self.faults = faults
        self.rng = random.Random(faults.seed * 7919 + 17)
        self.nodes = [(lm.lm_id, n) for lm in system.lms for n in range(len(lm.capacity))]
        self.failed: set[tuple[int, int]] = set()
        self.crashes = 0
        self._own_pending = 0  # this injector's detections and repairs still to come
        system.loop.register(FAULTS, self.handle)

    def start(self, now: float) -> None:
        for at, lm, node in self.faults.at:
            if (lm, node) not in self.nodes:
                raise ValueError(f"worker fault at {at}: LM {lm} has no node {node}")
            self.system.loop.post(at, FAULTS, _Crash(lm, node, scheduled=False))
        self._draw_next(now)

    def _draw_next(self, now: float) -> None:
        if self.faults.rate > 0 and self.nodes:
            per_second = self.faults.rate * len(self.nodes) / 3600.0
            lm, node = self.rng.choice(self.nodes)
            self.system.loop.post(now + self.rng.expovariate(per_second), FAULTS, _Crash(lm, node, scheduled=True))

    def _work_left(self) -> bool:
        """Tasks still queued, waiting or running anywhere, or jobs still to arrive (this injector's own pending
        detections and repairs do not count: they would keep drawing crashes forever)."""
        system = self.system
        return (
            any(gm.queue or gm.waiting or gm.running for gm in system.gms)
            or any(lm.running for lm in system.lms)
            or system.loop.pending_work > self._own_pending
        )

    def handle(self, msg: object, now: float) -> list[Output]:
        system = self.system
        if isinstance(msg, _Crash):
            if (msg.lm, msg.node) not in self.failed:
                self.failed.add((msg.lm, msg.node))
                self.crashes += 1
                system.workers[msg.lm].crash({msg.node})
                system.loop.post(now + self.faults.detect, FAULTS, _Detect(msg.lm, msg.node, self.faults.detect))
                system.loop.post(now + self.faults.repair, FAULTS, _Repair(msg.lm, msg.node))
                self._own_pending += 2
            if msg.scheduled and self._work_left():
                self._draw_next(now)
            return []
        if isinstance(msg, _Detect):
            self._own_pending -= 1
            reason = f"worker of LM {msg.lm} node {msg.node} silent for {msg.silent:g} s"
            return system.lms[msg.lm].take_down([msg.node], reason, now)
        if isinstance(msg, _Repair):
            self._own_pending -= 1
            self.failed.discard((msg.lm, msg.node))
            system.workers[msg.lm].repair({msg.node})
            return system.lms[msg.lm].bring_up([msg.node], now)
        raise TypeError(f"fault injector cannot handle {type(msg).__name__}")
