"""Illegal task transitions under faults: a preemption request to a crashed LM fails (`GlobalMaster.call_failed`)
and counts as refused, and the task is decided again (for the next LM, or once a node frees up). No LM saw the
request, so the GM reports the refusal itself; before it did, the recorder saw DECIDED while the task was still
PLACING and counted an illegal transition (`megha replay ... --fail lm:rate=200 --job-classes low:30%,high:30%`)."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

import megha.loadgen.replay
from megha.cli import main
from megha.common.core.gm import GlobalMaster
from megha.common.core.lifecycle import State
from megha.common.core.messages import Placement, PreemptRequest
from megha.common.core.parked import Shape
from megha.common.core.policies.preemption import PreemptionPlan
from megha.common.core.task import TaskSpec
from megha.loadgen.metrics import RunMetrics, compute_metrics
from megha.loadgen.recorder import Recorder
from megha.loadgen.report import format_table, run_warnings, write_outputs

from corekit import CAP, Net, cluster, job, task


class AskLms:
    """A preemption policy that asks LM `first`, then the LMs of `rest` (no victims: the test never lets the LM
    answer)."""

    name = "ask-lms"

    def __init__(self, first: int, rest: list[int]) -> None:
        self.first, self.rest = first, rest

    def plan(self, task: TaskSpec, lms: list[int] | None) -> PreemptionPlan | None:
        if lms is None:
            return PreemptionPlan(self.first, list(self.rest), [], CAP)
        return PreemptionPlan(lms[0], lms[1:], [], CAP) if lms else None

    def retry(
        self, parked: Mapping[Shape, deque[TaskSpec]], asking: set[Shape], attempt: Callable[[Shape], bool]
    ) -> None:
        return None


def full_system(rest: list[int]) -> tuple[Net, GlobalMaster, Recorder]:
    """Two LMs of one node each, both running a task of GM 0 (which asks LM 0 for a preemption, then `rest`)."""
    recorder = Recorder()
    net = Net.build(cluster([[[[]]], [[[]]]]), observer=recorder)
    gm = net.gms[0]
    for core in (*net.lms, *net.workers):
        core.observer = recorder
    gm.policies.preemption = AskLms(0, rest)
    filler = job("fill", task("fill.0", duration=5.0), task("fill.1", duration=5.0))
    recorder.expect(0, filler)
    net.post(gm.submit(filler, 0.0))
    while net.inbox:  # launch both, and their answers
        net.deliver()
    assert set(gm.running) == {"fill.0", "fill.1"}
    return net, gm, recorder


def state(recorder: Recorder, task_id: str) -> State:
    return State(recorder.states[recorder.tasks.number[task_id]])


def test_a_preemption_request_to_a_crashed_lm_is_refused_then_the_next_lm_is_asked_without_an_illegal_event() -> None:
    net, gm, recorder = full_system(rest=[1])
    waiting = job("wait", task("wait.0"))
    recorder.expect(0, waiting)
    net.post(gm.submit(waiting, 1.0))
    first = net.take("lm/0", PreemptRequest)
    assert isinstance(first, PreemptRequest) and state(recorder, "wait.0") == State.PLACING
    net.post(gm.call_failed(0, first.seq, "LM 0 is down", 1.5))  # the LM crashed: the request failed at once
    second = net.take("lm/1", PreemptRequest)  # counted as refused: the next LM is asked
    assert isinstance(second, PreemptRequest) and second.task.task_id == "wait.0"
    assert state(recorder, "wait.0") == State.PLACING
    assert recorder.illegal == 0


def test_a_parked_task_whose_preemption_request_failed_is_placed_later_without_an_illegal_event() -> None:
    net, gm, recorder = full_system(rest=[])
    waiting = job("wait", task("wait.0"))
    recorder.expect(0, waiting)
    net.post(gm.submit(waiting, 1.0))
    request = net.take("lm/0", PreemptRequest)
    assert isinstance(request, PreemptRequest)
    net.post(gm.call_failed(0, request.seq, "LM 0 is down", 1.5))  # no other LM to ask: it waits, parked
    assert state(recorder, "wait.0") == State.QUEUED
    net.run()  # the fillers finish; the parked task is placed on a freed node and runs
    assert state(recorder, "wait.0") == State.COMPLETED
    assert recorder.illegal == 0
    assert [state(recorder, t) for t in ("fill.0", "fill.1")] == [State.COMPLETED] * 2


# ------------------------------------------------------------ the report


def records_with_an_illegal_transition() -> Recorder:
    """Three finished tasks, one of them decided again after it started (an event the lifecycle does not allow)."""
    recorder = Recorder()
    tasks = [task(f"j.{i}") for i in range(3)]
    submitted = job("j", *tasks)
    recorder.expect(0, submitted)
    recorder.job_arrived(submitted, 0, 0.0)
    placements = [Placement(t, 0, i, False, 0) for i, t in enumerate(tasks)]
    recorder.decided(placements, 0.1)
    recorder.started(placements, 0.2)
    recorder.decided(placements[:1], 0.3)  # RUNNING -> DECIDED: illegal
    recorder.finished([t.task_id for t in tasks], 1.2)
    return recorder


def metrics_of(recorder: Recorder) -> RunMetrics:
    return compute_metrics(recorder.tasks, list(recorder.jobs.values()), CAP, ("cpu", "mem"), 1.0, clock="virtual")


def test_the_report_counts_illegal_transitions_in_the_table_the_summary_and_a_warning(tmp_path: Path) -> None:
    recorder = records_with_an_illegal_transition()
    assert recorder.illegal == 1
    metrics = metrics_of(recorder)
    assert metrics.illegal_transitions == 1 and not metrics.not_exactly_once
    assert "not completed exactly once: 0  illegal transitions: 1" in format_table(metrics, "t")
    (warning,) = run_warnings(metrics)
    assert warning.startswith("1 illegal task transition (")
    assert "task j.0: DECIDED is not allowed in state RUNNING" in warning
    write_outputs(metrics, recorder.tasks, list(recorder.jobs.values()), tmp_path, "t", {})
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["counts"]["illegal_transitions"] == 1 and summary["warnings"] == [warning]


def test_a_clean_run_reports_no_illegal_transition() -> None:
    recorder = Recorder()
    submitted = job("k", task("k.0"))
    recorder.expect(0, submitted)
    recorder.job_arrived(submitted, 0, 0.0)
    metrics = metrics_of(recorder)
    assert metrics.illegal_transitions == 0 and "illegal transitions: 0" in format_table(metrics, "t")
    assert not any("illegal" in w for w in run_warnings(metrics))


def test_a_replay_with_an_illegal_transition_warns_and_exits_non_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Replayed(Recorder):
        def started(self, placements: Sequence[Placement], now: float) -> None:
            super().started(placements, now)
            if any(p.task.task_id == "j0.0" for p in placements):
                self.decided([p for p in placements if p.task.task_id == "j0.0"], now)  # illegal: RUNNING

    replay = ["replay", "--trace", "syn:10:5", "--lms", "1", "--gms", "2", "--workers-per-partition", "10"]
    replay += ["--no-constraints", "--quiet", "--out", str(tmp_path)]
    assert main(replay) == 0
    monkeypatch.setattr(megha.loadgen.replay, "Recorder", Replayed)
    assert main([*replay, "--overwrite"]) == 3
    out, err = capsys.readouterr()
    assert "illegal transitions: 1" in out
    assert "WARNING: 1 illegal task transition" in err and "task j0.0: DECIDED is not allowed in state RUNNING" in err
    assert json.loads((tmp_path / "summary.json").read_text())["counts"]["illegal_transitions"] == 1


REASONS = tuple((f"reason {k}", 5 - k) for k in range(5))


@pytest.mark.parametrize(
    ("files", "said"),
    [
        (True, "; 2 more reasons in tasks.csv"),
        (False, "; 2 more reasons not shown (--no-files: no tasks.csv was written)"),
        (None, "; 2 more reasons in tasks.csv (not written with --no-files)"),
    ],
)
def test_the_warning_says_where_further_reasons_are_only_when_the_files_hold_them(
    files: bool | None, said: str
) -> None:
    recorder = records_with_an_illegal_transition()
    metrics = replace(metrics_of(recorder), tasks=6, tasks_failed=5, failure_reasons=REASONS, illegal_transitions=0)
    (warning,) = run_warnings(metrics, files=files)
    assert warning.startswith("5 of 6 tasks failed") and warning.endswith(said)


# ------------------------------------------- a lost run stopped on its worker


def test_a_lost_run_stopped_on_its_worker_is_no_preemption_and_no_illegal_event() -> None:
    """A launch reaches its node after the node's repair; its LM then takes the node out of service (the crash
    noticed late), reports the run lost, and stops it on the worker, which reports it preempted."""
    recorder = Recorder()
    submitted = job("j", task("j.0"))
    recorder.expect(0, submitted)
    recorder.job_arrived(submitted, 0, 0.0)
    placement = Placement(submitted.tasks[0], 0, 4, False, 0)
    recorder.decided([placement], 1.0)
    recorder.started([placement], 3.0)
    recorder.task_lost(submitted.tasks[0], "worker of LM 0 node 4 silent for 2 s", 3.0)
    recorder.preempted(["j.0"], 3.0)  # the worker stops the lost run
    assert recorder.illegal == 0 and state(recorder, "j.0") == State.QUEUED
    assert recorder.tasks["j.0"].preemptions == 0 and recorder.tasks["j.0"].retries == 1
    assert recorder.preempted_runs == []


LOST_AND_STOPPED = ["replay", "--trace", "syn:20:40", "--lms", "2", "--gms", "2", "--workers-per-partition", "5"]
LOST_AND_STOPPED += ["--no-constraints", "--job-classes", "low:30%,high:30%", "--fail", "lm:rate=100", "--fail"]
LOST_AND_STOPPED += ["worker:rate=200", "--fail-detect", "2", "--fail-repair", "3", "--seed", "15", "--quiet"]

CALL_FAILED = ["replay", "--trace", "syn:20:40", "--lms", "2", "--gms", "2", "--workers-per-partition", "5"]
CALL_FAILED += ["--no-constraints", "--job-classes", "low:30%,high:30%", "--fail", "lm:rate=200", "--fail-repair"]
CALL_FAILED += ["3", "--seed", "3", "--quiet"]


RUN_LOST_WHILE_ITS_GM_WAS_DOWN = ["replay", "--trace", "syn:20:40", "--lms", "2", "--gms", "2", "--no-constraints"]
RUN_LOST_WHILE_ITS_GM_WAS_DOWN += ["--workers-per-partition", "5", "--job-classes", "low:30%,high:30%", "--fail"]
RUN_LOST_WHILE_ITS_GM_WAS_DOWN += ["lm:rate=100", "--fail", "gm:rate=100", "--fail", "worker:rate=200", "--fail-detect"]
RUN_LOST_WHILE_ITS_GM_WAS_DOWN += ["2", "--fail-repair", "3", "--seed", "3", "--quiet"]


@pytest.mark.parametrize(
    "argv",
    [CALL_FAILED, LOST_AND_STOPPED, RUN_LOST_WHILE_ITS_GM_WAS_DOWN],
    ids=["preemption-call-failed", "lost-run-stopped-on-its-worker", "run-lost-while-its-gm-was-down"],
)
def test_replays_that_saw_illegal_transitions_see_none(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The audit's reproduction (4 illegal transitions before the GM reported its refusals), a worker and LM crash
    replay (1 more before the recorder took a lost run's stop for what it is), and a worker, LM and GM crash replay
    (4 more before a restarted GM told its observers which tasks it queued again)."""
    assert main([*argv, "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "illegal transitions: 0" in out and "not allowed" not in err
    assert json.loads((tmp_path / "summary.json").read_text())["counts"]["illegal_transitions"] == 0


# ------------------------------------------- a run lost while its GM was down


class Requeued(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.requeued: list[str] = []

    def requeued_at_recovery(self, tasks: Sequence[TaskSpec], now: float) -> None:
        self.requeued += [t.task_id for t in tasks]
        super().requeued_at_recovery(tasks, now)


def test_a_restarted_gm_tells_its_observers_which_tasks_it_queues_again() -> None:
    recorder = Requeued()
    net = Net.build(cluster([[[[]]]]), observer=recorder)
    first = job("j", task("j.0"), task("j.1"))
    recorder.expect(0, first)
    net.post(net.gms[0].submit(first, 0.0))
    net.run()  # j.0 ran to its end; j.1 waited for the one node, then ran
    recorder.expect(0, again := job("k", task("k.0")))
    recorder.job_arrived(again, 0, 1.0)
    recovered = GlobalMaster(0, cluster([[[[]]]]), observer=recorder)
    recovered.recover([net.lms[0].full_state(0)], [], [again.tasks[0]], 5.0)
    assert recorder.requeued == ["k.0"] and recorder.illegal == 0
    assert state(recorder, "k.0") == State.PLACING  # queued, and placed at once on the free node


def test_a_run_lost_while_its_gm_was_down_goes_back_to_the_queue_in_the_records() -> None:
    """Its worker crashed and its LM restarted without it while its GM was down; the GM restarted, found it
    neither running nor ended, and queued it again: the records see it lost, and placed again legally."""
    recorder = Recorder()
    submitted = job("j", task("j.0", duration=4.0))
    recorder.expect(0, submitted)
    recorder.job_arrived(submitted, 0, 0.0)
    placement = Placement(submitted.tasks[0], 0, 0, False, 0)
    recorder.decided([placement], 0.0)
    recorder.started([placement], 1.0)
    recorder.requeued_at_recovery(submitted.tasks, 3.0)
    assert state(recorder, "j.0") == State.QUEUED
    assert recorder.tasks["j.0"].lost_cpu_seconds == CAP[0] / 1000 * 2.0  # ran 2 s of its 4 before it was lost
    recorder.decided([placement], 3.0)
    recorder.started([placement], 3.5)
    recorder.requeued_at_recovery([], 4.0)
    assert recorder.illegal == 0 and state(recorder, "j.0") == State.RUNNING
