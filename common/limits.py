"""Bounds shared by the services' settings and the simulator's configuration (a light module: a replay imports it
without the settings' pydantic machinery)."""

from __future__ import annotations

MIN_INTERVAL = 0.001
"""The fewest seconds between two rounds of a repeated action (a delta update, a heartbeat, a dependency poll, a
liveness check): a shorter interval, 1e-300 say, would make a busy loop of it (or overflow the delta timer)."""

MAX_WAIT_SECONDS = 86_400.0
"""The most seconds a service waits for a peer or a broker, or lets pass between two rounds of a repeated action: a
day. A setting beyond (1e30 s, say, which is finite) would wait for ever as surely as inf, which is refused too."""

MAX_GMS = 4096
"""The most GMs a deployment may have (MEGHA_NUM_GMS): each LM's cluster has a partition per GM, and an LM holds a
fencing term per GM."""
