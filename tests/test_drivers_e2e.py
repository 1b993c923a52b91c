"""Task drivers end to end: the README's example jobs (a shell command, a Python script, a container) submitted to a
real GM, placed only on nodes whose agent offers their driver, run by real agents (separate processes, the real
RabbitMQ), ended finished or failed with the reason, and their output read back through the GM's log route and
`megha job logs`. Bad task specs, and a driver no agent offers, are refused with a 422 naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner, Result

from megha.ctl import cli
from megha.deploy.local import LocalDeployment

from dockerkit import build_images
from servicekit import api, needs_rabbitmq, wait_until

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
ENDED = ("finished", "failed", "cancelled")
PRIMES = "5133 primes below 50000; the largest is 49999\n"  # what examples/python-script.yaml prints


def example(name: str, job_id: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text()) | {"job_id": job_id}


def status(gm: str, job_id: str) -> dict[str, Any]:
    r = api.get(f"{gm}/v1/jobs/{job_id}", timeout=5.0)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def wait_ended(gm: str, job_id: str, timeout: float = 90.0) -> dict[str, Any]:
    wait_until(lambda: status(gm, job_id)["state"] in ENDED, timeout, lambda: status(gm, job_id))
    return status(gm, job_id)


def logs(gm: str, job_id: str, task_id: str, **params: object) -> httpx.Response:
    return api.get(f"{gm}/v1/jobs/{job_id}/tasks/{task_id}/logs", params=params, timeout=10.0)


def field_of(response: httpx.Response) -> str:
    return response.json()["detail"][0]["field"]  # type: ignore[no-any-return]


def megha(gm: str, *args: str, code: int = 0) -> Result:
    token = api.headers.get("Authorization", "").removeprefix("Bearer ")
    env = {"COLUMNS": "200", "MEGHA_GM_URL": gm, "MEGHA_GM_URLS": "", "MEGHA_API_TOKEN": token}
    result = CliRunner().invoke(cli, list(args), env=env)
    assert result.exit_code == code, (args, result.output, result.exception)
    return result


def nodes_offering(lm: str, driver: str) -> set[int]:
    """The LM's nodes whose agent offers `driver`, from GET /v1/cluster (nodes are numbered across partitions)."""
    cluster = api.get(f"{lm}/v1/cluster", timeout=5.0).json()
    offered = [driver in d for p in cluster["partitions"] for d in p["drivers"]]
    return {n for n, yes in enumerate(offered) if yes}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    """One GM, one LM and two agents: one offers burn only, the other burn and exec. Each keeps task output in a
    folder of this test's (the default folder is named after the agent alone, so it outlives a deployment)."""
    here = tmp_path_factory.mktemp("drivers")
    logs_dir = here / "logs"
    agents = {
        "worker-0-0": {"drivers": "burn", "task_log_dir": here / "output-0"},
        "worker-0-1": {"drivers": "burn,exec", "task_log_dir": here / "output-1"},
    }
    with LocalDeployment(gms=1, lms=1, workers_per_lm=2, log_dir=logs_dir, worker_settings=agents) as deployment:
        api.use(deployment)
        yield deployment


@needs_rabbitmq
def test_exec_examples_run_only_where_exec_is_offered_and_their_output_is_read_back(
    deployment: LocalDeployment,
) -> None:
    gm, lm = deployment.gm_urls[0], deployment.lm_urls[0]
    exec_nodes = nodes_offering(lm, "exec")
    assert len(exec_nodes) == 1 and len(nodes_offering(lm, "burn")) == 2
    jobs = {"shell": example("shell-command", "shell"), "python": example("python-script", "python")}
    burn_task = {"duration": 0.1, "cpu_millicores": 100, "memory_mb": 16}
    jobs["burn"] = {"job_id": "burn", "user": "alice", "tasks": [burn_task]}
    for body in jobs.values():
        r = api.post(f"{gm}/v1/jobs", json=body, timeout=10.0)
        assert r.status_code == 201, r.text
    shell, python, burn = (wait_ended(gm, job_id) for job_id in jobs)

    # The shell example: a command that finishes, and one that fails with its exit code and stderr as the reason.
    greeter, failing = shell["tasks"]
    assert greeter["state"] == "finished" and greeter["failed_reason"] is None, greeter
    assert failing["state"] == "failed", failing
    assert "3" in failing["failed_reason"] and "input.csv: no such file" in failing["failed_reason"], failing
    assert python["state"] == "finished", python
    assert burn["state"] == "finished", burn
    assert {t["node"] for t in shell["tasks"] + python["tasks"]} == exec_nodes  # never the burn-only agent's

    # Their output, through the GM (which asks the LM, which asks the agent that ran the task).
    out = logs(gm, "shell", "shell.0")
    assert out.status_code == 200 and out.headers["content-type"].startswith("text/plain"), out.text
    assert "hello, world\n" in out.text and "running as " in out.text, out.text
    assert logs(gm, "shell", "shell.1", stream="stderr").text == "input.csv: no such file\n"
    assert logs(gm, "shell", "shell.1").text == "reading /data/input.csv\n"
    latest = logs(gm, "python", "python.0")
    assert latest.text == PRIMES and latest.headers["x-megha-attempt"] == "1"  # the agent's header, passed on
    assert logs(gm, "python", "python.0", tail=8).text == PRIMES[-8:]
    assert logs(gm, "python", "python.0", attempt=1).text == PRIMES
    assert logs(gm, "burn", "burn.0").text == ""  # a burn task prints nothing

    # What cannot be read is refused naming the field.
    for response, code, field in (
        (logs(gm, "python", "python.0", attempt=2), 404, "attempt"),  # no run of attempt 2 at the GM
        (logs(gm, "nope", "nope.0"), 404, "job_id"),
        (logs(gm, "python", "python.7"), 404, "task_id"),
        (logs(gm, "python", "python.0", stream="stdin"), 422, "stream"),
        (logs(gm, "python", "python.0", tail=0), 422, "tail"),
        (api.get(f"{lm}/v1/nodes/99/tasks/python.0/logs", timeout=5.0), 404, "node"),
    ):
        assert (response.status_code, field_of(response)) == (code, field), response.text

    # megha job logs: every task of a job, each headed by its id; or one task's stream, as it was written.
    every = megha(gm, "job", "logs", "shell").stdout
    assert every.index("==> shell.0 (finished) stdout <==") < every.index("hello, world")
    assert every.index("==> shell.1 (failed) stdout <==") < every.index("reading /data/input.csv")
    assert megha(gm, "job", "logs", "shell", "--task", "1", "--stream", "stderr").stdout == "input.csv: no such file\n"
    assert megha(gm, "job", "logs", "python", "--task", "python.0").stdout == PRIMES
    assert megha(gm, "job", "logs", "python", "--task", "0", "--attempt", "1", "--json").stdout.count(PRIMES[:4]) == 1
    refused = megha(gm, "job", "logs", "python", "--task", "0", "--attempt", "2", code=1)
    assert "attempt" in refused.output and "Traceback" not in refused.output


@needs_rabbitmq
def test_bad_specs_and_drivers_no_agent_offers_are_refused_naming_the_field(deployment: LocalDeployment) -> None:
    gm = deployment.gm_urls[0]
    burn = {"duration": 1.0, "cpu_millicores": 100, "memory_mb": 16}
    small = {"cpu_millicores": 100, "memory_mb": 16}
    container = small | {"driver": "container", "image": "megha:latest"}
    for tasks, field in (
        ([container], "tasks.0.driver"),  # a good spec, but no agent here offers container
        ([burn, container], "tasks.1.driver"),
        ([small | {"driver": "exec"}], "tasks.0.command"),
        ([small | {"driver": "container"}], "tasks.0.image"),
        ([burn | {"command": ["true"]}], "tasks.0.command"),
        ([small], "tasks.0.duration"),  # burn needs a duration
        ([small | {"driver": "exec", "command": ["true"], "workdir": "relative/dir"}], "tasks.0.workdir"),
        ([small | {"driver": "exec", "command": ["true"], "env": {"1X": "y"}}], "tasks.0.env.1X.[key]"),
        ([small | {"driver": "rkt", "command": ["true"]}], "tasks.0.driver"),
    ):
        r = api.post(f"{gm}/v1/jobs", json={"user": "alice", "tasks": tasks}, timeout=10.0)
        assert r.status_code == 422, (tasks, r.text)
        assert field in [d["field"] for d in r.json()["detail"]], (tasks, r.text)
    r = api.post(f"{gm}/v1/jobs", json={"user": "alice", "tasks": [container]}, timeout=10.0)
    assert r.json()["error"].endswith(".0: no node offers driver 'container'"), r.text
    listed = api.get(f"{gm}/v1/jobs", timeout=5.0).json()
    assert all(j["job_id"] in ("shell", "python", "burn") for j in listed["jobs"]), listed  # nothing refused queued


@needs_rabbitmq
@pytest.mark.docker
def test_the_container_example_runs_through_the_docker_engine(tmp_path: Path) -> None:
    build_images()  # megha:latest, the example's image, follows the working tree
    agents = {"worker-0-0": {"drivers": "burn,exec,container", "task_log_dir": tmp_path / "output"}}
    with LocalDeployment(
        gms=1, lms=1, workers_per_lm=1, log_dir=tmp_path / "logs", worker_settings=agents
    ) as deployment:
        api.use(deployment)
        gm = deployment.gm_urls[0]
        job = example("container", "boxed")
        failing = job["tasks"][0] | {"command": ["sh", "-c", "echo starting; echo 'model.bin: corrupt' >&2; exit 4"]}
        job["tasks"].append(failing)
        r = api.post(f"{gm}/v1/jobs", json=job, timeout=10.0)
        assert r.status_code == 201, r.text
        ran, failed = wait_ended(gm, "boxed", timeout=240.0)["tasks"]
        assert ran["state"] == "finished", ran
        assert failed["state"] == "failed" and "4" in failed["failed_reason"], failed
        assert "model.bin: corrupt" in failed["failed_reason"], failed
        assert logs(gm, "boxed", "boxed.0").text.startswith("hello from a container, Python 3.")
        assert logs(gm, "boxed", "boxed.1", stream="stderr").text == "model.bin: corrupt\n"
        every = megha(gm, "job", "logs", "boxed").stdout
        assert "==> boxed.0 (finished) stdout <==\nhello from a container, Python 3." in every, every
        assert "==> boxed.1 (failed) stdout <==\nstarting\n" in every, every
