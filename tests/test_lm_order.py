"""The scarcity LM order: tasks that do not need a constraint in short supply go first where they take none of its
nodes, so the tasks that need it still find room; its pressure estimate; the option that selects it; the scarcity
node choice, which spares those nodes within a partition; and the experiment that compares the LM orders and node
choices (reduced) and its count of late jobs."""

from __future__ import annotations

import csv
import random
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from megha import cli
from megha.common.core.gm import GlobalMaster
from megha.common.core.messages import LaunchBatch, Output
from megha.common.core.placement.choice import ChoicePolicy, RandomChoice, RarityChoice, ScarcityChoice, make_choice
from megha.common.core.placement.rarity import RaritySearch, fewest
from megha.common.core.placement.scarcity import FIRST_ESTIMATE, ScarcitySearch
from megha.common.core.placement.search import FirstFitSearch
from megha.common.core.policies import LM_ORDERS, gm_policies
from megha.common.core.task import TaskSpec
from megha.common.core.view import PartitionView
from megha.common.settings import GMSettings
from megha.loadgen.records import JobRecord
from megha.loadgen.replay import ReplayConfig, replay
from megha.loadgen.trace import demo_trace_path, read_trace
from megha.services.gm.service import GMService
from megha.sim.experiments import lm_order

from corekit import cluster, job, task

SCARCE = 5
# One GM, two LMs: LM 0 holds the only node with constraint 5, LM 1 two nodes without constraints.
RICH_AND_PLAIN = [[[[SCARCE]]], [[[], []]]]


def _placed(out: list[Output]) -> list[tuple[int, int]]:
    """(LM, node) of every placement in the launch batches of `out`."""
    return [(p.lm, p.node) for send in out if isinstance(send.msg, LaunchBatch) for p in send.msg.placements]


def _gm(order: str) -> GlobalMaster:
    """A GM of RICH_AND_PLAIN using `order`, that has seen FIRST_ESTIMATE tasks needing constraint 5 (its demand
    estimate's warm-up: every task needs 5, a third of the nodes have it, so 5 is hot)."""
    spec = cluster(RICH_AND_PLAIN)
    gm = GlobalMaster(0, spec, policies=gm_policies(0, spec, lm_order=order))
    for i in range(FIRST_ESTIMATE):
        gm.placer.search.internal(task(f"seen.{i}", [SCARCE]))
    return gm


def test_unconstrained_tasks_go_to_the_plain_lm_first_and_a_later_constrained_task_still_finds_room() -> None:
    gm = _gm("scarcity")
    assert [k for k, _ in gm.placer.search.hot] == [SCARCE]
    assert sorted(_placed(gm.submit(job("plain", task("plain.0"), task("plain.1")), 0.0))) == [(1, 0), (1, 1)]
    assert _placed(gm.submit(job("needs5", task("needs5.0", [SCARCE])), 0.1)) == [(0, 0)]
    assert not gm.waiting


@pytest.mark.parametrize("order", ["round-robin", "first-fit"])
def test_the_paper_orders_give_the_scarce_node_away_and_the_constrained_task_waits(order: str) -> None:
    gm = _gm(order)
    assert (0, 0) in _placed(gm.submit(job("plain", task("plain.0"), task("plain.1")), 0.0))
    assert _placed(gm.submit(job("needs5", task("needs5.0", [SCARCE])), 0.1)) == []
    assert len(gm.waiting) == 1


def _warm_search(layout: list) -> ScarcitySearch:  # type: ignore[type-arg]
    """GM 0's scarcity search over `layout`, after FIRST_ESTIMATE tasks that all need constraint 5."""
    search = ScarcitySearch(0, GlobalMaster(0, cluster(layout)).views)
    for i in range(FIRST_ESTIMATE):
        search.internal(task(f"t.{i}", [SCARCE]))
    return search


def _lms(search: ScarcitySearch, t: TaskSpec) -> list[int]:
    return [view.lm for view in search.internal(t)]


def test_hot_constraints_are_those_asked_for_at_least_half_as_often_as_their_nodes_are_common() -> None:
    # Constraint 5 on a quarter of the nodes, 3 on half of them; half the tasks need 5, an eighth need 3.
    search = ScarcitySearch(0, GlobalMaster(0, cluster([[[[5, 3], [3], [], []]]])).views)
    assert search.hot == ()  # nothing estimated before FIRST_ESTIMATE tasks: first-fit
    for i in range(FIRST_ESTIMATE):
        search.internal(task(f"t.{i}", [5] if i % 2 else [3] if i % 8 == 0 else []))
    assert search.hot == ((5, 2.0),)  # 3: pressure 0.25, below HOT_PRESSURE


def test_waste_orders_partitions_and_first_fit_breaks_ties() -> None:
    # LM 0's partition: a node with 5 and a plain one; LM 1's: two plain nodes; LM 2's: one node with 5.
    search = _warm_search([[[[5], []]], [[[], []]], [[[5]]]])
    assert _lms(search, task("plain")) == [1, 0, 2]  # no waste, then half, then all of its picks on a node with 5
    assert _lms(search, task("needs5", [5])) == [0, 1, 2]  # needs every hot constraint: first-fit
    assert _lms(search, task("needs7", [7])) == []  # room nowhere


def test_external_partitions_are_ranked_the_same_way() -> None:
    # GM 0 has no room of its own; GM 1's partition of LM 0 has a node with 5, of LM 1 a plain node.
    layout = [[[], [[5]]], [[], [[]]]]
    first_fit = FirstFitSearch(0, GlobalMaster(0, cluster(layout)).views)
    assert [(v.lm, v.gm) for v in first_fit.external(task("plain"))] == [(0, 1), (1, 1)]
    assert [(v.lm, v.gm) for v in _warm_search(layout).external(task("plain"))] == [(1, 1), (0, 1)]


def test_scarcity_is_an_lm_order_a_setting_and_a_replay_option(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert LM_ORDERS["scarcity"] is ScarcitySearch
    monkeypatch.setenv("MEGHA_LM_ORDER", "scarcity")
    assert GMSettings().lm_order == "scarcity"
    with pytest.raises(ValidationError, match="lm_order"):
        GMSettings(lm_order="scarce")
    with pytest.raises(SystemExit) as exc:
        cli.main(["replay", "--lm-order", "scarce"])
    assert exc.value.code == 2
    assert "--lm-order: invalid choice: 'scarce'" in capsys.readouterr().err
    done = replay(ReplayConfig(trace="syn:40:30", lms=2, gms=3, workers_per_partition=30, lm_order="scarcity"))
    assert isinstance(done.system.gms[0].placer.search, ScarcitySearch)
    accepted = [rec for rec in done.recorder.tasks.values() if not rec.failed_reason]
    assert len(accepted) >= 200 and all(rec.completions == 1 for rec in accepted)


def test_reduced_experiment_writes_a_row_per_order_and_seed_and_slices_the_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--workloads", "demo[:4]@2x2x20", "demo[10:14]@2x2x20", "--seeds", "0", "1", "--out", str(tmp_path)]
    assert lm_order.main(argv) == 0
    with (tmp_path / "lm-order.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["workload"], r["lm_order"], r["seed"]) for r in rows] == [
        (w, o, s) for w in ("demo[:4]@2x2x20", "demo[10:14]@2x2x20") for o in sorted(LM_ORDERS) for s in "01"
    ]
    sliced_tasks = sum(int(r["tasks"]) for r in rows if r["workload"] == "demo[10:14]@2x2x20")
    assert sliced_tasks == 2 * len(LM_ORDERS) * sum(
        len(job.durations) for job in read_trace(demo_trace_path(), 14)[10:]
    )
    assert all(0 <= int(r["late_jobs"]) <= 14 for r in rows)
    page = (tmp_path / "lm-order.md").read_text()
    assert "| demo[10:14]@2x2x20 | yes |" in page and "workloads at the tail." in page
    assert "| late jobs, all seeds |" in page
    with pytest.raises(SystemExit) as exc:
        lm_order.main(["--workloads", "demo[5:2]", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "the slice [5:2] holds no job" in capsys.readouterr().err


def test_a_late_job_is_one_delayed_half_a_delta_interval_or_more() -> None:
    def job_delayed(delay: float | None) -> JobRecord:
        """A one-task job submitted at 10 s whose task runs 2 s, finished `delay` late (None: never finished)."""
        record = JobRecord("j", 0, submitted_at=10.0, num_tasks=1, ideal_jrt=2.0)
        if delay is not None:
            record.task_finished(12.0 + delay)
        return record

    jobs = [job_delayed(d) for d in (0.0025, 0.4999, 0.5, 1.003, None)]
    assert lm_order.late_jobs(jobs, delta_interval=1.0) == 2  # 0.5 s and 1.003 s; an unfinished job is not late
    assert lm_order.late_jobs(jobs, delta_interval=0.1) == 3


# -------------------------------------------------------------------------------------------- scarcity node choice

HOT_TOO = 6
# One GM, one LM: a node with 5 and 6, one with 5, one with 6, two plain ones.
MIXED = [[[[SCARCE, HOT_TOO], [SCARCE], [HOT_TOO], [], []]]]


def _warm_choice(view: PartitionView, needs: list[list[int]]) -> ScarcityChoice:
    """A scarcity choice that has placed FIRST_ESTIMATE tasks on `view`, cycling through the constraint lists
    `needs`: its pressures are then estimated."""
    choice = ScarcityChoice()
    rng = random.Random(0)
    for i in range(FIRST_ESTIMATE):
        t = task(f"seen.{i}", needs[i % len(needs)])
        choice.choose(view, view.feasible(t), rng, t)
    return choice


def _picks(choice: ChoicePolicy, view: PartitionView, constraints: list[int], draws: int = 200) -> set[int]:
    """The nodes `choice` picks for a task with `constraints` over `draws` draws, every node of `view` free."""
    rng = random.Random(1)
    picks = set()
    for i in range(draws):
        t = task(f"probe.{i}", constraints)
        picks.add(choice.choose(view, view.feasible(t), rng, t))
    return picks


def test_scarcity_choice_spares_hot_constraints_a_task_does_not_need_hottest_first_and_picks_at_random() -> None:
    view = GlobalMaster(0, cluster(MIXED)).views[0][0]
    # 5 on two nodes of five and asked for by 5 tasks of 8 (pressure 1.56); 6 on two and asked for by 3 of 8 (0.94).
    needs = [[SCARCE]] * 5 + [[HOT_TOO]] * 3
    assert _picks(_warm_choice(view, needs), view, []) == {3, 4}  # neither 5 nor 6; both plain nodes, at random
    assert _picks(_warm_choice(view, needs), view, [SCARCE]) == {1}  # needs 5: the 5-node without 6
    assert _picks(_warm_choice(view, needs), view, [HOT_TOO]) == {2}  # needs 6: the 6-node without 5
    assert _picks(_warm_choice(view, needs), view, [SCARCE, HOT_TOO]) == {0}
    # With only 5-nodes free a plain task takes one without 6: the hotter constraint is spared first, then the next.
    choice, rng = _warm_choice(view, needs), random.Random(2)
    assert {choice.choose(view, 0b011, rng, task(f"p.{i}")) for i in range(50)} == {1}
    assert {choice.choose(view, 0b101, rng, task(f"q.{i}")) for i in range(50)} == {2}


def test_scarcity_choice_is_random_before_its_first_estimate_and_when_nothing_is_hot() -> None:
    view = GlobalMaster(0, cluster(MIXED)).views[0][0]
    assert _picks(ScarcityChoice(), view, [], draws=FIRST_ESTIMATE - 1) == {0, 1, 2, 3, 4}
    # Tasks asking for nothing: no constraint is under pressure, every node stays a candidate.
    assert _picks(_warm_choice(view, [[]]), view, []) == {0, 1, 2, 3, 4}


def _gm_with_choice(choice: ChoicePolicy, seed: int) -> GlobalMaster:
    spec = cluster([[[[SCARCE], [], []]]])  # one LM, one GM: the only node with 5 and two plain ones
    return GlobalMaster(0, spec, seed=seed, policies=gm_policies(0, spec, choice=choice))


def test_scarcity_choice_keeps_the_only_scarce_node_for_the_task_that_needs_it_where_random_gives_it_away() -> None:
    for seed in range(10):
        gm = _gm_with_choice(
            _warm_choice(GlobalMaster(0, cluster([[[[SCARCE], [], []]]])).views[0][0], [[SCARCE]]), seed
        )
        assert sorted(_placed(gm.submit(job("plain", task("plain.0"), task("plain.1")), 0.0))) == [(0, 1), (0, 2)]
        assert _placed(gm.submit(job("needs5", task("needs5.0", [SCARCE])), 0.1)) == [(0, 0)]
        assert not gm.waiting
    gave_away = 0
    for seed in range(10):
        gm = _gm_with_choice(RandomChoice(), seed)
        if (0, 0) in _placed(gm.submit(job("plain", task("plain.0"), task("plain.1")), 0.0)):
            assert _placed(gm.submit(job("needs5", task("needs5.0", [SCARCE])), 0.1)) == []
            assert len(gm.waiting) == 1
            gave_away += 1
    assert gave_away >= 3  # two of three nodes are taken at random: the scarce one two times in three


def test_scarcity_is_a_node_choice_a_setting_and_a_replay_option(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = make_choice("scarcity"), make_choice("scarcity")
    assert isinstance(first, ScarcityChoice) and first is not second  # one per GM: each learns from its own tasks
    monkeypatch.setenv("MEGHA_MATCHING", "scarcity")
    assert GMSettings().matching == "scarcity"
    done = replay(ReplayConfig(trace="syn:40:30", lms=2, gms=3, workers_per_partition=30, matching="scarcity"))
    choices = [gm.placer.choice for gm in done.system.gms]
    assert all(isinstance(c, ScarcityChoice) for c in choices) and len(set(map(id, choices))) == 3
    accepted = [rec for rec in done.recorder.tasks.values() if not rec.failed_reason]
    assert len(accepted) >= 200 and all(rec.completions == 1 for rec in accepted)


def test_reduced_experiment_runs_node_choices_with_every_order_and_judges_the_candidate(tmp_path: Path) -> None:
    argv = ["--workloads", "demo[:4]@2x2x20", "--orders", "first-fit", "round-robin", "--matchings", "random"]
    argv += ["scarcity", "--candidate", "first-fit/scarcity", "--seeds", "0", "--out", str(tmp_path)]
    assert lm_order.main(argv) == 0
    with (tmp_path / "lm-order.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["lm_order"], r["matching"]) for r in rows] == [
        (o, m) for o in ("first-fit", "round-robin") for m in ("random", "scarcity")
    ]
    page = (tmp_path / "lm-order.md").read_text()
    assert "| first-fit/scarcity |" in page and "| round-robin/scarcity |" in page
    assert "## first-fit/scarcity against the others at the tail" in page


# ------------------------------------------------------------------------------------ rarity order and node choice

# One GM, two LMs: LM 0 holds the only node with constraints 1, 2 and 3 (a rare combination), LM 1 a node with 1 alone.
RARE_AND_COMMON = [[[[1, 2, 3]]], [[[1]]]]


def _rare_node_kept(order: str, choice: str, seed: int) -> bool:
    """On RARE_AND_COMMON, after a task needing 1 is placed, whether a task needing 1, 2 and 3 still finds room."""
    spec = cluster(RARE_AND_COMMON)
    gm = GlobalMaster(0, spec, seed=seed, policies=gm_policies(0, spec, lm_order=order, choice=make_choice(choice)))
    assert len(_placed(gm.submit(job("needs1", task("needs1.0", [1])), 0.0))) == 1
    return _placed(gm.submit(job("needs123", task("needs123.0", [1, 2, 3])), 0.1)) == [(0, 0)]


@pytest.mark.parametrize("order", ["round-robin", "first-fit", "scarcity"])
@pytest.mark.parametrize("choice", ["random", "min-constraints", "scarcity"])
def test_the_other_policies_give_a_rare_combination_away_when_it_comes_first(order: str, choice: str) -> None:
    assert not _rare_node_kept(order, choice, seed=0)


def test_rarity_keeps_the_rare_combination_for_the_task_that_needs_all_of_it() -> None:
    assert all(_rare_node_kept("rarity", "rarity", seed) for seed in range(10))
    assert all(_rare_node_kept("rarity", "random", seed) for seed in range(10))  # the order alone does it here


def test_rarity_order_ranks_partitions_by_the_fewest_extra_constraints_first_fit_among_equals() -> None:
    # LM 0: nodes with {1, 2} and {1, 2, 3}; LM 1: {1, 2, 3, 4}; LM 2: {1} and {1, 5}; LM 3: {1, 2}.
    views = GlobalMaster(0, cluster([[[[1, 2], [1, 2, 3]]], [[[1, 2, 3, 4]]], [[[1], [1, 5]]], [[[1, 2]]]])).views
    search = RaritySearch(0, views)
    assert [v.lm for v in search.internal(task("needs1", [1]))] == [2, 0, 3, 1]  # 0, 1, 1, 3 extra
    assert [v.lm for v in search.internal(task("needs12", [1, 2]))] == [0, 3, 1]  # 0, 0, 2 extra; LM 2 has no room
    assert [v.lm for v in search.internal(task("needs7", [7]))] == []


def test_rarity_order_finds_a_later_better_partition_and_ranks_the_rest_only_when_asked() -> None:
    # LM 0: {1, 2, 3, 4}; LM 1: {1, 2, 3}; LM 2: {1, 2}; LM 3: {1, 2, 3, 4, 5}: each later one better until LM 3.
    views = GlobalMaster(0, cluster([[[[1, 2, 3, 4]]], [[[1, 2, 3]]], [[[1, 2]]], [[[1, 2, 3, 4, 5]]]])).views
    ranked = RaritySearch(0, views).internal(task("needs1", [1]))
    first = next(ranked)
    assert first.lm == 2  # 1 extra constraint, against 3, 2 and 4
    assert [v.lm for v in ranked] == [1, 0, 3]  # the rest, fewest extra first


def test_the_fewest_constraint_nodes_the_order_found_serve_the_choice_only_for_the_same_candidates() -> None:
    # One partition: nodes {1, 2, 3}, {1}, {1, 2}. The order yields it with every node free; its fewest is node 1.
    view = GlobalMaster(0, cluster([[[[1, 2, 3], [1], [1, 2]]]])).views[0][0]
    assert next(RaritySearch(0, [[view]]).internal(task("plain"))) is view
    assert fewest(view, 0b111) == 0b010
    assert fewest(view, 0b101) == 0b100  # other candidates (node 1 taken): node 2, not the order's node 1
    assert fewest(view, 0b001) == 0b001


def test_rarity_choice_takes_the_fewest_extra_constraints_then_spares_the_hot_ones_at_random() -> None:
    # Nodes: {5, 6}, {5}, {6}, {} twice, {5, 6, 1}: a plain task gets a plain node; one needing 6 the 6-node without 5.
    view = GlobalMaster(0, cluster([[[[SCARCE, HOT_TOO], [SCARCE], [HOT_TOO], [], [], [SCARCE, HOT_TOO, 1]]]])).views[
        0
    ][0]
    choice = RarityChoice()
    for i in range(FIRST_ESTIMATE):
        t = task(f"seen.{i}", [SCARCE])  # 5 is hot, 6 not
        choice.choose(view, view.feasible(t), random.Random(i), t)
    assert _picks(choice, view, []) == {3, 4}
    assert _picks(choice, view, [HOT_TOO]) == {2}
    assert _picks(choice, view, [SCARCE, HOT_TOO]) == {0}  # not the rare {5, 6, 1}
    # Among nodes of equal count, the hot constraint the task does not need is spared: {5} and {6} free, a plain task.
    assert {choice.choose(view, 0b110, random.Random(i), task(f"p.{i}")) for i in range(50)} == {2}


def test_the_placers_fused_rarity_pass_places_as_the_order_and_the_choice_do_step_by_step() -> None:
    """The placer runs the rarity order and choice in one pass (`Placer._match_rarity`); on random clusters, free
    states and tasks it picks the same LM, node and repartition flag, drawing the same random numbers, as the order's
    first partition with room and the choice among its feasible nodes."""
    compared = repartitions = 0
    for seed in range(40):
        rng = random.Random(seed)
        layout = [
            [[rng.sample(range(8), rng.randint(0, 5)) for _ in range(rng.randint(1, 6))] for _gm in range(3)]
            for _lm in range(rng.randint(1, 4))
        ]
        spec = cluster(layout, capacity=(4, 4))
        gm = GlobalMaster(0, spec, policies=gm_policies(0, spec, lm_order="rarity", choice=make_choice("rarity")))
        placer = gm.placer
        assert placer._fused is placer.search
        for view in gm.view.partitions():  # some nodes partly or wholly taken
            for i in range(view.size):
                view.set_free(i, (rng.randint(0, 4), rng.randint(0, 4)))
        step_by_step = RarityChoice()
        for n in range(60):
            t = task(f"t.{seed}.{n}", rng.sample(range(8), rng.randint(0, 3)), request=(rng.randint(1, 3), 1))
            draws = random.Random(n)
            placer.rng = random.Random(n)
            fused = placer.match(t)
            expected = None
            for views, repartition in ((placer.search.internal(t), False), (placer.search.external(t), True)):
                first = next(views, None)
                if first is not None:
                    node = step_by_step.choose(first, first.feasible(t), draws, t)
                    expected = (first.lm, first.start + node, repartition)
                    break
            assert (None if fused is None else (fused.lm, fused.node, fused.repartition)) == expected
            assert placer.rng.random() == draws.random()  # the same numbers drawn
            compared += fused is not None
            repartitions += fused is not None and fused.repartition
    assert compared > 1000 and repartitions > 50  # both internal and external placements were compared


def test_rarity_is_an_lm_order_a_node_choice_and_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert LM_ORDERS["rarity"] is RaritySearch and isinstance(make_choice("rarity"), RarityChoice)
    monkeypatch.setenv("MEGHA_LM_ORDER", "rarity")
    monkeypatch.setenv("MEGHA_MATCHING", "rarity")
    assert (GMSettings().lm_order, GMSettings().matching) == ("rarity", "rarity")
    config = ReplayConfig(trace="syn:40:30", lms=2, gms=3, workers_per_partition=30, lm_order="rarity")
    done = replay(replace(config, matching="rarity"))
    assert isinstance(done.system.gms[0].placer.search, RaritySearch)
    accepted = [rec for rec in done.recorder.tasks.values() if not rec.failed_reason]
    assert len(accepted) >= 200 and all(rec.completions == 1 for rec in accepted)


def test_a_gm_service_places_with_the_rarity_order_and_choice_its_settings_name(tmp_path: Path) -> None:
    """MEGHA_LM_ORDER=rarity and MEGHA_MATCHING=rarity reach the GM service's core, which then keeps a rare node
    for the task that needs it: a plain task takes the plain node of the other LM, not LM 0's rare one."""
    settings = GMSettings(
        lm_urls=["http://127.0.0.1:9", "http://127.0.0.1:10"],
        journal_dir=str(tmp_path),
        lm_order="rarity",
        matching="rarity",
    )
    service = GMService(settings)
    service.adopt(cluster([[[[1, 2, 3]]], [[[]]]]))  # LM 0: one node with constraints 1-3; LM 1: a plain node
    core = service.core
    assert core is not None
    assert isinstance(core.placer.search, RaritySearch) and isinstance(core.placer.choice, RarityChoice)
    placement = core.placer.match(task("plain"))
    assert placement is not None and placement.lm == 1
    placement = core.placer.match(task("picky", [1, 2]))
    assert placement is not None and placement.lm == 0
