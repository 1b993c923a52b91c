"""Bounds shared by the services' settings and the simulator's configuration (a light module: a replay imports it
without the settings' pydantic machinery)."""

from __future__ import annotations

MIN_INTERVAL = 0.001
"""The fewest seconds between two rounds of a repeated action (a delta update, a heartbeat, a dependency poll, a
liveness check): a shorter interval, 1e-300 say, would make a busy loop of it (or overflow the delta timer)."""
