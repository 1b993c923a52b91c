"""Shared test configuration.

Tests marked `docker` need a Docker engine. They run by default and fail (in set-up, saying why) when the engine
does not answer; MEGHA_SKIP_DOCKER=1 skips them instead, for a machine without Docker.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

import pytest

SKIP_DOCKER = "MEGHA_SKIP_DOCKER"

# Services and apps a test builds in this process, or starts with this environment, check no credential unless the
# test turns authentication on. Deployments (`LocalDeployment`, `ContainerDeployment`, the compose demo, the swarm
# stack) make their own secrets and run with MEGHA_AUTH=on, as they do for users; tests/test_auth.py covers it.
os.environ.setdefault("MEGHA_AUTH", "off")


_OWN_BROKER: list[object] = []  # the RabbitMQ node this test run started, if it started one


def pytest_configure(config: pytest.Config) -> None:
    """The service tests need RabbitMQ at 127.0.0.1:5672. When nothing answers there and Debian's rabbitmq-server is
    installed, the run starts a node of its own on that port (its data in a temporary folder) and stops it at the
    end; `rabbitmqctl` then reaches that node (RABBITMQ_NODENAME). Without rabbitmq-server, the tests that need a
    broker say so: they skip, or fail under CI=true."""
    from megha.deploy.broker_node import BrokerNode, port_open

    if port_open(5672) or shutil.which("rabbitmq-server") is None:
        return
    node = BrokerNode(port=5672)
    try:
        node.start()
    except (OSError, RuntimeError, TimeoutError, subprocess.SubprocessError) as exc:
        node.destroy()
        config.issue_config_time_warning(pytest.PytestWarning(f"could not start a RabbitMQ node: {exc}"), 2)
        return
    os.environ["RABBITMQ_NODENAME"] = node.name
    _OWN_BROKER.append(node)


def pytest_unconfigure(config: pytest.Config) -> None:
    for node in _OWN_BROKER:
        node.destroy()  # type: ignore[attr-defined]
    _OWN_BROKER.clear()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(SKIP_DOCKER, "").lower() not in ("1", "true", "yes"):
        return
    skip = pytest.mark.skip(reason=f"{SKIP_DOCKER}=1: the Docker tests are turned off")
    for item in items:
        if item.get_closest_marker("docker") is not None:
            item.add_marker(skip)


@functools.cache
def docker_problem() -> str | None:
    """Why the Docker engine cannot be used, or None when it answers."""
    if shutil.which("docker") is None:
        return "the docker command is not installed"
    try:
        info = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 60 s"
    if info.returncode != 0:
        return f"the Docker engine does not answer: {info.stderr.strip() or info.stdout.strip()}"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("docker") is not None and (problem := docker_problem()) is not None:
        pytest.fail(f"{problem} (set {SKIP_DOCKER}=1 to skip the Docker tests)", pytrace=False)
