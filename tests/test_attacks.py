"""Attacks of a hostile user through the public interfaces, against a real deployment (separate processes, the real
RabbitMQ, authentication on, an agent offering `exec` as shipped): a task that dumps every environment and every
file it can find holds no secret, and whatever it can read cannot be turned into a token that acts as a GM, an LM
or another agent. docs/security.md, "Threat model", lists what each principal holds and reaches; the other attack
tests are named there."""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from megha.common.auth import Credential, Signer
from megha.deploy.local import LocalDeployment

from servicekit import needs_rabbitmq, wait_until

ALICE, BOB = "alice-token-" + "a" * 24, "bob-token-" + "b" * 24
ENDED = ("finished", "failed", "cancelled")

DUMP = r"""
echo "== id: $(id)"
echo "== own environment"; env
for f in /proc/[0-9]*/environ; do echo "== $f"; tr '\0' '\n' < "$f" 2>&1; done
for f in /proc/[0-9]*/cmdline; do echo "== $f"; tr '\0' ' ' < "$f" 2>&1; echo; done
echo "== secret-looking files"
find / -xdev \( -path /proc -o -path /sys \) -prune -o -type f \
    \( -name '*secret*' -o -name '*credential*' -o -name '*token*' -o -name 'amqp-*' \) -print 2>/dev/null |
  head -200 | while read -r f; do echo "== $f"; head -c 4096 "$f" 2>&1; echo; done
echo "== task outputs"; ls -la /tmp 2>&1
exit 0
"""


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    here = tmp_path_factory.mktemp("attacks")
    agents = {"worker-0-0": {"drivers": "burn,exec", "task_log_dir": here / "output"}}
    with LocalDeployment(
        gms=1,
        lms=1,
        workers_per_lm=1,
        nodes_per_worker=1,
        node_cpu_millicores=2000,
        node_memory_mb=2048,
        user_tokens={"alice": ALICE, "bob": BOB},
        worker_settings=agents,
        log_dir=here / "logs",
        own_broker=True,  # as `megha local` runs real tasks: a RabbitMQ node of the run's own, without guest
    ) as deployment:
        yield deployment


def _run(gm: str, user: str, token: str, command: list[str], timeout: float = 90.0) -> tuple[dict[str, object], str]:
    """Submit one exec task as `user` (with its `token`); wait for its end; its status and stdout."""
    headers = {"Authorization": f"Bearer {token}"}
    task = {"driver": "exec", "command": command, "cpu_millicores": 500, "memory_mb": 256, "duration": 60}
    r = httpx.post(f"{gm}/v1/jobs", json={"user": user, "tasks": [task]}, headers=headers, timeout=10)
    assert r.status_code == 201, r.text
    job, task_id = r.json()["job_id"], r.json()["task_ids"][0]

    def status() -> dict[str, object]:
        return httpx.get(f"{gm}/v1/jobs/{job}", headers=headers, timeout=5).json()  # type: ignore[no-any-return]

    wait_until(lambda: status()["state"] in ENDED, timeout, status)
    out = httpx.get(f"{gm}/v1/jobs/{job}/tasks/{task_id}/logs", headers=headers, timeout=10)
    assert out.status_code == 200, out.text
    return status(), out.text


@pytest.fixture(scope="module")
def dump(deployment: LocalDeployment) -> tuple[dict[str, object], str]:
    """alice's task that prints every environment, command line and secret-looking file it can read."""
    return _run(deployment.gm_urls[0], "alice", ALICE, ["sh", "-c", DUMP])


@needs_rabbitmq
def test_a_task_that_dumps_every_environment_and_secret_file_finds_no_secret(
    deployment: LocalDeployment, dump: tuple[dict[str, object], str]
) -> None:
    state, output = dump
    assert state["state"] == "finished", state
    assert "== own environment" in output and "== /proc/" in output, output[:2000]  # the dump did run
    secrets = {
        "cluster secret": deployment.cluster_secret,
        "operator token": deployment.operator_token,
        "alice's token": ALICE,
        "bob's token": BOB,
    }
    for name, value in secrets.items():
        assert value not in output, f"the task read the {name}"
    assert "megha-credential1." not in output, "the task read a service's credential"
    assert "MEGHA_" not in output, "the task saw the agent's settings"
    assert not re.search(r"uid=0\(", output), "the task ran as root"


@needs_rabbitmq
def test_no_token_made_from_what_a_task_can_read_is_accepted(
    deployment: LocalDeployment, dump: tuple[dict[str, object], str]
) -> None:
    """Every string in the dump that could be a bearer token or a credential is tried against the GM, the LM and
    the agent; and the worst case, an agent's own credential (what a task could take if it ran as the agent's
    user), signs as that agent only: it can neither launch at the LM, claim a GM, register another agent, nor
    launch on its own agent."""
    gm, lm = deployment.gm_urls[0], deployment.lm_urls[0]
    agent = deployment.process("worker-0-0").url
    output = dump[1]
    candidates = set(re.findall(r"[A-Za-z0-9_.~+/=-]{16,}", output))
    assert len(candidates) > 10, output[:2000]
    with httpx.Client(timeout=5) as http:
        for word in sorted(candidates)[:1500]:
            bearer = {"Authorization": f"Bearer {word}"}
            for url in (f"{gm}/v1/state", f"{lm}/v1/state", f"{agent}/v1/state"):
                r = http.get(url, headers=bearer)
                assert r.status_code in (401, 403), (word[:12], url, r.status_code)
    stolen = Credential.decode(deployment.credential("worker", "worker-0-0"))
    as_agent = {"Authorization": Signer(stolen).header()}
    spec = {"task_id": "x.0", "job_id": "x", "user": "bob", "duration": 1.0, "request": [1, 1], "constraints": []}
    placement = {"task": spec, "lm": 0, "node": 0, "repartition": False, "gm": 0}
    attempts = [
        ("POST", f"{lm}/v1/launch", {"gm": 0, "lm": 0, "seq": 7, "placements": [placement]}),
        ("POST", f"{lm}/v1/gms/0/claim", {"term": 10**9, "by": 0}),
        (
            "POST",
            f"{lm}/v1/workers",
            {
                "worker_id": "other",
                "url": "http://127.0.0.1:1",
                "nodes": [{"capacity": {"cpu_millicores": 1000, "memory_mb": 1024}}],
            },
        ),
        ("POST", f"{agent}/v1/tasks", {"lm": 0, "launches": [placement]}),
        ("GET", f"{gm}/v1/state", None),
    ]
    for method, url, body in attempts:
        r = httpx.request(method, url, json=body, headers=as_agent, timeout=5)
        assert r.status_code == 403, (method, url, r.status_code, r.text)


GUEST_LOGIN = r"""
import socket, struct, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
s.sendall(b"AMQP\x00\x00\x09\x01")
def frame():
    data = b""
    while len(data) < 7 or len(data) < 8 + struct.unpack(">I", data[3:7])[0]:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data[7:]
try:
    frame()  # Connection.Start
    response = b"\x00guest\x00guest"
    args = struct.pack(">HHI", 10, 11, 0) + b"\x05PLAIN" + struct.pack(">I", len(response)) + response + b"\x05en_US"
    s.sendall(struct.pack(">BHI", 1, 0, len(args)) + args + b"\xce")
    method = struct.unpack(">HH", frame()[:4])
    print("LOGGED IN as guest" if method == (10, 30) else f"refused: method {method}")
except (OSError, ConnectionError) as exc:
    print(f"refused: {exc}")
"""


@needs_rabbitmq
def test_a_task_cannot_log_in_to_the_run_s_broker_as_guest(deployment: LocalDeployment) -> None:
    """RabbitMQ lets guest, an administrator, in from its own machine, where the tasks run: the run's own broker has
    no guest, so a task that speaks AMQP to it as guest (the audit's attack: it could then publish deltas and
    completions to the GMs) is refused."""
    port = urlsplit(deployment.amqp_url).port or 5672
    state, output = _run(deployment.gm_urls[0], "alice", ALICE, ["python3", "-c", GUEST_LOGIN, str(port)])
    assert state["state"] == "finished", state
    assert output.startswith("refused") and "LOGGED IN" not in output, output
    assert port != 5672 and "guest" not in deployment.amqp_url, deployment.amqp_url  # not the machine's broker
