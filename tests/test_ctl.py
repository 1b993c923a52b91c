"""The operator's command line (`megha job|queues|nodes|top`, megha/ctl.py) against a real deployment: a GM, an LM
and a worker agent as separate processes on the real RabbitMQ. Tables are checked for the numbers the services
report, `--json` is parsed, and every failure is one line with the documented exit status, never a traceback."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from megha.ctl import cli
from megha.deploy.local import LocalDeployment, free_port

from servicekit import api, needs_rabbitmq, wait_until

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "job.yaml"
MEGHA = str(Path(sys.executable).parent / "megha")
WIDE = {"COLUMNS": "200", "MEGHA_GM_URL": "", "MEGHA_GM_URLS": "", "MEGHA_LM_URLS": ""}
ENDED = ("finished", "failed", "cancelled")


def megha(*args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli, list(args), env={**WIDE, "MEGHA_API_TOKEN": _token()})
    assert result.exit_code == code, (args, result.output, result.exception)
    return result


def _token() -> str:
    """The API token of the running deployment's operator."""
    return api.headers.get("Authorization", "").removeprefix("Bearer ")


def as_json(*args: str) -> Any:
    return json.loads(megha(*args, "--json").stdout)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    logs = tmp_path_factory.mktemp("ctl") / "logs"
    with LocalDeployment(gms=1, lms=1, workers_per_lm=1, execution="simulated", log_dir=logs) as deployment:
        api.use(deployment)
        yield deployment


def test_version_and_help_name_the_new_commands() -> None:
    version = subprocess.run([MEGHA, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and re.fullmatch(r"megha \d+\.\d+\.\d+\S*\n", version.stdout), version
    listed = subprocess.run([MEGHA, "--help"], capture_output=True, text=True, timeout=60).stdout
    assert all(name in listed for name in ("job", "queues", "nodes", "top", "replay", "local")), listed


@pytest.mark.parametrize("args", [("job", "list"), ("job", "status", "x"), ("queues",), ("nodes", "--lm", "GM")])
def test_an_unreachable_gm_or_lm_is_one_line_and_exit_status_3(args: tuple[str, ...]) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    args = tuple(url if a == "GM" else a for a in args)
    run = subprocess.run(
        [MEGHA, *args, "--gm", url], capture_output=True, text=True, timeout=60, env={**os.environ, **WIDE}
    )
    assert run.returncode == 3, run
    assert run.stdout == "" and run.stderr.count("\n") == 1, run.stderr
    assert re.match(rf"megha: (GM|LM) at {url} cannot be reached: .*[Cc]onnection refused", run.stderr), run.stderr


def test_a_bad_job_file_names_the_field_and_bad_usage_is_status_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("user: alice\ntasks:\n  - {duration: 1, cpu_millicores: 0, memory_mb: 64}\n")
    out = megha("job", "submit", str(bad), code=2).stderr
    assert out.startswith(f"megha: {bad}: tasks.0.cpu_millicores: ") and out.count("\n") == 1, out
    broken = tmp_path / "broken.json"
    broken.write_text('{"tasks": [')
    assert "not valid JSON" in megha("job", "submit", str(broken), code=2).stderr
    laughs = tmp_path / "laughs.yaml"  # nine levels of nine aliases: 9**9 nodes if expanded
    levels = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    levels += [f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi", strict=True)]
    laughs.write_text("\n".join([*levels, "tasks: *i"]) + "\n")
    assert "a job file takes no YAML aliases" in megha("job", "submit", str(laughs), code=2).stderr
    assert "not both" in megha("job", "submit", str(EXAMPLE), "--tasks", "2", code=2).stderr
    assert "--duration" in megha("job", "submit", code=2).stderr
    assert "not an http" in megha("job", "list", "--gm", "localhost:8000", code=2).stderr


@needs_rabbitmq
def test_submit_the_example_then_status_and_list_with_filters_and_pages(deployment: LocalDeployment) -> None:
    gm = ("--gm", deployment.gm_urls[0])
    accepted = as_json("job", "submit", str(EXAMPLE), *gm)
    job = accepted["job_id"]
    assert len(accepted["task_ids"]) == 3 and accepted["gm"] == 0
    wait_until(
        lambda: as_json("job", "status", job, *gm)["state"] in ENDED, 60, lambda: as_json("job", "status", job, *gm)
    )
    status = as_json("job", "status", job, *gm)
    assert status == api.get(f"{deployment.gm_urls[0]}/v1/jobs/{job}", timeout=5).json()  # the API's JSON
    assert status["state"] == "finished" and status["user"] == "alice"
    table = megha("job", "status", job, *gm).stdout
    assert f"job {job}" in table and "finished: 3 finished" in table and f"{job}.2" in table

    flagged = as_json("job", "submit", "--user", "bob", "--tasks", "2", "--duration", "0.1", *gm)["job_id"]
    wait_until(lambda: as_json("job", "status", flagged, *gm)["state"] in ENDED, 60)
    assert [j["job_id"] for j in as_json("job", "list", "--user", "alice", *gm)["jobs"]] == [job]
    assert [j["job_id"] for j in as_json("job", "list", "--queue", "bob", "--state", "finished", *gm)["jobs"]] == [
        flagged
    ]
    assert as_json("job", "list", "--state", "running", "--user", "bob", *gm)["jobs"] == []
    first = as_json("job", "list", "--limit", "1", *gm)
    assert first["total"] >= 2 and first["next_offset"] == 1 and len(first["jobs"]) == 1
    second = as_json("job", "list", "--limit", "1", "--offset", "1", *gm)
    assert second["jobs"][0]["job_id"] != first["jobs"][0]["job_id"]
    every = as_json("job", "list", "--all", *gm)
    assert len(every["jobs"]) == every["total"] == first["total"] and every["next_offset"] is None
    listed = megha("job", "list", "--user", "alice", *gm).stdout
    assert job in listed and "3 finished" in listed and "jobs 1-1 of 1" in listed


@needs_rabbitmq
def test_cancel_a_long_job_and_a_finished_one_is_refused_in_one_line(deployment: LocalDeployment) -> None:
    gm, lm = deployment.gm_urls[0], deployment.lm_urls[0]
    whole_node = ("--cpu-millicores", "2000", "--memory-mb", "4096")
    job = as_json("job", "submit", "--job-id", "long", "--tasks", "2", "--duration", "600", *whole_node, "--gm", gm)
    assert job["job_id"] == "long"
    wait_until(lambda: api.get(f"{lm}/v1/state", timeout=5).json()["running"] == 1, 30)
    line = megha("job", "cancel", "long", "--gm", gm).stdout
    assert line.startswith("job long cancelled at GM 0") and line.count("\n") == 1, line
    wait_until(lambda: as_json("job", "status", "long", "--gm", gm)["state"] == "cancelled", 30)
    wait_until(lambda: api.get(f"{lm}/v1/state", timeout=5).json()["running"] == 0, 30)

    assert "2 cancelled" in megha("job", "cancel", "long", "--gm", gm).stdout  # a repeat answers the status

    short = as_json("job", "submit", "--duration", "0.1", "--gm", gm)["job_id"]
    wait_until(lambda: as_json("job", "status", short, "--gm", gm)["state"] in ENDED, 30)
    refused = megha("job", "cancel", short, "--gm", gm, code=1).stderr
    assert refused == f"megha: GM at {gm} answered 409: job {short} already ended (finished); nothing to cancel\n"
    missing = megha("job", "status", "nope", "--gm", gm, code=1).stderr
    assert missing == f"megha: GM at {gm} answered 404: no job nope at GM 0\n"
    assert (
        "answered 422: "
        in megha("job", "submit", "--duration", "1", "--cpu-millicores", "9999", "--gm", gm, code=1).stderr
    )


def _numbers(text: str) -> str:
    return " ".join(re.findall(r"[\w,/%-]+", text))


@needs_rabbitmq
def test_queues_and_nodes_show_what_the_gm_and_lm_report(deployment: LocalDeployment) -> None:
    gm, lm = deployment.gm_urls[0], deployment.lm_urls[0]
    assert as_json("job", "submit", "--tasks", "1", "--duration", "600", "--cpu-millicores", "500", "--gm", gm)
    wait_until(lambda: api.get(f"{lm}/v1/state", timeout=5).json()["running"] == 1, 30)

    queues = as_json("queues", "--gm", gm)
    assert queues[0]["queues"] == api.get(f"{gm}/v1/queues", timeout=5).json()
    assert queues[0]["tasks"] == {"default": {"pending": 0, "running": 1}}
    table = _numbers(megha("queues", "--gm", gm).stdout)
    assert "default 0 - - - - 0 1 -" in table, table

    nodes = as_json("nodes", "--lm", lm)
    assert nodes[0]["cluster"] == api.get(f"{lm}/v1/cluster", timeout=5).json()
    state = api.get(f"{lm}/v1/state", timeout=5).json()
    (free,), (capacity,) = state["free"], state["capacity"]
    assert free == [capacity[0] - 500, capacity[1] - 1024]
    table = _numbers(megha("nodes", "--lm", lm).stdout)
    cpu, memory = f"{free[0]:,}/{capacity[0]:,}", f"{free[1]:,}/{capacity[1]:,}"
    assert f"0 GM 0 1 1 0 {cpu} {memory} 25%" in table, table
    assert "worker agents 1, tasks running 1" in table
    assert as_json("nodes", "--gm", gm)[0]["cluster"] == nodes[0]["cluster"]  # the LM URLs the GM uses
    assert "--lm" in megha("nodes", "--gm", "http://127.0.0.1:9", code=2).stderr  # no LM URLs to be had


def _pty_run(args: list[str], shown: Callable[[str], bool], timeout: float = 20.0) -> tuple[int, str]:
    """Run `args` on a pseudo-terminal until its screen text satisfies `shown` (at most `timeout` seconds), then
    press Ctrl-C: its exit status and its screen text."""
    master, slave = pty.openpty()
    env = {**os.environ, **WIDE, "LINES": "60", "TERM": "xterm", "MEGHA_API_TOKEN": _token()}
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    out = b""

    def screen() -> str:
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))

    def drain(until: float, done: Callable[[str], bool] = lambda _: False) -> None:
        nonlocal out
        while time.monotonic() < until and not done(screen()):
            if select.select([master], [], [], 0.1)[0]:
                try:
                    out += os.read(master, 65536)
                except OSError:  # the terminal closed with the process
                    return

    drain(time.monotonic() + timeout, shown)
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=15)
    drain(time.monotonic() + 0.5)
    os.close(master)
    return code, screen()


@needs_rabbitmq
def _a_finished_and_a_cancelled_job(gm: str) -> None:
    """At least one finished and one cancelled job at GM `gm`, made here when the module's earlier tests left none
    (the test runs alone, or after the module fixture's deployment was made again)."""
    if as_json("job", "list", "--state", "finished", "--gm", gm)["total"] == 0:
        short = as_json("job", "submit", "--duration", "0.1", "--gm", gm)["job_id"]
        wait_until(lambda: as_json("job", "status", short, "--gm", gm)["state"] in ENDED, 30)
    if as_json("job", "list", "--state", "cancelled", "--gm", gm)["total"] == 0:
        long = as_json("job", "submit", "--duration", "600", "--gm", gm)["job_id"]
        megha("job", "cancel", long, "--gm", gm)
        wait_until(lambda: as_json("job", "status", long, "--gm", gm)["state"] == "cancelled", 30)


def test_top_shows_job_counts_live_and_ctrl_c_exits_0(deployment: LocalDeployment) -> None:
    gm, lm = deployment.gm_urls[0], deployment.lm_urls[0]
    _a_finished_and_a_cancelled_job(gm)
    counts = {state: as_json("job", "list", "--state", state, "--gm", gm)["total"] for state in ENDED}
    assert counts["finished"] >= 1 and counts["cancelled"] >= 1

    frame = json.loads(megha("top", "--iterations", "1", "--json", "--gm", gm, "--lm", lm).stdout)
    assert {s: frame["gms"][0]["jobs"][s] for s in ENDED} == counts
    assert frame["lms"][0]["running"] == api.get(f"{lm}/v1/state", timeout=5).json()["running"]

    # Two frames drawn: the live view refreshed at least once before Ctrl-C.
    two_frames = lambda text: text.count("LMs (resources: free/capacity)") >= 2  # noqa: E731
    code, screen = _pty_run([MEGHA, "top", "--gm", gm, "--lm", lm, "--interval", "0.5"], two_frames)
    assert code == 0 and "Traceback" not in screen, screen
    assert "jobs by state" in screen and "LMs (resources: free/capacity)" in screen, screen
    row = f"0 0 {_running_jobs(gm)} {counts['finished']} {counts['failed']} {counts['cancelled']}"
    assert row in _numbers(screen), _numbers(screen)


def _running_jobs(gm: str) -> int:
    return api.get(f"{gm}/v1/jobs", params={"state": "running"}, timeout=5).json()["total"]


@needs_rabbitmq
def test_several_gms_submit_to_the_queues_gm_and_merge_lists(tmp_path: Path) -> None:
    """Fair scheduling on two GMs: a job goes to the GM serving its user's queue (the other answers 422), `job
    status` finds it there, `job list` merges both GMs' jobs, and `queues` shows each queue once."""
    deployment = LocalDeployment(
        gms=2, lms=1, workers_per_lm=1, execution="simulated", queues="alice:40%:0,bob:60%:1", log_dir=tmp_path
    )
    with deployment:
        api.use(deployment)
        gms = ("--gm", ",".join(deployment.gm_urls))
        bob = as_json("job", "submit", "--user", "bob", "--duration", "0.1", *gms)
        alice = as_json("job", "submit", "--user", "alice", "--duration", "0.1", *gms)
        assert (bob["gm"], alice["gm"]) == (1, 0)
        for job in (bob, alice):
            wait_until(lambda job=job: as_json("job", "status", job["job_id"], *gms)["state"] in ENDED, 30)
        listed = as_json("job", "list", *gms)
        assert [j["job_id"] for j in listed["jobs"]] == [bob["job_id"], alice["job_id"]] and listed["total"] == 2
        assert [j["job_id"] for j in as_json("job", "list", "--limit", "1", "--offset", "1", *gms)["jobs"]] == [
            alice["job_id"]
        ]
        refused = megha("job", "submit", "--user", "carol", "--duration", "1", *gms, code=1).stderr
        assert "answered 422: " in refused and "'carol' has no queue" in refused, refused
        table = _numbers(megha("queues", *gms).stdout)
        assert "alice 0 40%" in table and "bob 1 60%" in table, table
