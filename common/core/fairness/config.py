"""User queues and their shares: which GM serves each queue, and the share policy all GMs and LMs apply."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """The queue of user `user`: its `share` (0 < share <= 1) of the data centre's resources, served by GM `gm`."""

    user: str
    share: float
    gm: int

    def __post_init__(self) -> None:
        if not self.user:
            raise ValueError("a queue needs a user name")
        if not 0 < self.share <= 1:
            raise ValueError(f"queue {self.user}: share must be in (0, 1], got {self.share}")
        if self.gm < 0:
            raise ValueError(f"queue {self.user}: GM must be >= 0, got {self.gm}")


@dataclass(frozen=True, slots=True)
class FairnessConfig:
    """Every queue of the data centre (each mapped to exactly one GM) and the share policy's name."""

    queues: tuple[QueueSpec, ...]
    policy: str = "share"

    def __post_init__(self) -> None:
        if not self.queues:
            raise ValueError("fair scheduling needs at least one queue")
        users = [q.user for q in self.queues]
        duplicates = sorted({u for u in users if users.count(u) > 1})
        if duplicates:
            raise ValueError(f"queues {duplicates} are configured twice; each user has exactly one queue")
        total = sum(q.share for q in self.queues)
        if total > 1 + 1e-9:
            raise ValueError(f"queue shares add up to {total:.3f}; they must not exceed 1")

    def shares(self) -> dict[str, float]:
        return {q.user: q.share for q in self.queues}

    def queues_of(self, gm: int) -> tuple[QueueSpec, ...]:
        return tuple(q for q in self.queues if q.gm == gm)

    def check_gms(self, num_gms: int) -> None:
        """Raise ValueError naming a queue mapped to a GM the data centre does not have."""
        for q in self.queues:
            if q.gm >= num_gms:
                raise ValueError(f"queue {q.user} is mapped to GM {q.gm}; there are GMs 0..{num_gms - 1}")


def parse_queues(text: str, policy: str = "share") -> FairnessConfig:
    """Queues from 'user:share:gm,...', e.g. 'q1:0.10:0,q2:0.25:1' (shares as fractions or percentages)."""
    queues = []
    for k, item in enumerate(x.strip() for x in text.split(",") if x.strip()):
        parts = item.split(":")
        if len(parts) != 3:
            raise ValueError(f"queue {k}: {item!r} is not user:share:gm")
        user, share_text, gm_text = parts
        try:
            share = float(share_text.rstrip("%")) / (100 if share_text.endswith("%") else 1)
            gm = int(gm_text)
        except ValueError as exc:
            raise ValueError(f"queue {k}: {item!r}: share must be a number and gm an integer") from exc
        queues.append(QueueSpec(user, share, gm))
    return FairnessConfig(tuple(queues), policy)
