"""Megha on Docker Swarm: deploy/swarm/stack.yml checked as `docker stack config` reads it, its secrets wrapper,
and the stack deployed on a single-node swarm, agents scaled with `docker service scale`, replayed to the end.

The deployment test runs `docker swarm init` (listening on 127.0.0.1 only) when the engine is in no swarm and
`docker swarm leave --force` at the end; a swarm this machine already manages alone is reused, any other swarm
skips the test. Stack, secrets, volumes, node labels and the bridge network the swarm adds are removed again.
"""

from __future__ import annotations

import csv
import fcntl
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from megha.common.settings import GMSettings, LMSettings, LoadgenSettings, ServiceSettings, WorkerSettings

from dockerkit import ROOT, Images, build_images, run
from servicekit import wait_until

SWARM = ROOT / "deploy" / "swarm"
STACK_FILE = SWARM / "stack.yml"
WRAPPER = SWARM / "with-secrets.sh"
MODELS: dict[str, type[ServiceSettings]] = {
    "megha.services.gm": GMSettings,
    "megha.services.lm": LMSettings,
    "megha.services.worker": WorkerSettings,
    "megha.loadgen.services": LoadgenSettings,
}
ROLES = ("broker", "gm", "lm", "worker", "loadgen")
"""Node labels megha.<role>=true that place the services."""
TEMPLATES = {"{{.Task.Slot}}": "1"}
"""Swarm templates in the stack's environment -> what a task of slot 1 sees."""
GWBRIDGE = "docker_gwbridge"
"""The bridge network `docker swarm init` adds (and `docker swarm leave` keeps)."""
SWARM_LOCK = Path("/tmp/megha-swarm-test.lock")
"""Held while a test owns the swarm, so two runs (of any checkout) do not init and leave it under each other."""

DEPLOY_TIMEOUT = 240.0
"""Seconds from `docker stack deploy` until both GMs answer: the broker starts in about 20 s."""
REPLAY_TIMEOUT = 240.0
"""Seconds for the load generator's task: 8 jobs arriving over 8 s with tasks of up to 17 s."""


# ------------------------------------------------------------------------------------------------ the stack file


STACK_TESTS = pytest.mark.docker  # `docker stack config` needs the docker command (MEGHA_SKIP_DOCKER=1 skips)


def stack_config(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The stack as `docker stack config` merges and interpolates it (no engine needed), with `env` set."""
    if shutil.which("docker") is None:
        pytest.fail("the docker command is not installed: `docker stack config` reads the stack")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEGHA_")}
    result = run(["docker", "stack", "config", "-c", str(STACK_FILE)], 60, env={**clean, **(env or {})})
    if result.returncode != 0 and "unknown command" in result.stderr:
        pytest.fail(f"this docker client has no `docker stack config`: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


@pytest.fixture(scope="module")
def stack() -> dict[str, Any]:
    return stack_config()


def _module(service: dict[str, Any]) -> str | None:
    argv = service.get("command") or []
    return argv[2] if argv[:2] == ["python", "-m"] and len(argv) > 2 else None


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = {k: "" if v is None else str(v) for k, v in (service.get("environment") or {}).items()}
    for template, value in TEMPLATES.items():
        env = {k: v.replace(template, value) for k, v in env.items()}
    return env


def _settings(service: dict[str, Any]) -> ServiceSettings:
    """The service's settings as a task of slot 1 builds them (the secrets wrapper puts a user into the URL)."""
    model = MODELS[_module(service) or ""]
    env = _environment(service)
    env["MEGHA_AMQP_URL"] = env["MEGHA_AMQP_URL"].replace("://", "://user:password@", 1)
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.upper().startswith("MEGHA_")]:
            mp.delenv(key)
        for key, value in env.items():
            mp.setenv(key, value)
        return model()


def _megha(stack: dict[str, Any]) -> dict[str, ServiceSettings]:
    return {name: _settings(svc) for name, svc in stack["services"].items() if _module(svc) in MODELS}


def _of(stack: dict[str, Any], model: type[ServiceSettings]) -> dict[str, Any]:
    return {name: s for name, s in _megha(stack).items() if type(s) is model}


@STACK_TESTS
def test_every_megha_service_runs_a_known_module_with_valid_settings(stack: dict[str, Any]) -> None:
    services = stack["services"]
    assert set(services) - {"rabbitmq"} == {name for name, svc in services.items() if _module(svc) in MODELS}
    megha = _megha(stack)
    assert {type(s) for s in megha.values()} == set(MODELS.values()), "the stack should run every role"
    for name, svc in services.items():
        if name == "rabbitmq":
            continue
        fields = {f"MEGHA_{f}".upper() for f in MODELS[_module(svc) or ""].model_fields}
        unknown = sorted(set(_environment(svc)) - fields)
        assert not unknown, f"{name}: {unknown} are not settings of {_module(svc)}"


@STACK_TESTS
def test_the_broker_user_comes_from_secrets_and_is_not_guest(stack: dict[str, Any]) -> None:
    assert "guest" not in json.dumps(stack), "no guest account"
    for name, svc in stack["services"].items():
        granted = {s["source"] for s in svc.get("secrets", [])}
        assert granted == {"amqp_user", "amqp_password"}, f"{name}: secrets {granted}"
        assert svc["entrypoint"][0] == "megha-with-secrets", f"{name}: the wrapper must start the entrypoint"
        assert {c["target"] for c in svc["configs"]} == {"/usr/local/bin/megha-with-secrets"}, name
    for name, s in _megha(stack).items():
        url = urlsplit(_environment(stack["services"][name])["MEGHA_AMQP_URL"])
        assert url.username is None, f"{name}: MEGHA_AMQP_URL names a user; the secrets give it"
        assert url.hostname == "rabbitmq", f"{name}: MEGHA_AMQP_URL host {url.hostname}"
        assert s.amqp_url.startswith("amqp://user:password@rabbitmq:")
    for secret in stack["secrets"].values():
        assert secret.get("external"), "the secrets are created with docker secret create, not kept in a file"


@STACK_TESTS
def test_every_service_is_placed_by_a_role_label_and_restarts(stack: dict[str, Any]) -> None:
    for name, svc in stack["services"].items():
        deploy = svc.get("deploy", {})
        constraints = deploy.get("placement", {}).get("constraints", [])
        roles = [m.group(1) for c in constraints if (m := re.fullmatch(r"node\.labels\.megha\.(\w+) == true", c))]
        assert roles and set(roles) <= set(ROLES), f"{name}: placement constraints {constraints}"
        policy = deploy.get("restart_policy", {})
        expected = "none" if name == "loadgen" else "on-failure"
        assert policy.get("condition") == expected, f"{name}: restart policy {policy}"


@STACK_TESTS
def test_servers_bind_all_interfaces_and_published_ports_reach_them(stack: dict[str, Any]) -> None:
    for name, s in _megha(stack).items():
        if isinstance(s, LoadgenSettings):
            continue
        assert s.host == "0.0.0.0", f"{name}: MEGHA_HOST"
        for port in stack["services"][name].get("ports", []):
            assert port["target"] == s.port, f"{name}: publishes {port}, serves on {s.port}"


@STACK_TESTS
def test_nothing_needs_ipvs(stack: dict[str, Any]) -> None:
    """Virtual IPs and the routing mesh need IPVS in the kernel (this project's VM has none): DNS round robin and
    ports published on the node that runs the task do not."""
    for name, svc in stack["services"].items():
        assert svc["deploy"].get("endpoint_mode") == "dnsrr", f"{name}: endpoint_mode"
        for port in svc.get("ports", []):
            assert port["mode"] == "host", f"{name}: publishes {port} through the routing mesh"


@STACK_TESTS
def test_lms_gms_and_agents_find_each_other(stack: dict[str, Any]) -> None:
    lms = sorted(_of(stack, LMSettings).items(), key=lambda item: item[1].lm_id)
    gms = sorted(_of(stack, GMSettings).items(), key=lambda item: item[1].gm_id)
    assert [lm.lm_id for _, lm in lms] == list(range(len(lms)))
    assert [gm.gm_id for _, gm in gms] == list(range(len(gms)))
    lm_urls = [f"http://{name}:{lm.port}" for name, lm in lms]
    for name, lm in lms:
        assert lm.url() == f"http://{name}:{lm.port}", f"{name}: MEGHA_PUBLIC_URL"
        assert lm.num_gms == len(gms), f"{name}: MEGHA_NUM_GMS"
    gm_urls = [f"http://{name}:{gm.port}" for name, gm in gms]
    for name, gm in gms:
        assert gm.lm_urls == lm_urls, f"{name}: MEGHA_LM_URLS"
        assert gm.gm_urls == gm_urls, f"{name}: MEGHA_GM_URLS (its peers, as in docker-compose.yml)"
    for _, lg in _of(stack, LoadgenSettings).items():
        assert lg.gm_urls == gm_urls, "MEGHA_GM_URLS"
    workers = _of(stack, WorkerSettings)
    for name, w in workers.items():
        svc = stack["services"][name]
        env = svc["environment"]
        # Named after the task slot, a replacement agent keeps its name and address (its host name, in DNS).
        assert "{{.Task.Slot}}" in env["MEGHA_WORKER_ID"], f"{name}: replicas need distinct MEGHA_WORKER_IDs"
        assert svc["hostname"] == env["MEGHA_WORKER_ID"], f"{name}: the host name is the agent's name"
        assert env["MEGHA_PUBLIC_URL"] == f"http://{svc['hostname']}:{w.port}", f"{name}: MEGHA_PUBLIC_URL"
        assert w.lm_url in lm_urls, f"{name}: MEGHA_LM_URL {w.lm_url} is no LM"
        lm = dict(lms)[urlsplit(w.lm_url).hostname]
        assert lm.expected_nodes == svc["deploy"]["replicas"] * w.nodes, f"{name}: replicas x nodes != LM's nodes"
    ids = [s.worker_id for s in workers.values()]
    assert len(set(ids)) == len(ids), f"agents of different LMs share names: {ids}"
    assert len({s.run_id for s in _megha(stack).values()}) == 1, "one MEGHA_RUN_ID"


@STACK_TESTS
def test_the_agent_count_follows_one_variable() -> None:
    stack = stack_config({"MEGHA_AGENTS_PER_LM": "5"})
    for name, s in _of(stack, LMSettings).items():
        assert s.expected_nodes == 5, name
    for name in _of(stack, WorkerSettings):
        assert stack["services"][name]["deploy"]["replicas"] == 5, name


@STACK_TESTS
def test_the_load_generator_waits_to_be_scaled_and_writes_to_a_bind_mount(stack: dict[str, Any]) -> None:
    for name, lg in _of(stack, LoadgenSettings).items():
        svc = stack["services"][name]
        assert svc["deploy"]["replicas"] == 0, "the replay starts with docker service scale, once the GMs are up"
        mounts = {v["target"]: v for v in svc.get("volumes", [])}
        assert lg.out in mounts and mounts[lg.out]["type"] == "bind", f"MEGHA_OUT={lg.out} is no bind mount"


# ------------------------------------------------------------------------------------------------ the wrapper


def _wrapper(tmp_path: Path, user: str, password: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the wrapper with these secrets; the command it runs prints the variables it was given."""
    (tmp_path / "amqp_user").write_text(f"{user}\n")
    (tmp_path / "amqp_password").write_text(f"{password}\n")
    base = {"PATH": os.environ["PATH"], "SECRETS_DIR": str(tmp_path)}
    show = 'printf "%s|%s|%s" "${MEGHA_AMQP_URL:-}" "${RABBITMQ_DEFAULT_USER:-}" "${RABBITMQ_DEFAULT_PASS:-}"'
    return run(["sh", str(WRAPPER), "sh", "-c", show], 30, env={**base, **env})


def test_wrapper_puts_the_secrets_into_a_megha_services_url(tmp_path: Path) -> None:
    result = _wrapper(tmp_path, "megha", "0a1b-2c", MEGHA_AMQP_URL="amqp://rabbitmq:5672/")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "amqp://megha:0a1b-2c@rabbitmq:5672/||"


def test_wrapper_gives_the_broker_its_user(tmp_path: Path) -> None:
    result = _wrapper(tmp_path, "megha", "0a1b2c")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "|megha|0a1b2c"


@pytest.mark.parametrize(
    ("user", "password", "url", "reason"),
    [
        ("guest", "0a1b2c", "", "may not be guest"),
        ("megha", "p@ss/word", "", "holds characters other than"),
        ("megha", "", "", "is empty"),
        ("megha", "0a1b2c", "amqp://other:pw@rabbitmq:5672/", "names a user already"),
        ("megha", "0a1b2c", "http://rabbitmq:5672/", "is not an amqp://"),
    ],
)
def test_wrapper_refuses(tmp_path: Path, user: str, password: str, url: str, reason: str) -> None:
    result = _wrapper(tmp_path, user, password, **({"MEGHA_AMQP_URL": url} if url else {}))
    assert result.returncode == 2 and reason in result.stderr, (result.returncode, result.stderr)
    assert result.stdout == "", "the command must not run"


def test_wrapper_names_a_missing_secret(tmp_path: Path) -> None:
    base = {"PATH": os.environ["PATH"], "SECRETS_DIR": str(tmp_path)}
    result = run(["sh", str(WRAPPER), "true"], 30, env=base)
    assert result.returncode == 2 and "no secret amqp_user" in result.stderr, result.stderr


# ------------------------------------------------------------------------------------------------ on a swarm


def _docker(*argv: str, timeout: float = 120.0, check: bool = True, **kwargs: Any) -> str:
    result = run(["docker", *argv], timeout, **kwargs)
    if check:
        assert result.returncode == 0, f"docker {' '.join(argv)}: {result.stderr.strip() or result.stdout}"
    return result.stdout


def _swarm_info() -> dict[str, Any]:
    return json.loads(_docker("info", "--format", "{{json .Swarm}}"))


@pytest.fixture
def swarm() -> Iterator[str]:
    """The node of a single-node swarm, labelled with every role: made here (and left at the end) when the engine
    is in no swarm, else the engine's own swarm when this node manages it alone; other swarms skip the test."""
    SWARM_LOCK.touch(mode=0o666, exist_ok=True)
    with SWARM_LOCK.open() as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = _swarm_info()
        state = info["LocalNodeState"]
        made = state == "inactive"
        if not made and not (state == "active" and info["ControlAvailable"] and info["Nodes"] == 1):
            pytest.skip(
                f"the engine is in a swarm this test should not deploy on (state {state}, manager "
                f"{info['ControlAvailable']}, {info.get('Nodes')} nodes): it needs none, or one of this node alone"
            )
        had_gwbridge = GWBRIDGE in _docker("network", "ls", "--format", "{{.Name}}").split()
        if made:
            # Listening on the loopback only: nothing outside this machine can join or reach the manager.
            _docker("swarm", "init", "--advertise-addr", "127.0.0.1", "--listen-addr", "127.0.0.1:2377")
        node = _swarm_info()["NodeID"]
        had = json.loads(_docker("node", "inspect", "--format", "{{json .Spec.Labels}}", node)) or {}
        before = {f"megha.{role}": had.get(f"megha.{role}") for role in ROLES if had.get(f"megha.{role}") != "true"}
        try:
            if before:
                _docker("node", "update", *(a for label in before for a in ("--label-add", f"{label}=true")), node)
            yield node
        finally:
            if made:
                _leave(remove_gwbridge=not had_gwbridge)
            elif before:
                restore = [
                    a
                    for label, value in before.items()
                    for a in (("--label-rm", label) if value is None else ("--label-add", f"{label}={value}"))
                ]
                _docker("node", "update", *restore, node, check=False)


def _gwbridge_endpoints() -> int | None:
    result = run(["docker", "network", "inspect", "--format", "{{len .Containers}}", GWBRIDGE], 60)
    return int(result.stdout) if result.returncode == 0 else None


def _leave(remove_gwbridge: bool) -> None:
    """Leave the swarm this test made, and remove the bridge from its containers to the outside (docker_gwbridge),
    which outlives it. Docker 20.10 sometimes loses count of that network's endpoints as a swarm goes: it then
    refuses to remove it ("has active endpoints") until dockerd restarts, which this test must not do. The network
    is empty and harmless (the next swarm uses it), so that is a warning, not a failure."""
    settled = time.monotonic() + 30  # the containers of the stack have just gone: let their endpoints follow
    while _gwbridge_endpoints() and time.monotonic() < settled:
        time.sleep(0.5)
    _docker("swarm", "leave", "--force", check=False)
    if not remove_gwbridge:
        return
    deadline = time.monotonic() + 30
    while (result := run(["docker", "network", "rm", GWBRIDGE], 60)).returncode != 0:
        if time.monotonic() > deadline:
            warnings.warn(f"{GWBRIDGE} stays behind: {result.stderr.strip()}", stacklevel=1)
            return
        time.sleep(1)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("", 0))  # a published port is bound on every interface
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _get(url: str) -> dict[str, Any] | None:
    """The JSON a service answers, or None while it does not answer (200)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return json.loads(response.read()) if response.status == 200 else None
    except (OSError, ValueError):
        return None


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _check_bridge_networks_work(name: str, image: str) -> None:
    """Beside the swarm, a user-defined bridge network (what Compose makes) still works: a container reaches another
    by name, and the port it publishes on 127.0.0.1 answers."""
    port = _free_ports(1)[0]
    server = f"{name}-server"
    reach = (
        "import time, urllib.request\n"
        "for _ in range(60):\n"
        "    try:\n"
        f"        urllib.request.urlopen('http://{server}:8000/', timeout=2); break\n"
        "    except OSError:\n"
        "        time.sleep(0.5)\n"
        "else:\n"
        "    raise SystemExit('unreachable')\n"
    )
    _docker("network", "create", name)
    try:
        published = ("-p", f"127.0.0.1:{port}:8000")
        _docker("run", "-d", "--name", server, "--network", name, *published, image, "python", "-m", "http.server")
        client = run(["docker", "run", "--rm", "--network", name, image, "python", "-c", reach], 120)
        assert client.returncode == 0, f"on a bridge network beside the swarm, {server} is unreachable: {client.stderr}"
        wait_until(lambda: _answers(f"http://127.0.0.1:{port}/"), 30, lambda: f"127.0.0.1:{port}", 0.5)
    finally:
        _docker("rm", "--force", server, check=False)
        _docker("network", "rm", name, check=False)


def _tasks(service: str) -> list[dict[str, Any]]:
    ids = _docker("service", "ps", "-q", "--no-trunc", service).split()
    return [json.loads(line) for line in _docker("inspect", "--format", "{{json .}}", *ids).splitlines()] if ids else []


def _stack_resources(stack: str) -> dict[str, list[str]]:
    """What of the stack is still there: services, containers, networks, volumes, secrets and configs."""
    label = f"label=com.docker.stack.namespace={stack}"
    found = {
        kind: _docker(*argv, "--filter", label, "--format", "{{.Name}}").split()
        for kind, argv in {
            "services": ("service", "ls"),
            "networks": ("network", "ls"),
            "configs": ("config", "ls"),
        }.items()
    }
    found["containers"] = _docker("ps", "-a", "--filter", label, "--format", "{{.Names}}").split()
    found["secrets"] = [s for s in _docker("secret", "ls", "--format", "{{.Name}}").split() if s.startswith(stack)]
    found["volumes"] = [v for v in _docker("volume", "ls", "--format", "{{.Name}}").split() if v.startswith(stack)]
    return {kind: names for kind, names in found.items() if names}


def _tear_down(stack: str) -> None:
    _docker("stack", "rm", stack, check=False)
    # The swarm removes the containers (and then the network) in the background; volumes only go when asked.
    wait_until(
        lambda: not {"services", "containers", "networks"} & set(_stack_resources(stack)),
        120,
        lambda: _stack_resources(stack),
        every=1.0,
    )
    left = _stack_resources(stack)
    if left.get("volumes"):
        _docker("volume", "rm", *left["volumes"], check=False)
    if left.get("secrets"):
        _docker("secret", "rm", *left["secrets"], check=False)


def _diagnostics(stack: str) -> str:
    """Every task of the stack, and the last lines of every service's log."""
    lines = [_docker("stack", "ps", "--no-trunc", stack, check=False)]
    for service in _docker("stack", "services", "--format", "{{.Name}}", stack, check=False).split():
        logs = run(["docker", "service", "logs", "--no-task-ids", "--tail", "60", service], 60)
        lines.append(f"--- {service}\n{logs.stdout[-6000:]}{logs.stderr[-3000:]}")
    return "\n".join(lines)


@pytest.fixture
def images() -> Images:
    """Built before the swarm is made: a build that fails leaves the engine alone."""
    return build_images()


@pytest.mark.docker
def test_swarm_stack_replays_a_trace_and_leaves_nothing_behind(images: Images, swarm: str, tmp_path: Path) -> None:
    stack = f"megha-test-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the load generator runs as uid 1000
    # Deployed with one agent per LM: the LMs wait for their second node until the agents are scaled.
    override = tmp_path / "one-agent-each.yml"
    override.write_text(
        'version: "3.8"\nservices:\n' + "".join(f"  worker-{lm}:\n    deploy:\n      replicas: 1\n" for lm in (0, 1))
    )
    ports = dict(zip(("GM0", "GM1", "LM0", "LM1", "RABBITMQ_UI"), _free_ports(5)))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEGHA_")},  # the stack's defaults, but:
        "MEGHA_IMAGE": images.megha,
        "MEGHA_RABBITMQ_IMAGE": images.rabbitmq,
        **{f"MEGHA_{name}_PORT": str(port) for name, port in ports.items()},
        "MEGHA_SECRETS": stack,
        "MEGHA_RUN_ID": stack,
        "MEGHA_REPORT_DIR": str(out),
        "MEGHA_AGENTS_PER_LM": "2",
        "MEGHA_FIRST_JOBS": "8",
        "MEGHA_TIME_SCALE": "0.0002",  # 8 jobs (76 tasks) arrive over 8 s and run for up to 17 s
    }
    lm_state = [f"http://127.0.0.1:{ports[f'LM{lm}']}/v1/state" for lm in (0, 1)]
    gm_health = [f"http://127.0.0.1:{ports[f'GM{gm}']}/healthz" for gm in (0, 1)]
    started = time.monotonic()
    try:
        for name, value in (("user", "megha"), ("password", secrets.token_hex(24))):
            (tmp_path / name).write_text(f"{value}\n")
            _docker("secret", "create", f"{stack}-amqp-{name}", str(tmp_path / name))
            (tmp_path / name).unlink()
        files = ("-c", str(STACK_FILE), "-c", str(override))
        _docker("stack", "deploy", "--resolve-image", "never", *files, stack, env=env)

        def states() -> list[dict[str, Any] | None]:
            return [_get(url) for url in lm_state]

        wait_until(lambda: all(s and s["registered_nodes"] == 1 for s in states()), DEPLOY_TIMEOUT, states, 1.0)
        assert not any(s and s["ready"] for s in states()), "an LM is ready with 1 of its 2 nodes"
        _check_bridge_networks_work(f"{stack}-bridge", images.megha)

        _docker("service", "scale", "--detach", f"{stack}_worker-0=2", f"{stack}_worker-1=2")
        wait_until(lambda: all(_get(url) for url in gm_health), DEPLOY_TIMEOUT, lambda: [states(), gm_health], 1.0)
        for lm, state in enumerate(states()):
            assert state is not None and state["ready"], state
            assert set(state["heartbeats"]) <= {f"worker-{lm}-1", f"worker-{lm}-2"}, state["heartbeats"]
            assert state["workers"] == 2, state

        _docker("service", "scale", "--detach", f"{stack}_loadgen=1")
        loadgen = f"{stack}_loadgen"

        def ended() -> bool:
            return any(t["Status"]["State"] in ("complete", "failed", "rejected") for t in _tasks(loadgen))

        wait_until(ended, REPLAY_TIMEOUT, lambda: [t["Status"] for t in _tasks(loadgen)], 1.0)
        (task,) = _tasks(loadgen)
        logs = run(["docker", "service", "logs", "--raw", loadgen], 60).stdout
        assert task["Status"]["State"] == "complete", f"the load generator: {task['Status']}\n{logs[-6000:]}"
        assert "wrote /out/" in logs, f"the load generator wrote no report:\n{logs[-6000:]}"

        summary = json.loads((out / "summary.json").read_text())
        counts = summary["counts"]
        assert counts["jobs"] == 8 and counts["tasks"] > 0, counts
        assert counts["tasks_completed"] == counts["tasks"], counts
        assert counts["tasks_failed"] == 0 and counts["jobs_rejected"] == 0, counts
        assert summary["not_exactly_once"] == [], summary["not_exactly_once"]
        with (out / "tasks.csv").open() as handle:
            rows = list(csv.DictReader(handle))
        assert {int(row["completions"]) for row in rows} == {1}, "a task did not finish exactly once"
        assert {int(row["lm"]) for row in rows} == {0, 1}, "both LMs' agents should have run tasks"
        print(f"deployed, scaled and replayed in {time.monotonic() - started:.0f} s")
    except BaseException:
        print(_diagnostics(stack))
        raise
    finally:
        _tear_down(stack)

    left = _stack_resources(stack)
    assert not left, f"the stack left {left}"
