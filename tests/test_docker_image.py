"""Megha's Docker image, built by deploy/images/build.sh on the Debian base it makes: what it holds and how it runs."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest

from dockerkit import Images, build_images, run

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def images() -> Images:
    return build_images()


@pytest.fixture
def cleanup() -> Iterator[list[list[str]]]:
    """Commands that undo what a test started (containers, networks), run in reverse order at its end."""
    undo: list[list[str]] = []
    yield undo
    for argv in reversed(undo):
        run(argv, 120)


def _inspect(image: str) -> dict:
    result = run(["docker", "image", "inspect", image], 60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)[0]


def _health(container: str) -> str:
    return run(["docker", "inspect", "--format", "{{.State.Health.Status}}", container], 60).stdout.strip()


def _wait_health(container: str, want: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while (status := _health(container)) != want and time.monotonic() < deadline:
        time.sleep(1)
    return status


def test_build_script_reports_the_image_sizes(images: Images, capsys: pytest.CaptureFixture[str]) -> None:
    for image in (images.base, images.rabbitmq, images.prometheus, images.megha):
        assert 10 < images.sizes[image] < 2000, f"{image}: {images.sizes[image]} MB"
    with capsys.disabled():
        print("\nimage sizes: " + ", ".join(f"{name} {mb} MB" for name, mb in images.sizes.items()))


def test_megha_help_is_the_default_command(images: Images) -> None:
    result = run(["docker", "run", "--rm", images.megha], 120)
    assert result.returncode == 0, result.stderr
    assert "replay" in result.stdout and "Usage: megha" in result.stdout


def test_runs_as_a_non_root_user_under_an_init(images: Images) -> None:
    config = _inspect(images.megha)["Config"]
    assert config["User"] not in ("", "root", "0"), "the image must run as a non-root user"
    assert config["Entrypoint"][0] == "tini", config["Entrypoint"]
    result = run(["docker", "run", "--rm", images.megha, "id", "-u"], 120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() != "0"


def test_holds_megha_in_a_virtual_environment_without_test_tools(images: Images) -> None:
    tools = ("pytest", "hypothesis", "ruff", "pip")
    probe = (
        "import importlib.util, sys, megha; "
        f"print(sys.prefix, megha.__file__, [m for m in {tools} if importlib.util.find_spec(m)])"
    )
    result = run(["docker", "run", "--rm", images.megha, "python", "-c", probe], 120)
    assert result.returncode == 0, result.stderr
    prefix, package, present = result.stdout.strip().split(" ", 2)
    assert prefix == "/opt/megha" and package.startswith("/opt/megha/lib/"), result.stdout
    assert present == "[]", f"test or build tools in the image: {present}"


def test_healthcheck_is_set(images: Images) -> None:
    check = _inspect(images.megha)["Config"].get("Healthcheck") or {}
    assert check.get("Test") == ["CMD", "megha-healthcheck"], check


def test_stops_at_once_on_sigterm(images: Images, cleanup: list[list[str]]) -> None:
    """tini is PID 1: `docker stop` ends a command that installs no signal handler without waiting for SIGKILL."""
    name = f"megha-test-{uuid.uuid4().hex[:8]}"
    cleanup.append(["docker", "rm", "-f", name])
    assert run(["docker", "run", "-d", "--name", name, images.megha, "sleep", "300"], 120).returncode == 0
    # Once the command runs: a SIGTERM that comes while tini itself starts (PID 1, no handler yet) is dropped by the
    # kernel, a race a loaded machine lost once; what is tested is that tini passes it on to the command.
    deadline = time.monotonic() + 60
    while "sleep 300" not in run(["docker", "top", name], 30).stdout:
        assert time.monotonic() < deadline, "the container's command never started"
        time.sleep(0.2)
    started = time.monotonic()
    assert run(["docker", "stop", "--time", "20", name], 60).returncode == 0
    assert time.monotonic() - started < 10, "SIGTERM did not end the container; it was killed"


def test_healthcheck_follows_the_role(images: Images, cleanup: list[list[str]]) -> None:
    """An LM is unhealthy until it serves /healthz on MEGHA_PORT, then healthy; a role without HTTP is healthy.
    The broker is the RabbitMQ image of build.sh, with its user set by RABBITMQ_DEFAULT_USER/PASS."""
    tag = uuid.uuid4().hex[:8]
    net, broker, lm, other = (f"megha-test-{tag}-{what}" for what in ("net", "rabbitmq", "lm", "other"))
    assert run(["docker", "network", "create", net], 60).returncode == 0
    cleanup.append(["docker", "network", "rm", net])
    for container in (broker, lm, other):
        cleanup.append(["docker", "rm", "-f", "-v", container])
    lm_env = ["-e", f"MEGHA_AMQP_URL=amqp://megha:{tag}@{broker}:5672/", "-e", "MEGHA_HOST=0.0.0.0"]
    lm_env += ["-e", "MEGHA_PORT=8123", "-e", f"MEGHA_RUN_ID=test-{tag}", "-e", f"MEGHA_CLUSTER_SECRET={tag * 4}"]
    started = run(["docker", "run", "-d", "--name", lm, "--network", net, *lm_env, images.megha, "megha", "lm"], 120)
    assert started.returncode == 0, started.stderr
    started = run(["docker", "run", "-d", "--name", other, "--network", net, images.megha, "sleep", "300"], 120)
    assert started.returncode == 0, started.stderr
    # No broker yet: the LM does not serve HTTP, and its check says where it looked.
    probe = run(["docker", "exec", lm, "megha-healthcheck"], 60)
    assert probe.returncode == 1 and "http://127.0.0.1:8123/healthz" in probe.stderr, probe
    assert run(["docker", "exec", other, "megha-healthcheck"], 60).returncode == 0
    broker_env = ["-e", "RABBITMQ_DEFAULT_USER=megha", "-e", f"RABBITMQ_DEFAULT_PASS={tag}"]
    started = run(["docker", "run", "-d", "--name", broker, "--network", net, *broker_env, images.rabbitmq], 120)
    assert started.returncode == 0, started.stderr
    status = _wait_health(lm, "healthy", 120)
    logs = run(["docker", "logs", "--tail", "30", lm], 60)
    broker_logs = run(["docker", "logs", "--tail", "30", broker], 60)
    assert status == "healthy", f"LM is {status}:\n{logs.stdout}{logs.stderr}\nbroker:\n{broker_logs.stdout}"
    assert _wait_health(broker, "healthy", 60) == "healthy"
    # The configured user replaced guest.
    login = "import asyncio, aio_pika; asyncio.run(aio_pika.connect(__import__('sys').argv[1], timeout=10))"
    guest = run(["docker", "exec", other, "python", "-c", login, f"amqp://guest:guest@{broker}:5672/"], 60)
    assert guest.returncode != 0 and "ProbableAuthenticationError" in guest.stderr, guest
