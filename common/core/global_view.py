"""A GM's view upkeep: its possibly stale copy of every partition's free resources, kept from LM reports with
read-your-writes for its own placements still in flight (Megha paper, section IV-B: the GM's global state)."""

from __future__ import annotations

from collections.abc import Iterable
from operator import add, ge, gt, sub

from megha.common.core.cluster import ClusterSpec
from megha.common.core.messages import NodeState, Placement
from megha.common.core.resources import Resources
from megha.common.core.view import PartitionView


class GlobalView:
    """Every partition of every LM as GM `gm` last heard of it.

    LM reports (absolute, versioned node states) are held, newest per node, and reach the partition views only
    when a placement needs them (`sync`), so a node that changed many times in between costs one update. The
    GM's own placements deduct from the view at once; until their LM answers, they are re-applied on top of any
    state the LM read before processing them."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.resource_names = cluster.resource_names
        # views[lm][gm]: partition gm of LM lm.
        self.views: list[list[PartitionView]] = [
            [PartitionView(cluster.partitions[lm][g], cluster.partition_start(lm, g)) for g in range(cluster.num_gms)]
            for lm in range(cluster.num_lms)
        ]
        # locate[lm][node]: the partition view holding LM `lm`'s node, and the node's index in it.
        self.locate: list[list[tuple[PartitionView, int]]] = [
            [(view, i) for view in row for i in range(view.size)] for row in self.views
        ]
        # The newest node version each LM reported, held or adopted: a held state is newer than the node's adopted
        # one, so one number per node is all `hold_states` needs to keep only the newest state of each node.
        self._newest_version: list[list[int]] = [[0] * len(nodes) for nodes in self.locate]
        # Newest LM-reported state per node not yet in the view: node -> (free, applied_through), in the order the
        # nodes were first reported since the last `sync` (the order in which freed nodes retry parked tasks).
        self._unapplied_states: list[dict[int, tuple[Resources, int]]] = [{} for _ in range(cluster.num_lms)]
        self.has_unapplied_states = False
        # The requests of launch batches sent and not answered yet, per LM: node -> [(seq, request)].
        self._unanswered_requests: list[dict[int, list[tuple[int, Resources]]]] = [{} for _ in range(cluster.num_lms)]
        # (LM, node) whose free resources grew since the GM last took them: parked tasks may fit there.
        self.freed_nodes: list[tuple[int, int]] = []
        # LMs out of the view (`take_out`: their GM cannot reach them): lm -> each partition's free resources as the
        # view would hold them, kept current while the partitions show nothing free.
        self.out: dict[int, list[list[Resources]]] = {}

    def partitions(self) -> Iterable[PartitionView]:
        return (v for row in self.views for v in row)

    # ------------------------------------------------------- own placements

    def deduct(self, lm: int, node: int, request: Resources) -> None:
        """A placement of this GM takes `request` on LM `lm`'s node."""
        view, i = self.locate[lm][node]
        if self.out and lm in self.out:
            saved = self.out[lm][view.gm]
            saved[i] = tuple(map(sub, saved[i], request))
            return
        view.set_free(i, tuple(map(sub, view.free[i], request)))

    def undo(self, lm: int, node: int, request: Resources, freed: bool = True) -> None:
        """A deduction of this GM that was never sent is given back; `freed`: parked tasks may use it now."""
        view, i = self.locate[lm][node]
        if self.out and lm in self.out:
            saved = self.out[lm][view.gm]
            saved[i] = tuple(map(min, view.capacity[i], map(add, saved[i], request)))
            return
        view.set_free(i, tuple(map(min, view.capacity[i], map(add, view.free[i], request))))
        if freed:
            self.freed_nodes.append((lm, node))

    def sent(self, lm: int, seq: int, placements: Iterable[Placement]) -> None:
        """Launch batch `seq` went to LM `lm`: its requests hold until the LM answers (read-your-writes)."""
        unanswered = self._unanswered_requests[lm]
        for p in placements:
            unanswered.setdefault(p.node, []).append((seq, p.task.request))

    def answered(self, lm: int, seq: int, placements: Iterable[Placement]) -> None:
        """LM `lm` answered batch `seq`: its state reports cover those placements from now on."""
        unanswered = self._unanswered_requests[lm]
        for p in placements:
            entries = unanswered.get(p.node, [])
            if (seq, p.task.request) in entries:
                entries.remove((seq, p.task.request))
            if not entries:
                unanswered.pop(p.node, None)

    def given_back(self, lm: int, seq: int, placements: Iterable[Placement]) -> None:
        """Batch `seq` to LM `lm` got no answer: its requests return to the view (if the LM launched them after
        all, its next report of the node says so)."""
        self.sync()
        self.answered(lm, seq, placements)
        for p in placements:
            self.undo(lm, p.node, p.task.request)

    # ----------------------------------------------------------- LM reports

    def hold_states(self, lm: int, states: Iterable[NodeState], applied_through: int) -> None:
        """Keep the newest reported state of each node until the view next needs it."""
        newest = self._newest_version[lm]
        unapplied = self._unapplied_states[lm]
        held_any = False
        for node, free, version in states:
            if version > newest[node]:  # newer than the node's adopted state and than any state held for it
                newest[node] = version
                unapplied[node] = (free, applied_through)
                held_any = True
        if held_any:
            self.has_unapplied_states = True

    def sync(self) -> None:
        """Adopt the held LM states, re-applying this GM's own placements on a node that the LM had not
        processed when it read the state (read-your-writes); note which nodes gained free resources.

        This runs over every node state the LMs report (hundreds of thousands in a replay), so the partition
        view's `set_free` is inlined: the same update of its free resources and fit caches."""
        self.has_unapplied_states = False
        freed = self.freed_nodes
        for lm, unapplied in enumerate(self._unapplied_states):
            if not unapplied:
                continue
            if self.out and lm in self.out:
                self.has_unapplied_states = True  # adopted once the LM is back in the view (`take_in`)
                continue
            locate = self.locate[lm]
            unanswered = self._unanswered_requests[lm]
            for node, (free, applied_through) in unapplied.items():
                if unanswered:
                    pending = unanswered.get(node)
                    if pending:
                        for seq, request in pending:
                            if seq > applied_through:
                                free = tuple(map(sub, free, request))
                view, i = locate[node]
                view_free = view.free
                old = view_free[i]
                if free != old:
                    if any(map(gt, free, old)):
                        freed.append((lm, node))
                    view_free[i] = free  # view.set_free(i, free), inline
                    fit = view.fit_cache
                    if fit:
                        bit = 1 << i
                        for request, bits in fit.items():
                            fit[request] = bits | bit if all(map(ge, free, request)) else bits & ~bit
            unapplied.clear()

    # ------------------------------------------------------- unreachable LMs

    def take_out(self, lm: int) -> None:
        """LM `lm` cannot be reached: its nodes show nothing free, so no placement goes there, while what the view
        would hold of them is kept aside (its reports, and requests given back, still apply to that) until
        `take_in`. Their capacity stays: a task only such nodes could run waits rather than being unschedulable."""
        if lm in self.out:
            return
        self.sync()
        self.out[lm] = [list(view.free) for view in self.views[lm]]
        nothing = tuple(0 for _ in self.resource_names)
        for view in self.views[lm]:
            for i in range(view.size):
                view.set_free(i, nothing)

    def take_in(self, lm: int) -> None:
        """LM `lm` answers again: its nodes' free resources return to the view (parked tasks may fit there), and
        the states it reported meanwhile are adopted at the next `sync`."""
        saved = self.out.pop(lm, None)
        if saved is None:
            return
        for view, free in zip(self.views[lm], saved, strict=True):
            for i, amount in enumerate(free):
                view.set_free(i, amount)
                if any(amount):
                    self.freed_nodes.append((lm, view.start + i))
        if self._unapplied_states[lm]:
            self.has_unapplied_states = True

    def take_freed(self) -> list[tuple[int, int]]:
        """The nodes whose free resources grew since the last call, oldest first."""
        freed, self.freed_nodes = self.freed_nodes, []
        return freed

    # --------------------------------------------------------------- queries

    def total_capacity(self) -> list[int]:
        return [sum(c[k] for v in self.partitions() for c in v.capacity) for k in range(len(self.resource_names))]

    def partition_usage(self) -> list[dict[str, int | float]]:
        """Each partition's size and used share of its first resource, in this view."""
        return [
            {"lm": v.lm, "gm": v.gm, "nodes": v.size, "used_fraction": round(v.used_fraction(), 4)}
            for v in self.partitions()
        ]
