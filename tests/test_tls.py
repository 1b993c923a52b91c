"""TLS: a certificate authority made for the test, services serving HTTPS and calling each other over it, AMQPS to a
private RabbitMQ node with a TLS listener; a replay through them completes. Plain HTTP to a service port fails, a
client that does not trust the CA is refused, and a bad certificate setting is one line and exit status 2."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from megha.common.settings import LoadgenSettings
from megha.common.transport.rabbit import Broker, BrokerUnavailable
from megha.ctl import cli
from megha.deploy.broker_node import BrokerNode, broker_node
from megha.loadgen.services import replay_services
from megha.services.client import CallError, ServiceClient, use_tls_ca

from servicekit import small_deployment


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr}"


def make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate authority: (certificate, key)."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=folder,
    )  # fmt: skip
    return cert, key


def make_server_cert(folder: Path, ca: tuple[Path, Path]) -> tuple[Path, Path]:
    """A server certificate for 127.0.0.1 and localhost signed by `ca`: (certificate, key)."""
    cert, key, request, extensions = (folder / f"server.{ext}" for ext in ("pem", "key", "csr", "ext"))
    extensions.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
        "-out", str(request), "-subj", "/CN=localhost", cwd=folder,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
        "-days", "2", "-out", str(cert), "-extfile", str(extensions), cwd=folder,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def pki(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(server certificate, its key, the CA that signed it)."""
    ca = make_ca(tmp_path / "pki", "Megha test CA")
    cert, key = make_server_cert(tmp_path / "pki", ca)
    return cert, key, ca[0]


@pytest.fixture
def node(pki: tuple[Path, Path, Path]) -> Iterator[BrokerNode]:
    with broker_node(tls=pki) as started:
        yield started


def test_a_deployment_over_https_and_amqps_replays_and_refuses_plain_or_untrusted_clients(
    pki: tuple[Path, Path, Path], node: BrokerNode, tmp_path: Path
) -> None:
    cert, key, ca = pki
    assert node.tls_url is not None
    tls = {"tls_cert": str(cert), "tls_key": str(key), "tls_ca": str(ca)}
    deployment = small_deployment(tmp_path / "logs", workers_per_lm=2, nodes_per_worker=2, amqp_url=node.tls_url, **tls)
    with deployment:
        urls = [p.url for p in deployment.processes]
        assert all(u.startswith("https://127.0.0.1:") for u in urls), urls
        assert all(p.env["MEGHA_AMQP_URL"].startswith("amqps://") for p in deployment.processes)
        settings = deployment.loadgen(LoadgenSettings(trace="demo", first_jobs=5, time_scale=0.00002, mode="slot"))
        run = asyncio.run(replay_services(settings))
        gm, lm = deployment.gm_urls[0], deployment.lm_urls[0]

        # Plain HTTP to a service's port gets no answer.
        plain = gm.replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{plain}/healthz", timeout=5.0)
        # A client that does not trust the CA is refused; one that does is answered.
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{gm}/healthz", timeout=5.0)
        assert httpx.get(f"{gm}/healthz", timeout=5.0, verify=deployment.verify).status_code == 200
        assert asyncio.run(_service_client_answers(f"{lm}/healthz", None)) == "refused"
        assert asyncio.run(_service_client_answers(f"{lm}/healthz", str(ca))) == "200"
        # The CLI verifies with --ca (or MEGHA_TLS_CA).
        token = deployment.operator_token
        listed = CliRunner().invoke(cli, ["job", "list", "--gm", gm, "--ca", str(ca), "--token", token, "--json"])
        assert listed.exit_code == 0, listed.output
        untrusted = CliRunner().invoke(cli, ["job", "list", "--gm", gm, "--token", token], env={"MEGHA_TLS_CA": ""})
        assert untrusted.exit_code != 0 and "CERTIFICATE_VERIFY_FAILED" in untrusted.output, untrusted.output
    assert run.metrics is not None and run.metrics.tasks > 0
    assert run.timed_out == [] and run.metrics.not_exactly_once == ()
    assert run.metrics.tasks_completed == run.metrics.tasks, run.metrics


async def _service_client_answers(url: str, ca: str | None) -> str:
    use_tls_ca(ca)
    client = ServiceClient(timeout=5.0)
    try:
        return str((await client.get(url)).status)
    except CallError as exc:
        assert "CERTIFICATE_VERIFY_FAILED" in str(exc), exc
        return "refused"
    finally:
        use_tls_ca(None)
        await client.aclose()


def test_amqps_verifies_the_broker_with_the_ca(pki: tuple[Path, Path, Path], node: BrokerNode, tmp_path: Path) -> None:
    _, _, ca = pki
    assert node.tls_url is not None
    other_ca, _ = make_ca(tmp_path / "other", "Another CA")

    async def connect(tls_ca: str | None) -> None:
        broker = Broker(node.tls_url or "", "tls-check", role="loadgen", tls_ca=tls_ca, connect_timeout=2.0)
        await broker.connect()
        await broker.close()

    asyncio.run(connect(str(ca)))
    for untrusted in (str(other_ca), None):  # another CA, the system's
        with pytest.raises(BrokerUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            asyncio.run(connect(untrusted))


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MEGHA_TLS_CERT": "/nonexistent/cert.pem", "MEGHA_TLS_KEY": "/nonexistent/key.pem"}, "MEGHA_TLS_CERT"),
        ({"MEGHA_TLS_CERT": "CERT"}, "MEGHA_TLS_KEY"),
        ({"MEGHA_TLS_CA": "/nonexistent/ca.pem"}, "MEGHA_TLS_CA"),
        ({"MEGHA_TLS_CERT": "KEY", "MEGHA_TLS_KEY": "CERT"}, "MEGHA_TLS_CERT"),  # swapped
    ],
)
def test_a_bad_tls_setting_is_one_line_and_exit_status_2(
    pki: tuple[Path, Path, Path], env: dict[str, str], named: str
) -> None:
    cert, key, _ = pki
    files = {"CERT": str(cert), "KEY": str(key)}
    env = {name: files.get(value, value) for name, value in env.items()}
    done = subprocess.run(
        [sys.executable, "-m", "megha.services.lm"],
        env={"PATH": "/usr/bin:/bin", "MEGHA_AUTH": "off", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and named in done.stderr, done.stderr
