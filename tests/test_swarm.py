"""Megha on Docker Swarm: deploy/swarm/stack.yml checked as `docker stack config` reads it, and the stack deployed on
a single-node swarm with the secrets deploy/swarm/with-secrets.sh makes, agents scaled with `docker service scale`,
replayed to the end.

The deployment test runs `docker swarm init` (listening on 127.0.0.1 only) when the engine is in no swarm and
`docker swarm leave --force` at the end; a swarm this machine already manages alone is reused, any other swarm
skips the test. Stack, secrets, volumes, node labels and the bridge network the swarm adds are removed again.
"""

from __future__ import annotations

import atexit
import csv
import fcntl
import functools
import json
import os
import re
import shutil
import socket
import tempfile
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
from deploykit import MODELS, ROLE_OF, check_secrets, module_of, settings_in

from megha.common.settings import (
    SECRET_SETTINGS,
    GMSettings,
    LMSettings,
    LoadgenSettings,
    ServiceSettings,
    WorkerSettings,
)
from megha.deploy.secrets import main as make_secrets_main

from dockerkit import ROOT, Images, build_images, run
from servicekit import wait_until

SWARM = ROOT / "deploy" / "swarm"
STACK_FILE = SWARM / "stack.yml"
MAKE_SECRETS = SWARM / "with-secrets.sh"
SECRETS_DIR = "/run/secrets/"
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


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = {k: "" if v is None else str(v) for k, v in (service.get("environment") or {}).items()}
    for template, value in TEMPLATES.items():
        env = {k: v.replace(template, value) for k, v in env.items()}
    return env


AGENT_SLOTS = 2
"""Agents per LM with-secrets.sh makes credentials for by default (MEGHA_AGENTS_PER_LM, as in the stack)."""


@functools.cache
def _made_secrets() -> Path:
    """The generator's files, as with-secrets.sh makes them for the stack's default run id: a folder per service of
    the stack, an agent's per task slot (worker-<lm>-<slot>)."""
    folder = Path(tempfile.mkdtemp(prefix="megha-swarm-secrets-"))
    atexit.register(shutil.rmtree, folder, True)
    agents = [f"worker-{lm}-{slot}" for lm in (0, 1) for slot in range(1, AGENT_SLOTS + 1)]
    services = ",".join(["gm-0", "gm-1", "lm-0", "lm-1", *agents, "loadgen", "rabbitmq"])
    argv = [str(folder), "--run-id", "swarm", "--broker", "amqp://rabbitmq:5672/", "--services", services]
    assert make_secrets_main(argv) == 0
    return folder


@functools.cache
def _secret_files() -> dict[str, Path]:
    """The stack's secret (its key, as its external name <prefix>-<service>-<file> names it) -> the generator's file
    behind it as a task of slot 1 sees it: an agent service's secrets are templates over its agents' files."""
    found = {}
    for folder in (p for p in _made_secrets().iterdir() if p.is_dir()):
        service = folder.name
        if agent := re.fullmatch(r"(worker-\d+)-(\d+)", service):
            if agent[2] != TEMPLATES["{{.Task.Slot}}"]:
                continue
            service = agent[1]
        for path in folder.iterdir():
            found[f"{service}-{path.name.removesuffix('.json')}".replace("-", "_")] = path
    return found


def _secret_file(source: str) -> Path:
    """The generator's file behind the stack's secret `source`."""
    assert source in _secret_files(), f"the generator makes no file for the secret {source}"
    return _secret_files()[source]


def _settings(service: dict[str, Any]) -> ServiceSettings:
    """The service's settings as a task of slot 1 builds them, its secrets in /run/secrets."""
    env = _environment(service)
    granted = {s["target"]: s["source"] for s in service.get("secrets", [])}
    for key, value in env.items():
        if key.endswith("_FILE") and value.startswith(SECRETS_DIR):
            target = value.removeprefix(SECRETS_DIR)
            assert target in granted, f"{key}={value}: no secret {target} is granted"
            env[key] = str(_secret_file(granted[target]))
    return settings_in(MODELS[module_of(service) or ""], env)


def _megha(stack: dict[str, Any]) -> dict[str, ServiceSettings]:
    return {name: _settings(svc) for name, svc in stack["services"].items() if module_of(svc) in MODELS}


def _of(stack: dict[str, Any], model: type[ServiceSettings]) -> dict[str, Any]:
    return {name: s for name, s in _megha(stack).items() if type(s) is model}


@STACK_TESTS
def test_every_megha_service_runs_a_known_module_with_valid_settings(stack: dict[str, Any]) -> None:
    services = stack["services"]
    assert set(services) - {"rabbitmq"} == {name for name, svc in services.items() if module_of(svc) in MODELS}
    megha = _megha(stack)
    assert {type(s) for s in megha.values()} == set(MODELS.values()), "the stack should run every role"
    for name, svc in services.items():
        if name == "rabbitmq":
            continue
        model = MODELS[module_of(svc) or ""]
        fields = {f"MEGHA_{f}".upper() for f in model.model_fields}
        fields |= {f"MEGHA_{f}_FILE".upper() for f in SECRET_SETTINGS if f in model.model_fields}
        unknown = sorted(set(_environment(svc)) - fields)
        assert not unknown, f"{name}: {unknown} are not settings of {module_of(svc)}"


@STACK_TESTS
def test_each_service_is_granted_its_own_secrets_only(stack: dict[str, Any]) -> None:
    """A GM or LM its own credential, the users' tokens as digests and its role's broker user; an agent its own
    credential (a template: each task slot its own agent's) and its broker user, readable by root, which it runs
    as; the load generator the operator's token; RabbitMQ its definitions. No secret holds the cluster secret, and
    no two services share one."""
    assert "guest" not in json.dumps(stack), "no guest account"
    expected_files = {
        "gm": {"credential", "api_tokens", "amqp_url"},
        "lm": {"credential", "api_tokens", "amqp_url"},
        "worker": {"credential", "amqp_url"},
        "loadgen": {"operator_token", "amqp_url"},
    }
    granted_to: dict[str, list[str]] = {}
    for name, s in _megha(stack).items():
        svc = stack["services"][name]
        role = ROLE_OF[type(s)]
        granted = {x["target"]: x["source"] for x in svc["secrets"]}
        for source in granted.values():
            granted_to.setdefault(source, []).append(name)
        assert set(granted) == expected_files[role], f"{name}: secrets {granted}"
        own = name.replace("-", "_")
        assert all(source == f"{own}_{target}" for target, source in granted.items()), f"{name}: {granted}"
        uid = "0" if role == "worker" else "1000"
        assert svc.get("user") == ("0:0" if role == "worker" else None), f"{name}: runs as {svc.get('user')}"
        assert all(x["uid"] == uid and x["mode"] == 0o400 for x in svc["secrets"]), f"{name}: readable by others"
        env = _environment(svc)
        assert not {f"MEGHA_{x}".upper() for x in SECRET_SETTINGS} & set(env), f"{name}: a secret in its environment"
        check_secrets(name, s)
        assert urlsplit(s.amqp_url).hostname == "rabbitmq", f"{name}: {s.amqp_url}"
    broker = stack["services"]["rabbitmq"]
    assert [x["source"] for x in broker["secrets"]] == ["rabbitmq_definitions"]
    erl_args = broker["environment"]["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]
    assert '-rabbit load_definitions "/run/secrets/rabbitmq_definitions"' in erl_args, erl_args
    shared = {source: names for source, names in granted_to.items() if len(names) > 1}
    assert not shared, f"secrets granted to more than one service: {shared}"
    cluster_secret = (_made_secrets() / "cluster-secret").read_text().strip()
    for key, secret in stack["secrets"].items():
        assert secret.get("external"), "the secrets are created with docker secret create, not kept in a file"
        assert secret["name"] == f"megha-{key.replace('_', '-')}", secret
        assert cluster_secret not in _secret_file(key).read_text(), f"{key} holds the cluster secret"


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
def test_the_agents_alone_hold_cap_sys_admin(stack: dict[str, Any]) -> None:
    """Each run of an agent gets a /proc of its own, which takes CAP_SYS_ADMIN (docs/security.md, "A worker
    agent's container"); no other service holds an added capability."""
    for name, svc in stack["services"].items():
        expected = {"SYS_ADMIN"} if module_of(svc) == "megha.services.worker" else set()
        assert set(svc.get("cap_add", [])) == expected, f"{name}: cap_add {svc.get('cap_add')}"


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
    refuses to remove it ("has active endpoints") until dockerd restarts, which this test must not do, so asking
    again is no use. The network is empty and harmless (the next swarm uses it), so that is a warning, not a
    failure."""
    settled = time.monotonic() + 10  # the stack's containers are gone (`_tear_down`): let their endpoints follow
    while _gwbridge_endpoints() and time.monotonic() < settled:
        time.sleep(0.5)
    _docker("swarm", "leave", "--force", check=False)
    if not remove_gwbridge:
        return
    deadline = time.monotonic() + 30
    while (result := run(["docker", "network", "rm", GWBRIDGE], 60)).returncode != 0:
        if "active endpoints" in result.stderr or time.monotonic() > deadline:
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


def _get(url: str, headers: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The JSON a service answers, or None while it does not answer (200)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2) as response:
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
    # The swarm removes the containers, then the network, in the background; volumes only go when asked. On a
    # loaded machine Docker 20.10 has kept the network for minutes after the last container went (CI, under load):
    # once the containers are gone it is removed as the operator would (docs/deploy.md, "Tear down").
    wait_until(
        lambda: not {"services", "containers"} & set(_stack_resources(stack)),
        120,
        lambda: _stack_resources(stack),
        every=1.0,
    )

    def networks_gone() -> bool:
        networks = _stack_resources(stack).get("networks", [])
        if networks:
            _docker("network", "rm", *networks, check=False)
        return not networks

    wait_until(networks_gone, 60, lambda: _stack_resources(stack), every=2.0)
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


AGENT_SECRETS = """
import json, os, socket
from megha.common.auth import Credential
with open("/run/secrets/credential") as handle:
    credential = Credential.decode(handle.read())
files = sorted(os.listdir("/run/secrets"))
print(json.dumps({"files": files, "credential": [credential.role, credential.ident], "host": socket.gethostname()}))
"""
"""Run in an agent's container: the secrets it sees, and whose credential it holds."""


def _check_each_agent_holds_its_own_credential(stack: str) -> None:
    """Every agent task, given its service's one credential secret (a template), reads its own agent's credential,
    and no secret but its own and its broker user."""
    for lm in (0, 1):
        service = f"{stack}_worker-{lm}"
        containers = _docker("ps", "-q", "--filter", f"label=com.docker.swarm.service.name={service}").split()
        assert len(containers) == 2, f"{service}: containers {containers}"
        for container in containers:
            seen = json.loads(_docker("exec", container, "python", "-c", AGENT_SECRETS))
            assert seen["files"] == ["amqp_url", "credential"], seen
            assert seen["credential"] == ["worker", seen["host"]], f"{service}: another agent's credential: {seen}"


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
    token_file = tmp_path / f"{stack}-operator-token"
    env["MEGHA_KEEP_DIR"] = str(tmp_path)
    try:
        files = ("-c", str(STACK_FILE), "-c", str(override))
        made = run(
            [str(MAKE_SECRETS), "docker", "stack", "deploy", "--resolve-image", "never", *files, stack], 300, env=env
        )
        assert made.returncode == 0, made.stderr
        assert f"made the secrets {stack}-*" in made.stderr and token_file.stat().st_mode & 0o077 == 0, made.stderr
        again = run([str(MAKE_SECRETS)], 120, env=env)
        assert again.returncode == 0 and "exist; kept" in again.stderr, again.stderr
        operator = {"Authorization": f"Bearer {token_file.read_text().strip()}"}

        def states() -> list[dict[str, Any] | None]:
            return [_get(url, operator) for url in lm_state]

        wait_until(lambda: all(s and s["registered_nodes"] == 1 for s in states()), DEPLOY_TIMEOUT, states, 1.0)
        assert not any(s and s["ready"] for s in states()), "an LM is ready with 1 of its 2 nodes"
        _check_bridge_networks_work(f"{stack}-bridge", images.megha)

        _docker("service", "scale", "--detach", f"{stack}_worker-0=2", f"{stack}_worker-1=2")
        wait_until(lambda: all(_get(url) for url in gm_health), DEPLOY_TIMEOUT, lambda: [states(), gm_health], 1.0)
        for lm, state in enumerate(states()):
            assert state is not None and state["ready"], state
            assert set(state["heartbeats"]) <= {f"worker-{lm}-1", f"worker-{lm}-2"}, state["heartbeats"]
            assert state["workers"] == 2, state
        _check_each_agent_holds_its_own_credential(stack)

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
