"""The GM core's extension points, each with a plain default, and the registries that name their policies.

| extension point | default | alternatives | module |
|---|---|---|---|
| queue order (QueueSort) | `fifo` | `fair` (fair scheduling), `priority` (over either) | `queue_order`, `priority` |
| preemption (PostFilter) | `none` | `fair-share` (fair scheduling), `priority` (first) | `preemption`, `priority` |
| usage accounting | none | the share book (with fair scheduling) | `usage`, `fairness.queues` |
| class reports | none | the class book (with priority classes) | `priority` |
| node choice | `random` | `min-constraints[-first]`, `first-fit`, `scarcity`, `rarity` | `placement.choice` |
| LM order | `round-robin` | `first-fit`, `scarcity`, `rarity` | `placement.search`, `.scarcity`, `.rarity` |
| unplaceable task (rescheduling) | `park` | `park-freed-node`, `requeue-back` | `unplaceable` |
| unsatisfiable task (admission) | `reject` | `drop` | `unsatisfiable` |
| task refused as inconsistent | `retry` | `wait-for-free` | `inconsistent` |
| waiting order (who gets a freed node) | `shape` | `arrival` (the authors' one queue) | `waiting_order` |
| node states in an LM's launch answer (the LM's) | `always` | `on-refusal` | `answer_states` |
| gang reservation (anti-starvation) | none | LMs held for a gang that waited `gang_reserve_after` s | `reservation` |

A new queue order is one new module here defining a class with the `QueueOrder` methods (or a `KeyedOrder`
subclass with a `key`), plus one line in `QUEUE_ORDERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from megha.common.core.cluster import ClusterSpec
from megha.common.core.fairness.config import FairnessConfig
from megha.common.core.fairness.policy import make_share_policy
from megha.common.core.fairness.queues import ShareBook
from megha.common.core.parked import ParkedShapes
from megha.common.core.placement.choice import ChoicePolicy, RandomChoice
from megha.common.core.placement.rarity import RaritySearch
from megha.common.core.placement.scarcity import ScarcitySearch
from megha.common.core.placement.search import FirstFitSearch, PartitionSearch
from megha.common.core.policies.answer_states import Always, AnswerStates, OnRefusal
from megha.common.core.policies.fair_share import FairQueueOrder, FairSharePreemption
from megha.common.core.policies.inconsistent import InconsistentPolicy, RetryAtOnce, WaitForFree
from megha.common.core.policies.preemption import NoPreemption, PreemptionPolicy
from megha.common.core.policies.priority import (
    ClassBook,
    ClassReports,
    NoClassReports,
    PreemptionChain,
    PriorityOrder,
    PriorityPreemption,
)
from megha.common.core.policies.queue_order import FifoOrder, QueueOrder, UserTurnsOrder
from megha.common.core.policies.unplaceable import ParkByShape, ParkForFreedNode, RequeueBack, UnplaceablePolicy
from megha.common.core.policies.unsatisfiable import DropTasks, RejectJob, UnsatisfiablePolicy
from megha.common.core.policies.usage import NoAccounting, UsageAccounting
from megha.common.core.policies.waiting_order import ArrivalOrder, ShapeOrder, WaitingOrder
from megha.common.core.view import PartitionView

QUEUE_ORDERS: dict[str, Callable[[], QueueOrder]] = {
    FifoOrder.name: FifoOrder,
    UserTurnsOrder.name: UserTurnsOrder,
    "priority": PriorityOrder,
}
"""Queue orders a GM without fair scheduling may use, by name (`megha replay --queue-order`)."""

LM_ORDERS: dict[str, Callable[[int, list[list[PartitionView]]], PartitionSearch]] = {
    "round-robin": PartitionSearch,
    "first-fit": FirstFitSearch,
    "scarcity": ScarcitySearch,
    "rarity": RaritySearch,
}
"""The orders a GM searches LMs' partitions in, by name."""

UNPLACEABLE: dict[str, Callable[[ParkedShapes], UnplaceablePolicy]] = {
    ParkByShape.name: ParkByShape,
    ParkForFreedNode.name: ParkForFreedNode,
    RequeueBack.name: RequeueBack,
}
"""What a GM does with a task that fits nowhere now, by name (`megha replay --unplaceable`); built over the GM's
parked shapes."""

UNSATISFIABLE: dict[str, Callable[[], UnsatisfiablePolicy]] = {
    RejectJob.name: RejectJob,
    DropTasks.name: DropTasks,
}
"""What a GM does at submission with a task no node could ever run, by name (`megha replay --unsatisfiable`)."""

INCONSISTENT: dict[str, Callable[[ParkedShapes], InconsistentPolicy]] = {
    RetryAtOnce.name: RetryAtOnce,
    WaitForFree.name: WaitForFree,
}
"""What a GM does with a task an LM refused as inconsistent, by name (`megha replay --inconsistent`); built over
the shapes a held task waits in (the waiting order's)."""

WAITING_ORDERS: dict[str, Callable[[], WaitingOrder]] = {
    ShapeOrder.name: ShapeOrder,
    ArrivalOrder.name: ArrivalOrder,
}
"""The orders in which a node that frees up serves the tasks waiting for one, by name (`megha replay
--waiting-order`)."""

ANSWER_STATES: dict[str, Callable[[], AnswerStates]] = {
    Always.name: Always,
    OnRefusal.name: OnRefusal,
}
"""Whether an LM's answer to a launch batch carries node states, by name (`megha replay --answer-states`)."""


@dataclass
class GmPolicies:
    """The policies one GM core runs with."""

    queue_order: QueueOrder = field(default_factory=FifoOrder)
    preemption: PreemptionPolicy = field(default_factory=NoPreemption)
    usage: UsageAccounting = field(default_factory=NoAccounting)
    choice: ChoicePolicy = field(default_factory=RandomChoice)
    lm_order: str = "round-robin"
    unplaceable: str = "park"  # an UNPLACEABLE name: the GM builds it over its parked shapes
    unsatisfiable: UnsatisfiablePolicy = field(default_factory=RejectJob)
    class_reports: ClassReports = field(default_factory=NoClassReports)
    inconsistent: InconsistentPolicy = field(default_factory=RetryAtOnce)
    gang_reserve_after: float | None = None  # seconds a gang waits before LMs are held for it (None: never)
    waiting_order: WaitingOrder = field(default_factory=ShapeOrder)  # who of the waiting tasks gets a freed node


def gm_policies(
    gm: int,
    cluster: ClusterSpec,
    fairness: FairnessConfig | None = None,
    choice: ChoicePolicy | None = None,
    queue_order: str = "fifo",
    lm_order: str = "round-robin",
    unplaceable: str = "park",
    unsatisfiable: str = "reject",
    priority_classes: bool = False,
    inconsistent: str = "retry",
    gang_reserve_after: float | None = None,
    waiting_order: str = "shape",
) -> GmPolicies:
    """GM `gm`'s policies: with `fairness`, its user queues, fair share preemption and share book (the queue order
    is then `fair`); without, the named queue order and no preemption. LM order, unplaceable, unsatisfiable and
    inconsistent tasks as named. With `priority_classes`, higher classes are served first over that order and may
    preempt lower ones before any other preemption is tried (`policies/priority.py`). A gang that waited
    `gang_reserve_after` seconds has LMs held for it (`policies.reservation.GangReservation`; None: never). A node
    that frees up serves the waiting tasks in the named waiting order (`arrival` with the FIFO queue order only)."""
    if gang_reserve_after is not None and not gang_reserve_after > 0:
        raise ValueError(f"gang reservation after {gang_reserve_after} s: give a number of seconds above 0")
    for kind, name, known in (
        ("LM order", lm_order, LM_ORDERS),
        ("unplaceable policy", unplaceable, UNPLACEABLE),
        ("unsatisfiable policy", unsatisfiable, UNSATISFIABLE),
        ("inconsistent policy", inconsistent, INCONSISTENT),
        ("waiting order", waiting_order, WAITING_ORDERS),
    ):
        if name not in known:
            raise ValueError(f"unknown {kind} {name!r}; choose one of {sorted(known)}")
    order = WAITING_ORDERS[waiting_order]()
    if order.one_queue and (fairness is not None or queue_order != "fifo" or priority_classes):
        raise ValueError(
            f"waiting order {waiting_order!r} serves one queue in arrival order: it applies with the fifo queue "
            "order only, without fair scheduling or priority classes"
        )
    chosen = choice or RandomChoice()
    plain = GmPolicies(
        choice=chosen,
        lm_order=lm_order,
        unplaceable=unplaceable,
        unsatisfiable=UNSATISFIABLE[unsatisfiable](),
        inconsistent=INCONSISTENT[inconsistent](order.refused_shapes()),
        gang_reserve_after=gang_reserve_after,
        waiting_order=order,
    )
    if fairness is None:
        if queue_order not in QUEUE_ORDERS:
            raise ValueError(f"unknown queue order {queue_order!r}; choose one of {sorted(QUEUE_ORDERS)}")
        policies = replace(plain, queue_order=QUEUE_ORDERS[queue_order]())
    else:
        if queue_order not in ("fifo", FairQueueOrder.name):
            raise ValueError(f"queue order {queue_order!r} does not apply under fair scheduling (its order is 'fair')")
        fairness.check_gms(cluster.num_gms)
        book = ShareBook(fairness, gm, cluster.num_lms, cluster.total_capacity(), make_share_policy(fairness.policy))
        policies = replace(plain, queue_order=FairQueueOrder(book), preemption=FairSharePreemption(book), usage=book)
    return with_priority_classes(policies, cluster) if priority_classes else policies


def with_priority_classes(policies: GmPolicies, cluster: ClusterSpec) -> GmPolicies:
    """`policies` with priority classes: higher classes first over their queue order, and priority preemption
    tried before their preemption policy, over one class book fed by the LMs' reports."""
    book = ClassBook(cluster.num_lms, cluster.total_capacity())
    order = policies.queue_order
    return replace(
        policies,
        queue_order=order if isinstance(order, PriorityOrder) else PriorityOrder(order),
        preemption=PreemptionChain([PriorityPreemption(book), policies.preemption]),
        class_reports=book,
    )
