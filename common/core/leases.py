"""The LM side of gang scheduling: all-or-nothing validation of a gang's placements, and the leases that hold a
prepared gang's resources until its GM commits (launch) or aborts, or the lease expires (docs/gang.md)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from operator import add, sub
from typing import TYPE_CHECKING

from megha.common.core.messages import (
    GangAbort,
    GangCommit,
    GangCommitted,
    GangPrepare,
    GangPrepared,
    LeaseExpiry,
    Output,
    Placement,
    Send,
    Wake,
    WorkerLaunch,
    gm_address,
    lm_address,
    worker_address,
)

if TYPE_CHECKING:
    from megha.common.core.lm import LocalMaster

LAUNCHED_KEPT = 10_000
"""How many launched gang parts an LM remembers, so that a repeated commit (its answer was lost) is answered as the
first was instead of refused."""

GANG_MESSAGES = (GangPrepare, GangCommit, GangAbort, LeaseExpiry)
"""What `GangLeases.handle` takes (the LM routes them here)."""


@dataclass(slots=True)
class Lease:
    """The resources prepare `seq` of GM `gm`'s gang `gang` reserved on this LM, held until `expires_at` (LM time)."""

    gm: int
    gang: str
    seq: int
    placements: list[Placement]
    expires_at: float


class GangLeases:
    """LM `lm`'s gang protocol (the LM is the plan applier here as for launch batches):

    1. prepare: validate every placement against the authoritative node table as a launch would, each on top of
       the ones before it; one failure refuses them all and nothing stays reserved; else reserve them all;
    2. with `commit` set (a gang on one LM), launch at once; else hold the reservation under a lease;
    3. commit: launch the lease's placements, unless the lease expired (refused: the GM aborts the rest);
    4. abort or expiry: give the reservation back, reported to every GM by delta.

    A lease is keyed by (GM, gang); a prepare with a newer `seq` for the same gang replaces an older lease."""

    def __init__(self, lm: LocalMaster) -> None:
        self.lm = lm
        self.held: dict[tuple[int, str], Lease] = {}
        self.refused = 0  # prepares refused (some placement failed validation)
        self.expired = 0  # leases that ran out before their commit
        self.committed = 0  # gangs (or their parts on this LM) launched
        self._launched: OrderedDict[tuple[int, str], int] = OrderedDict()  # the newest launched parts' prepare seqs

    def handle(self, msg: object, now: float) -> list[Output]:
        if isinstance(msg, GangPrepare):
            return self._prepare(msg, now)
        if isinstance(msg, GangCommit):
            return self._commit(msg, now)
        if isinstance(msg, GangAbort):
            return self._end(msg.gm, msg.gang, msg.seq, now, expired=False)
        if isinstance(msg, LeaseExpiry):
            return self._end(msg.gm, msg.gang, msg.seq, now, expired=True)
        raise TypeError(f"LM gang leases cannot handle {type(msg).__name__}")

    def reserved(self) -> list[Placement]:
        """The placements held under leases."""
        return [p for lease in self.held.values() for p in lease.placements]

    # ------------------------------------------------------------- prepare

    def _prepare(self, req: GangPrepare, now: float) -> list[Output]:
        lm = self.lm
        if not 0 <= req.gm < lm.num_gms:
            raise ValueError(f"gang prepare from unknown GM {req.gm}")
        if req.lease_s <= 0 and not req.commit:
            raise ValueError(f"gang lease must be positive, got {req.lease_s}")
        lm._applied_through[req.gm] = max(lm._applied_through[req.gm], req.seq)
        key = (req.gm, req.gang)
        old = self.held.get(key)
        out: list[Output] = []
        if old is not None:
            if old.seq == req.seq:  # a repeated prepare: answered as the first was
                return [self._prepared(req, True, "", old.placements)]
            if old.seq > req.seq:  # an older prepare overtaken by a newer one: it reserves nothing
                return [self._prepared(req, False, f"prepare {req.seq} of gang {req.gang} is superseded", [])]
            self._release(self.held.pop(key))
        reason = self._reserve(req)
        if reason:
            self.refused += 1
            lm.observer.gang_refused(req.gang, lm.lm_id, reason, now)
            out.append(self._prepared(req, False, reason, req.placements))
        elif req.commit:
            self._launch(Lease(req.gm, req.gang, req.seq, req.placements, now), now, out)
            out.insert(0, self._prepared(req, True, "", req.placements))
        else:
            lease = Lease(req.gm, req.gang, req.seq, req.placements, now + req.lease_s)
            self.held[key] = lease
            out.append(self._prepared(req, True, "", req.placements))
            out.append(Wake(lease.expires_at, lm_address(lm.lm_id), LeaseExpiry(req.gm, req.seq, req.gang)))
        lm._arm_tick(now, out)
        return out

    def _reserve(self, req: GangPrepare) -> str:
        """Reserve every placement of `req` (each validated on top of those before it) and return "", or reserve
        none and return why the first that failed did. Every node the request names gets a new version either
        way, so the GM adopts the LM's states of them over its own deductions."""
        lm = self.lm
        nodes = lm.nodes
        reserved: list[Placement] = []
        reason = ""
        seen: set[str] = set()
        for p in req.placements:
            task_id = p.task.task_id
            rejection = lm._validate(p, req.gm, lm.running.get(task_id) or lm.preempting.get(task_id))
            if rejection is None and task_id in seen:
                reason = f"task {task_id} appears twice in gang {req.gang}"
            elif rejection is not None:
                reason = rejection.reason
            if reason:
                break
            seen.add(task_id)
            nodes.set_free(p.node, tuple(map(sub, lm.free[p.node], p.task.request)), except_gm=req.gm)
            reserved.append(p)
        if reason:
            for p in reserved:
                nodes.set_free(p.node, tuple(map(add, lm.free[p.node], p.task.request)), except_gm=req.gm)
            for n in {p.node for p in req.placements if 0 <= p.node < len(lm.free)}:
                nodes.set_free(n, lm.free[n], except_gm=req.gm)
        return reason

    def _prepared(self, req: GangPrepare, ok: bool, reason: str, placements: list[Placement]) -> Send:
        lm = self.lm
        touched = dict.fromkeys(p.node for p in placements if 0 <= p.node < len(lm.free))
        states = [lm.nodes.state(n) for n in touched]
        answer = GangPrepared(req.gm, lm.lm_id, req.seq, req.gang, ok, reason, states, lm._take_delta(req.gm))
        return Send(gm_address(req.gm), answer)

    # -------------------------------------------------------------- commit

    def _commit(self, req: GangCommit, now: float) -> list[Output]:
        lm = self.lm
        lease = self.held.get((req.gm, req.gang))
        out: list[Output] = []
        reason = ""
        if lease is None and self._launched.get((req.gm, req.gang)) == req.seq:
            return [
                Send(
                    gm_address(req.gm),
                    GangCommitted(req.gm, lm.lm_id, req.seq, req.gang, True, "", [], lm._take_delta(req.gm)),
                )
            ]
        if lease is None or lease.seq != req.seq:
            reason = f"no lease for gang {req.gang} (prepare {req.seq}): it expired or was aborted"
        elif now >= lease.expires_at:
            reason = f"the lease of gang {req.gang} (prepare {req.seq}) expired at {lease.expires_at:.3f}"
        elif any(p.node in lm.down for p in lease.placements):
            reason = f"a node reserved for gang {req.gang} went out of service"
        if reason:
            if lease is not None and lease.seq == req.seq:
                del self.held[(req.gm, req.gang)]
                self.expired += 1
                self._release(lease)
            touched = [] if lease is None else [p.node for p in lease.placements]
        else:
            del self.held[(req.gm, req.gang)]
            self._launch(lease, now, out)  # type: ignore[arg-type]  # not None: checked above
            touched = [p.node for p in lease.placements]  # type: ignore[union-attr]
        states = [lm.nodes.state(n) for n in dict.fromkeys(touched)]
        answer = GangCommitted(req.gm, lm.lm_id, req.seq, req.gang, not reason, reason, states, lm._take_delta(req.gm))
        out.insert(0, Send(gm_address(req.gm), answer))
        lm._arm_tick(now, out)
        return out

    def _launch(self, lease: Lease, now: float, out: list[Output]) -> None:
        """Turn the reservation into runs: each placement is allocated as a launch allocates it, and started."""
        lm = self.lm
        nodes = lm.nodes
        for p in lease.placements:
            nodes.set_free(p.node, tuple(map(add, lm.free[p.node], p.task.request)), except_gm=lease.gm)
            lm._allocate(p, lease.gm)
        self.committed += 1
        self._launched[(lease.gm, lease.gang)] = lease.seq
        if len(self._launched) > LAUNCHED_KEPT:
            self._launched.popitem(last=False)
        lm.launched += len(lease.placements)
        lm.observer.lm_received(lease.placements, now)
        lm.observer.launched(lease.placements, now)
        out.append(Send(worker_address(lm.lm_id), WorkerLaunch(lm.lm_id, list(lease.placements))))

    # ------------------------------------------------------- abort, expiry

    def _end(self, gm: int, gang: str, seq: int, now: float, expired: bool) -> list[Output]:
        lease = self.held.get((gm, gang))
        if lease is None or lease.seq != seq:
            return []  # committed, aborted or replaced already
        del self.held[(gm, gang)]
        if expired:
            self.expired += 1
        self._release(lease)
        out: list[Output] = []
        self.lm._arm_tick(now, out)
        return out

    def _release(self, lease: Lease) -> None:
        """Give a lease's reservation back; every GM (its own included) learns it by delta."""
        lm = self.lm
        for p in lease.placements:
            if p.node in lm.down:
                continue  # a node out of service shows nothing free until it is brought up
            lm.nodes.set_free_for_all(p.node, tuple(map(add, lm.free[p.node], p.task.request)))
