"""The compose demo for real: docker-compose.yml on the images deploy/images/build.sh makes, replayed to the end.

The load generator must exit 0 with every task finished exactly once and its report written, and the project's
Prometheus must have scraped every GM, LM and agent: started again after the run (as a user does to look back at
it), it answers what the run did, and every expression of the Grafana dashboard runs on it and has data. `down -v`
must then leave no container, network or volume of the project behind. Each container must have seen only its own
secrets: only the secrets service mounts the root material, and an agent's container finds its own credential and
broker URL and nothing else (no cluster secret, no operator token, no secret in its environment). The demo's own file
is used as a laptop user runs it; a small override moves the report from ./out to a temporary directory and replays
the demo's arrivals and tasks at 0.0002 of their trace times instead of the demo's 0.0005.
"""

from __future__ import annotations

import csv
import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dockerkit import ROOT, build_images, compose_command, project_resources, run
from servicekit import wait_until

pytestmark = pytest.mark.docker

UP_TIMEOUT = 480.0
"""Seconds for `up`: the broker and services start in about 20 s and the replay (sped up below) about 40 s."""
REPORT = ("tasks.csv", "jobs.csv", "summary.json", "utilization.csv", "cdf.png")
PROMETHEUS = "http://127.0.0.1:9090"
"""The compose Prometheus, as docker-compose.yml publishes it."""
RUN = "1h"
"""A range that holds the whole run, for queries asked after it."""
RATE_INTERVAL = "10s"
"""What Grafana makes of $__rate_interval with the 2 s scrape interval (4 scrapes) and a 5 s step."""
AGENT = "worker-0-0"
AGENT_VIEW = """
import json, os
from megha.common.auth import Credential
with open("/secrets/credential") as handle:
    credential = Credential.decode(handle.read())
view = {"files": sorted(os.listdir("/secrets")), "credential": [credential.role, credential.ident]}
print(json.dumps({**view, "uid": os.getuid(), "env": dict(os.environ)}))
"""
"""Run in an agent's container: the secrets it sees, whose credential it holds, its uid and its environment."""


def _anonymous_volumes(project: str) -> list[str]:
    """Volumes the project's containers mount without a name (the broker image's VOLUME): unlabelled by Compose."""
    ids = run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"], 60).stdout.split()
    if not ids:
        return []
    mounts = run(["docker", "inspect", "--format", "{{json .Mounts}}", *ids], 60)
    assert mounts.returncode == 0, mounts.stderr
    return [m["Name"] for line in mounts.stdout.splitlines() for m in json.loads(line) if m["Type"] == "volume"]


def _prometheus(path: str, **params: str | float) -> Any:
    """The data of a successful answer of Prometheus's HTTP API."""
    response = httpx.get(f"{PROMETHEUS}{path}", params=params, timeout=10.0)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", f"{path} {params}: {body}"
    return body["data"]


def _ready() -> bool:
    try:
        return httpx.get(f"{PROMETHEUS}/-/ready", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _value(promql: str) -> float:
    (sample,) = _prometheus("/api/v1/query", query=promql)["result"]
    return float(sample["value"][1])


def _check_prometheus_saw_the_run(tasks: int) -> None:
    """Prometheus, started again after the run, holds the run's samples: every target was up, the LMs launched each
    task once, the GMs observed an allocation time for each, and every dashboard expression has data."""
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for static in job["static_configs"] for t in static["targets"]}
    up = _prometheus("/api/v1/query", query=f"max_over_time(up[{RUN}])")["result"]
    assert {s["metric"]["instance"]: s["value"][1] for s in up} == dict.fromkeys(targets, "1"), up
    assert _value(f"sum(max_over_time(megha_lm_launched_tasks_total[{RUN}]))") == tasks
    assert _value(f"sum(max_over_time(megha_allocation_time_seconds_count[{RUN}]))") >= tasks
    end = time.time()
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "megha.json").read_text())
    for expr in (target["expr"] for panel in dashboard["panels"] for target in panel["targets"]):
        query = expr.replace("$__rate_interval", RATE_INTERVAL)
        answer = _prometheus("/api/v1/query_range", query=query, start=end - 900, end=end, step=5)
        assert answer["result"], f"the dashboard's {expr} has no data for the run"


# Two runs in an agent's container as its service starts it, each started as the exec driver starts a run (a uid of
# its own, and a /proc of its own when the agent can make one): the snooping one lists /proc and every command line.
SNOOP = """
import json, subprocess
from megha.services.worker import enforcement, isolation
why = isolation.why_no_private_proc()
def as_run(uid):
    return lambda: enforcement.child_setup(None, None, 0, None, uid, uid, own_proc=why is None)
victim = ["python", "-c", "import time; time.sleep(60)", "victim-key-7f3a"]
victim = subprocess.Popen(victim, preexec_fn=as_run(900000006))
snoop = "ls /proc; for f in /proc/[0-9]*/cmdline; do tr '\\\\0' ' ' < $f; echo; done"
seen = subprocess.run(["sh", "-c", snoop], capture_output=True, text=True, preexec_fn=as_run(900000005))
victim.kill()
print(json.dumps({"why": why, "seen": seen.stdout, "victim": victim.pid}))
"""


def _check_a_run_reads_no_other_run_s_command_line(compose: list[str], env: dict[str, str]) -> None:
    """The demo's agent container may give each run a /proc of its own (`x-agent`'s CAP_SYS_ADMIN), and a run then
    finds neither the pid nor the command line of another run, though it sees its own."""
    done = run([*compose, "run", "--rm", "--no-deps", "-T", AGENT, "python", "-c", SNOOP], 120, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["why"] is None, f"{AGENT}'s container cannot give a run a /proc of its own: {found['why']}"
    assert "for f in /proc" in found["seen"], f"the snooping run did not see its own command line:\n{found['seen']}"
    assert "victim-key-7f3a" not in found["seen"], f"a run read another run's command line:\n{found['seen']}"
    assert str(found["victim"]) not in found["seen"].split(), f"a run saw another run's pid:\n{found['seen']}"


def _check_each_container_saw_only_its_own_secrets(compose: list[str], env: dict[str, str], project: str) -> None:
    """The run's containers mounted no secrets volume but their own (the secrets service alone the root material,
    volume `secrets`), and an agent's container, as its service runs it, sees at /secrets its own credential and broker
    URL only, runs as root, and holds none of the root secrets in its environment; run as a task's uid, it reads
    none of them."""
    containers = run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"], 60).stdout
    inspected = run(["docker", "inspect", *containers.split()], 60)
    assert inspected.returncode == 0, inspected.stderr
    for container in json.loads(inspected.stdout):
        service = container["Config"]["Labels"]["com.docker.compose.service"]
        if service == "secrets":
            continue
        mounts = [m for m in container["Mounts"] if m.get("Name", "").startswith(f"{project}_secrets")]
        own = [(m["Name"], m["Destination"], m["RW"]) for m in mounts]
        assert own in ([], [(f"{project}_secrets-{service}", "/secrets", False)]), f"{service} mounted {own}"

    cat = ["cat", "/secrets/cluster-secret", "/secrets/operator-token"]
    root = run([*compose, "run", "--rm", "--no-deps", "-T", "secrets", *cat], 120, cwd=ROOT, env=env)
    held = root.stdout.split()  # the cluster secret, the operator's token
    assert root.returncode == 0 and len(held) == 2, root.stderr
    seen = run([*compose, "run", "--rm", "--no-deps", "-T", AGENT, "python", "-c", AGENT_VIEW], 120, cwd=ROOT, env=env)
    assert seen.returncode == 0, seen.stderr
    view = json.loads(seen.stdout.strip().splitlines()[-1])
    assert view["files"] == ["amqp-url", "credential"], f"{AGENT} sees {view['files']} at /secrets"
    assert view["credential"] == ["worker", AGENT] and view["uid"] == 0, view
    leaked = [key for key, value in view["env"].items() if any(secret in value for secret in held)]
    assert not leaked, f"{AGENT}'s environment holds a root secret in {leaked}"
    # What an exec task of that agent (a uid of MEGHA_TASK_UIDS, no group of the agent's) reads of the secrets.
    task = ["--user", "900000005:900000005", AGENT, "sh", "-c", "cat /secrets/* /proc/1/environ; ls -a /secrets"]
    dump = run([*compose, "run", "--rm", "--no-deps", "-T", *task], 120, cwd=ROOT, env=env)
    assert "Permission denied" in dump.stderr, (dump.stdout, dump.stderr)
    assert "megha-credential1" not in dump.stdout and "amqp://" not in dump.stdout, dump.stdout
    assert not any(secret in dump.stdout for secret in held), "a task uid read a root secret"


def test_compose_demo_replays_every_task_exactly_once_and_leaves_nothing_behind(tmp_path: Path) -> None:
    images = build_images()
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the load generator runs as uid 1000
    override = tmp_path / "report-dir.yml"
    # The report in a temporary directory; the demo's 20 jobs replayed 2.5 times faster than the demo does (tasks
    # of 1-17 s arriving over 12 s): what the test checks does not depend on how long the tasks last.
    override.write_text(
        f"services:\n  loadgen:\n    environment:\n      MEGHA_TIME_SCALE: '0.0002'\n    volumes:\n      - {out}:/out\n"
    )
    project = f"megha-test-{uuid.uuid4().hex[:8]}"
    compose = [*compose_command(), "-p", project, "-f", str(ROOT / "docker-compose.yml"), "-f", str(override)]
    env = images.env()

    volumes: list[str] = []
    try:
        up = run([*compose, "up", "--no-color", "--exit-code-from", "loadgen"], UP_TIMEOUT, cwd=ROOT, env=env)
        volumes = _anonymous_volumes(project)
        logs = f"{up.stdout[-15000:]}\n{up.stderr[-5000:]}"
        assert up.returncode == 0, f"`up` ended with {up.returncode}; the services' output:\n{logs}"
        assert "wrote /out/" in up.stdout, f"the load generator wrote no report:\n{logs}"
        # Each agent could give its runs a /proc of their own (x-agent's CAP_SYS_ADMIN), and said so at start-up.
        assert up.stdout.count("seeing only its own processes") == 4, f"an agent's runs see every process:\n{logs}"
        assert "exec tasks can list every process" not in up.stdout, logs

        missing = [name for name in REPORT if not (out / name).is_file()]
        assert not missing, f"the report lacks {missing}; {out} holds {sorted(p.name for p in out.iterdir())}"
        summary = json.loads((out / "summary.json").read_text())
        counts = summary["counts"]
        assert counts["tasks"] > 0 and counts["jobs"] == 20, counts
        assert counts["tasks_completed"] == counts["tasks"], counts
        assert counts["tasks_failed"] == 0 and counts["jobs_rejected"] == 0, counts
        assert summary["not_exactly_once"] == [], summary["not_exactly_once"]
        with (out / "tasks.csv").open() as handle:
            completions = [int(row["completions"]) for row in csv.DictReader(handle)]
        assert len(completions) == counts["tasks"] and set(completions) == {1}, "a task did not finish exactly once"
        _check_each_container_saw_only_its_own_secrets(compose, env, project)
        _check_a_run_reads_no_other_run_s_command_line(compose, env)

        started = run([*compose, "start", "prometheus"], 120, cwd=ROOT, env=env)
        assert started.returncode == 0, started.stderr
        wait_until(
            _ready, 60, lambda: run([*compose, "logs", "--tail", "20", "prometheus"], 60, cwd=ROOT, env=env).stdout
        )
        _check_prometheus_saw_the_run(counts["tasks"])
    except BaseException:
        print(run([*compose, "logs", "--no-color", "--tail", "200"], 120, cwd=ROOT, env=env).stdout)
        raise
    finally:
        down = run([*compose, "down", "-v", "--remove-orphans", "--timeout", "10"], 180, cwd=ROOT, env=env)

    assert down.returncode == 0, down.stderr
    left = {kind: names for kind, names in project_resources(project).items() if names}
    assert not left, f"`down -v` left {left}"
    listed = set(run(["docker", "volume", "ls", "--format", "{{.Name}}"], 60).stdout.split())
    assert not listed & set(volumes), f"`down -v` left the anonymous volumes {sorted(listed & set(volumes))}"
