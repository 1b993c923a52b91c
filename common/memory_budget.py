"""Whether what a command is asked to build fits in this machine's memory, told before it starts.

A replay's data centre and trace, and `megha local`'s processes, grow with numbers on the command line; a typo
(`--lms 100000`, `syn:100000000:1`) would otherwise build for minutes in silence and then swap or be killed by the
kernel. Each command estimates what it will hold from sizes measured on its plainest runs, rounded down (what a
run's options add is left out, so a refused run could not have fit), and refuses, in one line, a run whose estimate
is over the memory this machine (or its container) has available now."""

from __future__ import annotations

from pathlib import Path

GB = 1 << 30

SERVICE_PROCESS_BYTES = 50 << 20
"""The memory a GM, LM or worker agent process holds, at least: 55-68 MB once its modules are imported (measured
2026-11-30), before any state."""

CGROUP_LIMITS = (
    (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current")),  # cgroup v2
    (
        Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        Path("/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ),  # cgroup v1
)


class MemoryBudgetError(ValueError):
    """A run would need more memory than is available; the message says how much, for what, and what to change."""


def _meminfo_available(path: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room(limits: tuple[tuple[Path, Path], ...] = CGROUP_LIMITS) -> int | None:
    """The room left under this process's cgroup memory limit, or None without a limit."""
    for limit_file, usage_file in limits:
        try:
            limit = limit_file.read_text().strip()
            usage = int(usage_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:  # v1 writes "no limit" as ~2**63
            return None
        return max(int(limit) - usage, 0)
    return None


def available_bytes() -> int | None:
    """The memory a new run can use now: the kernel's estimate of what can be allocated without swapping
    (MemAvailable), or less under a container's limit; None where neither can be read (not Linux)."""
    found = [n for n in (_meminfo_available(), _cgroup_room()) if n is not None]
    return min(found) if found else None


def check_fits(needed: int, what: str, advice: str, available: int | None = None) -> None:
    """Raise MemoryBudgetError when `needed` bytes (an estimate of `what`) are more than `available` (by default
    `available_bytes()`; nothing is checked when that is unknown)."""
    room = available_bytes() if available is None else available
    if room is not None and needed > room:
        raise MemoryBudgetError(
            f"{what} would need about {needed / GB:,.1f} GB of memory, more than the {room / GB:,.1f} GB this "
            f"machine has available; {advice}"
        )
