"""Retry rules through the real services (separate processes, the real RabbitMQ): an exec task that exits 3 runs again
under its job's rule until its attempts are used up, one whose exit code the rule does not name fails at once, and
bad rules are refused with a 422 naming the field (docs/retry.md); and, without processes, the GM journal's retry
records and what the job table and job event stream show of a retried failure."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from rich.console import Console

from megha.common.core.messages import Placement
from megha.common.core.observer import observe
from megha.common.core.retry import RetryRule as CoreRetryRule
from megha.common.core.task import JobSpec, TaskSpec
from megha.common.models import JobStatus, JobSubmission
from megha.ctl.jobs import _show_job
from megha.deploy.local import LocalDeployment
from megha.services.gm.events_route import JobEvents
from megha.services.gm.jobs import JobTable
from megha.services.gm.journal import Journal, merge_lines
from megha.services.worker.executor import task_exit_code

from servicekit import api, needs_rabbitmq, task_visible_folder, wait_until

ENDED = ("finished", "failed", "cancelled")


def exec_task(script: str) -> dict[str, Any]:
    return {"driver": "exec", "command": ["sh", "-c", script], "cpu_millicores": 100, "memory_mb": 64}


def status(gm: str, job_id: str) -> dict[str, Any]:
    r = api.get(f"{gm}/v1/jobs/{job_id}", timeout=5.0)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def answered(gm: str, job_id: str) -> dict[str, Any] | None:
    """The job's status once its GM answers (None while it is restarting)."""
    try:
        r = api.get(f"{gm}/v1/jobs/{job_id}", timeout=5.0)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    """One GM, one LM and one agent offering burn and exec."""
    here = tmp_path_factory.mktemp("retry")
    agents = {"worker-0-0": {"drivers": "burn,exec", "task_log_dir": here / "output"}}
    with LocalDeployment(gms=1, lms=1, workers_per_lm=1, log_dir=here / "logs", worker_settings=agents) as deployment:
        api.use(deployment)
        yield deployment


@needs_rabbitmq
def test_a_failing_exec_task_is_retried_to_its_limit_and_an_exit_code_not_named_fails_at_once(
    deployment: LocalDeployment,
) -> None:
    gm = deployment.gm_urls[0]
    rule = {"max_attempts": 3, "backoff_s": 0.05, "on_exit_codes": [3]}
    body = {"job_id": "flaky", "retry": rule, "tasks": [exec_task("exit 3"), exec_task("exit 4")]}
    r = api.post(f"{gm}/v1/jobs", json=body, timeout=10.0)
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    wait_until(lambda: status(gm, job_id)["state"] in ENDED, 60.0, lambda: status(gm, job_id))
    job = status(gm, job_id)
    assert job["state"] == "failed" and job["retry"] == rule, job
    retried, refused = job["tasks"]
    assert retried["state"] == "failed" and retried["failures_retried"] == 2 and retried["retries"] == 0, retried
    assert "exit code 3" in retried["failed_reason"] and "failure 3 of at most 3" in retried["failed_reason"]
    assert retried["attempts"] == 3  # placed three times
    assert refused["state"] == "failed" and refused["failures_retried"] == 0, refused
    assert "exit code 4 not retried" in refused["failed_reason"], refused
    # Each retry ran as its own attempt: the GM reads back what each printed.
    runs = api.get(f"{gm}/v1/jobs/{job_id}/tasks/{job_id}.0/logs", params={"attempt": 3}, timeout=10.0)
    assert runs.status_code == 200 and runs.headers["x-megha-attempt"] == "3", runs.text


@needs_rabbitmq
@pytest.mark.parametrize(
    ("rule", "field"),
    [
        ({"max_attempts": 0, "backoff_s": 1}, "retry.max_attempts"),
        ({"max_attempts": 2, "backoff_s": -1}, "retry.backoff_s"),
        ({"max_attempts": 2, "backoff_s": 1, "on_exit_codes": [0]}, "retry.on_exit_codes.0"),
        ({"max_attempts": 2, "backoff_s": 1, "on_exit_codes": [3, 256]}, "retry.on_exit_codes.1"),
        ({"max_attempts": 2, "backoff_s": 1, "exit_codes": [3]}, "retry.exit_codes"),
    ],
)
def test_a_bad_rule_is_refused_naming_its_field(deployment: LocalDeployment, rule: dict[str, Any], field: str) -> None:
    body = {"retry": rule, "tasks": [exec_task("true")]}
    r = api.post(f"{deployment.gm_urls[0]}/v1/jobs", json=body, timeout=10.0)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == field, r.text


@needs_rabbitmq
def test_a_gang_whose_member_fails_with_a_matching_code_runs_again_whole(
    deployment: LocalDeployment,
) -> None:
    """A gang with a rule (docs/gang.md): member 0 exits 3 on its first run; member 1 runs until the marker member
    0 leaves exists. The failure stops member 1 (or its run, if it already finished, is thrown away), and both run
    again as attempt 2, after one failure of the gang, and finish."""
    gm = deployment.gm_urls[0]
    shared = task_visible_folder("megha-gang-retry-", 0o777)  # the agent may run tasks as another user
    marker = shared / "failed-once"
    first = exec_task(f"test -f {marker} && exit 0; touch {marker}; exit 3")
    second = exec_task(f"for i in $(seq 300); do test -f {marker} && exit 0; sleep 0.1; done")
    rule = {"max_attempts": 2, "backoff_s": 0.05, "on_exit_codes": [3]}
    body = {"job_id": "ranks", "gang": True, "retry": rule, "tasks": [first, second]}
    r = api.post(f"{gm}/v1/jobs", json=body, timeout=10.0)
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    wait_until(lambda: status(gm, job_id)["state"] in ENDED, 60.0, lambda: status(gm, job_id))
    job = status(gm, job_id)
    reasons = [t.get("failed_reason") for t in job["tasks"]]
    assert job["state"] == "finished" and job["gang"] and job["retry"] == rule, reasons
    for task in job["tasks"]:
        assert task["state"] == "finished" and task["failures_retried"] == 1 and task["attempts"] == 2, task
    shutil.rmtree(shared, ignore_errors=True)


@needs_rabbitmq
def test_a_gm_killed_while_a_task_waits_out_its_backoff_comes_back_and_stops_at_the_rules_limit(
    deployment: LocalDeployment,
) -> None:
    """Last in the module but one (both kill and restart the GM). The LM remembers the failed run, but the GM's
    journal says the task runs again as attempt 2 after one failure: it is queued again, not ended, and still fails
    for good on its third failure."""
    gm = deployment.gm_urls[0]
    body = {"job_id": "restarted", "retry": {"max_attempts": 3, "backoff_s": 1.5}, "tasks": [exec_task("exit 5")]}
    r = api.post(f"{gm}/v1/jobs", json=body, timeout=10.0)
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    wait_until(lambda: status(gm, job_id)["tasks"][0]["failures_retried"] >= 1, 30.0, lambda: status(gm, job_id))
    deployment.kill("gm-0")
    deployment.restart("gm-0")

    def held() -> dict[str, Any] | None:
        return answered(gm, job_id)

    wait_until(lambda: (job := held()) is not None and job["state"] in ENDED, 60.0, held)
    (task,) = status(gm, job_id)["tasks"]
    assert task["state"] == "failed" and task["failures_retried"] == 2, task
    assert "exit code 5; failure 3 of at most 3" in task["failed_reason"], task


@needs_rabbitmq
def test_a_gang_member_that_finished_before_its_gm_was_killed_runs_again_when_another_fails_after_the_restart(
    deployment: LocalDeployment,
) -> None:
    """Last in the module: it kills and restarts the GM. Member 0 of a gang with a rule finishes at once (each run
    leaves a file): its end is held, not reported, when the GM is killed. After the restart member 1, which
    waited for the test's go, exits 3: the restarted GM learnt member 0's end from the LM's memory of ended runs and
    held it again (docs/gang.md), so the whole gang runs again, member 0 too, and finishes."""
    gm, lm = deployment.gm_urls[0], deployment.lm_urls[0]
    shared = task_visible_folder("megha-gang-restart-", 0o777)  # the agent may run tasks as another user
    go, failed = shared / "go", shared / "failed-once"
    first = exec_task(f"mktemp {shared}/run-of-0.XXXXXX")  # a file of its own: each run may be another user
    second = exec_task(
        f"test -f {failed} && exit 0; for i in $(seq 600); do test -f {go} && touch {failed} && exit 3; sleep 0.1; done"
    )
    rule = {"max_attempts": 2, "backoff_s": 0.05, "on_exit_codes": [3]}
    body = {"job_id": "held-ranks", "gang": True, "retry": rule, "tasks": [first, second]}
    r = api.post(f"{gm}/v1/jobs", json=body, timeout=10.0)
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]

    def ended_at_lm() -> list[str]:
        return [run["task_id"] for run in api.get(f"{lm}/v1/gms/0/state", timeout=5.0).json()["ended"]]

    wait_until(lambda: f"{job_id}.0" in ended_at_lm(), 30.0, ended_at_lm)
    assert status(gm, job_id)["tasks"][0]["state"] not in ENDED  # held
    deployment.kill("gm-0")
    deployment.restart("gm-0")

    def held() -> dict[str, Any] | None:
        return answered(gm, job_id)

    wait_until(lambda: held() is not None, 60.0, held)
    go.touch()
    wait_until(lambda: (job := held()) is not None and job["state"] in ENDED, 60.0, held)
    job = status(gm, job_id)
    assert job["state"] == "finished", [(t["state"], t.get("failed_reason")) for t in job["tasks"]]
    for task in job["tasks"]:
        assert task["state"] == "finished" and task["failures_retried"] == 1, task
    assert len(list(shared.glob("run-of-0.*"))) == 2  # member 0 ran again with the gang
    shutil.rmtree(shared, ignore_errors=True)


def test_the_journal_keeps_each_tasks_latest_retry_and_a_peers_copy_merges_newer_ones(tmp_path: Path) -> None:
    path = tmp_path / "gm.journal"
    journal = Journal(path)
    journal.append({"retry": "j.0", "attempt": 2, "failures": 1})
    journal.append({"retry": "j.0", "attempt": 3, "failures": 2})
    journal.append({"retry": "j.1", "attempt": 2, "failures": 1})
    journal.close()
    assert Journal.replay(path).retries == {"j.0": (3, 2), "j.1": (2, 1)}
    older, newer = '{"retry":"j.0","attempt":2,"failures":1}', '{"retry":"j.1","attempt":3,"failures":2}'
    assert merge_lines(path, [older, newer]) == 1
    assert Journal.replay(path).retries == {"j.0": (3, 2), "j.1": (3, 2)}


def test_the_job_table_and_event_stream_show_a_retried_failure_as_no_end() -> None:
    rule = CoreRetryRule(3, 1.0, frozenset({3}))
    journaled: list[tuple[str, int]] = []
    table = JobTable(0, on_retry=lambda task, n: journaled.append((task.task_id, n)))
    events = JobEvents(lambda: table)
    observer = observe(table, events)
    task = TaskSpec("j.0", "j", "u", 0.0, (1, 1), 0)
    observer.job_arrived(JobSpec("j", (task,), 1.0, retry=rule), 0, 1.0)
    reader = events.open("j", 1.0)
    observer.decided([Placement(task, 0, 2, False)], 2.0)
    observer.task_retry_scheduled(task, "exit code 3; failure 1 of at most 3", 4.0, 3.0)
    status = table.status("j")
    assert status is not None and status.state == "queued" and status.retry is not None
    assert status.retry.on_exit_codes == [3] and status.tasks[0].failures_retried == 1
    assert status.tasks[0].state == "queued" and table.unfinished() == 1 and journaled == [("j.0", 1)]
    frames = [f.decode() for f in reader.frames]
    assert "event: task" in frames[-1] and '"kind":"retrying"' in frames[-1] and not reader.closed


def test_a_runs_exit_code_for_retry_rules_maps_signals_and_kills() -> None:
    assert task_exit_code(3, memory_exceeded=False, timed_out=False) == 3
    assert task_exit_code(0, memory_exceeded=False, timed_out=False) == 0
    assert task_exit_code(-9, memory_exceeded=False, timed_out=False) == 137  # SIGKILL from outside: 128 + 9
    assert task_exit_code(-15, memory_exceeded=False, timed_out=False) == 143
    assert task_exit_code(-9, memory_exceeded=True, timed_out=False) == 137  # the memory limit
    assert task_exit_code(1, memory_exceeded=True, timed_out=False) == 137  # an allocation failed at its rlimit
    assert task_exit_code(-15, memory_exceeded=False, timed_out=True) is None  # the duration limit


def test_megha_job_status_shows_the_rule_and_the_failed_runs_retried() -> None:
    status = JobStatus.model_validate(
        {
            "job_id": "j",
            "user": "u",
            "gm": 0,
            "state": "running",
            "retry": {"max_attempts": 3, "backoff_s": 0.5, "on_exit_codes": [3, 137]},
            "tasks": [{"task_id": "j.0", "state": "queued", "failures_retried": 2}],
        }
    )
    console = Console(record=True, width=200)

    class Shown:
        urls = ["http://gm"]

        def print(self, *renderables: object) -> None:
            console.print(*renderables)

    _show_job(Shown(), status, Shown())  # type: ignore[arg-type]
    text = console.export_text()
    assert "retry: at most 3 failed runs per task, backoff 0.5 s, exit codes 3,137; 2 failed runs retried" in text


def test_the_example_job_file_is_a_valid_submission_with_its_rule() -> None:
    example = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "retry.yaml").read_text())
    sub = JobSubmission.model_validate(example)
    assert sub.retry is not None and sub.retry.to_core() == CoreRetryRule(4, 2.0, frozenset({3, 137}))
