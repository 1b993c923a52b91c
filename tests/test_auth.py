"""Authentication and authorisation (issue 14, part 2): users' API tokens, services' signed tokens, and what each may
call, against a real GM, LM and worker agent (separate processes, the real RabbitMQ) with MEGHA_AUTH=on, as
`megha local` runs them; and the credential code itself."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from megha.common.auth import (
    TOKEN_LIFETIME,
    Credential,
    Principal,
    Signer,
    Unauthenticated,
    Verifier,
    new_secret,
    parse_api_tokens,
    root_public,
    token_digest,
)
from megha.common.settings import GMSettings, LMSettings, LoadgenSettings, WorkerSettings
from megha.deploy.local import LocalDeployment
from megha.services.auth import GM_RULES, LM_RULES, WORKER_RULES, acts_as_gm, routes_of
from megha.services.gm.app import create_app as gm_app
from megha.services.lm.app import create_app as lm_app
from megha.services.worker.app import create_app as worker_app

from servicekit import needs_rabbitmq, small_deployment, wait_until

SECRET = "s" * 32
ALICE, BOB = "alice-token-" + "a" * 20, "bob-token-" + "b" * 20
NODE = {"cpu_millicores": 2000, "memory_mb": 4096}


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _as(role: str, ident: str, secret: str = "") -> dict[str, str]:
    return {"Authorization": Signer(Credential.issue(secret or SECRET, role, ident)).header()}  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ credentials


def test_signed_tokens_are_checked_for_certificate_signature_expiry_and_form() -> None:
    verifier = Verifier(root_public(SECRET))
    gm3 = Signer(Credential.issue(SECRET, "gm", "3"))
    assert verifier.principal(gm3.header(), time.time()) == Principal("gm", "3")
    signer = Signer(Credential.issue(SECRET, "lm", "1"))
    token = signer.token(1000.0)
    assert verifier.principal(f"Bearer {token}", 1000.0 + TOKEN_LIFETIME - 1) == Principal("lm", "1")
    with pytest.raises(Unauthenticated, match="expired"):
        Verifier(root_public(SECRET)).principal(f"Bearer {token}", 1000.0 + TOKEN_LIFETIME + 1)
    with pytest.raises(Unauthenticated, match="not certified"):  # another deployment's service
        verifier.principal(Signer(Credential.issue("x" * 32, "gm", "0")).header(), time.time())
    with pytest.raises(Unauthenticated, match="accepts no service token"):
        Verifier(None).principal(gm3.header(), time.time())
    for bad in (None, "", "Basic abc", "Bearer ", "Bearer megha2.gm.0", "Bearer megha2.e30.AA", "Bearer megha2.a.b.c"):
        with pytest.raises(Unauthenticated):
            verifier.principal(bad, 1000.0)
    with pytest.raises(Unauthenticated, match="longer"):
        Verifier(root_public(SECRET)).principal(f"Bearer {signer.token(1e6)}", 1000.0)  # far beyond a lifetime
    nested = base64.urlsafe_b64encode(b"[" * 1100).rstrip(b"=").decode()  # json.loads: RecursionError (a 500)
    with pytest.raises(Unauthenticated, match="malformed service token"):
        verifier.principal(f"Bearer megha2.{nested}.x", 1000.0)
    with pytest.raises(Unauthenticated, match="token longer than 4096 characters"):
        verifier.principal(f"Bearer megha2.{'A' * 5000}.x", 1000.0)


def _claim(token: str) -> dict[str, object]:
    body = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))


def _token(claim: dict[str, object], signature: str) -> str:
    body = base64.urlsafe_b64encode(json.dumps(claim).encode()).rstrip(b"=").decode()
    return f"Bearer megha2.{body}.{signature}"


def test_an_agents_credential_signs_as_that_agent_only() -> None:
    """What an agent holds (its credential) cannot make a token of a GM, an LM or another agent: its certificate
    names its role and id, and a claim changed to another identity no longer matches the certificate or the
    signature. A credential names no root secret."""
    verifier = Verifier(root_public(SECRET))
    agent = Credential.issue(SECRET, "worker", "w.0")  # a worker id with a dot registers too
    assert SECRET not in agent.encode() and Credential.decode(agent.encode()) == agent
    token = Signer(agent).token(time.time())
    assert verifier.principal(f"Bearer {token}", time.time()) == Principal("worker", "w.0")
    claim, signature = _claim(token), token.split(".")[2]
    for forged in ({"role": "gm", "id": "0"}, {"role": "lm", "id": "0"}, {"id": "w.1"}):
        # the agent re-signs the changed claim with its own key: the certificate still names w.0
        body = base64.urlsafe_b64encode(json.dumps({**claim, **forged}).encode()).rstrip(b"=").decode()
        own_key = Ed25519PrivateKey.from_private_bytes(agent.key)
        resigned = base64.urlsafe_b64encode(own_key.sign(body.encode())).rstrip(b"=").decode()
        with pytest.raises(Unauthenticated, match="not certified"):
            verifier.principal(f"Bearer megha2.{body}.{resigned}", time.time())
        with pytest.raises(Unauthenticated):  # or with the original signature
            verifier.principal(_token({**claim, **forged}, signature), time.time())
    # A key the agent makes itself, with its own certificate: the certificate does not cover that key.
    other = Ed25519PrivateKey.generate()
    public = base64.urlsafe_b64encode(other.public_key().public_bytes_raw()).rstrip(b"=").decode()
    body = base64.urlsafe_b64encode(json.dumps({**claim, "pub": public}).encode()).rstrip(b"=").decode()
    resigned = base64.urlsafe_b64encode(other.sign(body.encode())).rstrip(b"=").decode()
    with pytest.raises(Unauthenticated, match="not certified"):
        verifier.principal(f"Bearer megha2.{body}.{resigned}", time.time())
    tampered = agent.encode()[:-4] + "AAAA"
    with pytest.raises(ValueError, match="credential"):
        Credential.decode(tampered)


def test_api_tokens_map_to_users_and_operators_and_may_be_given_as_digests() -> None:
    tokens = parse_api_tokens(f"alice={ALICE}\n# a comment\n\nbob={token_digest(BOB)}, ops={'o' * 16}")
    verifier = Verifier(root_public(SECRET), tokens, frozenset({"ops"}))
    assert verifier.principal(f"Bearer {ALICE}", 0) == Principal("user", "alice")
    assert verifier.principal(f"Bearer {BOB}", 0) == Principal("user", "bob")
    assert verifier.principal(f"Bearer {'o' * 16}", 0).operator
    with pytest.raises(Unauthenticated, match="unknown"):
        verifier.principal(f"Bearer {'z' * 20}", 0)
    assert Principal("user", "alice").may_act_for("alice") and not Principal("user", "alice").may_act_for("bob")
    assert Principal("user", "ops", operator=True).may_act_for("bob")
    assert not Principal("gm", "0").may_act_for("0")
    for bad, why in (("alice", "user=token"), ("alice=short", "16 characters"), ("a b=" + "x" * 20, "letters")):
        with pytest.raises(ValueError, match=why):
            parse_api_tokens(bad)
        assert bad.split("=", 1)[-1] not in str(why)  # the message never repeats a token
    with pytest.raises(ValueError, match="same token"):
        parse_api_tokens(f"a={ALICE},b={ALICE}")


def test_every_route_of_every_service_has_a_rule_and_every_rule_a_route() -> None:
    apps = {
        "gm": (gm_app(GMSettings(auth="off"), use_broker=False), GM_RULES),
        "lm": (lm_app(LMSettings(auth="off"), use_broker=False), LM_RULES),
        "worker": (worker_app(WorkerSettings(auth="off"), use_broker=False), WORKER_RULES),
    }
    for name, (app, rules) in apps.items():
        assert routes_of(app) == set(rules), (name, routes_of(app) ^ set(rules))
        doc = app.openapi()
        assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        for path, operations in doc["paths"].items():
            for method, op in operations.items():
                needs = bool(rules[f"{method.upper()} {path}"])
                assert ("401" in op["responses"] and "403" in op["responses"]) == needs, (name, method, path)


# --------------------------------------------------------------------------------------------------- settings


def _start(module: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEGHA_")}
    return subprocess.run(
        [sys.executable, "-m", module], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("module", "env", "says"),
    [
        ("megha.services.lm", {}, "MEGHA_CREDENTIAL (or MEGHA_CREDENTIAL_FILE) is not set"),
        ("megha.services.lm", {"MEGHA_CREDENTIAL": "megha-credential1.e30"}, "MEGHA_CREDENTIAL: not a credential"),
        (
            "megha.services.lm",
            {"MEGHA_LM_ID": "1", "MEGHA_CREDENTIAL": Credential.issue(SECRET, "lm", "0").encode()},
            "the credential of lm 0, not of this lm 1",
        ),
        ("megha.services.worker", {"MEGHA_CLUSTER_SECRET": "short"}, "at least 16 characters"),
        ("megha.services.gm", {"MEGHA_CLUSTER_SECRET": SECRET}, "MEGHA_API_TOKENS (or MEGHA_API_TOKENS_FILE)"),
        ("megha.services.gm", {"MEGHA_CLUSTER_SECRET": SECRET, "MEGHA_API_TOKENS": "alice"}, "not user=token"),
        ("megha.services.lm", {"MEGHA_CLUSTER_SECRET_FILE": "/nonexistent/secret"}, "cannot read /nonexistent"),
        ("megha.loadgen.services", {}, "MEGHA_API_TOKEN (or MEGHA_API_TOKEN_FILE) is not set"),
    ],
)
def test_a_service_without_its_secrets_exits_with_one_line(module: str, env: dict[str, str], says: str) -> None:
    done = _start(module, env)
    assert done.returncode == 2, done
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_secrets_come_from_files_and_never_from_both_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "secret").write_text(SECRET + "\n")
    (tmp_path / "tokens").write_text(f"# users\nalice={ALICE}\nbob={BOB}\n")
    monkeypatch.setenv("MEGHA_AUTH", "on")
    monkeypatch.setenv("MEGHA_CLUSTER_SECRET_FILE", str(tmp_path / "secret"))
    monkeypatch.setenv("MEGHA_API_TOKENS_FILE", str(tmp_path / "tokens"))
    settings = GMSettings()
    assert settings.cluster_secret.get_secret_value() == SECRET and SECRET not in repr(settings)
    verifier = settings.verifier()
    assert verifier is not None and verifier.principal(f"Bearer {BOB}", 0) == Principal("user", "bob")
    monkeypatch.setenv("MEGHA_CLUSTER_SECRET", SECRET)
    done = _start("megha.services.gm", {k: v for k, v in os.environ.items() if k.startswith("MEGHA_")})
    assert done.returncode == 2 and "are both set" in done.stderr, done.stderr
    monkeypatch.delenv("MEGHA_CLUSTER_SECRET")
    monkeypatch.setenv("MEGHA_API_TOKEN_FILE", str(tmp_path / "secret"))
    assert LoadgenSettings().credentials() is not None


# ---------------------------------------------------------------------------------------- a real deployment


def _job(job_id: str, user: str, duration: float = 600.0) -> dict[str, object]:
    return {"job_id": job_id, "user": user, "tasks": [{"duration": duration, **NODE}]}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> LocalDeployment:  # type: ignore[misc]
    logs = tmp_path_factory.mktemp("auth") / "logs"
    tokens = {"alice": ALICE, "bob": BOB}
    with small_deployment(logs, nodes_per_worker=3, cluster_secret=SECRET, user_tokens=tokens) as deployment:
        yield deployment


@needs_rabbitmq
def test_without_a_credential_only_health_metrics_docs_and_the_dashboard_page_answer(
    deployment: LocalDeployment,
) -> None:
    gm, lm = deployment.gm_urls[0], deployment.lm_urls[0]
    agent = deployment.process("worker-0-0").url
    for url in (gm, lm, agent):
        for path in ("/healthz", "/metrics", "/docs", "/openapi.json"):
            assert httpx.get(url + path, timeout=5).status_code == 200, (url, path)
    assert httpx.get(f"{gm}/dashboard", timeout=5).status_code == 200
    closed = [
        ("POST", f"{gm}/v1/jobs", _job("j", "alice")),
        ("GET", f"{gm}/v1/jobs", None),
        ("GET", f"{gm}/v1/jobs/j", None),
        ("DELETE", f"{gm}/v1/jobs/j", None),
        ("GET", f"{gm}/v1/state", None),
        ("GET", f"{gm}/v1/overview", None),
        ("POST", f"{gm}/v1/peers/0/journal", {"lines": []}),
        ("POST", f"{lm}/v1/launch", {"gm": 0, "lm": 0, "seq": 0, "placements": []}),
        ("POST", f"{lm}/v1/preempt", {}),
        ("POST", f"{lm}/v1/gms/0/claim", {}),
        ("GET", f"{lm}/v1/state", None),
        ("POST", f"{agent}/v1/tasks", {"lm": 0, "launches": []}),
        ("POST", f"{agent}/v1/preempt", {"task_ids": []}),
    ]
    for method, url, body in closed:
        r = httpx.request(method, url, json=body, timeout=5)
        assert r.status_code == 401, (method, url, r.status_code, r.text)
        assert r.headers["www-authenticate"] == "Bearer" and r.json()["detail"][0]["field"] == "authorization"
        wrong = httpx.request(method, url, json=body, headers=_bearer("x" * 30), timeout=5)
        assert wrong.status_code == 401, (method, url)
        other = httpx.request(method, url, json=body, headers=_as("gm", "0", "y" * 32), timeout=5)
        assert other.status_code == 401 and "not certified" in other.text, (method, url)


@needs_rabbitmq
def test_forged_launches_preemptions_and_registrations_are_refused(deployment: LocalDeployment) -> None:
    """The attacks the issue tried: a launch of zero-resource tasks at an LM claiming to be GM 0, a task at an agent
    beyond its node, a preemption of another user's task at an agent. Now only a service holding the cluster
    secret, in the right role, gets past authentication (what the LM and agent then check is tested elsewhere)."""
    lm, agent = deployment.lm_urls[0], deployment.process("worker-0-0").url
    spec = {"task_id": "f.0", "job_id": "f", "user": "bob", "duration": 1.0, "request": [0, 0], "constraints": []}
    placement = {"task": spec, "lm": 0, "node": 0, "repartition": False, "gm": 0}
    launch = {"gm": 0, "lm": 0, "seq": 1, "placements": [placement] * 3}
    for headers in (_bearer(ALICE), _bearer(deployment.operator_token), _as("worker", "worker-0-0"), _as("lm", "0")):
        r = httpx.post(f"{lm}/v1/launch", json=launch, headers=headers, timeout=5)
        assert r.status_code == 403 and "allowed: gm" in r.text, (headers, r.text)
    big = {**spec, "request": [64000, 1_000_000]}
    for headers in (_bearer(ALICE), _as("gm", "0"), _as("worker", "worker-0-0")):
        r = httpx.post(f"{agent}/v1/tasks", json={"lm": 0, "launches": [{**placement, "task": big}]}, headers=headers)
        assert r.status_code == 403, r.text
        r = httpx.post(f"{agent}/v1/preempt", json={"task_ids": ["x.0"]}, headers=headers, timeout=5)
        assert r.status_code == 403, r.text
    registration = {"worker_id": "intruder", "url": "http://127.0.0.1:1", "nodes": [{"capacity": NODE}]}
    r = httpx.post(f"{lm}/v1/workers", json=registration, headers=_as("worker", "worker-0-0"), timeout=5)
    assert r.status_code == 403 and r.json()["detail"][0]["field"] == "worker_id", r.text
    r = httpx.post(f"{lm}/v1/workers", json=registration, headers=_as("gm", "0"), timeout=5)
    assert r.status_code == 403, r.text
    r = httpx.post(f"{deployment.gm_urls[0]}/v1/peers/0/release", headers=_bearer(ALICE), timeout=5)
    assert r.status_code == 403, r.text
    state = httpx.get(f"{lm}/v1/state", headers=deployment.headers, timeout=5).json()
    assert state["running"] == 0 and state["launched"] == 0  # none of it got through
    log = (deployment.log_dir / "lm-0.log").read_text()
    assert "refused POST /v1/launch" in log or "may not POST /v1/launch" in log, log[-2000:]


def test_a_gm_acts_as_itself_or_as_the_gm_it_stands_in_for_only() -> None:
    gm = lambda n: Principal("gm", str(n))  # noqa: E731
    assert acts_as_gm(gm(0), 0, 3) and acts_as_gm(gm(1), 0, 3) and acts_as_gm(gm(0), 2, 3)  # 1 stands in for 0
    assert not acts_as_gm(gm(2), 0, 3) and not acts_as_gm(gm(1), 0, 3, stand_in=False)
    assert not acts_as_gm(gm(1), 0, 1)  # no ring with one GM
    assert not acts_as_gm(Principal("lm", "0"), 0, 3) and not acts_as_gm(Principal("user", "0", operator=True), 0, 3)


@needs_rabbitmq
def test_a_service_token_names_the_identity_a_route_acts_as(deployment: LocalDeployment) -> None:
    """GM 1's token (certified: a real GM of some deployment size) can neither launch, stop, claim, read the state
    of, nor write the journal copy of GM 0; LM 1's token cannot launch, stop or read output on LM 0's agent; an
    agent's token registers only itself (above)."""
    gm, lm = deployment.gm_urls[0], deployment.lm_urls[0]
    as_gm1 = deployment.headers_as("gm", "1")
    spec = {"task_id": "f.0", "job_id": "f", "user": "bob", "duration": 1.0, "request": [1, 1], "constraints": []}
    placement = {"task": spec, "lm": 0, "node": 0, "repartition": False, "gm": 0}
    calls = [
        ("POST", f"{lm}/v1/launch", {"gm": 0, "lm": 0, "seq": 99, "placements": [placement]}),
        ("POST", f"{lm}/v1/stop", {"gm": 0, "lm": 0, "runs": [{"task_id": "f.0", "attempt": 1}]}),
        ("GET", f"{lm}/v1/gms/0/state", None),
        ("POST", f"{lm}/v1/gms/0/claim", {"term": 10**9, "by": 0}),
        ("POST", f"{gm}/v1/peers/0/journal", {"lines": []}),
        ("POST", f"{gm}/v1/peers/0/release", {}),
    ]
    for method, url, body in calls:
        r = httpx.request(method, url, json=body, headers=as_gm1, timeout=5)
        assert r.status_code == 403 and r.json()["detail"][0]["field"] in ("gm", "by"), (method, url, r.text)
        assert "gm 1 may not" in r.text
    agent = deployment.process("worker-0-0").url
    launch = {"lm": 1, "launches": [{**placement, "lm": 1}]}
    as_lm1 = deployment.headers_as("lm", "1")  # another LM's token
    for method, url, body in [
        ("POST", f"{agent}/v1/tasks", {**launch, "lm": 0, "launches": [placement]}),
        ("POST", f"{agent}/v1/preempt", {"lm": 0, "task_ids": ["f.0"]}),
        ("GET", f"{agent}/v1/tasks/f.0/logs", None),
    ]:
        r = httpx.request(method, url, json=body, headers=as_lm1, timeout=5)
        assert r.status_code == 403 and "lm 1 may not" in r.text, (method, url, r.text)
    for task in ("g0-mwuy71mk-0.0", "alice~train-1~g0-mwuy71mk-3.0"):  # GM 0's tasks' output, by the ids it made
        r = httpx.get(f"{lm}/v1/nodes/0/tasks/{task}/logs", headers=as_gm1, timeout=5)
        assert r.status_code == 403 and r.json()["detail"][0]["field"] == "task_id", r.text
        r = httpx.get(f"{lm}/v1/nodes/0/tasks/{task}/logs", headers=deployment.headers_as("gm", "0"), timeout=5)
        assert r.status_code == 404, r.text  # GM 0 may ask: the agent ran no such task
    state = httpx.get(f"{lm}/v1/gms/0/state", headers=deployment.headers_as("gm", "0"), timeout=5)
    assert state.status_code == 200, state.text  # GM 0 itself may, and its term was not raised by GM 1's claim
    assert httpx.get(f"{lm}/v1/gms/0/state", headers=deployment.headers, timeout=5).status_code == 200  # operator
    assert httpx.get(f"{lm}/v1/state", headers=deployment.headers, timeout=5).json()["launched"] == 0


@needs_rabbitmq
def test_users_submit_to_their_own_queue_and_see_and_cancel_only_their_jobs(deployment: LocalDeployment) -> None:
    gm = deployment.gm_urls[0]
    alice, bob, operator = _bearer(ALICE), _bearer(BOB), deployment.headers
    r = httpx.post(f"{gm}/v1/jobs", json=_job("a1", "bob"), headers=alice, timeout=10)
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "user", r.text  # tests/test_identities.py
    assert httpx.post(f"{gm}/v1/jobs", json=_job("a1", "alice"), headers=alice, timeout=10).status_code == 201
    assert httpx.post(f"{gm}/v1/jobs", json=_job("b1", "bob", 0.05), headers=bob, timeout=10).status_code == 201
    assert httpx.post(f"{gm}/v1/jobs", json=_job("o1", "carol", 0.05), headers=operator, timeout=10).status_code == 201

    def state(job: str) -> str:
        return str(httpx.get(f"{gm}/v1/jobs/{job}", headers=operator, timeout=5).json()["state"])

    wait_until(lambda: state("bob~b1") == "finished" and state("o1") == "finished", 30, lambda: state("bob~b1"))

    assert httpx.get(f"{gm}/v1/jobs/a1", headers=alice, timeout=5).status_code == 200  # alice~a1, by its name
    hidden = httpx.get(f"{gm}/v1/jobs/alice~a1", headers=bob, timeout=5)
    assert hidden.status_code == 404 and hidden.json()["detail"][0]["field"] == "job_id"
    assert httpx.delete(f"{gm}/v1/jobs/alice~a1", headers=bob, timeout=5).status_code == 404
    assert state("alice~a1") != "cancelled"

    def listed(headers: dict[str, str], **params: str) -> list[str]:
        r = httpx.get(f"{gm}/v1/jobs", params=params, headers=headers, timeout=5)
        assert r.status_code == 200, r.text
        return [j["job_id"].rsplit("~", 1)[0] for j in r.json()["jobs"]]  # a user's name, without its GM-made id

    assert listed(alice) == ["alice~a1"] and listed(bob) == ["bob~b1"] and listed(bob, user="bob") == ["bob~b1"]
    assert sorted(listed(operator)) == ["alice~a1", "bob~b1", "o1"] and listed(operator, user="alice") == ["alice~a1"]
    r = httpx.get(f"{gm}/v1/jobs", params={"user": "alice"}, headers=bob, timeout=5)
    assert r.status_code == 403 and r.json()["detail"][0]["field"] == "user"
    assert httpx.get(f"{gm}/v1/state", headers=alice, timeout=5).status_code == 403  # operators' and GMs'
    assert httpx.get(f"{gm}/v1/overview", headers=alice, timeout=5).status_code == 403
    assert httpx.get(f"{gm}/v1/queues", headers=alice, timeout=5).status_code == 200

    r = httpx.delete(f"{gm}/v1/jobs/a1", headers=alice, timeout=10)
    assert r.status_code == 202, r.text
    wait_until(lambda: state("alice~a1") == "cancelled", 30, lambda: state("alice~a1"))


@needs_rabbitmq
def test_authentication_off_is_loud(tmp_path: Path) -> None:
    with LocalDeployment(
        gms=1, lms=1, workers_per_lm=1, execution="simulated", auth=False, log_dir=tmp_path / "logs"
    ) as deployment:
        gm = deployment.gm_urls[0]
        assert httpx.post(f"{gm}/v1/jobs", json=_job("open", "anyone", 0.05), timeout=10).status_code == 201
    for name in ("gm-0", "lm-0", "worker-0-0"):
        log = (tmp_path / "logs" / f"{name}.log").read_text()
        assert "AUTHENTICATION IS OFF (MEGHA_AUTH=off)" in log and " WARNING " in log, (name, log[-1000:])


def test_generated_secrets_differ_per_deployment() -> None:
    one, two = LocalDeployment(), LocalDeployment()
    assert len({one.cluster_secret, two.cluster_secret, one.operator_token, two.operator_token}) == 4
    assert len(new_secret()) >= 40 and "secret" not in repr(one).lower().replace("cluster_secret", "")


def test_megha_credential_issues_one_services_credential(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from megha.cli import main

    monkeypatch.setenv("MEGHA_CLUSTER_SECRET", SECRET)
    assert main(["credential", "worker", "rack7.a"]) == 0
    issued = Credential.decode(capsys.readouterr().out)
    assert (issued.role, issued.ident, issued.root) == ("worker", "rack7.a", root_public(SECRET))
    monkeypatch.setenv("MEGHA_CREDENTIAL", issued.encode())
    monkeypatch.setenv("MEGHA_AUTH", "on")
    monkeypatch.setenv("MEGHA_WORKER_ID", "rack7.a")
    monkeypatch.delenv("MEGHA_CLUSTER_SECRET")
    settings = WorkerSettings()
    assert not settings.holds_root() and settings.signer() is not None
    monkeypatch.delenv("MEGHA_CLUSTER_SECRET", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["credential", "gm", "0"])
    assert exited.value.code == 2 and "MEGHA_CLUSTER_SECRET" in capsys.readouterr().err
