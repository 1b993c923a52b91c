"""In-memory transport: a discrete-event loop that delivers core messages after a per-hop delay.

It runs on a virtual clock (events as fast as the machine allows) or in real time (sleeping until each event is
due). Periodic timers (LM delta ticks) are "background": when only background events remain, the run is over.

Under a decision-time model (`megha.common.core.costs`), each GM and LM endpoint is a server: a message delivered
while it is busy waits in its FIFO queue, handling it takes the model's time, and its outputs leave when the
handling ends. `ServedObserver` stamps the recorder's task events with those times.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from heapq import heappop, heappush

from megha.common.core.costs import DecisionCosts, Kind, Price
from megha.common.core.messages import Output, Placement, Wake
from megha.common.core.observer import EVENTS, CoreObserver, records
from megha.common.core.task import JobSpec, TaskSpec

Handler = Callable[[object, float], list[Output]]
#: What an endpoint is: a core's handler, or a `_Server` that runs one under a cost model and sends its outputs itself.
Endpoint = Callable[[object, float], list[Output] | None]

GC_GEN0_THRESHOLD = 100_000
EVENT_ORDERS = ("fifo", "seeded")
"""How the loop orders events due at the same time: in the order they were sent, or in a random order drawn with a
seed (as the constraint-aware paper's simulator leaves it undefined: its events all compare as less)."""


@contextmanager
def fewer_gc_pauses() -> Iterator[None]:
    """A run allocates millions of short-lived, acyclic message objects that reference counting frees; the
    cyclic collector's default gen-0 threshold (700) would scan the heap thousands of times for nothing."""
    old = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)


class EventLoop:
    """Delivers messages to named endpoints in time order: FIFO among equal times, or with `ties_seed` in a random
    order drawn with that seed (`EVENT_ORDERS`' "seeded"), even for messages between the same two endpoints."""

    def __init__(
        self,
        hop_delay: float = 0.0005,
        realtime: bool = False,
        costs: DecisionCosts | None = None,
        ties_seed: int | None = None,
    ) -> None:
        if hop_delay < 0:
            raise ValueError(f"hop delay must be >= 0, got {hop_delay}")
        # None: FIFO among equal times; else the generator of each message's random rank among them
        self._ties = None if ties_seed is None else random.Random(ties_seed)
        self.hop_delay = hop_delay
        self.realtime = realtime
        self.costs = None if costs is None or costs.zero else costs  # None: deciding takes no time
        # (delivered, started, ended) of the message a GM or LM server is handling, None between handlings
        self.serving: tuple[float, float, float] | None = None
        self.now = 0.0
        self._heap: list[tuple[float, int, Endpoint, object]] = []
        self._seq = 0
        self._endpoints: dict[str, Endpoint] = {}
        self._background: tuple[type, ...] = ()
        self._work = 0
        self.events = 0

    @property
    def pending_work(self) -> int:
        """Events still to come that keep the run alive (all but background timers)."""
        return self._work

    def register(self, address: str, handler: Handler, kind: Kind | None = None) -> None:
        """Deliver messages for `address` to `handler`; a GM or LM (`kind`) is a server under a cost model."""
        if address in self._endpoints:
            raise ValueError(f"endpoint {address} registered twice")
        self._endpoints[address] = (
            handler if kind is None or self.costs is None else _Server(self, handler, self.costs.pricer(kind))
        )

    def stamped(self, observer: CoreObserver) -> CoreObserver:
        """The observer to give a GM or LM core: `observer` itself, or under a cost model a `ServedObserver`."""
        return observer if self.costs is None else ServedObserver(observer, self)

    def background(self, *types: type) -> None:
        """Message types that do not keep the run alive on their own (periodic timers)."""
        self._background = types

    def post(self, at: float, dest: str, msg: object) -> None:
        """Deliver `msg` to `dest` at time `at`."""
        self.dispatch((Wake(at, dest, msg),))

    def dispatch(self, outputs: Iterable[Output], at: float | None = None) -> None:
        """Send a core step's outputs at `at` (default: now): Send after one hop, Wake at its time. The heap holds
        each message's handler (looked up once, here), so a delivery costs no lookup. Among equal times the heap
        orders by the second item: the sending order, or a random rank above it (the sending order stays unique)."""
        heap = self._heap
        endpoints = self._endpoints
        background = self._background
        ties = self._ties
        sent = (self.now if at is None else at) + self.hop_delay
        for out in outputs:
            handler = endpoints.get(out.dest)
            if handler is None:
                raise KeyError(f"no endpoint {out.dest}")
            msg = out.msg
            self._seq += 1
            rank = self._seq if ties is None else ties.getrandbits(32) << 40 | self._seq
            heappush(heap, (out.at if type(out) is Wake else sent, rank, handler, msg))
            if not isinstance(msg, background):
                self._work += 1

    def run(
        self,
        keep_going: Callable[[], bool],
        on_event: Callable[[float], None] | None = None,
        settled: Callable[[], bool] | None = None,
    ) -> None:
        """Process events until only background events remain and `keep_going()` says no more are needed. In real
        time, an event due while `settled()` (the work is over; what is left changes no task, as a fault process's
        crashes and repairs after the last task) is processed at once: what the virtual clock passes for free is
        not waited for on the wall clock, and the run ends when its work does."""
        with fewer_gc_pauses():
            self._loop(keep_going, on_event, settled)

    def _loop(
        self,
        keep_going: Callable[[], bool],
        on_event: Callable[[float], None] | None,
        settled: Callable[[], bool] | None,
    ) -> None:
        heap = self._heap
        background = self._background
        dispatch = self.dispatch
        realtime = self.realtime
        wall_start = time.monotonic()
        while heap:
            if self._work == 0 and not keep_going():
                return
            if realtime:  # wait for the next event's time (asked before it leaves the heap: it may be work)
                delay = wall_start + heap[0][0] - time.monotonic()
                if delay > 0:
                    if settled is not None and settled():
                        wall_start -= delay  # the wait is skipped: later events keep their spacing
                    else:
                        time.sleep(delay)
            at, _, handler, msg = heappop(heap)
            if not isinstance(msg, background):
                self._work -= 1
            self.now = at
            self.events += 1
            outputs = handler(msg, at)
            if outputs:
                dispatch(outputs)
            if on_event is not None:
                on_event(at)


class _Server:
    """A GM or LM endpoint that takes time to decide. Messages reach it in delivery order and it handles them
    in that order, so the core is handed each one as it is delivered, with `now` = when its handling starts
    (after the ones before it: the FIFO queue's wait); its outputs are sent when the handling ends. Nothing
    else reaches the core in between (all its input is messages, delivered later), so this is the queue's
    outcome without a second event per message."""

    __slots__ = ("free_at", "handler", "loop", "price")

    def __init__(self, loop: EventLoop, handler: Handler, price: Price) -> None:
        self.loop = loop
        self.handler = handler
        self.price = price
        self.free_at = 0.0  # when the message handled last is done

    def __call__(self, msg: object, at: float) -> None:
        start = at if at > self.free_at else self.free_at
        end = self.free_at = start + self.price(msg)
        loop = self.loop
        loop.serving = (at, start, end)
        outputs = self.handler(msg, start)
        loop.serving = None
        if outputs:
            loop.dispatch(outputs, end)


class ServedObserver(CoreObserver):
    """A GM's or LM's observer under a cost model: the task events that bound allocation time's components carry
    the served message's times, so framework queuing (arrival -> attempt) counts the wait for a busy GM and
    processing (attempt -> decided, LM received -> launched) the GM's deciding and the LM's wait and validation.
    A job arrives and an LM receives a batch when the message is delivered; an attempt starts when the GM starts
    handling; a decision and a launch are made when the handling ends. Other events pass through unchanged."""

    STAMPED = ("job_arrived", "attempt", "decided", "lm_received", "launched")

    def __init__(self, observer: CoreObserver, loop: EventLoop) -> None:
        self.observer = observer
        self.loop = loop
        for name in EVENTS:
            if name not in self.STAMPED and records(observer, name):
                setattr(self, name, getattr(observer, name))

    def _times(self, now: float) -> tuple[float, float, float]:
        return self.loop.serving or (now, now, now)

    def job_arrived(self, job: JobSpec, gm: int, now: float) -> None:
        self.observer.job_arrived(job, gm, self._times(now)[0])

    def attempt(self, task: TaskSpec, now: float) -> None:
        self.observer.attempt(task, self._times(now)[1])

    def decided(self, placements: Sequence[Placement], now: float) -> None:
        self.observer.decided(placements, self._times(now)[2])

    def lm_received(self, placements: Sequence[Placement], now: float) -> None:
        self.observer.lm_received(placements, self._times(now)[0])

    def launched(self, placements: Sequence[Placement], now: float) -> None:
        self.observer.launched(placements, self._times(now)[2])
