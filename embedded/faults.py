"""Failures in a simulation: what crashes (worker nodes, LMs, GMs) or is cut off, and when; `--fail` parsing.

A crashed node's worker stops its tasks and reports nothing (`SimulatedExecution.crash`); its LM notices after
`detect` seconds (the services' MEGHA_WORKER_TIMEOUT) and takes the node out of service, reporting its tasks
lost (`LocalMaster.take_down`), so their GMs run them again as their next attempt; the node is repaired `down`
seconds after the crash (by default `repair`) and comes back into service (`LocalMaster.bring_up`).

A crashed LM or GM loses its memory and restarts `down` seconds later (`megha.embedded.outages` models what
waits for it and how it recovers); a partitioned one keeps its memory, but messages to and from it wait until
the partition heals, `down` seconds later.

Faults come at given times, or at random: for each kind, a Poisson process of `rate` crashes per component
(worker node, LM, GM) per hour over the whole data centre, drawn from its own seeded generator (a run is
reproducible), scheduled only while there is work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

MAX_RATE = 3600.0
"""The most crashes per component per hour `rate=` may ask for (one a second): a Poisson process much faster leaves
virtual time barely advancing between crashes (at 1e9 per hour a replay runs for minutes; at 1e308 it never ends)."""
MAX_TIME = 1e12
"""The latest `at=` and the longest `down=`, in seconds (as a trace's arrivals and durations, loadgen/trace.py)."""

Kind = Literal["worker", "lm", "gm"]
FORMS = {
    "worker": "worker:rate=R or worker:at=T,lm=L,node=N[,down=D]",
    "lm": "lm:rate=R or lm:at=T,lm=L[,down=D]",
    "gm": "gm:rate=R or gm:at=T,gm=G[,down=D]",
    "partition": "partition:at=T,lm=L[,down=D] or partition:at=T,gm=G[,down=D]",
}


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault at time `at`: a crash of worker node `node` of LM `index` (kind "worker"), of LM `index` or of
    GM `index`, or (`partition`) LM or GM `index` cut off. It is over `down` seconds later (None: the repair
    time)."""

    kind: Kind
    at: float
    index: int
    node: int = -1
    down: float | None = None
    partition: bool = False

    def describe(self) -> str:
        what = {"worker": f"worker of LM {self.index} node {self.node}", "lm": f"LM {self.index}"}
        name = what.get(self.kind, f"GM {self.index}")
        return f"{'partition of' if self.partition else 'crash of'} {name} at {self.at:g}"


@dataclass(frozen=True, slots=True)
class Faults:
    """Failures to simulate: crashes at random (`worker_rate` per node per hour, `lm_rate` per LM per hour,
    `gm_rate` per GM per hour) and the faults in `at`. A crashed worker's LM notices after `detect` seconds;
    anything that crashes at random, or whose fault names no `down`, is back after `repair` seconds."""

    worker_rate: float = 0.0
    lm_rate: float = 0.0
    gm_rate: float = 0.0
    at: tuple[Fault, ...] = ()
    detect: float = 30.0
    repair: float = 60.0
    seed: int = 0

    def __post_init__(self) -> None:
        rates = {"worker rate": self.worker_rate, "LM rate": self.lm_rate, "GM rate": self.gm_rate}
        for name, rate in rates.items():
            if not 0 <= rate <= MAX_RATE:
                raise ValueError(f"{name} must be between 0 and {MAX_RATE:g} per component per hour, got {rate:g}")
        if self.detect <= 0 or self.repair <= 0:
            raise ValueError(f"faults need detect > 0 and repair > 0; got {self.detect:g} and {self.repair:g}")
        repaired = self.worker_rate > 0 or any(f.kind == "worker" and f.down is None for f in self.at)
        if repaired and self.repair <= self.detect:
            raise ValueError(
                f"worker crashes need repair > detect (a node is repaired after its LM noticed the crash); "
                f"got detect={self.detect:g}, repair={self.repair:g}"
            )
        for f in self.at:
            if f.kind == "worker" and f.down is not None and f.down <= self.detect:
                raise ValueError(
                    f"{f.describe()}: down={f.down:g} must be > the detection time {self.detect:g} (--fail-detect)"
                )

    def down(self, fault: Fault) -> float:
        return self.repair if fault.down is None else fault.down

    def of(self, kind: Kind) -> bool:
        """True when some `kind` component crashes (at random or at a given time)."""
        rate = {"worker": self.worker_rate, "lm": self.lm_rate, "gm": self.gm_rate}[kind]
        return rate > 0 or any(f.kind == kind and not f.partition for f in self.at)

    def cuts(self, kind: Kind) -> bool:
        """True when some `kind` component is partitioned."""
        return any(f.kind == kind and f.partition for f in self.at)


def parse_faults(specs: list[str], detect: float, repair: float, seed: int) -> Faults | None:
    """`--fail` specs (see FORMS); None for none. A bad spec raises ValueError: one line naming the bad field."""
    if not specs:
        return None
    rates = {"worker": 0.0, "lm": 0.0, "gm": 0.0}
    at: list[Fault] = []
    for spec in specs:
        kind, _, rest = spec.partition(":")
        if kind not in FORMS:
            raise ValueError(f"--fail {spec}: unknown component {kind!r} (expected worker, lm, gm or partition)")
        try:
            fields = _fields(rest)
            if kind != "partition" and "rate" in fields:
                if len(fields) > 1:
                    raise ValueError("rate= goes alone")
                rates[kind] += _number(fields, "rate", 0.0, high=MAX_RATE)
                if rates[kind] > MAX_RATE:
                    raise ValueError(f"{kind} rates add up to {rates[kind]:g}, over {MAX_RATE:g} per hour")
            else:
                at.append(_fault(kind, fields))
        except ValueError as exc:
            raise ValueError(f"--fail {spec}: {exc} (expected {FORMS[kind]})") from None
    return Faults(rates["worker"], rates["lm"], rates["gm"], tuple(at), detect, repair, seed)


def _fields(rest: str) -> dict[str, str]:
    if not rest:
        raise ValueError("no fields")
    fields: dict[str, str] = {}
    for item in rest.split(","):
        name, eq, value = item.partition("=")
        if not eq or not value:
            raise ValueError(f"field {name!r} has no value")
        if name in fields:
            raise ValueError(f"field {name!r} given twice")
        fields[name] = value
    return fields


def _fault(kind: str, fields: dict[str, str]) -> Fault:
    if kind == "partition":
        targets = [t for t in ("lm", "gm") if t in fields]
        if len(targets) != 1:
            raise ValueError("name one of lm= or gm=")
        target: Kind = "lm" if targets == ["lm"] else "gm"
    else:
        target = kind  # type: ignore[assignment]
    index = "gm" if target == "gm" else "lm"  # a worker node is named by its LM and its number there
    wanted = {"at", "down", index} | ({"node"} if kind == "worker" else set())
    unknown = sorted(set(fields) - wanted)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}")
    for name in ("at", index, "node"):
        if name in wanted and name not in fields:
            raise ValueError(f"missing field {name!r}")
    down = _number(fields, "down", 0.0, strict=True, high=MAX_TIME) if "down" in fields else None
    node = _whole(fields, "node") if kind == "worker" else -1
    return Fault(
        target, _number(fields, "at", 0.0, high=MAX_TIME), _whole(fields, index), node, down, kind == "partition"
    )


def _number(fields: dict[str, str], name: str, low: float, strict: bool = False, high: float = math.inf) -> float:
    try:
        value = float(fields[name])
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{name}={fields[name]!r} is not a number")
    if value < low or (strict and value == low):
        raise ValueError(f"{name}={fields[name]} must be {'>' if strict else '>='} {low:g}")
    if value > high:
        raise ValueError(f"{name}={fields[name]} must be at most {high:g}")
    return value


def _whole(fields: dict[str, str], name: str) -> int:
    try:
        value = int(fields[name])
    except ValueError:
        raise ValueError(f"{name}={fields[name]!r} is not a whole number") from None
    if value < 0:
        raise ValueError(f"{name}={value} must be >= 0")
    return value
