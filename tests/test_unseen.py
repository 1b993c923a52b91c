"""The unseen set-ups experiment (`sim/experiments/unseen.py`): its derived traces, its verdict per set-up, and one
small set-up run through its command's main()."""

from __future__ import annotations

import csv
from pathlib import Path

from megha.loadgen.trace import read_trace
from megha.sim.experiments import harness, unseen
from megha.sim.experiments.unseen import Derived, UnseenRun


def test_a_derived_trace_is_the_slice_re_based_with_its_arrivals_compressed_and_its_durations_kept(
    tmp_path: Path,
) -> None:
    whole = read_trace(harness.TRACES / harness.NAMED_TRACES["Yahoo"], 40)
    derived = read_trace(Derived("Yahoo", 30, 40, 0.25).write(tmp_path))
    assert len(derived) == 10
    for mine, theirs in zip(derived, whole[30:], strict=True):
        assert abs(mine.arrival - (theirs.arrival - whole[30].arrival) * 0.25) < 1e-5
        assert mine.durations == theirs.durations or all(
            abs(a - b) < 1e-5 for a, b in zip(mine.durations, theirs.durations, strict=True)
        )


def _runs(setup: str, p99s: dict[str, list[float]]) -> list[UnseenRun]:
    return [
        UnseenRun(setup, policy, seed, p99 / 2, p99, 10, 0)
        for policy, values in p99s.items()
        for seed, p99 in enumerate(values)
    ]


def test_the_verdict_compares_rarity_with_the_better_baseline_of_each_seed_and_counts_a_tie_as_neither() -> None:
    runs = _runs(
        "C5",
        {
            "rarity": [10.0, 20.0, 30.0, 40.0],
            "round-robin": [12.0, 19.0, 30.2, 50.0],
            "first-fit": [11.0, 25.0, 40.0, 39.0],
        },
    )
    (row,) = unseen.markdown(runs, [unseen.BY_NAME["C5"]])[2:]
    # seed 0 won (10 < 11), seed 1 lost (20 > 19), seed 2 a tie (30 within 1% of 30.2), seed 3 lost (40 > 39)
    assert row.endswith("| 1 / 2 |"), row
    # mean p99s: rarity 25, round-robin 27.8, first-fit 28.75: rarity / better baseline 25 / 27.8
    assert "| 90% |" in row, row


def test_a_small_set_up_runs_each_policy_once_a_seed_through_megha_replay(tmp_path: Path) -> None:
    assert unseen.main(["--setups", "C6", "--seeds", "0", "--out", str(tmp_path)]) == 0
    with (tmp_path / "lm-order-unseen.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(r["policy"] for r in rows) == sorted(unseen.POLICIES)
    assert all(r["setup"] == "C6" and r["jobs"] == "100" and r["jobs_rejected"] == "0" for r in rows), rows
    # 400-task jobs of 1 s tasks on 600 free nodes: every job is late by no more than a second or so
    assert all(1.0 <= float(r["jrt_delay_p99"]) < 2.0 for r in rows), rows
    page = (tmp_path / "lm-order-unseen.md").read_text()
    assert "| C6: small data centre without constraints" in page
