"""docs/results.md names, for each experiment and each reproduced figure of the papers, the command that produced
its page: they must agree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results.md"


def experiment_rows() -> list[tuple[str, Path]]:
    """(command, page) from the table of experiments at the top of docs/results.md (an experiment module, or
    `megha reproduce` for a figure of the papers)."""
    rows = []
    for line in RESULTS.read_text().splitlines():
        command = r"`(python -m megha\.sim\.experiments\.[^`]+|megha reproduce [^`]+)`"
        match = re.match(r"\| [^|]+ \| " + command + r" \| \[[^]]+\]\(([^)]+)\) \|", line)
        if match:
            rows.append((match.group(1), RESULTS.parent / match.group(2)))
    return rows


def test_every_experiment_page_was_produced_by_the_command_results_md_names() -> None:
    rows = experiment_rows()
    assert len(rows) >= 6
    for command, page in rows:
        assert page.exists(), page
        produced = re.search(r"Produced by `([^`]+)`", page.read_text())
        assert produced is not None, page
        assert produced.group(1) == command, (page.name, produced.group(1), command)


def test_every_results_page_is_summarised_in_results_md() -> None:
    linked = {page.name for _, page in experiment_rows()}
    pages = {p.name for p in (RESULTS.parent / "results").glob("*.md")}
    assert pages <= linked, pages - linked


def sections() -> dict[str, str]:
    """docs/results.md's text under each second-level heading, by heading."""
    parts = re.split(r"^## (.+)$", RESULTS.read_text(), flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_report_has_one_section_per_id_in_the_catalogue_order_each_linking_its_page() -> None:
    from megha.sim.reproduce.catalogue import ENTRIES

    by_heading = sections()
    ids = [heading for heading in by_heading if heading in {e.id for e in ENTRIES}]
    assert ids == [e.id for e in ENTRIES]
    for entry in ENTRIES:
        text = by_heading[entry.id]
        assert f"(results/{entry.id}.md)" in text, entry.id
        assert (RESULTS.parent / "results" / f"{entry.id}.md").exists(), entry.id


def test_every_experiment_the_report_names_exists_and_every_experiment_is_reported() -> None:
    from megha.sim.experiments.differences import EXPERIMENTS

    text = RESULTS.read_text()
    named = re.findall(r"`python -m megha\.sim\.experiments\.differences ([a-z-]+)[^`]*`", text)
    assert set(named) <= set(EXPERIMENTS), set(named) - set(EXPERIMENTS)
    assert set(EXPERIMENTS) <= set(named), set(EXPERIMENTS) - set(named)


def test_the_reference_pages_keep_no_diary_nor_template_leftovers() -> None:
    for page in (RESULTS, ROOT / "docs" / "reproduce.md"):
        text = page.read_text()
        for phrase in ("this session", "{{", "}}"):
            assert phrase not in text.lower(), (page.name, phrase)


def test_each_experiment_changes_only_the_options_it_names(tmp_path: Path) -> None:
    from dataclasses import asdict

    from megha.sim.experiments.differences import EXPERIMENTS

    names = ("component-hops", "component-requests", "fairness-unplaceable", "masters-lm-time", "synthetic-answers")
    names += ("yahoo-matching-durations", "yahoo-matching-event-order", "yahoo-peak-load", "yahoo-pigeonc-masters")
    names += ("yahoo-peak-load-seeds", "yahoo-peak-load-clusters", "google-reference-cluster")
    names += ("yahoo-authors-peak-load", "yahoo-authors-peak-load-halves", "yahoo-authors-peak-load-placing")
    names += ("yahoo-first-fit-fewer-workers",)
    for name in names:
        variants = EXPERIMENTS[name].variants([0], tmp_path)
        configs = [asdict(config) for _, config in variants]
        varied = {key for key in configs[0] if len({repr(c[key]) for c in configs}) > 1}
        expected = {"component-hops": {"hop_delay", "decision_costs"}}
        expected["component-requests"] = {"hop_delay", "trace", "first_jobs"}
        expected["fairness-unplaceable"] = {"unplaceable", "workers_per_partition"}
        expected["masters-lm-time"] = {"gms", "workers_per_partition"}
        expected["synthetic-answers"] = {"answer_states", "inconsistent", "matching"}
        expected["yahoo-matching-durations"] = {"truncate_durations", "matching"}
        expected["yahoo-matching-event-order"] = {"event_order", "matching"}
        expected["yahoo-peak-load"] = {"cluster", "trace", "scheduler", "matching"}
        expected["yahoo-pigeonc-masters"] = {"cluster", "trace", "pigeonc_masters", "scheduler", "matching"}
        expected["yahoo-peak-load-seeds"] = {"cluster", "trace", "matching"}
        expected["yahoo-peak-load-clusters"] = {"workers_per_partition", "trace", "matching"}
        expected["google-reference-cluster"] = {"matching"}  # every variant on the same (doubled) cluster
        expected["yahoo-authors-peak-load"] = {"cluster", "trace", "matching"}  # the authors' variants in every one
        expected["yahoo-authors-peak-load-halves"] = {"lm_order", "unsatisfiable", "answer_states", "inconsistent"}
        expected["yahoo-authors-peak-load-halves"] |= {"unplaceable", "delta_states", "matching"}
        expected["yahoo-authors-peak-load-placing"] = {"lm_order", "matching"}
        expected["yahoo-first-fit-fewer-workers"] = {"matching"}  # first-fit on 6,825 workers in every one
        assert varied == expected[name], (name, varied)


def test_the_doubled_reference_cluster_holds_each_reference_node_twice(tmp_path: Path) -> None:
    from megha.loadgen.replay import REFERENCE_CLUSTER, ReplayConfig, build_cluster
    from megha.sim.experiments.differences import EXPERIMENTS

    doubled = build_cluster(EXPERIMENTS["google-reference-cluster"].variants([0], tmp_path)[0][1])
    reference = build_cluster(ReplayConfig(cluster=str(REFERENCE_CLUSTER)))
    assert doubled.num_nodes == 2 * reference.num_nodes == 20_000
    for lm in range(reference.num_lms):
        for gm in range(reference.num_gms):
            masks = reference.partitions[lm][gm].constraint_masks
            assert doubled.partitions[lm][gm].constraint_masks == masks + masks


def test_tasks_submitted_one_request_each_wait_for_the_gm_and_a_job_at_once_does_not(tmp_path: Path) -> None:
    from dataclasses import replace

    from megha.loadgen.replay import replay
    from megha.loadgen.trace import read_trace
    from megha.sim.experiments.differences import EXPERIMENTS

    at_once, alone = [config for cell, config in EXPERIMENTS["component-requests"].variants([0], tmp_path)][:2]
    jobs = 30
    tasks = sum(len(j.durations) for j in read_trace(at_once.trace, jobs))
    queuing = {}
    for config, first in ((at_once, jobs), (alone, tasks)):
        metrics = replay(replace(config, first_jobs=first)).metrics
        assert metrics.tasks == tasks
        queuing[config.trace] = metrics.components["framework_queuing"].median
    assert queuing[at_once.trace] == 0 and queuing[alone.trace] > 0, queuing


def test_the_longest_wait_names_the_nodes_that_fit_the_last_task_and_the_task_it_waited_for(tmp_path: Path) -> None:
    """google-max-seeds' diagnosis of its max job, on a small slice: the nodes counted are those whose machine
    constraints cover the task's, the one it ran on among them, and the task before it there is one that ended
    there no later than it started."""
    import re
    from dataclasses import replace

    import numpy as np

    from megha.loadgen.replay import read_jobs, replay, trace_workload
    from megha.sim.experiments.differences import EXPERIMENTS, _longest_wait

    _, config = EXPERIMENTS["google-max-seeds"].variants([0], tmp_path)[0]
    result = replay(replace(config, first_jobs=150, workers_per_partition=40))
    found = re.fullmatch(r"([\d,]+) nodes?; (.+)", _longest_wait(result))
    assert found is not None, _longest_wait(result)
    worst = max((j for j in result.recorder.jobs.values() if not np.isnan(j.jrt_delay)), key=lambda j: j.jrt_delay)
    columns = {name: result.recorder.tasks.column(name) for name in ("job_id", "task_id", "lm", "node")}
    columns |= {name: result.recorder.tasks.column(name) for name in ("started_at", "finished_at")}
    last = max(
        (i for i, job in enumerate(columns["job_id"]) if job == worst.job_id), key=lambda i: columns["started_at"][i]
    )
    lm, node = columns["lm"][last], columns["node"][last]
    jobs = trace_workload(result.config, read_jobs(result.config), result.system.entry_points)
    spec = next(t for _, job in jobs for t in job.tasks if t.task_id == columns["task_id"][last])
    masks = [[m for p in row for m in p.constraint_masks] for row in result.cluster.partitions]
    assert masks[lm][node] & spec.constraints == spec.constraints  # the node it ran on fits it
    fitting = sum(m & spec.constraints == spec.constraints for row in masks for m in row)
    assert int(found.group(1).replace(",", "")) == fitting
    ran_there = [
        i
        for i in range(len(columns["lm"]))
        if (columns["lm"][i], columns["node"][i]) == (lm, node)
        and columns["finished_at"][i] <= columns["started_at"][last]
    ]
    assert (found.group(2) == "none before it") == (not ran_there)
