"""`megha reproduce`: the ids of both papers, the papers' numbers, an unknown id, one id run end to end at the tiny
scale (its PNG, CSV and page written, the paper's numbers printed beside ours), and fair-fig12 through the real
services against RabbitMQ, or refused in one line without it."""

from __future__ import annotations

import csv
import functools
import importlib
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from megha.cli import main
from megha.sim.reproduce.catalogue import BY_ID, ENTRIES
from megha.sim.reproduce.load import workload_load
from megha.sim.reproduce.paper import CLAIMS, Claim
from megha.sim.reproduce.result import compare
from megha.sim.reproduce.setup import Setup

from servicekit import needs_rabbitmq

PAPER_IDS = (
    [f"fair-fig{n}" for n in range(3, 13)] + [f"constraints-fig{n}" for n in range(2, 11)] + ["constraints-table1"]
)


def test_list_names_every_figure_and_table_of_both_papers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "list"]) == 0
    out = capsys.readouterr().out
    assert list(BY_ID) == PAPER_IDS
    for figure in PAPER_IDS:
        assert f"\n{figure} (" in f"\n{out}", figure
    for entry in ENTRIES:
        assert entry.status in out
        assert entry.caption and entry.setup


def test_every_id_has_a_runner_and_every_claim_an_id() -> None:
    for entry in ENTRIES:
        module, function = entry.runner.split(".")
        assert callable(getattr(importlib.import_module(f"megha.sim.reproduce.{module}"), function)), entry.id
        assert entry.quick, entry.id
    for claim in CLAIMS:
        assert claim.figure in BY_ID, claim
        assert claim.where, claim


def test_unknown_id_exits_2_naming_the_known_ids(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "fair-fig99"]) == 2
    err = capsys.readouterr().err
    assert "unknown id 'fair-fig99'" in err
    assert all(figure in err for figure in PAPER_IDS)


@pytest.mark.parametrize("what", ["constraints-table1", "all"])
def test_an_out_folder_that_cannot_be_made_is_refused_before_any_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    import megha.sim.reproduce.runner as runner

    ran: list[str] = []
    monkeypatch.setattr(runner, "reproduce", lambda *args: ran.append("one"))
    monkeypatch.setattr(runner, "reproduce_all", lambda *args: ran.append("all"))
    (tmp_path / "file").write_text("")
    assert main(["reproduce", what, "--scale", "tiny", "--out", str(tmp_path / "file" / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err and "cannot make the folder: Not a directory" in err
    assert ran == []


def test_fair_fig12_without_a_broker_fails_at_once_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEGHA_AMQP_URL", "amqp://guest:secret@127.0.0.1:1/")  # a port nothing listens on
    assert main(["reproduce", "fair-fig12", "--scale", "tiny", "--out", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("megha reproduce: error: fair-fig12 runs the real services and needs RabbitMQ")
    assert "amqp://guest@127.0.0.1:1/" in captured.err and "secret" not in captured.err
    assert not list(tmp_path.iterdir())


@needs_rabbitmq
def test_fair_fig12_whose_services_fail_to_start_says_why_in_one_line_and_keeps_their_logs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from megha.sim.reproduce import prototype

    # An LM that refuses its settings at start-up, as a misconfigured deployment would.
    monkeypatch.setattr(prototype, "LocalDeployment", functools.partial(prototype.LocalDeployment, worker_timeout=-1.0))
    assert main(["reproduce", "fair-fig12", "--scale", "tiny", "--out", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    last = captured.err.splitlines()[-1]  # after the progress lines: the error, one line
    said = last.removeprefix("megha reproduce: error: the real services did not run ")
    assert said != last and "exited with" in said and "worker_timeout" in said.lower(), captured.err
    logs = Path(said.rsplit("the services' logs are in ", 1)[1].strip())
    assert any("worker_timeout" in log.read_text().lower() for log in logs.glob("lm-*.log")), logs
    shutil.rmtree(logs.parent, ignore_errors=True)
    assert not list(tmp_path.iterdir())


@needs_rabbitmq
def test_fair_fig12_runs_the_real_services_beside_the_simulator_at_the_tiny_scale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["reproduce", "fair-fig12", "--scale", "tiny", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "fair-fig12: allocation time of the prototype" in out and "ours / paper" in out
    assert (tmp_path / "fair-fig12.png").stat().st_size > 10_000
    with (tmp_path / "fair-fig12.csv").open() as handle:
        rows = {(row["workload"], row["system"]): row for row in csv.DictReader(handle)}
    assert set(rows) == {(w, s) for w in ("heavier, GOOG[:2]", "lighter, GOOG[:1]") for s in ("prototype", "simulator")}
    for (workload, system), row in rows.items():
        tasks = 53 if workload.startswith("heavier") else 45  # the Google sub-trace's first jobs: 45 tasks, then 8
        assert int(row["tasks"]) == tasks, row
        assert row["offered CPU load"] == rows[(workload, "prototype")]["offered CPU load"]  # the same task set
        assert 0 <= float(row["alloc p50"]) <= float(row["alloc p99"]) <= float(row["alloc max"]), row
        delay, held = float(row["exec delay p50"]), float(row["CPU held during a run p50"])
        if system == "simulator":
            assert delay == 0 and math.isnan(held), row  # no interference, nothing measured on real nodes
        else:
            assert math.isfinite(delay) and delay >= 0 and held > 0, row
    with (tmp_path / "fair-fig12-vs-paper.csv").open() as handle:
        compared = list(csv.DictReader(handle))
    assert len(compared) == 3 * 2 + 2 + 1  # allocation ratios (p50, mean, p99) per workload; two medians; their ratio
    assert all(row["ours"] != "nan" for row in compared), compared
    page = (tmp_path / "fair-fig12.md").read_text()
    assert f"`megha reproduce fair-fig12 --scale tiny --out {tmp_path}` at commit " in page
    assert "| median execution delay, google_19 (heavier, GOOG[:2]) | 3.320 s |" in page


def test_quick_and_another_scale_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "fair-fig3", "--quick", "--scale", "tiny"]) == 2
    assert "--quick and --scale tiny disagree" in capsys.readouterr().err


def test_claims_are_compared_with_each_variant_of_our_figure() -> None:
    ours = {
        "Megha max allocation time (trace arrivals)": 0.001,
        "Megha max allocation time (90% load)": 3.0,
        "Sparrow max allocation time (trace arrivals)": 50.0,
    }
    rows = {c.what: c for c in compare("fair-fig3", ours)}
    assert rows["Megha max allocation time (trace arrivals)"].cells()[4] == "yes"
    assert rows["Megha max allocation time (90% load)"].cells()[4] == "no"
    assert rows["Sparrow max allocation time (trace arrivals)"].ratio == pytest.approx(0.5)
    assert math.isnan(rows["Sparrow / Megha median allocation time"].ours)  # not measured: shown as "-"
    bound = Claim("x", "k", ">=", 10.0, "ratio", "here")
    assert bound.holds(10.0) and not bound.holds(9.9) and bound.holds(math.nan) is None


def test_setup_scales_and_seeds() -> None:
    assert Setup.of("full").seeds == (0, 1, 2)
    assert Setup.of("quick").seeds == (0,)
    assert Setup.of("tiny", 2).seeds == (0, 1)
    with pytest.raises(ValueError, match="scale 'huge'"):
        Setup.of("huge")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 1"):
        Setup.of("quick", 0)


def test_table1_synthetic_loads_are_the_papers(syn_250: Path) -> None:
    """Table 1's synthetic rows follow from the traces alone: N one-second tasks a second on 10,000 workers."""
    result = workload_load(Setup.of("tiny"))
    ours = result.ours
    for name, load in (("syn_250", 0.025), ("syn_500", 0.05), ("syn_1000", 0.1)):
        for stat in ("median", "average", "p99"):
            assert ours[f"{name} {stat} load"] == pytest.approx(load), (name, stat)
    # The load at any instant bounds every per-second statistic from above.
    assert all(row[-1] >= row[-2] > 0 for row in result.rows), result.rows


def test_an_id_runs_end_to_end_at_the_tiny_scale(
    reference_cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["reproduce", "constraints-fig6", "--scale", "tiny", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "constraints-fig6: CDF of JRT delay" in out
    assert "ours / paper" in out
    line = next(line for line in out.splitlines() if "PigeonC random syn_500 JRT delay p50 (authors' tally)" in line)
    assert "508 s" in line  # the paper's 507.74 s, beside ours and the ratio
    assert (tmp_path / "constraints-fig6.png").stat().st_size > 10_000
    with (tmp_path / "constraints-fig6.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 3 * 3 * 2  # workloads x schedulers (Megha, PigeonC twice) x matchings
    assert all(row["completed once / accepted tasks"].split(" / ")[0] != "0" for row in rows)
    with (tmp_path / "constraints-fig6-vs-paper.csv").open() as handle:
        compared = list(csv.DictReader(handle))
    measured = [row for row in compared if row["ours"] != "nan"]
    assert len(measured) >= 30  # every claim but the published reference's (the first 200 jobs only)
    page = (tmp_path / "constraints-fig6.md").read_text()
    assert "## The paper's numbers beside ours" in page and "![constraints-fig6](constraints-fig6.png)" in page
    assert f"`megha reproduce constraints-fig6 --scale tiny --out {tmp_path}` at commit " in page


def test_a_conflict_is_a_pick_of_a_worker_another_task_holds() -> None:
    from megha.sim.reproduce.load import Conflicts

    nodes = np.array([0b01, 0b11, 0b00], np.int64)  # only worker 1 has constraint 1; workers 0 and 1 constraint 0
    starts = np.array([0.1, 0.2, 0.3, 0.4, 1.5, 2.2, 2.3])
    ends = starts + 1.0
    # t=0.1 takes worker 1 (the only one with constraint 1); 0.2 and 0.3 pick it while it is held: two conflicts,
    # and with no other worker having the constraint, both are blocked; 0.4 needs constraint 2, which no worker
    # has. 1.5: worker 1 is free again (held until 1.1). 2.2 and 2.3 need nothing and always find a free worker.
    masks = np.array([0b10, 0b10, 0b10, 0b100, 0b10, 0, 0], np.int64)
    found = Conflicts.count(starts, ends, masks, nodes, seed=0)
    assert found.per_second.tolist()[:2] == [2, 0] and (found.blocked, found.unsatisfiable, found.tasks) == (2, 1, 7)
    # Three workers, three unconstrained tasks at once: a conflict whenever one picks a held worker, never blocked.
    many = Conflicts.count(np.zeros(3), np.ones(3), np.zeros(3, np.int64), np.zeros(3, np.int64), seed=1)
    assert many.blocked == 0 and 0 <= many.per_second[0] <= 2


def test_conflicts_rise_with_the_arrival_rate_of_the_synthetic_workloads() -> None:
    from megha.sim.reproduce.load import conflicts

    ours = conflicts(Setup.of("tiny")).ours
    assert ours["syn_500 / syn_250 mean conflicts per second"] > 1.5
    assert ours["syn_1000 / syn_500 mean conflicts per second"] > 1.5


def test_fair_fig12_s_diagnostics_rank_ties_alike_and_count_starts_on_both_sides() -> None:
    from megha.sim.reproduce.prototype import rank_correlation, starts_nearby

    assert rank_correlation(np.array([1.0, 2.0, 3.0]), np.array([30.0, 20.0, 10.0])) == pytest.approx(-1.0)
    tied = rank_correlation(np.array([1.0, 2.0, 3.0, 4.0]), np.array([5.0, 7.0, 7.0, 9.0]))
    assert tied == pytest.approx(3 / math.sqrt(10))  # ranks 0, 1, 2, 3 against 0, 1.5, 1.5, 3
    assert math.isnan(rank_correlation(np.array([1.0, 2.0, 3.0]), np.array([4.0, 4.0, 4.0])))
    assert starts_nearby(np.array([0.0, 0.5, 1.2, 5.0, 5.0])).tolist() == [2, 3, 2, 2, 2]
