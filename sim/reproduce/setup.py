"""How big a reproduction runs: the scale (the paper's set-up, a reduced quick one, or a tiny one for tests) and
the seeds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeVar

Scale = Literal["full", "quick", "tiny"]
SCALES: tuple[Scale, ...] = ("full", "quick", "tiny")
#: Seeds run when none are asked for: the constraint-aware paper's three at full scale, one otherwise.
DEFAULT_SEEDS: dict[Scale, int] = {"full": 3, "quick": 1, "tiny": 1}
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Setup:
    """One reproduction's scale and seeds (0 .. n-1)."""

    scale: Scale = "full"
    seeds: tuple[int, ...] = (0, 1, 2)

    @classmethod
    def of(cls, scale: Scale, seeds: int | None = None) -> Setup:
        if scale not in SCALES:
            raise ValueError(f"scale {scale!r}: choose from {', '.join(SCALES)}")
        count = DEFAULT_SEEDS[scale] if seeds is None else seeds
        if count < 1:
            raise ValueError(f"seeds must be at least 1, got {count}")
        return cls(scale, tuple(range(count)))

    def pick(self, full: T, quick: T, tiny: T) -> T:
        """The value for this scale."""
        return {"full": full, "quick": quick, "tiny": tiny}[self.scale]

    def describe(self) -> str:
        return f"scale {self.scale}, seed{'s' if len(self.seeds) > 1 else ''} {', '.join(map(str, self.seeds))}"
