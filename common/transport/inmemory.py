"""In-memory transport: a discrete-event loop that delivers core messages after a per-hop delay.

It runs on a virtual clock (events as fast as the machine allows) or in real time (sleeping until each event is
due). Periodic timers (LM delta ticks) are "background": when only background events remain, the run is over.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from heapq import heappop, heappush

from megha.common.core.messages import Output, Send, Wake

Handler = Callable[[object, float], list[Output]]

GC_GEN0_THRESHOLD = 100_000


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
    """Delivers messages to named endpoints in time order (FIFO among equal times)."""

    def __init__(self, hop_delay: float = 0.0005, realtime: bool = False) -> None:
        if hop_delay < 0:
            raise ValueError(f"hop delay must be >= 0, got {hop_delay}")
        self.hop_delay = hop_delay
        self.realtime = realtime
        self.now = 0.0
        self._heap: list[tuple[float, int, Handler, object]] = []
        self._seq = 0
        self._endpoints: dict[str, Handler] = {}
        self._background: tuple[type, ...] = ()
        self._work = 0
        self.events = 0

    @property
    def pending_work(self) -> int:
        """Events still to come that keep the run alive (all but background timers)."""
        return self._work

    def register(self, address: str, handler: Handler) -> None:
        if address in self._endpoints:
            raise ValueError(f"endpoint {address} registered twice")
        self._endpoints[address] = handler

    def background(self, *types: type) -> None:
        """Message types that do not keep the run alive on their own (periodic timers)."""
        self._background = types

    def post(self, at: float, dest: str, msg: object) -> None:
        """Deliver `msg` to `dest` at time `at`."""
        self.dispatch((Wake(at, dest, msg),))

    def dispatch(self, outputs: Iterable[Output]) -> None:
        """Send a core step's outputs: Send after one hop, Wake at its time. The heap holds each message's handler
        (looked up once, here), so a delivery costs no lookup."""
        heap = self._heap
        endpoints = self._endpoints
        background = self._background
        sent = self.now + self.hop_delay
        for out in outputs:
            handler = endpoints.get(out.dest)
            if handler is None:
                raise KeyError(f"no endpoint {out.dest}")
            msg = out.msg
            self._seq += 1
            heappush(heap, (sent if type(out) is Send else out.at, self._seq, handler, msg))
            if not isinstance(msg, background):
                self._work += 1

    def run(self, keep_going: Callable[[], bool], on_event: Callable[[float], None] | None = None) -> None:
        """Process events until only background events remain and `keep_going()` says no more are needed."""
        with fewer_gc_pauses():
            self._loop(keep_going, on_event)

    def _loop(self, keep_going: Callable[[], bool], on_event: Callable[[float], None] | None) -> None:
        heap = self._heap
        background = self._background
        dispatch = self.dispatch
        realtime = self.realtime
        wall_start = time.monotonic()
        while heap:
            if self._work == 0 and not keep_going():
                return
            at, _, handler, msg = heappop(heap)
            if not isinstance(msg, background):
                self._work -= 1
            if realtime:
                delay = wall_start + at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            self.now = at
            self.events += 1
            outputs = handler(msg, at)
            if outputs:
                dispatch(outputs)
            if on_event is not None:
                on_event(at)
