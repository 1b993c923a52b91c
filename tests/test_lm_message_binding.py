"""A GM takes an LM's delta, completions or rebuilt notice only when the LM it names signed it, for this GM, with its
own credential (docs/security.md, "Broker reports"): a message claiming another LM, an unsigned one and one
signed for another GM are ignored, counted and logged, never requeued. First the signing helpers, then the GM
service in this process, fed broker messages directly; then a real deployment (separate processes, the real
RabbitMQ, a broker user per role) where forged completions of a running task are published to the GM's queue
with the LMs' broker credentials while the real run goes on."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from test_broker_users import users  # noqa: F401 (a fixture: a broker user per role)
from test_report_binding import (  # gate: a fixture, a task held until the test lets it go
    Gate,
    agent_runs,
    call,
    deployment,
    gate,  # noqa: F401
)

from megha.common import auth
from megha.common.auth import Credential, MessageSigner, MessageVerifier, Unauthenticated
from megha.common.core.messages import Completion, Completions, Delta, NodeState, Placement
from megha.common.core.task import TaskSpec
from megha.common.models import BrokerMessage
from megha.common.settings import GMSettings
from megha.common.transport.rabbit import (
    IGNORED_LOG_EVERY,
    LM_CERTIFICATE,
    LM_SIGNATURE,
    Broker,
    TryLater,
    gm_key,
    lm_report_headers,
    lm_report_signer,
)
from megha.deploy.local import LocalDeployment
from megha.services.gm.service import GMService

from corekit import cluster
from servicekit import needs_rabbitmq, wait_until

SECRET = "lm-message-binding-test-secret-0123"
LM0, LM1 = (MessageSigner(Credential.issue(SECRET, "lm", lm)) for lm in ("0", "1"))


def verifier(secret: str = SECRET) -> MessageVerifier:
    return MessageVerifier(auth.root_public(secret), "lm")


def delta(lm: int, gm: int = 0, free: tuple[int, ...] = (0, 0), version: int = 1) -> bytes:
    """LM `lm`'s delta for GM `gm`: its node 0 (in GM 0's partition) has `free` resources."""
    return BrokerMessage.core_json(Delta(lm, gm, 0, [NodeState(0, free, version)]))


def done(task_id: str, node: int, lm: int, gm: int = 0) -> bytes:
    """LM `lm`'s completions for GM `gm`: `task_id`'s first run on `node` finished."""
    return BrokerMessage.core_json(Completions(lm, gm, 0, [Completion(task_id, NodeState(node, (2000, 4096), 99))]))


# ------------------------------------------------------------------------------------------ the helpers


def test_a_message_is_bound_to_its_lm_its_gm_and_its_exact_bytes() -> None:
    body = delta(1)
    headers = lm_report_headers(LM1, 0, body)
    check = verifier()
    assert lm_report_signer(check, 0, body, headers) == "1"
    assert lm_report_signer(check, 0, body, {k: v.encode() for k, v in headers.items()}) == "1"  # AMQP's bytes
    tampered = [
        (0, body[:-2] + bytes([body[-2] ^ 1]) + body[-1:], headers),  # one byte of the body
        (1, body, headers),  # another GM
        (0, body, {**headers, LM_CERTIFICATE: LM0.certificate}),  # LM 1's signature, LM 0's certificate
        (0, body, lm_report_headers(LM0, 0, body) | {LM_SIGNATURE: headers[LM_SIGNATURE]}),
        (0, body, {}),  # unsigned
        (0, body, {LM_CERTIFICATE: LM1.certificate}),  # a certificate, no signature
        (0, body, {**headers, LM_SIGNATURE: "not base64!"}),
    ]
    for gm, signed, with_headers in tampered:
        with pytest.raises(Unauthenticated):
            lm_report_signer(check, gm, signed, with_headers)
    with pytest.raises(Unauthenticated, match="is not signed"):
        lm_report_signer(check, 0, body, {})
    with pytest.raises(Unauthenticated, match="signature is not lm 1's"):
        lm_report_signer(check, 1, body, headers)


def test_a_certificate_counts_only_under_the_root_for_the_role_and_is_checked_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = delta(1)
    other_root = MessageSigner(Credential.issue("another-deployment-secret-0123", "lm", "1"))
    worker = MessageSigner(Credential.issue(SECRET, "worker", "1"))
    gm = MessageSigner(Credential.issue(SECRET, "gm", "1"))
    for signer, why in ((other_root, "not signed by this deployment's root"), (worker, "role 'worker'")):
        with pytest.raises(Unauthenticated, match=why):
            lm_report_signer(verifier(), 0, body, lm_report_headers(signer, 0, body))
    with pytest.raises(Unauthenticated, match="role 'gm'"):
        lm_report_signer(verifier(), 0, body, lm_report_headers(gm, 0, body))
    role, ident, public, certificate = LM1.certificate.split(" ")
    for made_up in (f"{role} 2 {public} {certificate}", f"{role} {ident} {public}", f"{role} {ident} {public} !!"):
        with pytest.raises(Unauthenticated):
            lm_report_signer(verifier(), 0, body, {**lm_report_headers(LM1, 0, body), LM_CERTIFICATE: made_up})
    # A certificate checked once is remembered: the next message of that LM costs one Ed25519 verification.
    verifications = 0
    real = auth._verifies

    def counted(*args: Any) -> bool:
        nonlocal verifications
        verifications += 1
        return real(*args)

    monkeypatch.setattr(auth, "_verifies", counted)
    check = verifier()
    for n in range(3):
        body = delta(1, version=n + 1)
        assert lm_report_signer(check, 0, body, lm_report_headers(LM1, 0, body)) == "1"
    assert verifications == 2 + 1 + 1
    # It is remembered by what it decodes to: the same certificate spelt otherwise (base64 decoding skips what is
    # not base64) is not checked, nor kept, again.
    role, ident, public, certificate = LM1.certificate.split(" ")
    respelt = f"{role} {ident} {public} {certificate[:8]}!!!!{certificate[8:]}"
    assert lm_report_signer(check, 0, body, lm_report_headers(LM1, 0, body) | {LM_CERTIFICATE: respelt}) == "1"
    assert verifications == 2 + 1 + 1 + 1 and len(check._certified) == 1


# ------------------------------------------------------------------------------------ the GM in-process


def gm_service(auth_on: bool = True) -> GMService:
    """GM 0 of a deployment of two GMs and two LMs, each LM a node in each GM's partition, all free."""
    settings = GMSettings(
        auth="on" if auth_on else "off",
        cluster_secret=SECRET,
        api_tokens="operator=" + "t" * 32,
        gm_id=0,
        lm_urls=["http://127.0.0.1:9", "http://127.0.0.1:9"],
    )
    service = GMService(settings)
    service.adopt(cluster([[[()], [()]], [[()], [()]]]))
    return service


def used(service: GMService, lm: int) -> float:
    """The used fraction of LM `lm`'s partition of GM 0 in the GM's view."""
    assert service.core is not None
    partitions = service.core.view_snapshot()["partitions"]
    (use,) = [p for p in partitions if p["lm"] == lm and p["gm"] == 0]  # type: ignore[attr-defined]
    return use["used_fraction"]  # type: ignore[no-any-return]


@pytest.mark.asyncio
async def test_a_gm_applies_only_what_the_lm_it_names_signed_for_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="megha.gm")
    service = gm_service()
    try:
        forged = [
            (delta(1), lm_report_headers(LM0, 0, delta(1))),  # claims LM 1, signed by LM 0
            (delta(1), {}),  # unsigned
            (delta(1, gm=1), lm_report_headers(LM1, 1, delta(1, gm=1))),  # LM 1's, for GM 1
            (delta(1), lm_report_headers(LM1, 0, delta(1, version=2))),  # LM 1's signature of another body
            (delta(0), lm_report_headers(LM1, 0, delta(0))),  # claims LM 0, signed by LM 1
            (b"not json at all", {}),  # garbage is ignored too (not dead-lettered)
        ]
        for body, headers in forged:
            await service.on_broker_message(body, headers)
        assert service.lm_reports.ignored.count == len(forged)
        assert (used(service, 0), used(service, 1)) == (0.0, 0.0)
        # LM 1's own delta, signed for this GM, counts.
        await service.on_broker_message(delta(1), lm_report_headers(LM1, 0, delta(1)))
        assert (used(service, 0), used(service, 1)) == (0.0, 1.0)
        # A rebuilt notice claiming LM 1 signed by LM 0 is ignored; LM 1's own is acted on (here its LM cannot be
        # reached, so the GM asks for it again later).
        rebuilt = json.dumps({"lm_rebuilt": {"lm": 1, "gm": 0, "incarnation": 2}}).encode()
        await service.on_broker_message(rebuilt, lm_report_headers(LM0, 0, rebuilt))
        assert service.lm_reports.ignored.count == len(forged) + 1
        with pytest.raises(TryLater, match="LM 1 unreachable"):
            await service.on_broker_message(rebuilt, lm_report_headers(LM1, 0, rebuilt))
        # A body an LM signed that is no broker message is dead-lettered as before (the consumer's ValidationError).
        with pytest.raises(ValueError):
            await service.on_broker_message(b"{}", lm_report_headers(LM1, 0, b"{}"))
        # Logged with the LM each message claimed, at most one line per claimed LM within IGNORED_LOG_EVERY
        # seconds: 4 messages claimed LM 1 (and the rebuilt notice), 1 LM 0, 1 none.
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ignored ")]
        assert len(lines) == 3, lines
        assert lines[0] == "ignored a broker message from LM 1 (a delta of 1 nodes for GM 0): it is signed by LM 0"
        assert "from LM 0 (a delta of 1 nodes for GM 0): it is signed by LM 1" in lines[1]
        assert "from LM (none named) (15 bytes that are no broker message): it is not signed" in lines[2]
        # Once IGNORED_LOG_EVERY seconds have passed, the next one is logged with the count of those not logged.
        last, unlogged = service.lm_reports.ignored._logged["1"]
        service.lm_reports.ignored._logged["1"] = (last - IGNORED_LOG_EVERY, unlogged)
        await service.on_broker_message(delta(1, gm=1), lm_report_headers(LM1, 1, delta(1, gm=1)))
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ignored ")]
        assert len(lines) == 4 and "signature is not lm 1's for this receiver" in lines[3], lines
        assert lines[3].endswith("; 4 more ignored since the last such line"), lines
    finally:
        await service.close()


@pytest.mark.asyncio
async def test_what_a_restarting_gm_reads_in_its_queue_is_judged_as_it_would_be_applied_but_nothing_is_counted() -> (
    None
):
    """A restarting GM reads the completions waiting for it before it recovers (`LMReportGate.believed`): forged,
    unsigned, misdirected and malformed messages are not believed, as `admitted` would ignore or dead-letter them,
    but neither counted nor logged then, since each is handled through `admitted` once the GM consumes its queue."""
    service = gm_service()
    await service.close()
    reports = service.lm_reports
    own = done("j.0", 0, 1)
    for body, headers in [
        (own, lm_report_headers(LM0, 0, own)),  # claims LM 1, signed by LM 0
        (own, {}),  # unsigned
        (done("j.0", 0, 1, gm=1), lm_report_headers(LM1, 1, done("j.0", 0, 1, gm=1))),  # for GM 1
        (b"{}", lm_report_headers(LM1, 0, b"{}")),  # signed, no broker message
        (b"not json at all", {}),
    ]:
        assert reports.believed(body, headers) is None
    assert reports.ignored.count == 0
    believed = reports.believed(own, lm_report_headers(LM1, 0, own))
    assert believed is not None and believed.completions is not None
    assert [i.task_id for i in believed.completions.items] == ["j.0"]


@pytest.mark.asyncio
async def test_a_replayed_signed_end_of_an_earlier_run_is_ignored() -> None:
    """LM 1 signed, for this GM, the end of a task's first run, preempted; the task now runs again there as the
    same attempt, its run 2. A copy of that end published again names run 1: the GM ignores it (it is no forgery,
    so it is not counted as an ignored message). A message of an LM that does not write run numbers names run 1."""
    service = gm_service()
    try:
        core = service.ready_core()
        rerun = TaskSpec("j.0", "j", "alice", 10.0, (1000, 512), 0, run_number=2)
        core.recover([], [Placement(rerun, 1, 0, False, 0)], [], 0.0)
        first = BrokerMessage.core_json(
            Completions(1, 0, 0, [Completion("j.0", NodeState(0, (2000, 4096), 99), preempted=True)])
        )
        older = json.loads(first)
        del older["completions"]["items"][0]["run_number"]
        for body in (first, json.dumps(older).encode()):
            await service.on_broker_message(body, lm_report_headers(LM1, 0, body))
            assert core.running["j.0"].task == rerun and not core.queue and core.preempted == 0
        assert service.lm_reports.ignored.count == 0
        second = BrokerMessage.core_json(
            Completions(1, 0, 0, [Completion("j.0", NodeState(0, (2000, 4096), 100), run_number=2)])
        )
        await service.on_broker_message(second, lm_report_headers(LM1, 0, second))
        assert core.running == {} and not core.queue
    finally:
        await service.close()


@pytest.mark.asyncio
async def test_with_authentication_off_a_gm_applies_an_unsigned_message() -> None:
    service = gm_service(auth_on=False)
    try:
        await service.on_broker_message(delta(1))
        assert used(service, 1) == 1.0 and service.lm_reports.ignored.count == 0
    finally:
        await service.close()


# -------------------------------------------------------------------------------------- a real deployment


def gm_state(d: LocalDeployment, gm: int = 0) -> dict[str, Any]:
    return call(d, "GET", f"{d.gm_urls[gm]}/v1/state").json()  # type: ignore[no-any-return]


def job_status(d: LocalDeployment, job_id: str) -> dict[str, Any]:
    r = call(d, "GET", f"{d.gm_urls[0]}/v1/jobs/{job_id}")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


@needs_rabbitmq
def test_a_real_gm_ends_runs_on_the_lms_own_word_only(
    users: tuple[str, dict[str, str]],  # noqa: F811
    tmp_path: Path,
    gate: Gate,  # noqa: F811
) -> None:
    """Two GMs and two LMs, an agent each; only LM 1's node satisfies constraint 0. A few short tasks run to their
    end through the LMs' signed deltas and completions; then, while a held task runs on LM 1's node, completions of
    it (and a delta) that LM 1 did not sign for GM 0 are published to GM 0's queue with the LMs' broker user: GM 0
    ignores them, and the run ends once, when it really ends."""
    run_id, urls = users
    agents = {"worker-0-0": {"constraints": ""}, "worker-1-0": {"constraints": "0"}}
    with deployment(tmp_path, users, gms=2, lms=2, workers_per_lm=1, worker_settings=agents) as d:
        short = {"driver": "exec", "command": ["/bin/true"], "cpu_millicores": 100, "memory_mb": 64}
        r = call(d, "POST", f"{d.gm_urls[0]}/v1/jobs", json={"job_id": "short", "user": "alice", "tasks": [short] * 6})
        assert r.status_code == 201, r.text
        wait_until(lambda: job_status(d, "short")["state"] == "finished", 60, lambda: job_status(d, "short"))
        held = {**gate.task(), "constraints": [0]}
        r = call(d, "POST", f"{d.gm_urls[0]}/v1/jobs", json={"job_id": "held", "user": "alice", "tasks": [held]})
        assert r.status_code == 201, r.text
        wait_until(lambda: agent_runs(d, "worker-1-0") != [], 30, lambda: job_status(d, "held"))
        status = job_status(d, "held")["tasks"][0]
        task_id, node = status["task_id"], status["node"]
        assert status["state"] == "launched" and status["lm"] == 1 and agent_runs(d, "worker-1-0") == [task_id], status

        # What a compromised LM 0 (its credential, the LMs' broker user) can publish, and LM 1's message for GM 1.
        lm0 = MessageSigner(Credential.decode(d.credential("lm", "0")))
        lm1 = MessageSigner(Credential.decode(d.credential("lm", "1")))
        ended = done(task_id, node, lm=1)
        free = delta(1, free=(2000, 4096), version=10**6)
        forged = [
            (ended, lm_report_headers(lm0, 0, ended)),
            (ended, None),
            (ended, lm_report_headers(lm1, 1, ended)),
            (free, lm_report_headers(lm0, 0, free)),
            (b"[]", None),
        ]

        async def forge() -> None:
            attacker = Broker(urls["lm"], run_id, role="lm")
            await attacker.connect()
            try:
                for body, headers in forged:
                    await attacker.publish("gm", gm_key(0), body, headers)
                assert await attacker.flush(10)
            finally:
                await attacker.close()

        asyncio.run(forge())
        wait_until(lambda: gm_state(d)["ignored_broker_messages"] == len(forged), 20, lambda: gm_state(d))
        # Ignored: the run still runs, at its GM and on its agent.
        assert job_status(d, "held")["tasks"][0]["state"] == "launched" and agent_runs(d, "worker-1-0") == [task_id]
        gate.open()
        wait_until(lambda: job_status(d, "held")["state"] == "finished", 30, lambda: job_status(d, "held"))
        final = job_status(d, "held")["tasks"][0]
        assert (final["attempts"], final["retries"]) == (1, 0)
        # Every message the LMs sent was taken; only the forged ones were ignored.
        assert gm_state(d)["ignored_broker_messages"] == len(forged) and gm_state(d, 1)["ignored_broker_messages"] == 0
        metrics = call(d, "GET", f"{d.gm_urls[0]}/metrics").text
        assert f'megha_gm_ignored_broker_messages_total{{gm="0"}} {float(len(forged))}' in metrics
        log = (d.log_dir / "gm-0.log").read_text()
    lines = [line for line in log.splitlines() if "ignored a broker message" in line]
    assert len(lines) == 2, lines  # one per claimed LM: 1, none named
    assert f"from LM 1 (completions of tasks ['{task_id}'] for GM 0): it is signed by LM 0" in lines[0]
    assert "from LM (none named) (2 bytes that are no broker message): it is not signed" in lines[1]


@pytest.mark.asyncio
@pytest.mark.parametrize("auth_on", [True, False])
async def test_a_message_from_an_lm_the_gm_has_no_url_for_is_ignored_in_a_line(
    caplog: pytest.LogCaptureFixture, auth_on: bool
) -> None:
    """A GM restarted without one of its LMs in MEGHA_LM_URLS: that LM's deltas are ignored and logged (at most a
    line a minute), not a traceback per message and a requeue (hundreds in a minute, then dead-lettered)."""
    caplog.set_level(logging.WARNING, logger="megha.gm")
    service = gm_service(auth_on)
    lm2 = MessageSigner(Credential.issue(SECRET, "lm", "2"))
    try:
        for _ in range(3):
            await service.on_broker_message(delta(2), lm_report_headers(lm2, 0, delta(2)))
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ignored ")]
        assert len(lines) == 1 and lines[0].endswith("this GM has no LM 2 (MEGHA_LM_URLS lists 2)"), lines
        assert (used(service, 0), used(service, 1)) == (0.0, 0.0)
    finally:
        await service.close()
