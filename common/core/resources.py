"""Resource vectors: integer amounts per resource type, aligned to a data centre's resource names."""

from __future__ import annotations

from collections.abc import Sequence

CPU = "cpu_millicores"
MEMORY = "memory_mb"
DEFAULT_RESOURCE_NAMES: tuple[str, ...] = (CPU, MEMORY)

Resources = tuple[int, ...]


def fits(request: Resources, free: Resources) -> bool:
    """True when every requested amount is available."""
    return all(r <= f for r, f in zip(request, free, strict=True))


def subtract(a: Resources, b: Resources) -> Resources:
    return tuple(x - y for x, y in zip(a, b, strict=True))


def add(a: Resources, b: Resources) -> Resources:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def describe(amounts: Resources, names: Sequence[str]) -> str:
    return ", ".join(f"{n}={v}" for n, v in zip(names, amounts, strict=True))
