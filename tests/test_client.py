"""megha.client against a real deployment (a GM, an LM and a worker agent as separate processes on the real
RabbitMQ, authentication on): submit from a dict, a job file and a model, status, list, cancel, wait; and the job
event stream, GM `GET /v1/jobs/{id}/events`: events in order, ending with the job's end; another user's job is
404; a reader that stops reading holds no submission back."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from megha.client import AsyncClient, Client, MeghaError
from megha.common.models import MAX_TASKS_PER_JOB, JobEnd, JobStatus, JobSubmission, TaskRequest, TaskTransition
from megha.ctl import cli
from megha.deploy.local import LocalDeployment

from servicekit import needs_rabbitmq

pytestmark = needs_rabbitmq

ROOT = Path(__file__).resolve().parents[1]
TOKENS = {"alice": "alice-token-" + "a" * 20, "bob": "bob-token-" + "b" * 20}
SHORT = {"duration": 0.2, "cpu_millicores": 100, "memory_mb": 64}
ENDS = ("finished", "failed", "cancelled")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    logs = tmp_path_factory.mktemp("client") / "logs"
    with LocalDeployment(
        gms=1, lms=1, workers_per_lm=1, execution="simulated", log_dir=logs, user_tokens=TOKENS
    ) as deployment:
        yield deployment


def client(deployment: LocalDeployment, user: str) -> Client:
    return Client(deployment.gm_urls, token=TOKENS[user], ca=deployment.tls_ca or None)


def test_submit_from_a_dict_a_file_and_a_model_then_wait_status_and_list(deployment: LocalDeployment) -> None:
    with client(deployment, "alice") as alice:
        from_dict = alice.submit({"tasks": [SHORT, SHORT]})
        from_file = alice.submit(ROOT / "examples" / "job.yaml")
        from_model = alice.submit(JobSubmission(tasks=[TaskRequest(**SHORT)], job_id="modelled"))
        assert len(from_dict.task_ids) == 2 and len(from_file.task_ids) == 3
        assert from_model.job_id.startswith("alice~modelled~")  # a user's name, in its scope
        for accepted in (from_dict, from_file, from_model):
            ended = alice.wait(accepted.job_id, timeout=60)
            assert ended.state == "finished" and all(t.state == "finished" for t in ended.tasks)
        assert alice.status("modelled").job_id == from_model.job_id  # the name finds it
        listed = alice.list(state="finished")
        assert {from_dict.job_id, from_file.job_id, from_model.job_id} <= {j.job_id for j in listed.jobs}
        assert {j.user for j in listed.jobs} == {"alice"}


def test_cancel_and_the_error_names_the_field(deployment: LocalDeployment) -> None:
    with client(deployment, "alice") as alice:
        long = alice.submit({"tasks": [{**SHORT, "duration": 600}]})
        assert alice.cancel(long.job_id).state == "cancelled"
        assert alice.wait(long.job_id, timeout=30).tasks[0].state == "cancelled"
        with pytest.raises(MeghaError) as refused:
            alice.submit({"tasks": [{**SHORT, "cpu_millicores": 10**6}]})
        assert refused.value.status == 422 and refused.value.body is not None
        assert refused.value.body.detail[0].field.startswith("tasks")


def test_the_event_stream_gives_the_state_each_change_in_order_and_the_end(deployment: LocalDeployment) -> None:
    with client(deployment, "alice") as alice:
        accepted = alice.submit({"tasks": [{**SHORT, "duration": 1.0}] * 3})
        events = list(alice.events(accepted.job_id))
    first, changes, last = events[0], events[1:-1], events[-1]
    assert isinstance(first, JobStatus) and isinstance(last, JobEnd) and last.state == "finished"
    assert all(isinstance(c, TaskTransition) for c in changes)
    seen = {t.task_id: [t.state] for t in first.tasks}
    for change in changes:
        seen[change.task_id].append(change.kind)  # type: ignore[union-attr]
    for task_id, states in seen.items():  # each task: launched before it finished, and finished once
        assert states.count("finished") == 1 and states[-1] == "finished", (task_id, states)
        assert "launched" in states[: states.index("finished")] or states[0] == "finished", (task_id, states)
    times = [c.at for c in changes]  # type: ignore[union-attr]
    assert times == sorted(times) and all(t <= last.at for t in times)


def test_another_user_gets_404_for_a_jobs_events(deployment: LocalDeployment) -> None:
    with client(deployment, "alice") as alice, client(deployment, "bob") as bob:
        accepted = alice.submit({"tasks": [SHORT]})
        with pytest.raises(MeghaError) as refused:
            next(iter(bob.events(accepted.job_id)))
        assert refused.value.status == 404 and refused.value.body is not None
        assert refused.value.body.detail[0].field == "job_id"
        assert isinstance(next(iter(alice.events(accepted.job_id))), JobStatus)


def test_a_reader_that_stops_reading_holds_no_submission_back(deployment: LocalDeployment) -> None:
    """A stream of a job of many tasks is opened and not read; meanwhile other jobs are submitted and end, and the
    GM drops the reader once it fell behind."""
    with client(deployment, "alice") as alice:
        tiny = {"duration": 0.0, "cpu_millicores": 1, "memory_mb": 1}
        big = alice.submit({"tasks": [tiny] * MAX_TASKS_PER_JOB})  # 20,000 events: more than socket buffers hold
        gm = urlsplit(deployment.gm_urls[0])
        stalled = socket.create_connection((gm.hostname, gm.port))
        request = (
            f"GET /v1/jobs/{big.job_id}/events HTTP/1.1\r\nHost: {gm.netloc}\r\n"
            f"Authorization: Bearer {TOKENS['alice']}\r\nConnection: close\r\n\r\n"
        )
        stalled.sendall(request.encode())
        try:

            async def submit_and_wait() -> list[str]:
                async with AsyncClient(deployment.gm_urls, token=TOKENS["alice"]) as gm:
                    jobs = [await gm.submit({"tasks": [SHORT]}) for _ in range(5)]
                    return [(await gm.wait(j.job_id, timeout=60)).state for j in jobs]

            assert asyncio.run(submit_and_wait()) == ["finished"] * 5
            assert alice.wait(big.job_id, timeout=120).state == "finished"
            assert alice.health().ready
            stalled.settimeout(30)
            sent = b""
            while chunk := stalled.recv(65536):  # the GM dropped the reader: its stream ends with an error event
                sent += chunk
            assert b"event: error" in sent and b"events behind" in sent and b"event: end" not in sent
        finally:
            stalled.close()


def test_megha_job_watch_prints_the_events_and_exits_with_the_outcome(deployment: LocalDeployment) -> None:
    def watch(job_id: str, *more: str) -> tuple[int, str]:
        env = {"MEGHA_API_TOKEN": TOKENS["alice"], "MEGHA_GM_URL": deployment.gm_urls[0], "COLUMNS": "200"}
        run = CliRunner().invoke(cli, ["job", "watch", job_id, *more], env=env)
        assert run.exception is None or isinstance(run.exception, SystemExit), run.output
        return run.exit_code, run.stdout

    with client(deployment, "alice") as alice:
        done = alice.submit({"tasks": [SHORT, SHORT], "job_id": "watched"})
        code, out = watch("watched")
        lines = out.splitlines()
        assert code == 0 and lines[0].startswith(f"job {done.job_id} (user alice, GM 0) ")
        assert lines[-1].endswith(f"job {done.job_id} ended finished")
        assert all(f"task {t} finished" in out for t in done.task_ids) or "2 finished" in lines[0], out

        cancelled = alice.submit({"tasks": [{**SHORT, "duration": 600}]})
        alice.cancel(cancelled.job_id)
        code, out = watch(cancelled.job_id, "--json")
        events = [json.loads(line) for line in out.splitlines()]
        assert code == 4 and events[0]["event"] == "state" and events[-1]["event"] == "end"
        assert events[-1]["data"]["state"] == "cancelled"

        code, _ = watch("nobody-has-this-job")
        assert code == 1
