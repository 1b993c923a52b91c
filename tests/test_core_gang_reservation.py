"""Reservation for a starving gang (docs/gang.md, "Starvation: reservation"): a wide gang that waits behind a stream
of small jobs for ever is placed once its GM holds LMs for it; the held LMs are held only against other jobs of the
same or a lower priority, younger gangs included, and only on the LMs chosen; the GM's LM order is put back and
every task ends once."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from megha.common.core.gm import GlobalMaster
from megha.common.core.messages import Placement
from megha.common.core.observer import CoreObserver
from megha.common.core.placement.search import PartitionSearch
from megha.common.core.policies.reservation import fits_idle
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.settings import GMSettings
from megha.embedded.system import EmbeddedConfig, EmbeddedSystem

from corekit import CAP, cluster, task


class Starts(CoreObserver):
    """The order tasks started on their workers, with the LM each started on, and the tasks that ended."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.lm: dict[str, int] = {}
        self.ended: list[str] = []

    def started(self, placements: Sequence[Placement], now: float) -> None:
        for p in placements:
            self.order.append(p.task.task_id)
            self.lm[p.task.task_id] = p.lm

    def task_completed(self, task: TaskSpec, error: str, now: float, forwarded: bool) -> None:
        self.ended.append(task.task_id)


def _gang(job_id: str, n: int, at: float, duration: float = 1.0) -> JobSpec:
    return JobSpec(job_id, tuple(task(f"{job_id}.{k}", duration=duration) for k in range(n)), at, gang=math.inf)


def _single(job_id: str, at: float, duration: float, priority: int = 0) -> JobSpec:
    one = TaskSpec(f"{job_id}.0", job_id, "user-0", duration, CAP, 0, priority=priority)
    return JobSpec(job_id, (one,), at)


def _run(spec: object, jobs: Sequence[JobSpec], reserve_after: float | None) -> tuple[EmbeddedSystem, Starts]:
    seen = Starts()
    system = EmbeddedSystem(spec, EmbeddedConfig(gang_reserve_after=reserve_after), seen)  # type: ignore[arg-type]
    for job in jobs:
        system.submit(0, job)
    system.run()
    assert sorted(seen.ended) == sorted(t.task_id for job in jobs for t in job.tasks)  # every task ends once
    assert all(lm.free == lm.capacity for lm in system.lms)
    return system, seen


@pytest.mark.parametrize("reserve_after", [None, 5.0])
def test_a_wide_gang_starves_behind_a_stream_of_small_jobs_unless_its_gm_holds_lms_for_it(
    reserve_after: float | None,
) -> None:
    """Four nodes; a job of one task arrives every 0.5 s for a minute, each running 1.9 s, so three or four nodes are
    always busy; a gang of four arrives at 1 s. Without a reservation it starts only once the stream has dried up;
    with one after 5 s, its GM stops placing the small jobs on the LM, the LM drains, and the gang starts."""
    stream = [_single(f"s{k}", 0.5 * k, 1.9) for k in range(120)]
    system, seen = _run(cluster([[[[], [], [], []]]]), [*stream, _gang("g", 4, 1.0)], reserve_after)
    first_gang_start = seen.order.index("g.0")
    singles_before = sum(1 for t in seen.order[:first_gang_start] if t.startswith("s"))
    gm: GlobalMaster = system.gms[0]  # type: ignore[assignment]
    if reserve_after is None:
        assert singles_before == 120 and gm.gangs.reservation is None  # starved until the last small job started
    else:
        assert singles_before < 20  # the gang started within seconds of the reservation
        reservation = gm.gangs.reservation
        assert reservation is not None and reservation.made == 1 and reservation.gang is None
        assert type(gm.placer.search) is PartitionSearch  # the LM order is put back


def _held_lm_0(later: JobSpec, reserve_after: float | None) -> Starts:
    """Two LMs of two nodes, each taken by a long single task: LM 0's end at 6 and 7 s, LM 1's at 20 and 21 s. A gang
    of two waits from 0.1 s; `later` arrives at 5.5 s. With a reservation after 2 s, LM 0 (where a node frees first) is
    held for the gang from 6 s."""
    busy = [_single(f"b{k}", 0.0, duration) for k, duration in enumerate((6.0, 20.0, 7.0, 21.0))]
    _, seen = _run(cluster([[[[], []]], [[[], []]]]), [*busy, _gang("g", 2, 0.1), later], reserve_after)
    assert [seen.lm[f"b{k}.0"] for k in range(4)] == [0, 1, 0, 1]  # placed round-robin
    return seen


@pytest.mark.parametrize("later", [_single("s", 5.5, 1.0), _gang("y", 1, 5.5)], ids=["single", "younger-gang"])
def test_held_lms_are_held_against_later_work_of_the_same_priority_which_passes_the_gang_without_them(
    later: JobSpec,
) -> None:
    without = _held_lm_0(later, None)
    assert without.order.index(later.tasks[0].task_id) < without.order.index("g.0")  # it took LM 0's first node
    held = _held_lm_0(later, 2.0)
    assert held.order.index("g.0") < held.order.index(later.tasks[0].task_id)
    assert held.lm["g.0"] == held.lm["g.1"] == 0


def test_held_lms_are_not_held_against_a_task_of_a_higher_priority() -> None:
    seen = _held_lm_0(_single("s", 5.5, 1.0, priority=1), 2.0)
    assert seen.order.index("s.0") < seen.order.index("g.0") and seen.lm["s.0"] == 0


def test_a_gang_fits_idle_partitions_only_when_each_task_has_a_node_with_its_constraints() -> None:
    spec = cluster([[[[1], [], []]]])  # one partition: node 0 has constraint 1, nodes 1 and 2 have none
    views = GlobalMaster(0, spec).view.views[0]
    half = (CAP[0] // 2, CAP[1] // 2)
    assert fits_idle([task("g.0", [1], half), task("g.1", [1], half)], views)  # both on node 0
    assert not fits_idle([task("g.0", [1]), task("g.1", [1])], views)  # one node has constraint 1
    assert fits_idle([task(f"g.{k}") for k in range(3)], views)
    assert not fits_idle([task(f"g.{k}") for k in range(4)], views)


def test_the_gm_setting_and_the_replay_option_give_the_core_its_reservation() -> None:
    from megha.loadgen.replay import ReplayConfig, replay
    from megha.services.gm.service import GMService

    settings = GMSettings(lm_urls=["http://127.0.0.1:9"], journal_dir="", gang_reserve_after=30)
    service = GMService(settings, None)  # type: ignore[arg-type]
    service.adopt(cluster([[[[], []]]]))
    assert service.core is not None and service.core.gangs.reservation is not None
    assert service.core.gangs.reservation.after == 30.0
    with pytest.raises(ValueError, match="gang_reserve_after"):
        GMSettings(gang_reserve_after=0)
    config = ReplayConfig(
        trace="syn:6:40", lms=2, gms=2, workers_per_partition=2, constraints=False, gangs=0.5, gang_reserve_after=0.5
    )
    result = replay(config)
    assert not result.metrics.not_exactly_once and result.metrics.tasks_completed == 240
    assert sum(gm.gangs.reservation.made for gm in result.system.gms) > 0  # type: ignore[attr-defined]
